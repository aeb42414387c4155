package proxy

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// udpRelay keeps a session per client address and port: a socket bound to
// the client's address (transparent) and connected to a backend. Memory is
// fixed at start: the session table and its index are sized for
// MaxSessions, and two goroutines serve every session, the backend side
// through one epoll set, so neither goroutine stacks nor descriptors grow
// past the cap under a flood of new sources; sessions past it are refused
// and counted.
type udpRelay struct {
	s    *service
	ln   *net.UDPConn
	epfd int
	done chan struct{}

	mu       sync.Mutex
	sessions []udpSession
	free     []int32
	byClient map[netip.AddrPort]int32
}

type udpSession struct {
	fd     int
	gen    int32 // tells a closed session's late epoll events from its successor's
	client netip.AddrPort
	b      *backend
	last   time.Time
}

func newUDPRelay(s *service, ln *net.UDPConn) (*udpRelay, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	n := s.cfg.MaxSessions
	u := &udpRelay{s: s, ln: ln, epfd: epfd, done: make(chan struct{}), sessions: make([]udpSession, n), free: make([]int32, n), byClient: make(map[netip.AddrPort]int32, n)}
	for i := range n {
		u.free[i] = int32(n - 1 - i)
		u.sessions[i].fd = -1
	}
	return u, nil
}

func (u *udpRelay) close() {
	close(u.done)
	u.ln.Close()
}

// clientLoop reads clients' datagrams and sends each on its session.
func (u *udpRelay) clientLoop() {
	buf := make([]byte, 65535)
	for {
		n, client, err := u.ln.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			u.s.stats.errors.Add(1)
			continue
		}
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
		u.s.stats.bytesIn.Add(uint64(n))
		u.mu.Lock()
		i, ok := u.byClient[client]
		if !ok {
			i, ok = u.open(client)
		}
		if ok {
			se := &u.sessions[i]
			se.last = time.Now()
			if _, err := unix.Write(se.fd, buf[:n]); err != nil && err != unix.EAGAIN {
				u.s.stats.errors.Add(1)
			}
		}
		u.mu.Unlock()
	}
}

// open starts a session (u.mu held).
func (u *udpRelay) open(client netip.AddrPort) (int32, bool) {
	if len(u.free) == 0 {
		u.s.stats.refused.Add(1)
		return 0, false
	}
	b := u.s.pick(client)
	fd, err := u.dial(b.addr, client)
	if err != nil {
		u.s.stats.errors.Add(1)
		slog.Warn("open UDP session", "service", u.s.cfg.Name, "client", client.String(), "err", err)
		return 0, false
	}
	i := u.free[len(u.free)-1]
	u.free = u.free[:len(u.free)-1]
	se := &u.sessions[i]
	se.fd, se.client, se.b, se.gen = fd, client, b, se.gen+1
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: i, Pad: se.gen}
	if err := unix.EpollCtl(u.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		u.closeSession(i)
		u.s.stats.errors.Add(1)
		return 0, false
	}
	u.byClient[client] = i
	u.s.stats.sessions.Add(1)
	u.s.stats.conns.Add(1)
	b.total.Add(1)
	b.active.Add(1)
	return i, true
}

func sockaddr(a netip.AddrPort) unix.Sockaddr {
	if a.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: a.Addr().As4(), Port: int(a.Port())}
	}
	return &unix.SockaddrInet6{Addr: a.Addr().As16(), Port: int(a.Port())}
}

// dial opens a socket from the client's address and port to the backend.
func (u *udpRelay) dial(b, client netip.AddrPort) (int, error) {
	fd, err := unix.Socket(family4or6(b.Addr()), unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if u.s.cfg.Transparent {
		if err = transparent(uintptr(fd), b.Addr().Is6()); err == nil {
			err = unix.Bind(fd, sockaddr(client))
		}
	}
	if err == nil {
		err = unix.Connect(fd, sockaddr(b))
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// closeSession ends session i (u.mu held).
func (u *udpRelay) closeSession(i int32) {
	se := &u.sessions[i]
	if se.fd < 0 {
		return
	}
	unix.Close(se.fd) // leaves the epoll set with it
	if u.byClient[se.client] == i {
		delete(u.byClient, se.client)
		u.s.stats.sessions.Add(-1)
		se.b.active.Add(-1)
	}
	se.fd, se.b = -1, nil
	u.free = append(u.free, i)
}

// backendLoop relays backends' replies to their clients and ends idle
// sessions.
func (u *udpRelay) backendLoop() {
	defer unix.Close(u.epfd)
	events := make([]unix.EpollEvent, 256)
	buf := make([]byte, 65535)
	lastSweep := time.Now()
	for {
		select {
		case <-u.done:
			u.mu.Lock()
			for i := range u.sessions {
				u.closeSession(int32(i))
			}
			u.mu.Unlock()
			return
		default:
		}
		n, err := unix.EpollWait(u.epfd, events, 100)
		if err != nil && err != unix.EINTR {
			slog.Error("epoll", "err", err)
			return
		}
		for _, ev := range events[:max(n, 0)] {
			u.mu.Lock()
			se := u.sessions[ev.Fd]
			u.mu.Unlock()
			if se.fd < 0 || se.gen != ev.Pad {
				continue
			}
			for {
				m, err := unix.Read(se.fd, buf)
				if err != nil {
					break // EAGAIN: drained; an ICMP error: dropped
				}
				if _, err := u.ln.WriteToUDPAddrPort(buf[:m], se.client); err != nil {
					u.s.stats.errors.Add(1)
				}
				u.s.stats.bytesOut.Add(uint64(m))
			}
		}
		if time.Since(lastSweep) >= time.Second {
			lastSweep = time.Now()
			u.sweep()
		}
	}
}

// sweep closes sessions idle past the timeout.
func (u *udpRelay) sweep() {
	cutoff := time.Now().Add(-u.s.cfg.IdleTimeout)
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := range u.sessions {
		if se := &u.sessions[i]; se.fd >= 0 && se.last.Before(cutoff) {
			u.closeSession(int32(i))
		}
	}
}
