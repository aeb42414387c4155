package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernels before 6.6 have no tcx: there a tc program runs as a
// direct-action cls_bpf filter under a clsact qdisc, as iproute2's `tc filter
// add dev IF ingress bpf da` puts it. Replacing the filter in place (same
// parent, priority and handle) swaps its program under RCU: a packet sees
// the old program or the new one. A filter is no bpf object, so its pin is
// the program it runs; the filter itself is found again by its handle.
const (
	clsactPriority = 1      // first among the clsact filters of its direction
	clsactHandle   = 0x5241 // "RA": ours among the filters of that priority
	clsactName     = "rampart"
)

// hookLink holds a program on an interface: a bpf link (XDP, tcx) or a
// clsact filter.
type hookLink interface {
	Update(*ebpf.Program) error
	Pin(string) error
	Unpin() error
	Detach() error
	Close() error
}

// clsactFilter is rampart's filter on one direction of an interface. Its
// methods run in the interface's network namespace.
type clsactFilter struct {
	ifindex int
	egress  bool
	prog    *ebpf.Program // what it runs, for the pin; may be nil
	pin     string
}

var _ hookLink = (*clsactFilter)(nil)

// attrs name rampart's filter: its parent, priority and handle.
func (f *clsactFilter) attrs() netlink.FilterAttrs {
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if f.egress {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	return netlink.FilterAttrs{LinkIndex: f.ifindex, Parent: parent, Handle: clsactHandle, Priority: clsactPriority, Protocol: unix.ETH_P_ALL}
}

func clsactQdisc(ifindex int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
}

// attachClsact adds a clsact qdisc when the interface has none, then the
// filter (replacing one a killed run left).
func attachClsact(ifindex int, egress bool, prog *ebpf.Program) (*clsactFilter, error) {
	f := &clsactFilter{ifindex: ifindex, egress: egress}
	if err := f.Update(prog); err != nil {
		return nil, err
	}
	return f, nil
}

// Update makes the filter run prog, creating it (and the qdisc) when it is
// not there.
func (f *clsactFilter) Update(prog *ebpf.Program) error {
	if err := netlink.QdiscAdd(clsactQdisc(f.ifindex)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add a clsact qdisc: %w", err)
	}
	err := netlink.FilterReplace(&netlink.BpfFilter{FilterAttrs: f.attrs(), Fd: prog.FD(), Name: clsactName, DirectAction: true})
	if err != nil {
		return fmt.Errorf("clsact filter (priority %d, handle %#x): %w", clsactPriority, clsactHandle, err)
	}
	clone, err := prog.Clone()
	if err != nil {
		return err
	}
	if f.pin != "" {
		// bpffs renames no pin over another: a crash between these two
		// leaves no pin, which status reports and reattach puts right.
		if err := errors.Join(ignoreNotExist(os.Remove(f.pin)), clone.Pin(f.pin)); err != nil {
			clone.Close()
			return fmt.Errorf("pin the clsact filter's program: %w", err)
		}
	}
	if f.prog != nil {
		f.prog.Close()
	}
	f.prog = clone
	return nil
}

// Pin pins the program the filter runs.
func (f *clsactFilter) Pin(path string) error {
	if f.prog == nil {
		return errors.New("no program to pin")
	}
	if err := f.prog.Pin(path); err != nil {
		return err
	}
	f.pin = path
	return nil
}

func (f *clsactFilter) Unpin() error {
	if f.pin == "" {
		return nil
	}
	if err := ignoreNotExist(os.Remove(f.pin)); err != nil {
		return err
	}
	f.pin = ""
	return nil
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Detach removes the filter, and the clsact qdisc once no filter is left
// under it in either direction (what rampart added, nothing else).
func (f *clsactFilter) Detach() error {
	if f.ifindex == 0 {
		return nil // the interface, and the filter with it, is gone
	}
	err := netlink.FilterDel(&netlink.BpfFilter{FilterAttrs: f.attrs()})
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete the clsact filter: %w", err)
	}
	nl, err := netlink.LinkByIndex(f.ifindex)
	if err != nil {
		return nil
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		if fs, err := netlink.FilterList(nl, parent); err != nil || len(fs) > 0 {
			return nil
		}
	}
	if err := netlink.QdiscDel(clsactQdisc(f.ifindex)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("delete the clsact qdisc: %w", err)
	}
	return nil
}

func (f *clsactFilter) Close() error {
	if f.prog != nil {
		return f.prog.Close()
	}
	return nil
}

// running is the program our filter on the interface runs; 0 when there is
// no such filter.
func (f *clsactFilter) running() (ebpf.ProgramID, error) {
	nl, err := netlink.LinkByIndex(f.ifindex)
	if err != nil {
		return 0, err
	}
	fs, err := netlink.FilterList(nl, f.attrs().Parent)
	if err != nil {
		return 0, err
	}
	for _, x := range fs {
		if b, ok := x.(*netlink.BpfFilter); ok && b.Handle == clsactHandle && b.Priority == clsactPriority {
			return ebpf.ProgramID(b.Id), nil
		}
	}
	return 0, nil
}

// openClsact opens the hook of a pinned program: the filter on the
// interface the attachment names as it is now (ifindex 0 when it is gone).
// It runs in the attachment's namespace.
func openClsact(a Attachment, prog *ebpf.Program) *clsactFilter {
	f := &clsactFilter{egress: a.Egress, prog: prog, pin: a.LinkPin}
	f.ifindex, _ = indexOf(a.Iface)
	return f
}
