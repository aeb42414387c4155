package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/watchdog"
)

func confirmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "confirm",
		Short: "Keep the policy applied with --confirm (stops its rollback)",
		Long: `confirm makes the pending applies of the namespace (--netns; the host's
without it) permanent. A hook it cannot confirm is named and the command
fails; the others are confirmed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fw, err := g.recovered()
			if err != nil {
				return err
			}
			done, err := fw.Confirm()
			var names []string
			for _, h := range done {
				names = append(names, h.String()+inNetns(g.netns))
			}
			if g.json && err == nil {
				return g.printJSON(map[string]any{"confirmed": nonNil(names)})
			}
			for _, h := range names {
				fmt.Fprintln(g.env.Stdout, "confirmed", h)
			}
			return err
		},
	}
}

// watchdogCmd is started by apply --confirm; it is not for people.
func watchdogCmd(g *globals) *cobra.Command {
	return rollbackWatchdogCmd(g, "Roll back an unconfirmed apply at its deadline (started by apply --confirm)", func(token string) ([]string, error) {
		fw, err := g.firewall()
		if err != nil {
			return nil, err
		}
		return fw.RollbackExpired(token)
	})
}

// rollbackWatchdogCmd is a watchdog an apply --confirm starts (see
// internal/watchdog): at --at it undoes the apply that still carries
// --token, and prints a timestamped line for each thing undone.
func rollbackWatchdogCmd(g *globals, short string, undo func(token string) ([]string, error)) *cobra.Command {
	var token, at string
	c := &cobra.Command{
		Use:    "rollback-watchdog --token T --at TIME",
		Short:  short,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := watchdog.Wait(cmd.Context(), at); err != nil {
				return err
			}
			done, err := undo(token)
			for _, d := range done {
				fmt.Fprintf(g.env.Stdout, "%s: %s\n", time.Now().UTC().Format(time.RFC3339), d)
			}
			return err
		},
	}
	c.Flags().StringVar(&token, "token", "", "the apply to watch")
	c.Flags().StringVar(&at, "at", "", "deadline (RFC 3339)")
	return c
}
