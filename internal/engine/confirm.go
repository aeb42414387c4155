package engine

import (
	"errors"
	"fmt"
)

// Confirm makes the namespace's pending applies permanent. It confirms what
// it can and names every hook it could not.
func (fw *Firewall) Confirm() ([]Hook, error) {
	var done []Hook
	err := fw.withHooks(func(h Hook, st *hookState) error {
		if st.pending == nil {
			return nil
		}
		if st.live != st.pending.Next {
			return fmt.Errorf("%s: not confirmed: it runs generation %d, not the pending %d (%s)", h, st.live, st.pending.Next, fw.describeState(h, st))
		}
		if err := errors.Join(fw.keepOnly(h, st.live), removeFile(fw.pendingFile(h))); err != nil {
			return fmt.Errorf("%s: not confirmed: %w", h, err)
		}
		done = append(done, h)
		return nil
	})
	if len(done) == 0 && err == nil {
		return nil, fmt.Errorf("no apply is waiting for confirmation%s (if its deadline passed, the previous policy is back: see rampart status)", fw.inNetns())
	}
	return done, err
}
