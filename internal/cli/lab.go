package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	labcrowdsec "github.com/rampart-fw/rampart/internal/lab/crowdsec"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/lab/drop"
	"github.com/rampart-fw/rampart/internal/lab/egress"
	"github.com/rampart-fw/rampart/internal/lab/flood"
	labproxy "github.com/rampart-fw/rampart/internal/lab/proxy"
)

func labCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "lab",
		Short: "Reproduce packet-filtering studies in network namespaces of its own",
	}
	c.AddCommand(labDropCmd(g), labFloodCmd(g), labEgressCmd(g), labProxyCmd(g), labCrowdSecCmd(g))
	return c
}

func labFloodCmd(g *globals) *cobra.Command {
	var (
		quick            bool
		floods, defences []string
		family, out      string
		warmup, window   time.Duration
		tcpRate, udpRate int
		sources          int
	)
	c := &cobra.Command{
		Use:   "flood [--quick] [--floods syn,udp,sources] [--defences a,b,...] [--family 4|6|both] [--out DIR]",
		Short: "Legitimate traffic under floods no list can name, with each defence",
		Long: `flood runs a receiving namespace with a TCP service (port 80: one request
per connection) and a UDP echo (port 53), legitimate clients in a namespace
of their own (100 addresses, routed through the generator's namespace so
their traffic and the flood arrive on the same interface) and an in-kernel
generator flooding at its full rate:

  syn      SYNs from 2^24 random sources to the TCP service
  udp      datagrams from 2^24 random sources to the UDP service
  sources  datagrams from --sources sources, each far over a fair share

Rows: ` + strings.Join(flood.DefenceNames(), ", ") + `; each defence
runs against the floods it is for (the SYN defences against syn, the limit
against udp and sources), and every family has an unflooded baseline.
For every row: the legitimate requests answered within 1s and their p50/p99
latency (and p99 over the baseline's), the flood offered, received and
stopped (dropped, or answered without state), the receiving CPU's busy
share and its time per packet received, and SYN-ACKs per busy core.

Everything it creates (namespaces, links, rules, pins) is removed after
each row, also on Ctrl-C or failure. It writes flood.json, flood.png and
flood.svg to --out and prints a table.`,
		Example: `  rampart lab flood --quick
  rampart lab flood --floods syn --defences kernel-syncookies,rampart-syncookie --family 4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := flood.Full
			if quick {
				opts = flood.Quick
			}
			f := cmd.Flags()
			if f.Changed("warmup") {
				opts.Warmup = warmup
			}
			if f.Changed("window") {
				opts.Window = window
			}
			if f.Changed("tcp-rate") {
				opts.TCPRate = tcpRate
			}
			if f.Changed("udp-rate") {
				opts.UDPRate = udpRate
			}
			if f.Changed("sources") {
				opts.Sources = sources
			}
			opts.Floods, opts.Defences = floods, defences
			var err error
			if opts.Families, err = families(family); err != nil {
				return err
			}
			if err := opts.Validate(); err != nil {
				return err
			}
			return runLab(g, "flood", out, func(dir string, progress func(string)) (*flood.Report, error) {
				opts.Dir, opts.Progress = dir, progress
				return flood.Run(cmd.Context(), opts)
			}, renderFlood)
		},
	}
	fl := c.Flags()
	fl.BoolVar(&quick, "quick", false, "shorter windows (about a minute for every row and both families)")
	fl.StringSliceVar(&floods, "floods", nil, "floods to run, comma-separated (default all): "+strings.Join(flood.Names, ","))
	fl.StringSliceVar(&defences, "defences", nil, "defences to run, comma-separated (default all): "+strings.Join(flood.DefenceNames(), ","))
	fl.StringVar(&family, "family", "both", "4, 6 or both")
	fl.StringVar(&out, "out", "", "directory for flood.json, flood.png and flood.svg (default ./lab-flood-TIME)")
	fl.DurationVar(&warmup, "warmup", flood.Full.Warmup, "flood time before the window")
	fl.DurationVar(&window, "window", flood.Full.Window, "length of the measurement window")
	fl.IntVar(&tcpRate, "tcp-rate", flood.Full.TCPRate, "legitimate TCP connections per second")
	fl.IntVar(&udpRate, "udp-rate", flood.Full.UDPRate, "legitimate UDP requests per second")
	fl.IntVar(&sources, "sources", flood.Full.Sources, "sources of the sources flood")
	return c
}

func labEgressCmd(g *globals) *cobra.Command {
	var (
		quick, large      bool
		methods           []string
		sizes, out, dests string
		rounds            int
		window, budget    time.Duration
	)
	c := &cobra.Command{
		Use:   "egress [--quick] [--sizes 10,1000,...] [--large] [--methods a,b,...] [--destinations many|one] [--out DIR]",
		Short: "What filtering outgoing traffic by destination costs, by list size, rampart beside iptables, ipset, nftables and an LPM trie",
		Long: `egress reruns the egress-filtering scale study (SAP and Kinvolk, 2020) in a
client and a server namespace joined by a veth pair. Each method filters the
client's outgoing traffic by a deny list of the study's mix (10% /24, 1% /16,
the rest /32): ` + strings.Join(egress.MethodNames(), ", ") + `.
iptables is one OUTPUT rule per prefix (iptables-restore), ipset a hash:net
set and one rule, nft-set an interval set and one rule, tc-lpm the study's
own filter (clsact egress, cls_bpf, the kernel's LPM trie), rampart a real
rampart apply --egress.

Per method and size, set up fresh in every round: set-up time from list file
to filter live; a check that a listed destination is unreachable; UDP at
saturation from one client CPU (sendmmsg, 18-byte payloads) counted at the
server's interface; one TCP connection (iperf3); ping every 1 ms (mean and
p99). Traffic goes to 4,096 addresses the server answers for, none listed,
so that lookups walk the structures as real traffic would;
--destinations one sends it all to one address, as the study did.

It prints a table per metric and the study's findings and rampart's
targets as checks, and writes egress.json, egress.csv and a chart per
metric (egress-METRIC.png and .svg) to --out. Namespaces, rules, sets and
pins are removed after each row, also on Ctrl-C.`,
		Example: `  rampart lab egress --quick
  rampart lab egress --sizes 1000,1000000 --methods none,ipset,rampart --rounds 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := egress.Full
			if quick {
				opts = egress.Quick
			}
			f := cmd.Flags()
			if f.Changed("sizes") {
				var err error
				if opts.Sizes, err = intList(sizes, "--sizes"); err != nil {
					return err
				}
			}
			if large {
				opts.Sizes = append(opts.Sizes, egress.Large...)
			}
			if f.Changed("rounds") {
				opts.Rounds = rounds
			}
			if f.Changed("window") {
				opts.Window = window
			}
			if f.Changed("budget") {
				opts.Budget = budget
			}
			opts.Methods, opts.Destinations = methods, dests
			if err := opts.Validate(); err != nil {
				return err
			}
			return runLab(g, "egress", out, func(dir string, progress func(string)) (*egress.Report, error) {
				opts.Dir, opts.Progress = dir, progress
				return egress.Run(cmd.Context(), opts)
			}, renderEgress)
		},
	}
	fl := c.Flags()
	fl.BoolVar(&quick, "quick", false, "sizes 10, 10k and 1M, 2 rounds, 500 ms windows")
	fl.BoolVar(&large, "large", false, "add 10M and 50M prefixes")
	fl.StringSliceVar(&methods, "methods", nil, "methods to run, comma-separated (default all): "+strings.Join(egress.MethodNames(), ","))
	fl.StringVar(&sizes, "sizes", "10,100,1000,10000,100000,1000000", "list sizes, comma-separated")
	fl.StringVar(&dests, "destinations", "many", "many (4,096 addresses) or one (the study's single server address)")
	fl.IntVar(&rounds, "rounds", egress.Full.Rounds, "rounds (the report gives median and min-max)")
	fl.DurationVar(&window, "window", egress.Full.Window, "length of each throughput test")
	fl.DurationVar(&budget, "budget", egress.Full.Budget, "a method whose set-up takes longer is reported as over budget")
	fl.StringVar(&out, "out", "", "directory for egress.json, egress.csv and the charts (default ./lab-egress-TIME)")
	return c
}

