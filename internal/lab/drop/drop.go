// Package drop is `rampart lab drop`: how many packets per second each
// layer of the stack drops on one receiving CPU, rampart beside them.
package drop

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/lab"
)

// Options configure `rampart lab drop`.
type Options struct {
	Layers   []string // names from LayerNames; empty means all
	Families []int    // 4, 6 or both
	Warmup   time.Duration
	Window   time.Duration
	Repeats  int
	Src4     netip.Prefix // range the IPv4 flood's sources are spread over
	Src6     netip.Prefix
	Sources  int    // flood sources per family, and so the size of the list-based layers' lists
	Dir      string // where the list and policy files (and the rampart layer's state) go
	Progress lab.Progress
	// Unlisted: the list holds as many sources, none of them the flood's;
	// only rampart's row and the floor run (the peers would drop nothing).
	Unlisted bool
}

// Defaults for a full run and for --quick.
var (
	Full  = Options{Warmup: 2 * time.Second, Window: 2 * time.Second, Repeats: 5}
	Quick = Options{Warmup: 500 * time.Millisecond, Window: 500 * time.Millisecond, Repeats: 3}
)

// DefaultSources is the flood's sources, the list the list-based layers load.
const DefaultSources = 1_000_000

// LayerNames lists the layers in the study's order.
func LayerNames() []string {
	var n []string
	for _, l := range layers {
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
	for _, name := range o.Layers {
		if o.Unlisted && !unlistedLayer(name) {
			return fmt.Errorf("--unlisted runs rampart and %s only: %s would drop none of the flood (use --layers rampart)", floorLayer, name)
		}
	}
	for _, fam := range o.Families {
		if _, err := o.traffic(fam); err != nil {
			return err
		}
	}
	return nil
}

// runs says whether the run has a layer's rows: the layers asked for, and
// the floor whenever rampart's row runs, as its reference; with --unlisted,
// those two alone.
func (o *Options) runs(name string) bool {
	asked := func(n string) bool {
		if o.Unlisted && !unlistedLayer(n) {
			return false
		}
		return len(o.Layers) == 0 || slices.Contains(o.Layers, n)
	}
	return asked(name) || name == floorLayer && asked("rampart")
}

// unlistedLayer says whether a layer runs with --unlisted: rampart's and
// the floor's; a peer's list would drop none of the flood.
func unlistedLayer(name string) bool { return name == "rampart" || name == floorLayer }

// plan is one row of the run: a layer, its family's flood, and what the
// rounds measured of it.
type plan struct {
	layer   layer
	traffic *lab.Traffic
	list    string // the flood's sources as a list file
	res     Result
	samples []sample
}

// Run runs the per-layer drop study. It always removes what it created,
// also when ctx is cancelled; a layer that cannot run is reported as
// skipped or failed and the run goes on.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Dir == "" {
		return nil, errors.New("lab drop: Options need Dir")
	}
	if err := datapath.Require(datapath.FeatureLiveFrames); err != nil {
		return nil, err
	}
	lab.SweepStale()
	defer os.RemoveAll(lab.PinRoot()) // what the rampart layer's detach leaves: empty directories
	if missing := lab.MissingTool([]string{"ip", "ethtool"}); missing != "" {
		return nil, errors.New(missing)
	}
	cpu := lab.CPUs()
	rep := &Report{Env: environment(o, cpu)}
	var plans []*plan
	for _, fam := range o.Families {
		tr, err := o.traffic(fam)
		if err != nil {
			return nil, err
		}
		list, err := tr.WriteList(o.Dir)
		if err != nil {
			return nil, err
		}
		if o.runs(floorLayer) {
			o.Progress.Say(fmt.Sprintf("IPv%d: sizing %s as rampart's tables for the list", fam, floorLayer))
			tr.FloorBytes = tr.TableBytes()
		}
		for _, l := range layers {
			if o.runs(l.name) {
				p := &plan{layer: l, traffic: tr, list: list, res: Result{Layer: l.name, Family: fam, Status: lab.StatusOK}}
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
			if p.res.Status != lab.StatusOK {
				continue
			}
			seq++
			o.Progress.Say(fmt.Sprintf("round %d/%d, row %d/%d: %s IPv%d", round+1, o.Repeats, i+1, len(plans), p.layer.name, p.traffic.Family))
			s, mode, err := measureOnce(ctx, o, p, seq, cpu)
			if ctx.Err() != nil {
				rep.Results = results(plans)
				return rep, ctx.Err()
			}
			if err != nil {
				p.res.Status, p.res.Reason = lab.Failure(err)
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
		if p.res.Status == lab.StatusOK && len(p.samples) > 0 {
			p.res.summarise(p.samples)
		}
		out = append(out, p.res)
	}
	return out
}

// traffic is the family's flood as the options describe it.
func (o *Options) traffic(family int) (*lab.Traffic, error) {
	src := o.Src4
	if family == 6 {
		src = o.Src6
	}
	tr, err := lab.NewTraffic(family, src, o.Sources)
	if err == nil && o.Unlisted {
		err = tr.Unlisted()
	}
	if err != nil {
		return nil, fmt.Errorf("--src%d: %w", family, err)
	}
	return tr, nil
}

// measureOnce runs one row once: a fresh topology and layer, the
// generator, warm-up, one window; everything torn down after.
func measureOnce(ctx context.Context, o Options, p *plan, seq int, cpu lab.CPUPlan) (s sample, mode string, err error) {
	l, tr := p.layer, p.traffic
	if missing := lab.MissingTool(l.tools); missing != "" {
		return s, "", lab.SkipError{Reason: missing}
	}
	topo, err := lab.NewTopology(seq, cpu.Rx)
	if err != nil {
		return s, "", fmt.Errorf("topology: %w", err)
	}
	defer topo.Close()
	objs, err := lab.LoadObjects(topo, tr)
	if err != nil {
		return s, "", err
	}
	defer objs.Close()
	r := &row{topo: topo, family: tr.Family, objs: objs, appCPU: cpu.App, traffic: tr, list: p.list, dir: o.Dir, ipt: lab.IptablesFor(tr.Family)}
	start := time.Now()
	act, err := l.setup(r)
	s.setup = time.Since(start).Seconds()
	if err != nil {
		return s, "", lab.SetupError(l.name, err)
	}
	defer func() {
		if terr := act.teardown(); terr != nil && err == nil {
			err = fmt.Errorf("tear down %s: %w", l.name, terr)
		}
	}()
	if err := topo.PinNAPI(); err != nil {
		return s, "", err
	}
	iface, err := lab.RxCounter(topo)
	if err != nil {
		return s, "", err
	}
	defer iface.Close()

	gen := lab.StartGenerator(objs, topo, tr, cpu.Gen)
	err = func() error {
		if !lab.SleepCtx(ctx.Done(), o.Warmup) {
			return ctx.Err()
		}
		rx := cpu.Receivers()
		prev, err := takeSample(act, objs, iface, rx)
		if err != nil {
			return err
		}
		if !lab.SleepCtx(ctx.Done(), o.Window) {
			return ctx.Err()
		}
		cur, err := takeSample(act, objs, iface, rx)
		if err != nil {
			return err
		}
		setup := s.setup
		s = cur.since(prev)
		s.setup = setup
		o.Progress.Say(fmt.Sprintf("%s IPv%d: %.3f Mpps dropped of %.2f offered", l.name, tr.Family, s.mpps, s.offered))
		return nil
	}()
	if gerr := gen.Halt(); err == nil {
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
	cpu       []lab.CPUTimes
}

// sample is the rates over one window.
type sample struct {
	mpps, offered, ifaceRx float64
	cpuBusy                float64 // fraction of one CPU
	packets                uint64
	setup                  float64 // seconds the layer took to set up, its list loaded
}

func takeSample(act *active, objs *lab.Objects, iface *lab.IfaceCounter, rxCPUs []int) (c counts, err error) {
	c.at = time.Now()
	if c.dropped, err = act.count(); err != nil {
		return c, fmt.Errorf("read the layer's counter: %w", err)
	}
	if c.generated, err = objs.Sent(); err != nil {
		return c, err
	}
	if c.ifaceRx, err = iface.RxPackets(); err != nil {
		return c, err
	}
	for _, cpu := range rxCPUs {
		t, err := lab.ReadCPU(cpu)
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
		s.cpuBusy += c.cpu[i].BusySince(p.cpu[i])
	}
	return s
}

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
	r.MPPS, r.MPPSMin, r.MPPSMax = lab.Median(mpps), mpps[0], mpps[len(mpps)-1]
	r.OfferedMPPS = lab.Median(pick(func(x sample) float64 { return x.offered }))
	r.SetupSeconds = lab.Median(pick(func(x sample) float64 { return x.setup }))
	r.IfaceRxMPPS = lab.Median(pick(func(x sample) float64 { return x.ifaceRx }))
	r.CPUBusy = 100 * lab.Median(pick(func(x sample) float64 { return x.cpuBusy }))
	r.NsPerPacket = lab.Median(pick(func(x sample) float64 {
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

// environment records what the numbers depend on.
func environment(o Options, cpu lab.CPUPlan) Env {
	h := lab.ThisHost()
	e := Env{
		Kernel: h.Kernel, CPUModel: h.CPUModel, CPUs: h.CPUs,
		GeneratorCPU: cpu.Gen, ReceiveCPU: cpu.Rx, AppCPU: cpu.App, BatchSize: lab.BatchSize,
		Warmup: o.Warmup.String(), Window: o.Window.String(), Repeats: o.Repeats,
		Sources: o.Sources, Src4: o.Src4.String(), Src6: o.Src6.String(),
		Iptables: lab.IptablesFor(4), Unlisted: o.Unlisted,
	}
	if b, err := os.ReadFile("/proc/sys/net/core/bpf_jit_enable"); err == nil {
		e.JIT = strings.TrimSpace(string(b)) != "0"
	}
	e.Emulated = strings.Contains(e.CPUModel, "QEMU")
	return e
}
