package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
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
	c.AddCommand(labDropCmd(g))
	return c
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
			switch family {
			case "4":
				opts.Families = []int{4}
			case "6":
				opts.Families = []int{6}
			case "both":
				opts.Families = []int{4, 6}
			default:
				return fmt.Errorf("--family %q: give 4, 6 or both", family)
			}
			var err error
			if opts.Src4, err = netip.ParsePrefix(src4); err != nil {
				return fmt.Errorf("--src4: %w", err)
			}
			if opts.Src6, err = netip.ParsePrefix(src6); err != nil {
				return fmt.Errorf("--src6: %w", err)
			}
			if err := opts.Validate(); err != nil {
				return err
			}
			if os.Geteuid() != 0 {
				return errors.New("lab drop needs root: it creates network namespaces and loads BPF programs (run it with sudo)")
			}
			if out == "" {
				out = "lab-drop-" + time.Now().Format("20060102-150405")
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			work, err := os.MkdirTemp("", "rampart-lab-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(work)
			opts.Dir = work
			if g.interactive() {
				opts.Progress = func(msg string) { fmt.Fprintf(g.env.Stderr, "\r\033[K%s", msg) }
			}
			rep, err := lab.Drop(cmd.Context(), opts)
			if g.interactive() {
				fmt.Fprint(g.env.Stderr, "\r\033[K")
			}
			if rep == nil {
				return err
			}
			files, werr := writeLabFiles(rep, out)
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
