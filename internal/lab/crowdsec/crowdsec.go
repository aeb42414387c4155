// Package crowdsec is `rampart lab crowdsec`: one CrowdSec Local API's
// decisions fed to rampart's bouncer (rampart serve) and to CrowdSec's own
// firewall bouncer (cs-firewall-bouncer, nftables mode), each in a
// namespace of its own, side by side in one run: how long a cscli import
// takes to be enforced, what the bouncer spends on it (CPU, memory), and
// whether a ban sent again before it expires stays enforced
// (crowdsecurity/cs-firewall-bouncer #509).
package crowdsec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/netns"
)

// Bouncers are the bouncers a run compares.
var Bouncers = []string{"rampart", "cs-firewall-bouncer"}

// Options of a run.
type Options struct {
	Sizes    []int         // decisions per import
	Bouncers []string      // of Bouncers
	Refresh  time.Duration // the refresh check's first ban; 0: no check
	Exe      string        // the rampart binary, for its serve; it runs with this process's environment
	Dir      string        // the run's work directory
	Progress lab.Progress
}

// Row is one bouncer's sync of one import.
type Row struct {
	Bouncer   string `json:"bouncer"`
	Decisions int    `json:"decisions"`
	// ImportSeconds is cscli decisions import's own time; EnforcedSeconds
	// runs from its start until a ban added after it is enforced (the
	// bouncers apply deltas in order); AfterImportSeconds from its end.
	ImportSeconds      float64 `json:"import_seconds"`
	EnforcedSeconds    float64 `json:"enforced_seconds"`
	AfterImportSeconds float64 `json:"after_import_seconds"`
	CPUSeconds         float64 `json:"cpu_seconds"` // the bouncer's, over EnforcedSeconds
	RSSBytes           uint64  `json:"rss_bytes"`   // the bouncer's, once enforced
	PeakRSSBytes       uint64  `json:"peak_rss_bytes"`
	// A flood from the banned sources once they are enforced: the receive
	// CPU's busy time per packet it took in, that rate, and how many of its
	// datagrams reached the socket (none should).
	NsPerPacket float64 `json:"ns_per_packet"`
	FloodMpps   float64 `json:"flood_mpps"`
	Leaked      int     `json:"leaked"`
	Status      string  `json:"status"` // ok, failed, skipped
	Reason      string  `json:"reason,omitempty"`
}

// RefreshRow says whether a ban sent again for longer, before its first
// decision expired, was still enforced after that first expiry.
type RefreshRow struct {
	Bouncer   string `json:"bouncer"`
	Decisions int    `json:"decisions"`
	First     string `json:"first"`
	Kept      bool   `json:"kept"`
	Status    string `json:"status"`
	Reason    string `json:"reason,omitempty"`
}

// Report is a run's result.
type Report struct {
	Host    lab.Host     `json:"host"`
	Rows    []Row        `json:"rows"`
	Speedup []Speedup    `json:"speedup,omitempty"`
	Refresh []RefreshRow `json:"refresh,omitempty"`
}

// Speedup is cs-firewall-bouncer's time from the import's end to
// enforcement over rampart's, at one size; Cost is rampart's CPU time per
// packet of the flood over cs-firewall-bouncer's.
type Speedup struct {
	Decisions int     `json:"decisions"`
	Ratio     float64 `json:"ratio"`
	Cost      float64 `json:"cost"`
}

func speedups(rows []Row) []Speedup {
	var out []Speedup
	for _, r := range rows {
		if r.Bouncer != "rampart" || r.Status != "ok" {
			continue
		}
		for _, f := range rows {
			if f.Bouncer == "cs-firewall-bouncer" && f.Decisions == r.Decisions && f.Status == "ok" && r.AfterImportSeconds > 0 {
				sp := Speedup{Decisions: r.Decisions, Ratio: f.AfterImportSeconds / r.AfterImportSeconds}
				if f.NsPerPacket > 0 {
					sp.Cost = r.NsPerPacket / f.NsPerPacket
				}
				out = append(out, sp)
			}
		}
	}
	return out
}

