package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/tune"
)

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
	var root string
	c.PersistentFlags().StringVar(&root, "root", "/", "read and write proc/, sys/, etc/ and var/ under this directory instead of /")
	var ext, in []string
	var irqbalance string
	var confirm time.Duration
	plan := func() (*tune.IRQPlan, error) {
		if len(ext) == 0 || len(in) == 0 {
			return nil, errors.New("--external and --internal are required: the interfaces (or bonds) facing the outside and the LAN")
		}
		for _, e := range ext {
			if slices.Contains(in, e) {
				return nil, fmt.Errorf("%s is both --external and --internal", e)
			}
		}
		m, err := tune.ReadMachine(root, slices.Concat(ext, in))
		if err != nil {
			return nil, err
		}
		nExt := 0
		for _, n := range m.NICs {
			if slices.Contains(ext, n.Name) || slices.Contains(ext, n.Bond) {
				nExt++
			}
		}
		return tune.PlanIRQ(m, nExt)
	}
	sideFlags := func(cmd *cobra.Command) {
		cmd.Flags().StringSliceVar(&ext, "external", nil, "interfaces or bonds facing the outside (comma-separated)")
		cmd.Flags().StringSliceVar(&in, "internal", nil, "interfaces or bonds facing the LAN (comma-separated)")
	}
	planCmd := &cobra.Command{
		Use:   "plan --external IF[,IF…] --internal IF[,IF…]",
		Short: "Print where each queue's interrupt, RPS and XPS would go",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := plan()
			if err != nil {
				return err
			}
			return g.printIRQPlan(p)
		},
	}
	sideFlags(planCmd)
	applyCmd := &cobra.Command{
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
			p, err := plan()
			if err != nil {
				return err
			}
			var token string
			var deadline time.Time
			if confirm > 0 {
				b := make([]byte, 8)
				rand.Read(b)
				token, deadline = hex.EncodeToString(b), time.Now().Add(confirm)
			}
			if _, err := tune.ApplyIRQ(root, p, irqbalance, token, deadline); err != nil {
				return err
			}
			if token != "" {
				if err := spawnIRQWatchdog(root, token, deadline); err != nil {
					_, rerr := tune.RollbackIRQ(root, token)
					return errors.Join(fmt.Errorf("start the rollback watchdog: %w (the apply is rolled back)", err), rerr)
				}
			}
			if g.json {
				return g.printJSON(map[string]any{"applied": p, "confirm_deadline": deadline})
			}
			if err := g.printIRQPlan(p); err != nil {
				return err
			}
			fmt.Fprintln(g.env.Stdout, "\napplied; rampart tune irq check reports drift, rampart tune irq rollback undoes it")
			if token != "" {
				fmt.Fprintf(g.env.Stdout, "rolls back at %s unless rampart tune irq confirm runs\n", deadline.Format(time.RFC3339))
			}
			return nil
		},
	}
	sideFlags(applyCmd)
	applyCmd.Flags().StringVar(&irqbalance, "irqbalance", "", "when irqbalance runs: ban (add --banirq for these interrupts to its arguments) or stop (disable it)")
	applyCmd.Flags().DurationVar(&confirm, "confirm", 0, "roll back unless 'rampart tune irq confirm' runs within this time")
	checkCmd := &cobra.Command{
		Use:   "check",
		Short: "Report the settings that drifted from the last apply (exit 1 if any)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, drift, err := tune.CheckIRQ(root)
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
	confirmCmd := &cobra.Command{
		Use:   "confirm",
		Short: "Keep the plan applied with --confirm (stops its rollback)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tune.ConfirmIRQ(root); err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]any{"confirmed": true})
			}
			fmt.Fprintln(g.env.Stdout, "confirmed")
			return nil
		},
	}
	rollbackCmd := &cobra.Command{
		Use:   "rollback",
		Short: "Restore what the last apply replaced",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := tune.RollbackIRQ(root, "")
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
	var token, at string
	watchdog := &cobra.Command{
		Use:    "rollback-watchdog --token T --at TIME",
		Short:  "Roll back an unconfirmed tune irq apply at its deadline",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := sleepUntil(cmd.Context(), at); err != nil {
				return err
			}
			a, err := tune.RollbackIRQ(root, token)
			if a != nil {
				fmt.Fprintf(g.env.Stdout, "%s: not confirmed, rolled back %d settings\n", time.Now().UTC().Format(time.RFC3339), len(a.Writes))
			}
			return err
		},
	}
	watchdog.Flags().StringVar(&token, "token", "", "the apply to watch")
	watchdog.Flags().StringVar(&at, "at", "", "deadline (RFC 3339)")
	c.AddCommand(planCmd, applyCmd, checkCmd, confirmCmd, rollbackCmd, watchdog)
	return c
}

// spawnIRQWatchdog starts the process that rolls an unconfirmed apply
// back, in its own session so it outlives this command.
func spawnIRQWatchdog(root, token string, deadline time.Time) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "tune", "irq", "rollback-watchdog", "--root", root, "--token", token, "--at", deadline.UTC().Format(time.RFC3339Nano))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
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
