// Package cli implements the rampart command line: one file per subcommand,
// each flags → an engine (or lab, diagnose, bench) call → rendering.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/yamlpos"
)

// Env is what a command may touch of its process, injected so that commands
// run in-process under test.
type Env struct {
	Stdout io.Writer
	Stderr io.Writer
}

// globals are the flags every command takes.
type globals struct {
	json      bool
	netns     string
	pinRoot   string
	stateRoot string
	env       Env
}

// Run executes one command line (without the program name). With --json an
// error is also printed on stdout as a JSON object, so that a reader of the
// output always gets JSON.
func Run(ctx context.Context, env Env, args []string) error {
	g := &globals{env: env}
	root := rootCmd(g)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var done printed
	if err != nil && !errors.As(err, &done) && (g.json || slices.Contains(args, "--json")) {
		g.printJSON(map[string]any{"error": errorJSON(err)})
	}
	return err
}

// printed is an error the command has already put in its JSON output.
type printed struct{ error }

func (p printed) Unwrap() error { return p.error }

// rootCmd builds the command table.
func rootCmd(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "rampart",
		Short: "A host firewall for packet floods: XDP and tc filtering, prefix lists at scale, drop diagnosis",
		Long: `rampart compiles one declarative policy into BPF programs, attaches them at the
fastest layer an interface offers (XDP native, XDP generic, tc), swaps them
atomically and keeps them pinned so they outlive the command.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(g.env.Stdout)
	root.SetErr(g.env.Stderr)
	pf := root.PersistentFlags()
	pf.BoolVar(&g.json, "json", false, "print machine-readable JSON")
	pf.StringVar(&g.netns, "netns", "", "act on the interfaces of this named network namespace (like ip -n); pins stay in the host's bpffs")
	pf.StringVar(&g.pinRoot, "pin-root", envOr("RAMPART_PIN_ROOT", engine.DefaultPinRoot), "bpffs directory rampart pins its objects in ($RAMPART_PIN_ROOT)")
	pf.StringVar(&g.stateRoot, "state-root", envOr("RAMPART_STATE_ROOT", engine.DefaultStateRoot), "directory rampart keeps its state in ($RAMPART_STATE_ROOT)")
	root.AddCommand(
		applyCmd(g),
		detachCmd(g),
		reattachCmd(g),
		confirmCmd(g),
		statusCmd(g),
		statsCmd(g),
		checkCmd(g),
		watchdogCmd(g),
		listCmd(g),
		expirerCmd(g),
		benchCmd(g),
		labCmd(g),
		diagnoseCmd(g),
		tuneCmd(g),
		proxyCmd(g),
		serveCmd(g),
		flowspecCmd(g),
		genManCmd(g),
		versionCmd(g),
	)
	root.Version = readBuildInfo().short()
	root.SetVersionTemplate("{{.Version}}\n")
	return root
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Main is the binary's entry point: it runs and turns an error into exit 1.
func Main() {
	ctx, stop := signalContext()
	defer stop()
	if err := Run(ctx, Env{Stdout: os.Stdout, Stderr: os.Stderr}, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "rampart:", err)
		os.Exit(1)
	}
}

// errorJSON is an error as JSON: its message and, for an error in a file
// (a policy, a list, a proxy file), where.
func errorJSON(err error) map[string]any {
	out := map[string]any{"message": err.Error()}
	var pe *yamlpos.Error
	if errors.As(err, &pe) {
		out["file"], out["line"], out["field"] = pe.File, pe.Line, pe.Field
	}
	return out
}

// options place the engine by the global flags.
func (g *globals) options() engine.Options {
	return engine.Options{PinRoot: g.pinRoot, StateRoot: g.stateRoot, Netns: g.netns}
}

// firewall is the engine for the global flags.
func (g *globals) firewall() (*engine.Firewall, error) {
	return engine.New(g.options())
}

// loadingFirewall is the engine of a command that loads policies (apply,
// serve): the firewall with the operator's cap on table memory.
func (g *globals) loadingFirewall() (*engine.Firewall, error) {
	opt := g.options()
	var err error
	if opt.MaxTableBytes, err = maxTableBytes(); err != nil {
		return nil, err
	}
	return engine.New(opt)
}

// maxTableBytes is the operator's cap on the kernel memory of a policy's
// tables, $RAMPART_MAX_TABLE_BYTES (0 when unset). Only the commands that
// load policies read it: a bad value stops no confirm or detach.
func maxTableBytes() (uint64, error) {
	s := os.Getenv("RAMPART_MAX_TABLE_BYTES")
	if s == "" {
		return 0, nil
	}
	limit, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("RAMPART_MAX_TABLE_BYTES=%q: want a number of bytes", s)
	}
	return limit, nil
}

// recovered opens the firewall and first finishes what earlier commands
// left (rollbacks past their deadline, crashed applies), saying what it did.
func (g *globals) recovered() (*engine.Firewall, error) {
	return g.recover(g.firewall())
}

// recover finishes, on a firewall just opened, what earlier commands left.
func (g *globals) recover(fw *engine.Firewall, err error) (*engine.Firewall, error) {
	if err != nil {
		return nil, err
	}
	notes, err := fw.Recover()
	g.notes(notes)
	return fw, err
}

// everywhere is the firewall of --netns, or without it one for every
// namespace rampart holds something for (reports cover them all), each
// recovered first.
func (g *globals) everywhere() ([]*engine.Firewall, error) {
	if g.netns != "" {
		fw, err := g.recovered()
		return []*engine.Firewall{fw}, err
	}
	fws, err := engine.All(g.options())
	if err != nil {
		return nil, err
	}
	for _, fw := range fws {
		notes, err := fw.Recover()
		g.notes(notes)
		if err != nil {
			return nil, err
		}
	}
	return fws, nil
}

// warnings prints what the engine warns of on stderr.
func (g *globals) warnings(lines []string) {
	for _, l := range lines {
		fmt.Fprintln(g.env.Stderr, "rampart: warning:", l)
	}
}

// notes prints the engine's notes on stderr.
func (g *globals) notes(lines []string) {
	for _, l := range lines {
		fmt.Fprintln(g.env.Stderr, "rampart:", l)
	}
}

func (g *globals) printJSON(v any) error {
	enc := json.NewEncoder(g.env.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table prints rows aligned in columns; the first row is the header.
func (g *globals) table(rows [][]string) {
	tw := tabwriter.NewWriter(g.env.Stdout, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

// interactive reports whether progress may be drawn: only on a terminal.
func (g *globals) interactive() bool {
	f, ok := g.env.Stderr.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// loadPolicy reads a policy and its lists, drawing progress on a terminal
// while big list files are read, and reporting skipped lines and warnings.
func (g *globals) loadPolicy(ctx context.Context, file string, lenient bool) (*policy.Policy, error) {
	opt := policy.Options{Lenient: lenient, Context: ctx}
	if g.interactive() {
		opt.Progress = func(name string, read, total int64) {
			fmt.Fprintf(g.env.Stderr, "\rreading %s: %3.0f%% (%d MiB)", filepath.Base(name), 100*float64(read)/float64(max(total, 1)), read>>20)
			if read >= total {
				fmt.Fprintln(g.env.Stderr)
			}
		}
	}
	pol, err := policy.Load(file, opt)
	if err != nil {
		return nil, err
	}
	for _, name := range pol.ListNames() {
		if l := pol.Lists[name]; l.Skipped > 0 {
			fmt.Fprintf(g.env.Stderr, "rampart: list %s: skipped %d bad lines (first: %s)\n", l.Name, l.Skipped, l.FirstSkipped)
		}
	}
	for _, w := range pol.Warnings {
		fmt.Fprintln(g.env.Stderr, "rampart: warning:", w.Error())
	}
	return pol, nil
}

func inNetns(ns string) string {
	if ns == "" {
		return ""
	}
	return " (netns " + ns + ")"
}