// runLab is what the lab commands share: root, the output and work
// directories, progress, the report's files written also when the run
// stops short, and the table or JSON.
func runLab[R any, P interface {
	*R
	WriteFiles(dir string) ([]string, error)
}](g *globals, name, out string, run func(dir string, progress func(string)) (P, error), render func(io.Writer, P)) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("lab %s needs root: it creates network namespaces and loads BPF programs (run it with sudo)", name)
	}
	if out == "" {
		out = "lab-" + name + "-" + time.Now().Format("20060102-150405")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "rampart-lab-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	progress, clearProgress := g.progressLine()
	rep, err := run(work, progress)
	clearProgress()
	if rep == nil { // a run that could not start has no report
		return err
	}
	files, werr := rep.WriteFiles(out)
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("interrupted: the lab's namespaces, rules and pins are removed; partial results in %s", out)
	}
	if err != nil {
		return fmt.Errorf("%w (the lab's namespaces, rules and pins are removed; partial results in %s)", err, out)
	}
	if werr != nil {
		return werr
	}
	if g.json {
		return g.printJSON(rep)
	}
	render(g.env.Stdout, rep)
	fmt.Fprintf(g.env.Stdout, "\nwrote %s\n", strings.Join(files, ", "))
	return nil
}

// progressLine draws progress on one line of stderr when it is a terminal
// (say is nil otherwise); clear wipes the line.
func (g *globals) progressLine() (say func(string), clear func()) {
	if !g.interactive() {
		return nil, func() {}
	}
	say = func(msg string) { fmt.Fprintf(g.env.Stderr, "\r\033[K%s", msg) }
	return say, func() { fmt.Fprint(g.env.Stderr, "\r\033[K") }
}

