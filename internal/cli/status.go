package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/engine"
)

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show where rampart is attached, at which layer, with which policy, as the kernel runs it",
		Long: `status reports every hook of the namespace given with --netns (of every
namespace without it) from what the kernel runs: a hook whose interface was deleted, or recreated,
or whose link was removed outside rampart, is reported as such with the
command that puts it right.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fws, err := g.everywhere()
			if err != nil {
				return err
			}
			hooks := []engine.HookStatus{}
			warnings := []string{}
			unpinned := []engine.UnpinnedHook{}
			for _, fw := range fws {
				hs, err := fw.Status()
				if err != nil {
					return err
				}
				hooks = append(hooks, hs...)
				found, err := fw.Unpinned()
				if err != nil {
					return err
				}
				unpinned = append(unpinned, found...)
				if len(hs) > 0 {
					w, _ := fw.UnfilteredTunnels() // a namespace that is gone has none to warn of
					warnings = append(warnings, w...)
				}
			}
			// Status shows what it found, then fails when rampart's own
			// record of a hook is unreadable: nothing it says of it holds.
			var unreadable []string
			for _, h := range hooks {
				if h.State == engine.StateUnreadable {
					unreadable = append(unreadable, h.Problem)
				}
			}
			var bad error
			if len(unreadable) > 0 {
				bad = fmt.Errorf("rampart's record of %d hook(s) is unreadable (%s): the fix column says how to write it anew", len(unreadable), strings.Join(unreadable, "; "))
			}
			if g.json {
				out := map[string]any{"hooks": hooks, "unpinned": unpinned, "warnings": warnings}
				if bad == nil {
					return g.printJSON(out)
				}
				out["error"] = errorJSON(bad)
				g.printJSON(out)
				return printed{bad}
			}
			g.warnings(warnings)
			rows := [][]string{{"IFACE", "DIRECTION", "MODE", "RULES", "POLICY", "APPLIED", "STATE"}}
			for _, h := range hooks {
				state := h.State
				if h.ConfirmDeadline != nil {
					state += " until " + h.ConfirmDeadline.Local().Format(time.TimeOnly)
				}
				if h.Fix != "" {
					state += ": " + h.Fix
				}
				hash := h.PolicyHash
				if len(hash) > 12 {
					hash = hash[:12]
				}
				applied := "-"
				if !h.AppliedAt.IsZero() {
					applied = h.AppliedAt.Local().Format(time.DateTime)
				}
				rows = append(rows, []string{h.Iface + inNetns(h.Netns), h.Direction, string(h.Mode), strconv.Itoa(h.Rules),
					hash, applied, state})
			}
			g.table(rows)
			if len(unpinned) > 0 {
				fmt.Fprintf(g.env.Stdout, "\nrampart programs the kernel runs that no pin under %s accounts for (a pin root mounted over, or another root's):\n", g.pinRoot)
				for _, u := range unpinned {
					fmt.Fprintf(g.env.Stdout, "  %s%s: remove with %s\n", u.String(), inNetns(u.Netns), u.Fix)
				}
			}
			return bad
		},
	}
}
