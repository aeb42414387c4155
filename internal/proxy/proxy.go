package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/unixhttp"
)

// backend is one backend of a service and its state.
type backend struct {
	addr    netip.AddrPort
	healthy atomic.Bool
	active  atomic.Int64
	total   atomic.Uint64
}

// service is a running service.
type service struct {
	cfg      Service
	backends []*backend
	next     atomic.Uint64
	stats    stats
}

type stats struct {
	conns, active, refused, errors atomic.Int64
	bytesIn, bytesOut              atomic.Uint64 // from clients, to clients
	sessions                       atomic.Int64
}

// pick chooses a healthy backend (any when none is healthy: the connect
// then fails and is counted).
func (s *service) pick(client netip.AddrPort) *backend {
	var up []*backend
	for _, b := range s.backends {
		if b.healthy.Load() {
			up = append(up, b)
		}
	}
	if len(up) == 0 {
		up = s.backends
	}
	switch s.cfg.Balance {
	case "least-conn":
		best := up[0]
		for _, b := range up[1:] {
			if b.active.Load() < best.active.Load() {
				best = b
			}
		}
		return best
	case "source-hash":
		h := fnv.New32a()
		h.Write(client.Addr().AsSlice())
		return up[h.Sum32()%uint32(len(up))]
	}
	return up[s.next.Add(1)%uint64(len(up))]
}

