package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/stats"
)

// States of a hook, as the kernel has it.
const (
	StateActive      = "active"
	StateUnconfirmed = "unconfirmed"
	// StateIfaceGone: the interface was deleted; the link went with it.
	StateIfaceGone = "interface-gone"
	// StateIfaceRecreated: an interface of the same name came back; nothing
	// is attached to it.
	StateIfaceRecreated = "interface-recreated"
	// StateLinkMissing: the pinned link is gone (removed outside rampart).
	StateLinkMissing = "link-missing"
	// StateForeign: the link runs a program rampart did not pin.
	StateForeign = "foreign-program"
	// StateUnreadable: the kernel runs the hook but rampart's record of
	// what it runs is missing or corrupt.
	StateUnreadable = "state-unreadable"
	// StateNetnsGone: the hook's network namespace was deleted, and its
	// interfaces and links with it; the pins (and the tables they hold)
	// remain until detach.
	StateNetnsGone = "netns-gone"
)

// HookStatus is what runs on a hook.
type HookStatus struct {
	Iface      string        `json:"iface"`
	Netns      string        `json:"netns,omitempty"`
	Direction  string        `json:"direction"`
	Mode       datapath.Mode `json:"mode"`
	Attached   bool          `json:"attached"`
	State      string        `json:"state"`
	Fix        string        `json:"fix,omitempty"` // the command that puts a broken hook right
	Generation int           `json:"generation"`
	PolicyFile string        `json:"policy_file"`
	PolicyHash string        `json:"policy_hash"`
	AppliedAt  time.Time     `json:"applied_at"`
	Rules      int           `json:"rules"`
	// FoldedChanges: live list changes compiled into the tables (fold.go).
	FoldedChanges int `json:"folded_changes,omitempty"`
	// TableBytes: the kernel memory of the maps of the generation the
	// hook runs (its tables, rules, counters, and the outer maps).
	TableBytes      uint64     `json:"table_bytes,omitempty"`
	ConfirmDeadline *time.Time `json:"confirm_deadline,omitempty"`
	Problem         string     `json:"problem,omitempty"` // what could not be read
}

// Status reports every hook of the namespace as the kernel runs it.
func (fw *Firewall) Status() ([]HookStatus, error) {
	if err := fw.pinsVisible(); err != nil {
		return nil, err
	}
	out := []HookStatus{}
	err := fw.withHooks(func(h Hook, st *hookState) error {
		hs := HookStatus{Iface: h.Iface, Netns: fw.netns, Direction: h.Direction()}
		g, gerr := fw.readGen(h, fw.newest(h, st))
		if g != nil {
			hs.Mode, hs.Generation, hs.PolicyFile, hs.PolicyHash, hs.AppliedAt, hs.Rules = g.Mode, g.N, g.PolicyFile, g.PolicyHash, g.AppliedAt, len(g.Rules)
			for _, n := range g.Folded {
				hs.FoldedChanges += n
			}
			hs.TableBytes = fw.tableBytes(h, g.N)
		}
		hs.State, hs.Fix = fw.judge(h, st)
		if gerr != nil && (hs.State == StateActive || hs.State == StateUnconfirmed) {
			hs.State, hs.Problem = StateUnreadable, gerr.Error()
			hs.Fix = fmt.Sprintf("rampart%s apply -f POLICY --iface %s (records it anew), or rampart%s detach --iface %s", fw.netnsFlag(), h.Iface, fw.netnsFlag(), h.Iface)
		}
		hs.Attached = hs.State == StateActive || hs.State == StateUnconfirmed || hs.State == StateUnreadable
		if st.pending != nil {
			d := st.pending.Deadline
			hs.ConfirmDeadline = &d
		}
		out = append(out, hs)
		return nil
	})
	return out, err
}

