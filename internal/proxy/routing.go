package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// routeProtocol marks the ip rules and routes the proxy installs
// (rtm_protocol). With the table number as the rules' priority, it tells a
// proxy's own rules and routes from the ones others put in its table.
const routeProtocol = 167

// Routing is what delivers a backend's replies, addressed to a client the
// proxy host does not own, to the proxy's transparent socket: a rule per
// backend (its address, protocol and source port) into a table whose
// routes make every destination local. Rules match the backend's source
// port rather than a mark, so no netfilter rule is needed on the proxy.
//
// A table belongs to one proxy of a network namespace at a time (Claim);
// what a stopped proxy with the same table left there is removed by the
// next start, and nothing in any other table is touched.
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

// Needed says whether any service connects from its clients' addresses,
// the only ones that need rules and routes.
func (r *Routing) Needed() bool { return len(r.rules) > 0 }

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

// ownRule says whether a rule looking up the table is of the kind the
// proxy installs: its protocol and priority, a source and source port.
func (r *Routing) ownRule(rule netlink.Rule) bool {
	return rule.Protocol == routeProtocol && rule.Priority == r.Table && rule.Src != nil && rule.Sport != nil &&
		rule.Mark == 0 && rule.IifName == "" && rule.OifName == "" && !rule.Invert
}

// ownRoute says whether a route of the table is one the proxy installs:
// local default, its protocol.
func ownRoute(rt netlink.Route) bool {
	return rt.Protocol == routeProtocol && rt.Type == unix.RTN_LOCAL && (rt.Dst == nil || prefixLen(rt.Dst) == 0)
}

func prefixLen(n *net.IPNet) int {
	ones, _ := n.Mask.Size()
	return ones
}

// inTable lists the rules that look up the table and the routes it holds,
// IPv4 and IPv6.
func (r *Routing) inTable() ([]netlink.Rule, []netlink.Route, error) {
	rules, err := rulesWhere(func(rule netlink.Rule) bool { return rule.Table == r.Table })
	if err != nil {
		return nil, nil, err
	}
	var routes []netlink.Route
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rts, err := tableRoutes(fam, r.Table)
		if err != nil {
			return nil, nil, fmt.Errorf("list the routes of table %d: %w", r.Table, err)
		}
		routes = append(routes, rts...)
	}
	return rules, routes, nil
}

// rulesWhere lists the IPv4 and IPv6 rules keep takes.
func rulesWhere(keep func(netlink.Rule) bool) ([]netlink.Rule, error) {
	var rules []netlink.Rule
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := netlink.RuleList(fam)
		if err != nil {
			return nil, fmt.Errorf("list ip rules: %w", err)
		}
		for _, r := range rs {
			if keep(r) {
				rules = append(rules, r)
			}
		}
	}
	return rules, nil
}

// tableRoutes lists one table's routes. With strict checking the kernel
// dumps that table alone, rather than every route of a host that may carry
// large tables, each time the proxy checks its routing.
func tableRoutes(fam, table int) ([]netlink.Route, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	_ = h.SetStrictCheck(true) // older kernels: filtered here instead
	routes, err := h.RouteListFiltered(fam, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil // the kernel has no such table yet: it holds nothing
	}
	return routes, err
}

// Install adds the local routes and the rules, after refusing a table that
// holds routes or is looked up by rules the proxy does not install, and
// removing what an earlier run with this table left. A kernel that cannot
// match rules by port says so.
func (r *Routing) Install() error {
	if !r.Needed() {
		return nil
	}
	rules, routes, err := r.inTable()
	if err != nil {
		return err
	}
	var others []string
	for _, rule := range rules {
		if !r.ownRule(rule) {
			others = append(others, describeRule(rule))
		}
	}
	for _, rt := range routes {
		if !ownRoute(rt) {
			others = append(others, describeRoute(rt))
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("routing table %d is in use by routes or rules rampart proxy did not install (%s): give the proxy a free table (table: in its file), or remove them if they are stale", r.Table, strings.Join(others, "; "))
	}
	if err := r.remove(rules, routes); err != nil {
		return fmt.Errorf("remove what an earlier run left in table %d: %w", r.Table, err)
	}
	want, err := r.localRoutes()
	if err != nil {
		return err
	}
	for _, rt := range want {
		if err := netlink.RouteAdd(&rt); err != nil {
			return errors.Join(fmt.Errorf("add route %s: %w", describeRoute(rt), err), r.Remove())
		}
	}
	for _, rule := range r.rules {
		if err := netlink.RuleAdd(&rule); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				err = fmt.Errorf("%w: this kernel cannot match ip rules by protocol and port (Linux 4.17 or newer)", err)
			}
			return errors.Join(fmt.Errorf("add %s: %w", describeRule(rule), err), r.Remove())
		}
	}
	return r.Check()
}

// Check verifies that the rules and routes are in place.
func (r *Routing) Check() error {
	rules, routes, err := r.missing()
	if err != nil {
		return err
	}
	if len(rules)+len(routes) > 0 {
		return fmt.Errorf("not in place: %s", strings.Join(describe(rules, routes), "; "))
	}
	return nil
}

