package engine

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rampart-fw/rampart/internal/datapath"
)

// Recover rolls back every unconfirmed apply of the namespace that no
// process owns any more: those whose confirmation deadline has passed (their
// watchdog may have died with a reboot) and those whose apply died before
// confirming (a crash mid-transaction). It removes generations no hook runs
// or can go back to. It returns what it did, a line each.
func (fw *Firewall) Recover() ([]string, error) {
	if err := datapath.OnBPFFS(fw.pinRoot); err != nil {
		if _, serr := os.Stat(fw.scopeState()); serr != nil {
			return nil, nil // nothing was ever applied here
		}
		return nil, fmt.Errorf("%w: nothing was changed", err)
	}
	unlock, err := fw.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return fw.recoverLocked(time.Now())
}

// RollbackExpired rolls back the pending apply with the token (every
// pending one past its deadline when token is empty): the watchdog of
// `apply --confirm` calls it at the deadline.
func (fw *Firewall) RollbackExpired(token string) ([]string, error) {
	var done []string
	now := time.Now()
	err := fw.withHooks(func(h Hook, st *hookState) error {
		p := st.pending
		if p == nil || now.Before(p.Deadline) || token != "" && p.Token != token {
			return nil
		}
		if err := fw.revert(h, st, p); err != nil {
			return err
		}
		done = append(done, fmt.Sprintf("not confirmed by %s: rolled back %s%s", p.Deadline.Format(time.RFC3339), h, fw.inNetns()))
		return nil
	})
	return done, err
}

// recoverLocked is Recover with the lock held. A hook it cannot put right is
// reported among its lines and does not stop the others.
func (fw *Firewall) recoverLocked(now time.Time) ([]string, error) {
	var notes []string
	err := fw.eachHook(func(h Hook, st *hookState) error {
		if p := st.pending; p != nil && (!p.Watched || !now.Before(p.Deadline)) {
			why := "its apply died before confirming"
			if p.Watched {
				why = "it was not confirmed by " + p.Deadline.Local().Format(time.DateTime)
			}
			if err := fw.revert(h, st, p); err != nil {
				notes = append(notes, fmt.Sprintf("%s: could not roll back (%s): %v", h, why, err))
			} else {
				notes = append(notes, fmt.Sprintf("%s%s: rolled back: %s", h, fw.inNetns(), why))
			}
			return nil
		}
		if err := fw.prune(h, st); err != nil {
			notes = append(notes, fmt.Sprintf("%s: remove leftovers: %v", h, err))
		}
		return nil
	})
	if err != nil {
		notes = append(notes, err.Error())
	}
	return notes, nil
}

// revert undoes a pending transaction on one hook: back to the generation
// before it (or no rampart at all), its own generations removed.
func (fw *Firewall) revert(h Hook, st *hookState, p *pending) error {
	if st.live != p.Previous {
		if err := fw.swapBack(h, st.live, p.Previous); err != nil {
			return err
		}
	}
	if p.Previous == 0 {
		return fw.removeHook(h)
	}
	return errors.Join(fw.keepOnly(h, p.Previous), removeFile(fw.pendingFile(h)))
}

// prune removes the generations nothing runs or goes back to: the pins of a
// crashed apply, descriptions without pins. A pending transaction keeps the
// generation it installed and the one it goes back to.
func (fw *Firewall) prune(h Hook, st *hookState) error {
	keep := map[int]bool{fw.newest(h, st): true}
	if p := st.pending; p != nil {
		keep[p.Previous], keep[p.Next] = true, true
	}
	if keep[0] && len(keep) == 1 && !st.link.Pinned {
		return fw.removeHook(h) // nothing to run, nothing attached
	}
	var errs []error
	for _, n := range st.gens {
		if !keep[n] {
			errs = append(errs, fw.removeGen(h, n))
		}
	}
	return errors.Join(errs...)
}
