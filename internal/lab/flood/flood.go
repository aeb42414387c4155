// Package flood is `rampart lab flood`: legitimate traffic under floods no
// list can name, with each defence.
package flood

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/stats"
)

// The floods of `rampart lab flood`.
const (
	SYN     = "syn"     // SYNs from random sources to the TCP service
	UDP     = "udp"     // UDP from random sources to the UDP service
	Sources = "sources" // UDP from a fixed set of sources, each far over a fair share
	noFlood = "none"    // the unflooded baseline of the legitimate clients
)

// Names lists the floods in the study's order.
var Names = []string{SYN, UDP, Sources}

// A defence is one row of the flood study.
type defence struct {
	name   string
	floods []string // the floods it is a defence against
	tools  []string
	setup  func(r *row) (*defenceActive, error)
}

// defenceActive is a defence while it runs: what it counts of the flood.
type defenceActive struct {
	// stopped counts flood packets kept from the service, dropped or
	// answered without state; answered counts the SYN-ACKs among them.
	stopped, answered func() (uint64, error)
	mode              string
}

// defences are the rows: nothing, the kernel's SYN cookies, iptables'
// SYNPROXY, rampart's SYN cookies; against the UDP floods, what an operator
// can do today (drop the service's port: the flood's cost, and the clients
// lost with it) and rampart's limit.
var defences = []defence{
	{"none", []string{SYN, UDP, Sources}, nil, setupNoDefence},
	{"kernel-syncookies", []string{SYN}, nil, setupKernelCookies},
	{"iptables-synproxy", []string{SYN}, []string{"iptables"}, setupSynproxy},
	{"rampart-syncookie", []string{SYN}, nil, setupRampartCookies},
	{"rampart-drop", []string{UDP, Sources}, nil, setupRampartDrop},
	{"rampart-limit", []string{UDP, Sources}, nil, setupRampartLimit},
}

// DefenceNames lists the rows in order.
func DefenceNames() []string {
	var n []string
	for _, d := range defences {
		n = append(n, d.name)
	}
	return n
}

// Options configure `rampart lab flood`.
type Options struct {
	Floods   []string // empty: all
	Defences []string // empty: all
	Families []int
	Warmup   time.Duration
	Window   time.Duration
	TCPRate  int // legitimate connections per second
	UDPRate  int // legitimate requests per second
	Sources  int // the sources flood's sources
	Dir      string
	Progress lab.Progress
}

// Defaults for a full run and for --quick.
var (
	Full  = Options{Warmup: time.Second, Window: 10 * time.Second, TCPRate: 100, UDPRate: 200, Sources: 1000}
	Quick = Options{Warmup: 500 * time.Millisecond, Window: 2 * time.Second, TCPRate: 100, UDPRate: 200, Sources: 1000}
)

