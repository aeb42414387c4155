package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// Install puts objs on hook h: it pins them as a new generation, then either
// swaps the program of the hook's existing link (one atomic update: a packet
// sees the old policy or the new one, never a mix) or attaches a new link.
// meta describes the policy. Every install is pending until Confirm; past
// deadline, Expired rolls it back. The caller holds Lock.
func Install(h Hook, objs *Objects, meta State, mode Mode, force bool, deadline time.Time, token string) (*State, error) {
	old, err := LoadState(h)
	if err != nil {
		return nil, err
	}
	st := meta
	st.Hook = h
	st.Generation = 1
	st.AppliedAt = time.Now().UTC()
	if old != nil {
		st.Generation = old.Generation + 1
	}
	genDir := h.genDir(st.Generation)
	os.RemoveAll(genDir)
	if err := objs.Pin(genDir); err != nil {
		return nil, err
	}
	err = h.Do(func() error {
		var oldMode Mode
		if old != nil {
			oldMode = old.Mode
		}
		st.Mode, err = swap(h, oldMode, objs, mode, force)
		return err
	})
	if err != nil {
		os.RemoveAll(genDir)
		return nil, fmt.Errorf("%s: %w", h, err)
	}

	st.Carried = make([]Counter, SlotRule0+len(st.Rules))
	if old != nil {
		addCounts(old.Rules, old.Carried, &st)
		if live, err := liveCounters(old); err == nil {
			addCounts(old.Rules, live, &st)
		}
	}
	p := &Pending{Token: token, Deadline: deadline.UTC(), Previous: old}
	if old != nil && old.Pending != nil {
		// Still unconfirmed: a rollback returns to the last confirmed
		// policy, not to the intermediate one.
		p.Previous = old.Pending.Previous
		os.RemoveAll(h.genDir(old.Generation))
	}
	if p.Previous != nil {
		p.Previous.Pending = nil
	}
	st.Pending = p
	return &st, saveState(&st)
}

// progs is what swap needs: a program per kind.
type progs interface{ Prog(Kind) *ebpf.Program }

// Kind is the program kind a mode runs.
func (m Mode) Kind() Kind {
	if m == ModeTC {
		return KindTC
	}
	return KindXDP
}

func loadPinnedProgs(dir string) (*Objects, error) {
	xdp, err := ebpf.LoadPinnedProgram(dir+"/xdp", nil)
	if err != nil {
		return nil, err
	}
	tc, err := ebpf.LoadPinnedProgram(dir+"/tc", nil)
	if err != nil {
		xdp.Close()
		return nil, err
	}
	return &Objects{XDP: xdp, TC: tc}, nil
}

// addCounts adds counts (indexed by the slots of rules) into to.Carried for
// the fixed slots and for every rule of to with the same name and match.
func addCounts(rules []RuleInfo, counts []Counter, to *State) {
	add := func(dst, src int) {
		if src < len(counts) {
			to.Carried[dst].Packets += counts[src].Packets
			to.Carried[dst].Bytes += counts[src].Bytes
		}
	}
	for slot := 0; slot < SlotRule0; slot++ {
		add(slot, slot)
	}
	for i, r := range to.Rules {
		for j, o := range rules {
			if o.Name == r.Name && o.Match == r.Match {
				add(SlotRule0+i, SlotRule0+j)
			}
		}
	}
}

// liveCounters reads the counters map of a state's own generation.
func liveCounters(st *State) ([]Counter, error) {
	m, err := ebpf.LoadPinnedMap(st.Hook.genDir(st.Generation)+"/counters", nil)
	if err != nil {
		return nil, fmt.Errorf("%s: counters not found (was it detached by hand?): %w", st.Hook, err)
	}
	defer m.Close()
	return ReadCounters(m)
}

// swap runs in the hook's namespace. It updates the pinned link when the mode
// stays, otherwise attaches anew. It returns the mode in force.
func swap(h Hook, oldMode Mode, objs progs, want Mode, force bool) (Mode, error) {
	ifc, err := net.InterfaceByName(h.Iface)
	if err != nil {
		return "", fmt.Errorf("interface %q: %w (list them with: ip link)", h.Iface, err)
	}
	if old, err := link.LoadPinnedLink(h.linkPath(), nil); err == nil {
		defer old.Close()
		if want == ModeAuto || want == oldMode {
			if err := old.Update(objs.Prog(oldMode.Kind())); err == nil {
				return oldMode, nil
			}
			// The link is defunct (its interface went away): attach anew.
		}
		// A change of layer. XDP native and generic cannot coexist on one
		// interface, so the old link goes first: a short gap, only here.
		old.Unpin()
		old.Detach()
	}
	l, mode, err := attach(h, ifc.Index, objs, want, force)
	if err != nil {
		return "", err
	}
	defer l.Close()
	if err := l.Pin(h.linkPath()); err != nil {
		l.Detach()
		return "", fmt.Errorf("pin link: %w", err)
	}
	return mode, nil
}

