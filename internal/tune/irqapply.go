package tune

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/rampart-fw/rampart/internal/watchdog"
)

// irqState is what `tune irq apply` wrote and what it replaced, kept for
// check, confirm and rollback.
const irqState = "var/lib/rampart/tune-irq.json"

// Write is one file apply sets: a CPU list or a CPU mask.
type Write struct {
	Path   string `json:"path"` // under the root
	Mask   bool   `json:"mask"` // a hex mask (rps_cpus, xps_cpus), else a list
	Want   string `json:"want"`
	Before string `json:"before"`
}

// IRQApplied is the state of the last apply.
type IRQApplied struct {
	At         time.Time `json:"at"`
	Plan       *IRQPlan  `json:"plan"`
	Writes     []Write   `json:"writes"`
	IRQBalance string    `json:"irqbalance,omitempty"` // ban or stop
	// The irqbalance defaults file before a ban (absent if it was absent).
	BalanceFileBefore *string `json:"irqbalance_file_before,omitempty"`
	// Set while an apply with --confirm waits for `tune irq confirm`.
	PendingToken string    `json:"pending_token,omitempty"`
	Deadline     time.Time `json:"deadline,omitzero"`
}

// irqbalanceDefaults is where Debian's irqbalance unit reads its
// arguments (EnvironmentFile, IRQBALANCE_ARGS).
const irqbalanceDefaults = "etc/default/irqbalance"

func (p *IRQPlan) writes() []Write {
	var w []Write
	for _, a := range p.Assignments {
		w = append(w, Write{Path: fmt.Sprintf("proc/irq/%d/smp_affinity_list", a.IRQ), Want: a.CPUs})
	}
	mask := func(kind string, qs []QueueCPUs, file string) {
		for _, q := range qs {
			set, _ := ParseCPUList(q.CPUs)
			w = append(w, Write{Path: fmt.Sprintf("sys/class/net/%s/queues/%s-%d/%s", q.Iface, kind, q.Queue, file), Mask: true, Want: set.Mask(p.maskWords)})
		}
	}
	mask("rx", p.RPS, "rps_cpus")
	mask("tx", p.XPS, "xps_cpus")
	return w
}

// LoadIRQApplied reads the last apply's state under root (nil if none).
func LoadIRQApplied(root string) (*IRQApplied, error) {
	b, err := os.ReadFile(filepath.Join(root, irqState))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var a IRQApplied
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%s: %w (remove it to start over)", filepath.Join(root, irqState), err)
	}
	return &a, nil
}

func (a *IRQApplied) save(root string) error {
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(root, irqState), string(b)+"\n")
}

// ApplyIRQ writes the plan under root. irqbalance is "ban" (its arguments
// gain --banirq for every planned interrupt), "stop" (systemctl disable
// --now, on the host only) or "" (refused while it runs). The values
// replaced are kept, the first apply's when applied again, and a failed
// write restores what was written before it. A non-empty token marks the
// apply pending until ConfirmIRQ; RollbackIRQ(root, token) undoes it.
func ApplyIRQ(root string, p *IRQPlan, irqbalance, token string, deadline time.Time) (*IRQApplied, error) {
	if p.IRQBalance && irqbalance == "" {
		return nil, errors.New("irqbalance is running and would move these interrupts: add --irqbalance ban (it leaves them alone) or --irqbalance stop")
	}
	if irqbalance == "stop" && filepath.Clean(root) != "/" {
		return nil, errors.New("--irqbalance stop stops the host's service: it needs --root /")
	}
	old, err := LoadIRQApplied(root)
	if err != nil {
		return nil, err
	}
	a := &IRQApplied{At: time.Now().UTC(), Plan: p, Writes: p.writes(), IRQBalance: irqbalance, PendingToken: token, Deadline: deadline}
	for i := range a.Writes {
		w := &a.Writes[i]
		if old != nil {
			if j := slices.IndexFunc(old.Writes, func(o Write) bool { return o.Path == w.Path }); j >= 0 {
				w.Before = old.Writes[j].Before
				continue
			}
		}
		if w.Before, err = readTrim(filepath.Join(root, w.Path)); err != nil {
			return nil, fmt.Errorf("read %s: %w", w.Path, err)
		}
	}
	if old != nil {
		a.BalanceFileBefore = old.BalanceFileBefore
		if a.IRQBalance == "" {
			a.IRQBalance = old.IRQBalance
		}
	}
	// The state goes first: an apply that dies half way is still undone.
	if err := a.save(root); err != nil {
		return nil, err
	}
	for i, w := range a.Writes {
		if err := os.WriteFile(filepath.Join(root, w.Path), []byte(w.Want+"\n"), 0); err != nil {
			restore(root, a.Writes[:i])
			return nil, errors.Join(fmt.Errorf("write %s: %w (what was written before it is restored)", w.Path, err), os.Remove(filepath.Join(root, irqState)))
		}
	}
	switch irqbalance {
	case "ban":
		if err := a.banIRQs(root); err != nil {
			return a, err
		}
	case "stop":
		if out, err := exec.Command("systemctl", "disable", "--now", "irqbalance").CombinedOutput(); err != nil {
			return a, fmt.Errorf("systemctl disable --now irqbalance: %v: %s", err, out)
		}
	}
	return a, a.save(root)
}

