package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/netns"
)

// measure runs one method at one size once: a fresh topology, the
// filter set up (timed), a check that it drops a listed destination, then
// UDP at saturation, one TCP connection and ping; everything torn down
// after.
func measure(ctx context.Context, o Options, m method, list listFile, seq int, cpu lab.CPUPlan) (map[string]float64, error) {
	if missing := lab.MissingTool(m.tools); missing != "" {
		return nil, lab.SkipError{Reason: missing}
	}
	topo, err := lab.NewTopology(seq, cpu.Rx)
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	defer topo.Close()
	for _, step := range [][]string{
		{"ip", "-n", topo.RxNs, "route", "add", "local", servedNet.String(), "dev", "lo"},
		{"ip", "-n", topo.GenNs, "route", "add", servedNet.String(), "via", lab.RxAddr4.String()},
		{"ip", "-n", topo.GenNs, "neigh", "replace", lab.RxAddr4.String(), "lladdr", topo.RxMAC.String(), "dev", topo.GenIf, "nud", "permanent"},
	} {
		if err := lab.Run(step...); err != nil {
			return nil, err
		}
	}
	r := &row{topo: topo, list: list.prefixes, file: list.file, dir: o.Dir, ipt: lab.IptablesFor(4)}
	s := map[string]float64{}
	start := time.Now()
	err = m.setup(r)
	s[MetricSetup] = time.Since(start).Seconds()
	if r.objs != nil {
		defer r.objs.Close()
	}
	if r.rampart != nil {
		defer r.rampart.Detach() // its state goes with the row; the namespace takes the link
	}
	if err != nil {
		return nil, lab.SetupError(m.name, err)
	}
	if s[MetricSetup] > o.Budget.Seconds() {
		return nil, lab.SkipError{Reason: fmt.Sprintf("set-up took %.0f s, over the %v budget", s[MetricSetup], o.Budget)}
	}
	if err := topo.PinNAPI(); err != nil {
		return nil, err
	}
	if err := r.checkFilter(m.name == "none"); err != nil {
		return nil, err
	}
	if s[MetricTCP], err = r.tcpRate(ctx, o, cpu); err != nil {
		return nil, fmt.Errorf("TCP: %w", err)
	}
	if s[MetricPingAvg], s[MetricPingP99], err = r.ping(ctx, o); err != nil {
		return nil, fmt.Errorf("ping: %w", err)
	}
	// A veth hands a TSO sender's packets to its peer by the sending
	// CPU's backlog, which would put the server's receive work on the
	// client's CPU; without TSO they go by the peer's NAPI, on the
	// server's. TCP and ping were measured with TSO, as the study's NICs
	// had it (ping by the backlog: the NAPI thread's wake-ups are noise at
	// its scale).
	if err := lab.InNs(r.topo.GenNs, "ethtool", "-K", r.topo.GenIf, "tso", "off"); err != nil {
		return nil, err
	}
	if s[MetricUDP], err = r.udpRate(ctx, o, cpu.Gen); err != nil {
		return nil, fmt.Errorf("UDP: %w", err)
	}
	if s[MetricCPU], err = r.cpuAtRate(ctx, o, cpu.Gen); err != nil {
		return nil, fmt.Errorf("UDP at 1 Gbit/s: %w", err)
	}
	return s, nil
}

// destinations draws the traffic's destinations: many addresses of
// trafficNet, none listed (lookups walk the structure as real traffic
// does), or the study's one.
func destinations(o Options) []netip.Addr {
	if o.Destinations == "one" {
		return []netip.Addr{trafficNet.Addr().Next()}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]netip.Addr, 4096)
	base := binary.BigEndian.Uint32(trafficNet.Addr().AsSlice())
	for i := range out {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], base|rng.Uint32()&0xffff)
		out[i] = netip.AddrFrom4(a)
	}
	return out
}

// checkFilter sends datagrams to a listed destination the server answers
// for: with a filter none may arrive; without, they must (else the check
// proves nothing).
func (r *row) checkFilter(unfiltered bool) error {
	var got int
	err := netns.Run(r.topo.RxNs, func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: probePort})
		if err != nil {
			return err
		}
		defer c.Close()
		if err := netns.Run(r.topo.GenNs, func() error {
			s, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(probeAddr, probePort)))
			if err != nil {
				return err
			}
			defer s.Close()
			for range 20 {
				s.Write([]byte("probe")) // a filter's drop may be reported as an error: that is the point
			}
			return nil
		}); err != nil {
			return err
		}
		got = countUDP(c, 200*time.Millisecond)
		return nil
	})
	switch {
	case err != nil:
		return fmt.Errorf("filter check: %w", err)
	case unfiltered && got == 0:
		return fmt.Errorf("filter check: no probe reached the server without a filter")
	case !unfiltered && got > 0:
		return fmt.Errorf("filter check: %d of 20 datagrams to the listed %s got through", got, probeAddr)
	}
	return nil
}

