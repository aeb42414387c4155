package datapath

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// OnBPFFS reports an error when dir (or, before it exists, its parent) is not
// on a bpffs mount: there are no pins to see, and pins made there would be
// in a mount other commands do not see.
func OnBPFFS(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		err := unix.Statfs(d, &st)
		if err == nil {
			if st.Type == unix.BPF_FS_MAGIC {
				return nil
			}
			return fmt.Errorf("%s is not on a bpffs mount in this mount namespace, so rampart's pinned programs are out of sight (mount it: mount -t bpf bpf /sys/fs/bpf)", dir)
		}
		if !os.IsNotExist(err) || d == filepath.Dir(d) {
			return fmt.Errorf("%s: %w", d, err)
		}
	}
}

// EnsureBPFFS mounts bpffs at /sys/fs/bpf when dir lies below it and nothing
// is mounted there yet (a machine that booted without it), then creates dir.
func EnsureBPFFS(dir string) error {
	const base = "/sys/fs/bpf"
	var st unix.Statfs_t
	if rel, err := filepath.Rel(base, dir); err == nil && filepath.IsLocal(rel) &&
		unix.Statfs(base, &st) == nil && st.Type != unix.BPF_FS_MAGIC {
		if err := unix.Mount("bpf", base, "bpf", 0, ""); err != nil {
			return fmt.Errorf("mount bpffs at %s: %w (mount it yourself: mount -t bpf bpf %s)", base, err, base)
		}
	}
	if err := OnBPFFS(dir); err != nil {
		return err
	}
	return os.MkdirAll(dir, 0o700)
}
