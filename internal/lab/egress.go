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

	"github.com/rampart-fw/rampart/internal/bench"
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

// EgressMetrics in report order.
var EgressMetrics = []string{MetricSetup, MetricUDP, MetricTCP, MetricCPU, MetricPingAvg, MetricPingP99}

// EgressOptions configure `rampart lab egress`.
type EgressOptions struct {
	Methods      []string // empty: all
	Sizes        []int
	Rounds       int
	Window       time.Duration // each throughput test
	Destinations string        // "many" (default) or "one", as the study ran it
	Budget       time.Duration // a method's set-up past it is reported as over budget
	Dir          string
	Progress     Progress
}

// Defaults for a full run and for --quick; --large adds 10M and 50M.
var (
	EgressFull  = EgressOptions{Sizes: []int{10, 100, 1000, 10_000, 100_000, 1_000_000}, Rounds: 5, Window: 2 * time.Second, Destinations: "many", Budget: 5 * time.Minute}
	EgressQuick = EgressOptions{Sizes: []int{10, 10_000, 1_000_000}, Rounds: 2, Window: 500 * time.Millisecond, Destinations: "many", Budget: time.Minute}
	EgressLarge = []int{10_000_000, 50_000_000}
)

// An egress method is one way to filter the client's outgoing traffic by
// destination.
type egressMethod struct {
	name  string
	tools []string
	setup func(r *egressRow) error // returns once the filter is live
}

// EgressMethods are the study's three, what a user picks today, and rampart.
var EgressMethods = []egressMethod{
	{"none", nil, func(*egressRow) error { return nil }},
	{"iptables", []string{"iptables"}, setupEgressIptables},
	{"ipset", []string{"ipset", "iptables"}, setupEgressIpset},
	{"nft-set", []string{"nft"}, setupEgressNft},
	{"tc-lpm", nil, setupEgressTCLPM},
	{"rampart", nil, setupEgressRampart},
}

// EgressMethodNames lists the methods in order.
func EgressMethodNames() []string {
	var n []string
	for _, m := range EgressMethods {
		n = append(n, m.name)
	}
	return n
}

