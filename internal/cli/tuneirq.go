package cli

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/tune"
)

// irqFlags are the flags the tune irq subcommands share.
type irqFlags struct {
	root               string
	external, internal []string
}

func tuneIRQCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "irq plan|apply|check|confirm|rollback",
		Short: "Keep the external side's interrupts off the LAN's CPUs",
		Long: `irq puts the queues of the external interfaces (--external) and of the
internal ones (--internal) on disjoint CPUs, so a flood that saturates the
outside's CPUs leaves the LAN's traffic its own. Bonds count as all their
slaves, up or down. With several NUMA nodes each side gets its NICs' node
(split by cores when both sides' NICs share one); with one node the cores
are split in proportion to the queues, SMT siblings on the same side.
Queues are spread one per CPU, physical cores first, before any CPU takes
a second. RPS spreads NICs with one queue interrupt or none (veth,
single-queue virtio) over their side; XPS maps every CPU to one transmit
queue of each NIC. Isolated CPUs are left out.

plan prints the plan; apply writes smp_affinity_list, rps_cpus and
xps_cpus and keeps what they were; check reports what drifted since;
rollback restores; apply --confirm D rolls back by itself unless
'rampart tune irq confirm' runs within D.`,
		Example: `  rampart tune irq plan --external bond0 --internal bond1
  rampart tune irq apply --external eth0 --internal eth1 --irqbalance ban --confirm 60s
  rampart tune irq check`,
	}
	f := &irqFlags{}
	c.PersistentFlags().StringVar(&f.root, "root", "/", "read and write proc/, sys/, etc/ and var/ under this directory instead of /")
	c.AddCommand(irqPlanCmd(g, f), irqApplyCmd(g, f), irqCheckCmd(g, f), irqConfirmCmd(g, f), irqRollbackCmd(g, f), irqWatchdogCmd(g, f))
	return c
}

// addSides adds --external and --internal to cmd.
func (f *irqFlags) addSides(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&f.external, "external", nil, "interfaces or bonds facing the outside (comma-separated)")
	cmd.Flags().StringSliceVar(&f.internal, "internal", nil, "interfaces or bonds facing the LAN (comma-separated)")
}

// plan reads the machine under the root and plans the two sides.
func (f *irqFlags) plan() (*tune.IRQPlan, error) {
	if len(f.external) == 0 || len(f.internal) == 0 {
		return nil, errors.New("--external and --internal are required: the interfaces (or bonds) facing the outside and the LAN")
	}
	for _, e := range f.external {
		if slices.Contains(f.internal, e) {
			return nil, fmt.Errorf("%s is both --external and --internal", e)
		}
	}
	m, err := tune.ReadMachine(f.root, slices.Concat(f.external, f.internal))
	if err != nil {
		return nil, err
	}
	nExt := 0
	for _, n := range m.NICs {
		if slices.Contains(f.external, n.Name) || slices.Contains(f.external, n.Bond) {
			nExt++
		}
	}
	return tune.PlanIRQ(m, nExt)
}

func irqPlanCmd(g *globals, f *irqFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "plan --external IF[,IF…] --internal IF[,IF…]",
		Short: "Print where each queue's interrupt, RPS and XPS would go",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := f.plan()
			if err != nil {
				return err
			}
			return g.printIRQPlan(p)
		},
	}
	f.addSides(c)
	return c
}

func irqApplyCmd(g *globals, f *irqFlags) *cobra.Command {
	var irqbalance string
	var confirm time.Duration
	c := &cobra.Command{
		Use:   "apply --external IF[,IF…] --internal IF[,IF…] [--irqbalance ban|stop] [--confirm DURATION]",
		Short: "Write the plan; keep what it replaces for rollback",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if irqbalance != "" && irqbalance != "ban" && irqbalance != "stop" {
				return fmt.Errorf("--irqbalance %q: ban (it leaves these interrupts alone) or stop", irqbalance)
			}
			if cmd.Flags().Changed("confirm") && confirm <= 0 {
				return fmt.Errorf("--confirm %s: give the time to confirm in, e.g. --confirm 60s", confirm)
			}
			p, err := f.plan()
			if err != nil {
				return err
			}
			a, err := tune.ApplyIRQWatched(f.root, p, irqbalance, confirm)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]any{"applied": p, "confirm_deadline": a.Deadline})
			}
			if err := g.printIRQPlan(p); err != nil {
				return err
			}
			fmt.Fprintln(g.env.Stdout, "\napplied; rampart tune irq check reports drift, rampart tune irq rollback undoes it")
			if a.PendingToken != "" {
				fmt.Fprintf(g.env.Stdout, "rolls back at %s unless rampart tune irq confirm runs\n", a.Deadline.Format(time.RFC3339))
			}
			return nil
		},
	}
	f.addSides(c)
	c.Flags().StringVar(&irqbalance, "irqbalance", "", "when irqbalance runs: ban (add --banirq for these interrupts to its arguments) or stop (disable it)")
	c.Flags().DurationVar(&confirm, "confirm", 0, "roll back unless 'rampart tune irq confirm' runs within this time")
	return c
}