// Validate checks the options before anything is created.
func (o *Options) Validate() error {
	for _, f := range o.Floods {
		if !slices.Contains(Names, f) {
			return fmt.Errorf("--floods: unknown flood %q: choose from %s", f, strings.Join(Names, ", "))
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

// Result is one row: a defence against a flood, one family, with the
// legitimate traffic that flood competes with.
type Result struct {
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

// Env is what the numbers depend on.
type Env struct {
	lab.Host
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

// Report is the whole run.
type Report struct {
	Env     Env         `json:"environment"`
	Results []Result    `json:"results"`
	Checks  []lab.Check `json:"checks"`
}

// clientCount is how many addresses of lab.ClientNet4 and lab.ClientNet6
// the legitimate clients spread their requests over.
const clientCount = 100

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

// plan is one row to run.
type plan struct {
	def    defence
	flood  string
	family int
	res    Result
}

// Run runs the flood study. It always removes what it created, also
// when ctx is cancelled; a row that cannot run is reported as skipped or
// failed and the run goes on.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Dir == "" {
		return nil, errors.New("lab flood: Options need Dir")
	}
	for _, f := range []*datapath.Feature{datapath.FeatureLiveFrames} {
		if err := datapath.Require(f); err != nil {
			return nil, err
		}
	}
	lab.SweepStale()
	defer os.RemoveAll(lab.PinRoot())
	if missing := lab.MissingTool([]string{"ip", "ethtool", "sysctl"}); missing != "" {
		return nil, errors.New(missing)
	}
	cpu := lab.CPUs()
	rep := &Report{Env: Env{
		Host: lab.ThisHost(), GeneratorCPU: cpu.Gen, ReceiveCPU: cpu.Rx,
		Warmup: o.Warmup.String(), Window: o.Window.String(), TCPRate: o.TCPRate, UDPRate: o.UDPRate,
		Clients: clientCount, Timeout: legitTimeout.String(), Sources: o.Sources, Iptables: lab.IptablesFor(4),
	}}
	var plans []*plan
	floods := o.Floods
	if len(floods) == 0 {
		floods = Names
	}
	// The baselines first: each kind of legitimate traffic, no flood.
	for _, fam := range o.Families {
		for _, legit := range []string{"tcp", "udp"} {
			if slices.ContainsFunc(floods, func(f string) bool { return legitOf(f) == legit }) {
				plans = append(plans, &plan{def: defences[0], flood: noFlood, family: fam,
					res: Result{Defence: "none", Flood: noFlood, Family: fam, Legit: legit, Status: lab.StatusOK}})
			}
		}
	}
	for _, fam := range o.Families {
		for _, f := range floods {
			for _, d := range defences {
				if slices.Contains(d.floods, f) && (len(o.Defences) == 0 || slices.Contains(o.Defences, d.name)) {
					plans = append(plans, &plan{def: d, flood: f, family: fam,
						res: Result{Defence: d.name, Flood: f, Family: fam, Legit: legitOf(f), Status: lab.StatusOK}})
				}
			}
		}
	}
	for i, p := range plans {
		o.Progress.Say(fmt.Sprintf("row %d/%d: %s against %s flood, IPv%d", i+1, len(plans), p.def.name, p.flood, p.family))
		// The kernel dismantles the last row's namespaces in the
		// background, on the CPUs the next row measures.
		if i > 0 && !lab.SleepCtx(ctx.Done(), settle) {
			break
		}
		err := runRow(ctx, o, p, i+1, cpu)
		if ctx.Err() != nil {
			rep.Results = results(plans)
			return rep, ctx.Err()
		}
		if err != nil {
			p.res.Status, p.res.Reason = lab.Failure(err)
		}
	}
	rep.Results = results(plans)
	rep.finish()
	return rep, nil
}

// legitOf is the legitimate traffic a flood competes with.
func legitOf(flood string) string {
	if flood == SYN {
		return "tcp"
	}
	return "udp"
}

func results(plans []*plan) []Result {
	out := make([]Result, 0, len(plans))
	for _, p := range plans {
		out = append(out, p.res)
	}
	return out
}

// row is what a defence's setup works with.
type row struct {
	topo   *lab.Topology
	family int
	dir    string
	ipt    string
}

// runRow measures one row: a fresh topology, the defence, the
// servers, the generator (unless the row is a baseline), the legitimate
// clients over the window.
func runRow(ctx context.Context, o Options, p *plan, seq int, cpu lab.CPUPlan) (err error) {
	if missing := lab.MissingTool(p.def.tools); missing != "" {
		return lab.SkipError{Reason: missing}
	}
	topo, err := lab.NewTopology(seq, cpu.Rx)
	if err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	defer topo.Close()
	tr, err := traffic(p.flood, p.family, o.Sources)
	if err != nil {
		return err
	}
	objs, err := lab.LoadObjects(topo, tr)
	if err != nil {
		return err
	}
	defer objs.Close()
	cl, err := addClients(topo, objs, cpu.Gen)
	if err != nil {
		return fmt.Errorf("clients: %w", err)
	}
	defer cl.close()
	r := &row{topo: topo, family: p.family, dir: o.Dir, ipt: lab.IptablesFor(p.family)}
	act, err := p.def.setup(r)
	if err != nil {
		return lab.SetupError(p.def.name, err)
	}
	p.res.Mode = act.mode
	srv, err := startServers(topo, p.family)
	if err != nil {
		return fmt.Errorf("servers: %w", err)
	}
	defer srv.close()
	if err := topo.PinNAPI(); err != nil {
		return err
	}
	for _, pid := range topo.NAPIPIDs {
		if err := realTime(pid); err != nil {
			return err
		}
	}
	iface, err := lab.RxCounter(topo)
	if err != nil {
		return err
	}
	defer iface.Close()

	prime(cl, p.family)
	var gen *lab.Generator
	if p.flood != noFlood {
		gen = lab.StartGenerator(objs, topo, tr, cpu.Gen)
	}
	err = func() error {
		if !lab.SleepCtx(ctx.Done(), o.Warmup) {
			return ctx.Err()
		}
		before, err := takeSample(act, objs, iface, cpu.Rx)
		if err != nil {
			return err
		}
		rate := o.TCPRate
		if p.res.Legit == "udp" {
			rate = o.UDPRate
		}
		load := startLegit(cl, p.res.Legit, p.family, rate)
		if !lab.SleepCtx(ctx.Done(), o.Window) {
			load.stop()
			return ctx.Err()
		}
		after, err := takeSample(act, objs, iface, cpu.Rx)
		load.stop()
		if err != nil {
			return err
		}
		after.since(before, &p.res)
		load.summarise(&p.res)
		o.Progress.Say(fmt.Sprintf("%s against %s flood, IPv%d: %.1f%% of legitimate %s answered, %.2f Mpps offered",
			p.def.name, p.flood, p.family, 100*p.res.LegitSuccess, p.res.Legit, p.res.OfferedMPPS))
		return nil
	}()
	if gen != nil {
		if gerr := gen.Halt(); err == nil {
			err = gerr
		}
	}
	return err
}

// traffic is a flood's traffic: SYNs to the TCP service or UDP to the UDP
// service, from 2^24 random sources (IPv6: /64s), or from n sources.
func traffic(name string, family, n int) (*lab.Traffic, error) {
	src := lab.DefaultSrc4
	if family == 6 {
		src = lab.DefaultSrc6
	}
	count := 1 << 24
	if name == Sources {
		count = n
	}
	tr, err := lab.NewTraffic(family, src, count)
	if err != nil {
		return nil, err
	}
	tr.Port = udpPort
	if name == SYN || name == noFlood {
		tr.Proto, tr.Port = unix.IPPROTO_TCP, tcpPort
	}
	return tr, nil
}

// counts is one reading of what a row watches.
type counts struct {
	at                time.Time
	generated, rx     uint64
	stopped, answered uint64
	cpu               lab.CPUTimes
}

func takeSample(act *defenceActive, objs *lab.Objects, iface *lab.IfaceCounter, rxCPU int) (c counts, err error) {
	c.at = time.Now()
	if c.generated, err = objs.Sent(); err != nil {
		return c, err
	}
	if c.rx, err = iface.RxPackets(); err != nil {
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
	c.cpu, err = lab.ReadCPU(rxCPU)
	return c, err
}

func (c counts) since(p counts, r *Result) {
	dt := c.at.Sub(p.at).Seconds()
	rate := func(a, b uint64) float64 {
		if a < b || dt <= 0 {
			return 0
		}
		return float64(a-b) / dt / 1e6
	}
	r.OfferedMPPS, r.ReceivedMPPS = rate(c.generated, p.generated), rate(c.rx, p.rx)
	r.DroppedMPPS, r.AnsweredMPPS = rate(c.stopped, p.stopped), rate(c.answered, p.answered)
	r.CPUBusy = c.cpu.BusySince(p.cpu)
	if r.ReceivedMPPS > 0 {
		r.NsPerPacket = r.CPUBusy * 1e3 / r.ReceivedMPPS
	}
	if r.CPUBusy > 0 {
		r.AnsweredPerCore = r.AnsweredMPPS / r.CPUBusy
	}
}

// setupNoDefence turns the kernel's SYN cookies off: the listener's SYN
// queue is all there is. What the kernel drops is counted.
func setupNoDefence(r *row) (*defenceActive, error) {
	if err := lab.InNs(r.topo.RxNs, "sysctl", "-qw", "net.ipv4.tcp_syncookies=0"); err != nil {
		return nil, err
	}
	return &defenceActive{stopped: r.kernelDrops}, nil
}

// setupKernelCookies answers every SYN with a cookie (tcp_syncookies=2),
// not only when the queue overflows.
func setupKernelCookies(r *row) (*defenceActive, error) {
	if err := lab.InNs(r.topo.RxNs, "sysctl", "-qw", "net.ipv4.tcp_syncookies=2"); err != nil {
		return nil, err
	}
	sent := func() (uint64, error) { return r.netstat("TcpExt", "SyncookiesSent") }
	return &defenceActive{stopped: sent, answered: sent}, nil
}

// kernelDrops is what the kernel dropped of the flood: SYNs the listener
// had no room for, datagrams the socket had no room for.
func (r *row) kernelDrops() (uint64, error) {
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
func (r *row) netstat(group, name string) (uint64, error) {
	var n uint64
	err := netns.Run(r.topo.RxNs, func() error {
		var err error
		n, err = readNetstat(group, name)
		return err
	})
	return n, err
}

// setupSynproxy is the netfilter recipe (iptables-extensions(8), SYNPROXY):
// SYNs to the service untracked, answered by SYNPROXY with a cookie, the
// connection made to the listener only once the client's ACK proves it.
func setupSynproxy(r *row) (*defenceActive, error) {
	if err := lab.InNs(r.topo.RxNs, r.ipt, "-w", "-t", "raw", "-A", "PREROUTING", "-i", r.topo.RxIf, "-p", "tcp", "--dport", fmt.Sprint(tcpPort),
		"--syn", "-j", "CT", "--notrack"); err != nil {
		return nil, err
	}
	if err := lab.InNs(r.topo.RxNs, r.ipt, "-w", "-A", "INPUT", "-i", r.topo.RxIf, "-p", "tcp", "--dport", fmt.Sprint(tcpPort),
		"-m", "conntrack", "--ctstate", "INVALID,UNTRACKED", "-j", "SYNPROXY", "--sack-perm", "--timestamp", "--wscale", "7", "--mss", "1460"); err != nil {
		return nil, err
	}
	if err := lab.InNs(r.topo.RxNs, r.ipt, "-w", "-A", "INPUT", "-i", r.topo.RxIf, "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"); err != nil {
		return nil, err
	}
	// Out-of-window ACKs must be INVALID for SYNPROXY to see them.
	if err := lab.InNs(r.topo.RxNs, "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_loose=0"); err != nil {
		return nil, err
	}
	answered := lab.IptablesCounter(r.topo.RxNs, r.ipt, "filter", "INPUT", "SYNPROXY")
	dropped := lab.IptablesCounter(r.topo.RxNs, r.ipt, "filter", "INPUT", "DROP")
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
func (r *row) applyRampart(name, text string) (*lab.RampartHook, error) {
	return lab.ApplyRampart(r.dir, r.topo.RxNs, r.topo.RxIf, filepath.Join(r.dir, name+".yaml"), text, false)
}

func setupRampartCookies(r *row) (*defenceActive, error) {
	if err := datapath.Require(datapath.FeatureTCPReqsk); err != nil {
		return nil, lab.SkipError{Reason: err.Error()}
	}
	h, err := r.applyRampart("syncookie", fmt.Sprintf(cookiePolicy, tcpPort))
	if err != nil {
		return nil, err
	}
	sent := h.Counter("syn-web", func(x stats.Row) uint64 { return x.CookiesSent })
	return &defenceActive{stopped: sent, answered: sent, mode: h.Mode}, nil
}

func setupRampartDrop(r *row) (*defenceActive, error) {
	h, err := r.applyRampart("drop", fmt.Sprintf(dropPolicy, udpPort))
	if err != nil {
		return nil, err
	}
	dropped := h.Counter("udp-closed", func(x stats.Row) uint64 { return x.Packets })
	return &defenceActive{stopped: dropped, mode: h.Mode}, nil
}

func setupRampartLimit(r *row) (*defenceActive, error) {
	h, err := r.applyRampart("limit", fmt.Sprintf(limitPolicy, udpPort))
	if err != nil {
		return nil, err
	}
	over := h.Counter("udp-fair-share", func(x stats.Row) uint64 { return x.Over })
	return &defenceActive{stopped: over, mode: h.Mode}, nil
}

// finish computes rampart's targets from rows of the same run.
func (r *Report) finish() {
	for i := range r.Results {
		x := &r.Results[i]
		if base := r.find("none", noFlood, x.Family, x.Legit); base != nil && x.Flood != noFlood && base.LegitP99Ms > 0 && x.LegitSuccess > 0 {
			x.P99VsUnflooded = x.LegitP99Ms / base.LegitP99Ms
		}
	}
	for _, fam := range []int{4, 6} {
		if c := r.find("rampart-syncookie", SYN, fam, "tcp"); c != nil {
			r.Checks = append(r.Checks,
				lab.Check{Name: "legitimate TCP success under a SYN flood, rampart syncookie", Family: fam, Value: c.LegitSuccess, Target: "≥ 0.99", Met: c.LegitSuccess >= 0.99})
			if c.P99VsUnflooded > 0 {
				r.Checks = append(r.Checks, lab.Check{Name: "legitimate TCP p99 latency over the unflooded one, rampart syncookie", Family: fam,
					Value: c.P99VsUnflooded, Target: "≤ 2", Met: c.P99VsUnflooded <= 2})
			}
			if k := r.find("kernel-syncookies", SYN, fam, "tcp"); k != nil && k.AnsweredPerCore > 0 {
				v := c.AnsweredPerCore / k.AnsweredPerCore
				r.Checks = append(r.Checks, lab.Check{Name: "SYNs answered per receiving core, rampart over the kernel's cookies", Family: fam, Value: v, Target: "≥ 5", Met: v >= 5})
			}
			if c.NsPerPacket > 0 {
				r.Checks = append(r.Checks, lab.Check{Name: "receiving CPU per SYN, rampart syncookie (ns)", Family: fam, Value: c.NsPerPacket, Target: "≤ 400", Met: c.NsPerPacket <= 400})
			}
		}
		if l := r.find("rampart-limit", Sources, fam, "udp"); l != nil {
			r.Checks = append(r.Checks, lab.Check{Name: "legitimate UDP success under an over-limit flood, rampart limit", Family: fam, Value: l.LegitSuccess, Target: "≥ 0.99", Met: l.LegitSuccess >= 0.99})
			if d := r.find("rampart-drop", Sources, fam, "udp"); d != nil && d.NsPerPacket > 0 {
				v := l.NsPerPacket / d.NsPerPacket
				r.Checks = append(r.Checks, lab.Check{Name: "receiving CPU per flood packet, limit rule over plain drop rule", Family: fam, Value: v, Target: "≤ 1.3", Met: v <= 1.3})
			}
		}
	}
}

func (r *Report) find(def, flood string, family int, legit string) *Result {
	for i := range r.Results {
		if x := &r.Results[i]; x.Defence == def && x.Flood == flood && x.Family == family && x.Legit == legit && x.Status == lab.StatusOK {
			return x
		}
	}
	return nil
}
