package testutil

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Privileged gates tests that need root, BPF or network namespaces. Without
// privilege they skip, unless RAMPART_REQUIRE_PRIVILEGED=1 (as in CI), where
// a missing privilege is a failure.
func Privileged(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		MountBPFFS(t)
		return
	}
	if os.Getenv("RAMPART_REQUIRE_PRIVILEGED") == "1" {
		t.Fatal("this test needs root (RAMPART_REQUIRE_PRIVILEGED=1 forbids skipping)")
	}
	t.Skip("needs root; set RAMPART_REQUIRE_PRIVILEGED=1 to make this a failure")
}

// MountBPFFS mounts bpffs at /sys/fs/bpf when nothing is mounted there.
func MountBPFFS(t testing.TB) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return
	}
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
}
