package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkParse10k reads a feed's 10,000 rules, each with a source /24 of
// its own: what every apply of such a policy reads again, one rule changed
// or not.
func BenchmarkParse10k(b *testing.B) {
	var text strings.Builder
	text.WriteString("rules:\n")
	for i := range 10000 {
		fmt.Fprintf(&text, "  - {name: r%d, src: 10.%d.%d.0/24, proto: udp, dport: %d, action: drop}\n", i, i>>8&255, i&255, 1+i)
	}
	data := []byte(text.String())
	for b.Loop() {
		if _, err := Parse("feed.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseV6Lines parses 100,000 random /128s as a list file writes
// them (bench apply's random32 mix): the parse of every line of a big IPv6
// list.
func BenchmarkParseV6Lines(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	lines := make([][]byte, 100_000)
	for i := range lines {
		u := U128{Hi: rng.Uint64()>>3 | 1<<61, Lo: rng.Uint64()}
		lines[i] = []byte(netip.PrefixFrom(u.Addr(), 128).String())
	}
	for b.Loop() {
		for _, l := range lines {
			if _, _, ok := parseV6(l); !ok {
				b.Fatalf("%s refused", l)
			}
		}
	}
}

// BenchmarkReadListFile reads list files of a million random addresses,
// one a line, as bench apply writes them: the file's lines, before any
// sort or merge.
func BenchmarkReadListFile(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, family := range []int{4, 6} {
		var text strings.Builder
		for range 1_000_000 {
			if family == 4 {
				fmt.Fprintln(&text, netip.AddrFrom4([4]byte{byte(rng.UintN(224)), byte(rng.UintN(256)), byte(rng.UintN(256)), byte(rng.UintN(256))}))
			} else {
				fmt.Fprintln(&text, U128{Hi: rng.Uint64()>>3 | 1<<61, Lo: rng.Uint64()}.Addr())
			}
		}
		path := filepath.Join(b.TempDir(), "list")
		if err := os.WriteFile(path, []byte(text.String()), 0o600); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("IPv%d", family), func(b *testing.B) {
			for b.Loop() {
				var l listBuilder
				if err := l.readFile(path, 0, Options{}); err != nil || l.entries != 1_000_000 {
					b.Fatalf("%d entries, %v", l.entries, err)
				}
			}
		})
	}
}
