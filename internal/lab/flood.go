package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/stats"
)

// The floods of `rampart lab flood`.
const (
	FloodSYN     = "syn"     // SYNs from random sources to the TCP service
	FloodUDP     = "udp"     // UDP from random sources to the UDP service
	FloodSources = "sources" // UDP from a fixed set of sources, each far over a fair share
	floodNone    = "none"    // the unflooded baseline of the legitimate clients
)

// FloodNames lists the floods in the study's order.
var FloodNames = []string{FloodSYN, FloodUDP, FloodSources}

// A defence is one row of the flood study.
type defence struct {
	name   string
	floods []string // the floods it is a defence against
	tools  []string
	setup  func(r *floodRow) (*defenceActive, error)
}

// defenceActive is a defence while it runs: what it counts of the flood.
type defenceActive struct {
	// stopped counts flood packets kept from the service, dropped or
	// answered without state; answered counts the SYN-ACKs among them.
	stopped, answered func() (uint64, error)
	mode              string
}

// Defences are the rows: nothing, the kernel's SYN cookies, iptables'
// SYNPROXY, rampart's SYN cookies; against the UDP floods, what an operator
// can do today (drop the service's port: the flood's cost, and the clients
// lost with it) and rampart's limit.
var Defences = []defence{
	{"none", []string{FloodSYN, FloodUDP, FloodSources}, nil, setupNoDefence},
	{"kernel-syncookies", []string{FloodSYN}, nil, setupKernelCookies},
	{"iptables-synproxy", []string{FloodSYN}, []string{"iptables"}, setupSynproxy},
	{"rampart-syncookie", []string{FloodSYN}, nil, setupRampartCookies},
	{"rampart-drop", []string{FloodUDP, FloodSources}, nil, setupRampartDrop},
	{"rampart-limit", []string{FloodUDP, FloodSources}, nil, setupRampartLimit},
}

// DefenceNames lists the rows in order.
func DefenceNames() []string {
	var n []string
	for _, d := range Defences {
		n = append(n, d.name)
	}
	return n
}

// FloodOptions configure `rampart lab flood`.
type FloodOptions struct {
	Floods   []string // empty: all
	Defences []string // empty: all
	Families []int
	Warmup   time.Duration
	Window   time.Duration
	TCPRate  int // legitimate connections per second
	UDPRate  int // legitimate requests per second
	Sources  int // the sources flood's sources
	Dir      string
	Progress Progress
}

// Defaults for a full run and for --quick.
var (
	FloodFull  = FloodOptions{Warmup: time.Second, Window: 10 * time.Second, TCPRate: 100, UDPRate: 200, Sources: 1000}
	FloodQuick = FloodOptions{Warmup: 500 * time.Millisecond, Window: 2 * time.Second, TCPRate: 100, UDPRate: 200, Sources: 1000}
)

// Validate checks the options before anything is created.
func (o *FloodOptions) Validate() error {
	for _, f := range o.Floods {
		if !slices.Contains(FloodNames, f) {
			return fmt.Errorf("--floods: unknown flood %q: choose from %s", f, strings.Join(FloodNames, ", "))
		}
	}
	for _, d := range o.Defences {
		if !slices.Contains(DefenceNames(), d) {
			return fmt.Errorf("--defences: unknown defence %q: choose from %s", d, strings.Join(DefenceNames(), ", "))
		}
	}
	for _, f := range o.Families {
		if f != 4 && f != 6 {
			return fmt.Errorf("--family %d: choose 4, 6 or both", f)
		}
	}
	switch {
	case o.Window <= 0 || o.Warmup < 0:
		return errors.New("--window must be positive and --warmup not negative")
	case o.TCPRate < 1 || o.UDPRate < 1:
		return errors.New("--tcp-rate and --udp-rate must be at least 1")
	case o.Sources < 1 || o.Sources > 1<<24:
		return errors.New("--sources must be 1 to 16777216")
	}
	return nil
}

