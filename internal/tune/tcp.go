// Package tune sizes a host's TCP buffers from a path's bandwidth and RTT.
package tune

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// TCPSettings are the sysctls that bound what one TCP connection can have
// in flight, as the running kernel has them.
type TCPSettings struct {
	Rmem, Wmem         [3]int64 // net.ipv4.tcp_rmem, tcp_wmem: min, default, max (bytes)
	RmemMax, WmemMax   int64    // net.core.rmem_max, wmem_max: the ceiling of SO_RCVBUF/SO_SNDBUF
	Mem                [3]int64 // net.ipv4.tcp_mem, in pages
	AdvWinScale        int      // net.ipv4.tcp_adv_win_scale (unused from Linux 6.6)
	WindowScaling      bool     // net.ipv4.tcp_window_scaling
	SlowStartAfterIdle bool     // net.ipv4.tcp_slow_start_after_idle
	Kernel             [2]int   // major, minor
	MTU                int      // of the path, for the kernel's window ratio from 6.6 (1500 if 0)
	MemPages           int64    // MemTotal of proc/meminfo in pages, 0 when it cannot be read
}

// sendPayloadRatio is how much of a send buffer carries data in flight:
// the rest is the overhead of the skbs that hold it, measured at 0.7 on a
// long fat pipe.
const sendPayloadRatio = 0.7

// maxBuffer is the largest tcp_rmem, tcp_wmem, rmem_max and wmem_max
// entry the kernel takes: they are C ints (INT_MAX).
const maxBuffer = math.MaxInt32

// The paths tune tcp plans for. Beyond them an input is a typo or a unit
// slip, and its buffers would be past what the kernel takes anyway.
const (
	MinRTT       = time.Microsecond // below what ping measures over loopback
	MaxRTT       = 10 * time.Second // a geostationary hop behind a bloated queue is a few seconds
	MinBandwidth = 1e3 / 8          // 1 kbit/s, in bytes per second
	MaxBandwidth = 10e12 / 8        // 10 Tbit/s, past the fastest Ethernet
	MaxConns     = 1_000_000
	MinMTU       = 576   // the least every IPv4 host must take
	MaxMTU       = 65535 // the most an IPv4 packet can be
)

// segmentScalingRatio is the share of a receive buffer the kernel
// advertises as window from Linux 6.6 on: each connection measures its
// payload to truesize ratio (tcp_measure_rcv_mss). For a full segment
// received into a linear buffer that is the MSS (the MTU less 52 bytes of
// IPv4 and TCP headers with timestamps) over the kmalloc bucket holding
// the frame with NET_SKB_PAD and skb_shared_info, plus the sk_buff: 0.628
// at MTU 1500. Drivers that receive into half pages and merge with GRO
// reach ≈0.7; a page per frame, ≈0.35.
func segmentScalingRatio(mtu int) float64 {
	bucket := 1 << bits.Len(uint(mtu+14+64+320-1))
	return float64(mtu-52) / float64(bucket+256)
}

// ReadTCP reads the settings under root ("/", or a tree with proc/ under
// it).
func ReadTCP(root string) (TCPSettings, error) {
	var s TCPSettings
	// read reads a sysctl of n numbers, refusing one the kernel cannot hold
	// (a negative buffer, say, would give negative rates), naming the file.
	read := func(name string, n int) ([]int64, error) {
		p := sysctlPath(root, name)
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		f := strings.Fields(string(b))
		if len(f) != n {
			return nil, fmt.Errorf("%s: want %d values, got %d", p, n, len(f))
		}
		v := make([]int64, n)
		for i := range f {
			if v[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
				return nil, fmt.Errorf("%s: %q is not a number", p, f[i])
			}
		}
		if bad, r, ok := outOfRange(name, v); ok {
			return nil, fmt.Errorf("%s holds %d, out of the kernel's range %d to %d: set %s right (sysctl -w) and run again", p, bad, r[0], r[1], name)
		}
		return v, nil
	}
	// A slice, not a map: read in a fixed order, so the first error is always the same.
	for _, t := range []struct {
		name string
		into *[3]int64
	}{{"net.ipv4.tcp_rmem", &s.Rmem}, {"net.ipv4.tcp_wmem", &s.Wmem}, {"net.ipv4.tcp_mem", &s.Mem}} {
		v, err := read(t.name, 3)
		if err != nil {
			return s, err
		}
		copy(t.into[:], v)
	}
	var one [6]int64
	for i, name := range []string{"net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_adv_win_scale",
		"net.ipv4.tcp_window_scaling", "net.ipv4.tcp_slow_start_after_idle"} {
		v, err := read(name, 1)
		if err != nil {
			return s, err
		}
		one[i] = v[0]
	}
	s.RmemMax, s.WmemMax, s.AdvWinScale = one[0], one[1], int(one[2])
	ws, ss := one[3], one[4]
	s.WindowScaling, s.SlowStartAfterIdle = ws != 0, ss != 0
	rel, err := os.ReadFile(filepath.Join(root, "proc/sys/kernel/osrelease"))
	if err != nil {
		return s, err
	}
	if _, err := fmt.Sscanf(string(rel), "%d.%d", &s.Kernel[0], &s.Kernel[1]); err != nil {
		return s, fmt.Errorf("%s %q: %w", filepath.Join(root, "proc/sys/kernel/osrelease"), strings.TrimSpace(string(rel)), err)
	}
	s.MemPages, err = readMemPages(root)
	return s, err
}

