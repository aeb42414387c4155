package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// transactionWindow bounds an apply without --confirm: its hooks are pending
// only while the command runs, so a crash mid-way is rolled back by the next
// rampart command.
const transactionWindow = 2 * time.Minute

func applyCmd(g *globals) *cobra.Command {
	var (
		file    string
		ifaces  []string
		mode    string
		egress  bool
		force   bool
		lenient bool
		confirm time.Duration
	)
	c := &cobra.Command{
		Use:   "apply -f POLICY --iface IF [--iface IF2] [--mode auto|xdp-native|xdp-generic|tc] [--egress] [--confirm 60s]",
		Short: "Compile a policy and attach or atomically swap it on interfaces",
		Long: `apply validates the policy, builds a new program with fresh maps and swaps it
in with one link update, so no packet sees a half-written policy. Counters of
rules whose name and match are unchanged carry over.

--mode auto tries XDP native, then XDP generic, then tc. --egress filters
outgoing traffic with tc (tcx) instead of incoming. With --confirm DURATION
the previous policy comes back by itself unless 'rampart confirm' runs in
time, even if this command is killed.`,
		Example: `  rampart apply -f /etc/rampart/policy.yaml --iface eth0
  rampart apply -f policy.yaml --iface eth0 --confirm 60s && rampart confirm`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("--file/-f is required: the policy to apply")
			}
			if len(ifaces) == 0 {
				return errors.New("--iface is required: the interface(s) to filter")
			}
			m, err := datapath.ParseMode(mode)
			if err != nil {
				return err
			}
			if egress && (m == datapath.ModeXDPNative || m == datapath.ModeXDPGeneric) {
				return fmt.Errorf("--mode %s with --egress: XDP sees only incoming packets; egress uses tc (--mode tc or auto)", m)
			}
			if confirm < 0 {
				return errors.New("--confirm must be positive")
			}
			pol, err := g.loadPolicy(file, lenient)
			if err != nil {
				return err
			}
			return g.apply(pol, ifaces, m, egress, force, confirm)
		},
	}
	f := c.Flags()
	f.StringVarP(&file, "file", "f", "", "policy file (YAML)")
	f.StringArrayVar(&ifaces, "iface", nil, "interface to filter (repeat for several)")
	f.StringVar(&mode, "mode", "auto", "layer: auto, xdp-native, xdp-generic or tc")
	f.BoolVar(&egress, "egress", false, "filter outgoing packets (tc egress) instead of incoming")
	f.BoolVar(&force, "force", false, "replace another program's XDP on the interface")
	f.DurationVar(&confirm, "confirm", 0, "roll back unless 'rampart confirm' runs within this time")
	f.BoolVar(&lenient, "lenient", false, "skip bad lines in list files (their count is reported) instead of failing")
	return c
}

type applied struct {
	Iface      string `json:"iface"`
	Netns      string `json:"netns,omitempty"`
	Direction  string `json:"direction"`
	Mode       string `json:"mode"`
	Generation int    `json:"generation"`
	PolicyHash string `json:"policy_hash"`
	Rules      int    `json:"rules"`
}

func (g *globals) apply(pol *policy.Policy, ifaces []string, mode datapath.Mode, egress, force bool, confirm time.Duration) error {
	var hooks []datapath.Hook
	for _, ifc := range ifaces {
		hooks = append(hooks, datapath.Hook{Netns: g.netns, Iface: ifc, Egress: egress})
	}
	// Every interface must exist before anything changes.
	if err := datapath.InNetns(g.netns, func() error {
		for _, h := range hooks {
			if _, err := net.InterfaceByName(h.Iface); err != nil {
				return fmt.Errorf("--iface %s: no such interface%s (list them with: ip link)", h.Iface, inNetns(g.netns))
			}
		}
		return nil
	}); err != nil {
		return err
	}

	if err := datapath.EnsureBPFFS(); err != nil {
		return err
	}
	unlock, err := g.lock()
	if err != nil {
		return err
	}
	defer unlock()
	// In-place list changes still live carry over to the new tables.
	ops, err := loadOps(g.netns)
	if err != nil {
		return err
	}
	for _, op := range ops {
		if l := pol.Lists[op.List]; l != nil {
			l.Ops = append(l.Ops, op)
		}
	}
	img := compile.Build(pol)

	objs, err := datapath.Load(img)
	if err != nil {
		return fmt.Errorf("apply %s: %w", pol.File, err)
	}
	defer objs.Close()

	meta := datapath.State{PolicyFile: absPath(pol.File), PolicyHash: img.Hash(), Default: pol.Default.String(),
		Unparsed: pol.Unparsed.String(), Malformed: pol.MalformedAction().String(), Lists: img.Lists}
	for _, r := range pol.Rules {
		meta.Rules = append(meta.Rules, datapath.RuleInfo{Name: r.Name, Match: r.MatchKey(), Action: r.Action.String()})
	}
	token := newToken()
	deadline := time.Now().Add(transactionWindow)
	if confirm > 0 {
		deadline = time.Now().Add(confirm)
	}

	var done []*datapath.State
	for _, h := range hooks {
		st, err := datapath.Install(h, objs, meta, mode, force, deadline, token)
		if err != nil {
			// Put back the hooks this command already changed.
			for _, d := range done {
				if rerr := datapath.Rollback(d); rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return err
		}
		done = append(done, st)
	}
	if confirm > 0 {
		if err := spawnWatchdog(token, deadline); err != nil {
			for _, d := range done {
				datapath.Rollback(d)
			}
			return fmt.Errorf("start the rollback watchdog: %w (nothing was changed)", err)
		}
	} else {
		for _, st := range done {
			if err := datapath.Confirm(st); err != nil {
				return err
			}
		}
	}

	var out []applied
	for _, st := range done {
		out = append(out, applied{Iface: st.Hook.Iface, Netns: st.Hook.Netns, Direction: st.Hook.Direction(), Mode: string(st.Mode),
			Generation: st.Generation, PolicyHash: st.PolicyHash, Rules: len(st.Rules)})
	}
	if g.json {
		return g.printJSON(map[string]any{"applied": out, "confirm_deadline": confirmDeadline(confirm, deadline)})
	}
	rows := [][]string{{"IFACE", "DIRECTION", "MODE", "RULES", "POLICY", "GEN"}}
	for _, a := range out {
		rows = append(rows, []string{a.Iface + inNetns(a.Netns), a.Direction, a.Mode, strconv.Itoa(a.Rules), a.PolicyHash[:12], strconv.Itoa(a.Generation)})
	}
	g.table(rows)
	if confirm > 0 {
		fmt.Fprintf(g.env.Stdout, "Run 'rampart confirm' before %s or the previous policy comes back.\n", deadline.Format(time.TimeOnly))
	}
	return nil
}

func confirmDeadline(confirm time.Duration, deadline time.Time) any {
	if confirm <= 0 {
		return nil
	}
	return deadline.UTC()
}

func inNetns(ns string) string {
	if ns == "" {
		return ""
	}
	return " (netns " + ns + ")"
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func newToken() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// spawnWatchdog starts a detached rampart that rolls this apply back at the
// deadline unless it was confirmed.
func spawnWatchdog(token string, deadline time.Time) error {
	return spawnDetached("rollback.log", "rollback-watchdog", "--token", token, "--at", deadline.UTC().Format(time.RFC3339Nano))
}

// spawnDetached starts rampart with args in a session of its own, so killing
// this command (or its terminal) does not stop it; it logs to logName in
// the state directory.
func spawnDetached(logName string, args ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(datapath.StateRoot, logName), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}
