// Package netns enters named network namespaces the way `ip -n` does: on a
// locked thread, the mount namespace (and so bpffs) staying the caller's.
package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrGone: the namespace's name does not exist, or no longer names a
// namespace. `ip netns delete` unmounts the namespace before it unlinks the
// name, so for a moment /run/netns/NAME is an empty file that opens but
// cannot be entered (setns says EINVAL).
var ErrGone = errors.New("no such network namespace")

// Open opens a named network namespace, refusing a name that is gone or
// being deleted with ErrGone.
func Open(name string) (vnetns.NsHandle, error) {
	h, err := vnetns.GetFromName(name)
	if errors.Is(err, fs.ErrNotExist) {
		err = ErrGone
	}
	if err == nil {
		var st unix.Statfs_t
		if serr := unix.Fstatfs(int(h), &st); serr != nil {
			err = serr
		} else if st.Type != unix.NSFS_MAGIC {
			err = ErrGone
		}
		if err != nil {
			h.Close()
		}
	}
	if err != nil {
		return vnetns.None(), fmt.Errorf("network namespace %q: %w (list them with: ip netns list)", name, err)
	}
	return h, nil
}

// Run runs fn on a thread switched into the named network namespace
// ("" is the caller's), the way `ip -n` does: interface indexes, netlink and
// link creation then refer to that namespace, while the mount namespace, and
// so the host's bpffs, stays ours.
func Run(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	target, err := Open(name)
	if err != nil {
		return err
	}
	defer target.Close()

	errc := make(chan error, 1)
	go func() {
		// The thread is discarded, not unlocked, if it cannot be put back.
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := vnetns.Set(target); err != nil {
			errc <- fmt.Errorf("enter network namespace %q: %w", name, err)
			return
		}
		ferr := fn()
		if err := vnetns.Set(orig); err != nil {
			errc <- fmt.Errorf("leave network namespace %q: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Enter moves the calling thread, which the caller has locked and will
// discard, into the named namespace for good.
func Enter(name string) error {
	h, err := Open(name)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := vnetns.Set(h); err != nil {
		return fmt.Errorf("enter network namespace %q: %w", name, err)
	}
	return nil
}

// Exists reports an error naming a network namespace that does not exist.
func Exists(name string) error {
	if name == "" {
		return nil
	}
	h, err := Open(name)
	if err != nil {
		return err
	}
	return h.Close()
}

// RunScratch runs fn on a thread in a new, unnamed network namespace
// that goes away, with everything fn made in it, when fn returns.
func RunScratch(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // discarded, not unlocked, if it cannot go back
		orig, err := vnetns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		scratch, err := vnetns.New()
		if err != nil {
			errc <- fmt.Errorf("a scratch network namespace: %w", err)
			return
		}
		ferr := fn()
		scratch.Close()
		if err := vnetns.Set(orig); err != nil {
			errc <- err
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Inside reports whether the calling thread is in the named network
// namespace already (the same inode as /run/netns/NAME).
func Inside(name string) (bool, error) {
	target, err := Open(name)
	if err != nil {
		return false, err
	}
	defer target.Close()
	self, err := vnetns.Get()
	if err != nil {
		return false, err
	}
	defer self.Close()
	return self.Equal(target), nil
}