// missing lists the proxy's rules and routes that are not in place.
func (r *Routing) missing() ([]netlink.Rule, []netlink.Route, error) {
	if !r.Needed() {
		return nil, nil, nil
	}
	rules, routes, err := r.inTable()
	if err != nil {
		return nil, nil, err
	}
	have := map[string]bool{}
	for _, rule := range rules {
		if r.ownRule(rule) {
			have[ruleKey(rule)] = true
		}
	}
	for _, rt := range routes {
		if ownRoute(rt) {
			have[fmt.Sprint("route", rt.Family)] = true
		}
	}
	var mrules []netlink.Rule
	for _, rule := range r.rules {
		if !have[ruleKey(rule)] {
			mrules = append(mrules, rule)
		}
	}
	want, err := r.localRoutes()
	if err != nil {
		return nil, nil, err
	}
	var mroutes []netlink.Route
	for _, rt := range want {
		if !have[fmt.Sprint("route", rt.Family)] {
			mroutes = append(mroutes, rt)
		}
	}
	return mrules, mroutes, nil
}

// Repair puts back the rules and routes someone removed, and says which
// were missing.
func (r *Routing) Repair() (missing []string, err error) {
	rules, routes, err := r.missing()
	if err != nil {
		return nil, err
	}
	var errs []error
	// Routes first: a rule into a table without them sends replies nowhere.
	for _, rt := range routes {
		if err := netlink.RouteAdd(&rt); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("add route %s: %w", describeRoute(rt), err))
		}
	}
	for _, rule := range rules {
		if err := netlink.RuleAdd(&rule); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("add %s: %w", describeRule(rule), err))
		}
	}
	return describe(rules, routes), errors.Join(errs...)
}

func ruleKey(rule netlink.Rule) string {
	return fmt.Sprint(rule.Src, rule.IPProto, rule.Sport.Start, rule.Sport.End)
}

// Remove deletes the proxy's rules and routes of its table, and nothing
// else.
func (r *Routing) Remove() error {
	if !r.Needed() {
		return nil
	}
	rules, routes, err := r.inTable()
	if err != nil {
		return err
	}
	return r.remove(rules, routes)
}

// remove deletes the proxy's own among rules and routes.
func (r *Routing) remove(rules []netlink.Rule, routes []netlink.Route) error {
	var errs []error
	for _, rule := range rules {
		if r.ownRule(rule) {
			if err := netlink.RuleDel(&rule); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete %s: %w", describeRule(rule), err))
			}
		}
	}
	for _, rt := range routes {
		if ownRoute(rt) {
			if err := netlink.RouteDel(&rt); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete route %s: %w", describeRoute(rt), err))
			}
		}
	}
	return errors.Join(errs...)
}

// describe names rules and routes as ip rule and ip route show them.
func describe(rules []netlink.Rule, routes []netlink.Route) []string {
	var out []string
	for _, rule := range rules {
		out = append(out, describeRule(rule))
	}
	for _, rt := range routes {
		out = append(out, describeRoute(rt))
	}
	return out
}

func describeRule(rule netlink.Rule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rule %d: ", rule.Priority)
	if rule.Invert {
		b.WriteString("not ")
	}
	b.WriteString("from " + addrOrAll(rule.Src))
	if rule.Dst != nil {
		b.WriteString(" to " + addrOrAll(rule.Dst))
	}
	if rule.Mark != 0 {
		fmt.Fprintf(&b, " fwmark %#x", rule.Mark)
	}
	if rule.IifName != "" {
		b.WriteString(" iif " + rule.IifName)
	}
	switch rule.IPProto {
	case unix.IPPROTO_TCP:
		b.WriteString(" ipproto tcp")
	case unix.IPPROTO_UDP:
		b.WriteString(" ipproto udp")
	}
	if rule.Sport != nil {
		fmt.Fprintf(&b, " sport %d", rule.Sport.Start)
		if rule.Sport.End != rule.Sport.Start {
			fmt.Fprintf(&b, "-%d", rule.Sport.End)
		}
	}
	fmt.Fprintf(&b, " lookup %d", rule.Table)
	return b.String()
}

func describeRoute(rt netlink.Route) string {
	var b strings.Builder
	if name := map[int]string{unix.RTN_LOCAL: "local ", unix.RTN_UNREACHABLE: "unreachable ", unix.RTN_BLACKHOLE: "blackhole ", unix.RTN_PROHIBIT: "prohibit ", unix.RTN_THROW: "throw "}[rt.Type]; name != "" {
		b.WriteString(name)
	}
	if rt.Dst == nil || prefixLen(rt.Dst) == 0 {
		b.WriteString("default")
		if rt.Family == unix.AF_INET6 {
			b.WriteString(" (IPv6)")
		}
	} else {
		b.WriteString(rt.Dst.String())
	}
	if rt.Gw != nil {
		b.WriteString(" via " + rt.Gw.String())
	}
	fmt.Fprintf(&b, " table %d", rt.Table)
	return b.String()
}

// addrOrAll is an address, a prefix when shorter than one, "all" for none.
func addrOrAll(n *net.IPNet) string {
	if n == nil {
		return "all"
	}
	if ones, bits := n.Mask.Size(); ones == bits {
		return n.IP.String()
	}
	return n.String()
}

// installed lists the rules and routes carrying the proxy's protocol, in
// any table.
func installed() ([]netlink.Rule, []netlink.Route, error) {
	rules, err := rulesWhere(func(r netlink.Rule) bool { return r.Protocol == routeProtocol })
	if err != nil {
		return nil, nil, err
	}
	var routes []netlink.Route
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rts, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: routeProtocol}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return nil, nil, fmt.Errorf("list routes: %w", err)
		}
		routes = append(routes, rts...)
	}
	return rules, routes, nil
}

// Cleanup removes every rule and route carrying rampart's protocol in this
// network namespace, whatever its table: for what owns the whole namespace
// (backend-setup --undo, a lab). A proxy removes only its own (Remove), so
// that another proxy in the namespace keeps its routing.
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
