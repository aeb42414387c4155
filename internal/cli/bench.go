package cli

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/bench"
	"github.com/rampart-fw/rampart/internal/policy"
)

func benchCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "bench lookup|rules|apply",
		Short: "Measure the data plane, side by side in one run",
	}
	c.AddCommand(benchLookupCmd(g), benchRulesCmd(g), benchApplyCmd(g), benchProxyCmd(g))
	return c
}

func benchRulesCmd(g *globals) *cobra.Command {
	var (
		families     string
		counts       string
		victims      bool
		repeat, runs int
		lists        int
	)
	c := &cobra.Command{
		Use:   "rules [--rules 10,256,10000 [--victims | --lists N]] [--family 4,6] [--repeat N] [--runs N]",
		Short: "Per-packet cost of rule kinds, or of policies of many rules",
		Long: `rules loads rampart's XDP program with one-rule policies that each drop
the benchmark's UDP frame: a plain drop, a per-rule limit and a per-source
limit the frame is far over, and runs the frame through each with
BPF_PROG_TEST_RUN, in interleaved rounds. It reports the median ns per
packet and the ratio to the drop rule's.

The frame has one source, so a per-source limit's schedule stays in the
cache here; what many sources cost besides (a table slot out of cache per
source) shows in rampart lab flood's sources flood.

With --rules, it loads instead one policy of each size, rules as a feed
sends them (each a source list of 32, or of --lists, UDP, its own
destination port), and runs two frames through each: one no rule
matches, one only the last rule matches. Past 63 lists named in as many
ways, the later lists take no bit of the membership mask, and their
rules check the class's row instead. With --victims, each rule's destination is an address of its own
instead of a source list, as BGP FlowSpec routes name the addresses under
attack. It reports ns per packet, the ratio to the smallest policy's for
the same frame, the time to compile and load each policy and its kernel
bytes.`,
		Example: "  rampart bench rules --family 4\n  rampart bench rules --rules 10,256,10000,100000 --family 4\n  rampart bench rules --rules 10,10000 --victims\n  rampart bench rules --rules 10,10000 --lists 1024",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fams, err := familyList(families)
			if err != nil {
				return err
			}
			if repeat < 1 || runs < 1 {
				return fmt.Errorf("--repeat and --runs must be at least 1")
			}
			var progress func(string)
			if g.interactive() {
				progress = func(msg string) { fmt.Fprintf(g.env.Stderr, "\r\033[K%s", msg) }
			}
			if counts != "" {
				ns, err := intList(counts, "--rules")
				if err != nil {
					return err
				}
				for _, n := range ns {
					if n < 1 || n > policy.MaxRules {
						return fmt.Errorf("--rules %d: each size must be 1 to %d", n, policy.MaxRules)
					}
				}
				if lists < 1 || lists > bench.MaxScaleLists {
					return fmt.Errorf("--lists %d: must be 1 to %d", lists, bench.MaxScaleLists)
				}
				return benchScale(g, ns, fams, victims, lists, repeat, runs, progress)
			}
			res, err := bench.Rules(fams, repeat, runs, progress)
			if done, err := rulesDone(g, progress, err, repeat, runs, res); done {
				return err
			}
			rows := [][]string{{"FAMILY", "RULE", "NS/PKT", "MIN-MAX", "x DROP"}}
			for _, r := range res {
				rows = append(rows, []string{fmt.Sprintf("IPv%d", r.Family), r.Rule, fmt.Sprintf("%.1f", r.NsPerPacket),
					fmt.Sprintf("%.1f-%.1f", r.NsMin, r.NsMax), fmt.Sprintf("%.2f", r.VsDrop)})
			}
			g.table(rows)
			fmt.Fprintf(g.env.Stdout, "ns/pkt: median of %d runs of %d packets; x drop: against the drop rule of the same run.\n", runs, repeat)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&families, "family", "4,6", "address families: 4, 6")
	f.StringVar(&counts, "rules", "", "policy sizes to compare, e.g. 10,256,10000")
	f.BoolVar(&victims, "victims", false, "with --rules: each rule a destination address of its own, not a source list")
	f.IntVar(&lists, "lists", bench.ScaleLists, "with --rules: the source lists the rules spread over")
	f.IntVar(&repeat, "repeat", 1_000_000, "packets per run")
	f.IntVar(&runs, "runs", 5, "runs per measurement (the median is reported)")
	return c
}

