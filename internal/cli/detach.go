package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func detachCmd(g *globals) *cobra.Command {
	var ifaces []string
	c := &cobra.Command{
		Use:   "detach --iface IF [--iface IF2]",
		Short: "Remove rampart from interfaces: links, pinned objects, state and live list changes, nothing else",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(ifaces) == 0 {
				return errors.New("--iface is required: the interface(s) to detach from")
			}
			fw, err := g.recovered()
			if err != nil {
				return err
			}
			done, err := fw.Detach(ifaces)
			var names []string
			for _, h := range done {
				names = append(names, h.String()+inNetns(g.netns))
			}
			if g.json && err == nil {
				return g.printJSON(map[string]any{"detached": nonNil(names)})
			}
			if len(names) == 0 && err == nil {
				fmt.Fprintln(g.env.Stdout, "nothing applied on", ifaces)
			}
			for _, h := range names {
				fmt.Fprintln(g.env.Stdout, "detached", h)
			}
			return err
		},
	}
	c.Flags().StringArrayVar(&ifaces, "iface", nil, "interface to detach from (repeat for several)")
	return c
}

func reattachCmd(g *globals) *cobra.Command {
	var ifaces []string
	c := &cobra.Command{
		Use:   "reattach [--iface IF]",
		Short: "Attach again, with the policy they ran, hooks whose interface was recreated or whose link was removed",
		Long: `When an interface rampart filters is deleted and created again under the same
name, its link goes with the old interface and nothing filters the new one;
status says so. reattach attaches the programs rampart still holds for such
hooks (all of the namespace's, or those of --iface), without the policy file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fw, err := g.recovered()
			if err != nil {
				return err
			}
			done, err := fw.Reattach(ifaces)
			if g.json && err == nil {
				return g.printJSON(map[string]any{"reattached": nonNil(done)})
			}
			if len(done) == 0 && err == nil {
				fmt.Fprintln(g.env.Stdout, "every hook is attached")
			}
			for _, a := range done {
				fmt.Fprintf(g.env.Stdout, "reattached %s%s (%s, generation %d)\n", a.Hook, inNetns(g.netns), a.Mode, a.Generation)
			}
			return err
		},
	}
	c.Flags().StringArrayVar(&ifaces, "iface", nil, "only this interface (repeat for several)")
	return c
}