func attach(h Hook, ifindex int, objs progs, want Mode, force bool) (link.Link, Mode, error) {
	if h.Egress || want == ModeTC {
		return attachTC(h, ifindex, objs.Prog(KindTC))
	}
	if err := clearForeignXDP(h, ifindex, force); err != nil {
		return nil, "", err
	}
	tries := []Mode{want}
	if want == ModeAuto {
		tries = []Mode{ModeXDPNative, ModeXDPGeneric, ModeTC}
	}
	var errs []error
	for _, m := range tries {
		var l link.Link
		var err error
		switch m {
		case ModeXDPNative:
			l, err = link.AttachXDP(link.XDPOptions{Program: objs.Prog(KindXDP), Interface: ifindex, Flags: link.XDPDriverMode})
		case ModeXDPGeneric:
			l, err = link.AttachXDP(link.XDPOptions{Program: objs.Prog(KindXDP), Interface: ifindex, Flags: link.XDPGenericMode})
		case ModeTC:
			return attachTC(h, ifindex, objs.Prog(KindTC))
		}
		if err == nil {
			return l, m, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", m, err))
	}
	return nil, "", errors.Join(errs...)
}

// attachTC uses tcx, the link-based successor of the clsact qdisc: it can be
// pinned and updated atomically, and other tc programs keep running after ours.
func attachTC(h Hook, ifindex int, prog *ebpf.Program) (link.Link, Mode, error) {
	at := ebpf.AttachTCXIngress
	if h.Egress {
		at = ebpf.AttachTCXEgress
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at, Anchor: link.Head()})
	if err != nil {
		return nil, "", fmt.Errorf("tc (tcx %s): %w", h.Direction(), err)
	}
	return l, ModeTC, nil
}

// clearForeignXDP refuses to replace another program's XDP unless forced.
func clearForeignXDP(h Hook, ifindex int, force bool) error {
	nl, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return err
	}
	x := nl.Attrs().Xdp
	if x == nil || !x.Attached || x.ProgId == 0 {
		return nil
	}
	if !force {
		return fmt.Errorf("interface %s already carries another XDP program (id %d); rampart will not replace it without --force (or use --mode tc to run beside it)", h.Iface, x.ProgId)
	}
	if err := netlink.LinkSetXdpFdWithFlags(nl, -1, int(x.Flags)); err == nil {
		if nl, err = netlink.LinkByIndex(ifindex); err == nil && (nl.Attrs().Xdp == nil || !nl.Attrs().Xdp.Attached) {
			return nil
		}
	}
	// Attached through a bpf link: detach that link.
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		l := it.Take()
		info, err := l.Info()
		if err == nil && info.Type == link.XDPType && info.XDP().Ifindex == uint32(ifindex) {
			err = l.Detach()
		}
		l.Close()
		if err != nil {
			return fmt.Errorf("remove the XDP link on %s: %w", h.Iface, err)
		}
	}
	return it.Err()
}

// Detach removes everything rampart created for h: the link, the pinned
// objects and the state. It is not an error when nothing was applied.
func Detach(h Hook) error {
	err := h.Do(func() error {
		if l, err := link.LoadPinnedLink(h.linkPath(), nil); err == nil {
			l.Unpin()
			l.Detach()
			l.Close()
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := os.RemoveAll(h.PinDir()); err != nil {
		return err
	}
	removeEmptyDirs(filepath.Dir(h.PinDir()), PinRoot)
	return removeState(h)
}

// Confirm makes a pending apply permanent.
func Confirm(st *State) error {
	if st.Pending == nil {
		return nil
	}
	if prev := st.Pending.Previous; prev != nil && prev.Generation != st.Generation {
		os.RemoveAll(st.Hook.genDir(prev.Generation))
	}
	st.Pending = nil
	return saveState(st)
}

// Rollback returns a pending hook to its previous policy, or removes it when
// there was none.
func Rollback(st *State) error {
	prev := st.Pending.Previous
	if prev == nil {
		return Detach(st.Hook)
	}
	h := st.Hook
	progs, err := loadPinnedProgs(h.genDir(prev.Generation))
	if err != nil {
		return fmt.Errorf("%s: previous program gone, cannot roll back: %w", h, err)
	}
	defer progs.Close()
	err = h.Do(func() error {
		prev.Mode, err = swap(h, st.Mode, progs, prev.Mode, true)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: roll back: %w", h, err)
	}
	back := *prev
	back.Pending = nil
	back.Carried = make([]Counter, SlotRule0+len(back.Rules))
	copy(back.Carried, prev.Carried)
	// What the unconfirmed generation counted itself; the previous
	// generation's map still holds its own counts.
	if live, err := liveCounters(st); err == nil {
		addCounts(st.Rules, live, &back)
	}
	os.RemoveAll(h.genDir(st.Generation))
	return saveState(&back)
}

// Expired rolls back every pending apply whose deadline has passed (and, with
// a token, only that apply's). It returns the hooks it rolled back.
func Expired(token string, now time.Time) ([]Hook, error) {
	states, err := States("", true)
	if err != nil {
		return nil, err
	}
	var done []Hook
	var errs []error
	for _, st := range states {
		p := st.Pending
		if p == nil || now.Before(p.Deadline) || token != "" && p.Token != token {
			continue
		}
		if err := Rollback(st); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, st.Hook)
	}
	return done, errors.Join(errs...)
}

// Counters returns a hook's counters per slot: the live ones plus what
// earlier generations carried over.
func Counters(st *State) ([]Counter, error) {
	live, err := liveCounters(st)
	if err != nil {
		return nil, err
	}
	out := live[:SlotRule0+len(st.Rules)]
	for i := range out {
		if i < len(st.Carried) {
			out[i].Packets += st.Carried[i].Packets
			out[i].Bytes += st.Carried[i].Bytes
		}
	}
	return out, nil
}

// Attached reports whether the hook's pinned link still exists.
func Attached(h Hook) bool {
	_, err := os.Stat(h.linkPath())
	return err == nil
}
