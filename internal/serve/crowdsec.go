package serve

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/fleet/crowdsec"
	"github.com/rampart-fw/rampart/internal/policy"
)

// foldAt is how many decisions may wait in the live overlay before the
// list is compiled again with them: the overlay costs a probe per prefix
// length whatever its size, but each change rewrites its journal.
const foldAt = 50_000

// feed follows a CrowdSec Local API's decision stream into the lists the
// policy's crowdsec section names. New decisions reach the kernel as live
// list changes (milliseconds); a decision that goes (deleted, expired)
// owes a rebuild of the lists from the set within an interval, since
// another decision may still hold its address. The set is saved after each change, so a restarted service
// applies it before it asks the LAPI anything: enforcement never lapses.
type feed struct {
	mu          sync.Mutex
	cfg         *policy.CrowdSec // as last applied; nil: the policy has none
	set         *crowdsec.Set
	loaded      bool // the saved set was read
	resync      bool // ask for the whole set at the next poll
	overlay     int  // decisions pushed as live changes since the list was built
	dirty       bool // a rebuild of the lists is owed
	lastRebuild time.Time
	wake        chan struct{}

	polls    map[string]uint64 // by result: ok, error
	errs     map[string]uint64 // by reason
	refused  map[string]uint64 // decisions refused, by reason
	deltas   uint64            // answers that changed the set
	lastSync time.Time
	lastFull time.Time   // the last startup answer applied
	split    originSplit // of the policy applied last
	pending  originSplit // of the policy being applied
	applied  prometheus.Histogram
}

func newFeed() *feed {
	return &feed{wake: make(chan struct{}, 1), polls: map[string]uint64{}, errs: map[string]uint64{}, refused: map[string]uint64{},
		applied: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rampart_crowdsec_apply_seconds",
			Help:    "From a decision stream answer's arrival to its decisions enforced in the kernel.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}})}
}

// The set is saved in the namespace's state (for a restarted service, and
// for rampart apply) and under --persist (for a reboot).
const decisionsFile = "crowdsec-decisions"

func (d *Daemon) decisionsPaths() []string {
	paths := []string{filepath.Join(d.fw.StateDir(), decisionsFile)}
	if d.opt.PersistDir != "" {
		paths = append(paths, filepath.Join(d.opt.PersistDir, decisionsFile))
	}
	return paths
}

// loadDecisions reads the first saved set there is.
func loadDecisions(set *crowdsec.Set, paths []string) (string, error) {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p, set.Load(p, time.Now())
		}
	}
	return "", nil
}

// SavedDecisions fills the CrowdSec list of a policy applied by hand
// (rampart apply) with the decisions the service saved last, so that the
// apply does not lift the bans the service enforces. It returns how many.
func SavedDecisions(fw *engine.Firewall, pol *policy.Policy) (int, error) {
	c := pol.CrowdSec
	if c == nil {
		return 0, nil
	}
	set := crowdsec.NewSet(func(dec crowdsec.Decision) bool { return c.Enforces(dec.Type) })
	if _, err := loadDecisions(set, []string{filepath.Join(fw.StateDir(), decisionsFile)}); err != nil {
		return 0, err
	}
	// Split as the service splits it, so the rules keep their counters.
	if split, ok := splitByOrigin(pol, c.List, set.ByOrigin()); !ok || len(split.lists) == 0 {
		pol.Lists[c.List] = policy.NewList(c.List, set.Prefixes())
	}
	return set.Len(), nil
}

