package lab

import (
	"bufio"
	"bytes"
	"os"
	"strings"
	"testing"
)

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParsers(t *testing.T) {
	if n, err := parseIptablesCount(string(readFixture(t, "iptables-raw.txt")), "DROP"); err != nil || n != 4181221 {
		t.Errorf("iptables: %d, %v", n, err)
	}
	if _, err := parseIptablesCount(string(readFixture(t, "iptables-raw.txt")), "NOTRACK"); err == nil {
		t.Error("iptables: a missing target gave no error")
	}
	c, err := parseCPU(bufio.NewScanner(bytes.NewReader(readFixture(t, "proc-stat.txt"))), 1)
	// busy = user+nice+system+irq+softirq; total adds idle, iowait, steal.
	if err != nil || c.busy != 1335806+31604+535128+1106 || c.total != c.busy+10879690+4016+120 {
		t.Errorf("cpu1: %+v, %v", c, err)
	}
	if _, err := parseCPU(bufio.NewScanner(bytes.NewReader(readFixture(t, "proc-stat.txt"))), 7); err == nil {
		t.Error("cpu7 absent, no error")
	}
	if got := (CPUTimes{busy: 150, total: 300}).BusySince(CPUTimes{busy: 100, total: 200}); got != 0.5 {
		t.Errorf("busySince = %v, want 0.5", got)
	}
}

func TestParseIperf(t *testing.T) {
	g, err := ParseIperf([]byte(`{"end": {"sum_received": {"bits_per_second": 9.5e9}}}`))
	if err != nil || g != 9.5 {
		t.Errorf("parseIperf: %v %v", g, err)
	}
	if _, err := ParseIperf([]byte(`{"error": "unable to connect to server: Connection refused"}`)); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("parseIperf of an error: %v", err)
	}
}
