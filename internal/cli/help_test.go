package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestHelpEveryCommand walks the command table: every command a person can
// run has help that shows its usage and the --json flag.
func TestHelpEveryCommand(t *testing.T) {
	var walk func(c *cobra.Command, path []string)
	n := 0
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			args := append(append([]string{}, path...), sub.Name())
			var out bytes.Buffer
			if err := Run(context.Background(), Env{Stdout: &out, Stderr: &out}, append(args, "--help")); err != nil {
				t.Errorf("%s --help: %v", strings.Join(args, " "), err)
			}
			if !strings.Contains(out.String(), "--json") || !strings.Contains(out.String(), "Usage:") {
				t.Errorf("%s --help lacks usage or --json:\n%s", strings.Join(args, " "), out.String())
			}
			n++
			walk(sub, args)
		}
	}
	walk(rootCmd(&globals{env: Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}}), nil)
	if n < 15 {
		t.Errorf("walked %d commands: the table is not being walked", n)
	}
}
