package cli

import (
	"strconv"
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
			for _, fw := range fws {
				hs, err := fw.Status()
				if err != nil {
					return err
				}
				hooks = append(hooks, hs...)
			}
			if g.json {
				return g.printJSON(map[string]any{"hooks": hooks})
			}
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
				rows = append(rows, []string{h.Iface + inNetns(h.Netns), h.Direction, string(h.Mode), strconv.Itoa(h.Rules),
					hash, h.AppliedAt.Local().Format(time.DateTime), state})
			}
			g.table(rows)
			return nil
		},
	}
}
