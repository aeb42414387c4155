package flowspec

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"runtime"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/policy"
)

// EventKind says what a speaker event is.
type EventKind int

const (
	Announced EventKind = iota
	Withdrawn
	SessionUp
	SessionDown
	// Malformed: a route whose NLRI could not be read (GoBGP keeps what it
	// cannot decode as an unknown component and passes the route on).
	Malformed
)

// Event is what a neighbor did.
type Event struct {
	Kind     EventKind
	Neighbor netip.Addr
	IPv6     bool
	NLRI     []byte
	Route    Route
	Action   Action
	Err      error  // Malformed: why
	Reason   string // SessionDown: GoBGP's word for it
}

// Speaker is an embedded GoBGP server that takes FlowSpec routes from the
// neighbors of a policy's section. GoBGP v4 rather than v3: v3.37 panics,
// with no recover, on a truncated FlowSpec value or IPv6 prefix and on an
// unknown message type from a configured neighbor; v4 reads them as an
// error or an unknown component.
type Speaker struct {
	s      *server.BgpServer
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs a speaker for cfg in the network namespace ns ("" for the
// caller's) and calls events with what the neighbors send, one batch at a
// time, in the order it came.
func Start(cfg *policy.FlowSpec, ns string, log *slog.Logger, events func([]Event)) (*Speaker, error) {
	lv := new(slog.LevelVar)
	lv.Set(slog.LevelWarn)
	s := server.NewBgpServer(server.LoggerOption(log.With("component", "gobgp"), lv))
	sp := &Speaker{s: s, done: make(chan struct{})}
	serving := make(chan error, 1)
	go func() {
		defer close(sp.done)
		// The server's loop makes the listening sockets: on a thread in
		// the namespace, which is discarded afterwards.
		runtime.LockOSThread()
		if ns != "" {
			if err := netns.Enter(ns); err != nil {
				serving <- err
				return
			}
		}
		serving <- nil
		s.Serve()
	}()
	if err := <-serving; err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sp.cancel = cancel
	ok := false
	defer func() {
		if !ok {
			sp.Stop()
		}
	}()
	addr := cfg.Listen.Addr().Unmap()
	listen := []string{addr.String()}
	if addr == netip.IPv6Unspecified() {
		listen = nil // GoBGP's default: both families' wildcards
	}
	err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: cfg.LocalAS, RouterId: cfg.RouterID.String(),
		ListenPort: int32(cfg.Listen.Port()), ListenAddresses: listen}})
	if err != nil {
		return nil, fmt.Errorf("flowspec: start the BGP speaker on %s: %w", cfg.Listen, err)
	}
	// rampart takes routes and gives none: without a policy GoBGP would
	// pass one neighbor's routes on to the others.
	err = s.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{Name: "global",
		Direction: api.PolicyDirection_POLICY_DIRECTION_EXPORT, DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT}})
	if err != nil {
		return nil, fmt.Errorf("flowspec: set the speaker's export policy: %w", err)
	}
	// Routes and sessions in one watch: one goroutine delivers both, in
	// the order they happened.
	err = s.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnPathUpdate: func(paths []*apiutil.Path, _ time.Time) { events(pathEvents(paths)) },
		OnPeerUpdate: func(p *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
			if ev, ok := peerEvent(p); ok {
				events([]Event{ev})
			}
		},
	}, server.WatchUpdate(false, "", ""), server.WatchPeer())
	if err != nil {
		return nil, fmt.Errorf("flowspec: watch the BGP speaker: %w", err)
	}
	for _, nb := range cfg.Neighbors {
		var fams []*api.AfiSafi
		for _, f := range []struct {
			on  bool
			afi api.Family_Afi
		}{{nb.IPv4, api.Family_AFI_IP}, {nb.IPv6, api.Family_AFI_IP6}} {
			if f.on {
				fams = append(fams, &api.AfiSafi{Config: &api.AfiSafiConfig{Enabled: true,
					Family: &api.Family{Afi: f.afi, Safi: api.Family_SAFI_FLOW_SPEC_UNICAST}}})
			}
		}
		hold := uint64(nb.HoldTime / time.Second)
		err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
			Conf:      &api.PeerConf{NeighborAddress: nb.Address.String(), PeerAsn: nb.PeerAS},
			Transport: &api.Transport{PassiveMode: true}, // the neighbors connect; only they may
			Timers:    &api.Timers{Config: &api.TimersConfig{HoldTime: hold, KeepaliveInterval: max(1, hold/3), IdleHoldTimeAfterReset: 1}},
			AfiSafis:  fams,
		}})
		if err != nil {
			return nil, fmt.Errorf("flowspec: neighbor %s (line %d): %w", nb.Address, nb.Line, err)
		}
	}
	ok = true
	return sp, nil
}

