package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/rampart-fw/rampart/internal/datapath"
)

// Reattach attaches again the hooks of the interfaces whose link is gone
// (an interface deleted and created again, a link removed by hand), with
// the policy they ran. Hooks still attached are left alone.
func (fw *Firewall) Reattach(ifaces []string) ([]Applied, error) {
	if err := fw.pinsVisible(); err != nil {
		return nil, err
	}
	var out []Applied
	held := map[string]bool{}
	err := fw.withHooks(func(h Hook, st *hookState) error {
		held[h.Iface] = true
		if len(ifaces) > 0 && !slices.Contains(ifaces, h.Iface) {
			return nil
		}
		if state, _ := fw.judge(h, st); state == StateActive || state == StateUnconfirmed {
			return nil
		}
		a, err := fw.reattach(h, st)
		if err != nil {
			return fmt.Errorf("reattach %s: %w", h, err)
		}
		out = append(out, a)
		return nil
	})
	for _, ifc := range ifaces {
		if !held[ifc] {
			err = errors.Join(err, fmt.Errorf("--iface %s: rampart holds no hook on it%s (rampart status lists them)", ifc, fw.inNetns()))
		}
	}
	return out, err
}

func (fw *Firewall) reattach(h Hook, st *hookState) (Applied, error) {
	n := fw.newest(h, st)
	g, err := fw.readGen(h, n)
	if err != nil || g == nil {
		return Applied{}, fmt.Errorf("no pinned generation to attach: apply the policy again (%v)", err)
	}
	objs, err := datapath.LoadPinned(fw.genPins(h, n))
	if err != nil {
		return Applied{}, err
	}
	defer objs.Close()
	mode, note, err := datapath.Swap(fw.attachment(h), "", objs, g.Mode, false, g.syncookie())
	if err != nil {
		return Applied{}, err
	}
	g.Mode = mode
	if err := fw.writeGen(h, g); err != nil {
		return Applied{}, err
	}
	return Applied{Hook: h, Mode: mode, Generation: n, PolicyHash: g.PolicyHash, Rules: len(g.Rules), Note: note}, nil
}
