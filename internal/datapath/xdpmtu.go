package datapath

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"
)

// xdpMTUError explains a native XDP attach the driver refused with ERANGE:
// the interface's MTU is above what the driver's XDP path takes in one
// buffer. It names the MTU, the driver's own words and, where it can be
// found, the largest MTU native XDP takes there.
func xdpMTUError(ifindex int, err error) error {
	l, lerr := netlink.LinkByIndex(ifindex)
	if lerr != nil || !errors.Is(err, unix.ERANGE) {
		return err
	}
	a := l.Attrs()
	said := driverSays(l)
	largest := 0
	if m := maxMTU.FindStringSubmatch(said); m != nil {
		largest, _ = strconv.Atoi(m[1])
	} else if l.Type() == "veth" {
		largest = vethXDPMTU()
	}
	msg := fmt.Sprintf("the MTU of %s (%d) is above what native XDP takes on this driver (%s: %s)", a.Name, a.MTU, l.Type(), said)
	if largest > 0 {
		msg += fmt.Sprintf("; the largest it takes is %d: ip link set dev %s mtu %d", largest, a.Name, largest)
		if l.Type() == "veth" {
			msg += " (and the same on its peer)"
		}
	}
	return errors.New(msg + "; or use --mode xdp-generic or --mode tc")
}

var maxMTU = regexp.MustCompile(`max (\d+)`)

// driverSays asks the driver, through netlink with extended acks, why it
// refuses native XDP: the bpf link call that failed carries no message.
func driverSays(l netlink.Link) string {
	prog, err := trivialXDP()
	if err != nil {
		return "no reason given"
	}
	defer prog.Close()
	saved := nl.EnableErrorMessageReporting
	nl.EnableErrorMessageReporting = true
	defer func() { nl.EnableErrorMessageReporting = saved }()
	err = netlink.LinkSetXdpFdWithFlags(l, prog.FD(), nl.XDP_FLAGS_DRV_MODE)
	if err == nil { // taken after all: leave the interface as it was
		netlink.LinkSetXdpFdWithFlags(l, -1, nl.XDP_FLAGS_DRV_MODE)
		return "no reason given"
	}
	return err.Error()
}

func trivialXDP() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
}

// vethXDPMTU is the largest MTU at which veth takes native XDP on this
// kernel (it depends on the page size and the kernel's buffer layout),
// found on a scratch pair in a namespace of its own; 0 when it cannot be.
func vethXDPMTU() int {
	largest := 0
	_ = netns.RunScratch(func() error {
		la := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}
		if err := netlink.LinkAdd(la); err != nil {
			return err
		}
		a, err := netlink.LinkByName("probe0")
		if err != nil {
			return err
		}
		b, err := netlink.LinkByName("probe1")
		if err != nil {
			return err
		}
		prog, err := trivialXDP()
		if err != nil {
			return err
		}
		defer prog.Close()
		lo, hi := 68, 65535 // the first MTU that fails is in (lo, hi]
		for lo+1 < hi {
			mid := (lo + hi) / 2
			if netlink.LinkSetMTU(a, mid) != nil || netlink.LinkSetMTU(b, mid) != nil {
				hi = mid
				continue
			}
			if netlink.LinkSetXdpFdWithFlags(a, prog.FD(), nl.XDP_FLAGS_DRV_MODE) == nil {
				netlink.LinkSetXdpFdWithFlags(a, -1, nl.XDP_FLAGS_DRV_MODE)
				lo = mid
			} else {
				hi = mid
			}
		}
		largest = lo
		return nil
	})
	return largest
}
