package serve

import (
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/policy"
)

// TestFlowSpecInterfaceUnserved: a section naming an interface the
// service does not filter fails the apply, naming the file and line,
// before any speaker starts.
func TestFlowSpecInterfaceUnserved(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte("flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  neighbors: [{address: 192.0.2.2, peer_as: 2}]\n  interfaces: [eth0, eth9]\nrules: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{opt: Options{Ifaces: []string{"eth0", "eth1"}}, fs: newFSFeed()}
	_, err = d.flowspecRules(pol, true)
	if err == nil || !strings.Contains(err.Error(), "p.yaml:5: flowspec.interfaces: eth9 is not an interface this service filters (--iface eth0, eth1)") {
		t.Fatalf("err = %v", err)
	}
	if d.fs.speaker != nil || d.fs.cfg != nil {
		t.Error("a speaker was started for a section that failed")
	}
}
