package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/serve"
)

func serveCmd(g *globals) *cobra.Command {
	var (
		file, mode, listen, api, apiGroup, persist, logFormat string
		ifaces                                                []string
		egress, detach                                        bool
	)
	c := &cobra.Command{
		Use:   "serve -f POLICY --iface IF [--iface IF2] [--listen 127.0.0.1:9712]",
		Short: "Run as a service: live reload, Prometheus metrics, a ban API",
		Long: `serve applies the policy, then keeps it: it reloads when the policy file or
one of its list files changes (or on SIGHUP) through the same validated,
atomic apply as rampart apply (a bad file is logged with its line and the
running policy stays), expires live list changes itself, attaches the
policy again to an interface that is deleted and created again, and keeps
live list changes under --persist so a reboot (empty /run and bpffs) gets
them back. It serves Prometheus metrics on --listen (/metrics) and an
HTTP/JSON API on a unix socket (--api; rampart list add|del|revert use it
when it runs) that answers root, and the members of --api-group, by the
client's credentials. On SIGTERM it stops and leaves the filter running,
unless --detach-on-exit.

A file changes when it is closed after writing or renamed into place, and
not while it is open for writing; symbolic links (a Kubernetes ConfigMap's
..data) are followed. The safe way to replace a file is to write a new one
and rename it over the old.

API: POST /v1/ban and /v1/unban {"list": L, "prefixes": [...], "ttl": "10m"},
POST /v1/revert {"list": L, "prefixes": [...]}, GET /v1/changes, /v1/status,
/v1/stats, /v1/flowspec (rampart flowspec show).

A crowdsec: section makes it a CrowdSec bouncer, a flowspec: section a BGP
speaker whose FlowSpec routes become rules (see the README).`,
		Example: `  rampart serve -f /etc/rampart/policy.yaml --iface eth0
  curl --unix-socket /run/rampart/api.sock -d '{"list":"blocklist","prefixes":["203.0.113.7"],"ttl":"1h"}' http://rampart/v1/ban`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" || len(ifaces) == 0 {
				return errors.New("-f POLICY and --iface IF are required")
			}
			m, err := datapath.ParseMode(mode)
			if err != nil {
				return err
			}
			var h slog.Handler
			switch logFormat {
			case "text":
				h = slog.NewTextHandler(g.env.Stderr, nil)
			case "json":
				h = slog.NewJSONHandler(g.env.Stderr, nil)
			default:
				return fmt.Errorf("--log-format %q: text or json", logFormat)
			}
			fw, err := g.recover(g.loadingFirewall())
			if err != nil {
				return err
			}
			if api == "" {
				api = serve.DefaultSocket(g.stateRoot, g.netns)
			}
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			return serve.Run(cmd.Context(), fw, serve.Options{
				PolicyFile: file, Ifaces: ifaces, Mode: m, Egress: egress, Listen: listen, APISocket: api, APIGroup: apiGroup,
				PersistDir: persist, DetachOnExit: detach, Reload: hup, Log: slog.New(h),
			})
		},
	}
	f := c.Flags()
	f.StringVarP(&file, "file", "f", "", "policy file (YAML)")
	f.StringArrayVar(&ifaces, "iface", nil, "interface to filter (repeat for several)")
	f.StringVar(&mode, "mode", "auto", "layer: auto, xdp-native, xdp-generic or tc")
	f.BoolVar(&egress, "egress", false, "filter outgoing packets (tc egress) instead of incoming")
	f.StringVar(&listen, "listen", "127.0.0.1:9712", "address for Prometheus /metrics (\"\" for none)")
	f.StringVar(&api, "api", "", "unix socket for the API (default STATE_ROOT/api.sock; STATE_ROOT/api-netns-NAME.sock with --netns)")
	f.StringVar(&apiGroup, "api-group", "", "group whose members may use the API besides root (the socket becomes 0660 with this group)")
	f.StringVar(&persist, "persist", "/var/lib/rampart", "directory for what outlives a reboot (live list changes)")
	f.BoolVar(&detach, "detach-on-exit", false, "detach from the interfaces when stopping")
	f.StringVar(&logFormat, "log-format", "text", "log lines as text (journald-friendly key=value) or json")
	return c
}
