package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/serve"
)

func flowspecCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "flowspec",
		Short: "BGP FlowSpec routes rampart serve takes from its neighbors",
	}
	c.AddCommand(&cobra.Command{
		Use:   "show",
		Short: "The FlowSpec routes held, what became of each, their counters, and the sessions",
		Long: `Asks the running service (rampart serve with a flowspec: section) for its
FlowSpec routes in RFC 8955 order: the neighbor that sent each, its match and
action, whether it is installed (else why not: unsupported, never-matches,
shadowed, no-room), the rules it became and what they counted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.service()
			if err != nil {
				return err
			}
			if api == nil {
				return errors.New("no rampart serve runs for this namespace: FlowSpec routes are the service's (start it with a policy that has a flowspec: section)")
			}
			var show serve.FlowSpecShow
			if err := api.Do("GET", "/v1/flowspec", nil, &show); err != nil {
				return err
			}
			if g.json {
				return g.printJSON(show)
			}
			return g.printFlowSpec(&show)
		},
	})
	return c
}

func (g *globals) printFlowSpec(s *serve.FlowSpecShow) error {
	out := g.env.Stdout
	if !s.Enabled {
		fmt.Fprintln(out, "the service's policy has no flowspec: section")
		return nil
	}
	rows := [][]string{{"NEIGHBOR", "AS", "SESSION", "ROUTES", "WAITING", "MAX", "LOST"}}
	for _, n := range s.Neighbors {
		rows = append(rows, []string{n.Address, strconv.FormatUint(uint64(n.PeerAS), 10), map[bool]string{true: "up", false: "down"}[n.Up],
			strconv.Itoa(n.Routes), strconv.Itoa(n.Waiting), strconv.Itoa(n.Max), strconv.FormatUint(n.Flaps, 10)})
	}
	g.table(rows)
	fmt.Fprintln(out)
	rows = [][]string{{"ROUTE", "NEIGHBOR", "MATCH", "ACTION", "STATE", "PACKETS", "BYTES", "OVER LIMIT"}}
	for _, r := range s.Routes {
		state := r.State
		if r.Stale {
			state += " (session lost)"
		}
		action := r.Action
		if len(r.NotHere) > 0 {
			action += " (not on a host: " + strings.Join(r.NotHere, ", ") + ")"
		}
		rows = append(rows, []string{r.Name, r.Neighbor, r.Match, action, state, strconv.FormatUint(r.Packets, 10), strconv.FormatUint(r.Bytes, 10), strconv.FormatUint(r.Over, 10)})
	}
	g.table(rows)
	for _, r := range s.Routes {
		if r.Reason != "" {
			fmt.Fprintf(out, "%s: %s: %s\n", r.Name, r.State, r.Reason)
		}
	}
	if s.Malformed > 0 || s.Refused["max-routes"] > 0 {
		fmt.Fprintf(out, "routes not taken: %d malformed, %d over a neighbor's max_routes\n", s.Malformed, s.Refused["max-routes"])
	}
	return nil
}