// readMemPages is MemTotal of root's proc/meminfo in pages, what tcp_mem
// counts in; 0 when the file is absent (a tree without it).
func readMemPages(root string) (int64, error) {
	p := filepath.Join(root, "proc/meminfo")
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	for i, l := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(l, "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil || kb <= 0 || kb > math.MaxInt64/1024 {
			return 0, fmt.Errorf("%s:%d: %q is not a memory size in kB", p, i+1, strings.TrimSpace(l))
		}
		return kb * 1024 / int64(os.Getpagesize()), nil
	}
	return 0, fmt.Errorf("%s: no MemTotal line", p)
}

// scalingRatio is the share of receive-buffer space the kernel advertises
// as window: tcp_win_from_space().
func (s TCPSettings) scalingRatio() float64 {
	if s.Kernel[0] > 6 || s.Kernel[0] == 6 && s.Kernel[1] >= 6 {
		return segmentScalingRatio(cmp.Or(s.MTU, 1500))
	}
	if s.AdvWinScale <= 0 {
		return math.Ldexp(1, s.AdvWinScale) // space >> -scale
	}
	return 1 - math.Ldexp(1, -s.AdvWinScale) // space - (space >> scale)
}

// maxWindow is the largest receive window autotuning reaches: the window
// of tcp_rmem's max, and 64 KiB without window scaling.
func (s TCPSettings) maxWindow() float64 {
	w := float64(s.Rmem[2]) * s.scalingRatio()
	if !s.WindowScaling {
		w = min(w, 65535)
	}
	return min(w, 65535<<14)
}

// maxInFlight is the data one connection's send buffer keeps in flight.
func (s TCPSettings) maxInFlight() float64 { return float64(s.Wmem[2]) * sendPayloadRatio }

// RateNow is the rate, bytes per second, the settings allow one
// connection on a path of rtt: a window per round trip, the smaller of the
// receiver's and the sender's.
func (s TCPSettings) RateNow(rtt time.Duration) (rate float64, limit string) {
	rcv, snd := s.maxWindow(), s.maxInFlight()
	if rcv <= snd {
		return rcv / rtt.Seconds(), "receive window"
	}
	return snd / rtt.Seconds(), "send buffer"
}

// bufferHeadroom is what buffers get beyond the path's bandwidth × RTT:
// the ratio a connection measures from 6.6 falls below the model's with
// the driver's buffers and with data the application has not read yet
// (0.53 against 0.63 measured over the delay line at 20 ms), and the
// bottleneck's queue adds to the RTT.
const bufferHeadroom = 1.25

// bufferBytes are the tcp_rmem and tcp_wmem maxima that fill a path of
// rate (bytes per second) and rtt: the receiver advertises rate × rtt as
// window, the sender keeps rate × rtt in flight, both with headroom. They
// are floats, as large as the path asks: the caller caps them.
func (s TCPSettings) bufferBytes(rate float64, rtt time.Duration) (rmem, wmem float64) {
	bdp := rate * rtt.Seconds() * bufferHeadroom
	return math.Ceil(bdp / s.scalingRatio()), math.Ceil(bdp / sendPayloadRatio)
}

// capBuffer is a buffer size the kernel takes: 1 to maxBuffer bytes (a NaN
// from a path of no rate is 1). Converting a float past int64's range
// would give a negative number.
func capBuffer(b float64) int64 {
	if !(b >= 1) {
		return 1
	}
	return int64(min(b, maxBuffer))
}

