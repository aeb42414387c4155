package serve

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rampart-fw/rampart/internal/fleet/flowspec"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/stats"
)

// fsFeed follows the BGP FlowSpec routes of the policy's flowspec section:
// an embedded speaker fills the table, and every change is applied as a
// policy with the routes' rules placed among the local ones.
type fsFeed struct {
	mu      sync.Mutex
	cfg     *policy.FlowSpec // as last applied; nil: the policy has none
	speaker *flowspec.Speaker
	table   *flowspec.Table
	placed  []flowspec.Entry // as the policy applied last placed them
	next    []flowspec.Entry // as the policy being applied places them: copies, which later changes leave alone
	// What is owed an apply: the arrival of each change not yet enforced.
	pending []time.Time
	wake    chan struct{}

	sessions  map[netip.Addr]bool // up or not, by neighbor
	updates   map[string]uint64   // by kind: announce, withdraw
	malformed uint64
	flaps     map[netip.Addr]uint64 // sessions lost
	expired   uint64                // routes removed after their hold time
	applied   prometheus.Histogram
}

func newFSFeed() *fsFeed {
	return &fsFeed{table: flowspec.NewTable(), wake: make(chan struct{}, 1), sessions: map[netip.Addr]bool{},
		updates: map[string]uint64{}, flaps: map[netip.Addr]uint64{},
		applied: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rampart_flowspec_apply_seconds",
			Help:    "From a FlowSpec route's arrival (announced or withdrawn) to the kernel enforcing it, per route.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}})}
}

// flowspecRules starts, restarts or stops the speaker for pol's section,
// and places the table's routes among pol's rules; under d.mu. When the
// section names interfaces, pol stays as it is for the others, and the
// policy with the routes is returned for each named one. A speaker
// that cannot start (its address in use) is an error at the service's
// start, which then changes nothing on the host; later, the policy applies
// with the routes held and the speaker is tried again at the next reload.
func (d *Daemon) flowspecRules(pol *policy.Policy, start bool) (map[string]*policy.Policy, error) {
	c := pol.FlowSpec
	if c != nil {
		for _, name := range c.Interfaces {
			if !slices.Contains(d.opt.Ifaces, name) {
				return nil, fmt.Errorf("%s:%d: flowspec.interfaces: %s is not an interface this service filters (--iface %s)", pol.File, c.InterfacesLine, name, strings.Join(d.opt.Ifaces, ", "))
			}
		}
	}
	f := d.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	if c == nil || !c.SameSpeaker(f.cfg) {
		if f.speaker != nil {
			f.speaker.Stop()
			f.speaker = nil
			d.log.Info("flowspec: speaker stopped")
		}
		// Routes of neighbors the policy no longer names go; the others
		// come back from their neighbors when the new speaker is up.
		f.table.Forget(func(nb netip.Addr) bool { return c != nil && c.Neighbor(nb) != nil })
		clear(f.sessions)
	}
	f.cfg = c
	if c == nil {
		f.next = nil
		return nil, nil
	}
	for _, nb := range c.Neighbors {
		f.table.Limit(nb.Address, nb.MaxRoutes) // a higher max_routes takes what waits
	}
	if f.speaker == nil {
		sp, err := flowspec.Start(c, d.fw.Netns(), d.log, d.flowspecEvents)
		switch {
		case err != nil && start:
			f.cfg = nil
			return nil, err
		case err != nil:
			d.log.Error("flowspec: the speaker did not start; the policy applies with the routes held, and the speaker is tried again at the next reload", "err", err)
			f.cfg = nil
		default:
			f.speaker = sp
			d.log.Info("flowspec: speaker listening", "listen", c.Listen.String(), "neighbors", len(c.Neighbors))
		}
	}
	routed := pol
	if len(c.Interfaces) > 0 {
		// Place adds lists and rules: to a copy, which shares pol's lists.
		routed = &policy.Policy{}
		*routed = *pol
		routed.Lists, routed.Rules = maps.Clone(pol.Lists), slices.Clone(pol.Rules)
	}
	entries := f.table.Entries()
	flowspec.Place(routed, entries)
	f.next = make([]flowspec.Entry, len(entries))
	for i, e := range entries {
		f.next[i] = *e
	}
	if routed == pol || len(routed.Rules) == len(pol.Rules) {
		return nil, nil // one policy, loaded once, for every interface
	}
	policyOf := map[string]*policy.Policy{}
	for _, name := range c.Interfaces {
		policyOf[name] = routed
	}
	return policyOf, nil
}

// flowspecApplied records the routes of the policy just applied as the
// ones enforced; under d.mu.
func (d *Daemon) flowspecApplied() {
	f := d.fs
	f.mu.Lock()
	f.placed, f.next = f.next, nil
	f.mu.Unlock()
}

// flowspecEvents takes what the speaker heard, in order.
func (d *Daemon) flowspecEvents(evs []flowspec.Event) {
	f := d.fs
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ev := range evs {
		nb := f.cfg.Neighbor(ev.Neighbor)
		if nb == nil {
			continue // a speaker being replaced
		}
		switch ev.Kind {
		case flowspec.Malformed:
			f.malformed++
			d.log.Warn("flowspec: a route that cannot be read is ignored; the session stays up", "neighbor", ev.Neighbor, "nlri", hexShort(ev.NLRI), "err", ev.Err)
		case flowspec.Announced:
			f.updates["announce"]++
			if f.table.Announce(ev.Neighbor, ev.Route, ev.NLRI, ev.Action, nb.MaxRoutes, now) {
				f.owe(now)
			} else {
				d.log.Warn("flowspec: route refused: the neighbor is at its max_routes; it is taken when the neighbor's routes make room (up to max_routes wait)",
					"neighbor", ev.Neighbor, "max_routes", nb.MaxRoutes, "waiting", f.table.Waiting(ev.Neighbor), "route", ev.Route.String())
			}
		case flowspec.Withdrawn:
			f.updates["withdraw"]++
			if f.table.Withdraw(ev.Neighbor, ev.NLRI) {
				f.owe(now)
			}
		case flowspec.SessionUp:
			f.sessions[ev.Neighbor] = true
			d.log.Info("flowspec: session up", "neighbor", ev.Neighbor)
		case flowspec.SessionDown:
			if f.sessions[ev.Neighbor] {
				f.flaps[ev.Neighbor]++
				d.log.Warn("flowspec: session lost; its routes stay for the hold time", "neighbor", ev.Neighbor, "hold_time", nb.HoldTime.String(), "reason", ev.Reason)
			}
			f.sessions[ev.Neighbor] = false
			f.table.SessionLost(ev.Neighbor, nb.HoldTime, now)
		}
	}
}

func hexShort(b []byte) string {
	const max = 64
	s := ""
	for i, c := range b {
		if i == max {
			return s + "…"
		}
		s += string("0123456789abcdef"[c>>4]) + string("0123456789abcdef"[c&15])
	}
	return s
}

// owe marks an apply as owed for a change that arrived then, under f.mu.
func (f *fsFeed) owe(arrived time.Time) {
	f.pending = append(f.pending, arrived)
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// followFlowSpec applies what the table owes: a burst of UPDATEs is taken
// whole (until 10 ms pass without one, at most 100 ms after the first),
// then applied in one reload; what comes during a reload waits for it and
// goes in the next. Routes of lost sessions go when their hold time has
// passed.
func (d *Daemon) followFlowSpec(ctx context.Context) {
	f := d.fs
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var retry time.Duration // after a failed apply
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			f.mu.Lock()
			if n := f.table.Expire(time.Now()); n > 0 {
				f.expired += uint64(n)
				d.log.Info("flowspec: routes of a lost session removed after its hold time", "routes", n)
				f.owe(time.Now())
			}
			f.mu.Unlock()
			continue
		case <-f.wake:
		}
		first := time.Now()
		for quiet := false; !quiet && time.Since(first) < 100*time.Millisecond; {
			select {
			case <-ctx.Done():
				return
			case <-f.wake:
			case <-time.After(10 * time.Millisecond):
				quiet = true
			}
		}
		f.mu.Lock()
		changes := f.pending
		f.pending = nil
		f.mu.Unlock()
		if len(changes) == 0 {
			continue
		}
		if err := d.reload("flowspec"); err != nil {
			// Again after a while (the files may be fixed), and at the
			// next change.
			f.mu.Lock()
			f.pending = append(changes, f.pending...)
			f.mu.Unlock()
			retry = min(max(2*retry, time.Second), 30*time.Second)
			time.AfterFunc(retry, func() {
				select {
				case f.wake <- struct{}{}:
				default:
				}
			})
			continue
		}
		retry = 0
		done := time.Now()
		for _, t := range changes {
			f.applied.Observe(done.Sub(t).Seconds())
		}
	}
}

