package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/proxy"
	"github.com/rampart-fw/rampart/internal/unixhttp"
	"github.com/rampart-fw/rampart/internal/yamlpos"
)

func proxyCmd(g *globals) *cobra.Command {
	var file, listen, backend, status string
	var udp bool
	c := &cobra.Command{
		Use:   "proxy -f proxy.yaml | --listen ADDR:PORT --backend ADDR:PORT [--udp]",
		Short: "An L4 reverse proxy that connects to backends from the client's own address",
		Long: `proxy relays TCP (with splice, no copy through user space) and UDP (a
session per client address and port, an idle timeout, a hard cap) to
backends, connecting from the client's address and port (IP_TRANSPARENT),
so the services behind it see their real clients. It installs on start,
and removes on exit, the routing that delivers the backends' replies to
its sockets: a rule per backend (its address, protocol and source port)
into a table of local routes, IPv4 and IPv6. A table is one proxy's in a
network namespace: a start refuses a table a running proxy has, a table
the kernel reserves (0, 253, 254, 255) and one holding routes or looked up
by rules it did not install; it removes what a killed run with the same
table left, and nothing of other tables. While it runs, the proxy checks
its rules and routes every second and puts back what others removed
(proxy status shows it). With --netns it runs in that namespace, as under
ip netns exec. The backends must route those replies back through the
proxy: 'rampart proxy backend-setup' on each does it.

The file:

  table: 7100                 # routing table (and rule priority)
  services:
    - name: web
      protocol: tcp           # or udp
      listen: 192.0.2.1:80    # [2001:db8::1]:80 for IPv6
      backends: [10.0.0.10:80, 10.0.0.11:80]   # the listener's family
      balance: round-robin    # least-conn, source-hash
      health_interval: 2s     # TCP connect checks; 0 for none
      transparent: true
      idle_timeout: 30s       # UDP sessions
      max_sessions: 10000     # UDP sessions, descriptors and memory fixed`,
		Example: `  rampart proxy -f /etc/rampart/proxy.yaml
  rampart --netns edge proxy -f /etc/rampart/proxy.yaml
  rampart proxy --listen 192.0.2.1:53 --backend 10.0.0.53:53 --udp
  rampart proxy status --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg *proxy.Config
			switch {
			case file != "" && (listen != "" || backend != ""):
				return errors.New("give -f or --listen/--backend, not both")
			case file != "":
				var err error
				if cfg, err = proxy.Load(file); err != nil {
					return err
				}
			case listen != "" && backend != "":
				proto := "tcp"
				if udp {
					proto = "udp"
				}
				text := fmt.Sprintf("services:\n  - name: %s\n    protocol: %s\n    listen: %q\n    backends: [%q]\n", proto, proto, listen, backend)
				var err error
				if cfg, err = proxy.Parse("--listen/--backend", []byte(text)); err != nil {
					// Name the flag, not a line of the text built from them.
					var pe *yamlpos.Error
					if flag := map[string]string{"listen": "--listen", "backends": "--backend"}[fieldOf(err, &pe)]; flag != "" {
						return fmt.Errorf("%s %s", flag, pe.Msg)
					}
					return err
				}
			default:
				return errors.New("-f FILE, or --listen and --backend, is required")
			}
			if err := execInNetns(g.netns); err != nil {
				return err
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(g.env.Stderr, nil)))
			p := proxy.New(cfg)
			p.StateDir = filepath.Join(g.stateRoot, "proxy")
			return p.Run(cmd.Context(), g.proxyStatus(status), func() {
				for _, s := range cfg.Services {
					slog.Info("serving", "service", s.Name, "protocol", s.Proto(), "listen", s.Listen.String(), "backends", len(s.Backends), "transparent", s.Transparent)
				}
			})
		},
	}
	f := c.Flags()
	f.StringVarP(&file, "file", "f", "", "proxy configuration file")
	f.StringVar(&listen, "listen", "", "one service: the address and port to listen on")
	f.StringVar(&backend, "backend", "", "one service: the backend's address and port")
	f.BoolVar(&udp, "udp", false, "one service: UDP instead of TCP")
	c.PersistentFlags().StringVar(&status, "status", "", "unix socket the proxy answers status on (default STATE_ROOT/proxy.sock; STATE_ROOT/proxy-netns-NAME.sock with --netns)")
	c.AddCommand(proxyStatusCmd(g, &status), backendSetupCmd(g))
	return c
}

func proxyStatusCmd(g *globals, status *string) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Services, sessions, bytes and errors of the running proxy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := proxy.ReadStatus(g.proxyStatus(*status))
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(st)
			}
			rows := [][]string{{"SERVICE", "PROTO", "LISTEN", "CONNS", "ACTIVE", "SESSIONS", "REFUSED", "IN", "OUT", "ERRORS", "BACKENDS UP"}}
			for _, s := range st.Services {
				up := 0
				for _, b := range s.Backends {
					if b.Healthy {
						up++
					}
				}
				rows = append(rows, []string{s.Name, s.Protocol, s.Listen, fmt.Sprint(s.Connections), fmt.Sprint(s.Active), fmt.Sprint(s.Sessions),
					fmt.Sprint(s.SessionsRefused), fmt.Sprint(s.BytesIn), fmt.Sprint(s.BytesOut), fmt.Sprint(s.Errors), fmt.Sprintf("%d/%d", up, len(s.Backends))})
			}
			g.table(rows)
			fmt.Fprintln(g.env.Stdout, routingLine(st.Routing))
			return nil
		},
	}
}

// routingLine says whether the proxy's rules and routes are in place, and
// when they last had to be put back.
func routingLine(r proxy.RoutingStatus) string {
	if r.Rules == 0 {
		return "routing: none (no transparent service)"
	}
	line := fmt.Sprintf("routing: table %d in place (ip rules: %d, local routes: 2)", r.Table, r.Rules)
	if !r.InPlace {
		line = fmt.Sprintf("routing: table %d NOT IN PLACE: %s", r.Table, r.Error)
	}
	if r.Repairs > 0 {
		line += fmt.Sprintf("; put back %d time(s), last at %s (%s)", r.Repairs, r.LastProblemAt.Local().Format(time.DateTime), r.LastProblem)
	}
	return line
}

// proxyStatus is the proxy's status socket: the flag's, else the default of
// the namespace the command names.
func (g *globals) proxyStatus(flag string) string {
	if flag != "" {
		return flag
	}
	return unixhttp.DefaultPath(g.stateRoot, "proxy", g.netns)
}

// execInNetns starts this command again inside the named network
// namespace, as ip netns exec does, and returns nil when it already runs
// there. Every socket the proxy opens belongs to the namespace of the
// thread that opens it: its listeners, but also one per connection to a
// backend, UDP sessions, health checks and netlink requests. A Go process
// cannot move all of its threads, and entering the namespace around each
// socket would hold a thread through every connect in flight; a process
// started from a thread inside the namespace is wholly inside it.
func execInNetns(name string) error {
	if name == "" {
		return nil
	}
	if inside, err := netns.Inside(name); err != nil || inside {
		return err
	}
	err := netns.Run(name, func() error { return syscall.Exec("/proc/self/exe", os.Args, os.Environ()) })
	// Still here: the exec failed.
	return fmt.Errorf("start again in network namespace %q: %w", name, err)
}

func backendSetupCmd(g *globals) *cobra.Command {
	var by string
	var proxyAddrs, ports []string
	var table int
	var undo bool
	c := &cobra.Command{
		Use:   "backend-setup --proxy ADDR[,ADDR6] [--by source --port P[,P…] | --by mark] [--undo]",
		Short: "On a backend: route replies to proxied clients back through the proxy",
		Long: `backend-setup installs on a backend the return routing a transparent proxy
needs: replies addressed to the proxy's clients go to the proxy instead of
the default route. --by source matches the backend's address and service
ports (--port); --by mark marks connections arriving from the proxy's MAC
address (nft table inet rampart_proxy_return) and routes their replies by
the mark. Both use table --table via --proxy. --undo removes it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := execInNetns(g.netns); err != nil {
				return err
			}
			b := proxy.BackendSetup{By: by, Table: table}
			if undo {
				if err := b.Undo(); err != nil {
					return err
				}
				fmt.Fprintln(g.env.Stdout, "removed the return routing")
				return nil
			}
			if len(proxyAddrs) == 0 {
				return errors.New("--proxy is required: the proxy's address on this backend's network (one per family)")
			}
			for _, s := range proxyAddrs {
				a, err := netip.ParseAddr(strings.TrimSpace(s))
				if err != nil {
					return fmt.Errorf("--proxy %q: the proxy's address on this backend's network", s)
				}
				b.Proxies = append(b.Proxies, a.Unmap())
			}
			for _, p := range ports {
				n, err := strconv.ParseUint(strings.TrimSpace(p), 10, 16)
				if err != nil || n == 0 {
					return fmt.Errorf("--port %q: a port from 1 to 65535", p)
				}
				b.Ports = append(b.Ports, uint16(n))
			}
			if err := b.Install(); err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]any{"proxies": b.Proxies, "by": by, "ports": b.Ports, "table": table})
			}
			fmt.Fprintf(g.env.Stdout, "replies to proxied clients now go via %v (table %d, by %s); --undo removes it\n", b.Proxies, table, by)
			return nil
		},
	}
	c.Flags().StringSliceVar(&proxyAddrs, "proxy", nil, "the proxy's address on this backend's network, one per family (comma-separated)")
	c.Flags().StringVar(&by, "by", "source", "source (the backend's address and --port) or mark (connections from the proxy's MAC)")
	c.Flags().StringSliceVar(&ports, "port", nil, "with --by source: the service ports (comma-separated)")
	c.Flags().IntVar(&table, "table", proxy.DefaultTable, "routing table (and rule priority)")
	c.Flags().BoolVar(&undo, "undo", false, "remove the return routing")
	return c
}

// fieldOf is the field a yamlpos.Error names ("" for other errors).
func fieldOf(err error, pe **yamlpos.Error) string {
	if errors.As(err, pe) {
		return (*pe).Field
	}
	return ""
}
