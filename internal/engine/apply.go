package engine

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/watchdog"
)

// ApplyRequest is one apply: a validated policy onto interfaces.
type ApplyRequest struct {
	Policy *policy.Policy
	// PolicyOf gives interfaces a policy of their own in place of Policy
	// (serve's FlowSpec routes, on the interfaces their section names).
	PolicyOf map[string]*policy.Policy
	Ifaces   []string
	Mode     datapath.Mode // "" is auto
	Egress   bool
	Force    bool // replace another program's XDP
	// Confirm leaves the apply pending: unless Confirm is called before the
	// deadline, the previous policies come back by themselves, even if this
	// process dies. Zero confirms before Apply returns.
	Confirm time.Duration
	// Fold, when set, says which lists' live changes to compile into the
	// tables (fold.go) instead of the overlay: the daemon folds them in
	// the background as they pile up.
	Fold func(list string) bool
	// RangesDone: the caller reads the policy's lists' ranges no more (a
	// one-shot apply), so the build may free them as it goes.
	RangesDone bool
}

// Applied is one hook an apply changed.
type Applied struct {
	Hook
	Mode       datapath.Mode `json:"mode"`
	Generation int           `json:"generation"`
	PolicyHash string        `json:"policy_hash"`
	Rules      int           `json:"rules"`
	// FileChanges: the generation is the tables of the one before under
	// the changes of the lists' files, in this many prefixes of its
	// overlay (listchange.go); 0 for a compiled one.
	FileChanges int    `json:"file_changes,omitempty"`
	Note        string `json:"note,omitempty"` // why auto did not get XDP
}

// ApplyResult says what an apply did.
type ApplyResult struct {
	Applied         []Applied
	ConfirmDeadline time.Time // zero unless the request asked for confirmation
	// LiveChanges are the in-place changes (rampart list add|del) to the
	// policy's lists that still hold: they override the list files.
	LiveChanges []policy.ListOp
	// Recovered says what earlier commands left and this one undid.
	Recovered []string
	// Warnings are what the policy does not cover: tunnel devices no hook
	// filters.
	Warnings []string
}

// transactionWindow: an apply without Confirm confirms before it returns;
// its journal's deadline is only a backstop.
const transactionWindow = 2 * time.Minute

// crashPoint, when set (by tests), runs at the points of a transaction where
// a crash hurts: "pinned", "journaled", "swapped".
var crashPoint func(where string)

// firstRule is the policy's first rule with the action, or nil.
func firstRule(pol *policy.Policy, a policy.Action) *policy.Rule {
	for i := range pol.Rules {
		if pol.Rules[i].Action == a {
			return &pol.Rules[i]
		}
	}
	return nil
}

func reach(where string) {
	if crashPoint != nil {
		crashPoint(where)
	}
}