// Run measures every bouncer at every size, then the refresh check.
func Run(ctx context.Context, o Options) (*Report, error) {
	for _, tool := range []string{"crowdsec", "cscli"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s is not installed (apt-get install crowdsec)", tool)
		}
	}
	rep := &Report{Host: lab.ThisHost()}
	seq := 0
	for _, n := range o.Sizes {
		for _, b := range o.Bouncers {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			seq++
			o.Progress.Say(fmt.Sprintf("%s: %d decisions", b, n))
			row := Row{Bouncer: b, Decisions: n, Status: "ok"}
			if err := sync(ctx, o, seq, &row); err != nil {
				row.Status, row.Reason = lab.Failure(err)
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	rep.Speedup = speedups(rep.Rows)
	if o.Refresh > 0 {
		for _, b := range o.Bouncers {
			seq++
			o.Progress.Say(fmt.Sprintf("%s: a ban sent again before it expires", b))
			row := RefreshRow{Bouncer: b, Decisions: 1000, First: o.Refresh.String(), Status: "ok"}
			if err := refresh(ctx, o, seq, &row); err != nil {
				row.Status, row.Reason = lab.Failure(err)
			}
			rep.Refresh = append(rep.Refresh, row)
		}
	}
	return rep, nil
}

// round is one bouncer over its own LAPI and namespaces.
type round struct {
	lapi    *LAPI
	topo    *lab.Topology
	bouncer *exec.Cmd
	rx, tx  *net.UDPConn
	dir     string
}

func start(ctx context.Context, o Options, seq int, bouncer string) (*round, error) {
	r := &round{dir: filepath.Join(o.Dir, fmt.Sprintf("%d-%s", seq, bouncer))}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return nil, err
	}
	// The LAPI listens in the receiver's namespace, where both bouncers
	// run (cs-firewall-bouncer knows no other way to filter a namespace).
	var err error
	r.topo, err = lab.NewTopology(seq, lab.CPUs().Rx)
	if err == nil {
		if r.lapi, err = NewLAPI(r.dir, 8080, r.topo.RxNs); err == nil {
			err = r.lapi.Start()
		}
	}
	if err == nil {
		err = netns.Run(r.topo.RxNs, func() (err error) {
			r.rx, err = net.ListenUDP("udp", &net.UDPAddr{IP: lab.RxAddr4.AsSlice(), Port: lab.DstPort})
			return err
		})
	}
	if err == nil {
		err = netns.Run(r.topo.GenNs, func() (err error) {
			r.tx, err = net.DialUDP("udp", nil, &net.UDPAddr{IP: lab.RxAddr4.AsSlice(), Port: lab.DstPort})
			return err
		})
	}
	if err == nil && !r.arrives() {
		err = fmt.Errorf("datagrams from %s do not reach %s before any ban", lab.GenAddr4, lab.RxAddr4)
	}
	if err == nil {
		switch bouncer {
		case "rampart":
			err = r.startRampart(ctx, o)
		default:
			err = r.startFirewallBouncer(ctx)
		}
	}
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *round) close() {
	if r.bouncer != nil && r.bouncer.Process != nil {
		r.bouncer.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { r.bouncer.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			r.bouncer.Process.Kill()
			<-done
		}
	}
	for _, c := range []*net.UDPConn{r.rx, r.tx} {
		if c != nil {
			c.Close()
		}
	}
	if r.topo != nil {
		r.topo.Close()
	}
	if r.lapi != nil {
		r.lapi.Stop()
	}
}

// arrives sends five datagrams from the banned address and says whether
// any reached the receiver's socket: the kernel is the oracle.
func (r *round) arrives() bool {
	for range 5 {
		r.tx.Write([]byte("rampart-lab-crowdsec"))
	}
	buf := make([]byte, 64)
	got := false
	for {
		r.rx.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := r.rx.Read(buf); err != nil {
			return got
		}
		got = true
	}
}

func (r *round) startRampart(ctx context.Context, o Options) error {
	pol := filepath.Join(r.dir, "policy.yaml")
	text := fmt.Sprintf("crowdsec: {url: %q, api_key: %s, interval: 1s}\nrules:\n  - {name: crowdsec, src: crowdsec, action: drop}\n", r.lapi.URL, r.lapi.Key)
	if err := os.WriteFile(pol, []byte(text), 0o600); err != nil {
		return err
	}
	r.bouncer = InNetns(r.topo.RxNs, o.Exe, "serve", "-f", pol, "--iface", r.topo.RxIf, "--api", filepath.Join(r.dir, "api.sock"), "--persist", filepath.Join(r.dir, "persist"),
		"--detach-on-exit", "--pin-root", lab.PinRoot(), "--state-root", filepath.Join(r.dir, "rampart-state"))
	if err := r.startLogged("rampart.log"); err != nil {
		return err
	}
	// Ready once it has answered a poll.
	// Ready once it has applied its first answer, which it logs.
	return r.until(30*time.Second, "rampart serve's first poll of the LAPI", func() bool {
		b, _ := os.ReadFile(filepath.Join(r.dir, "rampart.log"))
		return bytes.Contains(b, []byte(`msg="crowdsec decisions applied" startup=true`))
	})
}

// startFirewallBouncer runs cs-firewall-bouncer in nftables mode in the
// receiver's namespace, configured as its package configures it, polling
// as often as rampart does.
func (r *round) startFirewallBouncer(ctx context.Context) error {
	if _, err := exec.LookPath("crowdsec-firewall-bouncer"); err != nil {
		return lab.SkipError{Reason: "crowdsec-firewall-bouncer is not installed (apt-get install crowdsec-firewall-bouncer)"}
	}
	conf := filepath.Join(r.dir, "cs-firewall-bouncer.yaml")
	text := fmt.Sprintf(`mode: nftables
pid_dir: %s
update_frequency: 1s
daemonize: false
log_mode: stdout
log_level: info
api_url: %s
api_key: %s
disable_ipv6: false
deny_action: DROP
deny_log: false
supported_decisions_types: [ban]
blacklists_ipv4: crowdsec-blacklists
blacklists_ipv6: crowdsec6-blacklists
nftables:
  ipv4: {enabled: true, set-only: false, table: crowdsec, chain: crowdsec-chain}
  ipv6: {enabled: true, set-only: false, table: crowdsec6, chain: crowdsec6-chain}
prometheus: {enabled: false}
`, r.dir, r.lapi.URL, r.lapi.Key)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return err
	}
	r.bouncer = InNetns(r.topo.RxNs, "crowdsec-firewall-bouncer", "-c", conf)
	if err := r.startLogged("cs-firewall-bouncer.log"); err != nil {
		return err
	}
	return r.until(30*time.Second, "cs-firewall-bouncer's nftables table", func() bool {
		return exec.Command("ip", "netns", "exec", r.topo.RxNs, "nft", "list", "chain", "ip", "crowdsec", "crowdsec-chain").Run() == nil
	})
}