// FloodResult is one row: a defence against a flood, one family, with the
// legitimate traffic that flood competes with.
type FloodResult struct {
	Defence string `json:"defence"`
	Flood   string `json:"flood"` // "none": the legitimate clients alone, the baseline
	Family  int    `json:"family"`
	Legit   string `json:"legit"` // tcp: connect, request, reply, close; udp: request and reply
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Mode    string `json:"mode,omitempty"`
	// The legitimate clients: requests started in the window, the share
	// answered within the timeout, and the latency of those answered.
	LegitRequests int     `json:"legit_requests"`
	LegitSuccess  float64 `json:"legit_success"` // 0-1
	LegitP50Ms    float64 `json:"legit_p50_ms"`
	LegitP99Ms    float64 `json:"legit_p99_ms"`
	// What became of those that failed: timeout, refused, reset, closed.
	LegitErrors    map[string]int `json:"legit_errors,omitempty"`
	P99VsUnflooded float64        `json:"p99_vs_unflooded,omitempty"`
	// The flood: what the generator sent, what reached the receiving
	// interface, what the defence kept from the service (dropped, or
	// answered without keeping state) and the SYN-ACKs it answered with.
	OfferedMPPS  float64 `json:"offered_mpps"`
	ReceivedMPPS float64 `json:"received_mpps"`
	DroppedMPPS  float64 `json:"dropped_mpps"`
	AnsweredMPPS float64 `json:"answered_mpps,omitempty"`
	// The receiving CPU: busy share (0-1), its time per packet received,
	// and SYN-ACKs answered per second per busy core.
	CPUBusy         float64 `json:"cpu_busy"`
	NsPerPacket     float64 `json:"ns_per_packet"`
	AnsweredPerCore float64 `json:"answered_mpps_per_core,omitempty"`
}

// FloodEnv is what the numbers depend on.
type FloodEnv struct {
	Host
	GeneratorCPU int    `json:"generator_cpu"`
	ReceiveCPU   int    `json:"receive_cpu"`
	Warmup       string `json:"warmup"`
	Window       string `json:"window"`
	TCPRate      int    `json:"legit_tcp_per_second"`
	UDPRate      int    `json:"legit_udp_per_second"`
	Clients      int    `json:"legit_client_addresses"`
	Timeout      string `json:"legit_timeout"`
	Sources      int    `json:"sources_flood_sources"`
	Iptables     string `json:"iptables"`
}

// FloodReport is the whole run.
type FloodReport struct {
	Env     FloodEnv      `json:"environment"`
	Results []FloodResult `json:"results"`
	Checks  []Check       `json:"checks"`
}

// The legitimate clients' side: their network, routed through the
// generator's namespace (the Internet), so that their traffic and the flood
// reach the receiving interface together.
var (
	clientNet4  = netip.MustParsePrefix("198.19.0.0/24")
	clientNet6  = netip.MustParsePrefix("fd01::/64")
	clientCount = 100 // addresses the clients spread their requests over
)

const (
	settle       = time.Second // between rows
	tcpPort      = 80
	udpPort      = 53
	legitTimeout = time.Second
)

// The rampart policies of the two rampart rows.
const (
	cookiePolicy = `rules:
  - {name: syn-web, dport: %d, action: syncookie}
default: pass
`
	dropPolicy = `rules:
  - {name: udp-closed, proto: udp, dport: %d, action: drop}
default: pass
`
	limitPolicy = `rules:
  - {name: udp-fair-share, proto: udp, dport: %d, action: limit, rate: 50/s, burst: 20, per: source}
default: pass
`
)

// floodPlan is one row to run.
type floodPlan struct {
	def    defence
	flood  string
	family int
	res    FloodResult
}