// Stop ends every session (a Cease to each neighbor) and the server.
func (sp *Speaker) Stop() {
	sp.s.Stop()
	sp.cancel()
}

func peerEvent(p *apiutil.WatchEventMessage_PeerEvent) (Event, bool) {
	st := p.Peer.State
	if p.Type != apiutil.PEER_EVENT_STATE || !st.NeighborAddress.IsValid() {
		return Event{}, false
	}
	ev := Event{Neighbor: st.NeighborAddress.Unmap(), Kind: SessionDown}
	if st.SessionState == bgp.BGP_FSM_ESTABLISHED {
		ev.Kind = SessionUp
	} else {
		ev.Reason = st.DisconnectMessage
		if ev.Reason == "" {
			ev.Reason = st.SessionState.String()
		}
	}
	return ev, true
}

func pathEvents(paths []*apiutil.Path) []Event {
	var out []Event
	for _, p := range paths {
		ipv6 := p.Family == bgp.RF_FS_IPv6_UC
		if p.Family != bgp.RF_FS_IPv4_UC && !ipv6 {
			continue
		}
		ev := Event{Neighbor: p.PeerAddress.Unmap(), IPv6: ipv6, Kind: Announced}
		if p.Withdrawal {
			ev.Kind = Withdrawn
		}
		b, err := p.Nlri.Serialize()
		if err == nil {
			ev.NLRI = b
			var rest []byte
			ev.Route, rest, err = Decode(b, ipv6)
			if err == nil && len(rest) > 0 {
				err = fmt.Errorf("%d bytes after the NLRI", len(rest))
			}
		}
		if err != nil {
			ev.Kind, ev.Err = Malformed, err
		}
		if ev.Kind == Announced {
			ev.Action = actionOf(p.Attrs)
		}
		out = append(out, ev)
	}
	return out
}

// actionOf reads a route's traffic filtering actions (RFC 8955 §7) from
// its extended communities. Of several rates (§7.7 leaves it to the
// implementation), a zero one wins, then traffic-rate-packets, then the
// lowest.
func actionOf(attrs []bgp.PathAttributeInterface) Action {
	a := Action{Kind: Accept}
	rate := func(k ActionKind, r float32) {
		switch {
		case r <= 0 || math.IsNaN(float64(r)): // negative values "MUST be treated as zero"
			a.Kind, a.Rate = Drop, 0
		case a.Kind == Drop:
		case a.Kind == Accept || k > a.Kind || k == a.Kind && float64(r) < a.Rate:
			a.Kind, a.Rate = k, float64(r)
		}
	}
	for _, attr := range attrs {
		var comms []bgp.ExtendedCommunityInterface
		switch ec := attr.(type) {
		case *bgp.PathAttributeExtendedCommunities:
			comms = ec.Value
		case *bgp.PathAttributeIP6ExtendedCommunities: // rt-redirect-ipv6 (RFC 8956 §6)
			comms = ec.Value
		}
		for _, c := range comms {
			switch c := c.(type) {
			case *bgp.TrafficRateExtended:
				rate(RateBytes, c.Rate)
			case *bgp.UnknownExtended:
				// traffic-rate-packets (0x800c), which GoBGP does not know.
				if c.Type == 0x80 && len(c.Value) >= 7 && c.Value[0] == 0x0c {
					rate(RatePackets, math.Float32frombits(binary.BigEndian.Uint32(c.Value[3:7])))
				}
			case *bgp.TrafficActionExtended:
				a.Continue, a.Sample = c.Terminal, c.Sample // GoBGP's Terminal is the T bit
			case *bgp.RedirectTwoOctetAsSpecificExtended, *bgp.RedirectIPv4AddressSpecificExtended,
				*bgp.RedirectFourOctetAsSpecificExtended, *bgp.RedirectIPv6AddressSpecificExtended:
				a.NotApplicable = appendOnce(a.NotApplicable, "redirect")
			case *bgp.TrafficRemarkExtended:
				a.NotApplicable = appendOnce(a.NotApplicable, "traffic-marking")
			}
		}
	}
	return a
}

func appendOnce(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}