// Apply compiles the policies and swaps them onto every hook, all or nothing:
// when one hook fails, the hooks already changed go back.
func (fw *Firewall) Apply(req ApplyRequest) (*ApplyResult, error) {
	if len(req.Ifaces) == 0 {
		return nil, errors.New("no interface to apply to")
	}
	mode := req.Mode
	if mode == "" {
		mode = datapath.ModeAuto
	}
	if req.Egress && (mode == datapath.ModeXDPNative || mode == datapath.ModeXDPGeneric) {
		return nil, fmt.Errorf("mode %s with egress: XDP sees only incoming packets; egress uses tc", mode)
	}
	if req.Confirm < 0 {
		return nil, errors.New("the confirmation window must be positive")
	}
	if err := datapath.Require(datapath.FeaturesFilter...); err != nil {
		return nil, err
	}
	// Each distinct policy is compiled and loaded once, for the hooks it
	// goes on.
	var pols []*policy.Policy
	polOf := map[string]int{}
	for _, ifc := range req.Ifaces {
		pol := req.Policy
		if p := req.PolicyOf[ifc]; p != nil {
			pol = p
		}
		i := slices.Index(pols, pol)
		if i < 0 {
			i, pols = len(pols), append(pols, pol)
		}
		polOf[ifc] = i
	}
	for _, pol := range pols {
		if err := checkSyncookie(pol, req.Egress); err != nil {
			return nil, err
		}
	}
	var hooks []Hook
	named := map[int]string{} // by index: one interface under two names (altnames) is one hook
	for _, ifc := range req.Ifaces {
		idx, err := datapath.Ifindex(fw.netns, ifc)
		if err != nil {
			return nil, err
		}
		if idx == 0 {
			return nil, fmt.Errorf("--iface %s: no such interface%s (list them with: ip link)", ifc, fw.inNetns())
		}
		if first, ok := named[idx]; ok {
			if first == ifc {
				return nil, fmt.Errorf("--iface %s is given twice: name each interface once", ifc)
			}
			return nil, fmt.Errorf("--iface %s and --iface %s are one interface (index %d): name it once", first, ifc, idx)
		}
		named[idx] = ifc
		hooks = append(hooks, Hook{Iface: ifc, Egress: req.Egress})
	}
	if err := datapath.EnsureBPFFS(fw.pinRoot); err != nil {
		return nil, err
	}
	unlock, err := fw.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	res := &ApplyResult{}
	if res.Recovered, err = fw.recoverLocked(time.Now()); err != nil {
		return nil, fmt.Errorf("finish what an earlier command left: %w (nothing was changed)", err)
	}

	// In-place list changes still live carry over into the new tables,
	// once into a list the policies share.
	ops, err := fw.liveOps()
	if err != nil {
		return nil, err
	}
	for _, op := range ops {
		var took []*policy.List
		for _, pol := range pols {
			if l := pol.Lists[op.List]; l != nil && !l.Inline.IsValid() && !slices.Contains(took, l) {
				l.Ops = append(l.Ops, op)
				took = append(took, l)
			}
		}
		if len(took) > 0 {
			res.LiveChanges = append(res.LiveChanges, op)
		}
	}
	folded := foldOps(ops, pols, req.Fold)
	for _, pol := range pols {
		if err := liveChangesFit(pol); err != nil {
			return nil, fmt.Errorf("apply %s: %w", pol.File, err)
		}
	}
	// Every hook's state is read before the first swap: a new generation
	// of a program several hooks run is live on all of them once the
	// first swaps, and the others' generations no longer look live.
	states := make([]*hookState, len(hooks))
	for i, h := range hooks {
		if states[i], err = fw.state(h); err != nil {
			return nil, err
		}
	}
	olds := fw.readAhead(hooks, states)
	// The flood key is read (from the live generation's record) only for
	// a new program: a new generation keeps its program's.
	var key [2]uint64
	keyOf := func() ([2]uint64, error) {
		var err error
		if key == ([2]uint64{}) {
			key, err = fw.floodKey(hooks)
		}
		return key, err
	}
	loaded := make([]struct {
		objs *datapath.Objects
		meta generation
	}, len(pols))
	var kernelBytes uint64
	for i, pol := range pols {
		on := hooksOf(hooks, polOf, i)
		shape := fw.sharedShape(on)
		if carries(pol) { // else no generation kept its lists' contents
			lives := peekLive(hooks, polOf, i, states, olds)
			if objs, meta, ok := fw.overLists(pol, on, lives, shape, ops, req.Fold); ok {
				shape.Close()
				defer objs.Close()
				loaded[i].objs, loaded[i].meta = objs, meta
				continue
			}
		}
		// The maps of a new generation of the hooks' programs are made
		// while the policy compiles, in case it fits their shape.
		spare := datapath.MakeSpare(shape)
		build := compile.Build
		// Unless another policy shares the lists, or the generation keeps
		// their contents (bases) to carry later changes.
		if req.RangesDone && len(pols) == 1 && !carries(pol) {
			build = compile.BuildReleasingRanges
		}
		img := build(pol)
		kernelBytes += img.KernelBytes()
		if err := datapath.CheckCap(kernelBytes, fw.maxTableBytes); err != nil {
			spare.Close()
			shape.Close()
			return nil, fmt.Errorf("apply %s: %w", pol.File, err)
		}
		// Hashing the image reads all its tables (hundreds of MB for lists
		// of millions): it overlaps the kernel's loading of them.
		hash := make(chan string, 1)
		go func() { hash <- img.Hash() }()
		objs, fresh, err := fw.load(shape, spare, img, keyOf)
		if err != nil {
			<-hash
			return nil, fmt.Errorf("apply %s: %w", pol.File, err)
		}
		defer objs.Close()
		loaded[i].objs, loaded[i].meta = objs, describe(pol, img, <-hash)
		loaded[i].meta.FoldedSeq, loaded[i].meta.Folded = folded.of(img)
		if fresh { // else a new generation of a program: install takes its last one's key
			loaded[i].meta.FloodKey = key
		}
	}
	tx := &transaction{fw: fw, bases: map[string]string{}, token: watchdog.NewToken(), watched: req.Confirm > 0, deadline: time.Now().Add(transactionWindow)}
	if req.Confirm > 0 {
		tx.deadline = time.Now().Add(req.Confirm)
		res.ConfirmDeadline = tx.deadline.UTC()
	}
	for i, h := range hooks {
		l := loaded[polOf[h.Iface]]
		a, err := tx.install(h, states[i], <-olds[i], l.objs, l.meta, mode, req.Force)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%s: %w", h, err), tx.rollback())
		}
		res.Applied = append(res.Applied, a)
	}
	if !req.Egress {
		res.Warnings, _ = fw.UnfilteredTunnels() // a warning that cannot be read is no reason to fail
	}
	if found, err := fw.Unpinned(); err == nil {
		for _, k := range found {
			if slices.ContainsFunc(hooks, func(h Hook) bool { return h.Iface == k.Iface }) {
				res.Warnings = append(res.Warnings, fmt.Sprintf("%s also runs a rampart program no pin accounts for (%s), beside this policy: remove it with %s", k.Iface, k.KernelHook, k.Fix))
			}
		}
	}
	if req.Confirm > 0 {
		if err := fw.spawn("rollback.log", append([]string{"rollback-watchdog"}, watchdog.Args(tx.token, tx.deadline)...)...); err != nil {
			return nil, errors.Join(fmt.Errorf("start the rollback watchdog: %w", err), tx.rollback())
		}
		return res, nil
	}
	if err := tx.commit(); err != nil {
		return res, fmt.Errorf("the new policy is live, but cleaning up after it failed: %w", err)
	}
	return res, nil
}