// Flood runs the flood study. It always removes what it created, also
// when ctx is cancelled; a row that cannot run is reported as skipped or
// failed and the run goes on.
func Flood(ctx context.Context, o FloodOptions) (*FloodReport, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Dir == "" {
		return nil, errors.New("lab: FloodOptions need Dir")
	}
	for _, f := range []*datapath.Feature{datapath.FeatureLiveFrames} {
		if err := datapath.Require(f); err != nil {
			return nil, err
		}
	}
	sweepStale()
	defer os.RemoveAll(PinRoot())
	if missing := missingTool([]string{"ip", "ethtool", "sysctl"}); missing != "" {
		return nil, errors.New(missing)
	}
	cpu := cpus()
	rep := &FloodReport{Env: FloodEnv{
		Host: thisHost(), GeneratorCPU: cpu.gen, ReceiveCPU: cpu.rx,
		Warmup: o.Warmup.String(), Window: o.Window.String(), TCPRate: o.TCPRate, UDPRate: o.UDPRate,
		Clients: clientCount, Timeout: legitTimeout.String(), Sources: o.Sources, Iptables: iptablesFor(4),
	}}
	var plans []*floodPlan
	floods := o.Floods
	if len(floods) == 0 {
		floods = FloodNames
	}
	// The baselines first: each kind of legitimate traffic, no flood.
	for _, fam := range o.Families {
		for _, legit := range []string{"tcp", "udp"} {
			if slices.ContainsFunc(floods, func(f string) bool { return legitOf(f) == legit }) {
				plans = append(plans, &floodPlan{def: Defences[0], flood: floodNone, family: fam,
					res: FloodResult{Defence: "none", Flood: floodNone, Family: fam, Legit: legit, Status: StatusOK}})
			}
		}
	}
	for _, fam := range o.Families {
		for _, f := range floods {
			for _, d := range Defences {
				if slices.Contains(d.floods, f) && (len(o.Defences) == 0 || slices.Contains(o.Defences, d.name)) {
					plans = append(plans, &floodPlan{def: d, flood: f, family: fam,
						res: FloodResult{Defence: d.name, Flood: f, Family: fam, Legit: legitOf(f), Status: StatusOK}})
				}
			}
		}
	}
	for i, p := range plans {
		o.Progress.say(fmt.Sprintf("row %d/%d: %s against %s flood, IPv%d", i+1, len(plans), p.def.name, p.flood, p.family))
		// The kernel dismantles the last row's namespaces in the
		// background, on the CPUs the next row measures.
		if i > 0 && !sleepCtx(ctx.Done(), settle) {
			break
		}
		err := runFloodRow(ctx, o, p, i+1, cpu)
		if ctx.Err() != nil {
			rep.Results = floodResults(plans)
			return rep, ctx.Err()
		}
		if err != nil {
			p.res.Status, p.res.Reason = failure(err)
		}
	}
	rep.Results = floodResults(plans)
	rep.finish()
	return rep, nil
}

// legitOf is the legitimate traffic a flood competes with.
func legitOf(flood string) string {
	if flood == FloodSYN {
		return "tcp"
	}
	return "udp"
}

func floodResults(plans []*floodPlan) []FloodResult {
	out := make([]FloodResult, 0, len(plans))
	for _, p := range plans {
		out = append(out, p.res)
	}
	return out
}

// floodRow is what a defence's setup works with.
type floodRow struct {
	topo   *topology
	family int
	dir    string
	ipt    string
}

