package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/bench"
)

func benchCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "bench lookup",
		Short: "Measure the data plane (BPF_PROG_TEST_RUN), side by side in one run",
	}
	c.AddCommand(benchLookupCmd(g))
	return c
}

func benchLookupCmd(g *globals) *cobra.Command {
	var (
		sizes    string
		mixes    string
		families string
		large    bool
		o        = bench.Options{}
	)
	c := &cobra.Command{
		Use:   "lookup [--sizes 10,1000000] [--mix egress|random32] [--family 4|6] [--large]",
		Short: "Per-packet cost of prefix-list lookups: rampart's tables against the kernel's LPM trie",
		Long: `lookup runs, for every family, prefix mix and list size, one XDP program per
step through BPF_PROG_TEST_RUN: a bare XDP_DROP, parsing, parsing plus a
random source address per packet (the baseline every lookup pays), then a
lookup of that address in the kernel's LPM trie and in rampart's tables.
It reports the median ns per packet over the runs with min-max, the ratio
to the baseline, the hit rate, the load time and kernel bytes per prefix.

Mixes: egress (the egress study's: /24 10%, /16 1%, the rest /32) and
random32 (all /32). IPv6 uses the same mixes shifted into 2001:db8::/96.`,
		Example: "  rampart bench lookup --sizes 10,1000000 --mix random32 --family 4",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Sizes, err = intList(sizes, "--sizes"); err != nil {
				return err
			}
			if large {
				o.Sizes = append(o.Sizes, 50_000_000, 100_000_000)
			}
			if o.Families, err = intList(families, "--family"); err != nil {
				return err
			}
			for _, f := range o.Families {
				if f != 4 && f != 6 {
					return fmt.Errorf("--family %d: use 4, 6 or 4,6", f)
				}
			}
			for _, m := range strings.Split(mixes, ",") {
				if m != bench.MixEgress && m != bench.MixRandom32 {
					return fmt.Errorf("--mix %q: use egress, random32 or egress,random32", m)
				}
				o.Mixes = append(o.Mixes, m)
			}
			if o.Repeat < 1 || o.Runs < 1 {
				return fmt.Errorf("--repeat and --runs must be at least 1")
			}
			if g.interactive() {
				o.Progress = func(msg string) { fmt.Fprintf(g.env.Stderr, "\r\033[K%s", msg) }
			}
			res, err := bench.Lookup(o)
			if o.Progress != nil {
				fmt.Fprint(g.env.Stderr, "\r\033[K")
			}
			if err != nil {
				return fmt.Errorf("bench lookup: %w (it needs root for BPF_PROG_TEST_RUN)", err)
			}
			if g.json {
				return g.printJSON(map[string]any{"repeat": o.Repeat, "runs": o.Runs, "results": res})
			}
			g.table(lookupTable(res))
			fmt.Fprintf(g.env.Stdout, "ns/pkt: median of %d runs of %d packets; x base: against parse + random source in the same run.\n", o.Runs, o.Repeat)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&sizes, "sizes", "10,1000,100000,1000000,10000000", "list sizes, comma-separated")
	f.StringVar(&mixes, "mix", "egress,random32", "prefix mixes: egress, random32")
	f.StringVar(&families, "family", "4,6", "address families: 4, 6")
	f.BoolVar(&large, "large", false, "add 50M and 100M prefixes (needs several GiB for the kernel LPM trie)")
	f.IntVar(&o.Repeat, "repeat", 1_000_000, "packets per run")
	f.IntVar(&o.Runs, "runs", 5, "runs per measurement (the median is reported)")
	f.BoolVar(&o.NoKernelLPM, "no-kernel-lpm", false, "leave out the kernel's LPM trie (it takes minutes to load past 10M prefixes)")
	return c
}

func intList(s, flag string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s %q: want comma-separated non-negative integers", flag, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func lookupTable(res []bench.Result) [][]string {
	rows := [][]string{{"FAMILY", "MIX", "SIZE", "STRUCTURE", "NS/PKT", "MIN-MAX", "x BASE", "HITS", "LOAD", "BYTES/PREFIX"}}
	opt := func(p *float64, format string, scale float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf(format, *p*scale)
	}
	for _, r := range res {
		ns, mm, x := "-", "-", "-"
		switch {
		case r.Error == "":
			ns, mm, x = fmt.Sprintf("%.1f", r.NsPerPacket), fmt.Sprintf("%.1f-%.1f", r.NsMin, r.NsMax), fmt.Sprintf("%.2f", r.VsBaseline)
		case strings.HasPrefix(r.Error, "not measured"):
			ns = "not measured"
		default:
			ns = "failed: " + r.Error
		}
		rows = append(rows, []string{fmt.Sprintf("IPv%d", r.Family), r.Mix, strconv.Itoa(r.Size), r.Structure, ns, mm, x,
			opt(r.HitRate, "%.2f%%", 100), opt(r.LoadSeconds, "%.3fs", 1), opt(r.BytesPerPrefix, "%.1f", 1)})
	}
	return rows
}
