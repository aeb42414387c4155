// Package stats holds rampart's counters as rows (per rule and per fixed
// slot, per hook) and turns two snapshots into rates. internal/engine reads
// the counters.
package stats

import "time"

// Row is one counter of one hook: a rule, the default, malformed or non-IP.
type Row struct {
	Iface     string  `json:"iface"`
	Netns     string  `json:"netns,omitempty"`
	Direction string  `json:"direction"`
	Kind      string  `json:"kind"` // rule, default, unparsed, malformed, non-ip
	Name      string  `json:"name"`
	Action    string  `json:"action"`
	Packets   uint64  `json:"packets"`
	Bytes     uint64  `json:"bytes"`
	PPS       float64 `json:"pps"`
	BPS       float64 `json:"bps"`
	// Limit rules: packets dropped over the limit (Packets passed under
	// it). Syncookie rules: SYN-ACKs sent with a cookie, ACKs whose cookie
	// held (connections handed to the listener) and ACKs whose did not.
	Over        uint64 `json:"over_limit,omitempty"`
	CookiesSent uint64 `json:"cookies_sent,omitempty"`
	CookiesOK   uint64 `json:"cookies_validated,omitempty"`
	CookiesBad  uint64 `json:"cookies_rejected,omitempty"`
}

// Snapshot is every row at one instant.
type Snapshot struct {
	Time time.Time `json:"time"`
	Rows []Row     `json:"rules"`
}

// Rates fills cur's per-second rates from the previous snapshot. Rows are
// matched by hook and name; a row without a predecessor keeps rate 0.
func Rates(prev, cur *Snapshot) {
	dt := cur.Time.Sub(prev.Time).Seconds()
	if dt <= 0 {
		return
	}
	type key struct{ iface, netns, dir, name string }
	before := map[key]Row{}
	for _, r := range prev.Rows {
		before[key{r.Iface, r.Netns, r.Direction, r.Name}] = r
	}
	for i := range cur.Rows {
		r := &cur.Rows[i]
		if p, ok := before[key{r.Iface, r.Netns, r.Direction, r.Name}]; ok && r.Packets >= p.Packets {
			r.PPS = float64(r.Packets-p.Packets) / dt
			r.BPS = float64(r.Bytes-p.Bytes) * 8 / dt
		}
	}
}
