package testutil

import (
	"os"
	"testing"

	"github.com/rampart-fw/rampart/internal/datapath"
)

// Privileged gates tests that need root, BPF or network namespaces. Without
// privilege they skip, unless RAMPART_REQUIRE_PRIVILEGED=1 (as in CI), where
// a missing privilege is a failure.
func Privileged(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		if err := datapath.EnsureBPFFS(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if os.Getenv("RAMPART_REQUIRE_PRIVILEGED") == "1" {
		t.Fatal("this test needs root (RAMPART_REQUIRE_PRIVILEGED=1 forbids skipping)")
	}
	t.Skip("needs root; set RAMPART_REQUIRE_PRIVILEGED=1 to make this a failure")
}
