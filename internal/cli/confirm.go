package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/datapath"
)

func confirmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "confirm",
		Short: "Keep the policy applied with --confirm (stops its rollback)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			unlock, err := g.lock()
			if err != nil {
				return err
			}
			defer unlock()
			states, err := datapath.States(g.netns, g.netns == "")
			if err != nil {
				return err
			}
			var confirmed []string
			for _, st := range states {
				if st.Pending == nil {
					continue
				}
				if err := datapath.Confirm(st); err != nil {
					return err
				}
				confirmed = append(confirmed, st.Hook.String())
			}
			if len(confirmed) == 0 {
				return errors.New("no apply is waiting for confirmation (if its deadline passed, the previous policy is back: see rampart status)")
			}
			if g.json {
				return g.printJSON(map[string]any{"confirmed": confirmed})
			}
			for _, h := range confirmed {
				fmt.Fprintln(g.env.Stdout, "confirmed", h)
			}
			return nil
		},
	}
}

// watchdogCmd is started by apply --confirm; it is not for people.
func watchdogCmd(g *globals) *cobra.Command {
	var token, at string
	c := &cobra.Command{
		Use:    "rollback-watchdog --token T --at TIME",
		Short:  "Roll back an unconfirmed apply at its deadline (started by apply --confirm)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			deadline, err := time.Parse(time.RFC3339Nano, at)
			if err != nil {
				return fmt.Errorf("--at: %w", err)
			}
			select {
			case <-time.After(time.Until(deadline)):
			case <-cmd.Context().Done():
				return cmd.Context().Err()
			}
			unlock, err := datapath.Lock()
			if err != nil {
				return err
			}
			defer unlock()
			hooks, err := datapath.Expired(token, time.Now())
			for _, h := range hooks {
				fmt.Fprintf(g.env.Stdout, "%s: not confirmed by %s: rolled back %s\n", time.Now().UTC().Format(time.RFC3339), at, h)
			}
			return err
		},
	}
	c.Flags().StringVar(&token, "token", "", "the apply to watch")
	c.Flags().StringVar(&at, "at", "", "deadline (RFC 3339)")
	return c
}