// hooksOf are the hooks that get policy i.
func hooksOf(hooks []Hook, polOf map[string]int, i int) []Hook {
	var out []Hook
	for _, h := range hooks {
		if polOf[h.Iface] == i {
			out = append(out, h)
		}
	}
	return out
}

// load makes img a new generation of shape, the programs the hooks run
// (sharedShape; nil for none), with what it can take of spare, when img
// fits their shape: no program is loaded or verified. Otherwise it loads
// new ones (fresh). It closes shape and spare.
func (fw *Firewall) load(shape *datapath.Objects, spare *datapath.Spare, img *compile.Image, key func() ([2]uint64, error)) (o *datapath.Objects, fresh bool, err error) {
	if shape != nil {
		o, fits, err := datapath.LoadOver(shape, img, spare)
		spare.Close()
		shape.Close()
		if err != nil || fits {
			return o, false, err
		}
	}
	k, err := key()
	if err != nil {
		return nil, false, err
	}
	o, err = datapath.LoadKeyed(img, k)
	return o, true, err
}

// sharedShape opens the live generation of hooks when every one of them
// runs its programs and no other hook has them, live or pinned (reattach
// would make an older generation of theirs live again); nil otherwise.
func (fw *Firewall) sharedShape(hooks []Hook) *datapath.Objects {
	all, err := fw.hooks()
	if err != nil || len(hooks) == 0 {
		return nil
	}
	st, err := fw.state(hooks[0])
	if err != nil || st.live == 0 {
		return nil
	}
	dir := fw.genPins(hooks[0], st.live)
	progs := datapath.PinnedPrograms(dir)
	for _, h := range all {
		st, err := fw.state(h)
		if err != nil {
			return nil
		}
		if slices.Contains(hooks, h) {
			if !st.link.Pinned || !slices.Contains(progs, st.link.Program) {
				return nil
			}
			continue
		}
		for _, n := range st.gens {
			if slices.ContainsFunc(datapath.PinnedPrograms(fw.genPins(h, n)), func(id ebpf.ProgramID) bool { return slices.Contains(progs, id) }) {
				return nil
			}
		}
	}
	for _, h := range hooks {
		if !slices.Contains(all, h) {
			return nil // a hook that runs nothing yet
		}
	}
	shape, err := datapath.LoadPinned(dir)
	if err != nil {
		return nil
	}
	return shape
}