// families reads --family.
func families(s string) ([]int, error) {
	switch s {
	case "4":
		return []int{4}, nil
	case "6":
		return []int{6}, nil
	case "both":
		return []int{4, 6}, nil
	}
	return nil, fmt.Errorf("--family %q: give 4, 6 or both", s)
}

func labDropCmd(g *globals) *cobra.Command {
	var (
		quick, unlisted  bool
		layers           []string
		family, out      string
		src4, src6       string
		warmup, window   time.Duration
		repeats, sources int
	)
	c := &cobra.Command{
		Use:   "drop [--quick] [--layers a,b,...] [--family 4|6|both] [--list-size N] [--unlisted] [--out DIR]",
		Short: "How many packets per second each layer of the stack drops, rampart beside them",
		Long: `drop floods a veth pair between two network namespaces of its own with an
in-kernel generator (BPF_PROG_RUN in live-frames mode: random sources and
ports, one flow per packet, as in the study) and measures, layer by layer,
how fast the receiving CPU drops it: ` + strings.Join(drop.LayerNames(), ", ") + `.

The list-based layers (ipset, nft-set, xdp-lpm, xdp-filter, rampart) drop
by a list of the flood's own sources (--list-size, 1M by default), each
loaded with the same list; their set-up time, list loaded, is reported.
rampart applies a real policy. With --unlisted, rampart's list holds as many
other sources, none of the flood's, and a rule after the list's drops the
flood: what a frame the list does not hold costs, against the same floor
(only rampart and xdp-floor run). Each layer is set up fresh and torn down
after; the namespaces, links, pins, sets and rules go away also on Ctrl-C
or failure.

It writes drop.json, drop.csv, drop.png and drop.svg (log-scale bar chart)
to --out and prints a table with the study's numbers beside the run's.`,
		Example: `  rampart lab drop --quick
  rampart lab drop --layers iptables-raw,xdp-native,rampart --family 4 --out /tmp/lab
  rampart lab drop --layers rampart --unlisted`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := drop.Full
			if quick {
				opts = drop.Quick
			}
			f := cmd.Flags()
			if f.Changed("warmup") {
				opts.Warmup = warmup
			}
			if f.Changed("window") {
				opts.Window = window
			}
			if f.Changed("repeats") {
				opts.Repeats = repeats
			}
			opts.Layers, opts.Sources, opts.Unlisted = layers, sources, unlisted
			var err error
			if opts.Families, err = families(family); err != nil {
				return err
			}
			if opts.Src4, err = netip.ParsePrefix(src4); err != nil {
				return fmt.Errorf("--src4: %w", err)
			}
			if opts.Src6, err = netip.ParsePrefix(src6); err != nil {
				return fmt.Errorf("--src6: %w", err)
			}
			if err := opts.Validate(); err != nil {
				return err
			}
			return runLab(g, "drop", out, func(dir string, progress func(string)) (*drop.Report, error) {
				opts.Dir, opts.Progress = dir, progress
				return drop.Run(cmd.Context(), opts)
			}, renderDrop)
		},
	}
	fl := c.Flags()
	fl.BoolVar(&quick, "quick", false, "fewer and shorter windows (under two minutes for every layer and both families)")
	fl.StringSliceVar(&layers, "layers", nil, "layers to run, comma-separated (default all): "+strings.Join(drop.LayerNames(), ","))
	fl.StringVar(&family, "family", "both", "4, 6 or both")
	fl.StringVar(&out, "out", "", "directory for drop.json, drop.csv, drop.png and drop.svg (default ./lab-drop-TIME)")
	fl.DurationVar(&warmup, "warmup", drop.Full.Warmup, "flood time before the first window")
	fl.DurationVar(&window, "window", drop.Full.Window, "length of one measurement window")
	fl.IntVar(&repeats, "repeats", drop.Full.Repeats, "windows per layer (the report gives median and min-max)")
	fl.IntVar(&sources, "list-size", drop.DefaultSources, "flood sources per family, the list the list-based layers load")
	fl.IntVar(&sources, "sources", drop.DefaultSources, "")
	fl.MarkDeprecated("sources", "use --list-size")
	fl.StringVar(&src4, "src4", lab.DefaultSrc4.String(), "range the IPv4 flood's sources are drawn from")
	fl.StringVar(&src6, "src6", lab.DefaultSrc6.String(), "range the IPv6 flood's sources are drawn from (one /64 each)")
	fl.BoolVar(&unlisted, "unlisted", false, "rampart's list holds as many other sources, none of the flood's (runs rampart and xdp-floor only)")
	return c
}

