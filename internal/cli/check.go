package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/compile"
)

func checkCmd(g *globals) *cobra.Command {
	var file string
	var lenient bool
	c := &cobra.Command{
		Use:   "check -f POLICY",
		Short: "Validate a policy and show what it compiles to, without touching the host",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("--file/-f is required: the policy to check")
			}
			pol, err := g.loadPolicy(file, lenient)
			if err != nil {
				return err
			}
			img := compile.Build(pol)
			entries, skipped := 0, 0
			for _, l := range pol.Lists {
				entries += l.Entries
				skipped += l.Skipped
			}
			t := &img.Tables
			res := map[string]any{
				"file": file, "valid": true, "rules": len(pol.Rules), "lists": len(pol.Lists), "entries": entries, "skipped_lines": skipped,
				"v4_split_blocks": len(t.V4Bitmaps) + len(t.V4Tbl8s), "v6_prefixes": len(t.V6), "table_bytes": t.KernelBytes(),
				"default": pol.Default.String(), "policy_hash": img.Hash(),
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.env.Stdout, "%s: valid: %d rules, %d lists with %d entries; tables take %.1f MiB (%d IPv4 blocks split below /24, %d IPv6 prefixes after aggregation); default %s, policy %s\n",
				file, len(pol.Rules), len(pol.Lists), entries, float64(t.KernelBytes())/(1<<20), res["v4_split_blocks"], len(t.V6), pol.Default, img.Hash()[:12])
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "policy file (YAML)")
	c.Flags().BoolVar(&lenient, "lenient", false, "skip bad lines in list files (their count is reported) instead of failing")
	return c
}