// Buffers are bufferBytes capped at what the kernel takes.
func (s TCPSettings) Buffers(rate float64, rtt time.Duration) (rmem, wmem int64) {
	r, w := s.bufferBytes(rate, rtt)
	return capBuffer(r), capBuffer(w)
}

// Sysctl is one setting: what it is and what the path needs.
type Sysctl struct {
	Name        string `json:"name"`
	Current     string `json:"current"`
	Recommended string `json:"recommended"`
}

// Finding is something the current settings do to the path.
type Finding struct {
	ID       string `json:"id"`
	Evidence string `json:"evidence"`
	Fix      string `json:"fix"`
}

// TCPPlan is what `tune tcp` reports for a path.
type TCPPlan struct {
	RTT         string    `json:"rtt"`
	Bandwidth   float64   `json:"bandwidth_bytes_per_second,omitempty"`
	RateNow     float64   `json:"rate_now_bytes_per_second"`
	RateLimitBy string    `json:"rate_now_limited_by"`
	Sysctls     []Sysctl  `json:"sysctls"`
	Findings    []Finding `json:"findings"`
}

func triple(v [3]int64) string { return fmt.Sprintf("%d\t%d\t%d", v[0], v[1], v[2]) }

// PlanTCP says what the settings allow one connection on a path of rtt
// and, given its bandwidth (bytes per second, 0 if unknown), what fills it
// for conns connections at once.
func PlanTCP(s TCPSettings, bandwidth float64, rtt time.Duration, conns int) TCPPlan {
	p := TCPPlan{RTT: rtt.String(), Bandwidth: bandwidth, Findings: []Finding{}}
	p.RateNow, p.RateLimitBy = s.RateNow(rtt)
	rmem, wmem := s.Rmem, s.Wmem
	rmemMax, wmemMax, mem := s.RmemMax, s.WmemMax, s.Mem
	if bandwidth > 0 {
		rb, wb := s.bufferBytes(bandwidth, rtt)
		rmem[2], wmem[2] = max(rmem[2], capBuffer(rb)), max(wmem[2], capBuffer(wb))
		rmemMax, wmemMax = max(rmemMax, rmem[2]), max(wmemMax, wmem[2])
		memFinding, memOK := s.sizeMem(&mem, rmem[2]+wmem[2], conns)
		if p.RateNow < 0.95*bandwidth {
			p.Findings = append(p.Findings, Finding{
				ID:       "tcp-" + strings.ReplaceAll(p.RateLimitBy, " ", "-") + "-caps-rate",
				Evidence: fmt.Sprintf("the %s caps one connection at %.1f MB/s on this %v path, %.0f%% of its %.1f MB/s", p.RateLimitBy, p.RateNow/1e6, rtt, 100*p.RateNow/bandwidth, bandwidth/1e6),
				Fix:      fmt.Sprintf("sysctl -w net.ipv4.tcp_rmem='%s' net.ipv4.tcp_wmem='%s'", triple(rmem), triple(wmem)),
			})
		}
		if rb > maxBuffer || wb > maxBuffer {
			capped := s
			capped.Rmem[2], capped.Wmem[2] = rmem[2], wmem[2]
			rate, _ := capped.RateNow(rtt)
			p.Findings = append(p.Findings, Finding{ID: "tcp-buffers-capped",
				Evidence: fmt.Sprintf("one connection at %.1f MB/s on this %v path needs a %.0f-byte receive buffer and a %.0f-byte send buffer, past the kernel's limit of %d bytes: capped at it, they carry %.1f MB/s", bandwidth/1e6, rtt, rb, wb, maxBuffer, rate/1e6),
				Fix:      fmt.Sprintf("spread the transfer over %.0f connections or more", math.Ceil(bandwidth/rate)),
			})
		}
		if memOK {
			p.Findings = append(p.Findings, memFinding)
		}
	}
	if s.SlowStartAfterIdle {
		p.Findings = append(p.Findings, Finding{ID: "tcp-slow-start-after-idle",
			Evidence: "net.ipv4.tcp_slow_start_after_idle is 1: a connection idle for an RTO starts over from the initial window",
			Fix:      "sysctl -w net.ipv4.tcp_slow_start_after_idle=0"})
	}
	if !s.WindowScaling {
		p.Findings = append(p.Findings, Finding{ID: "tcp-window-scaling-off",
			Evidence: "net.ipv4.tcp_window_scaling is 0: no receive window exceeds 64 KiB",
			Fix:      "sysctl -w net.ipv4.tcp_window_scaling=1"})
	}
	p.Sysctls = []Sysctl{
		{"net.ipv4.tcp_rmem", triple(s.Rmem), triple(rmem)},
		{"net.ipv4.tcp_wmem", triple(s.Wmem), triple(wmem)},
		{"net.core.rmem_max", strconv.FormatInt(s.RmemMax, 10), strconv.FormatInt(rmemMax, 10)},
		{"net.core.wmem_max", strconv.FormatInt(s.WmemMax, 10), strconv.FormatInt(wmemMax, 10)},
		{"net.ipv4.tcp_mem", triple(s.Mem), triple(mem)},
	}
	return p
}

