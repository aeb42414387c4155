// Package proxy is an L4 reverse proxy that connects to its backends from
// the client's own address (IP_TRANSPARENT), so the services behind it see
// who their clients are, and sets up the routing that takes.
package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rampart-fw/rampart/internal/yamlpos"
)

// Config is a proxy file: services and the routing table they use.
type Config struct {
	Services []Service
	// Table is the routing table that delivers backends' replies to the
	// proxy's sockets; its ip rules carry this table's number as priority.
	Table int
	// Source names where the configuration was read from (a file), for
	// messages.
	Source string
}

// Service is one listener and its backends.
type Service struct {
	Name        string
	UDP         bool
	Listen      netip.AddrPort
	Backends    []netip.AddrPort
	Balance     string        // round-robin, least-conn, source-hash
	Health      time.Duration // TCP connect check interval, 0: none
	Transparent bool          // connect from the client's address
	IdleTimeout time.Duration // UDP sessions
	MaxSessions int           // UDP sessions
}

// Proto is "tcp" or "udp".
func (s Service) Proto() string {
	if s.UDP {
		return "udp"
	}
	return "tcp"
}

// DefaultTable is the routing table number a config does not set.
const DefaultTable = 7100

// reservedTables are the kernel's (a route added to table 0 goes to the
// main table).
var reservedTables = map[int]string{0: "table 0 is the main table to the kernel", 253: "table 253 is the kernel's default table", 254: "table 254 is the kernel's main table", 255: "table 255 is the kernel's local table"}

// Load reads and validates a proxy file; errors name the file, line and
// field.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse validates proxy configuration text; path names it in errors.
func Parse(path string, data []byte) (*Config, error) {
	p := &cfgParser{file: path}
	var doc yaml.Node
	if err := yamlpos.NewDecoder(path, data).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, &yamlpos.Error{File: path, Line: 1, Msg: "empty: a proxy file needs a services list"}
	}
	top, err := p.fields(doc.Content[0], "proxy", "services", "table")
	if err != nil {
		return nil, err
	}
	c := &Config{Table: DefaultTable, Source: path}
	if n := top["table"]; n != nil {
		if c.Table, err = p.intIn(n, "table", 0, 0xfffffeff); err != nil {
			return nil, err
		}
		if what := reservedTables[c.Table]; what != "" {
			return nil, p.errf(n, "table", "%q: %s, reserved: the proxy's local default route there would make every address local to this host; choose an unused table such as %d", n.Value, what, DefaultTable)
		}
	}
	svcs := top["services"]
	if svcs == nil || svcs.Kind != yaml.SequenceNode || len(svcs.Content) == 0 {
		return nil, p.errf(doc.Content[0], "services", "a list of at least one service is required")
	}
	names := map[string]bool{}
	for _, n := range svcs.Content {
		s, err := p.service(n)
		if err != nil {
			return nil, err
		}
		if names[s.Name] {
			return nil, p.errf(n, "name", "service %q is named twice", s.Name)
		}
		names[s.Name] = true
		c.Services = append(c.Services, s)
	}
	return c, nil
}

type cfgParser struct{ file string }

func (p *cfgParser) errf(n *yaml.Node, field, format string, args ...any) error {
	return yamlpos.Errorf(p.file, n, field, format, args...)
}

func (p *cfgParser) fields(n *yaml.Node, what string, allowed ...string) (map[string]*yaml.Node, error) {
	return yamlpos.Fields(p.file, n, what, allowed...)
}

func (p *cfgParser) intIn(n *yaml.Node, field string, lo, hi int) (int, error) {
	v, err := strconv.Atoi(n.Value)
	if err != nil || v < lo || v > hi {
		return 0, p.errf(n, field, "%q: want a whole number from %d to %d", n.Value, lo, hi)
	}
	return v, nil
}

func (p *cfgParser) duration(n *yaml.Node, field string) (time.Duration, error) {
	d, err := time.ParseDuration(n.Value)
	if err != nil || d < 0 {
		return 0, p.errf(n, field, "%q: want a duration such as 30s", n.Value)
	}
	return d, nil
}

