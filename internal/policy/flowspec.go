package policy

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// FlowSpec is the policy's flowspec: section: the BGP speaker `rampart
// serve` runs to take FlowSpec routes (RFC 8955, RFC 8956) from its
// neighbors, and where the rules they become go among the policy's.
type FlowSpec struct {
	Line      int
	LocalAS   uint32
	RouterID  netip.Addr
	Listen    netip.AddrPort
	Neighbors []Neighbor
	// Position places the routes' rules: "auto" (before the first rule
	// that may drop, so after the leading pass rules), "first", "last",
	// or before or after the rule named Anchor.
	Position string
	Anchor   string
	// Interfaces are those the routes filter; none: every interface the
	// service filters.
	Interfaces     []string
	InterfacesLine int
}

// Neighbor is a BGP peer allowed to send FlowSpec routes.
type Neighbor struct {
	Line       int
	Address    netip.Addr
	PeerAS     uint32
	IPv4, IPv6 bool // the families taken from it
	// MaxRoutes caps the routes taken from the neighbor; those past it
	// are refused and counted, and the session stays up.
	MaxRoutes int
	HoldTime  time.Duration
}

// SameSpeaker says whether two sections ask for the same speaker (where
// the routes go may differ: that needs no new sessions).
func (f *FlowSpec) SameSpeaker(g *FlowSpec) bool {
	return f != nil && g != nil && f.LocalAS == g.LocalAS && f.RouterID == g.RouterID && f.Listen == g.Listen &&
		slices.EqualFunc(f.Neighbors, g.Neighbors, func(a, b Neighbor) bool {
			a.Line, b.Line = 0, 0
			return a == b
		})
}

// Neighbor is the section's neighbor of an address, or nil; f may be nil.
func (f *FlowSpec) Neighbor(addr netip.Addr) *Neighbor {
	if f == nil {
		return nil
	}
	for i := range f.Neighbors {
		if f.Neighbors[i].Address == addr.Unmap() {
			return &f.Neighbors[i]
		}
	}
	return nil
}

// FlowSpecAt is where in pol.Rules the routes' rules go.
func (pol *Policy) FlowSpecAt() int {
	f := pol.FlowSpec
	switch f.Position {
	case "first":
		return 0
	case "last":
		return len(pol.Rules)
	case "before", "after":
		i := slices.IndexFunc(pol.Rules, func(r Rule) bool { return r.Name == f.Anchor })
		if f.Position == "after" {
			i++
		}
		return i
	}
	i := slices.IndexFunc(pol.Rules, func(r Rule) bool { return r.Action.MayDrop() })
	if i < 0 {
		return len(pol.Rules)
	}
	return i
}

func (p *parser) flowspec(n *yaml.Node, pol *Policy) error {
	f, err := p.fields(n, "flowspec", "local_as", "router_id", "listen", "neighbors", "position", "interfaces")
	if err != nil {
		return err
	}
	fs := &FlowSpec{Line: n.Line, Position: "auto", Listen: netip.AddrPortFrom(netip.IPv6Unspecified(), 179)}
	as, err := p.asn(n, f["local_as"], "flowspec.local_as")
	if err != nil {
		return err
	}
	fs.LocalAS = as
	rn := f["router_id"]
	if rn == nil {
		return p.errf(n, "flowspec.router_id", "missing: a BGP identifier in IPv4 form, e.g. the host's address")
	}
	if fs.RouterID, err = netip.ParseAddr(rn.Value); err != nil || !fs.RouterID.Is4() || fs.RouterID.IsUnspecified() {
		return p.errf(rn, "flowspec.router_id", "%q: must be a non-zero IPv4 address", rn.Value)
	}
	if ln := f["listen"]; ln != nil {
		ap, err := netip.ParseAddrPort(ln.Value)
		if err != nil || ap.Port() == 0 {
			return p.errf(ln, "flowspec.listen", "%q: must be an address and port, e.g. 0.0.0.0:179 or [::]:179", ln.Value)
		}
		fs.Listen = ap
	}
	nn := f["neighbors"]
	if nn == nil || nn.Kind != yaml.SequenceNode || len(nn.Content) == 0 {
		return p.errf(n, "flowspec.neighbors", "needs a list of neighbors, each with address and peer_as: only they may connect")
	}
	seen := map[netip.Addr]int{}
	for _, c := range nn.Content {
		nb, err := p.neighbor(c)
		if err != nil {
			return err
		}
		if line, dup := seen[nb.Address]; dup {
			return p.errf(c, "flowspec.neighbors.address", "%s is already a neighbor at line %d", nb.Address, line)
		}
		seen[nb.Address] = nb.Line
		fs.Neighbors = append(fs.Neighbors, nb)
	}
	if pn := f["position"]; pn != nil {
		word, anchor, _ := strings.Cut(strings.TrimSpace(pn.Value), " ")
		fs.Position, fs.Anchor = word, strings.TrimSpace(anchor)
		switch {
		case (word == "auto" || word == "first" || word == "last") && anchor == "":
		case (word == "before" || word == "after") && fs.Anchor != "":
			if !slices.ContainsFunc(pol.Rules, func(r Rule) bool { return r.Name == fs.Anchor }) {
				return p.errf(pn, "flowspec.position", "no rule is named %q", fs.Anchor)
			}
		default:
			return p.errf(pn, "flowspec.position", "%q: must be auto, first, last, before RULE or after RULE", pn.Value)
		}
	}
	if in := f["interfaces"]; in != nil {
		names, err := p.strings(in, "flowspec.interfaces")
		if err != nil {
			return err
		}
		if len(names) == 0 {
			return p.errf(in, "flowspec.interfaces", "empty: omit it for every interface the service filters")
		}
		for i, name := range names {
			if name == "" || len(name) > 15 || strings.ContainsAny(name, "/ \t\n:") {
				return p.errf(in, "flowspec.interfaces", "%q: not an interface name", name)
			}
			if slices.Contains(names[:i], name) {
				return p.errf(in, "flowspec.interfaces", "%s is named twice", name)
			}
		}
		fs.Interfaces, fs.InterfacesLine = names, in.Line
	}
	pol.FlowSpec = fs
	return nil
}