// crowdsecList fills the policy's CrowdSec list from the set, under d.mu.
// A first policy with the section reads the saved set; a changed section
// asks the LAPI for everything again.
func (d *Daemon) crowdsecList(pol *policy.Policy) {
	f := d.cs
	f.mu.Lock()
	c := pol.CrowdSec
	if c == nil {
		f.cfg = nil
		f.mu.Unlock()
		return
	}
	if f.cfg == nil || !sameSource(f.cfg, c) {
		f.resync = true
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
	f.cfg = c
	if f.set == nil {
		f.set = crowdsec.NewSet(nil)
	}
	f.set.SetEnforce(func(dec crowdsec.Decision) bool { return c.Enforces(dec.Type) })
	if !f.loaded {
		f.loaded = true
		if from, err := loadDecisions(f.set, d.decisionsPaths()); err != nil {
			d.log.Error("crowdsec: the saved decisions cannot be read; the LAPI's answer will fill the list", "err", err)
		} else if n := f.set.Len(); n > 0 {
			d.log.Info("crowdsec: saved decisions restored", "decisions", n, "from", from)
		}
	}
	set := f.set
	f.mu.Unlock()
	byOrigin := set.ByOrigin()
	split, ok := splitByOrigin(pol, c.List, byOrigin)
	if !ok || len(byOrigin) == 0 {
		if !ok {
			d.log.Warn("crowdsec: a list per origin would pass the policy's limits; the decisions are one list, counted together", "origins", len(byOrigin))
		}
		var all []netip.Prefix
		for _, ps := range byOrigin {
			all = append(all, ps...)
		}
		pol.Lists[c.List] = policy.NewList(c.List, all)
	}
	f.mu.Lock()
	f.pending = split
	f.mu.Unlock()
}

// originSplit is how a policy's rules over the CrowdSec list were split:
// one list and one rule per origin, so that the kernel counts what each
// origin's decisions drop.
type originSplit struct {
	byOrigin bool              // false: the decisions are one list
	lists    map[string]string // origin → its list
	rules    map[string]string // rule name → the origin whose list it matches
}

// splitByOrigin gives each origin of the decisions a list (LIST/ORIGIN)
// and each rule naming LIST one copy per origin (RULE/ORIGIN) in its place:
// the same verdicts in the same order, since the copies differ only in
// which decisions they match. The names hold a '/', which no name a policy
// file gives may hold. It leaves pol alone and says false when the copies
// would pass the limits of a policy.
func splitByOrigin(pol *policy.Policy, list string, byOrigin map[string][]netip.Prefix) (originSplit, bool) {
	split := originSplit{byOrigin: true, lists: map[string]string{}, rules: map[string]string{}}
	if len(byOrigin) == 0 {
		return split, true
	}
	origins := make([]string, 0, len(byOrigin))
	for o := range byOrigin {
		origins = append(origins, o)
	}
	slices.Sort(origins)
	var rules []policy.Rule
	entries, use := 0, policy.NewListUse()
	for _, r := range pol.Rules {
		uses := slices.Contains(r.Src, list) || slices.Contains(r.Dst, list)
		copies := []string{""}
		if uses {
			copies = origins
		}
		for _, o := range copies {
			c := r
			if o != "" {
				c.Name = r.Name + "/" + o
				c.Src = swap(r.Src, list, list+"/"+o)
				c.Dst = swap(r.Dst, list, list+"/"+o)
				split.rules[c.Name] = o
			}
			use.Add(&c, pol.Lists)
			entries += c.Entries(pol.Lists)
			rules = append(rules, c)
		}
	}
	if entries > policy.MaxRules || use.Ways() > policy.MaxLists { // every origin's list takes live changes: a bit each
		return originSplit{}, false
	}
	for _, o := range origins {
		name := list + "/" + o
		pol.Lists[name] = policy.NewList(name, byOrigin[o])
		split.lists[o] = name
	}
	pol.Rules = rules
	return split, true
}

func swap(names []string, from, to string) []string {
	out := slices.Clone(names)
	for i, n := range out {
		if n == from {
			out[i] = to
		}
	}
	return out
}

func sameSource(a, b *policy.CrowdSec) bool {
	return a.URL == b.URL && a.APIKey == b.APIKey && a.List == b.List && slices.Equal(a.Scopes, b.Scopes) &&
		slices.Equal(a.Origins, b.Origins) && slices.Equal(a.Types, b.Types)
}

// afterReload drops the live changes the rebuilt list now holds.
func (d *Daemon) afterReload(pol *policy.Policy) {
	f := d.cs
	f.mu.Lock()
	old, split := f.split, f.pending
	f.split = split
	f.mu.Unlock()
	if pol.CrowdSec == nil {
		return
	}
	lists := []string{pol.CrowdSec.List}
	for _, s := range []originSplit{old, split} {
		for _, l := range s.lists {
			lists = append(lists, l)
		}
	}
	slices.Sort(lists)
	for _, l := range slices.Compact(lists) {
		if _, err := d.fw.RevertList(l, nil); err != nil {
			d.log.Error("crowdsec: drop the live changes the list now holds", "list", l, "err", err)
			return
		}
	}
	f.mu.Lock()
	f.overlay, f.dirty, f.lastRebuild = 0, false, time.Now()
	f.mu.Unlock()
}

// ownsList says whether a list is the CrowdSec feed's (its own, or one of
// its origins').
func (f *feed) ownsList(list string) bool { return f.cfg.Feeds(list) }

// followCrowdSec polls the LAPI while the policy has a crowdsec section,
// and expires decisions on their own time.
func (d *Daemon) followCrowdSec(ctx context.Context) {
	f := d.cs
	var backoff time.Duration
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	wait := func(dur time.Duration) bool {
		t := time.NewTimer(dur)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return false
			case <-f.wake:
				return true
			case <-t.C:
				return true
			case <-tick.C:
				d.expireDecisions()
			}
		}
	}
	for {
		f.mu.Lock()
		// The whole set again now and then: a delta is what was created
		// since the last poll by the LAPI's clock, and a decision that a
		// long transaction (a large cscli import) committed after a poll
		// but dated before it is in no delta.
		c := f.cfg
		startup := f.resync || f.lastFull.IsZero() || c != nil && time.Since(f.lastFull) >= c.Resync
		f.mu.Unlock()
		if c == nil {
			if !wait(time.Hour) {
				return
			}
			continue
		}
		client := &crowdsec.Client{URL: c.URL, Key: c.APIKey, Scopes: c.Scopes, Origins: c.Origins,
			HTTP: &http.Client{Timeout: 2 * time.Minute}}
		a, err := client.Stream(ctx, startup)
		if ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		if err != nil {
			f.polls["error"]++
			var ce *crowdsec.Error
			reason := "connect"
			if errors.As(err, &ce) {
				reason = ce.Reason
			}
			f.errs[reason]++
			f.resync = true // after an outage, ask for the whole set again
			backoff = min(max(2*backoff, time.Second), max(c.Interval, time.Minute))
			f.mu.Unlock()
			d.log.Error("crowdsec: poll failed; the decisions enforced stay", "err", err, "retry_in", backoff.String())
			if !wait(backoff) {
				return
			}
			continue
		}
		backoff = 0
		f.polls["ok"]++
		for r, n := range a.Refused {
			f.refused[r] += uint64(n)
		}
		f.mu.Unlock()
		for r, n := range a.Refused {
			d.log.Warn("crowdsec: decisions refused", "reason", r, "count", n)
		}
		d.applyDecisions(c, a, startup)
		if !wait(c.Interval) {
			return
		}
	}
}

