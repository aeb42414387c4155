package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/netns"
)

// Options configure `rampart lab drop`.
type Options struct {
	Layers   []string // names from Layers; empty means all
	Families []int    // 4, 6 or both
	Warmup   time.Duration
	Window   time.Duration
	Repeats  int
	Src4     netip.Prefix // range the IPv4 flood's sources are spread over
	Src6     netip.Prefix
	Sources  int    // flood sources per family, and so the size of the list-based layers' lists
	Dir      string // where the list and policy files (and the rampart layer's state) go
	// Progress, when set, hears what the run is doing.
	Progress Progress
}

// Defaults for a full run and for --quick.
var (
	Full  = Options{Warmup: 2 * time.Second, Window: 2 * time.Second, Repeats: 5}
	Quick = Options{Warmup: 500 * time.Millisecond, Window: 500 * time.Millisecond, Repeats: 3}
)

// DefaultSources is the flood's sources, the list the list-based layers load.
const DefaultSources = 1_000_000

var (
	DefaultSrc4 = netip.MustParsePrefix("10.0.0.0/8")
	DefaultSrc6 = netip.MustParsePrefix("fd10::/32")
)

// LayerNames lists the layers in the study's order.
func LayerNames() []string {
	var n []string
	for _, l := range Layers {
		n = append(n, l.name)
	}
	return n
}

// Validate checks the options before anything is created.
func (o *Options) Validate() error {
	for _, name := range o.Layers {
		if !slices.Contains(LayerNames(), name) {
			return fmt.Errorf("unknown layer %q: choose from %s", name, strings.Join(LayerNames(), ", "))
		}
	}
	for _, f := range o.Families {
		if f != 4 && f != 6 {
			return fmt.Errorf("family %d: choose 4, 6 or both", f)
		}
	}
	if o.Repeats < 1 || o.Window <= 0 || o.Warmup < 0 {
		return errors.New("--repeats must be at least 1 and --window positive")
	}
	if o.Sources < 1 {
		return errors.New("--list-size must be at least 1")
	}
	for _, fam := range o.Families {
		if _, err := o.flood(fam); err != nil {
			return err
		}
	}
	return nil
}

// cpus picks where things run: the generator on CPU 0, the receive path on
// CPU 1, the recvmmsg application on a CPU of its own when there is a third
// (as in the study) and else beside the receive path, never beside the
// generator, whose rate it would take. One CPU runs everything.
func cpus() cpuPlan {
	switch n := runtime.NumCPU(); {
	case n >= 3:
		return cpuPlan{gen: 0, rx: 1, app: 2}
	case n == 2:
		return cpuPlan{gen: 0, rx: 1, app: 1}
	}
	return cpuPlan{}
}

// receivers are the CPUs whose busy time a dropped packet costs.
func (c cpuPlan) receivers() []int {
	if c.app != c.rx && c.app != c.gen {
		return []int{c.rx, c.app}
	}
	return []int{c.rx}
}

// plan is one row of the run: a layer, its family's flood, and what the
// rounds measured of it.
type plan struct {
	layer   layer
	flood   *flood
	list    string // the flood's sources as a list file
	res     Result
	samples []sample
}

// Drop runs the per-layer drop study. It always removes what it created,
// also when ctx is cancelled; a layer that cannot run is reported as
// skipped or failed and the run goes on.
func Drop(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Dir == "" {
		return nil, errors.New("lab: Options need Dir")
	}
	if err := datapath.Require(datapath.FeatureLiveFrames); err != nil {
		return nil, err
	}
	sweepStale()
	defer os.RemoveAll(PinRoot()) // what the rampart layer's detach leaves: empty directories
	if missing := missingTool([]string{"ip", "ethtool"}); missing != "" {
		return nil, errors.New(missing)
	}
	cpu := cpus()
	rep := &Report{Env: environment(o, cpu)}
	var plans []*plan
	for _, fam := range o.Families {
		f, err := o.flood(fam)
		if err != nil {
			return nil, err
		}
		list, err := f.writeList(o.Dir)
		if err != nil {
			return nil, err
		}
		for _, l := range Layers {
			if len(o.Layers) == 0 || slices.Contains(o.Layers, l.name) {
				p := &plan{layer: l, flood: f, list: list, res: Result{Layer: l.name, Family: fam, Status: StatusOK}}
				if fam == 4 {
					p.res.StudyMPPS = l.study
				}
				plans = append(plans, p)
			}
		}
	}
	// Rounds, not repeats in place: every round runs every row once, so
	// the noise of a shared machine falls on all layers alike and the
	// ratios between rows compare like with like.
	seq := 0
	for round := range o.Repeats {
		for i, p := range plans {
			if p.res.Status != StatusOK {
				continue
			}
			seq++
			o.Progress.say(fmt.Sprintf("round %d/%d, row %d/%d: %s IPv%d", round+1, o.Repeats, i+1, len(plans), p.layer.name, p.flood.family))
			s, mode, err := measureOnce(ctx, o, p, seq, cpu)
			if ctx.Err() != nil {
				rep.Results = results(plans)
				return rep, ctx.Err()
			}
			if err != nil {
				p.res.Status, p.res.Reason = failure(err)
			} else {
				p.res.Mode = mode
				p.samples = append(p.samples, s)
			}
		}
	}
	rep.Results = results(plans)
	rep.finish()
	return rep, nil
}