func irqCheckCmd(g *globals, f *irqFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Report the settings that drifted from the last apply (exit 1 if any)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, drift, err := tune.CheckIRQ(f.root)
			if err != nil {
				return err
			}
			if g.json {
				if err := g.printJSON(map[string]any{"applied_at": a.At, "settings": len(a.Writes), "drift": drift}); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(g.env.Stdout, "%d settings applied at %s", len(a.Writes), a.At.Format(time.RFC3339))
				if len(drift) == 0 {
					fmt.Fprintln(g.env.Stdout, ": all hold")
				} else {
					fmt.Fprintf(g.env.Stdout, ": %d drifted\n", len(drift))
					rows := [][]string{{"FILE", "PLANNED", "NOW"}}
					for _, d := range drift {
						rows = append(rows, []string{d.Path, d.Want, d.Got})
					}
					g.table(rows)
				}
			}
			if len(drift) > 0 {
				return fmt.Errorf("%d settings drifted from the plan: apply it again (and look for what changed them: irqbalance, a driver reset)", len(drift))
			}
			return nil
		},
	}
}

func irqConfirmCmd(g *globals, f *irqFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "confirm",
		Short: "Keep the plan applied with --confirm (stops its rollback)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tune.ConfirmIRQ(f.root); err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]any{"confirmed": true})
			}
			fmt.Fprintln(g.env.Stdout, "confirmed")
			return nil
		},
	}
}

func irqRollbackCmd(g *globals, f *irqFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rollback",
		Short: "Restore what the last apply replaced",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := tune.RollbackIRQ(f.root, "")
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]any{"restored": len(a.Writes)})
			}
			fmt.Fprintf(g.env.Stdout, "restored %d settings\n", len(a.Writes))
			return nil
		},
	}
}

// irqWatchdogCmd is started by tune irq apply --confirm; it is not for
// people.
func irqWatchdogCmd(g *globals, f *irqFlags) *cobra.Command {
	return rollbackWatchdogCmd(g, "Roll back an unconfirmed tune irq apply at its deadline", func(token string) ([]string, error) {
		a, err := tune.RollbackIRQ(f.root, token)
		if a == nil {
			return nil, err
		}
		return []string{fmt.Sprintf("not confirmed, rolled back %d settings", len(a.Writes))}, err
	})
}

func (g *globals) printIRQPlan(p *tune.IRQPlan) error {
	if g.json {
		return g.printJSON(p)
	}
	rows := [][]string{{"SIDE", "INTERFACES", "QUEUES", "CPUS", "NODES"}}
	for _, s := range []struct {
		name string
		side tune.Side
	}{{"external", p.External}, {"internal", p.Internal}} {
		rows = append(rows, []string{s.name, strings.Join(s.side.Ifaces, ","), fmt.Sprint(s.side.Queues), s.side.CPUs, fmt.Sprint(s.side.Nodes)})
	}
	g.table(rows)
	fmt.Fprintln(g.env.Stdout)
	rows = [][]string{{"IFACE", "QUEUE", "IRQ", "NAME", "CPUS"}}
	for _, a := range p.Assignments {
		rows = append(rows, []string{a.Iface, fmt.Sprint(a.Queue), fmt.Sprint(a.IRQ), a.Name, a.CPUs})
	}
	for _, r := range p.RPS {
		if r.CPUs != "" {
			rows = append(rows, []string{r.Iface, fmt.Sprint(r.Queue), "-", "rps", r.CPUs})
		}
	}
	g.table(rows)
	for _, n := range p.Notes {
		fmt.Fprintln(g.env.Stdout, "note:", n)
	}
	return nil
}
