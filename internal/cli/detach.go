package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/datapath"
)

func detachCmd(g *globals) *cobra.Command {
	var ifaces []string
	c := &cobra.Command{
		Use:   "detach --iface IF [--iface IF2]",
		Short: "Remove rampart from interfaces: links, pinned objects and state, nothing else",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(ifaces) == 0 {
				return errors.New("--iface is required: the interface(s) to detach from")
			}
			unlock, err := g.lock()
			if err != nil {
				return err
			}
			defer unlock()
			var removed []string
			for _, ifc := range ifaces {
				for _, egress := range []bool{false, true} {
					h := datapath.Hook{Netns: g.netns, Iface: ifc, Egress: egress}
					st, err := datapath.LoadState(h)
					if err != nil {
						return err
					}
					if st == nil && !datapath.Attached(h) {
						continue
					}
					if err := datapath.Detach(h); err != nil {
						return fmt.Errorf("detach %s: %w", h, err)
					}
					removed = append(removed, h.String())
				}
			}
			if g.json {
				return g.printJSON(map[string]any{"detached": removed})
			}
			if len(removed) == 0 {
				fmt.Fprintln(g.env.Stdout, "nothing applied on", ifaces)
			}
			for _, h := range removed {
				fmt.Fprintln(g.env.Stdout, "detached", h)
			}
			return nil
		},
	}
	c.Flags().StringArrayVar(&ifaces, "iface", nil, "interface to detach from (repeat for several)")
	return c
}