// rulesDone ends a bench rules run: clears the progress line, words an
// error, prints the JSON when asked. done: nothing is left to print.
func rulesDone(g *globals, progress func(string), err error, repeat, runs int, res any) (done bool, _ error) {
	if progress != nil {
		fmt.Fprint(g.env.Stderr, "\r\033[K")
	}
	if err != nil {
		return true, fmt.Errorf("bench rules: %w (it needs root for BPF_PROG_TEST_RUN)", err)
	}
	if g.json {
		return true, g.printJSON(map[string]any{"repeat": repeat, "runs": runs, "results": res})
	}
	return false, nil
}

func benchScale(g *globals, counts, fams []int, victims bool, lists, repeat, runs int, progress func(string)) error {
	res, err := bench.Scale(counts, fams, victims, lists, repeat, runs, progress)
	if done, err := rulesDone(g, progress, err, repeat, runs, res); done {
		return err
	}
	rows := [][]string{{"FAMILY", "RULES", "FRAME", "NS/PKT", "MIN-MAX", "x FEWEST", "LOAD", "KERNEL"}}
	for _, r := range res {
		rows = append(rows, []string{fmt.Sprintf("IPv%d", r.Family), strconv.Itoa(r.Rules), r.Frame, fmt.Sprintf("%.1f", r.NsPerPacket),
			fmt.Sprintf("%.1f-%.1f", r.NsMin, r.NsMax), fmt.Sprintf("%.2f", r.VsFewest), fmt.Sprintf("%.2fs", r.LoadSeconds),
			fmt.Sprintf("%.1f MiB", float64(r.KernelBytes)/(1<<20))})
	}
	g.table(rows)
	fmt.Fprintf(g.env.Stdout, "ns/pkt: median of %d runs of %d packets; x fewest: against the smallest policy, same frame, same run.\n", runs, repeat)
	return nil
}

func benchLookupCmd(g *globals) *cobra.Command {
	var (
		sizes    string
		mixes    string
		traffic  string
		families string
		large    bool
		o        = bench.Options{}
	)
	c := &cobra.Command{
		Use:   "lookup [--sizes 10,1000000] [--mix egress|random32|networks|flood] [--traffic uniform|listed] [--family 4|6] [--large]",
		Short: "Per-packet cost of prefix-list lookups: rampart's tables against the kernel's LPM trie",
		Long: `lookup runs, for every family, prefix mix, list size and traffic, one XDP
program per step through BPF_PROG_TEST_RUN: a bare XDP_DROP, parsing,
parsing plus the next source address from a table (the baseline every
lookup pays), then a lookup of that address: one dependent random read
from an array as big as rampart's tables (one-read: the cost of a single
miss at that footprint, the floor), the kernel's LPM trie, rampart's
tables. It reports the median ns per packet over the runs with min-max,
the ratios to the baseline and to one-read, the hit rate, the dependent
reads and 4 KiB pages a lookup touches (rampart's, counted by walking its
tables for the run's sources), the load time and kernel bytes per prefix.

Mixes: egress (the egress study's: /24 10%, /16 1%, the rest /32),
random32 (all /32), networks (reputation lists of networks: /16-/24
and 15% hosts) and flood (lab drop's sources: hosts of 10.0.0.0/8, about
16 a /24 at a million, at most 16,777,216; /64s of fd10::/32). IPv6 draws prefixes in 2000::/3 with /64, /48 and /128
for the egress mix's /24, /16 and /32, and /19-/64 for networks.
Traffic: uniform (random addresses; IPv6 in 2000::/3: mostly misses) and
listed (addresses inside listed prefixes, as a flood from listed sources).`,
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
			if o.Families, err = familyList(families); err != nil {
				return err
			}
			if o.Mixes, err = choices(mixes, "--mix", bench.MixEgress, bench.MixRandom32, bench.MixNetworks, bench.MixFlood); err != nil {
				return err
			}
			if slices.Contains(o.Mixes, bench.MixFlood) && slices.Max(o.Sizes) > bench.FloodSources {
				return fmt.Errorf("--mix flood holds at most %d sources (the hosts of a /8): give smaller --sizes", bench.FloodSources)
			}
			if o.Traffic, err = choices(traffic, "--traffic", bench.TrafficUniform, bench.TrafficListed); err != nil {
				return err
			}
			if o.Repeat < 1 || o.Runs < 1 {
				return fmt.Errorf("--repeat and --runs must be at least 1")
			}
			progress, clear := g.progressLine()
			o.Progress = progress
			res, err := bench.Lookup(o)
			clear()
			if err != nil {
				return fmt.Errorf("bench lookup: %w (it needs root for BPF_PROG_TEST_RUN)", err)
			}
			if g.json {
				return g.printJSON(map[string]any{"repeat": o.Repeat, "runs": o.Runs, "results": res})
			}
			g.table(lookupTable(res))
			fmt.Fprintf(g.env.Stdout, "ns/pkt: median of %d runs of %d packets; x base, x 1-read: against the baseline and one-read rows of the same run.\n", o.Runs, o.Repeat)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&sizes, "sizes", "10,1000,100000,1000000,10000000", "list sizes, comma-separated")
	f.StringVar(&mixes, "mix", "egress,random32", "prefix mixes: egress, random32, networks, flood")
	f.StringVar(&traffic, "traffic", "uniform,listed", "traffic: uniform, listed")
	f.StringVar(&families, "family", "4,6", "address families: 4, 6")
	f.BoolVar(&large, "large", false, "add 50M and 100M prefixes (needs several GiB for the kernel LPM trie)")
	f.IntVar(&o.Repeat, "repeat", 1_000_000, "packets per run")
	f.IntVar(&o.Runs, "runs", 5, "runs per measurement (the median is reported)")
	f.BoolVar(&o.NoKernelLPM, "no-kernel-lpm", false, "leave out the kernel's LPM trie (it takes minutes to load past 10M prefixes)")
	return c
}

