package policy_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
)

// cutUDP is a UDP frame to port 7001 whose total length leaves 2 bytes of
// its header: the ports cannot be read.
func cutUDP(src string) []byte {
	b := packet.Frame{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.0.0.2"), Proto: 17, Dport: 7001}.Bytes()
	binary.BigEndian.PutUint16(b[16:], 22)
	return b
}

func TestEvalWithMissingFields(t *testing.T) {
	const drop, pass = policy.Drop, policy.Pass
	for _, c := range []struct {
		name     string
		rules    string
		frame    []byte
		action   policy.Action
		rule     int
		unparsed bool
	}{
		{"a drop rule might match, the default passes", `
  - {name: ports, proto: udp, dport: 7000-7999, action: drop}
default: pass`, cutUDP("10.0.0.1"), drop, -1, true},
		{"a drop rule might match, a later drop rule matches", `
  - {name: ports, proto: udp, dport: 7000-7999, action: drop}
  - {name: all, src: 10.0.0.0/8, action: drop}
default: pass`, cutUDP("10.0.0.1"), drop, 1, false},
		{"a drop rule might match, the default drops", `
  - {name: ports, proto: udp, dport: 7000-7999, action: drop}
default: drop`, cutUDP("10.0.0.1"), drop, -1, false},
		{"a pass rule might match, the default passes", `
  - {name: ports, proto: udp, dport: 7000-7999, action: pass}
default: pass`, cutUDP("10.0.0.1"), pass, -1, false},
		{"a pass rule might match, the default drops", `
  - {name: ports, proto: udp, dport: 7000-7999, action: pass}
default: drop`, cutUDP("10.0.0.1"), drop, -1, true},
		{"an L3 rule decides before the unknown one", `
  - {name: all, src: 10.0.0.0/8, action: pass}
  - {name: ports, proto: udp, dport: 7000-7999, action: drop}
default: drop`, cutUDP("10.0.0.1"), pass, 0, false},
		{"a rule whose L3 fields fail is no unknown", `
  - {name: ports, src: 192.0.2.0/24, proto: udp, dport: 7000-7999, action: drop}
default: pass`, cutUDP("10.0.0.1"), pass, -1, false},
		{"the protocol is known, so a TCP rule does not match cut UDP", `
  - {name: ports, proto: tcp, dport: 7000-7999, action: drop}
default: pass`, cutUDP("10.0.0.1"), pass, -1, false},
		{"unparsed: pass", `
  - {name: ports, proto: udp, dport: 7000-7999, action: drop}
default: pass
unparsed: pass`, cutUDP("10.0.0.1"), pass, -1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			pol, err := policy.Parse("p.yaml", []byte("rules:"+c.rules+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			v := pol.Eval(c.frame)
			if v.Action != c.action || v.Rule != c.rule || v.Unparsed != c.unparsed || v.Class != policy.ClassIP {
				t.Errorf("got %+v, want action %v rule %d unparsed %v", v, c.action, c.rule, c.unparsed)
			}
		})
	}
}

func TestMalformedAction(t *testing.T) {
	garbage := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0}
	for _, c := range []struct {
		text string
		want policy.Action
	}{
		{"rules: []\ndefault: pass\n", policy.Pass},
		{"rules: []\ndefault: drop\nunparsed: pass\n", policy.Drop},
		{"rules: [{name: a, src: 10.0.0.0/8, action: drop}]\ndefault: drop\nunparsed: pass\n", policy.Drop},
		{"rules: [{name: a, src: 10.0.0.0/8, action: drop}]\ndefault: pass\n", policy.Drop},
		{"rules: [{name: a, src: 10.0.0.0/8, action: drop}]\ndefault: pass\nunparsed: pass\n", policy.Pass},
	} {
		pol, err := policy.Parse("p.yaml", []byte(c.text))
		if err != nil {
			t.Fatal(err)
		}
		if v := pol.Eval(garbage); v.Class != policy.ClassMalformed || v.Action != c.want {
			t.Errorf("%q: got %+v, want %v", c.text, v, c.want)
		}
	}
}

func TestParseFrameReadsOnlyTheDatagram(t *testing.T) {
	// ihl=15 but a total length of 40: the header is longer than the datagram.
	f := packet.Frame{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: 17, Dport: 7001, IPOptions: make([]byte, 40)}.Bytes()
	binary.BigEndian.PutUint16(f[16:], 40)
	if _, class := policy.ParseFrame(f); class != policy.ClassMalformed {
		t.Errorf("ihl=15 totlen=40: class %v", class)
	}
	// ihl=6, total length 26: two bytes of UDP, the ports cut.
	f = packet.Frame{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: 17, Dport: 7001, IPOptions: make([]byte, 4)}.Bytes()
	binary.BigEndian.PutUint16(f[16:], 26)
	if p, class := policy.ParseFrame(f); class != policy.ClassIP || p.L4 != policy.L4Header || p.L4Len != 0 || p.Dport != 0 {
		t.Errorf("ihl=6 totlen=26: %+v class %v", p, class)
	}
}

func TestUnparsedField(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte("rules: []\n"))
	if err != nil || pol.Unparsed != policy.Drop {
		t.Fatalf("default unparsed: %v %v", pol, err)
	}
	_, err = policy.Parse("p.yaml", []byte("rules: []\nunparsed: maybe\n"))
	if err == nil || err.Error() != `p.yaml:2: unparsed: "maybe": must be drop or pass` {
		t.Errorf("bad unparsed: %v", err)
	}
	_, err = policy.Parse("p.yaml", []byte("rules: [{name: unparsed, action: drop}]\n"))
	if err == nil {
		t.Error("a rule named unparsed was accepted")
	}
}
