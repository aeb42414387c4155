package cli_test

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestTuneTCP: the path of the blog post "UDP SndbufErrors & ENOBUFS" (RTT 146 ms, a 6 MB tcp_rmem max,
// tcp_adv_win_scale 1 on a 5.10 kernel) gives ≈ 20.5 MB/s by the receive
// window; for 1 GbE the buffers grow, with the finding and its fix.
func TestTuneTCP(t *testing.T) {
	var p struct {
		RateNow  float64 `json:"rate_now_bytes_per_second"`
		LimitBy  string  `json:"rate_now_limited_by"`
		Sysctls  []struct{ Name, Current, Recommended string }
		Findings []struct{ ID, Evidence, Fix string }
	}
	jsonOf(t, &p, "tune", "tcp", "--root", "testdata/tune-seed", "--rtt", "146ms")
	if math.Abs(p.RateNow/1e6-20.5) > 0.2 || p.LimitBy != "receive window" {
		t.Errorf("rate now %.2f MB/s by the %s, want ≈ 20.5 by the receive window", p.RateNow/1e6, p.LimitBy)
	}
	jsonOf(t, &p, "tune", "tcp", "--root", "testdata/tune-seed", "--rtt", "146ms", "--bandwidth", "1Gbit")
	rec := map[string]string{}
	for _, s := range p.Sysctls {
		rec[s.Name] = s.Recommended
	}
	// 1 Gbit/s × 146 ms = 18.25 MB in flight, a quarter more for headroom:
	// a 45.6 MB receive buffer at half, a 32.6 MB send buffer at 0.7.
	if rec["net.ipv4.tcp_rmem"] != "4096\t87380\t45625000" || rec["net.ipv4.tcp_wmem"] != "4096\t16384\t32589286" {
		t.Errorf("recommended %v", rec)
	}
	ids := map[string]bool{}
	for _, f := range p.Findings {
		ids[f.ID] = true
	}
	if !ids["tcp-receive-window-caps-rate"] || !ids["tcp-slow-start-after-idle"] {
		t.Errorf("findings %+v", p.Findings)
	}
}

// seedCopy is a writable copy of testdata/tune-seed.
func seedCopy(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS("testdata/tune-seed")); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestTuneTCPFlagRanges: every input out of range is refused, naming the
// flag and what it takes, before anything is read or written; an RTT of
// 2562047h or 2000000000 connections no longer reach the sysctls.
func TestTuneTCPFlagRanges(t *testing.T) {
	root := seedCopy(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rtt", "2562047h", "--bandwidth", "1Gbit", "--apply"}, "--rtt 2562047h0m0s is out of range (too long): give the path's round-trip time, 1µs to 10s"},
		{[]string{"--rtt", "0s"}, "--rtt 0s is out of range (zero)"},
		{[]string{"--rtt", "146ms", "--bandwidth", "1Gbit", "--conns", "2000000000", "--apply"}, "--conns 2000000000 is out of range: give 1 to 1000000 connections"},
		{[]string{"--rtt", "146ms", "--conns", "0"}, "--conns 0 is out of range"},
		{[]string{"--rtt", "146ms", "--bandwidth", "20000Gbit", "--apply"}, `--bandwidth "20000Gbit" is out of range: give 1kbit/s to 10000Gbit/s`},
		{[]string{"--rtt", "146ms", "--bandwidth", "-1Gbit"}, `--bandwidth "-1Gbit" is out of range`},
		{[]string{"--rtt", "146ms", "--mtu", "100"}, "--mtu 100 is out of range: give the path's MTU, 576 to 65535"},
	} {
		out, err := rampart(t, append([]string{"tune", "tcp", "--root", root}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("tune tcp %v: %v, want %q\n%s", c.args, err, c.want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "etc")); !os.IsNotExist(err) {
		t.Errorf("a refused --apply wrote etc/ (%v)", err)
	}
	rmem, _ := os.ReadFile(filepath.Join(root, "proc/sys/net/ipv4/tcp_rmem"))
	if strings.TrimSpace(string(rmem)) != "4096\t87380\t6000000" {
		t.Errorf("a refused --apply changed tcp_rmem to %q", rmem)
	}

	// The largest path accepted: applied, each value within the kernel's.
	mustRampart(t, "tune", "tcp", "--root", root, "--rtt", "10s", "--bandwidth", "10000Gbit", "--conns", "1000000", "--apply")
	conf, err := os.ReadFile(filepath.Join(root, "etc/sysctl.d/90-rampart-tcp.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(conf)), "\n")[1:] {
		name, v, _ := strings.Cut(l, " = ")
		for _, f := range strings.Fields(v) {
			if n, err := strconv.ParseInt(f, 10, 64); err != nil || n < 0 || n > math.MaxInt32 && name != "net.ipv4.tcp_mem" {
				t.Errorf("sysctl.d: %s = %q", name, v)
			}
		}
	}
}

// TestTuneTCPNegativeRTT: a negative --rtt is out of range, not missing.
func TestTuneTCPNegativeRTT(t *testing.T) {
	_, err := rampart(t, "tune", "tcp", "--root", "testdata/tune-seed", "--rtt", "-5ms")
	if want := "--rtt -5ms is out of range (negative)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("--rtt -5ms: %v, want %q", err, want)
	}
}

// TestTuneTCPNonsenseSettings: a tcp_rmem of -1 -1 -1 is refused, naming
// the file, rather than read as a rate of -0.0 MB/s.
func TestTuneTCPNonsenseSettings(t *testing.T) {
	root := seedCopy(t)
	rmem := filepath.Join(root, "proc/sys/net/ipv4/tcp_rmem")
	if err := os.WriteFile(rmem, []byte("-1\t-1\t-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := rampart(t, "tune", "tcp", "--root", root, "--rtt", "146ms")
	if err == nil || !strings.Contains(err.Error(), rmem+" holds -1, out of the kernel's range 1 to 2147483647") || strings.Contains(out, "-0.0") {
		t.Errorf("tcp_rmem -1 -1 -1: %v\n%s", err, out)
	}
}

// TestTuneTCPSlowStartOnce: the slow-start finding is printed once, in
// text and in JSON, with --apply too.
func TestTuneTCPSlowStartOnce(t *testing.T) {
	for _, flags := range [][]string{
		{"--rtt", "146ms"},
		{"--rtt", "146ms", "--bandwidth", "1Gbit", "--conns", "4"},
		{"--rtt", "146ms", "--bandwidth", "1Gbit", "--apply"},
	} {
		args := append([]string{"tune", "tcp", "--root", seedCopy(t)}, flags...)
		if out := mustRampart(t, args...); strings.Count(out, "tcp-slow-start-after-idle") != 1 {
			t.Errorf("rampart %v: the slow-start finding is not printed once:\n%s", args, out)
		}
		var p struct{ Findings []struct{ ID string } }
		jsonOf(t, &p, append([]string{"tune", "tcp", "--root", seedCopy(t)}, flags...)...)
		n := 0
		for _, f := range p.Findings {
			if f.ID == "tcp-slow-start-after-idle" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("rampart %v --json: the slow-start finding %d times: %+v", args, n, p.Findings)
		}
	}
}

// TestTuneIRQBadTopology: a topology file that is not what it should be
// is named in the error.
func TestTuneIRQBadTopology(t *testing.T) {
	root := t.TempDir()
	for name, v := range map[string]string{
		"sys/devices/system/cpu/online":                             "0-1",
		"sys/devices/system/cpu/cpu0/topology/physical_package_id":  "x",
		"sys/devices/system/cpu/cpu0/topology/core_id":              "0",
		"sys/devices/system/cpu/cpu0/topology/thread_siblings_list": "0",
		"sys/devices/system/cpu/cpu1/topology/physical_package_id":  "0",
		"sys/devices/system/cpu/cpu1/topology/core_id":              "1",
		"sys/devices/system/cpu/cpu1/topology/thread_siblings_list": "1",
	} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := rampart(t, "tune", "irq", "plan", "--root", root, "--external", "eth0", "--internal", "eth1")
	want := filepath.Join(root, "sys/devices/system/cpu/cpu0/topology/physical_package_id") + `: "x" is not a number`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a bad physical_package_id: %v, want %q", err, want)
	}
}

// TestTuneTCPApplyTwice: a second apply, after the first turned slow start
// after idle off, keeps that in the file that holds after a reboot (it
// rewrote the file without it).
func TestTuneTCPApplyTwice(t *testing.T) {
	root := seedCopy(t)
	for i := 0; i < 2; i++ {
		mustRampart(t, "tune", "tcp", "--root", root, "--rtt", "146ms", "--bandwidth", "1Gbit", "--apply")
		b, err := os.ReadFile(filepath.Join(root, "etc/sysctl.d/90-rampart-tcp.conf"))
		if err != nil || !strings.Contains(string(b), "net.ipv4.tcp_slow_start_after_idle = 0") {
			t.Errorf("apply %d: the kept file lacks slow start after idle = 0:\n%s (%v)", i+1, b, err)
		}
	}
}