func countUDP(c *net.UDPConn, idle time.Duration) int {
	buf := make([]byte, 64)
	n := 0
	for {
		c.SetReadDeadline(time.Now().Add(idle))
		if _, err := c.Read(buf); err != nil {
			return n
		}
		n++
	}
}

// udpRate sends UDP as fast as one client CPU can, spread over the
// destinations with sendmmsg, and returns the Mpps the server's interface
// received: what left the client through its filter. 18-byte payloads: the
// minimum frame, as the study's UDP test.
func (r *row) udpRate(ctx context.Context, o Options, clientCPU int) (float64, error) {
	iface, err := lab.RxCounter(r.topo)
	if err != nil {
		return 0, err
	}
	defer iface.Close()
	var before, after uint64
	var start time.Time
	var dt time.Duration
	err = r.sendUDP(ctx, o, clientCPU, 18, 0, func(window bool) error {
		var err error
		if window {
			before, err = iface.RxPackets()
			start = time.Now()
		} else {
			after, err = iface.RxPackets()
			dt = time.Since(start)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	return float64(after-before) / dt.Seconds() / 1e6, nil
}

// cpuAtRate sends 1 Gbit/s of UDP (1,400-byte payloads) and returns how
// busy the client's CPU was, in percent: what filtering a fixed load costs.
func (r *row) cpuAtRate(ctx context.Context, o Options, clientCPU int) (float64, error) {
	var before, after lab.CPUTimes
	err := r.sendUDP(ctx, o, clientCPU, 1400, 1e9, func(window bool) error {
		var err error
		if window {
			before, err = lab.ReadCPU(clientCPU)
		} else {
			after, err = lab.ReadCPU(clientCPU)
		}
		return err
	})
	return 100 * after.BusySince(before), err
}

// sendUDP sends from a thread in the client's namespace pinned to its CPU,
// in sendmmsg batches of 64 spread over the destinations, at bitsPerSec
// (0: as fast as it can): a quarter window to warm up, then mark(true), a
// window, mark(false).
func (r *row) sendUDP(ctx context.Context, o Options, clientCPU, size int, bitsPerSec float64, mark func(window bool) error) error {
	var addrs []net.Addr
	for _, d := range destinations(o) {
		addrs = append(addrs, net.UDPAddrFromAddrPort(netip.AddrPortFrom(d, udpSinkPort)))
	}
	msgs := make([]ipv4.Message, 64)
	payload := make([]byte, size)
	for i := range msgs {
		msgs[i].Buffers = [][]byte{payload}
	}
	done := make(chan error, 1)
	go func() {
		done <- netns.Run(r.topo.GenNs, func() error {
			if err := lab.PinThread(0, clientCPU); err != nil {
				return err
			}
			c, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer c.Close()
			pc := ipv4.NewPacketConn(c)
			send := func(d time.Duration) {
				start := time.Now()
				for n := 0; time.Since(start) < d && ctx.Err() == nil; n++ {
					for i := range msgs {
						msgs[i].Addr = addrs[(n*len(msgs)+i)%len(addrs)]
					}
					pc.WriteBatch(msgs, 0) // a full queue refuses some: what arrives is counted
					if bitsPerSec > 0 {    // paced: wait for the schedule of what was sent
						due := time.Duration(float64((n+1)*len(msgs)*size*8) / bitsPerSec * 1e9)
						time.Sleep(due - time.Since(start))
					}
				}
			}
			send(o.Window / 4)
			if err := mark(true); err != nil {
				return err
			}
			send(o.Window)
			return mark(false)
		})
	}()
	return <-done
}

// tcpRate is one TCP connection's throughput, iperf3 against iperf3, the
// client on the client's CPU and the server on the server's.
func (r *row) tcpRate(ctx context.Context, o Options, cpu lab.CPUPlan) (float64, error) {
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", r.topo.RxNs, "taskset", "-c", strconv.Itoa(cpu.Rx), "iperf3", "-s", "-1", "-p", strconv.Itoa(iperfPort))
	if err := srv.Start(); err != nil {
		return 0, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	dst := trafficNet.Addr().Next().String()
	secs := strconv.FormatFloat(max(1, o.Window.Seconds()), 'f', 0, 64)
	for try := 0; ; try++ { // until the server listens
		// iperf3 -J reports its errors in the JSON, with a non-zero exit.
		out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", r.topo.GenNs, "taskset", "-c", strconv.Itoa(cpu.Gen), "iperf3", "-c", dst,
			"-p", strconv.Itoa(iperfPort), "-t", secs, "-J").Output()
		gbps, err := lab.ParseIperf(out)
		if err == nil || try == 50 || ctx.Err() != nil || !strings.Contains(err.Error(), "refused") {
			return gbps, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var pingTime = regexp.MustCompile(`time=([0-9.]+) ms`)

// ping sends pingCount echo requests 1 ms apart to a destination of the
// traffic's range and returns the mean and the 99th percentile RTT in µs.
func (r *row) ping(ctx context.Context, o Options) (avg, p99 float64, err error) {
	dst := destinations(o)[0].String()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", r.topo.GenNs, "ping", "-n", "-i", "0.001", "-c", strconv.Itoa(pingCount), "-W", "1", dst).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("ping: %w", err)
	}
	return parsePing(out)
}

// parsePing reads every reply's time from ping's output.
func parsePing(out []byte) (avg, p99 float64, err error) {
	var rtts []float64
	for _, m := range pingTime.FindAllSubmatch(out, -1) {
		v, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			return 0, 0, err
		}
		rtts = append(rtts, v*1000)
	}
	if len(rtts) == 0 {
		return 0, 0, errors.New("no replies")
	}
	var sum float64
	for _, v := range rtts {
		sum += v
	}
	slices.Sort(rtts)
	return sum / float64(len(rtts)), lab.Percentile(rtts, 0.99), nil
}

// setupIptables is the study's first method: one OUTPUT rule per
// prefix, loaded with iptables-restore.
func setupIptables(r *row) error {
	var b strings.Builder
	b.WriteString("*filter\n:OUTPUT ACCEPT [0:0]\n")
	for _, p := range r.list {
		fmt.Fprintf(&b, "-A OUTPUT -d %s -j DROP\n", p)
	}
	b.WriteString("COMMIT\n")
	return lab.RestoreIn(r.topo.GenNs, b.String(), r.ipt+"-restore", "-w", "--noflush")
}

// setupIpset: a hash:net set and one OUTPUT rule.
func setupIpset(r *row) error {
	var b strings.Builder
	fmt.Fprintf(&b, "create %s hash:net family inet hashsize %d maxelem %d\n", lab.IpsetSet, max(1024, len(r.list)/2), max(65536, len(r.list)))
	for _, p := range r.list {
		fmt.Fprintf(&b, "add %s %s\n", lab.IpsetSet, p)
	}
	if err := lab.RestoreIn(r.topo.GenNs, b.String(), "ipset", "restore", "-exist"); err != nil {
		return err
	}
	return lab.InNs(r.topo.GenNs, r.ipt, "-w", "-A", "OUTPUT", "-m", "set", "--match-set", lab.IpsetSet, "dst", "-j", "DROP")
}

// setupNft: what a user of nftables writes today, an interval set
// (auto-merge: the list's prefixes overlap) and one output rule.
func setupNft(r *row) error {
	var b strings.Builder
	fmt.Fprintf(&b, "table ip %s {\n\tset deny { type ipv4_addr; flags interval; auto-merge; }\n", lab.NftTable)
	b.WriteString("\tchain out {\n\t\ttype filter hook output priority 0; policy accept;\n\t\tip daddr @deny counter drop\n\t}\n}\n")
	for i := 0; i < len(r.list); i += 50_000 {
		fmt.Fprintf(&b, "add element ip %s deny { ", lab.NftTable)
		for j, p := range r.list[i:min(len(r.list), i+50_000)] {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(p.String())
		}
		b.WriteString(" }\n")
	}
	return lab.RestoreIn(r.topo.GenNs, b.String(), "nft", "-f", "-")
}

// setupTCLPM is the study's eBPF filter: a clsact qdisc on the
// client's interface and a cls_bpf program over the kernel's LPM trie at
// egress, the trie filled one update per prefix.
func setupTCLPM(r *row) error {
	var err error
	if r.objs, err = lab.LoadLPM(len(r.list)); err != nil {
		return err
	}
	if err := r.objs.AddPrefixes(r.list); err != nil {
		return err
	}
	return lab.AttachTC(r.topo.GenNs, r.topo.GenIndex, true, r.objs.LabTcLpmDst, "lab_tc_lpm_dst")
}

const egressPolicy = `lists:
  deny: {files: [%s], family: 4}
rules:
  - {name: deny, dst: deny, action: drop}
default: pass
`

// setupRampart applies a policy with the list through the engine, at
// the client's egress, as `rampart apply --egress` does.
func setupRampart(r *row) error {
	file := filepath.Join(r.dir, fmt.Sprintf("egress-%d.yaml", len(r.list)))
	var err error
	r.rampart, err = lab.ApplyRampart(r.dir, r.topo.GenNs, r.topo.GenIf, file, fmt.Sprintf(egressPolicy, r.file), true)
	return err
}
