package engine

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// In-place list changes (rampart list add|del) live in one file per
// namespace, oldest first; an overlay per hook carries them into the kernel.
// The file is gob, not JSON: every change reads and writes it whole, and
// at 50,000 changes JSON took 0.16 s of that, gob 0.04 s (`rampart list
// show --json` prints them).
func (fw *Firewall) opsPath() string { return filepath.Join(fw.scopeState(), "list-ops.gob") }

// legacyOpsPath is where releases before the gob file kept the changes.
func (fw *Firewall) legacyOpsPath() string { return filepath.Join(fw.scopeState(), "list-ops.json") }

func (fw *Firewall) readOps() ([]policy.ListOp, error) {
	var ops []policy.ListOp
	b, err := os.ReadFile(fw.opsPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, err = readJSON(fw.legacyOpsPath(), &ops); err != nil {
			return nil, err
		}
		return ops, fw.numberOps(ops)
	case err != nil:
		return nil, needRoot(err)
	}
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&ops); err != nil {
		return nil, fmt.Errorf("%s: %w", fw.opsPath(), err)
	}
	return ops, fw.numberOps(ops)
}

// numberOps gives the ops an earlier release journaled, without sequence
// numbers, theirs in the journal's order, after every number given (none
// of them was folded).
func (fw *Firewall) numberOps(ops []policy.ListOp) error {
	if !slices.ContainsFunc(ops, func(op policy.ListOp) bool { return op.Seq == 0 }) {
		return nil
	}
	next, err := fw.nextSeqOf(ops)
	if err != nil {
		return err
	}
	for i := range ops {
		if ops[i].Seq == 0 {
			ops[i].Seq, next = next, next+1
		}
	}
	return nil
}

// nextSeq is the sequence number of the next op appended to ops.
func nextSeq(ops []policy.ListOp) uint64 {
	var last uint64
	for _, op := range ops {
		last = max(last, op.Seq)
	}
	return last + 1
}

// seqPath keeps the last sequence number given: a number is never given
// twice, even after the journal was emptied, since a generation's tables
// may hold the changes up to one (foldedSeq).
func (fw *Firewall) seqPath() string { return filepath.Join(fw.scopeState(), "list-ops-seq.json") }

// nextSeqOf is the sequence number of the next change appended to ops.
func (fw *Firewall) nextSeqOf(ops []policy.ListOp) (uint64, error) {
	var last uint64
	_, err := readJSON(fw.seqPath(), &last)
	return max(nextSeq(ops), last+1), err
}

// liveOps reads the changes that have not expired.
func (fw *Firewall) liveOps() ([]policy.ListOp, error) {
	ops, err := fw.readOps()
	return unexpired(ops, time.Now()), err
}

func unexpired(ops []policy.ListOp, now time.Time) []policy.ListOp {
	return slices.DeleteFunc(ops, func(op policy.ListOp) bool { return !op.Expires.IsZero() && !op.Expires.After(now) })
}

func (fw *Firewall) saveOps(ops []policy.ListOp) error {
	if len(ops) == 0 {
		return errors.Join(removeFile(fw.opsPath()), removeFile(fw.legacyOpsPath()))
	}
	// The last number first: a journal is never written with numbers the
	// file has not kept.
	next, err := fw.nextSeqOf(ops)
	if err != nil {
		return err
	}
	last, _ := json.Marshal(next - 1) // a number cannot fail to encode
	if err := writeFile(fw.seqPath(), last); err != nil {
		return err
	}
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(ops); err != nil {
		return err
	}
	if err := writeFile(fw.opsPath(), b.Bytes()); err != nil {
		return err
	}
	return removeFile(fw.legacyOpsPath())
}

// ListChange is one `list add` or `list del`.
type ListChange struct {
	List     string
	Prefixes []netip.Prefix
	Add      bool
	TTL      time.Duration // 0: until reverted
}

// ListChanged says where a change went.
type ListChanged struct {
	Hooks   []Hook
	Expires time.Time // zero without a TTL
	// Foldable is how many changes the largest overlay of those hooks
	// holds that a fold would take (fold.go): the daemon folds past a
	// few.
	Foldable int
}

