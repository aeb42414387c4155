// Package egress is `rampart lab egress`: what filtering outgoing traffic
// by destination costs, by list size, rampart beside iptables, ipset,
// nftables and an LPM trie.
package egress

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

	"github.com/rampart-fw/rampart/internal/bench"
	"github.com/rampart-fw/rampart/internal/lab"
)

// The egress study's metrics.
const (
	MetricSetup   = "setup_seconds"  // list file to filter live
	MetricUDP     = "udp_mpps"       // UDP at saturation, packets that left the client
	MetricTCP     = "tcp_gbps"       // one TCP connection (iperf3)
	MetricCPU     = "cpu_1g_percent" // the client CPU's busy share sending UDP at 1 Gbit/s
	MetricPingAvg = "ping_avg_us"    // ping -i 0.001 -c 1000
	MetricPingP99 = "ping_p99_us"
)

// Metrics in report order.
var Metrics = []string{MetricSetup, MetricUDP, MetricTCP, MetricCPU, MetricPingAvg, MetricPingP99}

// Options configure `rampart lab egress`.
type Options struct {
	Methods      []string // empty: all
	Sizes        []int
	Rounds       int
	Window       time.Duration // each throughput test
	Destinations string        // "many" (default) or "one", as the study ran it
	Budget       time.Duration // a method's set-up past it is reported as over budget
	Dir          string
	Progress     lab.Progress
}

// Defaults for a full run and for --quick; --large adds 10M and 50M.
var (
	Full  = Options{Sizes: []int{10, 100, 1000, 10_000, 100_000, 1_000_000}, Rounds: 5, Window: 2 * time.Second, Destinations: "many", Budget: 5 * time.Minute}
	Quick = Options{Sizes: []int{10, 10_000, 1_000_000}, Rounds: 2, Window: 500 * time.Millisecond, Destinations: "many", Budget: time.Minute}
	Large = []int{10_000_000, 50_000_000}
)

// A method is one way to filter the client's outgoing traffic by
// destination.
type method struct {
	name  string
	tools []string
	setup func(r *row) error // returns once the filter is live
}

// methods are the study's three, what a user picks today, and rampart.
var methods = []method{
	{"none", nil, func(*row) error { return nil }},
	{"iptables", []string{"iptables"}, setupIptables},
	{"ipset", []string{"ipset", "iptables"}, setupIpset},
	{"nft-set", []string{"nft"}, setupNft},
	{"tc-lpm", nil, setupTCLPM},
	{"rampart", nil, setupRampart},
}

// MethodNames lists the methods in order.
func MethodNames() []string {
	var n []string
	for _, m := range methods {
		n = append(n, m.name)
	}
	return n
}

// Validate checks the options before anything is created.
func (o *Options) Validate() error {
	for _, m := range o.Methods {
		if !slices.Contains(MethodNames(), m) {
			return fmt.Errorf("--methods: unknown method %q: choose from %s", m, strings.Join(MethodNames(), ", "))
		}
	}
	for _, s := range o.Sizes {
		if s < 1 || s > 100_000_000 {
			return fmt.Errorf("--sizes: %d: a size is 1 to 100000000 prefixes", s)
		}
	}
	switch {
	case len(o.Sizes) == 0:
		return errors.New("--sizes: give at least one size")
	case o.Rounds < 1 || o.Window <= 0:
		return errors.New("--rounds must be at least 1 and --window positive")
	case o.Destinations != "many" && o.Destinations != "one":
		return fmt.Errorf("--destinations %q: many or one", o.Destinations)
	}
	return nil
}

// Result is one method's metric at one list size over the rounds.
type Result struct {
	Method string  `json:"method"`
	Size   int     `json:"size"`
	Metric string  `json:"metric"`
	Value  float64 `json:"value"` // median
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Status string  `json:"status"`
	Reason string  `json:"reason,omitempty"`
}

// Env is what the numbers depend on.
type Env struct {
	lab.Host
	ClientCPU    int    `json:"client_cpu"`
	ServerCPU    int    `json:"server_cpu"`
	Rounds       int    `json:"rounds"`
	Window       string `json:"window"`
	Destinations string `json:"destinations"`
	Mix          string `json:"mix"`
	Iptables     string `json:"iptables"`
}

// Report is the whole run.
type Report struct {
	Env     Env         `json:"environment"`
	Results []Result    `json:"results"`
	Checks  []lab.Check `json:"checks"`
}

// The client sends to destinations in trafficNet, all of which the server
// answers for (a local route for servedNet) and none of which a list
// holds; probeNet is in every list and routed to the server too, so that
// a row can see its filter drop.
var (
	servedNet  = netip.MustParsePrefix("100.64.0.0/10")
	trafficNet = netip.MustParsePrefix("100.64.0.0/16")
	probeNet   = netip.MustParsePrefix("100.127.0.0/24")
	probeAddr  = netip.MustParseAddr("100.127.0.1")
)

