package datapath

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Mode is the layer a hook's program runs at.
type Mode string

const (
	ModeAuto       Mode = "auto"
	ModeXDPNative  Mode = "xdp-native"
	ModeXDPGeneric Mode = "xdp-generic"
	ModeTC         Mode = "tc"
)

// ParseMode validates a --mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeXDPNative, ModeXDPGeneric, ModeTC:
		return m, nil
	}
	return "", fmt.Errorf("--mode %q: use auto, xdp-native, xdp-generic or tc", s)
}

// RuleInfo names what a counter slot belongs to.
type RuleInfo struct {
	Name   string `json:"name"`
	Match  string `json:"match"`
	Action string `json:"action"`
}

// State is what rampart remembers about an applied hook.
type State struct {
	Hook       Hook       `json:"hook"`
	Mode       Mode       `json:"mode"`
	Generation int        `json:"generation"`
	PolicyFile string     `json:"policy_file"`
	PolicyHash string     `json:"policy_hash"`
	AppliedAt  time.Time  `json:"applied_at"`
	Rules      []RuleInfo `json:"rules"`
	Default    string     `json:"default"`
	Unparsed   string     `json:"unparsed"`  // the action for unparsed frames
	Malformed  string     `json:"malformed"` // the action for malformed frames
	// Lists maps the name of each list the rules use to its bit in the
	// tables, for in-place changes.
	Lists map[string]uint64 `json:"lists,omitempty"`
	// Carried holds, per counter slot, the counts that earlier generations
	// contributed (rules kept across a re-apply keep their counters).
	Carried []Counter `json:"carried"`
	Pending *Pending  `json:"pending,omitempty"`
}

// Pending is an unconfirmed apply: without `rampart confirm` before Deadline,
// the hook goes back to Previous (nil: to nothing).
type Pending struct {
	Token    string    `json:"token"`
	Deadline time.Time `json:"deadline"`
	Previous *State    `json:"previous,omitempty"`
}

// LoadState reads a hook's state; it returns nil, nil when nothing is applied.
func LoadState(h Hook) (*State, error) {
	b, err := os.ReadFile(h.statePath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("state %s: %w", h.statePath(), err)
	}
	return &s, nil
}

func saveState(s *State) error {
	path := s.Hook.statePath()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func removeState(h Hook) error {
	err := os.Remove(h.statePath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	removeEmptyDirs(filepath.Dir(h.statePath()), StateRoot)
	return err
}

// removeEmptyDirs removes dir and its parents below root while they are
// empty, so that detach leaves nothing behind.
func removeEmptyDirs(dir, root string) {
	for ; dir == root || strings.HasPrefix(dir, root+"/"); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			return
		}
	}
}

// States lists every applied hook, optionally only those of one namespace
// (netns "" with all=false: the host's).
func States(netnsName string, all bool) ([]*State, error) {
	var out []*State
	err := filepath.WalkDir(StateRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return needRoot(err)
		}
		if d.IsDir() || !strings.HasSuffix(path, ".json") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var s State
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("state %s: %w", path, err)
		}
		if all || s.Hook.Netns == netnsName {
			out = append(out, &s)
		}
		return nil
	})
	return out, err
}

// needRoot explains a permission error: rampart's state and BPF objects
// belong to root.
func needRoot(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: rampart needs root (CAP_BPF and CAP_NET_ADMIN); run it with sudo", err)
	}
	return err
}

// Lock serialises commands that change the host. It returns the unlock.
func Lock() (func(), error) {
	if err := os.MkdirAll(StateRoot, 0o700); err != nil {
		return nil, needRoot(err)
	}
	f, err := os.OpenFile(filepath.Join(StateRoot, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, needRoot(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}
