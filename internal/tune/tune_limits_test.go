package tune

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// memTotalKB is the memory the trees below claim: 4 GiB.
const memTotalKB = 4 << 20

// limitsTree is tree() with a proc/meminfo, so tcp_mem has a bound.
func limitsTree(t *testing.T) string {
	t.Helper()
	root := tree(t, "6.18.0", "4096\t131072\t6291456", "4096\t16384\t4194304", "1")
	meminfo := "MemTotal:        " + strconv.Itoa(memTotalKB) + " kB\nMemFree:         1000 kB\n"
	if err := os.WriteFile(filepath.Join(root, "proc/meminfo"), []byte(meminfo), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// checkInRange fails on any value of a tcp_rmem, tcp_wmem, rmem_max,
// wmem_max or tcp_mem setting that the kernel would not take as it is
// meant: past INT_MAX for the int ones, past the tree's memory for
// tcp_mem, negative for any.
func checkInRange(t *testing.T, what, name, value string) {
	t.Helper()
	hi := int64(math.MaxInt32)
	if name == "net.ipv4.tcp_mem" {
		hi = memTotalKB * 1024 / int64(os.Getpagesize())
	}
	fields := strings.Fields(value)
	if len(fields) == 0 {
		t.Errorf("%s: %s has no value", what, name)
	}
	for _, f := range fields {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 0 || n > hi {
			t.Errorf("%s: %s = %q: %q is not within 0 to %d", what, name, value, f, hi)
		}
	}
}

// TestPlanTCPBounded: however fast, long or many the paths, every value
// the plan recommends, --apply writes and sysctl.d keeps is one the kernel
// takes, and a finding says what was capped.
func TestPlanTCPBounded(t *testing.T) {
	for _, c := range []struct {
		name      string
		bandwidth float64
		rtt       time.Duration
		conns     int
		capped    []string // finding IDs
	}{
		{"the largest accepted path", 10e12 / 8, 10 * time.Second, 1_000_000, []string{"tcp-buffers-capped", "tcp-mem-capped"}},
		{"an RTT of 2562047h", 125e6, 2562047 * time.Hour, 1, []string{"tcp-buffers-capped", "tcp-mem-capped"}},
		{"2000000000 connections", 125e6, 146 * time.Millisecond, 2_000_000_000, []string{"tcp-mem-capped"}},
		{"a 40 Gbit/s path of 1 s", 5e9, time.Second, 1, []string{"tcp-buffers-capped"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := limitsTree(t)
			s, err := ReadTCP(root)
			if err != nil {
				t.Fatal(err)
			}
			p := PlanTCP(s, c.bandwidth, c.rtt, c.conns)
			for _, x := range p.Sysctls {
				checkInRange(t, "plan", x.Name, x.Recommended)
			}
			ids := map[string]bool{}
			for _, f := range p.Findings {
				ids[f.ID] = true
			}
			for _, id := range c.capped {
				if !ids[id] {
					t.Errorf("no %s finding: %+v", id, p.Findings)
				}
			}
			if err := ApplyTCP(root, p); err != nil {
				t.Fatal(err)
			}
			for _, x := range p.Sysctls {
				b, err := os.ReadFile(sysctlPath(root, x.Name))
				if err != nil {
					t.Fatal(err)
				}
				checkInRange(t, "written", x.Name, string(b))
			}
			conf, err := os.ReadFile(filepath.Join(root, sysctlConf))
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(strings.TrimSpace(string(conf)), "\n") {
				if name, v, ok := strings.Cut(l, " = "); ok && name != "net.ipv4.tcp_slow_start_after_idle" {
					checkInRange(t, "sysctl.d", name, v)
				}
			}
		})
	}
}

// TestApplyTCPRefusesOutOfRange: a plan holding a value the kernel does
// not take is refused before anything is written.
func TestApplyTCPRefusesOutOfRange(t *testing.T) {
	for _, bad := range []Sysctl{
		{"net.ipv4.tcp_rmem", "4096\t131072\t6291456", "4096\t131072\t2293102839779005696"},
		{"net.core.wmem_max", "212992", "-1"},
		{"net.ipv4.tcp_mem", "188067\t250758\t376134", "188067\t-5\t376134"},
	} {
		root := limitsTree(t)
		before, err := ReadTCP(root)
		if err != nil {
			t.Fatal(err)
		}
		p := TCPPlan{Sysctls: []Sysctl{{"net.ipv4.tcp_wmem", "4096\t16384\t4194304", "4096\t16384\t8388608"}, bad}}
		if err := ApplyTCP(root, p); err == nil || !strings.Contains(err.Error(), bad.Name) || !strings.Contains(err.Error(), "out of the kernel's range") {
			t.Errorf("apply of %s = %q: %v, want refused naming it", bad.Name, bad.Recommended, err)
		}
		if after, err := ReadTCP(root); err != nil || after != before {
			t.Errorf("a refused apply changed the settings: %+v (%v)", after, err)
		}
		for _, f := range []string{sysctlConf, previousConf} {
			if _, err := os.Stat(filepath.Join(root, f)); !os.IsNotExist(err) {
				t.Errorf("a refused apply wrote %s (%v)", f, err)
			}
		}
	}
}

// TestReadTCPOutOfRange: current settings no kernel holds are refused,
// naming the file and the range, rather than read into negative rates.
func TestReadTCPOutOfRange(t *testing.T) {
	for _, c := range []struct{ file, value string }{
		{"net/ipv4/tcp_rmem", "-1\t-1\t-1"},
		{"net/ipv4/tcp_wmem", "4096\t0\t4194304"},
		{"net/ipv4/tcp_rmem", "4096\t131072\t2293102839779005696"},
		{"net/core/rmem_max", "-212992"},
		{"net/ipv4/tcp_mem", "188067\t-1\t376134"},
		{"net/ipv4/tcp_adv_win_scale", "-99"},
	} {
		root := limitsTree(t)
		p := filepath.Join(root, "proc/sys", c.file)
		if err := os.WriteFile(p, []byte(c.value+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := ReadTCP(root)
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "out of the kernel's range") {
			rate, _ := s.RateNow(146 * time.Millisecond)
			t.Errorf("%s %q: read with error %v (a rate of %.1f MB/s), want refused naming %s and the range", c.file, c.value, err, rate/1e6, p)
		}
	}
}

// TestParseRateRange: rates past what tune tcp plans for, negative, zero
// or not a number are refused, saying the range.
func TestParseRateRange(t *testing.T) {
	for _, s := range []string{"-1Gbit", "0Mbit/s", "20000Gbit", "3TB", "0.5bit", "NaNGbit", "InfMB"} {
		r, err := ParseRate(s)
		if err == nil {
			t.Errorf("%q read as %g B/s", s, r)
			continue
		}
		if s != "3TB" && s != "NaNGbit" && s != "InfMB" && !strings.Contains(err.Error(), "out of range: give 1kbit/s to 10000Gbit/s") {
			t.Errorf("%q: %v, want the range", s, err)
		}
	}
	for s, want := range map[string]float64{"1kbit": 125, "10000Gbit": 1.25e12, "112MB/s": 112e6} {
		if r, err := ParseRate(s); err != nil || r != want {
			t.Errorf("%q: %g %v, want %g", s, r, err, want)
		}
	}
}
