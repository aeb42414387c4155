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
		if err := datapath.EnsureBPFFS(BPFFS); err != nil {
			t.Fatal(err)
		}
		return
	}
	if os.Getenv("RAMPART_REQUIRE_PRIVILEGED") == "1" {
		t.Fatal("this test needs root (RAMPART_REQUIRE_PRIVILEGED=1 forbids skipping)")
	}
	t.Skip("needs root; set RAMPART_REQUIRE_PRIVILEGED=1 to make this a failure")
}

// BPFFS is where bpffs is mounted; temporary pin roots go below it.
const BPFFS = "/sys/fs/bpf"

// Roots makes a pin root on bpffs and a state root of the test's own, both
// removed when it ends: tests never touch the host's /sys/fs/bpf/rampart or
// /run/rampart, and can run side by side.
func Roots(t testing.TB) (pin, state string) {
	t.Helper()
	Privileged(t)
	pin, err := TempPinRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pin) })
	return pin, t.TempDir()
}

// TempPinRoot makes a fresh directory on bpffs (for TestMain, which has no
// testing.T); the caller removes it.
func TempPinRoot() (string, error) {
	if err := datapath.EnsureBPFFS(BPFFS); err != nil {
		return "", err
	}
	return os.MkdirTemp(BPFFS, "rampart-test-")
}
