package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"
)

// KernelHook is a rampart program the kernel runs on an interface, found
// from the interface's side (its XDP program, its tcx programs, its clsact
// filter), not from pins: what runs even where the pins are out of sight.
type KernelHook struct {
	Iface   string         `json:"iface"`
	Egress  bool           `json:"egress"`
	Hook    string         `json:"hook"` // xdp, tcx or clsact
	Program ebpf.ProgramID `json:"program_id"`
	Name    string         `json:"program_name"`
	Tag     string         `json:"program_tag"`
}

// rampartProgram reports whether a program's name is one of the filter's,
// as the kernel keeps it: 15 bytes (rampart_tc_cookie is rampart_tc_cook).
func rampartProgram(name string) bool {
	for _, n := range []string{filterProgRampartXdp, filterProgRampartTc, filterProgRampartTcCookie} {
		if name == n[:min(len(n), unix.BPF_OBJ_NAME_LEN-1)] {
			return true
		}
	}
	return false
}

// KernelHooks lists the rampart programs the kernel runs on the interfaces
// of the namespace but those known() returns, which it calls once it has
// seen what runs (a program pinned before it is attached is known then).
// Only an unknown program's full info is read, for its name: that copies
// its instructions out too, 1-2 ms.
func KernelHooks(ns string, known func() (map[ebpf.ProgramID]bool, error)) ([]KernelHook, error) {
	var running []KernelHook
	err := netns.Run(ns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		add := func(l netlink.Link, egress bool, hook string, id ebpf.ProgramID) {
			running = append(running, KernelHook{Iface: l.Attrs().Name, Egress: egress, Hook: hook, Program: id})
		}
		for _, l := range links {
			a := l.Attrs()
			if a.Xdp != nil && a.Xdp.Attached && a.Xdp.ProgId != 0 {
				add(l, false, "xdp", ebpf.ProgramID(a.Xdp.ProgId))
			}
			for _, egress := range []bool{false, true} {
				at := map[bool]ebpf.AttachType{false: ebpf.AttachTCXIngress, true: ebpf.AttachTCXEgress}[egress]
				if r, err := link.QueryPrograms(link.QueryOptions{Target: a.Index, Attach: at}); err == nil {
					for _, p := range r.Programs {
						add(l, egress, "tcx", p.ID)
					}
				}
				f := &clsactFilter{ifindex: a.Index, egress: egress}
				if id, err := f.running(); err == nil && id != 0 {
					add(l, egress, "clsact", id)
				}
			}
		}
		return nil
	})
	if err != nil || len(running) == 0 {
		return nil, err
	}
	skip, err := known()
	if err != nil {
		return nil, err
	}
	var out []KernelHook
	for _, k := range running {
		if skip[k.Program] {
			continue
		}
		p, err := ebpf.NewProgramFromID(k.Program)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err == nil && rampartProgram(info.Name) {
			k.Name, k.Tag = info.Name, info.Tag
			out = append(out, k)
		}
	}
	return out, nil
}

// Remove takes the program off its interface: the link that holds it is
// detached (found by its program among the kernel's links), a clsact filter
// deleted. The caller is in the hook's namespace.
func (k KernelHook) Remove() error {
	l, err := netlink.LinkByName(k.Iface)
	if err != nil {
		return err
	}
	if k.Hook == "clsact" {
		f := &clsactFilter{ifindex: l.Attrs().Index, egress: k.Egress}
		return f.Detach()
	}
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		kl := it.Take()
		info, err := kl.Info()
		if err == nil && info.Program == k.Program {
			err = kl.Detach()
			kl.Close()
			return err
		}
		kl.Close()
	}
	if err := it.Err(); err != nil {
		return err
	}
	if k.Hook == "xdp" { // attached without a link
		return netlink.LinkSetXdpFdWithFlags(l, -1, int(l.Attrs().Xdp.Flags)&(nl.XDP_FLAGS_SKB_MODE|nl.XDP_FLAGS_DRV_MODE))
	}
	return errors.New("no link holds it")
}

func (k KernelHook) String() string {
	dir := "ingress"
	if k.Egress {
		dir = "egress"
	}
	return fmt.Sprintf("%s %s (%s, program %d %s, tag %s)", k.Iface, dir, k.Hook, k.Program, k.Name, k.Tag)
}
