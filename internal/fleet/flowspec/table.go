package flowspec

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/rampart-fw/rampart/internal/policy"
)

// Entry is a route a neighbor sent, as the table keeps it.
type Entry struct {
	Neighbor netip.Addr
	Route    Route
	NLRI     []byte // as sent: the key
	Action   Action
	Name     string    // its rules' name, from the NLRI
	Since    time.Time // when it was last sent
	// StaleUntil, when set, is when the route goes: its session was lost,
	// and it is kept for the hold time unless sent again.
	StaleUntil time.Time
	// What Place made of it.
	State  string // installed, unsupported, never-matches, shadowed, no-room
	Reason string
	Rules  []string // the names of its rules, when installed
}

// States of an entry after Place.
const (
	StateInstalled   = "installed"
	StateUnsupported = "unsupported"
	StateNever       = "never-matches" // its match is empty, or an accept that continues
	StateShadowed    = "shadowed"      // another neighbor sent the same NLRI
	StateNoRoom      = "no-room"       // past the policy's limits of rules and lists
)

// Table holds the routes of every neighbor. It is not safe for concurrent
// use.
type Table struct {
	routes map[netip.Addr]map[string]*Entry
	// waiting holds, per neighbor, routes refused at its max_routes (as
	// many more as max_routes), in the order they came: the neighbor still
	// announces them, and will not send them again, so they are taken as
	// room is made.
	waiting map[netip.Addr]*queue
	max     map[netip.Addr]int
	// Refused counts routes not taken, by reason (max-routes).
	Refused map[string]uint64
}

// queue is routes in the order they came.
type queue struct {
	order []queued
	byKey map[string]waiter
	seq   uint64
}

// queued is a place in the queue; it is void when its key's waiter has
// another seq (withdrawn, or withdrawn and refused again later).
type queued struct {
	key string
	seq uint64
}

type waiter struct {
	e   *Entry
	seq uint64
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{routes: map[netip.Addr]map[string]*Entry{}, waiting: map[netip.Addr]*queue{}, max: map[netip.Addr]int{},
		Refused: map[string]uint64{}}
}

// RouteName names a route's rules by its NLRI: the same route keeps its
// name, and so its counters, across updates and restarts.
func RouteName(nlri []byte, ipv6 bool) string {
	fam := byte(4)
	if ipv6 {
		fam = 6
	}
	sum := sha256.Sum256(append([]byte{fam}, nlri...))
	return "flowspec/" + hex.EncodeToString(sum[:6])
}

// Announce adds or replaces a neighbor's route; false when the neighbor
// is at maxRoutes and nothing it holds changed: a new route is counted as
// refused and waits for room, one waiting already has its action
// updated.
func (t *Table) Announce(nb netip.Addr, r Route, nlri []byte, a Action, maxRoutes int, now time.Time) bool {
	m := t.routes[nb]
	if m == nil {
		m = map[string]*Entry{}
		t.routes[nb] = m
	}
	t.max[nb] = maxRoutes
	key := string(nlri)
	if e := m[key]; e != nil {
		e.Action, e.Since, e.StaleUntil = a, now, time.Time{}
		return true
	}
	w := t.queue(nb)
	if q, ok := w.byKey[key]; ok { // waiting already: sent again
		q.e.Action, q.e.Since = a, now
		return t.admit(nb) // a higher maxRoutes may have made room
	}
	e := &Entry{Neighbor: nb, Route: r, NLRI: slices.Clone(nlri), Action: a, Name: RouteName(nlri, r.IPv6), Since: now}
	if len(m) < maxRoutes {
		m[key] = e
		return true
	}
	t.Refused["max-routes"]++
	if len(w.byKey) < maxRoutes {
		w.order = append(w.order, w.add(key, e))
		if len(w.order) > 2*len(w.byKey)+64 { // places left by withdrawn routes
			w.order = slices.DeleteFunc(w.order, w.void)
		}
	}
	return false
}

// add makes a route wait and returns its place, for the caller to put in
// line.
func (w *queue) add(key string, e *Entry) queued {
	w.seq++
	w.byKey[key] = waiter{e, w.seq}
	return queued{key, w.seq}
}

// void says whether a place in the queue is no route's any more.
func (w *queue) void(q queued) bool {
	cur, ok := w.byKey[q.key]
	return !ok || cur.seq != q.seq
}

// Withdraw removes a neighbor's route, which lets a waiting one in; false
// when it held none (a waiting route is forgotten, nothing changes).
func (t *Table) Withdraw(nb netip.Addr, nlri []byte) bool {
	if w := t.waiting[nb]; w != nil {
		delete(w.byKey, string(nlri))
	}
	m := t.routes[nb]
	if m == nil || m[string(nlri)] == nil {
		return false
	}
	delete(m, string(nlri))
	t.admit(nb)
	return true
}

// Limit sets a neighbor's max_routes, as a reload may change it: a higher
// one takes the waiting routes there is room for, a lower one sends the
// routes sent last past it back to wait, first in line (as many as may
// wait; the rest are refused). It says whether the held routes changed.
func (t *Table) Limit(nb netip.Addr, maxRoutes int) bool {
	t.max[nb] = maxRoutes
	m := t.routes[nb]
	if len(m) <= maxRoutes {
		return t.admit(nb)
	}
	held := slices.SortedFunc(maps.Values(m), func(a, b *Entry) int { return a.Since.Compare(b.Since) })
	w := t.queue(nb)
	var first []queued
	for _, e := range held[maxRoutes:] {
		key := string(e.NLRI)
		delete(m, key)
		t.Refused["max-routes"]++
		if len(w.byKey) < maxRoutes {
			first = append(first, w.add(key, e))
		}
	}
	w.order = append(first, w.order...)
	return true
}