// stopFlowSpec ends the speaker's sessions.
func (d *Daemon) stopFlowSpec() {
	f := d.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.speaker != nil {
		f.speaker.Stop()
		f.speaker = nil
	}
}

// FlowSpecRoute is a route as `rampart flowspec show` prints it.
type FlowSpecRoute struct {
	Name     string   `json:"name"`
	Neighbor string   `json:"neighbor"`
	Family   string   `json:"family"`
	Match    string   `json:"match"`
	Action   string   `json:"action"`
	NotHere  []string `json:"not_applicable,omitempty"`
	State    string   `json:"state"`
	Reason   string   `json:"reason,omitempty"`
	Rules    []string `json:"rules,omitempty"`
	Stale    bool     `json:"stale,omitempty"`
	Packets  uint64   `json:"packets"` // that took the route's verdict
	Bytes    uint64   `json:"bytes"`
	Over     uint64   `json:"over_limit,omitempty"` // a rate's: dropped over it
	Since    string   `json:"since"`
}

// FlowSpecNeighbor is a neighbor's session as the show prints it.
type FlowSpecNeighbor struct {
	Address  string `json:"address"`
	PeerAS   uint32 `json:"peer_as"`
	Up       bool   `json:"up"`
	Routes   int    `json:"routes"`
	Waiting  int    `json:"waiting"` // refused at max_routes, taken as room is made
	Max      int    `json:"max_routes"`
	Flaps    uint64 `json:"sessions_lost"`
	HoldTime string `json:"hold_time"`
}

