package snmp

import (
	"os"
	"strings"
	"testing"
)

func open(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestParseProcFixtures(t *testing.T) {
	c := Counters{}
	for _, name := range []string{"snmp", "netstat"} {
		if err := Parse(open(t, name), c); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if err := Parse6(open(t, "snmp6"), c); err != nil {
		t.Fatal(err)
	}
	// Values as captured in the fixtures.
	for name, want := range map[string]uint64{
		"IpInReceives": 5704, "IpOutTransmits": 4527, "IcmpInDestUnreachs": 3, "Ip6InReceives": 3,
	} {
		if got, ok := c[name]; !ok || got != want {
			t.Errorf("%s = %d (present %v), want %d", name, got, ok, want)
		}
	}
	for _, name := range []string{"UdpRcvbufErrors", "UdpSndbufErrors", "UdpNoPorts", "TcpExtListenOverflows", "TcpExtListenDrops", "Udp6RcvbufErrors", "IpOutDiscards"} {
		if _, ok := c[name]; !ok {
			t.Errorf("%s missing", name)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Udp: InDatagrams NoPorts\nUdp: 1\n", "line 2: 1 values for 2 fields of Udp:"},
		{"Udp: InDatagrams\n", "line 1: Udp: has no line of values"},
		{"Udp: InDatagrams\nUdp: x\n", "line 2: UdpInDatagrams"},
	} {
		err := Parse(strings.NewReader(tc.in), Counters{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
	if err := Parse6(strings.NewReader("Ip6InReceives 1 2\n"), Counters{}); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("snmp6: %v", err)
	}
	// Tcp MaxConn is -1 in the kernel's table: read as 0, not an error.
	c := Counters{}
	if err := Parse(strings.NewReader("Tcp: MaxConn ActiveOpens\nTcp: -1 7\n"), c); err != nil || c["TcpMaxConn"] != 0 || c["TcpActiveOpens"] != 7 {
		t.Errorf("signed field: %v %v", c, err)
	}
}
