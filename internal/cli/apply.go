package cli

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/gcpace"
	"github.com/rampart-fw/rampart/internal/serve"
)

func applyCmd(g *globals) *cobra.Command {
	var (
		file    string
		ifaces  []string
		mode    string
		egress  bool
		force   bool
		lenient bool
		confirm time.Duration
	)
	c := &cobra.Command{
		Use:   "apply -f POLICY --iface IF [--iface IF2] [--mode auto|xdp-native|xdp-generic|tc] [--egress] [--confirm 60s]",
		Short: "Compile a policy and attach or atomically swap it on interfaces",
		Long: `apply validates the policy and fills it into fresh maps: a new generation of
the running program when the policy fits its shape (no program is loaded),
else a new program. One flip of the generation, or one link update, swaps it
in, so no packet sees a half-written policy. Counters of
rules whose name and match are unchanged carry over. Several interfaces are
changed all or nothing.

--mode auto tries XDP native, then XDP generic, then tc; beside another XDP
program (a libxdp dispatcher, say) it runs at tc and says so. tc attaches
with tcx, or before Linux 6.6 as a clsact filter. --egress filters outgoing
traffic with tc instead of incoming. With --confirm DURATION the previous
policy comes back by itself unless 'rampart confirm' runs in time, even if
this command is killed.`,
		Example: `  rampart apply -f /etc/rampart/policy.yaml --iface eth0
  rampart apply -f policy.yaml --iface eth0 --confirm 60s && rampart confirm`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("--file/-f is required: the policy to apply")
			}
			if len(ifaces) == 0 {
				return errors.New("--iface is required: the interface(s) to filter")
			}
			m, err := datapath.ParseMode(mode)
			if err != nil {
				return err
			}
			if egress && (m == datapath.ModeXDPNative || m == datapath.ModeXDPGeneric) {
				return fmt.Errorf("--mode %s with --egress: XDP sees only incoming packets; egress uses tc (--mode tc or auto)", m)
			}
			if cmd.Flags().Changed("confirm") && confirm <= 0 {
				return fmt.Errorf("--confirm %s: give the time to confirm in, e.g. --confirm 60s", confirm)
			}
			fw, err := g.loadingFirewall()
			if err != nil {
				return err
			}
			datapath.ParseAhead()
			gcpace.Lazy()
			pol, err := g.loadPolicy(cmd.Context(), file, lenient)
			if err != nil {
				return err
			}
			if pol.CrowdSec != nil {
				n, err := serve.SavedDecisions(fw, pol)
				if err != nil {
					return fmt.Errorf("the CrowdSec decisions the service saved: %w", err)
				}
				g.warnings([]string{fmt.Sprintf("list %q holds the %d CrowdSec decisions rampart serve saved last; only rampart serve follows the LAPI", pol.CrowdSec.List, n)})
			}
			res, err := fw.Apply(engine.ApplyRequest{Policy: pol, Ifaces: ifaces, Mode: m, Egress: egress, Force: force, Confirm: confirm, RangesDone: true})
			if res != nil {
				g.notes(res.Recovered)
				g.warnings(res.Warnings)
			}
			if err != nil {
				return err
			}
			return g.printApplied(res)
		},
	}
	f := c.Flags()
	f.StringVarP(&file, "file", "f", "", "policy file (YAML)")
	f.StringArrayVar(&ifaces, "iface", nil, "interface to filter (repeat for several)")
	f.StringVar(&mode, "mode", "auto", "layer: auto, xdp-native, xdp-generic or tc")
	f.BoolVar(&egress, "egress", false, "filter outgoing packets (tc egress) instead of incoming")
	f.BoolVar(&force, "force", false, "replace another program's XDP on the interface")
	f.DurationVar(&confirm, "confirm", 0, "roll back unless 'rampart confirm' runs within this time")
	f.BoolVar(&lenient, "lenient", false, "skip bad lines in list files (their count is reported) instead of failing")
	return c
}

func (g *globals) printApplied(res *engine.ApplyResult) error {
	if g.json {
		var deadline any
		if !res.ConfirmDeadline.IsZero() {
			deadline = res.ConfirmDeadline
		}
		applied := res.Applied
		if applied == nil {
			applied = []engine.Applied{}
		}
		return g.printJSON(map[string]any{"applied": applied, "netns": g.netns, "confirm_deadline": deadline, "live_changes": nonNil(res.LiveChanges), "warnings": nonNil(res.Warnings)})
	}
	rows := [][]string{{"IFACE", "DIRECTION", "MODE", "RULES", "POLICY", "GEN"}}
	for _, a := range res.Applied {
		rows = append(rows, []string{a.Iface + inNetns(g.netns), a.Direction(), string(a.Mode), strconv.Itoa(a.Rules), a.PolicyHash[:12], strconv.Itoa(a.Generation)})
	}
	g.table(rows)
	for _, a := range res.Applied {
		if a.Note != "" {
			fmt.Fprintf(g.env.Stdout, "%s: %s\n", a.Iface, a.Note)
		}
		if a.FileChanges > 0 {
			fmt.Fprintf(g.env.Stdout, "%s: the lists' changes went into the overlay over the tables, as %d prefixes\n", a.Iface, a.FileChanges)
		}
	}
	if n := len(res.LiveChanges); n > 0 {
		fmt.Fprintf(g.env.Stdout, "%d live list changes override the list files (rampart list show; rampart list revert to drop them).\n", n)
	}
	if !res.ConfirmDeadline.IsZero() {
		fmt.Fprintf(g.env.Stdout, "Run 'rampart confirm' before %s or the previous policy comes back.\n", res.ConfirmDeadline.Local().Format(time.TimeOnly))
	}
	return nil
}

// nonNil keeps an empty list a JSON [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
