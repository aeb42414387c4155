package diagnose

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
		if err := ParseSNMP(open(t, name), c); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if err := ParseSNMP6(open(t, "snmp6"), c); err != nil {
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
	sn, err := ParseSoftnet(open(t, "softnet_stat"))
	if err != nil {
		t.Fatal(err)
	}
	if len(sn) != 2 || sn[0].CPU != 0 || sn[1].CPU != 1 || sn[0].Processed != 0x0010b178 || sn[1].Processed != 0x20acfbf8 {
		t.Errorf("softnet %+v", sn)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Udp: InDatagrams NoPorts\nUdp: 1\n", "line 2: 1 values for 2 fields of Udp:"},
		{"Udp: InDatagrams\n", "line 1: Udp: has no line of values"},
		{"Udp: InDatagrams\nUdp: x\n", "line 2: UdpInDatagrams"},
	} {
		err := ParseSNMP(strings.NewReader(tc.in), Counters{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
	if err := ParseSNMP6(strings.NewReader("Ip6InReceives 1 2\n"), Counters{}); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("snmp6: %v", err)
	}
	if _, err := ParseSoftnet(strings.NewReader("0001 0002\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("softnet: %v", err)
	}
	// Tcp MaxConn is -1 in the kernel's table: read as 0, not an error.
	c := Counters{}
	if err := ParseSNMP(strings.NewReader("Tcp: MaxConn ActiveOpens\nTcp: -1 7\n"), c); err != nil || c["TcpMaxConn"] != 0 || c["TcpActiveOpens"] != 7 {
		t.Errorf("signed field: %v %v", c, err)
	}
}

func TestRates(t *testing.T) {
	r := Rates(Counters{"a": 10, "b": 5, "c": 9}, Counters{"a": 30, "b": 5, "c": 1, "d": 4}, 2)
	if len(r) != 1 || r["a"] != 10 {
		t.Errorf("rates %v: want only a at 10/s (b still, c reset, d new)", r)
	}
}
