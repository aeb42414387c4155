package diagnose

import (
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// testdata/nf_conntrack is /proc/net/stat/nf_conntrack of a namespace on
// two CPUs after new flows met a full table (nf_conntrack_max 64).
func TestParseConntrackStat(t *testing.T) {
	f, err := os.Open("testdata/nf_conntrack")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := Counters{}
	if err := ParseConntrackStat(f, c); err != nil {
		t.Fatal(err)
	}
	if c["conntrack/drop"] != 1 || c["conntrack/early_drop"] != 0 || c["conntrack/search_restart"] != 0 {
		t.Errorf("counters %v", c)
	}
	if _, ok := c["conntrack/entries"]; ok {
		t.Error("entries, a level, was read as a counter")
	}
	if len(c) != 16 {
		t.Errorf("%d counters, want the 16 columns after entries", len(c))
	}
	if err := ParseConntrackStat(strings.NewReader("entries drop\n00000001\n"), Counters{}); err == nil {
		t.Error("a short line parsed")
	}
}

// testdata/iptables-save is `iptables-legacy-save -c` after a few
// datagrams met DROP, REJECT and ACCEPT rules and a DROP policy.
func TestParseIptablesSave(t *testing.T) {
	b, err := os.ReadFile("testdata/iptables-save")
	if err != nil {
		t.Fatal(err)
	}
	got := ParseIptablesSave("iptables-legacy", string(b))
	want := map[string]uint64{
		"iptables-legacy/raw/PREROUTING/1":      1,
		"iptables-legacy/filter/INPUT/1":        3,
		"iptables-legacy/filter/INPUT/3":        2, // rule 2 accepts
		"iptables-legacy/filter/FORWARD/policy": 0,
	}
	if len(got) != len(want) {
		t.Errorf("rules %v, want %v", got, want)
	}
	for name, n := range want {
		if r, ok := got[name]; !ok || r.packets != n {
			t.Errorf("%s: %+v, want %d packets", name, r, n)
		}
	}
	if r := got["iptables-legacy/filter/INPUT/3"]; r.Table != "filter" || r.Chain != "INPUT" || !strings.HasSuffix(r.Text, "-j REJECT --reject-with icmp-port-unreachable") {
		t.Errorf("REJECT rule %+v", r)
	}
}

func TestSymbols(t *testing.T) {
	f, err := os.Open("testdata/kallsyms")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := ReadSymbols(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr uint64
		fn   string
		off  uint64
	}{
		{0xffffffff81f28dd0 + 0x7d, "nf_hook_slow", 0x7d},
		{0xffffffff82046a90 + 0x4bc, "__udp4_lib_rcv", 0x4bc},
		{0xffffffffc0027ac0, "bpf_dispatcher_xdp", 0}, // a module's symbol
	} {
		if fn, off := s.Lookup(c.addr); fn != c.fn || off != c.off {
			t.Errorf("0x%x: %s+0x%x, want %s+0x%x", c.addr, fn, off, c.fn, c.off)
		}
	}
	// Data symbols are not functions: an address past the last text
	// symbol before them resolves to that text symbol.
	if fn, _ := s.Lookup(0xffffffff82400010); fn != "__pfx_udp_v4_early_demux" {
		t.Errorf("address in rodata resolved to %s", fn)
	}
	if fn, _ := s.Lookup(0x1000); fn != "0x1000" {
		t.Errorf("address below every symbol resolved to %s", fn)
	}
	// Without privilege kallsyms shows zeros: no symbols, bare addresses.
	s, _ = ReadSymbols(strings.NewReader("0000000000000000 T nf_hook_slow\n"))
	if fn, _ := s.Lookup(0xffffffff81f28dd0); fn != "0xffffffff81f28dd0" {
		t.Errorf("zeroed kallsyms resolved to %s", fn)
	}
}

// The names come from the running kernel's BTF, which any user may read.
func TestDropReasonNames(t *testing.T) {
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatalf("kernel BTF: %v", err)
	}
	names, err := DropReasonNames(kernel)
	if err != nil {
		t.Fatal(err)
	}
	if names[0] != "NOT_DROPPED_YET" || names[1] != "CONSUMED" || names[2] != "NOT_SPECIFIED" {
		t.Errorf("first reasons %q %q %q", names[0], names[1], names[2])
	}
	for _, want := range []string{"NO_SOCKET", "SOCKET_RCVBUFF", "NETFILTER_DROP", "QDISC_DROP", "CPU_BACKLOG", "TCP_LISTEN_OVERFLOW"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("no reason %s among %d", want, len(names))
		}
	}
}
