package compile

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/policy"
)

// BenchmarkBuild10k compiles 10,000 rules as a feed sends them, each with a
// source /24, UDP and a destination port of its own: what every apply of
// such a policy compiles again, one rule changed or not.
func BenchmarkBuild10k(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	var text strings.Builder
	text.WriteString("rules:\n")
	for i := range 10000 {
		fmt.Fprintf(&text, "  - {name: r%d, src: %d.%d.%d.0/24, proto: udp, dport: %d, action: drop}\n",
			i, 1+rng.IntN(223), rng.IntN(256), rng.IntN(256), 1+rng.IntN(65535))
	}
	pol, err := policy.Parse("feed.yaml", []byte(text.String()))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		Build(pol)
	}
}
