package lab

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/stats"
)

// RampartHook is a policy applied through the engine, as `rampart apply`
// does, on roots of the run's own (a bpffs directory rampart-lab-<pid> and
// the run's work directory): a lab run never touches the host's rampart
// state.
type RampartHook struct {
	fw    *engine.Firewall
	iface string
	Mode  string // the attach mode the engine chose
}

// ApplyRampart writes text to file and applies it on iface in ns, at its
// egress when egress is set; dir holds the run's rampart state.
func ApplyRampart(dir, ns, iface, file, text string, egress bool) (*RampartHook, error) {
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		return nil, err
	}
	fw, err := engine.New(engine.Options{PinRoot: PinRoot(), StateRoot: filepath.Join(dir, "rampart-state"), Netns: ns})
	if err != nil {
		return nil, err
	}
	pol, err := policy.Load(file, policy.Options{})
	if err != nil {
		return nil, err
	}
	res, err := fw.Apply(engine.ApplyRequest{Policy: pol, Ifaces: []string{iface}, Egress: egress})
	if err != nil {
		return nil, fmt.Errorf("rampart apply: %w", err)
	}
	return &RampartHook{fw: fw, iface: iface, Mode: string(res.Applied[0].Mode)}, nil
}

// Detach removes the hook and its state; the namespace would take the
// link, but not the state.
func (h *RampartHook) Detach() error {
	if _, err := h.fw.Detach([]string{h.iface}); err != nil {
		return fmt.Errorf("rampart detach: %w", err)
	}
	return nil
}

// Counter reads one of a rule's counters.
func (h *RampartHook) Counter(rule string, pick func(stats.Row) uint64) func() (uint64, error) {
	return func() (uint64, error) {
		snap, err := h.fw.Stats()
		if err != nil {
			return 0, err
		}
		for _, row := range snap.Rows {
			if row.Name == rule {
				return pick(row), nil
			}
		}
		return 0, fmt.Errorf("rampart has no rule %s on %s", rule, h.iface)
	}
}

// TableBytes is what rampart's tables take in the kernel for the sources
// as one list: the footprint a lookup in that list reads from.
func (f *Traffic) TableBytes() uint64 {
	var v4 []policy.Range4
	var v6 []policy.Range6
	for _, p := range f.Prefixes() {
		if f.Family == 4 {
			v4 = append(v4, policy.PrefixRange4(p))
		} else {
			v6 = append(v6, policy.PrefixRange6(p))
		}
	}
	t := compile.BuildTables([]*policy.List{policy.BuildList("flood", v4, v6)}, []uint64{1}, nil, nil)
	return t.KernelBytes()
}
