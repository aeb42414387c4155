package stats

import (
	"testing"
	"time"
)

func TestRates(t *testing.T) {
	t0 := time.Unix(100, 0)
	prev := Snapshot{Time: t0, Rows: []Row{{Iface: "eth0", Name: "a", Packets: 100, Bytes: 1000}, {Iface: "eth0", Name: "b", Packets: 5}}}
	cur := Snapshot{Time: t0.Add(2 * time.Second), Rows: []Row{
		{Iface: "eth0", Name: "a", Packets: 300, Bytes: 3000},
		{Iface: "eth0", Name: "b", Packets: 1}, // counter went back (detach and re-apply): no rate
		{Iface: "eth0", Name: "new", Packets: 50},
	}}
	Rates(&prev, &cur)
	if r := cur.Rows[0]; r.PPS != 100 || r.BPS != 8000 {
		t.Errorf("a: pps %v bps %v, want 100 and 8000", r.PPS, r.BPS)
	}
	if cur.Rows[1].PPS != 0 || cur.Rows[2].PPS != 0 {
		t.Errorf("rows without a usable predecessor got rates: %+v", cur.Rows[1:])
	}
}
