package crowdsec

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rampart-fw/rampart/internal/netns"
)

// LAPI is a CrowdSec Local API of Debian's crowdsec package, run alone
// (crowdsec -no-cs) and offline (no Central API), with a database and a
// configuration of its own in Dir, on a loopback port: the host's, or the
// named network namespace's (where cscli runs too).
type LAPI struct {
	Dir, Conf string
	URL, Key  string
	Netns     string
	cmd       *exec.Cmd
	log       *os.File
}

// BouncerKey is the key the LAPI is given for the bouncers of a run.
const BouncerKey = "rampart-lab-bouncer-key-0123456789"

// NewLAPI writes the configuration (from the package's own, which must be
// installed) and registers a machine for cscli and a bouncer; Start runs it.
func NewLAPI(dir string, port int, ns string) (*LAPI, error) {
	raw, err := os.ReadFile("/etc/crowdsec/config.yaml")
	if err != nil {
		return nil, fmt.Errorf("crowdsec's configuration (apt-get install crowdsec): %w", err)
	}
	var c map[string]any
	if err := yaml.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("/etc/crowdsec/config.yaml: %w", err)
	}
	sub := func(m map[string]any, k string) map[string]any {
		if v, ok := m[k].(map[string]any); ok {
			return v
		}
		v := map[string]any{}
		m[k] = v
		return v
	}
	l := &LAPI{Dir: dir, Conf: filepath.Join(dir, "config.yaml"), URL: fmt.Sprintf("http://127.0.0.1:%d/", port), Key: BouncerKey, Netns: ns}
	common := sub(c, "common")
	common["daemonize"], common["log_media"], common["log_dir"] = false, "stdout", dir
	sub(c, "config_paths")["data_dir"] = dir
	db := sub(c, "db_config")
	db["db_path"], db["use_wal"] = filepath.Join(dir, "crowdsec.db"), true
	api := sub(c, "api")
	sub(api, "client")["credentials_path"] = filepath.Join(dir, "local_api_credentials.yaml")
	server := sub(api, "server")
	server["listen_uri"] = fmt.Sprintf("127.0.0.1:%d", port)
	delete(server, "online_client") // offline: no Central API
	sub(c, "prometheus")["enabled"] = false
	out, err := yaml.Marshal(c)
	if err == nil {
		err = os.WriteFile(l.Conf, out, 0o600)
	}
	if err != nil {
		return nil, err
	}
	if _, err := l.Cscli("machines", "add", "rampart-lab", "--auto", "-f", filepath.Join(dir, "local_api_credentials.yaml")); err != nil {
		return nil, err
	}
	if _, err := l.Cscli("bouncers", "add", "rampart-lab", "-k", l.Key); err != nil {
		return nil, err
	}
	return l, nil
}

// Start runs the LAPI and waits until it takes connections.
func (l *LAPI) Start() error {
	f, err := os.OpenFile(filepath.Join(l.Dir, "lapi.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	l.log = f
	l.cmd = InNetns(l.Netns, "crowdsec", "-c", l.Conf, "-no-cs")
	l.cmd.Stdout, l.cmd.Stderr = f, f
	if err := l.cmd.Start(); err != nil {
		f.Close()
		return err
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(l.URL, "http://"), "/")
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := netns.Run(l.Netns, func() error {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return nil
		}
		if time.Now().After(end) {
			l.Stop()
			return fmt.Errorf("the CrowdSec LAPI did not listen on %s within 20 s (see %s)", addr, f.Name())
		}
	}
}

// Stop ends the LAPI.
func (l *LAPI) Stop() {
	if l.cmd != nil && l.cmd.Process != nil {
		l.cmd.Process.Signal(syscall.SIGTERM)
		l.cmd.Wait()
		l.cmd = nil
	}
	if l.log != nil {
		l.log.Close()
		l.log = nil
	}
}

// Cscli runs cscli on the LAPI's configuration.
func (l *LAPI) Cscli(args ...string) (string, error) {
	for try := 1; ; try++ {
		out, err := InNetns(l.Netns, "cscli", append([]string{"-c", l.Conf}, args...)...).CombinedOutput()
		if err == nil {
			return string(out), nil
		}
		// SQLite takes one writer at a time, even with WAL: the LAPI
		// answers a write of cscli's that meets one of its own
		// (expiring decisions, say) "database is locked". It is made
		// again: what of it went in is banned twice, which changes
		// nothing.
		if try == 5 || !strings.Contains(string(out), "database is locked") {
			return string(out), fmt.Errorf("cscli %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		time.Sleep(time.Duration(try) * 200 * time.Millisecond)
	}
}

// InNetns is a command run in a named network namespace ("": this one).
// nsenter, not ip netns exec, which would mount a /sys of the namespace's
// own over the host's and hide bpffs from rampart.
func InNetns(ns, name string, args ...string) *exec.Cmd {
	if ns == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("nsenter", append([]string{"--net=" + filepath.Join("/var/run/netns", ns), name}, args...)...)
}
