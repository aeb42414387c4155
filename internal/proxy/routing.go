package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// routeProtocol marks the ip rules and routes the proxy installs
// (rtm_protocol), so a start finds and removes what a killed predecessor
// left, whatever its table.
const routeProtocol = 167

// Routing is what delivers a backend's replies, addressed to a client the
// proxy host does not own, to the proxy's transparent socket: a rule per
// backend (its address, protocol and source port) into a table whose
// routes make every destination local. Rules match the backend's source
// port rather than a mark, so no netfilter rule is needed on the proxy.
type Routing struct {
	Table int
	rules []netlink.Rule
}

// NewRouting plans the rules for cfg's transparent services.
func NewRouting(cfg *Config) *Routing {
	r := &Routing{Table: cfg.Table}
	seen := map[string]bool{}
	for _, s := range cfg.Services {
		if !s.Transparent {
			continue
		}
		proto := unix.IPPROTO_TCP
		if s.UDP {
			proto = unix.IPPROTO_UDP
		}
		for _, b := range s.Backends {
			key := fmt.Sprint(b, proto)
			if seen[key] {
				continue
			}
			seen[key] = true
			rule := netlink.NewRule()
			rule.Family = family4or6(b.Addr())
			rule.Src = prefixNet(netip.PrefixFrom(b.Addr(), b.Addr().BitLen()))
			rule.IPProto = proto
			rule.Sport = netlink.NewRulePortRange(b.Port(), b.Port())
			rule.Table, rule.Priority, rule.Protocol = cfg.Table, cfg.Table, routeProtocol
			r.rules = append(r.rules, *rule)
		}
	}
	return r
}

func family4or6(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func (r *Routing) localRoutes() ([]netlink.Route, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("find lo: %w", err)
	}
	var out []netlink.Route
	for _, p := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		out = append(out, netlink.Route{
			Family: family4or6(p.Addr()), Dst: prefixNet(p), LinkIndex: lo.Attrs().Index, Table: r.Table,
			Type: unix.RTN_LOCAL, Scope: unix.RT_SCOPE_HOST, Protocol: routeProtocol,
		})
	}
	return out, nil
}

// Install removes leftovers of an earlier run, then adds the local routes
// and the rules. A kernel that cannot match rules by port says so.
func (r *Routing) Install() error {
	if err := Cleanup(); err != nil {
		return fmt.Errorf("remove an earlier run's routing: %w", err)
	}
	if len(r.rules) == 0 {
		return nil
	}
	routes, err := r.localRoutes()
	if err != nil {
		return err
	}
	for _, rt := range routes {
		if err := netlink.RouteAdd(&rt); err != nil {
			return errors.Join(fmt.Errorf("add route local %s dev lo table %d: %w", rt.Dst, r.Table, err), Cleanup())
		}
	}
	for _, rule := range r.rules {
		if err := netlink.RuleAdd(&rule); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				err = fmt.Errorf("%w: this kernel cannot match ip rules by protocol and port (Linux 4.17 or newer)", err)
			}
			return errors.Join(fmt.Errorf("add rule from %s sport %d lookup %d: %w", rule.Src, rule.Sport.Start, r.Table, err), Cleanup())
		}
	}
	return r.Check()
}

// Check verifies that the rules and routes are in place.
func (r *Routing) Check() error {
	rules, routes, err := installed()
	if err != nil {
		return err
	}
	if len(rules) != len(r.rules) {
		return fmt.Errorf("%d of the proxy's %d ip rules are in place", len(rules), len(r.rules))
	}
	if len(r.rules) > 0 && len(routes) != 2 {
		return fmt.Errorf("%d of the proxy's 2 local routes (table %d) are in place", len(routes), r.Table)
	}
	return nil
}

// installed lists the rules and routes carrying the proxy's protocol.
func installed() ([]netlink.Rule, []netlink.Route, error) {
	var rules []netlink.Rule
	var routes []netlink.Route
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := netlink.RuleList(fam)
		if err != nil {
			return nil, nil, fmt.Errorf("list ip rules: %w", err)
		}
		for _, r := range rs {
			if r.Protocol == routeProtocol {
				rules = append(rules, r)
			}
		}
		rts, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: routeProtocol}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return nil, nil, fmt.Errorf("list routes: %w", err)
		}
		routes = append(routes, rts...)
	}
	return rules, routes, nil
}

// Cleanup removes every rule and route the proxy installed, this run's or
// a killed one's.
func Cleanup() error {
	rules, routes, err := installed()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range rules {
		if err := netlink.RuleDel(&r); err != nil {
			errs = append(errs, fmt.Errorf("delete rule %v: %w", r, err))
		}
	}
	for _, rt := range routes {
		if err := netlink.RouteDel(&rt); err != nil {
			errs = append(errs, fmt.Errorf("delete route %v: %w", rt, err))
		}
	}
	return errors.Join(errs...)
}

// Leftovers counts the rules and routes the proxy installed that are in
// place.
func Leftovers() (int, error) {
	rules, routes, err := installed()
	return len(rules) + len(routes), err
}
