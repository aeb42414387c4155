// Package proxy is `rampart lab proxy`: rampart proxy against direct
// routing, HAProxy and nginx stream, transparent, in three namespaces.
package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/netns"
	rampartproxy "github.com/rampart-fw/rampart/internal/proxy"
)

// Options set up `rampart lab proxy`.
type Options struct {
	Window   time.Duration // per measurement
	Rounds   int           // interleaved; medians reported
	Sessions int           // UDP client sessions (capped by the descriptor limit)
	Methods  []string
	Exe      string // the rampart binary, for its proxy; it runs with this process's environment
	Dir      string // configurations and logs
	Progress lab.Progress
}

// Methods are the proxies compared, direct (routed, no proxy) first.
var Methods = []string{"direct", "rampart", "haproxy", "nginx"}

// The metrics.
const (
	MetricTCP1    = "tcp_1conn_gbps"
	MetricTCP16   = "tcp_16conn_gbps"
	MetricCPS     = "connections_per_second"
	MetricUDPPps  = "udp_pps"
	MetricRSSLow  = "rss_1k_sessions_mb"
	MetricRSSHigh = "rss_cap_sessions_mb"
)

// Result is one method's medians.
type Result struct {
	Method  string             `json:"method"`
	Metrics map[string]float64 `json:"metrics"`
	Status  string             `json:"status"` // ok, skipped, error
	Reason  string             `json:"reason,omitempty"`
}

// Report is the whole run.
type Report struct {
	Host     lab.Host    `json:"host"`
	Window   string      `json:"window"`
	Rounds   int         `json:"rounds"`
	Sessions int         `json:"udp_sessions"`
	Results  []Result    `json:"results"`
	Checks   []lab.Check `json:"checks"`
}

// The three namespaces and addresses: the client's link, and the
// backend's on the proxy's other side (another host, not loopback).
var (
	pbClient   = netip.MustParseAddr("10.82.1.2")
	pbProxy    = netip.MustParseAddr("10.82.1.1")
	pbProxyB   = netip.MustParseAddr("10.82.2.1")
	pbBackend  = netip.MustParseAddr("10.82.2.2")
	pbIperf    = uint16(5201)
	pbCPSPort  = uint16(8000)
	pbUDPPort  = uint16(9000)
	pbServices = []uint16{pbIperf, pbCPSPort, pbUDPPort}
)

type proxyTopo struct{ client, proxy, backend string }

func newProxyTopo(seq int) (*proxyTopo, error) {
	tag := fmt.Sprintf("%d-%d", os.Getpid()%100000, seq)
	t := &proxyTopo{"rpb-" + tag + "-c", "rpb-" + tag + "-p", "rpb-" + tag + "-b"}
	steps := [][]string{}
	for _, ns := range []string{t.client, t.proxy, t.backend} {
		steps = append(steps, []string{"ip", "netns", "add", ns}, []string{"ip", "-n", ns, "link", "set", "lo", "up"})
	}
	steps = append(steps,
		[]string{"ip", "-n", t.client, "link", "add", "c0", "type", "veth", "peer", "name", "p0", "netns", t.proxy},
		[]string{"ip", "-n", t.proxy, "link", "add", "p1", "type", "veth", "peer", "name", "b0", "netns", t.backend},
		[]string{"ip", "-n", t.client, "addr", "add", pbClient.String() + "/24", "dev", "c0"},
		[]string{"ip", "-n", t.proxy, "addr", "add", pbProxy.String() + "/24", "dev", "p0"},
		[]string{"ip", "-n", t.proxy, "addr", "add", pbProxyB.String() + "/24", "dev", "p1"},
		[]string{"ip", "-n", t.backend, "addr", "add", pbBackend.String() + "/24", "dev", "b0"},
		[]string{"ip", "-n", t.client, "link", "set", "c0", "up"},
		[]string{"ip", "-n", t.proxy, "link", "set", "p0", "up"},
		[]string{"ip", "-n", t.proxy, "link", "set", "p1", "up"},
		[]string{"ip", "-n", t.backend, "link", "set", "b0", "up"},
		// Direct is routed through the proxy's host; the backend's
		// default route is the proxy, as HAProxy's transparent mode needs.
		[]string{"ip", "-n", t.client, "route", "add", "10.82.2.0/24", "via", pbProxy.String()},
		[]string{"ip", "-n", t.backend, "route", "add", "default", "via", pbProxyB.String()},
		[]string{"ip", "netns", "exec", t.proxy, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	)
	for _, ns := range []string{t.client, t.proxy, t.backend} {
		// Connection-rate runs open tens of thousands of connections.
		steps = append(steps, []string{"ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535", "net.ipv4.tcp_tw_reuse=1"})
	}
	for _, s := range steps {
		if err := lab.Run(s...); err != nil {
			t.close()
			return nil, err
		}
	}
	return t, nil
}

func (t *proxyTopo) close() {
	for _, ns := range []string{t.client, t.proxy, t.backend} {
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

// Run measures each method in interleaved rounds, in a fresh topology per
// round.
func Run(ctx context.Context, o Options) (*Report, error) {
	// Every session is a descriptor of the proxy's: root may raise the
	// limit the proxies inherit; else the sessions are capped by it.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && int(lim.Max) < o.Sessions+10000 {
		want := uint64(o.Sessions + 10000)
		if unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: want, Max: want}) == nil {
			lim.Max = want
		}
	}
	if int(lim.Max)-2000 < o.Sessions {
		o.Sessions = max(int(lim.Max)-2000, 1000)
	}
	rep := &Report{Host: lab.ThisHost(), Window: o.Window.String(), Rounds: o.Rounds, Sessions: o.Sessions}
	samples := map[string]map[string][]float64{}
	fail := map[string][2]string{}
	for round := range o.Rounds {
		for i, m := range o.Methods {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if _, failed := fail[m]; failed {
				continue
			}
			o.Progress.Say(fmt.Sprintf("round %d/%d: %s", round+1, o.Rounds, m))
			s, err := runOnce(ctx, o, m, round*len(o.Methods)+i)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				status, reason := lab.Failure(err)
				fail[m] = [2]string{status, reason}
				continue
			}
			if samples[m] == nil {
				samples[m] = map[string][]float64{}
			}
			for k, v := range s {
				samples[m][k] = append(samples[m][k], v)
			}
		}
	}
	for _, m := range o.Methods {
		r := Result{Method: m, Metrics: map[string]float64{}, Status: "ok"}
		if f, failed := fail[m]; failed {
			r.Status, r.Reason = f[0], f[1]
		}
		for k, v := range samples[m] {
			sort.Float64s(v)
			r.Metrics[k] = lab.Median(v)
		}
		rep.Results = append(rep.Results, r)
	}
	rep.check()
	return rep, nil
}