// results summarises each row's samples, in the study's order.
func results(plans []*plan) []Result {
	out := make([]Result, 0, len(plans))
	for _, p := range plans {
		if p.res.Status == StatusOK && len(p.samples) > 0 {
			p.res.summarise(p.samples)
		}
		out = append(out, p.res)
	}
	return out
}

// skipError marks a layer this host cannot run: a tool or a kernel
// feature is missing.
type skipError struct{ reason string }

func (e skipError) Error() string { return e.reason }

// failure is a row's status and reason after err: skipped when the host
// cannot run it, failed otherwise.
func failure(err error) (status, reason string) {
	var skip skipError
	if errors.As(err, &skip) {
		return StatusSkipped, skip.Error()
	}
	return StatusFailed, err.Error()
}

// cpuPlan says where the generator, the receive path and the application run.
type cpuPlan struct{ gen, rx, app int }

// flood is the family's flood as the options describe it.
func (o *Options) flood(family int) (*flood, error) {
	src := o.Src4
	if family == 6 {
		src = o.Src6
	}
	f, err := newFlood(family, src, o.Sources)
	if err != nil {
		return nil, fmt.Errorf("--src%d: %w", family, err)
	}
	return f, nil
}

// measureOnce runs one row once: a fresh topology and layer, the
// generator, warm-up, one window; everything torn down after.
func measureOnce(ctx context.Context, o Options, p *plan, seq int, cpu cpuPlan) (s sample, mode string, err error) {
	l, f := p.layer, p.flood
	if missing := missingTool(l.tools); missing != "" {
		return s, "", skipError{missing}
	}
	topo, err := newTopology(seq, cpu.rx)
	if err != nil {
		return s, "", fmt.Errorf("topology: %w", err)
	}
	defer topo.close()
	objs, err := loadObjects(topo, f)
	if err != nil {
		return s, "", err
	}
	defer objs.Close()
	r := &row{topo: topo, family: f.family, objs: objs, appCPU: cpu.app, flood: f, list: p.list, dir: o.Dir, ipt: iptablesFor(f.family)}
	start := time.Now()
	act, err := l.setup(r)
	s.setup = time.Since(start).Seconds()
	if err != nil {
		var skip skipError
		if errors.As(err, &skip) {
			return s, "", err
		}
		return s, "", fmt.Errorf("set up %s: %w", l.name, err)
	}
	defer func() {
		if terr := act.teardown(); terr != nil && err == nil {
			err = fmt.Errorf("tear down %s: %w", l.name, terr)
		}
	}()
	if err := topo.pinNAPI(); err != nil {
		return s, "", err
	}
	iface, err := rxCounter(topo)
	if err != nil {
		return s, "", err
	}
	defer iface.close()

	gen := startGenerator(objs, topo, f.frame(topo.genMAC, topo.rxMAC), cpu.gen)
	err = func() error {
		if !sleepCtx(ctx.Done(), o.Warmup) {
			return ctx.Err()
		}
		rx := cpu.receivers()
		prev, err := takeSample(act, objs, iface, rx)
		if err != nil {
			return err
		}
		if !sleepCtx(ctx.Done(), o.Window) {
			return ctx.Err()
		}
		cur, err := takeSample(act, objs, iface, rx)
		if err != nil {
			return err
		}
		setup := s.setup
		s = cur.since(prev)
		s.setup = setup
		o.Progress.say(fmt.Sprintf("%s IPv%d: %.3f Mpps dropped of %.2f offered", l.name, f.family, s.mpps, s.offered))
		return nil
	}()
	if gerr := gen.halt(); err == nil {
		err = gerr
	}
	return s, act.mode, err
}

// counts is one reading of every counter a row watches.
type counts struct {
	at        time.Time
	dropped   uint64
	generated uint64
	ifaceRx   uint64
	cpu       []cpuTimes
}

// sample is the rates over one window.
type sample struct {
	mpps, offered, ifaceRx float64
	cpuBusy                float64 // fraction of one CPU
	packets                uint64
	setup                  float64 // seconds the layer took to set up, its list loaded
}