// queue is a neighbor's waiting routes, made when first needed.
func (t *Table) queue(nb netip.Addr) *queue {
	w := t.waiting[nb]
	if w == nil {
		w = &queue{byKey: map[string]waiter{}}
		t.waiting[nb] = w
	}
	return w
}

// admit moves waiting routes into the neighbor's table while it has room,
// the first come first; it says whether it moved any.
func (t *Table) admit(nb netip.Addr) bool {
	w, m := t.waiting[nb], t.routes[nb]
	moved := false
	for w != nil && len(w.order) > 0 && len(m) < t.max[nb] {
		q := w.order[0]
		w.order = w.order[1:]
		if w.void(q) {
			continue
		}
		if m == nil {
			m = map[string]*Entry{}
			t.routes[nb] = m
		}
		m[q.key] = w.byKey[q.key].e
		delete(w.byKey, q.key)
		moved = true
	}
	return moved
}

// SessionLost keeps a neighbor's routes until the hold time has passed,
// unless they are sent again. Its waiting routes go: the neighbor sends
// what it still announces when the session is back.
func (t *Table) SessionLost(nb netip.Addr, hold time.Duration, now time.Time) {
	for _, e := range t.routes[nb] {
		if e.StaleUntil.IsZero() {
			e.StaleUntil = now.Add(hold)
		}
	}
	delete(t.waiting, nb)
}

// Expire removes the stale routes whose time has come; it says how many.
func (t *Table) Expire(now time.Time) int {
	n := 0
	for nb, m := range t.routes {
		for k, e := range m {
			if !e.StaleUntil.IsZero() && !now.Before(e.StaleUntil) {
				delete(m, k)
				n++
			}
		}
		t.admit(nb)
	}
	return n
}

// Forget drops every route of neighbors not in keep (a neighbor removed
// from the policy).
func (t *Table) Forget(keep func(netip.Addr) bool) {
	for nb := range t.max { // every neighbor the table has heard of
		if !keep(nb) {
			delete(t.routes, nb)
			delete(t.waiting, nb)
			delete(t.max, nb)
		}
	}
}

// Waiting is the number of a neighbor's routes waiting for room.
func (t *Table) Waiting(nb netip.Addr) int {
	if w := t.waiting[nb]; w != nil {
		return len(w.byKey)
	}
	return 0
}

// Len is the number of routes of a neighbor.
func (t *Table) Len(nb netip.Addr) int { return len(t.routes[nb]) }

// Entries are every route, IPv4 first, each family in RFC 8955 §5.1
// order; the same NLRI from several neighbors in neighbor order.
func (t *Table) Entries() []*Entry {
	var out []*Entry
	for _, m := range t.routes {
		for _, e := range m {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *Entry) int {
		if a.Route.IPv6 != b.Route.IPv6 {
			if a.Route.IPv6 {
				return 1
			}
			return -1
		}
		if c := Compare(&a.Route, &b.Route); c != 0 {
			return c
		}
		return a.Neighbor.Compare(b.Neighbor)
	})
	return out
}

// Place writes the entries, in order, as rules into pol at
// pol.FlowSpecAt(), as many as the policy's limits leave room for; each
// entry's State says what became of it. Rules of IPv4 and IPv6 routes
// never meet the same packet, so the families' order between them does
// not matter.
func Place(pol *policy.Policy, entries []*Entry) {
	at := pol.FlowSpecAt()
	used, lists := pol.Usage()
	var rules []policy.Rule
	seen := map[string]bool{}
	for _, e := range entries {
		e.Rules, e.Reason = nil, ""
		key := fmt.Sprint(e.Route.IPv6, string(e.NLRI))
		if seen[key] {
			e.State = StateShadowed
			continue
		}
		seen[key] = true
		added := map[string]*policy.List{}
		rs, err := Rules(&e.Route, e.Action, e.Name, added)
		if err != nil {
			e.State, e.Reason = StateUnsupported, err.Error()
			continue
		}
		if len(rs) == 0 {
			e.State = StateNever
			continue
		}
		var fresh []string
		for name, l := range added {
			if pol.Lists[name] == nil {
				pol.Lists[name] = l
				fresh = append(fresh, name)
			}
		}
		n := 0
		var undo []func()
		for i := range rs {
			n += rs[i].Entries(pol.Lists)
			undo = append(undo, lists.Add(&rs[i], pol.Lists))
		}
		if used+n > policy.MaxRules || lists.Fits() != nil {
			e.State, e.Reason = StateNoRoom, "the policy's limits of rules and lists are reached"
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			for _, name := range fresh {
				delete(pol.Lists, name)
			}
			continue
		}
		used += n
		e.State = StateInstalled
		for _, r := range rs {
			e.Rules = append(e.Rules, r.Name)
		}
		rules = append(rules, rs...)
	}
	pol.Rules = slices.Insert(pol.Rules, at, rules...)
}
