package proxy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Claim takes the routing table for this process in this network
// namespace, so that no other proxy installs into it or removes from it
// while this one runs. The claim is a lock on a file of dir named by the
// namespace and the table, which records who holds it; the kernel drops
// the lock when its holder dies, even by SIGKILL, so what is left in the
// table once the lock is free is a stopped run's, that Install removes.
// release gives the table up; remove the routing before.
func (r *Routing) Claim(dir, owner string) (release func(), err error) {
	if !r.Needed() {
		return func() {}, nil
	}
	if dir == "" {
		return nil, errors.New("no state directory to claim the routing table in")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory for the proxy: %w", err)
	}
	var ns unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &ns); err != nil {
		return nil, fmt.Errorf("identify this network namespace: %w", err)
	}
	path := filepath.Join(dir, fmt.Sprintf("netns-%d-table-%d.lock", ns.Ino, r.Table))
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("claim routing table %d: %w", r.Table, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			holder, _ := os.ReadFile(path)
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("routing table %d of this network namespace is in use by a running rampart proxy (%s): give this proxy another table (table: in its file)", r.Table, strings.TrimSpace(string(holder)))
			}
			return nil, fmt.Errorf("claim routing table %d: lock %s: %w", r.Table, path, err)
		}
		// The holder before may have removed the file as it let go: the
		// lock is only worth something on the file at path.
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &now) != nil || held.Ino != now.Ino {
			f.Close()
			continue
		}
		if err := f.Truncate(0); err == nil {
			fmt.Fprintf(f, "pid %d, %s\n", os.Getpid(), owner)
		}
		return func() {
			os.Remove(path) // while locked: the next one opens a new file
			f.Close()
		}, nil
	}
}
