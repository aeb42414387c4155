package cli

import (
	"fmt"
	"math"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/gcpace"
	"github.com/rampart-fw/rampart/internal/policy"
)

func checkCmd(g *globals) *cobra.Command {
	var file string
	var lenient bool
	c := &cobra.Command{
		Use:   "check -f POLICY",
		Short: "Validate a policy and show what it compiles to, without touching the host",
		Long: `check reads the policy and its lists as apply would, compiles them, and refuses
what apply would refuse (tables over the memory available or over
RAMPART_MAX_TABLE_BYTES), without changing anything. It shows the rules,
each list's entries, the size of the tables, and warnings (rules that can
never match).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("--file/-f is required: the policy to check")
			}
			limit, err := maxTableBytes()
			if err != nil {
				return err
			}
			gcpace.Lazy()
			pol, err := g.loadPolicy(cmd.Context(), file, lenient)
			if err != nil {
				return err
			}
			r, err := engine.Check(pol, limit)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			if g.json {
				return g.printJSON(struct {
					File  string `json:"file"`
					Valid bool   `json:"valid"`
					*engine.CheckReport
				}{file, true, r})
			}
			shared := ""
			switch {
			case r.StaticLists > 0:
				shared = fmt.Sprintf(", in %d list bits and %d static lists (named in more than %d ways: the lists of the later ways take no bit, nor in-place changes)", r.ListBits, r.StaticLists, policy.MaxLists)
			case r.BitsShared:
				shared = fmt.Sprintf(", in %d of the %d list bits (lists the same rules name share one)", r.ListBits, policy.MaxLists)
			}
			fmt.Fprintf(g.env.Stdout, "%s: valid: %d rules, %d lists with %d entries%s; tables take %.1f MiB (%d IPv4 blocks split below /24, %d IPv6 prefixes after aggregation); default %s, unparsed %s, policy %s\n",
				file, r.Rules, len(r.Lists), r.Entries, shared, float64(r.TableBytes)/(1<<20), r.V4SplitBlocks, r.V6Prefixes, r.Default, r.Unparsed, r.PolicyHash[:12])
			rows := [][]string{{"LIST", "ENTRIES", "SKIPPED", "IPV4 RANGES", "IPV4 ADDRESSES", "IPV6 RANGES", "IPV6 ADDRESSES"}}
			for _, l := range r.Lists {
				v6 := "0"
				if l.V6Addresses > 0 {
					v6 = fmt.Sprintf("2^%.1f", math.Log2(l.V6Addresses))
				}
				rows = append(rows, []string{l.Name, fmt.Sprint(l.Entries), fmt.Sprint(l.Skipped), fmt.Sprint(l.V4Ranges),
					fmt.Sprint(l.V4Addresses), fmt.Sprint(l.V6Ranges), v6})
			}
			if len(rows) > 1 {
				g.table(rows)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "policy file (YAML)")
	c.Flags().BoolVar(&lenient, "lenient", false, "skip bad lines in list files (their count is reported) instead of failing")
	return c
}