func labProxyCmd(g *globals) *cobra.Command {
	o := labproxy.Options{}
	var methods string
	c := &cobra.Command{
		Use:   "proxy [--window 3s] [--rounds 2] [--sessions 100000] [--methods direct,rampart,haproxy,nginx]",
		Short: "rampart proxy against direct routing, HAProxy and nginx stream, transparent, in three namespaces",
		Long: `proxy builds three namespaces (a client, the proxy's host, a backend on
its other link) and measures, per method, in interleaved rounds with a
fresh topology each: one- and 16-connection TCP throughput (iperf3), new
connections per second (16 clients; the backend answers two bytes and
closes), and UDP packets per second reaching the backend from --sessions
client sessions (the client's address over as many source ports, sent
through a raw socket). direct is routed through the proxy's host with no
proxy; rampart, HAProxy (source 0.0.0.0 usesrc clientip; no UDP) and
nginx stream (proxy_bind $remote_addr transparent) connect from the
client's address, checked at the backend. For rampart it also reads the
proxy's resident memory at 1,000 sessions and at --sessions. Sessions are
capped by the descriptor limit (RLIMIT_NOFILE less 2,000), which it raises
when it runs as root.`,
		Example: "  rampart lab proxy --json > proxy.json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Window < time.Second || o.Rounds < 1 || o.Sessions < 1000 {
				return fmt.Errorf("--window must be at least 1s, --rounds at least 1, --sessions at least 1000")
			}
			for _, m := range strings.Split(methods, ",") {
				if !slices.Contains(labproxy.Methods, m) {
					return fmt.Errorf("--methods: %q is not one of %s", m, strings.Join(labproxy.Methods, ","))
				}
				o.Methods = append(o.Methods, m)
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			o.Exe = exe
			dir, err := os.MkdirTemp("", "rampart-lab-proxy-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			o.Dir = dir
			progress, clearProgress := g.progressLine()
			o.Progress = progress
			rep, err := labproxy.Run(cmd.Context(), o)
			clearProgress()
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(rep)
			}
			renderProxy(g.env.Stdout, cmd.CommandPath(), rep)
			return nil
		},
	}
	f := c.Flags()
	f.DurationVar(&o.Window, "window", 3*time.Second, "each measurement's length")
	f.IntVar(&o.Rounds, "rounds", 2, "interleaved rounds; medians are reported")
	f.IntVar(&o.Sessions, "sessions", 100000, "UDP client sessions")
	f.StringVar(&methods, "methods", strings.Join(labproxy.Methods, ","), "methods to compare")
	return c
}

