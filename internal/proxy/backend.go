package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// BackendSetup is the return routing a backend needs: its replies to
// proxied connections carry the client's address as destination and must
// go back through the proxy, not by the backend's default route. The two
// ways the blog post "UDP SndbufErrors & ENOBUFS" describes: by source (the backend's address and service
// ports) or by mark (connections that arrive from the proxy's MAC address
// are marked, and their replies routed by the mark).
type BackendSetup struct {
	Proxies []netip.Addr // one per family at most
	By      string       // source or mark
	Ports   []uint16
	Table   int
}

// nftTable holds the by-mark rules; deleting it undoes them.
const nftTable = "rampart_proxy_return"

// Install adds the rules and the tables' routes via the proxy.
func (b BackendSetup) Install() error {
	if err := b.Undo(); err != nil {
		return err
	}
	var macs []string
	for _, p := range b.Proxies {
		mac, err := b.install(p)
		if err != nil {
			return errors.Join(err, b.Undo())
		}
		if mac != "" && !slices.Contains(macs, mac) {
			macs = append(macs, mac)
		}
	}
	if len(macs) == 0 {
		return nil
	}
	// nft rather than google/nftables: two fixed rules in a table of their
	// own, deleted whole by Undo. The output chain reroutes a reply the
	// kernel has already found a route for: the backend needs a default
	// route (any) for --by mark.
	script := fmt.Sprintf(`table inet %[1]s {
  chain prerouting { type filter hook prerouting priority mangle; ether saddr { %[2]s } ct state new ct mark set %[3]d; }
  chain output { type route hook output priority mangle; ct mark %[3]d meta mark set %[3]d; }
}
`, nftTable, strings.Join(macs, ", "), b.Table)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return errors.Join(fmt.Errorf("nft: %v: %s", err, out), b.Undo())
	}
	return nil
}

// install adds one family's rules and route; for --by mark it returns the
// proxy's MAC address for the nft rules.
func (b BackendSetup) install(proxy netip.Addr) (mac string, err error) {
	rt, err := netlink.RouteGet(proxy.AsSlice())
	if err != nil || len(rt) == 0 {
		return "", fmt.Errorf("no route to the proxy %s: %v", proxy, err)
	}
	src, ok := netip.AddrFromSlice(rt[0].Src)
	if !ok {
		return "", fmt.Errorf("no source address towards the proxy %s", proxy)
	}
	src = src.Unmap()
	fam := family4or6(proxy)
	var rules []*netlink.Rule
	switch b.By {
	case "source":
		if len(b.Ports) == 0 {
			return "", errors.New("--port is required with --by source: the ports the backend's services listen on")
		}
		for _, port := range b.Ports {
			for _, proto := range []int{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
				r := netlink.NewRule()
				r.Family, r.Src, r.IPProto = fam, prefixNet(netip.PrefixFrom(src, src.BitLen())), proto
				r.Sport = netlink.NewRulePortRange(port, port)
				rules = append(rules, r)
			}
		}
	case "mark":
		if mac, err = neighborMAC(proxy, rt[0].LinkIndex); err != nil {
			return "", err
		}
		r := netlink.NewRule()
		r.Family, r.Mark = fam, uint32(b.Table)
		rules = append(rules, r)
	default:
		return "", fmt.Errorf("--by %q: source or mark", b.By)
	}
	def := netip.MustParsePrefix("0.0.0.0/0")
	if fam == unix.AF_INET6 {
		def = netip.MustParsePrefix("::/0")
	}
	route := netlink.Route{Family: fam, Dst: prefixNet(def), Gw: proxy.AsSlice(), LinkIndex: rt[0].LinkIndex, Table: b.Table, Protocol: routeProtocol}
	if err := netlink.RouteAdd(&route); err != nil {
		return "", fmt.Errorf("add default via %s table %d: %w", proxy, b.Table, err)
	}
	for _, r := range rules {
		r.Table, r.Priority, r.Protocol = b.Table, b.Table, routeProtocol
		if err := netlink.RuleAdd(r); err != nil {
			return "", fmt.Errorf("add rule %v: %w", r, err)
		}
	}
	return mac, nil
}

// Undo removes the return routing (rules, routes, the nft table).
func (b BackendSetup) Undo() error {
	err := Cleanup()
	if out, nerr := exec.Command("nft", "list", "table", "inet", nftTable).CombinedOutput(); nerr == nil {
		if out, derr := exec.Command("nft", "delete", "table", "inet", nftTable).CombinedOutput(); derr != nil {
			err = errors.Join(err, fmt.Errorf("nft delete table: %v: %s", derr, out))
		}
	} else {
		_ = out // no such table: nothing to undo
	}
	return err
}

// neighborMAC finds the proxy's link-layer address, prompting the kernel
// to resolve it when it is not known yet.
func neighborMAC(ip netip.Addr, link int) (string, error) {
	for try := 0; try < 20; try++ {
		neighs, err := netlink.NeighList(link, family4or6(ip))
		if err != nil {
			return "", err
		}
		for _, n := range neighs {
			if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip && len(n.HardwareAddr) == 6 && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_PERMANENT|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
				return n.HardwareAddr.String(), nil
			}
		}
		if c, err := net.Dial("udp", netip.AddrPortFrom(ip, 9).String()); err == nil {
			c.Write([]byte{0})
			c.Close()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("the proxy %s's MAC address is not known: is it on this backend's link? (--by mark needs it there; --by source does not)", ip)
}
