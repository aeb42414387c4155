package lab

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestFloodSources: the sources are distinct, inside the range, and as many
// as asked; a range too small for them is refused.
func TestFloodSources(t *testing.T) {
	for _, tc := range []struct {
		family int
		src    string
		n      int
	}{{4, "10.0.0.0/8", 100000}, {4, "192.0.2.0/24", 256}, {6, "fd10::/32", 100000}, {6, "2001:db8:ab00::/40", 1 << 16}} {
		f, err := newFlood(tc.family, netip.MustParsePrefix(tc.src), tc.n)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[netip.Prefix]bool{}
		for i := range uint32(tc.n) {
			p := f.source(i)
			if !netip.MustParsePrefix(tc.src).Contains(p.Addr()) || seen[p] {
				t.Fatalf("%s: source %d = %s outside the range or repeated", tc.src, i, p)
			}
			seen[p] = true
		}
	}
	if _, err := newFlood(4, netip.MustParsePrefix("192.0.2.0/24"), 257); err == nil {
		t.Error("257 sources in a /24 accepted")
	}
	if _, err := newFlood(6, netip.MustParsePrefix("10.0.0.0/8"), 1); err == nil {
		t.Error("an IPv4 range for the IPv6 flood accepted")
	}
}

// TestGeneratorFrames runs the generator once per frame, outside live mode,
// and checks what it would send: a source the blocklist lists, a random
// port, and checksums that verify.
func TestGeneratorFrames(t *testing.T) {
	testutil.Privileged(t)
	for _, tc := range []struct {
		family int
		src    string
	}{{4, "10.0.0.0/8"}, {6, "fd10::/32"}} {
		f, err := newFlood(tc.family, netip.MustParsePrefix(tc.src), 1000)
		if err != nil {
			t.Fatal(err)
		}
		listed := map[netip.Prefix]bool{}
		for i := range f.count {
			listed[f.source(i)] = true
		}
		objs, err := loadObjects(&topology{genIndex: 1}, f)
		if err != nil {
			t.Fatal(err)
		}
		defer objs.Close()
		frame := f.frame([]byte{2, 0, 0, 0, 0, 1}, []byte{2, 0, 0, 0, 0, 2})
		ports := map[uint16]bool{}
		for range 200 {
			out := make([]byte, len(frame))
			if _, err := objs.LabGen.Run(&ebpf.RunOptions{Data: frame, DataOut: out}); err != nil {
				t.Fatal(err)
			}
			frame = out // the next run starts from what this one left, as recycled pages do
			var src netip.Prefix
			var udp []byte
			if tc.family == 4 {
				ip := out[14:34]
				if packet.Checksum(ip) != 0 {
					t.Fatalf("IPv4 header checksum does not verify: % x", ip)
				}
				src = netip.PrefixFrom(netip.AddrFrom4([4]byte(ip[12:16])), 32)
				udp = out[34:]
			} else {
				ip := out[14:54]
				src, _ = netip.AddrFrom16([16]byte(ip[8:24])).Prefix(64)
				udp = out[54:]
			}
			if !listed[src] {
				t.Fatalf("source %s is not one of the flood's listed sources", src)
			}
			if !udpChecksumOK(out, tc.family) {
				t.Fatalf("UDP checksum does not verify: % x", out)
			}
			sport := binary.BigEndian.Uint16(udp)
			if sport < 1024 {
				t.Fatalf("source port %d below 1024", sport)
			}
			ports[sport] = true
		}
		if len(ports) < 150 {
			t.Errorf("IPv%d: only %d distinct source ports in 200 frames", tc.family, len(ports))
		}
	}
}

func udpChecksumOK(frame []byte, family int) bool {
	var pseudo, udp []byte
	if family == 4 {
		ip := frame[14:34]
		udp = frame[34:]
		pseudo = append(append([]byte{}, ip[12:20]...), 0, 17, 0, byte(len(udp)))
	} else {
		ip := frame[14:54]
		udp = frame[54:]
		pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, 0, byte(len(udp)), 0, 0, 0, 17)
	}
	return packet.Checksum(append(pseudo, udp...)) == 0
}