// ChangeList adds prefixes to a live list or removes them from it, on every
// hook whose policy uses the list, without rebuilding the tables. With a
// TTL the change undoes itself (a detached process, or the daemon, expires
// it); without one it holds until reverted, detached, or put in the file.
func (fw *Firewall) ChangeList(c ListChange) (*ListChanged, error) {
	if c.TTL < 0 {
		return nil, errors.New("the TTL must be positive")
	}
	unlock, err := fw.lockVisible()
	if err != nil {
		return nil, err
	}
	defer unlock()
	users, known, err := fw.listUsers(c.List)
	if err != nil {
		return nil, err
	}
	if len(users) == 0 {
		if len(known) == 0 {
			return nil, fmt.Errorf("list %q: no policy is applied%s; apply one first", c.List, fw.inNetns())
		}
		hint := ""
		if _, err := netip.ParsePrefix(c.List); err == nil {
			hint = "; a rule's inline prefix is no list to change: name it under lists: for that"
		}
		return nil, fmt.Errorf("list %q is not used by any applied policy%s (lists in use: %s)%s", c.List, fw.inNetns(), strings.Join(known, ", "), hint)
	}
	others, static, err := fw.bitUse(c.List, users)
	switch {
	case err != nil:
		return nil, err
	case static:
		return nil, staticList(c.List)
	case !c.Add && len(others) > 0:
		return nil, removalShared(c.List, others)
	}
	for _, u := range users {
		for _, p := range c.Prefixes {
			if f := u.info.Family; f == 4 && !p.Addr().Is4() || f == 6 && p.Addr().Is4() {
				return nil, fmt.Errorf("list %q holds only IPv%d addresses: %s does not belong in it", c.List, f, p)
			}
		}
	}
	res := &ListChanged{}
	if c.TTL > 0 {
		res.Expires = time.Now().Add(c.TTL).UTC()
	}
	// The change's entries alone are written when the kernel holds what
	// the journal says: not when a change has expired and not been undone
	// yet, which a rewrite of the whole overlay undoes too.
	held, err := fw.readOps()
	if err != nil {
		return nil, err
	}
	ops := unexpired(slices.Clone(held), time.Now())
	added := c.Prefixes
	if len(ops) != len(held) {
		added = nil
	}
	seq, err := fw.nextSeqOf(held)
	if err != nil {
		return nil, err
	}
	for _, p := range c.Prefixes {
		ops = append(ops, policy.ListOp{List: c.List, Prefix: p, Add: c.Add, Expires: res.Expires, Seq: seq})
		seq++
	}
	res.Hooks, res.Foldable, err = fw.refreshOverlays(ops, c.List, added)
	if err == nil {
		err = fw.saveOps(ops)
	}
	if err != nil {
		// Back to what the journal holds, so that the next change's delta
		// starts from it.
		_, _, undo := fw.refreshOverlays(unexpired(held, time.Now()), "", nil)
		return nil, errors.Join(err, undo)
	}
	if c.TTL > 0 {
		if err := fw.ensureExpirer(); err != nil {
			return res, fmt.Errorf("start the expiry process: %w (the entries expire at the next rampart list command instead)", err)
		}
	}
	return res, nil
}

// RestoreChanges puts back live changes kept elsewhere (the daemon keeps
// them across reboots, when /run is empty): the unexpired ones of lists
// an applied policy uses that the namespace does not hold already, but
// removals from a list whose bit others share now and changes to a list
// without a bit, which it reports in its error. The caller expires them (ServeExpiry). It returns how many
// it restored.
func (fw *Firewall) RestoreChanges(saved []policy.ListOp) (int, error) {
	unlock, err := fw.lockVisible()
	if err != nil {
		return 0, err
	}
	defer unlock()
	ops, err := fw.liveOps()
	if err != nil {
		return 0, err
	}
	// Once per list and per op, not per pair: a hundred thousand bans
	// are restored in a second, not in minutes.
	type key struct {
		list    string
		prefix  netip.Prefix
		add     bool
		expires int64
	}
	keyOf := func(o policy.ListOp) key { return key{o.List, o.Prefix, o.Add, o.Expires.UnixNano()} }
	held := make(map[key]bool, len(ops))
	for _, o := range ops {
		held[keyOf(o)] = true
	}
	type listUse struct {
		inUse  bool
		others []string // the lists sharing its bit
		static bool
	}
	uses := map[string]*listUse{} // by list
	var refused []policy.ListOp   // removals from lists sharing a bit, changes to static ones
	touched, n := map[string]bool{}, 0
	seq, err := fw.nextSeqOf(ops)
	if err != nil {
		return 0, err
	}
	for _, op := range unexpired(saved, time.Now()) {
		use := uses[op.List]
		if use == nil {
			use = &listUse{}
			users, _, err := fw.listUsers(op.List)
			if use.inUse = err == nil && len(users) > 0; use.inUse {
				if use.others, use.static, err = fw.bitUse(op.List, users); err != nil {
					return 0, err
				}
			}
			uses[op.List] = use
		}
		if !use.inUse || held[keyOf(op)] {
			continue
		}
		if use.static || !op.Add && len(use.others) > 0 {
			refused = append(refused, op)
			continue
		}
		held[keyOf(op)] = true
		op.Seq, seq = seq, seq+1 // a new change here: nothing folded it
		ops = append(ops, op)
		touched[op.List] = true
		n++
	}
	for list := range touched {
		if _, _, err := fw.refreshOverlays(ops, list, nil); err != nil {
			return 0, err
		}
	}
	var notRestored error
	if len(refused) > 0 {
		first := refused[0]
		why := removalShared(first.List, uses[first.List].others)
		if uses[first.List].static {
			why = staticList(first.List)
		}
		notRestored = fmt.Errorf("%d changes not restored, the first %s from %s: %w", len(refused), first.Prefix, first.List, why)
	}
	if n == 0 {
		return 0, notRestored
	}
	return n, errors.Join(fw.saveOps(ops), notRestored)
}

