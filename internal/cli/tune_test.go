package cli_test

import (
	"math"
	"testing"
)

// TestTuneTCP: the field report's path (RTT 146 ms, a 6 MB tcp_rmem max,
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
