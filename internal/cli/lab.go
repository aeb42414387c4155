package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/lab"
)

func labCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "lab",
		Short: "Reproduce packet-filtering studies in network namespaces of its own",
	}
	c.AddCommand(labDropCmd(g), labFloodCmd(g))
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

Rows: ` + strings.Join(lab.DefenceNames(), ", ") + `; each defence
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
			opts := lab.FloodFull
			if quick {
				opts = lab.FloodQuick
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
			return runLab(g, "flood", out, func(dir string, progress func(string)) (*lab.FloodReport, error) {
				opts.Dir, opts.Progress = dir, progress
				return lab.Flood(cmd.Context(), opts)
			}, func(rep *lab.FloodReport, out string) ([]string, error) {
				return writeReport(out, "flood", rep, rep.Chart)
			})
		},
	}
	fl := c.Flags()
	fl.BoolVar(&quick, "quick", false, "shorter windows (about a minute for every row and both families)")
	fl.StringSliceVar(&floods, "floods", nil, "floods to run, comma-separated (default all): "+strings.Join(lab.FloodNames, ","))
	fl.StringSliceVar(&defences, "defences", nil, "defences to run, comma-separated (default all): "+strings.Join(lab.DefenceNames(), ","))
	fl.StringVar(&family, "family", "both", "4, 6 or both")
	fl.StringVar(&out, "out", "", "directory for flood.json, flood.png and flood.svg (default ./lab-flood-TIME)")
	fl.DurationVar(&warmup, "warmup", lab.FloodFull.Warmup, "flood time before the window")
	fl.DurationVar(&window, "window", lab.FloodFull.Window, "length of the measurement window")
	fl.IntVar(&tcpRate, "tcp-rate", lab.FloodFull.TCPRate, "legitimate TCP connections per second")
	fl.IntVar(&udpRate, "udp-rate", lab.FloodFull.UDPRate, "legitimate UDP requests per second")
	fl.IntVar(&sources, "sources", lab.FloodFull.Sources, "sources of the sources flood")
	return c
}

// runLab is what the lab commands share: root, the output and work
// directories, progress, the report written also when the run stops short,
// and the table or JSON.
func runLab[R interface{ WriteTable(io.Writer) }](g *globals, name, out string,
	run func(dir string, progress func(string)) (R, error), write func(R, string) ([]string, error)) error {
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
	var progress func(string)
	if g.interactive() {
		progress = func(msg string) { fmt.Fprintf(g.env.Stderr, "\r\033[K%s", msg) }
	}
	rep, err := run(work, progress)
	if progress != nil {
		fmt.Fprint(g.env.Stderr, "\r\033[K")
	}
	if reflect.ValueOf(rep).IsNil() { // a run that could not start has no report
		return err
	}
	files, werr := write(rep, out)
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
	rep.WriteTable(g.env.Stdout)
	fmt.Fprintf(g.env.Stdout, "\nwrote %s\n", strings.Join(files, ", "))
	return nil
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

// writeReport writes a lab report as NAME.json and its chart as NAME.png
// and NAME.svg.
func writeReport(dir, name string, rep any, chart func(format string) ([]byte, error)) ([]string, error) {
	var files []string
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, name+".json")
	files = append(files, p)
	if err := os.WriteFile(p, append(js, '\n'), 0o644); err != nil {
		return files, err
	}
	for _, format := range []string{"png", "svg"} {
		b, err := chart(format)
		if err != nil {
			return files, fmt.Errorf("chart: %w", err)
		}
		p := filepath.Join(dir, name+"."+format)
		files = append(files, p)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return files, err
		}
	}
	return files, nil
}

func labDropCmd(g *globals) *cobra.Command {
	var (
		quick            bool
		layers           []string
		family, out      string
		src4, src6       string
		warmup, window   time.Duration
		repeats, sources int
	)
	c := &cobra.Command{
		Use:   "drop [--quick] [--layers a,b,...] [--family 4|6|both] [--list-size N] [--out DIR]",
		Short: "How many packets per second each layer of the stack drops, rampart beside them",
		Long: `drop floods a veth pair between two network namespaces of its own with an
in-kernel generator (BPF_PROG_RUN in live-frames mode: random sources and
ports, one flow per packet, as in the study) and measures, layer by layer,
how fast the receiving CPU drops it: ` + strings.Join(lab.LayerNames(), ", ") + `.

The list-based layers (ipset, nft-set, xdp-lpm, xdp-filter, rampart) drop
by a list of the flood's own sources (--list-size, 1M by default), each
loaded with the same list; their set-up time, list loaded, is reported.
rampart applies a real policy. Each layer is set up fresh and torn down
after; the namespaces, links, pins, sets and rules go away also on Ctrl-C
or failure.

It writes drop.json, drop.csv, drop.png and drop.svg (log-scale bar chart)
to --out and prints a table with the study's numbers beside the run's.`,
		Example: `  rampart lab drop --quick
  rampart lab drop --layers iptables-raw,xdp-native,rampart --family 4 --out /tmp/lab`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := lab.Full
			if quick {
				opts = lab.Quick
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
			opts.Layers, opts.Sources = layers, sources
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
			return runLab(g, "drop", out, func(dir string, progress func(string)) (*lab.Report, error) {
				opts.Dir, opts.Progress = dir, progress
				return lab.Drop(cmd.Context(), opts)
			}, writeLabFiles)
		},
	}
	fl := c.Flags()
	fl.BoolVar(&quick, "quick", false, "fewer and shorter windows (under two minutes for every layer and both families)")
	fl.StringSliceVar(&layers, "layers", nil, "layers to run, comma-separated (default all): "+strings.Join(lab.LayerNames(), ","))
	fl.StringVar(&family, "family", "both", "4, 6 or both")
	fl.StringVar(&out, "out", "", "directory for drop.json, drop.csv, drop.png and drop.svg (default ./lab-drop-TIME)")
	fl.DurationVar(&warmup, "warmup", lab.Full.Warmup, "flood time before the first window")
	fl.DurationVar(&window, "window", lab.Full.Window, "length of one measurement window")
	fl.IntVar(&repeats, "repeats", lab.Full.Repeats, "windows per layer (the report gives median and min-max)")
	fl.IntVar(&sources, "list-size", lab.DefaultSources, "flood sources per family, the list the list-based layers load")
	fl.IntVar(&sources, "sources", lab.DefaultSources, "")
	fl.MarkDeprecated("sources", "use --list-size")
	fl.StringVar(&src4, "src4", lab.DefaultSrc4.String(), "range the IPv4 flood's sources are drawn from")
	fl.StringVar(&src6, "src6", lab.DefaultSrc6.String(), "range the IPv6 flood's sources are drawn from (one /64 each)")
	return c
}

// writeLabFiles writes the report as JSON, CSV and the charts.
func writeLabFiles(rep *lab.Report, dir string) ([]string, error) {
	var files []string
	write := func(name string, data []byte) error {
		p := filepath.Join(dir, name)
		files = append(files, p)
		return os.WriteFile(p, data, 0o644)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, err
	}
	var csvb bytes.Buffer
	if err := rep.WriteCSV(&csvb); err != nil {
		return nil, err
	}
	if err := write("drop.json", append(js, '\n')); err != nil {
		return nil, err
	}
	if err := write("drop.csv", csvb.Bytes()); err != nil {
		return nil, err
	}
	for _, format := range []string{"png", "svg"} {
		b, err := rep.Chart(format)
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		if err := write("drop."+format, b); err != nil {
			return nil, err
		}
	}
	return files, nil
}
