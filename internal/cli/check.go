package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/policy"
)

func checkCmd(g *globals) *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "check -f POLICY",
		Short: "Validate a policy and show what it compiles to, without touching the host",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("--file/-f is required: the policy to check")
			}
			pol, err := policy.Load(file)
			if err != nil {
				return err
			}
			img := compile.Build(pol)
			prefixes := 0
			for _, l := range pol.Lists {
				prefixes += len(l.Prefixes)
			}
			res := map[string]any{
				"file": file, "valid": true, "rules": len(pol.Rules), "lists": len(pol.Lists), "prefixes": prefixes,
				"entries_v4": len(img.V4), "entries_v6": len(img.V6), "default": pol.Default.String(), "policy_hash": img.Hash(),
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.env.Stdout, "%s: valid: %d rules, %d lists with %d prefixes (%d IPv4 and %d IPv6 table entries after aggregation), default %s, policy %s\n",
				file, len(pol.Rules), len(pol.Lists), prefixes, len(img.V4), len(img.V6), pol.Default, img.Hash()[:12])
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "policy file (YAML)")
	return c
}