// sizeMem raises tcp_mem's pressure threshold to hold conns connections
// of perConn bytes of buffers each, and its maximum half as high again.
// Both stay within the machine's memory: past it the threshold is capped
// with a finding, and without meminfo to bound it tcp_mem is left alone.
func (s TCPSettings) sizeMem(mem *[3]int64, perConn int64, conns int) (Finding, bool) {
	page := float64(os.Getpagesize())
	need := float64(perConn) * float64(max(conns, 1)) / page // float: no overflow whatever conns is
	if float64(mem[1]) >= need {
		return Finding{}, false
	}
	if s.MemPages <= 0 {
		return Finding{ID: "tcp-mem-unbounded",
			Evidence: fmt.Sprintf("%d connections need a tcp_mem pressure threshold of %.0f pages, but proc/meminfo could not be read to bound it by the machine's memory: tcp_mem is left as it is", max(conns, 1), need),
			Fix:      "run on the host itself, where /proc/meminfo says how much memory there is"}, true
	}
	// The pressure threshold keeps a third of memory from TCP.
	limit := s.MemPages * 2 / 3
	if need <= float64(limit) {
		pages := int64(need)
		*mem = [3]int64{mem[0], pages, pages + pages/2}
		return Finding{}, false
	}
	if mem[1] < limit {
		*mem = [3]int64{mem[0], limit, s.MemPages}
	}
	fit := max(int64(float64(limit)*page/float64(perConn)), 1)
	return Finding{ID: "tcp-mem-capped",
		Evidence: fmt.Sprintf("%d connections with full buffers need %.0f pages of TCP memory, past two thirds of the machine's %d pages: tcp_mem is capped there", max(conns, 1), need, s.MemPages),
		Fix:      fmt.Sprintf("plan for fewer connections at once: memory holds %d full ones (--conns %d)", fit, fit)}, true
}

// ParseRate reads a bandwidth: bits ("1Gbit", "100Mbit/s", "500kbit") or
// bytes ("112MB/s", "1.5GB"), decimal units; bytes per second, from
// MinBandwidth to MaxBandwidth.
func ParseRate(s string) (float64, error) {
	v := strings.TrimSuffix(strings.TrimSpace(s), "/s")
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"Gbit", 1e9 / 8}, {"Mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"bit", 1.0 / 8}, {"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3}, {"B", 1}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			f, err := strconv.ParseFloat(n, 64)
			if err != nil || math.IsNaN(f) {
				break
			}
			if r := f * u.mult; r < MinBandwidth || r > MaxBandwidth {
				return 0, fmt.Errorf("%q is out of range: give 1kbit/s to 10000Gbit/s", s)
			}
			return f * u.mult, nil
		}
	}
	return 0, fmt.Errorf("%q: give a rate such as 1Gbit, 100Mbit/s or 112MB/s", s)
}

// Where --apply keeps the settings across reboots and what it replaced.
const (
	sysctlConf   = "etc/sysctl.d/90-rampart-tcp.conf"
	previousConf = "var/lib/rampart/tune-tcp.previous.conf"
)

// sysctlRange is what the kernel holds in the TCP sysctls rampart reads and
// writes; the others (0 or 1 switches) are not bounded.
var sysctlRange = map[string][2]int64{
	"net.ipv4.tcp_rmem": {1, maxBuffer}, "net.ipv4.tcp_wmem": {1, maxBuffer},
	"net.core.rmem_max": {1, maxBuffer}, "net.core.wmem_max": {1, maxBuffer},
	"net.ipv4.tcp_mem":           {0, math.MaxInt64}, // a long, in pages
	"net.ipv4.tcp_adv_win_scale": {-31, 31},
}

