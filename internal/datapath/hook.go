package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Where rampart keeps what outlives it: BPF objects pinned in bpffs, and a
// small JSON state per hook in /run (both vanish at reboot, together).
// Variables so tests and packaging can move them.
var (
	PinRoot   = "/sys/fs/bpf/rampart"
	StateRoot = "/run/rampart"
)

// Hook is one attachment point: an interface, in the host or a named network
// namespace, in one direction.
type Hook struct {
	Netns  string `json:"netns,omitempty"`
	Iface  string `json:"iface"`
	Egress bool   `json:"egress"`
}

// Direction is "ingress" or "egress".
func (h Hook) Direction() string {
	if h.Egress {
		return "egress"
	}
	return "ingress"
}

func (h Hook) scope() string {
	if h.Netns == "" {
		return "host"
	}
	return "netns-" + h.Netns
}

func (h Hook) String() string {
	s := h.Iface + " " + h.Direction()
	if h.Netns != "" {
		s += " (netns " + h.Netns + ")"
	}
	return s
}

// PinDir holds the hook's pinned link and its generations of objects.
func (h Hook) PinDir() string { return filepath.Join(PinRoot, h.scope(), h.Iface, h.Direction()) }

func (h Hook) statePath() string {
	return filepath.Join(StateRoot, h.scope(), h.Iface, h.Direction()+".json")
}

func (h Hook) linkPath() string { return filepath.Join(h.PinDir(), "link") }

func (h Hook) genDir(gen int) string { return filepath.Join(h.PinDir(), fmt.Sprintf("gen-%d", gen)) }

// Do runs fn with the calling thread in the hook's network namespace, the way
// `ip -n` does: interface indexes, netlink and link creation then refer to that
// namespace, while the mount namespace, and so the host's bpffs, stays ours.
func (h Hook) Do(fn func() error) error {
	return InNetns(h.Netns, fn)
}

// InNetns runs fn on a thread switched into the named network namespace
// ("" is the current one).
func InNetns(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	target, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("network namespace %q: %w (list them with: ip netns list)", name, err)
	}
	defer target.Close()

	errc := make(chan error, 1)
	go func() {
		// The thread is discarded, not unlocked, if it cannot be put back.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter network namespace %q: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("leave network namespace %q: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// EnsureBPFFS mounts bpffs at /sys/fs/bpf when it is not mounted there.
func EnsureBPFFS() error {
	base := filepath.Dir(PinRoot)
	var st unix.Statfs_t
	if err := unix.Statfs(base, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if !strings.HasPrefix(base, "/sys/fs/bpf") {
		return fmt.Errorf("%s is not on a bpffs mount", base)
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("bpf", base, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w (mount it yourself: mount -t bpf bpf %s)", base, err, base)
	}
	return nil
}

// Program opens the program the hook's pinned link runs now.
func (h Hook) Program() (*ebpf.Program, error) {
	l, err := link.LoadPinnedLink(h.linkPath(), nil)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return nil, err
	}
	return ebpf.NewProgramFromID(info.Program)
}