func (r *Report) value(method, metric string) (float64, bool) {
	for _, x := range r.Results {
		if x.Method == method && x.Status == "ok" {
			v, ok := x.Metrics[metric]
			return v, ok
		}
	}
	return 0, false
}

// check holds rampart to the targets: 16-connection TCP ≥ 90% of direct
// and ≥ HAProxy's, connections per second ≥ HAProxy's, UDP pps ≥ nginx's,
// resident memory within ±10% between 1k sessions and the cap.
func (r *Report) check() {
	ratio := func(name, metric, other, target string, min float64) {
		a, ok1 := r.value("rampart", metric)
		b, ok2 := r.value(other, metric)
		if ok1 && ok2 && b > 0 {
			r.Checks = append(r.Checks, lab.Check{Name: name, Family: 4, Value: a / b, Target: target, Met: a/b >= min})
		}
	}
	ratio("tcp_16conn_vs_direct", MetricTCP16, "direct", "≥ 0.90", 0.9)
	ratio("tcp_16conn_vs_haproxy", MetricTCP16, "haproxy", "≥ 1.00", 1)
	ratio("cps_vs_haproxy", MetricCPS, "haproxy", "≥ 1.00", 1)
	ratio("udp_pps_vs_nginx", MetricUDPPps, "nginx", "≥ 1.00", 1)
	lo, ok1 := r.value("rampart", MetricRSSLow)
	hi, ok2 := r.value("rampart", MetricRSSHigh)
	if ok1 && ok2 && lo > 0 {
		r.Checks = append(r.Checks, lab.Check{Name: "rss_cap_vs_1k_sessions", Family: 4, Value: hi / lo, Target: "0.90–1.10", Met: hi/lo >= 0.9 && hi/lo <= 1.1})
	}
}

// runOnce runs one method in a fresh topology.
func runOnce(ctx context.Context, o Options, method string, seq int) (map[string]float64, error) {
	t, err := newProxyTopo(seq)
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	defer t.close()
	target := pbProxy
	pid := 0
	switch method {
	case "direct":
		target = pbBackend
	case "rampart":
		var stop func()
		if pid, stop, err = t.startRampart(ctx, o); err != nil {
			return nil, err
		}
		defer stop()
	case "haproxy", "nginx":
		if missing := lab.MissingTool([]string{method}); missing != "" {
			return nil, lab.SkipError{Reason: missing}
		}
		stop, err := t.startOther(ctx, o, method)
		if err != nil {
			return nil, err
		}
		defer stop()
	default:
		return nil, fmt.Errorf("unknown method %q", method)
	}
	srv, err := t.startBackend(ctx)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	s := map[string]float64{}
	if err := t.waitListening(ctx, target, pbCPSPort); err != nil {
		return nil, fmt.Errorf("%s does not answer: %w", method, err)
	}
	if s[MetricCPS], err = t.connRate(ctx, target, o.Window, srv); err != nil {
		return nil, fmt.Errorf("connections per second: %w", err)
	}
	if method != "direct" && !srv.onlyPeer(pbClient) {
		return nil, fmt.Errorf("not transparent: the backend saw %v, not the client's %s", srv.peerList(), pbClient)
	}
	for _, p := range []struct {
		metric  string
		streams int
	}{{MetricTCP1, 1}, {MetricTCP16, 16}} {
		if s[p.metric], err = t.iperf(ctx, target, p.streams, o.Window); err != nil {
			return nil, fmt.Errorf("iperf3 -P %d: %w", p.streams, err)
		}
	}
	if method == "haproxy" {
		return s, nil // HAProxy proxies no UDP
	}
	low, high, pps, err := t.udpSessions(ctx, target, o, srv, pid)
	if err != nil {
		return nil, fmt.Errorf("UDP: %w", err)
	}
	s[MetricUDPPps] = pps
	if pid != 0 {
		s[MetricRSSLow], s[MetricRSSHigh] = low, high
	}
	return s, nil
}