// addrPort reads "ADDR:PORT" or "[V6]:PORT", with the port checked here to
// name it (netip's error does not say which part is wrong).
func (p *cfgParser) addrPort(n *yaml.Node, field string) (netip.AddrPort, error) {
	host, port, ok := strings.Cut(n.Value, "]:")
	if ok {
		host = strings.TrimPrefix(host, "[")
	} else if i := strings.LastIndex(n.Value, ":"); i > 0 {
		host, port = n.Value[:i], n.Value[i+1:]
	} else {
		return netip.AddrPort{}, p.errf(n, field, "%q: want ADDRESS:PORT ([ADDRESS]:PORT for IPv6)", n.Value)
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, p.errf(n, field, "%q: %q is not an IP address", n.Value, host)
	}
	v, err := strconv.Atoi(port)
	if err != nil || v < 1 || v > 65535 {
		return netip.AddrPort{}, p.errf(n, field, "%q: port %q is not from 1 to 65535", n.Value, port)
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(v)), nil
}

func (p *cfgParser) service(n *yaml.Node) (Service, error) {
	f, err := p.fields(n, "service", "name", "protocol", "listen", "backends", "balance", "health_interval", "transparent", "idle_timeout", "max_sessions")
	if err != nil {
		return Service{}, err
	}
	s := Service{Balance: "round-robin", Health: 2 * time.Second, Transparent: true, IdleTimeout: 30 * time.Second, MaxSessions: 10000}
	if f["name"] == nil || f["listen"] == nil || f["backends"] == nil {
		return s, p.errf(n, "service", "name, listen and backends are required")
	}
	s.Name = f["name"].Value
	if v := f["protocol"]; v != nil {
		switch v.Value {
		case "tcp":
		case "udp":
			s.UDP = true
		default:
			return s, p.errf(v, "protocol", "%q: tcp or udp", v.Value)
		}
	}
	if s.Listen, err = p.addrPort(f["listen"], "listen"); err != nil {
		return s, err
	}
	b := f["backends"]
	if b.Kind != yaml.SequenceNode || len(b.Content) == 0 {
		return s, p.errf(b, "backends", "a list of at least one ADDRESS:PORT")
	}
	for _, e := range b.Content {
		ap, err := p.addrPort(e, "backends")
		if err != nil {
			return s, err
		}
		if ap.Addr().Is4() != s.Listen.Addr().Is4() {
			return s, p.errf(e, "backends", "%s is IPv%s and the service listens on IPv%s: a proxy cannot connect from a client's address to a backend of the other family (listen on the backend's family)", ap, family(ap), family(s.Listen))
		}
		s.Backends = append(s.Backends, ap)
	}
	if v := f["balance"]; v != nil {
		if !slices.Contains([]string{"round-robin", "least-conn", "source-hash"}, v.Value) {
			return s, p.errf(v, "balance", "%q: round-robin, least-conn or source-hash", v.Value)
		}
		s.Balance = v.Value
	}
	if v := f["health_interval"]; v != nil {
		if s.Health, err = p.duration(v, "health_interval"); err != nil {
			return s, err
		}
	}
	if v := f["transparent"]; v != nil {
		if v.Value != "true" && v.Value != "false" {
			return s, p.errf(v, "transparent", "%q: true or false", v.Value)
		}
		s.Transparent = v.Value == "true"
	}
	if v := f["idle_timeout"]; v != nil {
		if s.IdleTimeout, err = p.duration(v, "idle_timeout"); err != nil {
			return s, err
		}
	}
	if v := f["max_sessions"]; v != nil {
		if s.MaxSessions, err = p.intIn(v, "max_sessions", 1, 1<<20); err != nil {
			return s, err
		}
	}
	return s, nil
}

func family(a netip.AddrPort) string {
	if a.Addr().Is4() {
		return "4"
	}
	return "6"
}