func (r *round) startLogged(name string) error {
	f, err := os.Create(filepath.Join(r.dir, name))
	if err != nil {
		return err
	}
	r.bouncer.Stdout, r.bouncer.Stderr = f, f
	return r.bouncer.Start()
}

func (r *round) until(limit time.Duration, what string, ok func() bool) error {
	for end := time.Now().Add(limit); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			return fmt.Errorf("%s: not within %s (logs in %s)", what, limit, r.dir)
		}
		if r.bouncer.ProcessState != nil {
			return fmt.Errorf("the bouncer exited (logs in %s)", r.dir)
		}
	}
	return nil
}

// decisionsFile writes bans of the addresses, and of the sender too when
// it is set, as cscli imports them.
func (r *round) decisionsFile(name string, addrs []netip.Prefix, duration string, sender bool) (string, error) {
	var b strings.Builder
	b.WriteString("value,duration,type,scope\n")
	for _, a := range addrs {
		fmt.Fprintf(&b, "%s,%s,ban,ip\n", a.Addr(), duration)
	}
	if sender {
		fmt.Fprintf(&b, "%s,%s,ban,ip\n", lab.GenAddr4, duration)
	}
	file := filepath.Join(r.dir, name)
	return file, os.WriteFile(file, []byte(b.String()), 0o600)
}

// sync imports n decisions, then bans the sender, and times the ban.
func sync(ctx context.Context, o Options, seq int, row *Row) error {
	r, err := start(ctx, o, seq, row.Bouncer)
	if err != nil {
		return err
	}
	defer r.close()
	// The bans are the flood's sources.
	tr, err := lab.NewTraffic(4, lab.DefaultSrc4, row.Decisions)
	if err != nil {
		return err
	}
	file, err := r.decisionsFile("import.csv", tr.Prefixes(), "4h", false)
	if err != nil {
		return err
	}
	pid := r.bouncer.Process.Pid
	cpu0 := cpuSeconds(pid)
	t0 := time.Now()
	if _, err := r.lapi.Cscli("decisions", "import", "-i", file); err != nil {
		return err
	}
	t1 := time.Now()
	if _, err := r.lapi.Cscli("decisions", "add", "--ip", lab.GenAddr4.String(), "--duration", "4h"); err != nil {
		return err
	}
	if err := r.until(10*time.Minute, "the ban after the import enforced", func() bool { return !r.arrives() }); err != nil {
		return err
	}
	t2 := time.Now()
	row.ImportSeconds, row.EnforcedSeconds, row.AfterImportSeconds = t1.Sub(t0).Seconds(), t2.Sub(t0).Seconds(), t2.Sub(t1).Seconds()
	row.CPUSeconds = cpuSeconds(pid) - cpu0
	row.RSSBytes, row.PeakRSSBytes = memory(pid)
	o.Progress.Say(fmt.Sprintf("%s: a flood from the %d banned sources", row.Bouncer, row.Decisions))
	return r.flood(ctx, tr, row)
}

