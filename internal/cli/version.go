package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
)

// Version and Commit are set by `make build` with -ldflags -X; without
// them the commit comes from Go's VCS stamp, where the build made one.
var (
	Version = "0.1.0-dev"
	Commit  = ""
)

// buildInfo is what `rampart version` reports: the build, the running
// kernel and what it has of what rampart uses.
type buildInfo struct {
	Version    string          `json:"version"`
	Commit     string          `json:"commit"`
	CommitTime string          `json:"commit_time,omitempty"`
	Modified   bool            `json:"modified,omitempty"` // built from a tree with uncommitted changes
	Go         string          `json:"go"`
	Kernel     string          `json:"kernel"`
	TCAttach   string          `json:"tc_attach"` // tcx, or clsact before Linux 6.6
	Features   []featureReport `json:"features"`
}

type featureReport struct {
	Name      string `json:"name"`
	Kernel    string `json:"kernel"` // the first Linux release with it
	Available bool   `json:"available"`
	Error     string `json:"error,omitempty"`
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: Version, Commit: Commit, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok && Commit == "" {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.time":
				b.CommitTime = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if c, ok := strings.CutSuffix(b.Commit, "+modified"); ok {
		b.Commit, b.Modified = c, true
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		b.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return b
}

// short is the one line of --version.
func (b buildInfo) short() string {
	commit := b.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if b.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("rampart %s (commit %s, %s) on Linux %s", b.Version, commit, b.Go, b.Kernel)
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the commit, the kernel and the kernel features rampart uses",
		Long: `version prints rampart's version and commit, the running kernel, and each
kernel feature rampart probes with the first Linux release that has it:
what a bug report needs. It changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := readBuildInfo()
			for _, f := range datapath.Features {
				r := featureReport{Name: f.Name, Kernel: f.Kernel, Available: true}
				if err := f.Check(); err != nil {
					r.Available, r.Error = false, err.Error()
				}
				b.Features = append(b.Features, r)
			}
			b.TCAttach = "tcx"
			if datapath.FeatureTCX.Check() != nil {
				b.TCAttach = "clsact"
			}
			if g.json {
				return g.printJSON(b)
			}
			fmt.Fprintln(g.env.Stdout, b.short())
			fmt.Fprintln(g.env.Stdout, "tc programs attach with", b.TCAttach)
			rows := [][]string{{"FEATURE", "LINUX", "HERE"}}
			for _, f := range b.Features {
				here := "yes"
				if !f.Available {
					here = "no"
					if !strings.Contains(f.Error, "lacks") {
						here = "unknown: " + f.Error
					}
				}
				rows = append(rows, []string{f.Name, f.Kernel, here})
			}
			g.table(rows)
			return nil
		},
	}
}
