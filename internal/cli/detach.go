package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func detachCmd(g *globals) *cobra.Command {
	var ifaces []string
	var unpinned bool
	c := &cobra.Command{
		Use:   "detach --iface IF [--iface IF2] | --unpinned",
		Short: "Remove rampart from interfaces: links, pinned objects, state and live list changes, nothing else",
		Long: `detach removes rampart from the interfaces named: links, pinned objects, state
and live list changes, nothing else. --unpinned instead removes the rampart
programs the kernel runs on the namespace's interfaces that no pin under the
pin root accounts for (status lists them): left by a pin root mounted over,
or by another pin root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if unpinned {
				if len(ifaces) > 0 {
					return errors.New("--unpinned removes what no pin accounts for: give it without --iface")
				}
				return g.detachUnpinned()
			}
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
	c.Flags().BoolVar(&unpinned, "unpinned", false, "remove the rampart programs on the namespace's interfaces that no pin accounts for")
	return c
}

func (g *globals) detachUnpinned() error {
	fw, err := g.firewall()
	if err != nil {
		return err
	}
	done, err := fw.DetachUnpinned()
	var names []string
	for _, k := range done {
		names = append(names, k.KernelHook.String()+inNetns(g.netns))
	}
	if g.json && err == nil {
		return g.printJSON(map[string]any{"detached": nonNil(names)})
	}
	if len(names) == 0 && err == nil {
		fmt.Fprintln(g.env.Stdout, "no unpinned rampart program runs here")
	}
	for _, n := range names {
		fmt.Fprintln(g.env.Stdout, "detached", n)
	}
	return err
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
