package engine

import (
	"errors"
	"fmt"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/netns"
)

// Detach removes rampart from the interfaces, both directions: links, pins,
// state, and the live list changes no remaining hook uses. An interface
// that does not exist and never had rampart is an error.
func (fw *Firewall) Detach(ifaces []string) ([]Hook, error) {
	unlock, err := fw.lockVisible()
	if err != nil {
		return nil, fmt.Errorf("%w: nothing was detached", err)
	}
	defer unlock()
	hooks, err := fw.hooks()
	if err != nil {
		return nil, err
	}
	var done []Hook
	var errs []error
	for _, ifc := range ifaces {
		found := false
		for _, h := range hooks {
			if h.Iface != ifc {
				continue
			}
			found = true
			if err := fw.removeHook(h); err != nil {
				errs = append(errs, fmt.Errorf("detach %s: %w", h, err))
				continue
			}
			done = append(done, h)
		}
		if !found {
			if idx, _ := datapath.Ifindex(fw.netns, ifc); idx == 0 {
				errs = append(errs, fmt.Errorf("--iface %s: no such interface%s, and rampart holds nothing for it", ifc, fw.inNetns()))
			}
		}
	}
	if err := fw.dropUnusedOps(); err != nil {
		errs = append(errs, err)
	}
	return done, errors.Join(errs...)
}

// DetachUnpinned removes what Unpinned lists.
func (fw *Firewall) DetachUnpinned() ([]UnpinnedHook, error) {
	unlock, err := fw.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	found, err := fw.Unpinned()
	if err != nil {
		return nil, err
	}
	var done []UnpinnedHook
	var errs []error
	for _, k := range found {
		if err := netns.Run(fw.netns, k.Remove); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", k, err))
			continue
		}
		done = append(done, k)
	}
	return done, errors.Join(errs...)
}
