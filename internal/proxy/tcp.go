package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

func (s *service) acceptLoop(ctx context.Context, ln *net.TCPListener, wg *sync.WaitGroup) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			s.stats.errors.Add(1)
			slog.Warn("accept", "service", s.cfg.Name, "err", err)
			time.Sleep(10 * time.Millisecond) // out of descriptors: let some close
			continue
		}
		wg.Go(func() { s.relayTCP(ctx, c) })
	}
}

// dialBackend connects to b from the client's address and port (or, when
// that port is taken on this host, any port of the client's address).
func (s *service) dialBackend(ctx context.Context, b netip.AddrPort, client netip.AddrPort) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	d.SetMultipathTCP(false)
	if s.cfg.Transparent {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = transparent(fd, b.Addr().Is6()) }); err != nil {
				return err
			}
			return serr
		}
		d.LocalAddr = net.TCPAddrFromAddrPort(client)
	}
	c, err := d.DialContext(ctx, "tcp", b.String())
	if errors.Is(err, syscall.EADDRINUSE) && s.cfg.Transparent {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(client.Addr(), 0))
		c, err = d.DialContext(ctx, "tcp", b.String())
	}
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// relayTCP joins a client to a backend. io.Copy between two TCPConns is
// TCPConn.ReadFrom, which Go implements with splice(2) through a pipe: the
// bytes never cross into user space.
func (s *service) relayTCP(ctx context.Context, c *net.TCPConn) {
	defer c.Close()
	client := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	b := s.pick(client)
	s.stats.conns.Add(1)
	b.total.Add(1)
	b.active.Add(1)
	s.stats.active.Add(1)
	defer b.active.Add(-1)
	defer s.stats.active.Add(-1)
	u, err := s.dialBackend(ctx, b.addr, client)
	if err != nil {
		s.stats.errors.Add(1)
		slog.Warn("connect to backend", "service", s.cfg.Name, "backend", b.addr.String(), "client", client.String(), "err", err)
		return
	}
	defer u.Close()
	// Shutting down ends relays in flight.
	stop := context.AfterFunc(ctx, func() { c.Close(); u.Close() })
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		n, _ := io.Copy(u, c)
		s.stats.bytesIn.Add(uint64(n))
		u.CloseWrite()
	})
	n, _ := io.Copy(c, u)
	s.stats.bytesOut.Add(uint64(n))
	c.CloseWrite()
	wg.Wait()
}