// runFloodRow measures one row: a fresh topology, the defence, the
// servers, the generator (unless the row is a baseline), the legitimate
// clients over the window.
func runFloodRow(ctx context.Context, o FloodOptions, p *floodPlan, seq int, cpu cpuPlan) (err error) {
	if missing := missingTool(p.def.tools); missing != "" {
		return skipError{missing}
	}
	topo, err := newTopology(seq, cpu.rx)
	if err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	defer topo.close()
	f, err := floodFor(p.flood, p.family, o.Sources)
	if err != nil {
		return err
	}
	objs, err := loadObjects(topo, f)
	if err != nil {
		return err
	}
	defer objs.Close()
	cl, err := addClients(topo, objs, cpu.gen)
	if err != nil {
		return fmt.Errorf("clients: %w", err)
	}
	defer cl.close()
	r := &floodRow{topo: topo, family: p.family, dir: o.Dir, ipt: iptablesFor(p.family)}
	act, err := p.def.setup(r)
	if err != nil {
		var skip skipError
		if errors.As(err, &skip) {
			return err
		}
		return fmt.Errorf("set up %s: %w", p.def.name, err)
	}
	p.res.Mode = act.mode
	srv, err := startServers(topo, p.family)
	if err != nil {
		return fmt.Errorf("servers: %w", err)
	}
	defer srv.close()
	if err := topo.pinNAPI(); err != nil {
		return err
	}
	for _, pid := range topo.napiPIDs {
		if err := realTime(pid); err != nil {
			return err
		}
	}
	iface, err := rxCounter(topo)
	if err != nil {
		return err
	}
	defer iface.close()

	prime(cl, p.family)
	var gen *generator
	if p.flood != floodNone {
		gen = startGenerator(objs, topo, f.frame(topo.genMAC, topo.rxMAC), cpu.gen)
	}
	err = func() error {
		if !sleepCtx(ctx.Done(), o.Warmup) {
			return ctx.Err()
		}
		before, err := floodSample(act, objs, iface, cpu.rx)
		if err != nil {
			return err
		}
		rate := o.TCPRate
		if p.res.Legit == "udp" {
			rate = o.UDPRate
		}
		load := startLegit(cl, p.res.Legit, p.family, rate)
		if !sleepCtx(ctx.Done(), o.Window) {
			load.stop()
			return ctx.Err()
		}
		after, err := floodSample(act, objs, iface, cpu.rx)
		load.stop()
		if err != nil {
			return err
		}
		after.since(before, &p.res)
		load.summarise(&p.res)
		o.Progress.say(fmt.Sprintf("%s against %s flood, IPv%d: %.1f%% of legitimate %s answered, %.2f Mpps offered",
			p.def.name, p.flood, p.family, 100*p.res.LegitSuccess, p.res.Legit, p.res.OfferedMPPS))
		return nil
	}()
	if gen != nil {
		if gerr := gen.halt(); err == nil {
			err = gerr
		}
	}
	return err
}

// floodFor is a flood's traffic: SYNs to the TCP service or UDP to the UDP
// service, from 2^24 random sources (IPv6: /64s), or from n sources.
func floodFor(name string, family, n int) (*flood, error) {
	src := DefaultSrc4
	if family == 6 {
		src = DefaultSrc6
	}
	count := 1 << 24
	if name == FloodSources {
		count = n
	}
	f, err := newFlood(family, src, count)
	if err != nil {
		return nil, err
	}
	f.port = udpPort
	if name == FloodSYN || name == floodNone {
		f.proto, f.port = unix.IPPROTO_TCP, tcpPort
	}
	return f, nil
}

// floodCounts is one reading of what a row watches.
type floodCounts struct {
	at                time.Time
	generated, rx     uint64
	stopped, answered uint64
	cpu               cpuTimes
}

func floodSample(act *defenceActive, objs *labObjects, iface *ifaceCounter, rxCPU int) (c floodCounts, err error) {
	c.at = time.Now()
	if c.generated, err = generated(objs); err != nil {
		return c, err
	}
	if c.rx, err = iface.rxPackets(); err != nil {
		return c, err
	}
	if act.stopped != nil {
		if c.stopped, err = act.stopped(); err != nil {
			return c, fmt.Errorf("read the defence's counter: %w", err)
		}
	}
	if act.answered != nil {
		if c.answered, err = act.answered(); err != nil {
			return c, fmt.Errorf("read the defence's counter: %w", err)
		}
	}
	c.cpu, err = readCPU(rxCPU)
	return c, err
}

func (c floodCounts) since(p floodCounts, r *FloodResult) {
	dt := c.at.Sub(p.at).Seconds()
	rate := func(a, b uint64) float64 {
		if a < b || dt <= 0 {
			return 0
		}
		return float64(a-b) / dt / 1e6
	}
	r.OfferedMPPS, r.ReceivedMPPS = rate(c.generated, p.generated), rate(c.rx, p.rx)
	r.DroppedMPPS, r.AnsweredMPPS = rate(c.stopped, p.stopped), rate(c.answered, p.answered)
	r.CPUBusy = c.cpu.busySince(p.cpu)
	if r.ReceivedMPPS > 0 {
		r.NsPerPacket = r.CPUBusy * 1e3 / r.ReceivedMPPS
	}
	if r.CPUBusy > 0 {
		r.AnsweredPerCore = r.AnsweredMPPS / r.CPUBusy
	}
}