// judge says what state a hook is in, and what puts it right.
func (fw *Firewall) judge(h Hook, st *hookState) (string, string) {
	reattach := fmt.Sprintf("rampart%s reattach --iface %s", fw.netnsFlag(), h.Iface)
	if fw.netnsGone() {
		return StateNetnsGone, fmt.Sprintf("rampart%s detach --iface %s", fw.netnsFlag(), h.Iface)
	}
	idx, _ := datapath.Ifindex(fw.netns, h.Iface)
	switch {
	case !st.link.Pinned:
		return StateLinkMissing, reattach
	case st.link.Ifindex == 0 && idx == 0:
		return StateIfaceGone, fmt.Sprintf("%s once it is back, or: rampart%s detach --iface %s", reattach, fw.netnsFlag(), h.Iface)
	case st.link.Ifindex == 0 || int(st.link.Ifindex) != idx:
		return StateIfaceRecreated, reattach
	case st.live == 0:
		return StateForeign, fmt.Sprintf("rampart%s apply -f POLICY --iface %s", fw.netnsFlag(), h.Iface)
	case st.pending != nil:
		return StateUnconfirmed, fmt.Sprintf("rampart%s confirm", fw.netnsFlag())
	}
	return StateActive, ""
}

// describeState is a hook's state and, when it is broken, its fix.
func (fw *Firewall) describeState(h Hook, st *hookState) string {
	state, fix := fw.judge(h, st)
	if fix == "" {
		return state
	}
	return state + ": " + fix
}

func (fw *Firewall) netnsFlag() string {
	if fw.netns == "" {
		return ""
	}
	return " --netns " + fw.netns
}

// lockVisible takes the lock once the pins are known to be in sight.
func (fw *Firewall) lockVisible() (func(), error) {
	if err := fw.pinsVisible(); err != nil {
		return nil, err
	}
	return fw.lock()
}

// pinsVisible refuses to work on a pin root that is not on bpffs while state
// says something is applied: the pins are out of sight (another mount
// namespace), and acting on the state alone would lie.
func (fw *Firewall) pinsVisible() error {
	if err := datapath.OnBPFFS(fw.pinRoot); err != nil {
		if hooks, herr := fw.hooks(); herr == nil && len(hooks) == 0 {
			return nil
		}
		return err
	}
	return nil
}

// Stats reads every hook's counters: what its live generation counted plus
// what earlier generations carried over.
func (fw *Firewall) Stats() (stats.Snapshot, error) {
	snap := stats.Snapshot{Time: time.Now(), Rows: []stats.Row{}}
	if err := fw.pinsVisible(); err != nil {
		return snap, err
	}
	hooks, err := fw.hooks()
	if err != nil {
		return snap, err
	}
	for _, h := range hooks {
		st, err := fw.state(h)
		if err != nil {
			return snap, err
		}
		g, err := fw.readGen(h, fw.newest(h, st))
		if err != nil || g == nil {
			continue // a hook being removed
		}
		counts, events, err := fw.liveCounts(h, g)
		if err != nil {
			return snap, fmt.Errorf("%s: counters: %w", h, err)
		}
		for i := range counts {
			if i < len(g.Carried) {
				counts[i].Packets += g.Carried[i].Packets
				counts[i].Bytes += g.Carried[i].Bytes
			}
		}
		row := func(kind, name, action string, c abi.Counter) stats.Row {
			return stats.Row{Iface: h.Iface, Netns: fw.netns, Direction: h.Direction(), Kind: kind, Name: name, Action: action, Packets: c.Packets, Bytes: c.Bytes}
		}
		for i, r := range g.Rules {
			x := row("rule", r.Name, r.Action, counts[abi.SlotRule0+i])
			var e abi.RuleEvents
			if i < len(events) {
				e = events[i]
			}
			if i < len(g.CarriedEvents) {
				e = addEvents(e, g.CarriedEvents[i])
			}
			x.Over, x.CookiesSent, x.CookiesOK, x.CookiesBad = e.Over, e.CookiesSent, e.CookiesOk, e.CookiesBad
			snap.Rows = append(snap.Rows, x)
		}
		snap.Rows = append(snap.Rows,
			row("default", "default", g.Default, counts[abi.SlotDefault]),
			row("unparsed", "unparsed", g.Unparsed, counts[abi.SlotUnparsed]),
			row("malformed", "malformed", g.Malformed, counts[abi.SlotMalformed]),
			row("non-ip", "non-ip", "pass", counts[abi.SlotNonIP]))
	}
	return snap, nil
}

