package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/tune"
)

func tuneCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "tune irq|tcp",
		Short: "Tune the host: interrupts isolated by side, TCP buffers from bandwidth and RTT",
	}
	c.AddCommand(tuneIRQCmd(g), tuneTCPCmd(g))
	return c
}

func tuneTCPCmd(g *globals) *cobra.Command {
	var (
		bandwidth, root string
		rtt             time.Duration
		conns, mtu      int
		apply, revert   bool
	)
	c := &cobra.Command{
		Use:   "tcp --rtt DURATION [--bandwidth RATE] [--conns N] [--apply | --revert] [--root DIR]",
		Short: "What rate the TCP settings allow on a path, and the buffers that fill it",
		Long: `tcp reads the running kernel's TCP buffer settings and says what rate one
connection can reach on a path of --rtt: a receive window (the share of
tcp_rmem's max the kernel advertises: tcp_adv_win_scale before Linux 6.6;
from 6.6 the payload to truesize ratio each connection measures, 0.628
for a full segment at --mtu 1500) or a send buffer (of which 0.7 carries
data in flight) per round trip, whichever is smaller. Give the RTT ping
measures on the path. With --bandwidth it gives the tcp_rmem, tcp_wmem,
rmem_max, wmem_max and tcp_mem that fill the path, with a quarter of
headroom, for --conns connections at once, and findings with the commands that apply them. --apply sets
them (and tcp_slow_start_after_idle=0 when it is on), writes them to
/etc/sysctl.d/90-rampart-tcp.conf so they hold after a reboot, and keeps
what they were in /var/lib/rampart; --revert sets those back and removes
both files.`,
		Example: `  rampart tune tcp --rtt 146ms
  rampart tune tcp --rtt 68ms --bandwidth 1Gbit --conns 4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if revert {
				if err := tune.RevertTCP(root); err != nil {
					return err
				}
				fmt.Fprintln(g.env.Stdout, "reverted: the TCP settings are what they were before --apply")
				return nil
			}
			if !cmd.Flags().Changed("rtt") {
				return errors.New("--rtt is required: the path's round-trip time, e.g. --rtt 146ms")
			}
			if rtt < tune.MinRTT || rtt > tune.MaxRTT {
				why := "too long"
				switch {
				case rtt < 0:
					why = "negative"
				case rtt == 0:
					why = "zero"
				case rtt < tune.MinRTT:
					why = "too short"
				}
				return fmt.Errorf("--rtt %v is out of range (%s): give the path's round-trip time, %v to %v, e.g. --rtt 146ms", rtt, why, tune.MinRTT, tune.MaxRTT)
			}
			var rate float64
			if bandwidth != "" {
				var err error
				if rate, err = tune.ParseRate(bandwidth); err != nil {
					return fmt.Errorf("--bandwidth %w", err)
				}
			}
			if conns < 1 || conns > tune.MaxConns {
				return fmt.Errorf("--conns %d is out of range: give 1 to %d connections", conns, tune.MaxConns)
			}
			if apply && rate == 0 {
				return errors.New("--apply needs --bandwidth: the buffers are sized for a path's bandwidth × RTT")
			}
			if mtu < tune.MinMTU || mtu > tune.MaxMTU {
				return fmt.Errorf("--mtu %d is out of range: give the path's MTU, %d to %d", mtu, tune.MinMTU, tune.MaxMTU)
			}
			s, err := tune.ReadTCP(root)
			if err != nil {
				return fmt.Errorf("read the TCP settings: %w", err)
			}
			s.MTU = mtu
			p := tune.PlanTCP(s, rate, rtt, conns)
			if apply {
				if err := tune.ApplyTCP(root, p); err != nil {
					return fmt.Errorf("apply: %w (run rampart tune tcp --revert to set back what was changed)", err)
				}
			}
			if g.json {
				return g.printJSON(p)
			}
			fmt.Fprintf(g.env.Stdout, "One connection on this %v path: %.1f MB/s, limited by the %s.\n\n", rtt, p.RateNow/1e6, p.RateLimitBy)
			rows := [][]string{{"SYSCTL", "CURRENT", "RECOMMENDED"}}
			for _, x := range p.Sysctls {
				rows = append(rows, []string{x.Name, strings.ReplaceAll(x.Current, "\t", " "), strings.ReplaceAll(x.Recommended, "\t", " ")})
			}
			g.table(rows)
			for _, f := range p.Findings {
				fmt.Fprintf(g.env.Stdout, "\n%s: %s\n  fix: %s\n", f.ID, f.Evidence, f.Fix)
			}
			if apply {
				fmt.Fprintln(g.env.Stdout, "\napplied, and kept in /etc/sysctl.d/90-rampart-tcp.conf; rampart tune tcp --revert undoes it")
			}
			return nil
		},
	}
	f := c.Flags()
	f.DurationVar(&rtt, "rtt", 0, "the path's round-trip time, 1µs to 10s")
	f.StringVar(&bandwidth, "bandwidth", "", "the path's bandwidth, 1kbit to 10000Gbit: 1Gbit, 100Mbit/s, 112MB/s")
	f.IntVar(&conns, "conns", 1, "connections that fill the path at once, 1 to 1000000 (tcp_mem holds them all, within memory)")
	f.IntVar(&mtu, "mtu", 1500, "the path's MTU (the window's share of the buffer follows it from Linux 6.6)")
	f.StringVar(&root, "root", "/", "read and write proc/, etc/ and var/ under this directory instead of /")
	f.BoolVar(&apply, "apply", false, "set the recommended values and keep them in /etc/sysctl.d")
	f.BoolVar(&revert, "revert", false, "set back what --apply changed")
	c.MarkFlagsMutuallyExclusive("apply", "revert")
	return c
}