// FlowSpecShow is the answer of GET /v1/flowspec.
type FlowSpecShow struct {
	Enabled   bool               `json:"enabled"`
	Neighbors []FlowSpecNeighbor `json:"neighbors"`
	Routes    []FlowSpecRoute    `json:"routes"`
	Malformed uint64             `json:"malformed"`
	Refused   map[string]uint64  `json:"refused"`
}

// flowspecShow reports the routes as last applied, with their counters
// summed over their rules and hooks.
func (d *Daemon) flowspecShow(rows []stats.Row) FlowSpecShow {
	f := d.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	out := FlowSpecShow{Enabled: f.cfg != nil, Malformed: f.malformed, Refused: map[string]uint64{}, Routes: []FlowSpecRoute{}, Neighbors: []FlowSpecNeighbor{}}
	if f.cfg == nil {
		return out
	}
	for k, v := range f.table.Refused {
		out.Refused[k] = v
	}
	for _, nb := range f.cfg.Neighbors {
		out.Neighbors = append(out.Neighbors, FlowSpecNeighbor{Address: nb.Address.String(), PeerAS: nb.PeerAS, Up: f.sessions[nb.Address],
			Routes: f.table.Len(nb.Address), Waiting: f.table.Waiting(nb.Address), Max: nb.MaxRoutes, Flaps: f.flaps[nb.Address], HoldTime: nb.HoldTime.String()})
	}
	counts := routeCounters(rows)
	for _, e := range f.placed {
		fam := "ipv4"
		if e.Route.IPv6 {
			fam = "ipv6"
		}
		c := counts[e.Name]
		out.Routes = append(out.Routes, FlowSpecRoute{Name: e.Name, Neighbor: e.Neighbor.String(), Family: fam, Match: e.Route.String(),
			Action: e.Action.String(), NotHere: e.Action.NotApplicable, State: e.State, Reason: e.Reason, Rules: e.Rules,
			Stale: !e.StaleUntil.IsZero(), Packets: c[0], Bytes: c[1], Over: c[2], Since: e.Since.UTC().Format(time.RFC3339)})
	}
	return out
}

