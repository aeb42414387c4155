package cli_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestVersion: --version is one line naming the running kernel; version
// --json lists every feature rampart probes, as the kernel answers it.
func TestVersion(t *testing.T) {
	testutil.Privileged(t)
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	line := mustRampart(t, "--version")
	if !strings.HasPrefix(line, "rampart ") || !strings.Contains(line, "Linux "+release) || strings.Count(line, "\n") != 1 {
		t.Errorf("--version: %q", line)
	}
	var v struct {
		Version, Commit, Kernel string
		TCAttach                string `json:"tc_attach"`
		Features                []struct {
			Name, Kernel string
			Available    bool
		}
	}
	jsonOf(t, &v, "version")
	if v.Version == "" || v.Commit == "" || v.Kernel != release {
		t.Errorf("version --json: %+v", v)
	}
	if len(v.Features) != len(datapath.Features) {
		t.Fatalf("%d features reported, %d probed", len(v.Features), len(datapath.Features))
	}
	for i, f := range datapath.Features {
		got := v.Features[i]
		if got.Name != f.Name || got.Kernel != f.Kernel || got.Available != (f.Check() == nil) {
			t.Errorf("feature %d: %+v, want %s (Linux %s) available=%v", i, got, f.Name, f.Kernel, f.Check() == nil)
		}
	}
	wantTC := map[bool]string{true: "tcx", false: "clsact"}[datapath.FeatureTCX.Check() == nil]
	if v.TCAttach != wantTC {
		t.Errorf("tc_attach %q, want %q", v.TCAttach, wantTC)
	}
}

// TestSyncookieNeedsItsKernel: where the kernel lacks bpf_sk_assign_tcp_reqsk
// (before Linux 6.9), a policy with a syncookie rule is refused in one line
// naming the release that has it, and nothing changes: the running policy
// stays. Where the kernel has it, the same apply takes effect.
func TestSyncookieNeedsItsKernel(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	first := writeFile(t, "first.yaml", "rules:\n  - {name: drop-9000, proto: udp, dport: 9000, action: drop}\n")
	cookie := writeFile(t, "cookie.yaml", "rules:\n  - {name: drop-9000, proto: udp, dport: 9000, action: drop}\n  - {name: cookies, proto: tcp, dport: 80, action: syncookie}\n")
	mustRampart(t, "apply", "-f", first, "--netns", p.NsB, "--iface", p.IfB)
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	before := hookStatus(t, p.NsB)

	_, err := rampart(t, "apply", "-f", cookie, "--netns", p.NsB, "--iface", p.IfB)
	after := hookStatus(t, p.NsB)
	if datapath.FeatureTCPReqsk.Check() == nil {
		if err != nil || len(after.Hooks) != 1 || after.Hooks[0].Rules != 2 || !after.Hooks[0].Attached {
			t.Fatalf("with the kfunc here, apply: %v; status %+v", err, after)
		}
		return
	}
	want := fmt.Sprintf("%s:3: rule \"cookies\": this kernel lacks the bpf_sk_assign_tcp_reqsk kfunc (Linux 6.9 or newer)", cookie)
	if err == nil || err.Error() != want {
		t.Fatalf("apply: %v\nwant: %s", err, want)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) || after.Hooks[0].Rules != 1 {
		t.Errorf("status changed by a refused apply:\nbefore %+v\nafter  %+v", before, after)
	}
	dropped := testutil.UDPListener(t, p.NsB, p.B4, 9000)
	testutil.SendUDP(t, p.NsA, p.B4, 9000, 50)
	if got := testutil.CountUDP(dropped, 300*time.Millisecond); got != 0 {
		t.Errorf("%d datagrams to port 9000 arrived: the running policy no longer holds", got)
	}
}