// flood sends from the banned sources at the full rate of the generator's
// CPU and reads what the receive CPU spends per packet, as lab drop does.
func (r *round) flood(ctx context.Context, tr *lab.Traffic, row *Row) error {
	cpu := lab.CPUs()
	objs, err := lab.LoadObjects(r.topo, tr)
	if err != nil {
		return err
	}
	defer objs.Close()
	if err := r.topo.PinNAPI(); err != nil {
		return err
	}
	iface, err := lab.RxCounter(r.topo)
	if err != nil {
		return err
	}
	defer iface.Close()
	// The receiver's veth counts the frames its NAPI took off the ring,
	// whatever became of them; frames the ring had no room for are not
	// the bouncer's cost, and are not counted.
	read := func() (time.Time, uint64, []lab.CPUTimes, error) {
		rx, err := iface.RxPackets()
		var times []lab.CPUTimes
		for _, c := range cpu.Receivers() {
			t, cerr := lab.ReadCPU(c)
			err = errors.Join(err, cerr)
			times = append(times, t)
		}
		return time.Now(), rx, times, err
	}
	gen := lab.StartGenerator(objs, r.topo, tr, cpu.Gen)
	err = func() error {
		if !lab.SleepCtx(ctx.Done(), time.Second) {
			return ctx.Err()
		}
		t0, rx0, cpu0, err := read()
		if err != nil {
			return err
		}
		if !lab.SleepCtx(ctx.Done(), 3*time.Second) {
			return ctx.Err()
		}
		t1, rx1, cpu1, err := read()
		if err != nil {
			return err
		}
		busy := 0.0 // CPU seconds
		for i := range cpu1 {
			busy += cpu1[i].BusySince(cpu0[i]) * t1.Sub(t0).Seconds()
		}
		if packets := rx1 - rx0; packets > 0 {
			row.NsPerPacket = busy / float64(packets) * 1e9
			row.FloodMpps = float64(packets) / t1.Sub(t0).Seconds() / 1e6
		}
		return nil
	}()
	if gerr := gen.Halt(); err == nil {
		err = gerr
	}
	buf := make([]byte, 128)
	for {
		r.rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, rerr := r.rx.Read(buf); rerr != nil {
			break
		}
		row.Leaked++
	}
	return err
}

// refresh bans 1,000 addresses and the sender for o.Refresh, bans them all
// again for an hour halfway, and checks the sender's ban past the first
// expiry: a block list refreshed upstream is sent so.
func refresh(ctx context.Context, o Options, seq int, row *RefreshRow) error {
	r, err := start(ctx, o, seq, row.Bouncer)
	if err != nil {
		return err
	}
	defer r.close()
	tr, err := lab.NewTraffic(4, lab.DefaultSrc4, row.Decisions)
	if err != nil {
		return err
	}
	// The sender is banned on its own, after each import: a LAPI's delta
	// can miss decisions of a large transaction that a poll met (see the
	// README), and this check is about refreshing, not that.
	ban := func(file, duration string) error {
		if _, err := r.lapi.Cscli("decisions", "import", "-i", file); err != nil {
			return err
		}
		_, err := r.lapi.Cscli("decisions", "add", "--ip", lab.GenAddr4.String(), "--duration", duration)
		return err
	}
	first, err := r.decisionsFile("first.csv", tr.Prefixes(), o.Refresh.String(), false)
	if err != nil {
		return err
	}
	again, err := r.decisionsFile("again.csv", tr.Prefixes(), "1h", false)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := ban(first, o.Refresh.String()); err != nil {
		return err
	}
	if err := r.until(o.Refresh/2, "the first ban enforced", func() bool { return !r.arrives() }); err != nil {
		return err
	}
	time.Sleep(time.Until(t0.Add(o.Refresh / 2)))
	if err := ban(again, "1h"); err != nil {
		return err
	}
	time.Sleep(time.Until(t0.Add(o.Refresh + 5*time.Second)))
	row.Kept = !r.arrives()
	return nil
}

// cpuSeconds is the user and system time a process has used.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ, 100 on every Linux architecture rampart builds for
}

// memory is a process's resident memory now and at its peak.
func memory(pid int) (rss, peak uint64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			peak = v << 10
		}
	}
	return rss, peak
}
