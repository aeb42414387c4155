package datapath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/rampart-fw/rampart/internal/netns"
)

// Mode is the layer a program runs at.
type Mode string

const (
	ModeAuto       Mode = "auto"
	ModeXDPNative  Mode = "xdp-native"
	ModeXDPGeneric Mode = "xdp-generic"
	ModeTC         Mode = "tc"
)

// ParseMode validates a --mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeXDPNative, ModeXDPGeneric, ModeTC:
		return m, nil
	}
	return "", fmt.Errorf("--mode %q: use auto, xdp-native, xdp-generic or tc", s)
}

// Kind is the program kind a mode runs.
func (m Mode) Kind() Kind {
	if m == ModeTC {
		return KindTC
	}
	return KindXDP
}

// Attachment is one pinned link: an interface of a network namespace ("":
// the caller's), one direction.
type Attachment struct {
	Netns   string
	Iface   string
	Egress  bool
	LinkPin string // where the link is pinned
}

// cookie is the SYN cookie check's tc hook beside an XDP attachment.
func (a Attachment) cookie() Attachment {
	a.LinkPin += "-cookie"
	return a
}

func (a Attachment) String() string {
	dir := "ingress"
	if a.Egress {
		dir = "egress"
	}
	s := a.Iface + " " + dir
	if a.Netns != "" {
		s += " (netns " + a.Netns + ")"
	}
	return s
}

// Swap makes the attachment run the programs and generation of objs. When
// objs are a new generation of the programs the link runs, one flip of the
// generation (Activate); when the pinned link runs the wanted layer, one
// atomic update of it: either way a packet sees the old policy or the new
// one, never a mix. Otherwise a new link (XDP native and
// generic cannot coexist on an interface, so the old link goes first: a
// short gap, only then). With cookie (the policy answers SYNs with cookies)
// at XDP, the cookie check's tcx link goes beside it; without, it goes. It
// returns the mode in force and, when auto did not get XDP, why.
func Swap(a Attachment, current Mode, objs *Objects, want Mode, force, cookie bool) (Mode, string, error) {
	// A generation of the program the link runs goes live here, in one
	// flip; the link's update to the same program then changes nothing.
	if err := objs.Activate(); err != nil {
		return "", "", err
	}
	var mode Mode
	var note string
	err := netns.Run(a.Netns, func() error {
		ifindex, err := indexOf(a.Iface)
		if err != nil {
			return fmt.Errorf("interface %q: %w (list them with: ip link)", a.Iface, err)
		}
		old, err := openHook(a)
		if err != nil {
			return fmt.Errorf("open the pinned link: %w", err)
		}
		if old != nil {
			defer old.Close()
			if (want == ModeAuto || want == current) && current != "" {
				if err := old.Update(objs.Program(current.Kind())); err == nil {
					mode = current
					return nil
				}
				// The link is defunct (its interface went away): attach anew.
			}
			if err := old.Unpin(); err != nil {
				return fmt.Errorf("unpin the old link: %w", err)
			}
			if err := old.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
				return fmt.Errorf("detach the old link: %w", err)
			}
		}
		l, m, n, err := attach(a, ifindex, objs, want, force)
		if err != nil {
			return err
		}
		defer l.Close()
		if err := l.Pin(a.LinkPin); err != nil {
			return errors.Join(fmt.Errorf("pin the link: %w", err), l.Detach())
		}
		mode, note = m, n
		return nil
	})
	if err == nil {
		err = netns.Run(a.Netns, func() error { return cookieLink(a, objs, cookie && mode.Kind() == KindXDP) })
	}
	return mode, note, err
}

// cookieLink puts the cookie check at tcx ingress beside XDP (updating the
// pinned link to objs' program), or takes it away.
func cookieLink(a Attachment, objs *Objects, want bool) error {
	pin := a.cookie().LinkPin
	old, err := openHook(a.cookie())
	if err != nil {
		return fmt.Errorf("open the cookie check's link: %w", err)
	}
	if old != nil {
		defer old.Close()
		if want && old.Update(objs.RampartTcCookie) == nil {
			return nil
		}
		if err := errors.Join(old.Unpin(), ignoreUnsupported(old.Detach())); err != nil {
			return fmt.Errorf("remove the cookie check's link: %w", err)
		}
	}
	if !want {
		return nil
	}
	ifindex, err := indexOf(a.Iface)
	if err != nil {
		return err
	}
	l, err := attachTC(Attachment{Iface: a.Iface}, ifindex, objs.RampartTcCookie)
	if err != nil {
		return fmt.Errorf("the SYN cookie check: %w", err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return errors.Join(fmt.Errorf("pin the cookie check's link: %w", err), l.Detach())
	}
	return nil
}

func ignoreUnsupported(err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) {
		return nil
	}
	return err
}