func takeSample(act *active, objs *labObjects, iface *ifaceCounter, rxCPUs []int) (c counts, err error) {
	c.at = time.Now()
	if c.dropped, err = act.count(); err != nil {
		return c, fmt.Errorf("read the layer's counter: %w", err)
	}
	if c.generated, err = generated(objs); err != nil {
		return c, err
	}
	if c.ifaceRx, err = iface.rxPackets(); err != nil {
		return c, err
	}
	for _, cpu := range rxCPUs {
		t, err := readCPU(cpu)
		if err != nil {
			return c, err
		}
		c.cpu = append(c.cpu, t)
	}
	return c, nil
}

func (c counts) since(p counts) sample {
	dt := c.at.Sub(p.at).Seconds()
	rate := func(a, b uint64) float64 {
		if a < b || dt <= 0 {
			return 0
		}
		return float64(a-b) / dt / 1e6
	}
	s := sample{mpps: rate(c.dropped, p.dropped), offered: rate(c.generated, p.generated), ifaceRx: rate(c.ifaceRx, p.ifaceRx)}
	if c.dropped > p.dropped {
		s.packets = c.dropped - p.dropped
	}
	for i := range c.cpu {
		s.cpuBusy += c.cpu[i].busySince(p.cpu[i])
	}
	return s
}

// ifaceCounter reads the receiving veth's own packet counter over netlink.
type ifaceCounter struct {
	h     *netlink.Handle
	index int
}

func rxCounter(t *topology) (*ifaceCounter, error) {
	ns, err := netns.Open(t.rxNs)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	return &ifaceCounter{h: h, index: t.rxIndex}, nil
}

func (c *ifaceCounter) rxPackets() (uint64, error) {
	l, err := c.h.LinkByIndex(c.index)
	if err != nil {
		return 0, fmt.Errorf("read %d's counters: %w", c.index, err)
	}
	if l.Attrs().Statistics == nil {
		return 0, nil
	}
	return l.Attrs().Statistics.RxPackets, nil
}

func (c *ifaceCounter) close() { c.h.Close() }

// summarise turns the windows into the row's medians and ranges.
func (r *Result) summarise(s []sample) {
	pick := func(f func(sample) float64) []float64 {
		v := make([]float64, len(s))
		for i := range s {
			v[i] = f(s[i])
		}
		sort.Float64s(v)
		return v
	}
	mpps := pick(func(x sample) float64 { return x.mpps })
	r.MPPS, r.MPPSMin, r.MPPSMax = median(mpps), mpps[0], mpps[len(mpps)-1]
	r.OfferedMPPS = median(pick(func(x sample) float64 { return x.offered }))
	r.SetupSeconds = median(pick(func(x sample) float64 { return x.setup }))
	r.IfaceRxMPPS = median(pick(func(x sample) float64 { return x.ifaceRx }))
	r.CPUBusy = 100 * median(pick(func(x sample) float64 { return x.cpuBusy }))
	r.NsPerPacket = median(pick(func(x sample) float64 {
		if x.mpps == 0 {
			return 0
		}
		return x.cpuBusy * 1e3 / x.mpps
	}))
	for _, x := range s {
		r.Packets += x.packets
	}
	r.GeneratorBound = r.MPPS >= generatorBoundShare*r.OfferedMPPS || r.CPUBusy < generatorBoundBusy
}

// A layer that dropped this share of what was offered, or left its CPU
// this idle, kept up with the generator: its rate is a floor, not its
// capacity, and only its ns/packet says what it costs.
const (
	generatorBoundShare = 0.95
	generatorBoundBusy  = 85 // percent
)

func median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// environment records what the numbers depend on.
func environment(o Options, cpu cpuPlan) Env {
	e := Env{
		CPUs: runtime.NumCPU(), GeneratorCPU: cpu.gen, ReceiveCPU: cpu.rx, AppCPU: cpu.app, BatchSize: batchSize,
		Warmup: o.Warmup.String(), Window: o.Window.String(), Repeats: o.Repeats,
		Sources: o.Sources, Src4: o.Src4.String(), Src6: o.Src6.String(),
		Iptables: iptablesFor(4),
	}
	e.Kernel = kernelRelease()
	if b, err := os.ReadFile("/proc/sys/net/core/bpf_jit_enable"); err == nil {
		e.JIT = strings.TrimSpace(string(b)) != "0"
	}
	e.CPUModel = cpuModel()
	e.Emulated = strings.Contains(e.CPUModel, "QEMU")
	return e
}

// sleepCtx waits d or until done is closed; it reports whether d passed.
func sleepCtx(done <-chan struct{}, d time.Duration) bool {
	select {
	case <-done:
		return false
	case <-time.After(d):
		return true
	}
}