// checkSyncookie refuses a syncookie rule the hooks cannot serve.
func checkSyncookie(pol *policy.Policy, egress bool) error {
	r := firstRule(pol, policy.Syncookie)
	if r == nil {
		return nil
	}
	if egress {
		return fmt.Errorf("%s:%d: rule %q: syncookie answers incoming SYNs; apply it without --egress", pol.File, r.Line, r.Name)
	}
	if err := datapath.Require(datapath.FeatureTCPReqsk); err != nil {
		return fmt.Errorf("%s:%d: rule %q: %w", pol.File, r.Line, r.Name, err)
	}
	return nil
}

// floodKey is the key the newest generation of the first of hooks that
// has one was loaded under, else a new one: cookies a program sent stay
// valid under the program that replaces it.
func (fw *Firewall) floodKey(hooks []Hook) ([2]uint64, error) {
	for _, h := range hooks {
		st, err := fw.state(h)
		if err != nil {
			return [2]uint64{}, err
		}
		if g, err := fw.readGen(h, fw.newest(h, st)); err == nil && g != nil && g.FloodKey != [2]uint64{} {
			return g.FloodKey, nil
		}
	}
	return datapath.NewFloodKey()
}

func (fw *Firewall) inNetns() string {
	if fw.netns == "" {
		return ""
	}
	return " in network namespace " + fw.netns
}

// describe is the description every hook's new generation starts from;
// hash is img's.
func describe(pol *policy.Policy, img *compile.Image, hash string) generation {
	file, err := filepath.Abs(pol.File)
	if err != nil {
		file = pol.File
	}
	g := generation{PolicyFile: file, PolicyHash: hash, Default: pol.Default.String(),
		Unparsed: pol.Unparsed.String(), Malformed: pol.MalformedAction().String(), Lists: map[string]ListInfo{}}
	keys := policy.MatchKeys(pol.Rules)
	for i, r := range pol.Rules {
		g.Rules = append(g.Rules, RuleInfo{Name: r.Name, Match: matchDigest(keys[i]), Action: r.Action.String()})
	}
	for name, bit := range img.Lists {
		if l := pol.Lists[name]; !l.Inline.IsValid() { // a rule's prefix is no list to change live
			g.Lists[name] = ListInfo{Bit: bit, Family: l.Family}
		}
	}
	g.keepContents(pol, hash)
	return g
}

// transaction is one apply across hooks.
type transaction struct {
	fw       *Firewall
	bases    map[string]string // the lists' bases written, by digest (keepBases)
	token    string
	watched  bool
	deadline time.Time
	done     []step
}

// readAhead reads the record of each hook's live generation on a
// goroutine while the policies compile: a 10,000-rule policy's is 1.3 MB
// of JSON, 30 ms to decode. Hook i's comes on the i-th channel, nil when
// it has none or it is unreadable: an unreadable record carries nothing
// over, and the new one is written whole, which is how status says to
// mend it.
func (fw *Firewall) readAhead(hooks []Hook, states []*hookState) []chan *generation {
	out := make([]chan *generation, len(hooks))
	for i, h := range hooks {
		out[i] = make(chan *generation, 1)
		go func() {
			g, _ := fw.readGen(h, states[i].live)
			out[i] <- g
		}()
	}
	return out
}

