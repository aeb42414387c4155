// Package cli implements the rampart command line: one file per subcommand.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Env is what a command may touch of its process, injected so that commands
// run in-process under test.
type Env struct {
	Stdout io.Writer
	Stderr io.Writer
}

// globals are the flags every command takes.
type globals struct {
	json  bool
	netns string
	env   Env
}

// Run executes one command line (without the program name).
func Run(ctx context.Context, env Env, args []string) error {
	g := &globals{env: env}
	root := &cobra.Command{
		Use:   "rampart",
		Short: "A host firewall for packet floods: XDP and tc filtering, prefix lists at scale, drop diagnosis",
		Long: `rampart compiles one declarative policy into BPF programs, attaches them at the
fastest layer an interface offers (XDP native, XDP generic, tc), swaps them
atomically and keeps them pinned so they outlive the command.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	root.SetArgs(args)
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print machine-readable JSON")
	root.PersistentFlags().StringVar(&g.netns, "netns", "", "act on the interfaces of this named network namespace (like ip -n); pins stay in the host's bpffs")
	root.AddCommand(
		applyCmd(g),
		detachCmd(g),
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
	)
	return root.ExecuteContext(ctx)
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

// lock takes rampart's host lock and first rolls back any unconfirmed apply
// past its deadline (its watchdog may have died with a reboot or a kill), so
// every command sees and changes the state the operator was promised.
func (g *globals) lock() (func(), error) {
	unlock, err := datapath.Lock()
	if err != nil {
		return nil, err
	}
	if hooks, err := datapath.Expired("", time.Now()); err != nil {
		fmt.Fprintln(g.env.Stderr, "rampart: warning: rolling back an expired apply:", err)
	} else {
		for _, h := range hooks {
			fmt.Fprintln(g.env.Stderr, "rampart: rolled back unconfirmed apply on", h)
		}
	}
	// Backstop for the expiry process: list changes past their TTL go now.
	if _, err := expireOps(g.netns); err != nil {
		fmt.Fprintln(g.env.Stderr, "rampart: warning: expiring list changes:", err)
	}
	return unlock, nil
}

// interactive reports whether progress may be drawn: only on a terminal.
func (g *globals) interactive() bool {
	f, ok := g.env.Stderr.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// loadPolicy reads a policy and its lists, drawing progress on a terminal
// while big list files are read and reporting lines skipped under lenient.
func (g *globals) loadPolicy(file string, lenient bool) (*policy.Policy, error) {
	opt := policy.Options{Lenient: lenient}
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
	for _, l := range pol.Lists {
		if l.Skipped > 0 {
			fmt.Fprintf(g.env.Stderr, "rampart: list %s: skipped %d bad lines (first: %s)\n", l.Name, l.Skipped, l.FirstSkipped)
		}
	}
	return pol, nil
}