func (p *parser) asn(parent, n *yaml.Node, field string) (uint32, error) {
	if n == nil {
		return 0, p.errf(parent, field, "missing: an AS number")
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToUpper(n.Value), "AS"), 10, 32)
	if err != nil || v == 0 {
		return 0, p.errf(n, field, "%q: must be an AS number from 1 to 4294967295", n.Value)
	}
	return uint32(v), nil
}

func (p *parser) neighbor(n *yaml.Node) (Neighbor, error) {
	f, err := p.fields(n, "neighbor", "address", "peer_as", "families", "max_routes", "hold_time")
	if err != nil {
		return Neighbor{}, err
	}
	nb := Neighbor{Line: n.Line, IPv4: true, IPv6: true, MaxRoutes: 10000, HoldTime: 90 * time.Second}
	an := f["address"]
	if an == nil {
		return nb, p.errf(n, "flowspec.neighbors.address", "missing: the neighbor's address")
	}
	if nb.Address, err = netip.ParseAddr(an.Value); err != nil || nb.Address.IsUnspecified() || nb.Address.Zone() != "" {
		return nb, p.errf(an, "flowspec.neighbors.address", "%q: must be an IP address", an.Value)
	}
	nb.Address = nb.Address.Unmap()
	if nb.PeerAS, err = p.asn(n, f["peer_as"], "flowspec.neighbors.peer_as"); err != nil {
		return nb, err
	}
	if fn := f["families"]; fn != nil {
		fams, err := p.strings(fn, "flowspec.neighbors.families")
		if err != nil {
			return nb, err
		}
		nb.IPv4, nb.IPv6 = false, false
		for _, s := range fams {
			switch strings.ToLower(s) {
			case "ipv4":
				nb.IPv4 = true
			case "ipv6":
				nb.IPv6 = true
			default:
				return nb, p.errf(fn, "flowspec.neighbors.families", "%q: must be ipv4 or ipv6", s)
			}
		}
		if !nb.IPv4 && !nb.IPv6 {
			return nb, p.errf(fn, "flowspec.neighbors.families", "empty: omit it for both")
		}
	}
	if mn := f["max_routes"]; mn != nil {
		v, err := strconv.Atoi(mn.Value)
		if err != nil || v < 1 || v > MaxRules {
			return nb, p.errf(mn, "flowspec.neighbors.max_routes", "%q: must be a number from 1 to %d", mn.Value, MaxRules)
		}
		nb.MaxRoutes = v
	}
	if hn := f["hold_time"]; hn != nil {
		d, err := time.ParseDuration(hn.Value)
		// RFC 4271 §4.2: 0 or at least 3 seconds; rampart keeps routes
		// for the hold time after a session is lost, so 0 is refused.
		if err != nil || d < 3*time.Second || d > 65535*time.Second || d%time.Second != 0 {
			return nb, p.errf(hn, "flowspec.neighbors.hold_time", "%q: must be whole seconds from 3s to 65535s, e.g. 90s", hn.Value)
		}
		nb.HoldTime = d
	}
	return nb, nil
}
