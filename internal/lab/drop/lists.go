package drop

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/lab"
)

// The list-based layers: each drops the flood by looking its source up in
// a list of the flood's own sources, as rampart does, with the tool users
// would pick instead.

// listPeers are the layers that filter by a list, rampart's rivals.
var listPeers = []string{"ipset", "nft-set", "xdp-lpm", "xdp-filter"}

// setupIpset is iptables' answer: a hash:net set of the sources, matched
// in raw PREROUTING. Sets are per network namespace: they go with it.
func setupIpset(r *row) (*active, error) {
	ps := r.traffic.Prefixes()
	family := map[int]string{4: "inet", 6: "inet6"}[r.family]
	var b strings.Builder
	fmt.Fprintf(&b, "create %s hash:net family %s hashsize %d maxelem %d\n", lab.IpsetSet, family, max(1024, len(ps)/2), max(65536, len(ps)))
	for _, p := range ps {
		fmt.Fprintf(&b, "add %s %s\n", lab.IpsetSet, p)
	}
	if err := lab.RestoreIn(r.topo.RxNs, b.String(), "ipset", "restore"); err != nil {
		return nil, err
	}
	if err := r.rule("raw", "PREROUTING", "-m", "set", "--match-set", lab.IpsetSet, "src", "-j", "DROP"); err != nil {
		return nil, err
	}
	return &active{count: lab.IptablesCounter(r.topo.RxNs, r.ipt, "raw", "PREROUTING", "DROP"), teardown: noTeardown}, nil
}

// setupNftSet is nftables' answer: a set of the sources, matched at
// netdev ingress (IPv6 by the source's /64, as the list has them).
func setupNftSet(r *row) (*active, error) {
	ps := r.traffic.Prefixes()
	typ, match := "ipv4_addr", "ip saddr"
	if r.family == 6 {
		typ, match = "ipv6_addr", "ip6 saddr & ffff:ffff:ffff:ffff::"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s {\n\tset flood { type %s; size %d; }\n", lab.NftTable, typ, max(1, len(ps)))
	fmt.Fprintf(&b, "\tchain input {\n\t\ttype filter hook ingress device %q priority -500; policy accept;\n", r.topo.RxIf)
	fmt.Fprintf(&b, "\t\t%s @flood %s udp dport %d counter drop\n\t}\n}\n", match, r.dstMatch(), lab.DstPort)
	// Elements in chunks: one statement of a million elements takes nft
	// far longer to parse than many of fifty thousand.
	for i := 0; i < len(ps); i += 50_000 {
		fmt.Fprintf(&b, "add element netdev %s flood { ", lab.NftTable)
		for j, p := range ps[i:min(len(ps), i+50_000)] {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(p.Addr().String())
		}
		b.WriteString(" }\n")
	}
	if err := lab.RestoreIn(r.topo.RxNs, b.String(), "nft", "-f", "-"); err != nil {
		return nil, err
	}
	return &active{count: r.nftCount, teardown: noTeardown}, nil
}

func (r *row) dstMatch() string {
	if r.family == 6 {
		return "ip6 daddr " + lab.DstNet6.String()
	}
	return "ip daddr " + lab.DstNet4.String()
}

func (r *row) nftCount() (uint64, error) {
	out, err := lab.Output("ip", "netns", "exec", r.topo.RxNs, "nft", "-j", "list", "table", "netdev", lab.NftTable)
	if err != nil {
		return 0, err
	}
	return parseNftCounters(out)
}

// setupXDPLPM is the study's eBPF filter by list: a bare XDP program over
// the kernel's LPM trie, filled one update per prefix (the trie has no
// batch update).
func setupXDPLPM(r *row) (*active, error) {
	if err := r.objs.AddPrefixes(r.traffic.Prefixes()); err != nil {
		return nil, err
	}
	return r.attachXDP(r.objs.LabXdpLpm, link.XDPDriverMode)
}

// floorLayer is the physical floor of any list lookup: one dependent
// random read from an array as large as rampart's tables for the list.
// It is no peer, the reference rampart's row is read against, and so it
// runs whenever rampart's row does.
const floorLayer = "xdp-floor"

// setupXDPFloor attaches lab_xdp_floor; its array was sized at load from
// the traffic's FloorBytes.
func setupXDPFloor(r *row) (*active, error) {
	return r.attachXDP(r.objs.LabXdpFloor, link.XDPDriverMode)
}

// xdpFilterPins is where xdp-filter keeps its maps: one per host.
const xdpFilterPins = "/sys/fs/bpf/xdp-filter"

// setupXDPFilter loads xdp-tools' xdp-filter on the receiving veth with
// its own CLI, then writes the sources into its pinned address map as
// `xdp-filter ip -m src` would (value MAP_FLAG_SRC on every CPU): one exec
// per address would take minutes for the lists this lab uses.
func setupXDPFilter(r *row) (*active, error) {
	if r.family == 6 {
		return nil, lab.SkipError{Reason: "xdp-filter matches exact addresses, and the IPv6 flood's sources are /64s"}
	}
	if _, err := os.Stat(xdpFilterPins); err == nil {
		return nil, lab.SkipError{Reason: "xdp-filter is in use on this host (" + xdpFilterPins + " exists); the lab leaves it alone"}
	}
	if err := datapath.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		return nil, err
	}
	netnsPath := filepath.Join("/var/run/netns", r.topo.RxNs)
	xf := func(args ...string) error {
		// nsenter keeps the host's mount namespace, so xdp-filter finds
		// bpffs; `ip netns exec` would give it a fresh /sys without it.
		return lab.Run(append([]string{"nsenter", "--net=" + netnsPath, "xdp-filter"}, args...)...)
	}
	if err := xf("load", "-m", "native", "-f", "ipv4,udp", r.topo.RxIf); err != nil {
		return nil, err
	}
	teardown := func() error {
		err := xf("unload", r.topo.RxIf)
		os.RemoveAll(xdpFilterPins)
		return err
	}
	fail := func(err error) (*active, error) {
		teardown()
		return nil, err
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(xdpFilterPins, "filter_ipv4"), nil)
	if err != nil {
		return fail(fmt.Errorf("xdp-filter's address map: %w", err))
	}
	defer m.Close()
	if n := m.MaxEntries(); r.traffic.Count > n {
		return fail(lab.SkipError{Reason: fmt.Sprintf("xdp-filter holds at most %d addresses (its map's max_entries), the list has %d", n, r.traffic.Count)})
	}
	flags := make([]uint64, ebpf.MustPossibleCPU())
	for i := range flags {
		flags[i] = 1 // MAP_FLAG_SRC
	}
	for _, p := range r.traffic.Prefixes() {
		a := p.Addr().As4()
		if err := m.Put(binary.NativeEndian.Uint32(a[:]), flags); err != nil {
			return fail(fmt.Errorf("xdp-filter's address map: %w", err))
		}
	}
	stats, err := ebpf.LoadPinnedMap(filepath.Join(xdpFilterPins, "xdp_stats_map"), nil)
	if err != nil {
		return fail(fmt.Errorf("xdp-filter's statistics: %w", err))
	}
	count := func() (uint64, error) {
		// struct datarec {rx_packets, rx_bytes} per CPU, at key XDP_DROP.
		var recs [][2]uint64
		if err := stats.Lookup(uint32(1), &recs); err != nil {
			return 0, err
		}
		var n uint64
		for _, rec := range recs {
			n += rec[0]
		}
		return n, nil
	}
	return &active{count: count, teardown: func() error { stats.Close(); return teardown() }, mode: "xdp-native"}, nil
}
