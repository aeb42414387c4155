package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

func listCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "list add|del|show",
		Short: "Change live prefix lists in place, without a reload",
		Long: `list add and list del change a list of the applied policy in place on every
interface that uses it: the big tables are not rebuilt, the change is live at
once. With --ttl the change undoes itself when the time is up (no upper
bound). Changes survive a re-apply of the policy while they last; to make
them permanent, put them in the list file.`,
	}
	c.AddCommand(listChangeCmd(g, true), listChangeCmd(g, false), listShowCmd(g))
	return c
}

func listChangeCmd(g *globals, add bool) *cobra.Command {
	var ttl time.Duration
	verb := map[bool]string{true: "add", false: "del"}[add]
	c := &cobra.Command{
		Use:   verb + " NAME PREFIX... [--ttl 10m]",
		Short: map[bool]string{true: "Add prefixes or ranges to a live list", false: "Remove prefixes or ranges from a live list"}[add],
		Example: map[bool]string{
			true:  "  rampart list add blocklist 203.0.113.7 198.51.100.0/24 --ttl 10m",
			false: "  rampart list del blocklist 203.0.113.7",
		}[add],
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ttl < 0 {
				return errors.New("--ttl must be positive")
			}
			var prefixes []netip.Prefix
			for _, a := range args[1:] {
				ps, err := policy.ParseEntry(a)
				if err != nil {
					return fmt.Errorf("%s: %w", a, err)
				}
				prefixes = append(prefixes, ps...)
			}
			unlock, err := g.lock()
			if err != nil {
				return err
			}
			defer unlock()
			var expires time.Time
			if ttl > 0 {
				expires = time.Now().Add(ttl).UTC()
			}
			ops, err := loadOps(g.netns)
			if err != nil {
				return err
			}
			for _, p := range prefixes {
				ops = append(ops, policy.ListOp{List: args[0], Prefix: p, Add: add, Expires: expires})
			}
			hooks, err := refreshOverlays(g.netns, ops, args[0])
			if err != nil {
				return err
			}
			if err := saveOps(g.netns, ops); err != nil {
				return err
			}
			if ttl > 0 {
				if err := ensureExpirer(g.netns); err != nil {
					return fmt.Errorf("start the expiry process: %w (the entries expire at the next rampart command instead)", err)
				}
			}
			if g.json {
				return g.printJSON(map[string]any{"list": args[0], "op": verb, "prefixes": prefixes, "expires": nullTime(expires), "hooks": hooks})
			}
			fmt.Fprintf(g.env.Stdout, "%s: %s %d prefixes on %s", args[0], verb, len(prefixes), strings.Join(hooks, ", "))
			if ttl > 0 {
				fmt.Fprintf(g.env.Stdout, " until %s", expires.Local().Format(time.DateTime))
			}
			fmt.Fprintln(g.env.Stdout)
			return nil
		},
	}
	c.Flags().DurationVar(&ttl, "ttl", 0, "undo the change after this long (e.g. 10m, 72h)")
	return c
}

func listShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show",
		Short: "Show the in-place changes that are live",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			unlock, err := g.lock()
			if err != nil {
				return err
			}
			defer unlock()
			ops, err := loadOps(g.netns)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]any{"changes": ops})
			}
			rows := [][]string{{"LIST", "OP", "PREFIX", "EXPIRES"}}
			for _, op := range ops {
				exp := "never"
				if !op.Expires.IsZero() {
					exp = op.Expires.Local().Format(time.DateTime)
				}
				rows = append(rows, []string{op.List, map[bool]string{true: "add", false: "del"}[op.Add], op.Prefix.String(), exp})
			}
			g.table(rows)
			return nil
		},
	}
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// The in-place changes of a namespace's lists, oldest first, in one file.
// Its name does not end in .json: hook states do.
func opsPath(netns string) string { return filepath.Join(datapath.ScopeStateDir(netns), "list-ops") }

// loadOps reads the live changes, without the expired ones.
func loadOps(netns string) ([]policy.ListOp, error) {
	ops, err := readOps(netns)
	return liveOps(ops), err
}

