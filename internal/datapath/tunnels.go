package datapath

import (
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/rampart-fw/rampart/internal/netns"
)

// tunnelKinds are the link kinds that decapsulate: a packet arrives on the
// underlay interface wrapped, and its inner packet enters the stack again
// on the tunnel device, where only a hook on that device sees it.
var tunnelKinds = []string{"vxlan", "geneve", "gre", "gretap", "ip6gre", "ip6gretap", "erspan", "ip6erspan",
	"ipip", "ip6tnl", "sit", "vti", "vti6", "xfrm", "wireguard", "bareudp", "gtp", "amt"}

// Tunnel is a tunnel device of a namespace.
type Tunnel struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
}

// Tunnels lists the tunnel devices of the namespace.
func Tunnels(ns string) ([]Tunnel, error) {
	var out []Tunnel
	err := netns.Run(ns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if kind := l.Type(); slices.Contains(tunnelKinds, kind) {
				out = append(out, Tunnel{Name: l.Attrs().Name, Kind: kind})
			}
		}
		return nil
	})
	return out, err
}
