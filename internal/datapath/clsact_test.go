package datapath_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestClsact: on a kernel without tcx, tc programs run as a clsact filter
// that a swap replaces in place, that ReadLink finds again, and that Unlink
// removes with the qdisc it added. Run here with tcx hidden; on Linux 6.1
// (the kernel tier) it is the only tc path.
func TestClsact(t *testing.T) {
	testutil.Privileged(t)
	if datapath.Require(datapath.FeatureTCX) == nil {
		defer datapath.HideTCX()()
	}
	// One pair of programs serves both directions (a tc program is the
	// same at ingress and egress): in the kernel tier's guests each load
	// verifies for ~20 s.
	drop9000 := load(t, datapath.KindTC, "rules:\n  - {name: d, proto: udp, dport: 9000, action: drop}\n").objs
	drop9001 := load(t, datapath.KindTC, "rules:\n  - {name: d, proto: udp, dport: 9001, action: drop}\n").objs
	for _, egress := range []bool{false, true} {
		t.Run(map[bool]string{false: "ingress", true: "egress"}[egress], func(t *testing.T) {
			p := testutil.NewPair(t)
			pins, _ := testutil.Roots(t)
			// Ingress filters on the receiver B; egress on the sender A.
			a := datapath.Attachment{Netns: p.NsB, Iface: p.IfB, LinkPin: filepath.Join(pins, "link")}
			dir := "ingress"
			if egress {
				a = datapath.Attachment{Netns: p.NsA, Iface: p.IfA, Egress: true, LinkPin: filepath.Join(pins, "link")}
				dir = "egress"
			}
			ifindex, err := datapath.Ifindex(a.Netns, a.Iface)
			if err != nil || ifindex == 0 {
				t.Fatalf("ifindex: %d, %v", ifindex, err)
			}
			mode, _, err := datapath.Swap(a, "", drop9000, datapath.ModeTC, false, false)
			if err != nil || mode != datapath.ModeTC {
				t.Fatalf("swap: %s, %v", mode, err)
			}
			show := testutil.Run(t, "tc", "-n", a.Netns, "filter", "show", "dev", a.Iface, dir)
			if !strings.Contains(show, "rampart") || !strings.Contains(show, "direct-action") {
				t.Fatalf("no direct-action rampart filter on %s %s:\n%s", a.Iface, dir, show)
			}
			checkLink(t, a, ifindex, progID(t, drop9000))
			checkUDP(t, p, 0, 300)

			// The same filter, handle and priority, now running the new
			// program: replaced in place.
			if mode, _, err := datapath.Swap(a, datapath.ModeTC, drop9001, datapath.ModeAuto, false, false); err != nil || mode != datapath.ModeTC {
				t.Fatalf("second swap: %s, %v", mode, err)
			}
			if got := testutil.Run(t, "tc", "-n", a.Netns, "filter", "show", "dev", a.Iface, dir); strings.Count(got, "handle 0x5241") != 1 {
				t.Fatalf("want one rampart filter after the swap:\n%s", got)
			}
			checkLink(t, a, ifindex, progID(t, drop9001))
			checkUDP(t, p, 300, 0)

			if err := datapath.Unlink(a); err != nil {
				t.Fatal(err)
			}
			if got := testutil.Run(t, "tc", "-n", a.Netns, "qdisc", "show", "dev", a.Iface); strings.Contains(got, "clsact") {
				t.Errorf("clsact qdisc left after unlink:\n%s", got)
			}
			if st, err := datapath.ReadLink(a); err != nil || st.Pinned {
				t.Errorf("after unlink: %+v, %v", st, err)
			}
			checkUDP(t, p, 300, 300)
		})
	}
}

func progID(t *testing.T, objs *datapath.Objects) ebpf.ProgramID {
	t.Helper()
	info, err := objs.Program(datapath.KindTC).Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

func checkLink(t *testing.T, a datapath.Attachment, ifindex int, want ebpf.ProgramID) {
	t.Helper()
	st, err := datapath.ReadLink(a)
	if err != nil || !st.Pinned || st.Program != want || st.Ifindex != uint32(ifindex) {
		t.Fatalf("ReadLink: %+v, %v; want program %d on ifindex %d", st, err, want, ifindex)
	}
}

// checkUDP sends 300 datagrams from A to B on ports 9000 and 9001 and
// checks how many arrive at each.
func checkUDP(t *testing.T, p *testutil.Pair, want9000, want9001 int) {
	t.Helper()
	l0 := testutil.UDPListener(t, p.NsB, p.B4, 9000)
	l1 := testutil.UDPListener(t, p.NsB, p.B4, 9001)
	testutil.SendUDP(t, p.NsA, p.B4, 9000, 300)
	testutil.SendUDP(t, p.NsA, p.B4, 9001, 300)
	if got := testutil.CountUDP(l0, 300*time.Millisecond); got != want9000 {
		t.Errorf("port 9000: %d of 300 arrived, want %d", got, want9000)
	}
	if got := testutil.CountUDP(l1, 300*time.Millisecond); got != want9001 {
		t.Errorf("port 9001: %d of 300 arrived, want %d", got, want9001)
	}
	l0.Close()
	l1.Close()
}