func readOps(netns string) ([]policy.ListOp, error) {
	b, err := os.ReadFile(opsPath(netns))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ops []policy.ListOp
	if err := json.Unmarshal(b, &ops); err != nil {
		return nil, fmt.Errorf("%s: %w", opsPath(netns), err)
	}
	return ops, nil
}

func liveOps(ops []policy.ListOp) []policy.ListOp {
	now := time.Now()
	return slices.DeleteFunc(ops, func(op policy.ListOp) bool { return !op.Expires.IsZero() && !op.Expires.After(now) })
}

func saveOps(netns string, ops []policy.ListOp) error {
	path := opsPath(netns)
	if len(ops) == 0 {
		err := os.Remove(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// refreshOverlays rewrites the overlay of every hook of the namespace from
// ops. With mustHave set, a list no applied policy uses is an error.
func refreshOverlays(netns string, ops []policy.ListOp, mustHave string) ([]string, error) {
	states, err := datapath.States(netns, false)
	if err != nil {
		return nil, err
	}
	var touched []string
	known := map[string]bool{}
	for _, st := range states {
		for name := range st.Lists {
			known[name] = true
		}
		if mustHave != "" && st.Lists[mustHave] == 0 {
			continue
		}
		v4, v6 := compile.Overlay(st.Lists, ops)
		if err := datapath.ReplaceOverlay(st, v4, v6); err != nil {
			return touched, err
		}
		touched = append(touched, st.Hook.String())
	}
	if mustHave != "" && len(touched) == 0 {
		var names []string
		for n := range known {
			names = append(names, n)
		}
		sort.Strings(names)
		if len(names) == 0 {
			return nil, fmt.Errorf("list %q: no policy is applied%s; apply one first", mustHave, inNetns(netns))
		}
		return nil, fmt.Errorf("list %q is not used by any applied policy%s (lists in use: %s)", mustHave, inNetns(netns), strings.Join(names, ", "))
	}
	return touched, nil
}

// expireOps drops expired changes and refreshes the overlays when any did
// expire. The caller holds the host lock. It reports whether changes with a
// TTL remain.
func expireOps(netns string) (bool, error) {
	all, err := readOps(netns)
	if err != nil {
		return false, err
	}
	n := len(all)
	live := liveOps(all)
	if len(live) != n {
		if _, err := refreshOverlays(netns, live, ""); err != nil {
			return true, err
		}
		if err := saveOps(netns, live); err != nil {
			return true, err
		}
	}
	return slices.ContainsFunc(live, func(op policy.ListOp) bool { return !op.Expires.IsZero() }), nil
}

// The expirer is one detached process per namespace that undoes changes
// whose TTL is up. It holds expirerLock while it runs; it lets go of it
// before the host lock when it finds nothing left to expire, so a `list
// add` holding the host lock either sees it alive (and it will see the new
// change) or starts a new one.
func expirerLock(netns string) string {
	return filepath.Join(datapath.ScopeStateDir(netns), "list-expire.lock")
}

func tryLock(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return f, true, nil
}

func ensureExpirer(netns string) error {
	f, free, err := tryLock(expirerLock(netns))
	if err != nil || !free {
		return err
	}
	f.Close() // the new process takes it
	args := []string{"list-expire"}
	if netns != "" {
		args = append(args, "--netns", netns)
	}
	return spawnDetached("list-expire.log", args...)
}

// expirerCmd is started by list add/del --ttl; it is not for people.
func expirerCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "list-expire",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, ok, err := tryLock(expirerLock(g.netns))
			if err != nil || !ok {
				return err
			}
			for {
				unlock, err := datapath.Lock()
				if err != nil {
					f.Close()
					return err
				}
				more, err := expireOps(g.netns)
				if err != nil {
					fmt.Fprintln(g.env.Stderr, time.Now().Format(time.RFC3339), "expire list changes:", err)
				}
				if !more {
					f.Close()
					unlock()
					return nil
				}
				unlock()
				select {
				case <-cmd.Context().Done():
					f.Close()
					return nil
				case <-time.After(time.Second):
				}
			}
		},
	}
}
