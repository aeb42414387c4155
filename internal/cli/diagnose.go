package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/diagnose"
)

func diagnoseCmd(g *globals) *cobra.Command {
	var (
		duration time.Duration
		watch    bool
		all      bool
		iface    string
		top      int
	)
	c := &cobra.Command{
		Use:   "diagnose [--watch] [--duration D] [--iface IF]",
		Short: "Where the kernel drops packets, why, and what to change",
		Long: `diagnose samples the kernel's counters (/proc/net/snmp, snmp6, netstat,
softnet_stat, every qdisc, every interface and its driver statistics,
conntrack, iptables rules that drop, rampart's rules) over --duration, traces
the kfree_skb tracepoint for drop reasons meanwhile, and turns what moved into
findings, each with its evidence and the commands that fix it.

Finding ids: rx-ring, xdp-drop, tc-drop, backlog-drops, softnet-squeeze,
conntrack-full, netfilter-drop, no-listener, udp-rcvbuf, listen-overflow,
udp-sndbuf-qdisc, udp-sndbuf, qdisc-drops.

Tracing needs root; without it the counters and findings are still reported.
Counters that did not move are left out unless --all. With --watch the report
is refreshed every --duration until interrupted (one JSON object per line
with --json).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if duration <= 0 {
				return fmt.Errorf("--duration must be positive, got %s", duration)
			}
			opts := diagnose.Options{Netns: g.netns, Iface: iface}
			var stateErr error
			if os.Geteuid() == 0 {
				opts.Rampart, stateErr = g.firewall()
			}
			tracer, traceErr := diagnose.StartTracer(g.netns)
			if traceErr != nil {
				fmt.Fprintf(g.env.Stderr, "rampart: no drop reasons: %v\n", traceErr)
			} else {
				defer tracer.Close()
			}
			prev, err := diagnose.Collect(opts)
			if err != nil {
				return err
			}
			drops, err := tracer.Begin()
			if err != nil {
				return err
			}
			for {
				select {
				case <-cmd.Context().Done():
					if watch {
						return nil
					}
					return fmt.Errorf("interrupted before the end of the %s window", duration)
				case <-time.After(duration):
				}
				cur, err := diagnose.Collect(opts)
				if err != nil {
					return err
				}
				if err := tracer.End(drops); err != nil {
					return err
				}
				r := diagnose.Build(prev, cur, drops, all)
				r.Netns = g.netns
				if traceErr != nil {
					r.Tracing.Error = traceErr.Error()
				}
				if stateErr != nil {
					r.Missing = append(r.Missing, "rampart counters: "+stateErr.Error())
				}
				if err := g.printDiagnosis(r, watch, top); err != nil || !watch {
					return err
				}
				prev, drops = cur, drops.Next()
			}
		},
	}
	c.Flags().DurationVar(&duration, "duration", 2*time.Second, "sampling window (with --watch: the refresh interval)")
	c.Flags().BoolVarP(&watch, "watch", "w", false, "refresh the report until interrupted")
	c.Flags().BoolVar(&all, "all", false, "show every counter, not only those that moved")
	c.Flags().StringVar(&iface, "iface", "", "only this interface's link, qdisc and driver counters")
	c.Flags().IntVar(&top, "top", 10, "drop reasons shown in the table (--json has all)")
	return c
}

func (g *globals) printDiagnosis(r *diagnose.Report, watch bool, top int) error {
	if g.json {
		if watch {
			return json.NewEncoder(g.env.Stdout).Encode(r)
		}
		return g.printJSON(r)
	}
	out := g.env.Stdout
	if watch && g.interactive() {
		fmt.Fprint(out, "\033[H\033[2J")
	}
	where := "this host's namespace"
	if r.Netns != "" {
		where = "namespace " + r.Netns
	}
	fmt.Fprintf(out, "%s  %.1f s window, %s\n\n", r.Time.Format(time.TimeOnly), r.Window, where)
	if len(r.Findings) == 0 {
		fmt.Fprintln(out, "No findings: nothing dropped in this window.")
	}
	for _, f := range r.Findings {
		fmt.Fprintf(out, "[%s] %s\n", f.ID, f.Summary)
		for _, e := range f.Evidence {
			line := fmt.Sprintf("    %s = %d", e.Name, e.Value)
			if e.Rate > 0 {
				line += fmt.Sprintf(" (%s/s)", rate(e.Rate))
			}
			if e.Detail != "" {
				line += "  " + e.Detail
			}
			fmt.Fprintln(out, line)
		}
		fmt.Fprintf(out, "  fix: %s\n", f.Fix)
		for _, c := range f.Commands {
			fmt.Fprintf(out, "    $ %s\n", c)
		}
		fmt.Fprintln(out)
	}
	switch {
	case r.Tracing.Enabled:
		rows := [][]string{{"REASON", "FUNCTION", "IFACE", "PROTO", "COUNT", "PER SEC"}}
		for i, d := range r.DropReasons {
			if i == top {
				break
			}
			rows = append(rows, []string{d.Reason, d.Location, d.Iface, d.Protocol, strconv.FormatUint(d.Count, 10), rate(d.Rate)})
		}
		if len(rows) > 1 {
			fmt.Fprintf(out, "Drop reasons (kfree_skb), top %d of %d:\n", len(rows)-1, len(r.DropReasons))
			g.table(rows)
		} else {
			fmt.Fprintln(out, "Drop reasons (kfree_skb): none in this window.")
		}
		if r.Tracing.Lost > 0 {
			fmt.Fprintf(out, "%d drops since the tracer started were not counted: its table of drop kinds is full.\n", r.Tracing.Lost)
		}
		fmt.Fprintf(out, "Tracer cost: %d events, %.0f ns each, %.3f%% of one CPU.\n\n", r.Tracing.Events, r.Tracing.NsPerEvent, r.Tracing.CPUPercent)
	default:
		fmt.Fprintf(out, "Drop reasons: not traced (%s).\n\n", r.Tracing.Error)
	}
	rows := [][]string{{"COUNTER", "VALUE", "PER SEC"}}
	for _, c := range r.Counters {
		per := rate(c.Rate)
		if c.Gauge {
			per = "(level)"
		}
		rows = append(rows, []string{c.Name, strconv.FormatUint(c.Value, 10), per})
	}
	if len(rows) > 1 {
		g.table(rows)
	}
	if len(r.Missing) > 0 {
		fmt.Fprintf(out, "\nNot read: %s\n", strings.Join(r.Missing, "; "))
	}
	return nil
}

func rate(r float64) string {
	if r >= 100 {
		return strconv.FormatFloat(r, 'f', 0, 64)
	}
	return strconv.FormatFloat(r, 'f', 1, 64)
}