// setupNoDefence turns the kernel's SYN cookies off: the listener's SYN
// queue is all there is. What the kernel drops is counted.
func setupNoDefence(r *floodRow) (*defenceActive, error) {
	if err := inNs(r.topo.rxNs, "sysctl", "-qw", "net.ipv4.tcp_syncookies=0"); err != nil {
		return nil, err
	}
	return &defenceActive{stopped: r.kernelDrops}, nil
}

// setupKernelCookies answers every SYN with a cookie (tcp_syncookies=2),
// not only when the queue overflows.
func setupKernelCookies(r *floodRow) (*defenceActive, error) {
	if err := inNs(r.topo.rxNs, "sysctl", "-qw", "net.ipv4.tcp_syncookies=2"); err != nil {
		return nil, err
	}
	sent := func() (uint64, error) { return r.netstat("TcpExt", "SyncookiesSent") }
	return &defenceActive{stopped: sent, answered: sent}, nil
}

// kernelDrops is what the kernel dropped of the flood: SYNs the listener
// had no room for, datagrams the socket had no room for.
func (r *floodRow) kernelDrops() (uint64, error) {
	var sum uint64
	for _, c := range [][2]string{{"TcpExt", "ListenDrops"}, {"Udp", "InErrors"}, {"Udp6", "InErrors"}} {
		n, err := r.netstat(c[0], c[1])
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// netstat reads one of the receiving namespace's protocol counters.
func (r *floodRow) netstat(group, name string) (uint64, error) {
	var n uint64
	err := netns.Run(r.topo.rxNs, func() error {
		var err error
		n, err = readNetstat(group, name)
		return err
	})
	return n, err
}

// setupSynproxy is the netfilter recipe (iptables-extensions(8), SYNPROXY):
// SYNs to the service untracked, answered by SYNPROXY with a cookie, the
// connection made to the listener only once the client's ACK proves it.
func setupSynproxy(r *floodRow) (*defenceActive, error) {
	if err := inNs(r.topo.rxNs, r.ipt, "-w", "-t", "raw", "-A", "PREROUTING", "-i", r.topo.rxIf, "-p", "tcp", "--dport", fmt.Sprint(tcpPort),
		"--syn", "-j", "CT", "--notrack"); err != nil {
		return nil, err
	}
	if err := inNs(r.topo.rxNs, r.ipt, "-w", "-A", "INPUT", "-i", r.topo.rxIf, "-p", "tcp", "--dport", fmt.Sprint(tcpPort),
		"-m", "conntrack", "--ctstate", "INVALID,UNTRACKED", "-j", "SYNPROXY", "--sack-perm", "--timestamp", "--wscale", "7", "--mss", "1460"); err != nil {
		return nil, err
	}
	if err := inNs(r.topo.rxNs, r.ipt, "-w", "-A", "INPUT", "-i", r.topo.rxIf, "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"); err != nil {
		return nil, err
	}
	// Out-of-window ACKs must be INVALID for SYNPROXY to see them.
	if err := inNs(r.topo.rxNs, "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_loose=0"); err != nil {
		return nil, err
	}
	answered := iptablesCounter(r.topo.rxNs, r.ipt, "filter", "INPUT", "SYNPROXY")
	dropped := iptablesCounter(r.topo.rxNs, r.ipt, "filter", "INPUT", "DROP")
	stopped := func() (uint64, error) {
		a, err := answered()
		if err != nil {
			return 0, err
		}
		d, err := dropped()
		return a + d, err
	}
	return &defenceActive{stopped: stopped, answered: answered, mode: r.ipt}, nil
}

// applyRampart applies a row's policy at the receiving interface.
func (r *floodRow) applyRampart(name, text string) (*rampartHook, error) {
	return applyRampart(r.dir, r.topo.rxNs, r.topo.rxIf, filepath.Join(r.dir, name+".yaml"), text, false)
}

func setupRampartCookies(r *floodRow) (*defenceActive, error) {
	if err := datapath.Require(datapath.FeatureTCPReqsk); err != nil {
		return nil, skipError{err.Error()}
	}
	h, err := r.applyRampart("syncookie", fmt.Sprintf(cookiePolicy, tcpPort))
	if err != nil {
		return nil, err
	}
	sent := h.counter("syn-web", func(x stats.Row) uint64 { return x.CookiesSent })
	return &defenceActive{stopped: sent, answered: sent, mode: h.mode}, nil
}

func setupRampartDrop(r *floodRow) (*defenceActive, error) {
	h, err := r.applyRampart("drop", fmt.Sprintf(dropPolicy, udpPort))
	if err != nil {
		return nil, err
	}
	dropped := h.counter("udp-closed", func(x stats.Row) uint64 { return x.Packets })
	return &defenceActive{stopped: dropped, mode: h.mode}, nil
}

func setupRampartLimit(r *floodRow) (*defenceActive, error) {
	h, err := r.applyRampart("limit", fmt.Sprintf(limitPolicy, udpPort))
	if err != nil {
		return nil, err
	}
	over := h.counter("udp-fair-share", func(x stats.Row) uint64 { return x.Over })
	return &defenceActive{stopped: over, mode: h.mode}, nil
}

// finish computes rampart's targets from rows of the same run.
func (r *FloodReport) finish() {
	for i := range r.Results {
		x := &r.Results[i]
		if base := r.find("none", floodNone, x.Family, x.Legit); base != nil && x.Flood != floodNone && base.LegitP99Ms > 0 && x.LegitSuccess > 0 {
			x.P99VsUnflooded = x.LegitP99Ms / base.LegitP99Ms
		}
	}
	for _, fam := range []int{4, 6} {
		if c := r.find("rampart-syncookie", FloodSYN, fam, "tcp"); c != nil {
			r.Checks = append(r.Checks,
				Check{Name: "legitimate TCP success under a SYN flood, rampart syncookie", Family: fam, Value: c.LegitSuccess, Target: "≥ 0.99", Met: c.LegitSuccess >= 0.99})
			if c.P99VsUnflooded > 0 {
				r.Checks = append(r.Checks, Check{Name: "legitimate TCP p99 latency over the unflooded one, rampart syncookie", Family: fam,
					Value: c.P99VsUnflooded, Target: "≤ 2", Met: c.P99VsUnflooded <= 2})
			}
			if k := r.find("kernel-syncookies", FloodSYN, fam, "tcp"); k != nil && k.AnsweredPerCore > 0 {
				v := c.AnsweredPerCore / k.AnsweredPerCore
				r.Checks = append(r.Checks, Check{Name: "SYNs answered per receiving core, rampart over the kernel's cookies", Family: fam, Value: v, Target: "≥ 3", Met: v >= 3})
			}
		}
		if l := r.find("rampart-limit", FloodSources, fam, "udp"); l != nil {
			r.Checks = append(r.Checks, Check{Name: "legitimate UDP success under an over-limit flood, rampart limit", Family: fam, Value: l.LegitSuccess, Target: "≥ 0.99", Met: l.LegitSuccess >= 0.99})
			if d := r.find("rampart-drop", FloodSources, fam, "udp"); d != nil && d.NsPerPacket > 0 {
				v := l.NsPerPacket / d.NsPerPacket
				r.Checks = append(r.Checks, Check{Name: "receiving CPU per flood packet, limit rule over plain drop rule", Family: fam, Value: v, Target: "≤ 1.3", Met: v <= 1.3})
			}
		}
	}
}

func (r *FloodReport) find(def, flood string, family int, legit string) *FloodResult {
	for i := range r.Results {
		if x := &r.Results[i]; x.Defence == def && x.Flood == flood && x.Family == family && x.Legit == legit && x.Status == StatusOK {
			return x
		}
	}
	return nil
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