// routeCounters is the kernel's counters of each route's rule
// (flowspec/HASH), summed over the rows the kernel gives for it.
func routeCounters(rows []stats.Row) map[string][3]uint64 {
	out := map[string][3]uint64{}
	for _, r := range rows {
		if r.Kind != "rule" || !strings.HasPrefix(r.Name, "flowspec/") {
			continue
		}
		c := out[r.Name]
		out[r.Name] = [3]uint64{c[0] + r.Packets, c[1] + r.Bytes, c[2] + r.Over}
	}
	return out
}

var (
	descFSRoutes    = prometheus.NewDesc("rampart_flowspec_routes", "FlowSpec routes held, by what became of them (installed, unsupported, never-matches, shadowed, no-room), and those waiting for room under a neighbor's max_routes (waiting).", []string{"state"}, nil)
	descFSSession   = prometheus.NewDesc("rampart_flowspec_session_up", "1 while the BGP session with a neighbor is established.", []string{"neighbor"}, nil)
	descFSFlaps     = prometheus.NewDesc("rampart_flowspec_sessions_lost_total", "BGP sessions with a neighbor that were lost.", []string{"neighbor"}, nil)
	descFSUpdates   = prometheus.NewDesc("rampart_flowspec_updates_total", "FlowSpec routes announced and withdrawn by the neighbors.", []string{"kind"}, nil)
	descFSMalformed = prometheus.NewDesc("rampart_flowspec_malformed_total", "FlowSpec routes whose NLRI could not be read; they are ignored, the session stays up.", nil, nil)
	descFSRefused   = prometheus.NewDesc("rampart_flowspec_refused_total", "FlowSpec routes refused: their neighbor was at its max_routes.", []string{"reason"}, nil)
	descFSExpired   = prometheus.NewDesc("rampart_flowspec_expired_total", "FlowSpec routes removed when the hold time after their session was lost had passed.", nil, nil)
	descFSPackets   = prometheus.NewDesc("rampart_flowspec_packets_total", "Packets that took the verdict of a FlowSpec route's rules.", []string{"route", "action"}, nil)
	descFSBytes     = prometheus.NewDesc("rampart_flowspec_bytes_total", "Bytes of those packets.", []string{"route", "action"}, nil)
)

func (f *fsFeed) collect(ch chan<- prometheus.Metric, rows []stats.Row) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cfg == nil {
		return
	}
	states := map[string]int{flowspec.StateInstalled: 0, flowspec.StateUnsupported: 0, flowspec.StateNever: 0, flowspec.StateShadowed: 0, flowspec.StateNoRoom: 0}
	counts := routeCounters(rows)
	for _, e := range f.placed {
		states[e.State]++
		if e.State == flowspec.StateInstalled {
			c := counts[e.Name]
			ch <- prometheus.MustNewConstMetric(descFSPackets, prometheus.CounterValue, float64(c[0]), e.Name, e.Action.Kind.String())
			ch <- prometheus.MustNewConstMetric(descFSBytes, prometheus.CounterValue, float64(c[1]), e.Name, e.Action.Kind.String())
		}
	}
	for _, nb := range f.cfg.Neighbors {
		states["waiting"] += f.table.Waiting(nb.Address)
	}
	for s, n := range states {
		ch <- prometheus.MustNewConstMetric(descFSRoutes, prometheus.GaugeValue, float64(n), s)
	}
	for _, nb := range f.cfg.Neighbors {
		a := nb.Address.String()
		ch <- prometheus.MustNewConstMetric(descFSSession, prometheus.GaugeValue, boolf(f.sessions[nb.Address]), a)
		ch <- prometheus.MustNewConstMetric(descFSFlaps, prometheus.CounterValue, float64(f.flaps[nb.Address]), a)
	}
	for _, k := range []string{"announce", "withdraw"} {
		ch <- prometheus.MustNewConstMetric(descFSUpdates, prometheus.CounterValue, float64(f.updates[k]), k)
	}
	ch <- prometheus.MustNewConstMetric(descFSMalformed, prometheus.CounterValue, float64(f.malformed))
	ch <- prometheus.MustNewConstMetric(descFSRefused, prometheus.CounterValue, float64(f.table.Refused["max-routes"]), "max-routes")
	ch <- prometheus.MustNewConstMetric(descFSExpired, prometheus.CounterValue, float64(f.expired))
	f.applied.Collect(ch)
}