func attach(a Attachment, ifindex int, objs *Objects, want Mode, force bool) (hookLink, Mode, string, error) {
	if a.Egress || want == ModeTC {
		l, err := attachTC(a, ifindex, objs.Program(KindTC))
		return l, ModeTC, "", err
	}
	foreign, err := foreignXDP(a, ifindex, force)
	if err != nil {
		return nil, "", "", err
	}
	if foreign != "" {
		if want != ModeAuto {
			return nil, "", "", fmt.Errorf("%s; rampart will not replace it without --force (or use --mode tc to run beside it)", foreign)
		}
		// Beside another XDP program (a libxdp dispatcher, say), auto
		// runs at tc rather than take the interface.
		l, err := attachTC(a, ifindex, objs.Program(KindTC))
		return l, ModeTC, foreign + ": rampart runs at tc beside it (--mode xdp-native --force would replace it)", err
	}
	tries := []Mode{want}
	if want == ModeAuto {
		tries = []Mode{ModeXDPNative, ModeXDPGeneric, ModeTC}
	}
	var errs []error
	for _, m := range tries {
		var l hookLink
		var err error
		switch m {
		case ModeXDPNative:
			l, err = link.AttachXDP(link.XDPOptions{Program: objs.Program(KindXDP), Interface: ifindex, Flags: link.XDPDriverMode})
			if err != nil && want == ModeXDPNative {
				err = xdpMTUError(ifindex, err)
			}
		case ModeXDPGeneric:
			l, err = link.AttachXDP(link.XDPOptions{Program: objs.Program(KindXDP), Interface: ifindex, Flags: link.XDPGenericMode})
		case ModeTC:
			l, err := attachTC(a, ifindex, objs.Program(KindTC))
			return l, ModeTC, "XDP could not attach: " + errors.Join(errs...).Error(), err
		}
		if err == nil {
			return l, m, "", nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", m, err))
	}
	return nil, "", "", errors.Join(errs...)
}

// haveTCX reports whether the kernel has tcx links (a variable, so that
// tests on a kernel with tcx can take the clsact path too).
var haveTCX = func() bool { return Require(FeatureTCX) == nil }

// attachTC uses tcx, the link-based successor of the clsact qdisc: it can be
// pinned and updated atomically, and other tc programs keep running after
// ours. Before Linux 6.6, a clsact filter does the same (clsact.go).
func attachTC(a Attachment, ifindex int, prog *ebpf.Program) (hookLink, error) {
	dir := map[bool]string{false: "ingress", true: "egress"}[a.Egress]
	if !haveTCX() {
		f, err := attachClsact(ifindex, a.Egress, prog)
		if err != nil {
			return nil, fmt.Errorf("tc (clsact %s): %w", dir, err)
		}
		return f, nil
	}
	at := ebpf.AttachTCXIngress
	if a.Egress {
		at = ebpf.AttachTCXEgress
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at, Anchor: link.Head()})
	if err != nil {
		return nil, fmt.Errorf("tc (tcx %s): %w", dir, err)
	}
	return l, nil
}

// foreignXDP describes another program's XDP on the interface ("" when
// there is none), removing it when forced.
func foreignXDP(a Attachment, ifindex int, force bool) (string, error) {
	nl, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return "", err
	}
	x := nl.Attrs().Xdp
	if x == nil || !x.Attached || x.ProgId == 0 {
		return "", nil
	}
	desc := fmt.Sprintf("interface %s already carries another XDP program (id %d)", a.Iface, x.ProgId)
	if !force {
		return desc, nil
	}
	if err := netlink.LinkSetXdpFdWithFlags(nl, -1, int(x.Flags)); err == nil {
		if nl, err = netlink.LinkByIndex(ifindex); err == nil && (nl.Attrs().Xdp == nil || !nl.Attrs().Xdp.Attached) {
			return "", nil
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
			return "", fmt.Errorf("remove the XDP link on %s: %w", a.Iface, err)
		}
	}
	return "", it.Err()
}