// outOfRange is the first of v the kernel cannot hold in name, and the
// range it holds; ok is false when every value fits.
func outOfRange(name string, v []int64) (bad int64, r [2]int64, ok bool) {
	r, bounded := sysctlRange[name]
	for _, n := range v {
		if bounded && (n < r[0] || n > r[1]) {
			return n, r, true
		}
	}
	return 0, r, false
}

// sysctlPath is a sysctl's file under root.
func sysctlPath(root, name string) string {
	return filepath.Join(root, "proc/sys", strings.ReplaceAll(name, ".", "/"))
}

// ApplyTCP sets the plan's recommended sysctls (and turns off slow start
// after idle when the plan found it on) under root, writes them to
// /etc/sysctl.d so they hold after a reboot, and keeps what they were for
// RevertTCP. A setting already applied keeps its first saved value.
func ApplyTCP(root string, p TCPPlan) error {
	set := slices.Clone(p.Sysctls)
	for _, f := range p.Findings {
		if f.ID == "tcp-slow-start-after-idle" {
			set = append(set, Sysctl{"net.ipv4.tcp_slow_start_after_idle", "1", "0"})
		}
	}
	// What an earlier apply kept that this plan no longer names (slow start
	// after idle, once it is off) stays kept: the file is the whole of
	// what holds after a reboot.
	if b, err := os.ReadFile(filepath.Join(root, sysctlConf)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			name, v, ok := strings.Cut(l, " = ")
			if ok && !strings.HasPrefix(l, "#") && !slices.ContainsFunc(set, func(x Sysctl) bool { return x.Name == name }) {
				set = append(set, Sysctl{Name: name, Current: v, Recommended: v})
			}
		}
	}
	// PlanTCP keeps its values in range; this holds for any plan, before
	// anything is written: a value past a C int would be cut to garbage
	// by the kernel, and one refused half way leaves the host half set.
	for _, x := range set {
		var v []int64
		for _, f := range strings.Fields(x.Recommended) {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return fmt.Errorf("%s %q: %q is not a number; nothing was changed", x.Name, x.Recommended, f)
			}
			v = append(v, n)
		}
		if bad, r, ok := outOfRange(x.Name, v); ok {
			return fmt.Errorf("%s %q: %d is out of the kernel's range %d to %d; nothing was changed", x.Name, x.Recommended, bad, r[0], r[1])
		}
	}
	prev := filepath.Join(root, previousConf)
	if _, err := os.Stat(prev); os.IsNotExist(err) {
		var b strings.Builder
		for _, s := range set {
			fmt.Fprintf(&b, "%s = %s\n", s.Name, s.Current)
		}
		if err := writeFile(prev, b.String()); err != nil {
			return err
		}
	}
	var b strings.Builder
	b.WriteString("# Written by rampart tune tcp --apply; rampart tune tcp --revert removes it.\n")
	for _, s := range set {
		fmt.Fprintf(&b, "%s = %s\n", s.Name, s.Recommended)
	}
	if err := writeFile(filepath.Join(root, sysctlConf), b.String()); err != nil {
		return err
	}
	return setAll(root, set, func(s Sysctl) string { return s.Recommended })
}

// RevertTCP sets back what ApplyTCP replaced and removes its files.
func RevertTCP(root string) error {
	b, err := os.ReadFile(filepath.Join(root, previousConf))
	if os.IsNotExist(err) {
		return errors.New("nothing to revert: rampart tune tcp --apply has not changed this host")
	}
	if err != nil {
		return err
	}
	var set []Sysctl
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		name, v, ok := strings.Cut(l, " = ")
		if !ok {
			return fmt.Errorf("%s: cannot read %q", previousConf, l)
		}
		set = append(set, Sysctl{Name: name, Current: v})
	}
	if err := setAll(root, set, func(s Sysctl) string { return s.Current }); err != nil {
		return err
	}
	return errors.Join(os.Remove(filepath.Join(root, sysctlConf)), os.Remove(filepath.Join(root, previousConf)))
}

func setAll(root string, set []Sysctl, value func(Sysctl) string) error {
	for _, s := range set {
		if err := os.WriteFile(sysctlPath(root, s.Name), []byte(value(s)+"\n"), 0); err != nil {
			return fmt.Errorf("set %s: %w", s.Name, err)
		}
	}
	return nil
}

func writeFile(path, text string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
