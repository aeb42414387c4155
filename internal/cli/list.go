package cli

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/serve"
)

func listCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "list add|del|show|revert|flush",
		Short: "Change live prefix lists in place, without a reload",
		Long: `list add and list del change a list of the applied policy in place on every
interface that uses it: the big tables are not rebuilt, the change is live at
once. With --ttl the change undoes itself when the time is up (no upper
bound); without one it holds until list revert or list flush removes it, or
detach removes the last hook using the list. Changes survive a re-apply of
the policy while they last (apply says when they override the list files);
to make them permanent, put them in the list file.`,
	}
	c.AddCommand(listChangeCmd(g, true), listChangeCmd(g, false), listShowCmd(g), listRevertCmd(g), listFlushCmd(g))
	return c
}

// parseEntries reads addresses, prefixes and ranges given as arguments.
func parseEntries(args []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, a := range args {
		ps, err := policy.ParseEntry(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a, err)
		}
		out = append(out, ps...)
	}
	return out, nil
}

func listChangeCmd(g *globals, add bool) *cobra.Command {
	var ttl time.Duration
	verb := map[bool]string{true: "add", false: "del"}[add]
	c := &cobra.Command{
		Use:   verb + " NAME PREFIX... [--ttl 10m]",
		Short: map[bool]string{true: "Add prefixes or ranges to a live list", false: "Remove prefixes or ranges from a live list"}[add],
		Example: map[bool]string{
			true:  "  rampart list add blocklist 203.0.113.7 198.51.100.0/24 --ttl 10m",
			false: "  rampart list del blocklist 203.0.113.7 --ttl 1h",
		}[add],
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("ttl") && ttl <= 0 {
				return fmt.Errorf("--ttl %s: give how long the change holds, e.g. --ttl 10m", ttl)
			}
			prefixes, err := parseEntries(args[1:])
			if err != nil {
				return err
			}
			res, err := g.changeList(engine.ListChange{List: args[0], Prefixes: prefixes, Add: add, TTL: ttl})
			if err != nil {
				return err
			}
			var hooks []string
			for _, h := range res.Hooks {
				hooks = append(hooks, h.String()+inNetns(g.netns))
			}
			if g.json {
				var expires any
				if !res.Expires.IsZero() {
					expires = res.Expires
				}
				return g.printJSON(map[string]any{"list": args[0], "op": verb, "prefixes": prefixes, "expires": expires, "hooks": hooks})
			}
			fmt.Fprintf(g.env.Stdout, "%s: %s %d prefixes on %s", args[0], verb, len(prefixes), strings.Join(hooks, ", "))
			if !res.Expires.IsZero() {
				fmt.Fprintf(g.env.Stdout, " until %s", res.Expires.Local().Format(time.DateTime))
			} else {
				fmt.Fprint(g.env.Stdout, " until reverted (rampart list revert)")
			}
			fmt.Fprintln(g.env.Stdout)
			return nil
		},
	}
	c.Flags().DurationVar(&ttl, "ttl", 0, "undo the change after this long (e.g. 10m, 72h)")
	return c
}

func listShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show",
		Short: "Show the in-place changes that are live",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fw, err := g.recovered()
			if err != nil {
				return err
			}
			ops, err := fw.Changes()
			if err != nil {
				return err
			}
			return g.printChanges("changes", ops)
		},
	}
}

func (g *globals) printChanges(key string, ops []policy.ListOp) error {
	if g.json {
		return g.printJSON(map[string]any{key: nonNil(ops)})
	}
	rows := [][]string{{"LIST", "OP", "PREFIX", "EXPIRES"}}
	for _, op := range ops {
		exp := "never"
		if !op.Expires.IsZero() {
			exp = op.Expires.Local().Format(time.DateTime)
		}
		rows = append(rows, []string{op.List, map[bool]string{true: "add", false: "del"}[op.Add], op.Prefix.String(), exp})
	}
	g.table(rows)
	return nil
}

func listRevertCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "revert NAME [PREFIX...]",
		Short:   "Drop a list's live changes (or those of the given prefixes): the list files hold again",
		Example: "  rampart list revert blocklist 203.0.113.7\n  rampart list revert blocklist",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			prefixes, err := parseEntries(args[1:])
			if err != nil {
				return err
			}
			return g.revert(args[0], prefixes)
		},
	}
}

func listFlushCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "flush",
		Short: "Drop every live change of every list of the namespace",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return g.revert("", nil) },
	}
}

func (g *globals) revert(list string, prefixes []netip.Prefix) error {
	var removed []policy.ListOp
	api, err := g.service()
	if err != nil {
		return err
	}
	if api != nil {
		var out struct{ Removed []policy.ListOp }
		if err := api.Do("POST", "/v1/revert", serve.BanRequest{List: list, Prefixes: prefixStrings(prefixes)}, &out); err != nil {
			return err
		}
		removed = out.Removed
	} else {
		fw, err := g.recovered()
		if err != nil {
			return err
		}
		if removed, err = fw.RevertList(list, prefixes); err != nil {
			return err
		}
		if owed, err := fw.FoldOwed(); err == nil && owed {
			fmt.Fprintln(g.env.Stderr, "warning: rampart serve compiled some of these changes into the tables; they hold until the policy is applied again (start the service, or rampart apply)")
		}
	}
	if len(removed) == 0 && !g.json {
		return errors.New("no live change matched: nothing was reverted (rampart list show lists them)")
	}
	if !g.json {
		fmt.Fprintf(g.env.Stdout, "reverted %d changes:\n", len(removed))
	}
	return g.printChanges("reverted", removed)
}

// expirerCmd is started by list add|del --ttl; it is not for people.
func expirerCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "list-expire",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fw, err := g.firewall()
			if err != nil {
				return err
			}
			return fw.RunExpiry(cmd.Context(), func(err error) {
				fmt.Fprintln(g.env.Stderr, time.Now().Format(time.RFC3339), "expire list changes:", err)
			})
		},
	}
}

// service is the running service of the namespace the command names, nil
// when none runs: changes go through it, so that it keeps them (--persist)
// and holds their expiry.
func (g *globals) service() (*serve.Client, error) {
	return serve.Dial(serve.DefaultSocket(g.stateRoot, g.netns), g.netns)
}

func prefixStrings(ps []netip.Prefix) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// changeList adds or removes prefixes through the service when it runs,
// else through the engine.
func (g *globals) changeList(c engine.ListChange) (*engine.ListChanged, error) {
	api, err := g.service()
	if err != nil {
		return nil, err
	}
	if api != nil {
		req := serve.BanRequest{List: c.List, Prefixes: prefixStrings(c.Prefixes)}
		if c.TTL > 0 {
			req.TTL = c.TTL.String()
		}
		var out struct {
			Hooks   []engine.Hook
			Expires time.Time
		}
		path := map[bool]string{true: "/v1/ban", false: "/v1/unban"}[c.Add]
		if err := api.Do("POST", path, req, &out); err != nil {
			return nil, err
		}
		return &engine.ListChanged{Hooks: out.Hooks, Expires: out.Expires}, nil
	}
	fw, err := g.recovered()
	if err != nil {
		return nil, err
	}
	return fw.ChangeList(c)
}