// tableBytes is the kernel memory of generation n's maps; 0 when its pins
// cannot be opened.
func (fw *Firewall) tableBytes(h Hook, n int) uint64 {
	objs, err := datapath.LoadPinned(fw.genPins(h, n))
	if err != nil {
		return 0
	}
	defer objs.Close()
	return objs.Memlock()
}

// Program opens the program a hook's link runs now: what a frame arriving
// this instant meets (for tests and tools that run frames through it).
func (fw *Firewall) Program(h Hook) (*ebpf.Program, error) {
	ls, err := datapath.ReadLink(fw.attachment(h))
	if err != nil {
		return nil, err
	}
	if !ls.Pinned {
		return nil, fmt.Errorf("%s%s: nothing is attached", h, fw.inNetns())
	}
	return ebpf.NewProgramFromID(ls.Program)
}

// UnfilteredTunnels warns of the namespace's tunnel devices that no rampart
// ingress hook filters: the packets they decapsulate enter the stack on the
// tunnel device, past the underlay interface's filter, so a listed inner
// source reaches its socket.
func (fw *Firewall) UnfilteredTunnels() ([]string, error) {
	tunnels, err := datapath.Tunnels(fw.netns)
	if errors.Is(err, netns.ErrGone) {
		return nil, nil // deleted while we looked: it decapsulates nothing
	}
	if err != nil {
		return nil, err
	}
	hooks, err := fw.hooks()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, tun := range tunnels {
		if !slices.Contains(hooks, Hook{Iface: tun.Name}) {
			out = append(out, fmt.Sprintf("tunnel device %s (%s)%s: what it decapsulates is not filtered; filter it too: rampart%s apply -f POLICY --iface %s",
				tun.Name, tun.Kind, fw.inNetns(), fw.netnsFlag(), tun.Name))
		}
	}
	return out, nil
}

// UnpinnedHook is a rampart program on an interface of the namespace that
// no pin of its hooks accounts for, with the command that removes it.
type UnpinnedHook struct {
	datapath.KernelHook
	Netns string `json:"netns,omitempty"`
	Fix   string `json:"fix"`
}

// Unpinned lists the rampart programs the kernel runs on the namespace's
// interfaces that no pinned generation of its hooks accounts for: left by a
// pin root mounted over (bpffs mounted twice), deleted, or another root's.
// They filter, yet no hook of this root reports or removes them.
func (fw *Firewall) Unpinned() ([]UnpinnedHook, error) {
	running, err := datapath.KernelHooks(fw.netns, fw.pinnedPrograms)
	if errors.Is(err, netns.ErrGone) {
		return nil, nil // gone, or deleted while we looked: it runs nothing
	}
	if err != nil {
		return nil, err
	}
	var out []UnpinnedHook
	for _, k := range running {
		out = append(out, UnpinnedHook{k, fw.netns, "rampart" + fw.netnsFlag() + " detach --unpinned"})
	}
	return out, nil
}

// pinnedPrograms are the programs of every pinned generation of the
// namespace's hooks.
func (fw *Firewall) pinnedPrograms() (map[ebpf.ProgramID]bool, error) {
	known := map[ebpf.ProgramID]bool{}
	hooks, err := fw.hooks()
	if err != nil {
		return nil, err
	}
	for _, h := range hooks {
		gens, err := fw.generations(h)
		if err != nil {
			return nil, err
		}
		for _, n := range gens {
			for _, id := range datapath.PinnedPrograms(fw.genPins(h, n)) {
				known[id] = true
			}
		}
	}
	return known, nil
}