// applyDecisions enforces an answer. A delta's new decisions become live
// changes at once; what it removes is owed to a rebuild of the lists
// (rebuildOwed). A startup answer that changes what is enforced rebuilds
// the lists now; should that fail (a policy file broken meanwhile), its
// new decisions go in as live changes.
func (d *Daemon) applyDecisions(c *policy.CrowdSec, a *crowdsec.Answer, startup bool) {
	start := a.Received // the answer's arrival: decoding it is part of the delay
	if start.IsZero() {
		start = time.Now()
	}
	f := d.cs
	var err error
	var adds []crowdsec.Decision
	rebuilt := false
	if startup {
		var changed bool
		if changed, adds = f.set.Replace(a); changed {
			if err = d.reload("crowdsec decisions"); err == nil {
				adds, rebuilt = nil, true
			}
		}
	} else {
		var removed bool
		adds, removed = f.set.Update(a)
		if removed {
			f.owe()
		}
	}
	if len(adds) > 0 {
		err = errors.Join(err, d.addLive(c, adds))
	}
	f.mu.Lock()
	f.lastSync, f.resync = time.Now(), false
	if startup {
		f.lastFull = f.lastSync
	}
	changed := startup || len(a.New)+len(a.Deleted) > 0
	if changed {
		f.deltas++
	}
	f.mu.Unlock()
	if err != nil {
		f.owe()
		d.log.Error("crowdsec: decisions not all enforced yet; the lists are built again within an interval", "err", err)
	}
	if changed {
		f.applied.Observe(time.Since(start).Seconds())
		d.log.Info("crowdsec decisions applied", "startup", startup, "new", len(a.New), "deleted", len(a.Deleted),
			"decisions", f.set.Len(), "bytes", a.Bytes, "rebuilt", rebuilt, "took", time.Since(start).Round(time.Millisecond).String())
		d.saveDecisions()
	}
}

