package diagnose

import (
	"net"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestTracerCounts: every drop in the traced namespace is counted once,
// including those still pending on their CPU, and none from another
// namespace.
func TestTracerCounts(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	tr, err := StartTracer(p.NsB)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()

	send(t, p.NsA, p.B4, 1000) // to B's closed port: dropped in B
	send(t, p.NsB, p.A4, 500)  // to A's closed port: dropped in A
	// Counted as the receiving side gets to them: on a busy machine that
	// can be later than the sends return, and some of the datagrams to B
	// can overflow the CPU's backlog before they reach the closed port.
	// Either way each is one drop in B, and A's are none of B's.
	var toB, lost uint64
	var counts map[DropKey]uint64
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		counts, lost, err = tr.Counts()
		if err != nil {
			t.Fatal(err)
		}
		toB = 0
		for k, n := range counts {
			if k.L3proto != 0x0800 || k.L4proto != 17 {
				continue // B's ICMP errors
			}
			toB += n
			if r := tr.Reasons[k.Reason]; r != "NO_SOCKET" && r != "CPU_BACKLOG" || k.Ifindex == 0 {
				t.Errorf("key %+v (%s): want a UDP datagram to B's closed port, on B's interface", k, r)
			}
		}
		if toB >= 1000 || time.Now().After(deadline) {
			break
		}
	}
	if toB != 1000 || lost != 0 {
		t.Errorf("UDP drops in B counted %d times (lost %d), want the 1000 sent to B; all counts: %v", toB, lost, counts)
	}
	o, err := tr.Overhead()
	if err != nil {
		t.Fatal(err)
	}
	if o.Events < 1500 || o.Time <= 0 {
		t.Errorf("overhead %+v: the program ran for every drop in both namespaces", o)
	}
}

// send sends count datagrams to a closed port from an unconnected socket,
// which ICMP port unreachables do not make fail. Paced, so that most reach
// the port: a burst of a thousand fills the CPU's backlog
// (netdev_max_backlog, 1,000) while the machine is busy.
func send(t *testing.T, ns string, to net.IP, count int) {
	c := testutil.Socket(t, ns, func() (net.Conn, error) { return net.ListenUDP("udp", nil) }).(*net.UDPConn)
	for i := 0; i < count; i++ {
		if _, err := c.WriteToUDP([]byte("x"), &net.UDPAddr{IP: to, Port: 7100}); err != nil {
			t.Fatal(err)
		}
		if i%50 == 49 {
			time.Sleep(time.Millisecond)
		}
	}
}