const (
	udpSinkPort = 9 // discard: nothing listens, the server's interface counts
	probePort   = 5001
	pingCount   = 1000
	iperfPort   = 5201
)

// denyList is the study's prefix mix (10% /24, 1% /16, the rest /32) of
// size, distinct, without anything in the served range or the lab's own
// link, and with probeNet in place of its first /24.
func denyList(size int) []netip.Prefix {
	var out []netip.Prefix
	seen := map[netip.Prefix]bool{}
	for _, p := range bench.Prefixes(4, bench.MixEgress, size+size/8+16) {
		if len(out) == size {
			break
		}
		if p.Overlaps(servedNet) || p.Overlaps(lab.DstNet4) || seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, p)
	}
	for i, p := range out {
		if p.Bits() == 24 || i == len(out)-1 {
			out[i] = probeNet
			break
		}
	}
	return out
}

// listFile is one size's list, in memory for the methods that load
// prefixes and as the file rampart's policy names.
type listFile struct {
	file     string
	prefixes []netip.Prefix
}

// row is what a method's setup works with: the client is the topology's
// generator side, the server its receiving side.
type row struct {
	topo    *lab.Topology
	list    []netip.Prefix
	file    string // the list, one prefix a line
	dir     string
	ipt     string
	objs    *lab.Objects
	rampart *lab.RampartHook // the rampart method's
}

// Run runs the egress study. It removes what it created, also when ctx
// is cancelled; a method that cannot run is reported and the run goes on.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Dir == "" {
		return nil, errors.New("lab egress: Options need Dir")
	}
	lab.SweepStale()
	defer os.RemoveAll(lab.PinRoot())
	if missing := lab.MissingTool([]string{"ip", "ethtool", "iperf3", "ping"}); missing != "" {
		return nil, errors.New(missing)
	}
	cpu := lab.CPUs()
	rep := &Report{Env: Env{Host: lab.ThisHost(),
		ClientCPU: cpu.Gen, ServerCPU: cpu.Rx, Rounds: o.Rounds, Window: o.Window.String(), Destinations: o.Destinations,
		Mix: "10% /24, 1% /16, the rest /32", Iptables: lab.IptablesFor(4)}}
	chosen := methods
	if len(o.Methods) > 0 {
		chosen = slices.DeleteFunc(slices.Clone(methods), func(m method) bool { return !slices.Contains(o.Methods, m.name) })
	}
	cells := map[key]*cell{}
	lists := map[int]listFile{}
	for _, size := range o.Sizes {
		l := listFile{file: filepath.Join(o.Dir, fmt.Sprintf("egress-%d.txt", size)), prefixes: denyList(size)}
		if err := writePrefixes(l.file, l.prefixes); err != nil {
			return nil, err
		}
		lists[size] = l
		for _, m := range chosen {
			cells[key{m.name, size}] = &cell{samples: map[string][]float64{}, status: lab.StatusOK}
		}
	}
	seq := 0
	for round := range o.Rounds {
		for _, size := range o.Sizes {
			for _, m := range chosen {
				c := cells[key{m.name, size}]
				if c.status != lab.StatusOK {
					continue
				}
				seq++
				o.Progress.Say(fmt.Sprintf("round %d/%d: %s with %d prefixes", round+1, o.Rounds, m.name, size))
				s, err := measure(ctx, o, m, lists[size], seq, cpu)
				if ctx.Err() != nil {
					rep.Results = results(o.Sizes, chosen, cells)
					return rep, ctx.Err()
				}
				if err != nil {
					c.status, c.reason = lab.Failure(err)
					continue
				}
				for k, v := range s {
					c.samples[k] = append(c.samples[k], v)
				}
			}
		}
	}
	rep.Results = results(o.Sizes, chosen, cells)
	rep.finish()
	return rep, nil
}

// key and cell are one method at one size over the rounds.
type key struct {
	method string
	size   int
}

type cell struct {
	samples map[string][]float64 // by metric
	status  string
	reason  string
}

// results summarises every cell: a row per metric, median and range.
func results(sizes []int, methods []method, cells map[key]*cell) []Result {
	var out []Result
	for _, metric := range Metrics {
		for _, m := range methods {
			for _, size := range sizes {
				c := cells[key{m.name, size}]
				r := Result{Method: m.name, Size: size, Metric: metric, Status: c.status, Reason: c.reason}
				if v := slices.Sorted(slices.Values(c.samples[metric])); len(v) > 0 {
					r.Value, r.Min, r.Max = lab.Median(v), v[0], v[len(v)-1]
				} else if r.Status == lab.StatusOK {
					r.Status, r.Reason = lab.StatusFailed, "no round measured it"
				}
				out = append(out, r)
			}
		}
	}
	return out
}

func writePrefixes(file string, ps []netip.Prefix) error {
	b := make([]byte, 0, len(ps)*20)
	for _, p := range ps {
		b = p.AppendTo(b)
		b = append(b, '\n')
	}
	return os.WriteFile(file, b, 0o644)
}