// step is one hook the transaction changed, and how to put it back.
type step struct {
	hook     Hook
	gen      int      // the generation installed
	wasLive  int      // the generation it replaced (0: none)
	wasOwned *pending // the journal it replaced (an earlier apply still pending)
}

// install pins objs as the hook's next generation, describes it, journals
// the intent, and swaps the hook to it; st is the hook's state before the
// transaction, old its live generation's record (nil: none).
func (tx *transaction) install(h Hook, st *hookState, old *generation, objs *datapath.Objects, meta generation, want datapath.Mode, force bool) (Applied, error) {
	fw := tx.fw
	g := meta
	g.N = 1
	if len(st.gens) > 0 {
		g.N = st.gens[len(st.gens)-1] + 1
	}
	g.AppliedAt = time.Now().UTC()
	var from []int
	if old != nil {
		from = carryIndex(old.Rules, g.Rules)
	}
	g.Carried, g.CarriedEvents = fw.carry(h, old, g.Rules, from)
	if old != nil {
		g.Mode = old.Mode
		if g.FloodKey == ([2]uint64{}) { // a new generation of old's program
			g.FloodKey = old.FloodKey
		}
	}
	if err := os.MkdirAll(fw.pinDir(h), 0o700); err != nil {
		return Applied{}, needRoot(err)
	}
	fresh := len(st.gens) == 0 && !st.link.Pinned
	drop := func(err error) error {
		if fresh { // the hook had nothing: leave nothing
			return errors.Join(err, fw.removeHook(h))
		}
		return errors.Join(err, fw.removeGen(h, g.N))
	}
	if err := objs.Pin(fw.genPins(h, g.N)); err != nil {
		return Applied{}, drop(err)
	}
	reach("pinned")
	// What must be written is written before the swap: a full disk fails
	// here, with the running policy untouched.
	if err := fw.writeGen(h, &g); err != nil {
		return Applied{}, drop(err)
	}
	p := pending{Token: tx.token, Deadline: tx.deadline, Watched: tx.watched, PID: os.Getpid(), Previous: st.live, Next: g.N}
	if st.pending != nil {
		// Still unconfirmed: going back returns to the last confirmed
		// generation, not to the one in between.
		p.Previous = st.pending.Previous
	}
	if err := writeJSON(fw.pendingFile(h), p); err != nil {
		return Applied{}, drop(err)
	}
	reach("journaled")
	undo := func(err error) error {
		if fresh {
			return drop(err)
		}
		return errors.Join(err, fw.restorePending(h, st.pending), fw.removeGen(h, g.N))
	}

	var current datapath.Mode
	if st.live != 0 && old != nil {
		current = old.Mode
	}
	mode, note, err := datapath.Swap(fw.attachment(h), current, objs, want, force, g.syncookie())
	if err != nil {
		return Applied{}, undo(err)
	}
	tx.done = append(tx.done, step{hook: h, gen: g.N, wasLive: st.live, wasOwned: st.pending})
	reach("swapped")
	// The old generation counted until the swap: carry its final counts.
	g.Mode = mode
	g.Carried, g.CarriedEvents = fw.carry(h, old, g.Rules, from)
	fw.keepBases(h, old, &g, tx.bases)
	if err := fw.writeGen(h, &g); err != nil {
		// The bases may have taken the room the record needs: they are
		// only worth a faster next change.
		if fw.dropBases(h, &g) != nil || fw.writeGen(h, &g) != nil {
			return Applied{}, err
		}
	}
	return Applied{Hook: h, Mode: mode, Generation: g.N, PolicyHash: g.PolicyHash, Rules: len(g.Rules), FileChanges: len(g.FileOps), Note: note}, nil
}

// restorePending puts back the journal an install replaced (nil: none).
func (fw *Firewall) restorePending(h Hook, p *pending) error {
	if p == nil {
		return removeFile(fw.pendingFile(h))
	}
	return writeJSON(fw.pendingFile(h), p)
}