// healthLoop connects to each backend every interval from the proxy's own
// address; a backend that refuses or times out takes no new connections.
// UDP backends have no check a proxy can make without knowing the
// protocol: they are taken as up.
func (s *service) healthLoop(ctx context.Context) {
	for _, b := range s.backends {
		b.healthy.Store(true)
	}
	if s.cfg.UDP || s.cfg.Health == 0 {
		return
	}
	t := time.NewTicker(s.cfg.Health)
	defer t.Stop()
	for {
		for _, b := range s.backends {
			d := net.Dialer{Timeout: min(s.cfg.Health, time.Second)}
			d.SetMultipathTCP(false)
			c, err := d.DialContext(ctx, "tcp", b.addr.String())
			if err == nil {
				c.Close()
			}
			if was := b.healthy.Swap(err == nil); was != (err == nil) {
				slog.Info("backend health", "service", s.cfg.Name, "backend", b.addr.String(), "healthy", err == nil)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// transparent sets IP_TRANSPARENT (IPV6_TRANSPARENT): the socket may bind
// to an address this host does not own, the client's.
func transparent(fd uintptr, v6 bool) error {
	if v6 {
		return unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
	}
	return unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
}

// CheckCapability says what the host lacks for transparent connects.
func CheckCapability() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := transparent(uintptr(fd), false); err != nil {
		return fmt.Errorf("IP_TRANSPARENT: %w: connecting from clients' addresses needs CAP_NET_ADMIN", err)
	}
	return nil
}

// Proxy runs a configuration's services.
type Proxy struct {
	// StateDir keeps the claims on routing tables (see Routing.Claim).
	StateDir string

	cfg      *Config
	services []*service
	routing  *Routing

	mu         sync.Mutex
	routingNow RoutingStatus
}

// routingCheck is how often a running proxy checks that its rules and
// routes are still in place: others may flush rules or tables.
const routingCheck = time.Second

// New prepares cfg's services.
func New(cfg *Config) *Proxy {
	p := &Proxy{cfg: cfg, routing: NewRouting(cfg)}
	p.routingNow = RoutingStatus{Table: cfg.Table, Rules: len(p.routing.rules), InPlace: true}
	for _, sc := range cfg.Services {
		s := &service{cfg: sc}
		for _, b := range sc.Backends {
			s.backends = append(s.backends, &backend{addr: b})
		}
		p.services = append(p.services, s)
	}
	return p
}

// Run installs the routing, serves until ctx ends, then removes the
// routing. ready (if not nil) is called once every listener is open.
func (p *Proxy) Run(ctx context.Context, statusSocket string, ready func()) error {
	if err := CheckCapability(); err != nil {
		return err
	}
	release, err := p.routing.Claim(p.StateDir, p.cfg.Source)
	if err != nil {
		return err
	}
	defer release()
	if err := p.routing.Install(); err != nil {
		return err
	}
	defer func() {
		if err := p.routing.Remove(); err != nil {
			slog.Error("remove the proxy's routing", "table", p.cfg.Table, "err", err)
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var closers []func()
	shutdown := func() {
		cancel()
		for _, c := range closers {
			c()
		}
		wg.Wait()
	}
	defer shutdown()
	for _, s := range p.services {
		stop, err := s.start(ctx, &wg)
		if err != nil {
			return fmt.Errorf("service %s: %w", s.cfg.Name, err)
		}
		closers = append(closers, stop)
		wg.Go(func() { s.healthLoop(ctx) })
	}
	if statusSocket != "" {
		stop, err := p.serveStatus(statusSocket)
		if err != nil {
			return err
		}
		closers = append(closers, stop)
	}
	if p.routing.Needed() {
		wg.Go(func() { p.watchRouting(ctx) })
	}
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	return nil
}

// watchRouting puts back the rules and routes others remove while the
// proxy runs: without them backends' replies never reach it, and clients
// wait on connections that cannot complete.
func (p *Proxy) watchRouting(ctx context.Context) {
	t := time.NewTicker(routingCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.checkRouting()
	}
}

// checkRouting checks the routing once, puts back what is missing, and
// records it for the status.
func (p *Proxy) checkRouting() {
	missing, err := p.routing.Repair()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := &p.routingNow
	wasErr := st.Error
	st.InPlace, st.Error = err == nil, ""
	if err != nil {
		st.Error = err.Error()
	}
	if len(missing) > 0 {
		st.LastProblem, st.LastProblemAt = "missing: "+strings.Join(missing, "; "), time.Now()
		if err == nil {
			st.Repairs++
			slog.Warn("the proxy's routing was removed: put back", "table", p.cfg.Table, "missing", strings.Join(missing, "; "))
		}
	}
	// A failure that lasts is logged once, and when it changes.
	if err != nil && st.Error != wasErr {
		slog.Error("the proxy's routing is not in place and could not be put back", "table", p.cfg.Table, "missing", strings.Join(missing, "; "), "err", err)
	}
}

func (s *service) start(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	lc := net.ListenConfig{Control: func(network, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			// A v6 listener takes v6 clients only: a v4 client cannot
			// be connected from to a v6 backend.
			if s.cfg.Listen.Addr().Is6() {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	lc.SetMultipathTCP(false) // splice and IP_TRANSPARENT want plain TCP
	network := s.cfg.Proto() + family(s.cfg.Listen)
	if s.cfg.UDP {
		pc, err := lc.ListenPacket(ctx, network, s.cfg.Listen.String())
		if err != nil {
			return nil, err
		}
		u, err := newUDPRelay(s, pc.(*net.UDPConn))
		if err != nil {
			pc.Close()
			return nil, err
		}
		wg.Go(u.clientLoop)
		wg.Go(u.backendLoop)
		return u.close, nil
	}
	ln, err := lc.Listen(ctx, network, s.cfg.Listen.String())
	if err != nil {
		return nil, err
	}
	wg.Go(func() { s.acceptLoop(ctx, ln.(*net.TCPListener), wg) })
	return func() { ln.Close() }, nil
}

// Status is what `rampart proxy status` shows.
type Status struct {
	Services []ServiceStatus `json:"services"`
	Routing  RoutingStatus   `json:"routing"`
}

// RoutingStatus is the proxy's routing as last checked.
type RoutingStatus struct {
	Table int `json:"table"`
	Rules int `json:"rules"` // ip rules it installs; none without transparent services
	// InPlace: every rule and local route was there, or has been put back.
	InPlace bool `json:"in_place"`
	// Repairs counts the checks that found some removed and put them back.
	Repairs       int       `json:"repairs"`
	LastProblem   string    `json:"last_problem,omitempty"`
	LastProblemAt time.Time `json:"last_problem_at,omitzero"`
	Error         string    `json:"error,omitempty"` // why they could not be checked or put back
}

// ServiceStatus is one service's counters.
type ServiceStatus struct {
	Name            string          `json:"name"`
	Protocol        string          `json:"protocol"`
	Listen          string          `json:"listen"`
	Transparent     bool            `json:"transparent"`
	Connections     int64           `json:"connections"`
	Active          int64           `json:"active"`
	Sessions        int64           `json:"sessions"`
	SessionsRefused int64           `json:"sessions_refused"`
	BytesIn         uint64          `json:"bytes_from_clients"`
	BytesOut        uint64          `json:"bytes_to_clients"`
	Errors          int64           `json:"errors"`
	Backends        []BackendStatus `json:"backends"`
}

// BackendStatus is one backend's state.
type BackendStatus struct {
	Addr        string `json:"addr"`
	Healthy     bool   `json:"healthy"`
	Active      int64  `json:"active"`
	Connections uint64 `json:"connections"`
}

// Status reads the counters.
func (p *Proxy) Status() Status {
	st := Status{Services: []ServiceStatus{}}
	p.mu.Lock()
	st.Routing = p.routingNow
	p.mu.Unlock()
	for _, s := range p.services {
		ss := ServiceStatus{
			Name: s.cfg.Name, Protocol: s.cfg.Proto(), Listen: s.cfg.Listen.String(), Transparent: s.cfg.Transparent,
			Connections: s.stats.conns.Load(), Active: s.stats.active.Load(), Sessions: s.stats.sessions.Load(),
			SessionsRefused: s.stats.refused.Load(), BytesIn: s.stats.bytesIn.Load(), BytesOut: s.stats.bytesOut.Load(),
			Errors: s.stats.errors.Load(),
		}
		for _, b := range s.backends {
			ss.Backends = append(ss.Backends, BackendStatus{b.addr.String(), b.healthy.Load(), b.active.Load(), b.total.Load()})
		}
		st.Services = append(st.Services, ss)
	}
	return st
}

// serveStatus answers GET /status on a unix socket only root can open.
func (p *Proxy) serveStatus(path string) (func(), error) {
	ln, err := unixhttp.Listen(path)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(p.Status())
	})}
	go srv.Serve(ln)
	return func() { srv.Close() }, nil // Close removes the socket if it is still ours
}

// ReadStatus asks a running proxy for its status.
func ReadStatus(path string) (Status, error) {
	var st Status
	resp, err := unixhttp.Client(path, 5*time.Second).Get("http://proxy/status")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return st, fmt.Errorf("no proxy answers on %s: is rampart proxy running (with this --status)?", path)
		}
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}