// owe marks a rebuild of the lists as owed.
func (f *feed) owe() {
	f.mu.Lock()
	f.dirty = true
	f.mu.Unlock()
}

// addLive puts decisions into their origins' lists as live changes. An
// origin without a list yet borrows another's (its drops are counted
// there) and a rebuild, which gives it its own, is owed; so is one once
// the overlay holds more than foldAt.
func (d *Daemon) addLive(c *policy.CrowdSec, adds []crowdsec.Decision) error {
	f := d.cs
	byList := map[string][]netip.Prefix{}
	f.mu.Lock()
	var spare string
	for _, l := range f.split.lists {
		if spare == "" || l < spare {
			spare = l
		}
	}
	if f.split.byOrigin && spare == "" {
		f.dirty = true // the lists were built of no decision: one per origin is owed
	}
	for _, dec := range adds {
		l := c.List
		if f.split.byOrigin && spare != "" {
			if l = f.split.lists[dec.Origin]; l == "" {
				l, f.dirty = spare, true
			}
		}
		byList[l] = append(byList[l], dec.Prefix)
	}
	f.overlay += len(adds)
	if f.overlay > foldAt {
		f.dirty = true
	}
	f.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	for l, ps := range byList {
		if _, err := d.fw.ChangeList(engine.ListChange{List: l, Prefixes: ps, Add: true}); err != nil {
			return err
		}
	}
	return nil
}

// expireDecisions drops the decisions past their time, and pays an owed
// rebuild of the lists: at most one an interval, so that a set whose
// decisions expire every second is not rebuilt every second (a decision
// gone stays enforced until then, never the other way).
func (d *Daemon) expireDecisions() {
	f := d.cs
	f.mu.Lock()
	c, set := f.cfg, f.set
	f.mu.Unlock()
	if c == nil || set == nil {
		return
	}
	if set.Expire(time.Now()) {
		f.owe()
	}
	f.mu.Lock()
	due := f.dirty && time.Since(f.lastRebuild) >= c.Interval
	f.mu.Unlock()
	if !due {
		return
	}
	if err := d.reload("crowdsec decisions gone"); err != nil {
		f.mu.Lock()
		f.lastRebuild = time.Now() // retried an interval later, not every second
		f.mu.Unlock()
		return
	}
	d.saveDecisions()
}

// saveDecisions keeps the set for a restarted service.
func (d *Daemon) saveDecisions() {
	for _, p := range d.decisionsPaths() {
		if err := d.cs.set.Save(p); err != nil {
			d.log.Error("crowdsec: keep the decisions for a restart", "path", p, "err", err)
		}
	}
}