// Validate checks the options before anything is created.
func (o *EgressOptions) Validate() error {
	for _, m := range o.Methods {
		if !slices.Contains(EgressMethodNames(), m) {
			return fmt.Errorf("--methods: unknown method %q: choose from %s", m, strings.Join(EgressMethodNames(), ", "))
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

// EgressResult is one method's metric at one list size over the rounds.
type EgressResult struct {
	Method string  `json:"method"`
	Size   int     `json:"size"`
	Metric string  `json:"metric"`
	Value  float64 `json:"value"` // median
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Status string  `json:"status"`
	Reason string  `json:"reason,omitempty"`
}

// EgressEnv is what the numbers depend on.
type EgressEnv struct {
	Host
	ClientCPU    int    `json:"client_cpu"`
	ServerCPU    int    `json:"server_cpu"`
	Rounds       int    `json:"rounds"`
	Window       string `json:"window"`
	Destinations string `json:"destinations"`
	Mix          string `json:"mix"`
	Iptables     string `json:"iptables"`
}

// EgressReport is the whole run.
type EgressReport struct {
	Env     EgressEnv      `json:"environment"`
	Results []EgressResult `json:"results"`
	Checks  []Check        `json:"checks"`
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

// egressList is the study's prefix mix (10% /24, 1% /16, the rest /32) of
// size, distinct, without anything in the served range or the lab's own
// link, and with probeNet in place of its first /24.
func egressList(size int) []netip.Prefix {
	var out []netip.Prefix
	seen := map[netip.Prefix]bool{}
	for _, p := range bench.Prefixes(4, bench.MixEgress, size+size/8+16) {
		if len(out) == size {
			break
		}
		if p.Overlaps(servedNet) || p.Overlaps(dstNet4) || seen[p] {
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

// egressListFile is one size's list, in memory for the methods that load
// prefixes and as the file rampart's policy names.
type egressListFile struct {
	file     string
	prefixes []netip.Prefix
}

// egressRow is what a method's setup works with: the client is the
// topology's generator side, the server its receiving side.
type egressRow struct {
	topo    *topology
	list    []netip.Prefix
	file    string // the list, one prefix a line
	dir     string
	ipt     string
	objs    *labObjects
	rampart *rampartHook // the rampart method's
}

// Egress runs the egress study. It removes what it created, also when ctx
// is cancelled; a method that cannot run is reported and the run goes on.
func Egress(ctx context.Context, o EgressOptions) (*EgressReport, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Dir == "" {
		return nil, errors.New("lab: EgressOptions need Dir")
	}
	sweepStale()
	defer os.RemoveAll(PinRoot())
	if missing := missingTool([]string{"ip", "ethtool", "iperf3", "ping"}); missing != "" {
		return nil, errors.New(missing)
	}
	cpu := cpus()
	rep := &EgressReport{Env: EgressEnv{Host: thisHost(),
		ClientCPU: cpu.gen, ServerCPU: cpu.rx, Rounds: o.Rounds, Window: o.Window.String(), Destinations: o.Destinations,
		Mix: "10% /24, 1% /16, the rest /32", Iptables: iptablesFor(4)}}
	methods := EgressMethods
	if len(o.Methods) > 0 {
		methods = slices.DeleteFunc(slices.Clone(methods), func(m egressMethod) bool { return !slices.Contains(o.Methods, m.name) })
	}
	cells := map[egressKey]*egressCell{}
	lists := map[int]egressListFile{}
	for _, size := range o.Sizes {
		l := egressListFile{file: filepath.Join(o.Dir, fmt.Sprintf("egress-%d.txt", size)), prefixes: egressList(size)}
		if err := writePrefixes(l.file, l.prefixes); err != nil {
			return nil, err
		}
		lists[size] = l
		for _, m := range methods {
			cells[egressKey{m.name, size}] = &egressCell{samples: map[string][]float64{}, status: StatusOK}
		}
	}
	seq := 0
	for round := range o.Rounds {
		for _, size := range o.Sizes {
			for _, m := range methods {
				c := cells[egressKey{m.name, size}]
				if c.status != StatusOK {
					continue
				}
				seq++
				o.Progress.say(fmt.Sprintf("round %d/%d: %s with %d prefixes", round+1, o.Rounds, m.name, size))
				s, err := measureEgress(ctx, o, m, lists[size], seq, cpu)
				if ctx.Err() != nil {
					rep.Results = egressResults(o.Sizes, methods, cells)
					return rep, ctx.Err()
				}
				if err != nil {
					c.status, c.reason = failure(err)
					continue
				}
				for k, v := range s {
					c.samples[k] = append(c.samples[k], v)
				}
			}
		}
	}
	rep.Results = egressResults(o.Sizes, methods, cells)
	rep.finish()
	return rep, nil
}

// egressKey and egressCell are one method at one size over the rounds.
type egressKey struct {
	method string
	size   int
}

type egressCell struct {
	samples map[string][]float64 // by metric
	status  string
	reason  string
}

// egressResults summarises every cell: a row per metric, median and range.
func egressResults(sizes []int, methods []egressMethod, cells map[egressKey]*egressCell) []EgressResult {
	var out []EgressResult
	for _, metric := range EgressMetrics {
		for _, m := range methods {
			for _, size := range sizes {
				c := cells[egressKey{m.name, size}]
				r := EgressResult{Method: m.name, Size: size, Metric: metric, Status: c.status, Reason: c.reason}
				if v := slices.Sorted(slices.Values(c.samples[metric])); len(v) > 0 {
					r.Value, r.Min, r.Max = median(v), v[0], v[len(v)-1]
				} else if r.Status == StatusOK {
					r.Status, r.Reason = StatusFailed, "no round measured it"
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