// rollback puts every hook the transaction changed back as it was, last
// first, and reports every error.
func (tx *transaction) rollback() error {
	var errs []error
	for i := len(tx.done) - 1; i >= 0; i-- {
		s := tx.done[i]
		err := tx.fw.swapBack(s.hook, s.gen, s.wasLive)
		errs = append(errs, err, tx.fw.restorePending(s.hook, s.wasOwned))
		if err == nil {
			errs = append(errs, tx.fw.removeGen(s.hook, s.gen))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("putting back the hooks already changed: %w", err)
	}
	return nil
}

// commit makes the transaction's generations the only ones.
func (tx *transaction) commit() error {
	var errs []error
	for _, s := range tx.done {
		errs = append(errs, tx.fw.keepOnly(s.hook, s.gen), removeFile(tx.fw.pendingFile(s.hook)))
	}
	return errors.Join(errs...)
}

// keepOnly removes every generation of the hook but keep.
func (fw *Firewall) keepOnly(h Hook, keep int) error {
	gens, err := fw.generations(h)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range gens {
		if n != keep {
			errs = append(errs, fw.removeGen(h, n))
		}
	}
	return errors.Join(errs...)
}

// swapBack makes the hook run generation to again (0: removes the hook)
// instead of generation from, carrying what from counted into to's
// counters.
func (fw *Firewall) swapBack(h Hook, from, to int) error {
	if to == 0 {
		return fw.removeHook(h)
	}
	back, err := fw.readGen(h, to)
	if err != nil || back == nil {
		return fmt.Errorf("%s: generation %d is not described, cannot go back to it: %v", h, to, err)
	}
	objs, err := datapath.LoadPinned(fw.genPins(h, to))
	if err != nil {
		return fmt.Errorf("%s: generation %d is gone, cannot go back to it: %w", h, to, err)
	}
	defer objs.Close()
	// The live changes made since it was live reach its overlay (those it
	// folded that were reverted since are owed a fold: FoldOwed).
	ops, err := fw.liveOps()
	if err != nil {
		return err
	}
	if err := objs.ReplaceOverlay(back.overlay(back.overlayOps(ops))); err != nil {
		return fmt.Errorf("%s: the live list changes into generation %d: %w", h, to, err)
	}
	var current datapath.Mode
	if g, err := fw.readGen(h, from); err == nil && g != nil {
		current = g.Mode
		// What the undone generation counted stays counted.
		if live, events, err := fw.liveCounts(h, g); err == nil {
			addCounts(back, carryIndex(g.Rules, back.Rules), live, events)
		}
	}
	mode, _, err := datapath.Swap(fw.attachment(h), current, objs, back.Mode, true, back.syncookie())
	if err != nil {
		return fmt.Errorf("%s: go back to generation %d: %w", h, to, err)
	}
	back.Mode = mode
	return fw.writeGen(h, back)
}

// removeHook detaches a hook and removes its pins and state.
func (fw *Firewall) removeHook(h Hook) error {
	err := errors.Join(datapath.Unlink(fw.attachment(h)), removeAll(fw.pinDir(h)), removeAll(fw.stateDir(h)))
	removeEmptyDirs(filepath.Dir(fw.pinDir(h)), fw.pinRoot)
	removeEmptyDirs(filepath.Dir(fw.stateDir(h)), fw.stateRoot)
	return err
}

// carry is the counts (and limit and cookie events) a new generation with
// rules starts from: the old generation's carried counts plus what it
// counted itself, for the fixed slots and for every rule whose name and
// match stay (from: carryIndex(old.Rules, rules)).
func (fw *Firewall) carry(h Hook, old *generation, rules []RuleInfo, from []int) ([]abi.Counter, []abi.RuleEvents) {
	g := &generation{Rules: rules, Carried: make([]abi.Counter, abi.SlotRule0+len(rules)), CarriedEvents: make([]abi.RuleEvents, len(rules))}
	if old == nil {
		return g.Carried, g.CarriedEvents
	}
	addCounts(g, from, old.Carried, old.CarriedEvents)
	if live, events, err := fw.liveCounts(h, old); err == nil {
		addCounts(g, from, live, events)
	}
	return g.Carried, g.CarriedEvents
}

// carryIndex is, for each of rules, the index in old of the first rule
// with its name and match, or -1: whose counts it carries on.
func carryIndex(old, rules []RuleInfo) []int {
	type key struct{ name, match string }
	keyOf := func(r RuleInfo) key {
		if strings.Contains(r.Match, "=") { // a match key, from an earlier release's record
			return key{r.Name, matchDigest(r.Match)}
		}
		return key{r.Name, r.Match}
	}
	was := make(map[key]int, len(old)) // a map, not a search: policies hold 100,000 rules
	for j, o := range old {
		k := keyOf(o)
		if _, dup := was[k]; !dup {
			was[k] = j
		}
	}
	from := make([]int, len(rules))
	for i, r := range rules {
		j, ok := was[keyOf(r)]
		if !ok {
			j = -1
		}
		from[i] = j
	}
	return from
}

// matchDigest is what a record keeps of a rule's match key: 64 bits of
// FNV-1a, as 16 hex digits. The keys themselves (up to hundreds of bytes
// each, with their lists' names) were most of a 10,000-rule policy's
// record, which an apply reads once and writes twice. Equal digests under
// one rule name stand for one match: a collision would only carry a
// rule's counts over to another of the same name.
func matchDigest(key string) string {
	h := fnv.New64a()
	h.Write([]byte(key))
	return fmt.Sprintf("%016x", h.Sum64())
}

// addCounts adds counts (by slot: the fixed ones, then the old rules') and
// events (by old rule) into to's carried ones; from maps to's rules to the
// old ones (carryIndex).
func addCounts(to *generation, from []int, counts []abi.Counter, events []abi.RuleEvents) {
	if len(to.Carried) < abi.SlotRule0+len(to.Rules) {
		to.Carried = append(to.Carried, make([]abi.Counter, abi.SlotRule0+len(to.Rules)-len(to.Carried))...)
	}
	if len(to.CarriedEvents) < len(to.Rules) {
		to.CarriedEvents = append(to.CarriedEvents, make([]abi.RuleEvents, len(to.Rules)-len(to.CarriedEvents))...)
	}
	add := func(dst, src int) {
		if src < len(counts) {
			to.Carried[dst].Packets += counts[src].Packets
			to.Carried[dst].Bytes += counts[src].Bytes
		}
	}
	for slot := 0; slot < abi.SlotRule0; slot++ {
		add(slot, slot)
	}
	for i, j := range from {
		if j >= 0 {
			add(abi.SlotRule0+i, abi.SlotRule0+j)
			if j < len(events) {
				to.CarriedEvents[i] = addEvents(to.CarriedEvents[i], events[j])
			}
		}
	}
}

func addEvents(a, b abi.RuleEvents) abi.RuleEvents {
	a.Over += b.Over
	a.CookiesSent += b.CookiesSent
	a.CookiesOk += b.CookiesOk
	a.CookiesBad += b.CookiesBad
	return a
}

// liveCounts reads what a generation's own counters counted, and its
// rules' events.
func (fw *Firewall) liveCounts(h Hook, g *generation) ([]abi.Counter, []abi.RuleEvents, error) {
	objs, err := datapath.LoadPinned(fw.genPins(h, g.N))
	if err != nil {
		return nil, nil, err
	}
	defer objs.Close()
	counts, err := objs.ReadCounters(abi.SlotRule0 + len(g.Rules))
	if err != nil || !slices.ContainsFunc(g.Rules, RuleInfo.hasEvents) {
		return counts, nil, err // no rule of g counts events: they are all zero
	}
	events, err := objs.ReadEvents(len(g.Rules))
	return counts, events, err
}

// hasEvents: the rule's action counts events (limit: over its rate;
// syncookie: cookies sent, taken and refused).
func (r RuleInfo) hasEvents() bool {
	return r.Action == policy.Limit.String() || r.Action == policy.Syncookie.String()
}