func benchApplyCmd(g *globals) *cobra.Command {
	var (
		sizes, mixes, families string
		o                      = bench.ApplyOptions{}
	)
	c := &cobra.Command{
		Use:   "apply [--sizes 1000000,10000000] [--mix random32,networks,feed] [--family 4,6] [--runs 3]",
		Short: "Time and peak memory of rampart check and rampart apply on big lists and feeds",
		Long: `apply writes, for every family, mix and size, a list file of the mix's
prefixes (the mixes of bench lookup: random32 is all hosts, /32 or /128;
networks is a reputation list of networks) and a policy dropping them, or
for the mix feed a policy of that many rules as a BGP FlowSpec feed sends
them (bench rules' feed: UDP to an address and a port of its own; at most
131,072 rules, a policy's limit).
It runs 'rampart check' (read the policy, build the tables), 'rampart
apply' (that, and load them into the kernel, on a veth in a namespace of
its own, on pins and state of the run's own) and, as apply-change,
'rampart apply' again after one change (an entry appended to the list
file or cut off again, an address no listed prefix holds; a feed's first
rule's port changed or changed back), which fills a new generation of the
program the first apply loaded: a change that leaves the policy as it
was, or loads a program, is reported as an error. Each runs --runs times, a child process each. It reports the
median wall time with min-max and the largest peak resident memory of the
runs (the process's, from getrusage), beside the file's size and the
tables' kernel memory.`,
		Example: "  rampart bench apply --sizes 10000000 --mix random32 --family 6\n  rampart bench apply --sizes 10000 --mix feed --family 4",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return fmt.Errorf("bench apply needs root: it creates a network namespace and loads BPF programs (run it with sudo)")
			}
			var err error
			if o.Sizes, err = intList(sizes, "--sizes"); err != nil {
				return err
			}
			if o.Families, err = familyList(families); err != nil {
				return err
			}
			if o.Mixes, err = choices(mixes, "--mix", bench.MixEgress, bench.MixRandom32, bench.MixNetworks, bench.MixFeed); err != nil {
				return err
			}
			if slices.Contains(o.Mixes, bench.MixFeed) {
				for _, n := range o.Sizes {
					if n > policy.MaxRules {
						return fmt.Errorf("--sizes %d: the feed is a policy of that many rules, at most %d", n, policy.MaxRules)
					}
				}
			}
			if o.Runs < 1 {
				return fmt.Errorf("--runs %d: must be at least 1", o.Runs)
			}
			if o.Exe, err = os.Executable(); err != nil {
				return fmt.Errorf("bench apply runs this rampart binary and cannot find it: %w", err)
			}
			if o.Dir, err = os.MkdirTemp("", "rampart-bench-apply-"); err != nil {
				return err
			}
			defer os.RemoveAll(o.Dir)
			progress, clear := g.progressLine()
			o.Progress = progress
			res, err := bench.ApplyCost(o)
			clear()
			if err != nil {
				return fmt.Errorf("bench apply: %w", err)
			}
			if g.json {
				return g.printJSON(map[string]any{"runs": o.Runs, "results": res})
			}
			rows := [][]string{{"FAMILY", "MIX", "SIZE", "FILE MiB", "TABLES MiB", "STEP", "SECONDS", "MIN-MAX", "PEAK RSS MiB"}}
			for _, r := range res {
				secs, mm, rss := "failed: "+r.Error, "-", "-"
				if r.Error == "" {
					secs, mm, rss = fmt.Sprintf("%.2f", r.Seconds), fmt.Sprintf("%.2f-%.2f", r.SecondsMin, r.SecondsMax), strconv.FormatInt(r.PeakRSS>>20, 10)
				}
				rows = append(rows, []string{fmt.Sprintf("IPv%d", r.Family), r.Mix, strconv.Itoa(r.Size), strconv.FormatInt(r.FileBytes>>20, 10),
					strconv.FormatUint(r.TableBytes>>20, 10), r.Step, secs, mm, rss})
			}
			g.table(rows)
			fmt.Fprintf(g.env.Stdout, "seconds: median of %d runs of the command, each a process of its own; peak RSS: the largest of them; apply-change: apply again after one entry (a feed: one rule) changed.\n", o.Runs)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&sizes, "sizes", "1000000,10000000", "list sizes (a feed's: rules), comma-separated")
	f.StringVar(&mixes, "mix", "random32,networks", "prefix mixes: egress, random32, networks; or feed, --sizes rules")
	f.StringVar(&families, "family", "4,6", "address families: 4, 6")
	f.IntVar(&o.Runs, "runs", 3, "runs of each command (the median is reported)")
	return c
}

