package cli_test

import (
	"math"
	"testing"

	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestBenchLookup runs a short lookup benchmark and checks its JSON: every
// structure for every family and size, costs and memory measured, and
// rampart finding as many random sources in the list as the kernel's trie.
func TestBenchLookup(t *testing.T) {
	testutil.Privileged(t)
	var out struct {
		Results []struct {
			Structure      string   `json:"structure"`
			Family         int      `json:"family"`
			Mix            string   `json:"mix"`
			Size           int      `json:"size"`
			NsPerPacket    float64  `json:"ns_per_packet"`
			HitRate        *float64 `json:"hit_rate"`
			LoadSeconds    *float64 `json:"load_seconds"`
			BytesPerPrefix *float64 `json:"bytes_per_prefix"`
			Error          string   `json:"error"`
		} `json:"results"`
	}
	jsonOf(t, &out, "bench", "lookup", "--sizes", "10,100000", "--mix", "egress", "--family", "4,6", "--repeat", "20000", "--runs", "5")
	if len(out.Results) != 2*2*5 {
		t.Fatalf("%d results, want 20", len(out.Results))
	}
	hits := map[[2]int]map[string]float64{}
	for _, r := range out.Results {
		if r.Error != "" || r.NsPerPacket <= 0 || r.Mix != "egress" {
			t.Errorf("bad row %+v", r)
		}
		switch r.Structure {
		case "xdp-drop", "parse", "baseline":
			if r.LoadSeconds != nil || r.HitRate != nil {
				t.Errorf("%s row with load or hits: %+v", r.Structure, r)
			}
		case "kernel-lpm", "rampart":
			if r.LoadSeconds == nil || r.BytesPerPrefix == nil || *r.BytesPerPrefix <= 0 || r.HitRate == nil {
				t.Fatalf("%s row without load, memory or hits: %+v", r.Structure, r)
			}
			k := [2]int{r.Family, r.Size}
			if hits[k] == nil {
				hits[k] = map[string]float64{}
			}
			hits[k][r.Structure] = *r.HitRate
		default:
			t.Errorf("unknown structure %q", r.Structure)
		}
	}
	for k, h := range hits {
		// 100k prefixes of the egress mix cover about 1.6% of the space.
		if k[1] == 100000 && (h["rampart"] < 0.01 || math.Abs(h["rampart"]-h["kernel-lpm"]) > 0.3*h["kernel-lpm"]) {
			t.Errorf("IPv%d, %d prefixes: hit rates rampart %.4f, kernel LPM %.4f", k[0], k[1], h["rampart"], h["kernel-lpm"])
		}
	}
}