// Unlink detaches and unpins the attachment's link, and the cookie check's
// beside it. No link is not an error. When the namespace is gone, its
// interfaces and their hooks went with it: the pins are removed.
func Unlink(a Attachment) error {
	if netns.Exists(a.Netns) != nil {
		return errors.Join(ignoreNotExist(os.Remove(a.LinkPin)), ignoreNotExist(os.Remove(a.cookie().LinkPin)))
	}
	return netns.Run(a.Netns, func() error {
		var errs []error
		for _, hook := range []Attachment{a, a.cookie()} {
			l, err := openHook(hook)
			if l == nil && err == nil {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: open the pinned link: %w", a, err))
				continue
			}
			if err := ignoreUnsupported(l.Detach()); err != nil {
				errs = append(errs, fmt.Errorf("%s: detach: %w", a, err))
			}
			if err := l.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("%s: unpin the link: %w", a, err))
			}
			l.Close()
		}
		return errors.Join(errs...)
	})
}

// LinkState is what a pinned link does now.
type LinkState struct {
	Pinned  bool           // the pin exists
	Program ebpf.ProgramID // the program it runs
	Ifindex uint32         // 0: its interface is gone (the link is defunct)
}

// ReadLink reports the state of the attachment's pinned link. It reads
// bpffs only: it works for a namespace that is gone.
func ReadLink(a Attachment) (LinkState, error) {
	var st LinkState
	l, prog, err := loadPin(a.LinkPin)
	if err != nil || (l == nil && prog == nil) {
		return st, err
	}
	if prog != nil {
		defer prog.Close()
		return readClsact(a, prog)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return st, err
	}
	st.Pinned, st.Program = true, info.Program
	switch {
	case info.XDP() != nil:
		st.Ifindex = info.XDP().Ifindex
	case info.TCX() != nil:
		st.Ifindex = info.TCX().Ifindex
	}
	return st, nil
}

// Ifindex is the index the named interface has now; 0 when there is none.
func Ifindex(ns, iface string) (int, error) {
	idx := 0
	err := netns.Run(ns, func() error {
		idx, _ = indexOf(iface)
		return nil
	})
	return idx, err
}

// indexOf is the index of the interface with this name or altname in the
// caller's namespace (netlink resolves altnames; Go's net package does not).
func indexOf(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

// openHook opens what the attachment's pin holds, a link or the program of a
// clsact filter; nil when there is no pin. The caller is in the attachment's
// namespace.
func openHook(a Attachment) (hookLink, error) {
	l, prog, err := loadPin(a.LinkPin)
	switch {
	case err != nil:
		return nil, err
	case prog != nil:
		return openClsact(a, prog), nil
	case l != nil:
		return l, nil
	}
	return nil, nil
}

// loadPin opens a hook's pin: a link, or the program of a clsact filter;
// neither when there is no pin.
func loadPin(path string) (link.Link, *ebpf.Program, error) {
	l, err := link.LoadPinnedLink(path, nil)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return l, nil, nil
	}
	prog, perr := ebpf.LoadPinnedProgram(path, nil)
	if perr != nil {
		return nil, nil, err
	}
	return nil, prog, nil
}

// readClsact is ReadLink for a clsact filter: the program its pin holds, and
// the filter as the interface's namespace has it. A namespace or interface
// that is gone, or a filter removed, leaves Ifindex 0.
func readClsact(a Attachment, pinned *ebpf.Program) (LinkState, error) {
	st := LinkState{Pinned: true}
	var err error
	if st.Program, err = programID(pinned); err != nil {
		return st, err
	}
	_ = netns.Run(a.Netns, func() error {
		f := openClsact(a, nil)
		if f.ifindex == 0 {
			return nil
		}
		if id, err := f.running(); err == nil && id != 0 {
			st.Program, st.Ifindex = id, uint32(f.ifindex)
		}
		return nil
	})
	return st, nil
}