func (t *proxyTopo) proxyConfig(o Options) *rampartproxy.Config {
	cfg := &rampartproxy.Config{Table: rampartproxy.DefaultTable}
	for _, port := range pbServices {
		s := rampartproxy.Service{Name: fmt.Sprint(port), Listen: netip.AddrPortFrom(pbProxy, port), Backends: []netip.AddrPort{netip.AddrPortFrom(pbBackend, port)},
			Balance: "round-robin", Transparent: true, IdleTimeout: time.Minute, MaxSessions: o.Sessions + 100}
		s.UDP = port == pbUDPPort
		cfg.Services = append(cfg.Services, s)
	}
	return cfg
}

func (t *proxyTopo) startRampart(ctx context.Context, o Options) (int, func(), error) {
	var b strings.Builder
	b.WriteString("services:\n")
	for _, s := range t.proxyConfig(o).Services {
		fmt.Fprintf(&b, "  - {name: s%s, protocol: %s, listen: %q, backends: [%q], max_sessions: %d, idle_timeout: 1m, health_interval: 0s}\n", s.Name, s.Proto(), s.Listen, s.Backends[0], s.MaxSessions)
	}
	file := filepath.Join(o.Dir, "rampart-proxy.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		return 0, nil, err
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", t.proxy, o.Exe, "proxy", "-f", file, "--status", filepath.Join(o.Dir, "proxy.sock"))
	log, err := os.Create(filepath.Join(o.Dir, "rampart-proxy.log"))
	if err != nil {
		return 0, nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	return cmd.Process.Pid, stopper(cmd, log), nil
}

// startOther runs HAProxy or nginx stream, transparent, with the proxy
// host's routing rampart proxy would install (HAProxy and nginx leave it
// to the operator).
func (t *proxyTopo) startOther(ctx context.Context, o Options, method string) (func(), error) {
	cfg := t.proxyConfig(o)
	if err := netns.Run(t.proxy, func() error { return rampartproxy.NewRouting(cfg).Install() }); err != nil {
		return nil, err
	}
	var conf string
	var args []string
	switch method {
	case "haproxy":
		// HAProxy needs two descriptors per connection and refuses to
		// start when maxconn asks for more than the limit.
		conf = fmt.Sprintf("global\n  maxconn %d\ndefaults", o.Sessions/2)
		conf += "\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n"
		for _, port := range []uint16{pbIperf, pbCPSPort} {
			conf += fmt.Sprintf("listen p%d\n  bind %s:%d\n  source 0.0.0.0 usesrc clientip\n  server b %s:%d\n", port, pbProxy, port, pbBackend, port)
		}
		file := filepath.Join(o.Dir, "haproxy.cfg")
		if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		args = []string{"haproxy", "-db", "-f", file}
	case "nginx":
		n := o.Sessions + 2000
		conf = fmt.Sprintf(`load_module /usr/lib/nginx/modules/ngx_stream_module.so;
user root;
worker_processes auto;
worker_rlimit_nofile %[1]d;
pid %[2]s/nginx.pid;
error_log %[2]s/nginx-error.log;
events { worker_connections %[1]d; }
stream {
  server { listen %[3]s:%[4]d; proxy_pass %[5]s:%[4]d; proxy_bind $remote_addr transparent; }
  server { listen %[3]s:%[6]d; proxy_pass %[5]s:%[6]d; proxy_bind $remote_addr transparent; }
  server { listen %[3]s:%[7]d udp; proxy_pass %[5]s:%[7]d; proxy_bind $remote_addr transparent; proxy_timeout 60s; }
}
`, n, o.Dir, pbProxy, pbIperf, pbBackend, pbCPSPort, pbUDPPort)
		file := filepath.Join(o.Dir, "nginx.conf")
		if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		args = []string{"nginx", "-c", file, "-g", "daemon off;"}
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.proxy}, args...)...)
	log, err := os.Create(filepath.Join(o.Dir, method+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop := stopper(cmd, log)
	return func() {
		stop()
		netns.Run(t.proxy, rampartproxy.Cleanup)
	}, nil
}

// stopper ends a proxy process: SIGTERM, then SIGKILL after 3 s.
func stopper(cmd *exec.Cmd, log *os.File) func() {
	return func() {
		cmd.Process.Signal(unix.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		log.Close()
	}
}
