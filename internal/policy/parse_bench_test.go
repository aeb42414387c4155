package policy

import (
	"fmt"
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