// familyList reads the bench commands' --family: 4, 6 or 4,6.
func familyList(s string) ([]int, error) {
	fams, err := intList(s, "--family")
	if err != nil {
		return nil, err
	}
	for _, f := range fams {
		if f != 4 && f != 6 {
			return nil, fmt.Errorf("--family %d: use 4, 6 or 4,6", f)
		}
	}
	return fams, nil
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

// choices splits a comma-separated flag value and checks every item.
func choices(value, flag string, allowed ...string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(value, ",") {
		v = strings.TrimSpace(v)
		if !slices.Contains(allowed, v) {
			return nil, fmt.Errorf("%s %q: use one or more of %s, comma-separated", flag, v, strings.Join(allowed, ", "))
		}
		out = append(out, v)
	}
	return out, nil
}

func lookupTable(res []bench.Result) [][]string {
	rows := [][]string{{"FAMILY", "MIX", "SIZE", "TRAFFIC", "STRUCTURE", "NS/PKT", "MIN-MAX", "x BASE", "x 1-READ", "HITS", "READS", "PAGES", "LOAD", "BYTES/PREFIX"}}
	opt := func(p *float64, format string, scale float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf(format, *p*scale)
	}
	for _, r := range res {
		ns, mm, x, x1 := "-", "-", "-", "-"
		switch {
		case r.Error == "":
			ns, mm, x = fmt.Sprintf("%.1f", r.NsPerPacket), fmt.Sprintf("%.1f-%.1f", r.NsMin, r.NsMax), fmt.Sprintf("%.2f", r.VsBaseline)
			if r.VsOneRead > 0 {
				x1 = fmt.Sprintf("%.2f", r.VsOneRead)
			}
		case strings.HasPrefix(r.Error, "not measured"):
			ns = "not measured"
		default:
			ns = "failed: " + r.Error
		}
		rows = append(rows, []string{fmt.Sprintf("IPv%d", r.Family), r.Mix, strconv.Itoa(r.Size), r.Traffic, r.Structure, ns, mm, x, x1,
			opt(r.HitRate, "%.2f%%", 100), opt(r.Reads, "%.2f", 1), opt(r.Pages, "%.2f", 1), opt(r.LoadSeconds, "%.3fs", 1), opt(r.BytesPerPrefix, "%.1f", 1)})
	}
	return rows
}

// benchProxyCmd is `rampart lab proxy` under its old name, kept for one
// release: same flags, same output, left out of the help.
func benchProxyCmd(g *globals) *cobra.Command {
	c := labProxyCmd(g)
	c.Hidden = true
	c.Short = "Deprecated: rampart lab proxy under its old name, kept for one release"
	c.Long = "Deprecated: use rampart lab proxy; bench proxy is kept for one release.\n\n" + c.Long
	return c
}