// Changes lists the live changes of the namespace, oldest first.
func (fw *Firewall) Changes() ([]policy.ListOp, error) {
	unlock, err := fw.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return fw.liveOps()
}

// RevertList removes live changes of a list (all of them, or those of the
// given prefixes; every list's when list is ""): what the files say holds
// again. It returns the changes removed.
func (fw *Firewall) RevertList(list string, prefixes []netip.Prefix) ([]policy.ListOp, error) {
	unlock, err := fw.lockVisible()
	if err != nil {
		return nil, err
	}
	defer unlock()
	ops, err := fw.liveOps()
	if err != nil {
		return nil, err
	}
	var removed []policy.ListOp
	kept := slices.DeleteFunc(ops, func(op policy.ListOp) bool {
		hit := (list == "" || op.List == list) && (len(prefixes) == 0 || slices.Contains(prefixes, op.Prefix))
		if hit {
			removed = append(removed, op)
		}
		return hit
	})
	if _, _, err := fw.refreshOverlays(kept, "", nil); err != nil {
		return nil, err
	}
	return removed, fw.saveOps(kept)
}

// listUser is a hook whose policy uses a list.
type listUser struct {
	hook Hook
	gen  *generation
	info ListInfo
}

// bitUse is how list takes the membership mask (policy.ListUse) in the
// generations of its users (the newest of each hook using it) and in
// those a hook may go back to (an unconfirmed apply's previous one, whose
// overlay the rollback makes from the live changes): the other lists
// whose bit is its, sorted, in the first generation where some are; and
// whether it has no bit in one (a static way's list).
func (fw *Firewall) bitUse(list string, users []listUser) (others []string, static bool, err error) {
	check := func(g *generation) {
		if info, ok := g.Lists[list]; ok && info.Bit == 0 {
			static = true
		}
		if len(others) == 0 {
			others = g.sharing(list)
		}
	}
	for _, u := range users {
		check(u.gen)
	}
	err = fw.eachHook(func(h Hook, st *hookState) error {
		if st.pending == nil || st.pending.Previous == 0 {
			return nil
		}
		if g, err := fw.readGen(h, st.pending.Previous); err == nil && g != nil {
			check(g)
		}
		return nil
	})
	return others, static, err
}

// sharing are the other lists whose bit of the membership mask is list's
// (policy.ListUse), sorted.
func (g *generation) sharing(list string) []string {
	bits := make(map[string]uint64, len(g.Lists))
	for name, info := range g.Lists {
		bits[name] = info.Bit
	}
	return sharing(bits, list)
}

