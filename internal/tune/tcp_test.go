package tune

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tree writes a proc/sys tree with the sysctls ReadTCP reads.
func tree(t *testing.T, release, rmem, wmem string, scale string) string {
	t.Helper()
	root := t.TempDir()
	for name, v := range map[string]string{
		"net/ipv4/tcp_rmem": rmem, "net/ipv4/tcp_wmem": wmem, "net/ipv4/tcp_mem": "188067\t250758\t376134",
		"net/core/rmem_max": "212992", "net/core/wmem_max": "212992", "net/ipv4/tcp_adv_win_scale": scale,
		"net/ipv4/tcp_window_scaling": "1", "net/ipv4/tcp_slow_start_after_idle": "1", "kernel/osrelease": release,
	} {
		p := filepath.Join(root, "proc/sys", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestRateNowSeedCases: the worked cases of the blog post "UDP SndbufErrors
// & ENOBUFS", its MB decimal. A
// receiver whose window tops out at 3 MB (a 6 MB tcp_rmem max) on an RTT of
// 146 ms gives ≈ 20.5 MB/s; a 12 MB tcp_rmem max at 68 ms, ≈ 88.2 MB/s
// (tcp_adv_win_scale 1: half the buffer is window). From 6.6 the same
// buffer gives the share a full 1500-byte segment's payload has of its
// buffer, 1448/2304: 12 MB × 0.628 / 68 ms ≈ 110.9 MB/s.
func TestRateNowSeedCases(t *testing.T) {
	for _, c := range []struct {
		release, rmem, scale string
		rtt                  time.Duration
		want                 float64 // MB/s
	}{
		{"5.10.0-28-amd64", "4096\t131072\t6000000", "1", 146 * time.Millisecond, 20.5},
		{"6.1.0-18-amd64", "4096\t131072\t12000000", "1", 68 * time.Millisecond, 88.2},
		{"6.18.44", "4096\t131072\t12000000", "1", 68 * time.Millisecond, 110.9},
	} {
		s, err := ReadTCP(tree(t, c.release, c.rmem, "4096\t16384\t67108864", c.scale))
		if err != nil {
			t.Fatal(err)
		}
		rate, limit := s.RateNow(c.rtt)
		if got := rate / 1e6; math.Abs(got-c.want)/c.want > 0.03 || limit != "receive window" {
			t.Errorf("%s rmem %s rtt %v: %.1f MB/s (%s), want ≈ %.1f by the receive window", c.release, c.rmem, c.rtt, got, limit, c.want)
		}
	}
}

// TestBuffers: the buffers computed for a path give back its rate.
func TestBuffers(t *testing.T) {
	for _, release := range []string{"5.10.0", "6.18.44"} {
		s, err := ReadTCP(tree(t, release, "4096\t131072\t6291456", "4096\t16384\t4194304", "2"))
		if err != nil {
			t.Fatal(err)
		}
		rate, rtt := 112e6, 146*time.Millisecond // 1 GbE's payload rate, the post's RTT
		rmem, wmem := s.Buffers(rate, rtt)
		s.Rmem[2], s.Wmem[2] = rmem, wmem
		if got, _ := s.RateNow(rtt); math.Abs(got-rate*bufferHeadroom)/rate > 0.001 {
			t.Errorf("%s: buffers %d/%d give %.0f B/s, want %.0f", release, rmem, wmem, got, rate)
		}
	}
}

func TestReadTCPErrors(t *testing.T) {
	root := tree(t, "6.18.0", "4096 131072", "4096\t16384\t4194304", "1")
	if _, err := ReadTCP(root); err == nil {
		t.Error("a tcp_rmem of two values was read")
	}
	if _, err := ReadTCP(t.TempDir()); err == nil {
		t.Error("an empty tree was read")
	}
}

// TestApplyAndRevert on a fixture tree: the sysctls really written and
// kept in sysctl.d, then everything as it was.
func TestApplyAndRevert(t *testing.T) {
	root := tree(t, "6.18.0", "4096\t131072\t6000000", "4096\t16384\t4194304", "1")
	s, err := ReadTCP(root)
	if err != nil {
		t.Fatal(err)
	}
	rate, _ := ParseRate("1Gbit")
	if err := ApplyTCP(root, PlanTCP(s, rate, 146*time.Millisecond, 1)); err != nil {
		t.Fatal(err)
	}
	after, err := ReadTCP(root)
	if err != nil {
		t.Fatal(err)
	}
	// 1 Gbit/s × 146 ms × 1.25 over 1448/2304 and over 0.7.
	if after.Rmem[2] != 36_298_343 || after.Wmem[2] != 32_589_286 || after.SlowStartAfterIdle || after.RmemMax != 36_298_343 {
		t.Errorf("after apply: %+v", after)
	}
	conf, err := os.ReadFile(filepath.Join(root, sysctlConf))
	if err != nil || !strings.Contains(string(conf), "net.ipv4.tcp_rmem = 4096\t131072\t36298343") {
		t.Errorf("sysctl.d: %q %v", conf, err)
	}
	if got, _ := after.RateNow(146 * time.Millisecond); math.Abs(got-rate*bufferHeadroom)/rate > 0.001 {
		t.Errorf("after apply the path gets %.0f B/s, want %.0f", got, rate)
	}
	if err := RevertTCP(root); err != nil {
		t.Fatal(err)
	}
	back, err := ReadTCP(root)
	if err != nil || back != s {
		t.Errorf("after revert: %+v (%v), want %+v", back, err, s)
	}
	if _, err := os.Stat(filepath.Join(root, sysctlConf)); !os.IsNotExist(err) {
		t.Errorf("sysctl.d file left: %v", err)
	}
	if err := RevertTCP(root); err == nil || !strings.Contains(err.Error(), "nothing to revert") {
		t.Errorf("a second revert: %v", err)
	}
}
