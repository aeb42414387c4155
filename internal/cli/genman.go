package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// genManCmd writes a man page per command from the command table (make
// deb ships them); it is not for people.
func genManCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "gen-man DIR",
		Short:  "Write man pages for every command into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // reproducible pages
			if err := doc.GenManTree(root, &doc.GenManHeader{Title: "RAMPART", Section: "8", Source: "rampart", Manual: "rampart manual"}, args[0]); err != nil {
				return fmt.Errorf("man pages: %w", err)
			}
			return nil
		},
	}
}
