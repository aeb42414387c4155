package compile

import "testing"

// BenchmarkBuild10k compiles a feed's 10,000 rules, each with a source /24
// of its own: what every apply of such a policy compiles again, one rule
// changed or not.
func BenchmarkBuild10k(b *testing.B) {
	pol := feedPolicy(b, 10000, true)
	for b.Loop() {
		Build(pol)
	}
}