func labCrowdSecCmd(g *globals) *cobra.Command {
	var sizes, bouncers string
	o := labcrowdsec.Options{Refresh: 20 * time.Second}
	c := &cobra.Command{
		Use:   "crowdsec [--sizes 1000,100000] [--bouncers rampart,cs-firewall-bouncer] [--refresh 20s]",
		Short: "CrowdSec's decisions through rampart and through cs-firewall-bouncer, side by side",
		Long: `Feeds one CrowdSec Local API (Debian's crowdsec, run offline with a
database of the run's own) to rampart serve and to cs-firewall-bouncer
(nftables mode, as its package configures it), each in namespaces of its
own, both polling every second. For each size it imports that many bans
with cscli, then bans the sender, and times until the sender's datagrams
stop reaching the receiver's socket: from the import's start and from its
end (the bouncers apply deltas in order, so the last ban enforced means
the import was); the bouncer's CPU time over that, and its memory. The
refresh check bans 1,000 addresses and the sender for --refresh, bans
them again for an hour halfway, and checks the sender 5 s after the
first expiry (cs-firewall-bouncer #509). Needs root, crowdsec and
crowdsec-firewall-bouncer.`,
		Example: "  rampart lab crowdsec --sizes 1000,100000,1000000 --json > crowdsec.json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range strings.Split(sizes, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 || n > 4_000_000 {
					return fmt.Errorf("--sizes: %q is not a count of decisions from 1 to 4000000", s)
				}
				o.Sizes = append(o.Sizes, n)
			}
			for _, b := range strings.Split(bouncers, ",") {
				if !slices.Contains(labcrowdsec.Bouncers, b) {
					return fmt.Errorf("--bouncers: %q is not one of %s", b, strings.Join(labcrowdsec.Bouncers, ","))
				}
				o.Bouncers = append(o.Bouncers, b)
			}
			if o.Refresh != 0 && o.Refresh < 10*time.Second {
				return fmt.Errorf("--refresh %s: give at least 10s (0 skips the check)", o.Refresh)
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			o.Exe = exe
			dir, err := os.MkdirTemp("", "rampart-lab-crowdsec-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			o.Dir = dir
			progress, clearProgress := g.progressLine()
			o.Progress = progress
			rep, err := labcrowdsec.Run(cmd.Context(), o)
			clearProgress()
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(rep)
			}
			renderCrowdSec(g.env.Stdout, cmd.CommandPath(), rep)
			return nil
		},
	}
	c.Flags().StringVar(&sizes, "sizes", "1000,100000", "decisions per import")
	c.Flags().StringVar(&bouncers, "bouncers", strings.Join(labcrowdsec.Bouncers, ","), "bouncers to compare")
	c.Flags().DurationVar(&o.Refresh, "refresh", o.Refresh, "the refresh check's first ban (0: no check)")
	return c
}