func sharing(bits map[string]uint64, list string) []string {
	bit, ok := bits[list]
	if !ok {
		return nil
	}
	var out []string
	for name, b := range bits {
		if name != list && b == bit {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// liveChangesFit refuses pol when it would not enforce an in-place change
// it carries over from the live changes: a change to a list without a bit,
// or a removal from a list whose bit other lists share.
func liveChangesFit(pol *policy.Policy) error {
	use := pol.ListUse()
	for name := range use.Static() {
		if l := pol.Lists[name]; l != nil && len(l.Ops) > 0 {
			return fmt.Errorf("%w; it holds %d in-place changes, which this policy would not enforce: revert them (rampart list revert %s) or put them in its file first", staticList(name), len(l.Ops), name)
		}
	}
	bits := use.Bits()
	for name := range bits {
		l := pol.Lists[name]
		if l == nil || !slices.ContainsFunc(l.Ops, func(op policy.ListOp) bool { return !op.Add }) {
			continue
		}
		if others := sharing(bits, name); len(others) > 0 {
			return removalShared(name, others)
		}
	}
	return nil
}

// staticList refuses an in-place change to a list without a bit of the
// membership mask: its addresses' classes say they are in it, and a
// class is every address of the class.
func staticList(list string) error {
	return fmt.Errorf("list %q %w: its policy names lists in more than %d ways, and only the lists of the first %d ways take a bit of the membership mask, which in-place changes set and clear (those of the lists that hold in-place changes or that CrowdSec feeds first, then in the order rules name them); change the list's file and apply, or name it in an earlier rule", list, ErrStaticList, policy.MaxLists, policy.MaxLists)
}

// ErrStaticList is what a change to a list without a bit is refused with.
var ErrStaticList = errors.New("takes no in-place changes")

// removalShared refuses an in-place removal from a list whose bit other
// lists share: clearing it would take the addresses out of them too.
func removalShared(list string, others []string) error {
	if len(others) > 3 {
		others = append(others[:3:3], fmt.Sprintf("%d more", len(others)-3))
	}
	return fmt.Errorf("list %q shares its bit of the membership mask with %s (a policy naming more than %d lists gives one bit to the lists that the same rules name), so an address cannot be removed from it in place: take it out of the list's file and apply (rampart list revert, or POST /v1/revert, undoes in-place changes)", list, strings.Join(others, ", "), policy.MaxLists)
}

// listUsers finds the hooks using a list, and every list in use.
func (fw *Firewall) listUsers(name string) ([]listUser, []string, error) {
	hooks, err := fw.hooks()
	if err != nil {
		return nil, nil, err
	}
	var users []listUser
	known := map[string]bool{}
	for _, h := range hooks {
		st, err := fw.state(h)
		if err != nil {
			return nil, nil, err
		}
		g, err := fw.readGen(h, fw.newest(h, st))
		if err != nil || g == nil {
			continue
		}
		for l := range g.Lists {
			known[l] = true
		}
		if info, ok := g.Lists[name]; ok {
			users = append(users, listUser{h, g, info})
		}
	}
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	return users, names, nil
}

// refreshOverlays rewrites the overlay of every hook (every hook using the
// list, when one is named) from ops, less what its generation folded into
// its tables. With added, the prefixes of ops just appended, only the
// entries those ops change are written: a ban costs what it changes, not
// what the overlay holds. It returns the hooks and the most changes an
// overlay of theirs holds that a fold would take.
func (fw *Firewall) refreshOverlays(ops []policy.ListOp, only string, added []netip.Prefix) (touched []Hook, most int, err error) {
	hooks, err := fw.hooks()
	if err != nil {
		return nil, 0, err
	}
	for _, h := range hooks {
		st, err := fw.state(h)
		if err != nil {
			return touched, most, err
		}
		n := fw.newest(h, st)
		g, err := fw.readGen(h, n)
		if err != nil || g == nil {
			continue
		}
		if _, ok := g.Lists[only]; only != "" && !ok {
			continue
		}
		objs, err := datapath.LoadPinned(fw.genPins(h, n))
		if err != nil {
			return touched, most, err
		}
		held := g.overlayOps(ops)
		foldable := 0
		for _, op := range held {
			if g.foldable(op) {
				foldable++
			}
		}
		most = max(most, foldable)
		if added != nil {
			v4, v6 := g.overlay(overlapping(held, added))
			err = objs.AddOverlay(v4, v6)
		} else {
			v4, v6 := g.overlay(held)
			err = objs.ReplaceOverlay(v4, v6)
		}
		objs.Close()
		if err != nil {
			return touched, most, fmt.Errorf("%s: %w", h, err)
		}
		touched = append(touched, h)
	}
	return touched, most, nil
}

// overlapping returns the ops whose prefixes contain or lie in one of the
// changed prefixes. An overlay entry of a changed prefix, or of one inside
// it, depends on those ops alone (the latest op of each list covering its
// prefix), and no other entry depends on the changed ones.
func overlapping(ops []policy.ListOp, changed []netip.Prefix) []policy.ListOp {
	// The holders that matter are of the lengths ops have: bans are
	// mostly of one length, and a hundred thousand of them would
	// otherwise make millions of holders.
	var lengths [129]bool
	for _, op := range ops {
		lengths[op.Prefix.Bits()] = true
	}
	in := map[netip.Prefix]bool{}    // the changed prefixes
	above := map[netip.Prefix]bool{} // and every prefix of those lengths holding one
	shortest := 128
	for _, p := range changed {
		p = p.Masked()
		in[p] = true
		shortest = min(shortest, p.Bits())
		for b := p.Bits(); b >= 0; b-- {
			if lengths[b] {
				above[netip.PrefixFrom(p.Addr(), b).Masked()] = true
			}
		}
	}
	var out []policy.ListOp
	for _, op := range ops {
		q := op.Prefix.Masked()
		hit := above[q]
		for b := q.Bits() - 1; b >= shortest && !hit; b-- {
			hit = in[netip.PrefixFrom(q.Addr(), b).Masked()]
		}
		if hit {
			out = append(out, op)
		}
	}
	return out
}

// dropUnusedOps forgets changes to lists no hook of the namespace uses any
// more: detaching the last user of a list ends its live changes.
func (fw *Firewall) dropUnusedOps() error {
	_, known, err := fw.listUsers("")
	if err != nil {
		return err
	}
	if len(known) == 0 {
		// No generation has a list, nor folded a change: the numbers
		// may start again, and detach leaves nothing.
		return errors.Join(fw.saveOps(nil), removeFile(fw.seqPath()))
	}
	ops, err := fw.readOps()
	if err != nil || len(ops) == 0 {
		return err
	}
	return fw.saveOps(slices.DeleteFunc(ops, func(op policy.ListOp) bool { return !slices.Contains(known, op.List) }))
}

// ExpireLists drops the changes past their TTL and refreshes the overlays
// when any went. It reports whether changes with a TTL remain.
func (fw *Firewall) ExpireLists() (bool, error) {
	unlock, err := fw.lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	return fw.expireLocked()
}

func (fw *Firewall) expireLocked() (bool, error) {
	all, err := fw.readOps()
	if err != nil {
		return false, err
	}
	live := unexpired(slices.Clone(all), time.Now())
	if len(live) != len(all) {
		if _, _, err := fw.refreshOverlays(live, "", nil); err != nil {
			return true, err
		}
		if err := fw.saveOps(live); err != nil {
			return true, err
		}
	}
	return slices.ContainsFunc(live, func(op policy.ListOp) bool { return !op.Expires.IsZero() }), nil
}

// The expirer is one process per namespace that undoes changes whose TTL is
// up. It holds expirerLock while it runs, and lets go of it before the
// firewall's lock when nothing is left to expire: a `list add` holding the
// firewall's lock either sees it alive (it will see the new change) or
// starts a new one.
func (fw *Firewall) expirerLock() string { return filepath.Join(fw.scopeState(), "list-expire.lock") }

func tryLock(path string) (*os.File, bool, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return f, true, nil
}

func (fw *Firewall) ensureExpirer() error {
	f, free, err := tryLock(fw.expirerLock())
	if err != nil || !free {
		return err
	}
	f.Close() // the new process takes it
	return fw.spawn("list-expire.log", "list-expire")
}

// RunExpiry expires list changes as their TTLs run out, until none with a
// TTL is left or ctx ends. One runs per namespace; a second returns at once.
func (fw *Firewall) RunExpiry(ctx context.Context, logf func(error)) error {
	return fw.expiry(ctx, logf, false)
}

// ServeExpiry is RunExpiry for the daemon: it holds the expiry until ctx
// ends, so that no separate process is started while it runs (it waits for
// one already running to finish).
func (fw *Firewall) ServeExpiry(ctx context.Context, logf func(error)) error {
	for ctx.Err() == nil {
		if err := fw.expiry(ctx, logf, true); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second): // another expirer held it
		}
	}
	return nil
}

func (fw *Firewall) expiry(ctx context.Context, logf func(error), forever bool) error {
	f, ok, err := tryLock(fw.expirerLock())
	if err != nil || !ok {
		return err
	}
	defer func() { f.Close(); os.Remove(fw.expirerLock()) }()
	for {
		unlock, err := fw.lock()
		if err != nil {
			return err
		}
		more, err := fw.expireLocked()
		if err != nil && logf != nil {
			logf(err)
		}
		if !more && !forever {
			unlock()
			return nil
		}
		unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}
