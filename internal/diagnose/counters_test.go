package diagnose

import (
	"os"
	"strings"
	"testing"
)

func TestParseSoftnet(t *testing.T) {
	f, err := os.Open("testdata/softnet_stat")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sn, err := ParseSoftnet(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(sn) != 2 || sn[0].CPU != 0 || sn[1].CPU != 1 || sn[0].Processed != 0x0010b178 || sn[1].Processed != 0x20acfbf8 {
		t.Errorf("softnet %+v", sn)
	}
	if _, err := ParseSoftnet(strings.NewReader("0001 0002\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("softnet: %v", err)
	}
}

func TestRates(t *testing.T) {
	r := Rates(Counters{"a": 10, "b": 5, "c": 9}, Counters{"a": 30, "b": 5, "c": 1, "d": 4}, 2)
	if len(r) != 1 || r["a"] != 10 {
		t.Errorf("rates %v: want only a at 10/s (b still, c reset, d new)", r)
	}
}