// ApplyIRQWatched is ApplyIRQ as `rampart tune irq apply` runs it: with
// confirm > 0 the apply is pending, and a detached `rampart tune irq
// rollback-watchdog` rolls it back after confirm unless ConfirmIRQ runs
// first. The deadline is the result's.
func ApplyIRQWatched(root string, p *IRQPlan, irqbalance string, confirm time.Duration) (*IRQApplied, error) {
	if confirm <= 0 {
		return ApplyIRQ(root, p, irqbalance, "", time.Time{})
	}
	token, deadline := watchdog.NewToken(), time.Now().Add(confirm)
	a, err := ApplyIRQ(root, p, irqbalance, token, deadline)
	if err != nil {
		return a, err
	}
	args := append([]string{"tune", "irq", "rollback-watchdog", "--root", root}, watchdog.Args(token, deadline)...)
	if err := watchdog.Start("", args...); err != nil {
		_, rerr := RollbackIRQ(root, token)
		return nil, errors.Join(fmt.Errorf("start the rollback watchdog: %w (the apply is rolled back)", err), rerr)
	}
	return a, nil
}

var banirqArg = regexp.MustCompile(`\s*--banirq=\d+`)

// banIRQs adds a --banirq for every planned interrupt to irqbalance's
// arguments and restarts it when it runs on this host.
func (a *IRQApplied) banIRQs(root string) error {
	path := filepath.Join(root, irqbalanceDefaults)
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if a.BalanceFileBefore == nil {
		before := string(b)
		if os.IsNotExist(err) {
			before = "\x00absent"
		}
		a.BalanceFileBefore = &before
	}
	var bans []string
	for _, x := range a.Plan.Assignments {
		bans = append(bans, fmt.Sprintf("--banirq=%d", x.IRQ))
	}
	args := ""
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "IRQBALANCE_ARGS="); ok {
			args = banirqArg.ReplaceAllString(strings.Trim(v, `"'`), "")
			continue
		}
		if l != "" || len(lines) > 0 {
			lines = append(lines, l)
		}
	}
	args = strings.TrimSpace(args + " " + strings.Join(bans, " "))
	lines = append(lines, "# --banirq: interrupts placed by rampart tune irq; rampart tune irq rollback removes them", fmt.Sprintf("IRQBALANCE_ARGS=%q", args))
	if err := writeFile(path, strings.Join(lines, "\n")+"\n"); err != nil {
		return err
	}
	return restartIrqbalance(root, "try-restart")
}

func restartIrqbalance(root, verb string) error {
	if filepath.Clean(root) != "/" {
		return nil
	}
	if _, err := exec.LookPath("systemctl"); err != nil {
		return nil
	}
	if out, err := exec.Command("systemctl", verb, "irqbalance").CombinedOutput(); err != nil {
		return fmt.Errorf("systemctl %s irqbalance: %v: %s", verb, err, out)
	}
	return nil
}

func restore(root string, ws []Write) error {
	var errs []error
	for _, w := range slices.Backward(ws) {
		if err := os.WriteFile(filepath.Join(root, w.Path), []byte(w.Before+"\n"), 0); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("restore %s: %w", w.Path, err))
		}
	}
	return errors.Join(errs...)
}

// RollbackIRQ restores what the last apply replaced and forgets it. With
// a token it only undoes the apply still pending under that token (the
// --confirm watchdog's case); confirmed or newer applies stay.
func RollbackIRQ(root, token string) (*IRQApplied, error) {
	a, err := LoadIRQApplied(root)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, errors.New("nothing to roll back: rampart tune irq apply has not changed this host")
	}
	if token != "" && a.PendingToken != token {
		return nil, nil
	}
	errs := []error{restore(root, a.Writes)}
	if a.BalanceFileBefore != nil {
		path := filepath.Join(root, irqbalanceDefaults)
		if *a.BalanceFileBefore == "\x00absent" {
			errs = append(errs, os.Remove(path))
		} else {
			errs = append(errs, os.WriteFile(path, []byte(*a.BalanceFileBefore), 0o644))
		}
		errs = append(errs, restartIrqbalance(root, "try-restart"))
	}
	if a.IRQBalance == "stop" {
		if out, err := exec.Command("systemctl", "enable", "--now", "irqbalance").CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("systemctl enable --now irqbalance: %v: %s", err, out))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return a, err
	}
	return a, os.Remove(filepath.Join(root, irqState))
}

// ConfirmIRQ keeps a pending apply.
func ConfirmIRQ(root string) error {
	a, err := LoadIRQApplied(root)
	if err != nil {
		return err
	}
	if a == nil || a.PendingToken == "" {
		return errors.New("no apply is waiting for confirmation")
	}
	a.PendingToken, a.Deadline = "", time.Time{}
	return a.save(root)
}

// Drift is a planned setting that no longer holds.
type Drift struct {
	Path string `json:"path"`
	Want string `json:"want"`
	Got  string `json:"got"`
}

// CheckIRQ compares the files the last apply wrote with what they hold
// now, as CPU sets (the kernel prints masks padded and lists merged).
func CheckIRQ(root string) (*IRQApplied, []Drift, error) {
	a, err := LoadIRQApplied(root)
	if err != nil || a == nil {
		if a == nil && err == nil {
			err = errors.New("nothing applied: run rampart tune irq apply first")
		}
		return nil, nil, err
	}
	drift := []Drift{}
	for _, w := range a.Writes {
		got, err := readTrim(filepath.Join(root, w.Path))
		if err != nil {
			drift = append(drift, Drift{w.Path, w.Want, "unreadable: " + err.Error()})
			continue
		}
		parse := ParseCPUList
		if w.Mask {
			parse = ParseCPUMask
		}
		want, _ := parse(w.Want)
		have, err := parse(got)
		if err != nil || !slices.Equal(want, have) {
			drift = append(drift, Drift{w.Path, w.Want, got})
		}
	}
	return a, drift, nil
}
