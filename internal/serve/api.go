package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/unixhttp"
)

// BanRequest adds (ban) or removes (unban) addresses or prefixes of a list,
// for TTL when it is set.
type BanRequest struct {
	List     string   `json:"list"`
	Prefixes []string `json:"prefixes"`
	TTL      string   `json:"ttl,omitempty"` // a Go duration: "10m"
}

// apiHandler is the local API, for root and --api-group (authorize).
//
//	POST /v1/ban, /v1/unban  BanRequest → {"hooks": […], "expires": …}
//	POST /v1/revert          {"list": L, "prefixes": […]} → the changes removed
//	GET  /v1/changes         the live list changes
//	GET  /v1/status          hooks and the last reload
//	GET  /v1/stats           every counter
func (d *Daemon) apiHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/ban", func(w http.ResponseWriter, r *http.Request) { d.change(w, r, true) })
	mux.HandleFunc("POST /v1/unban", func(w http.ResponseWriter, r *http.Request) { d.change(w, r, false) })
	mux.HandleFunc("POST /v1/revert", func(w http.ResponseWriter, r *http.Request) {
		var req BanRequest
		prefixes, _, err := decodeBan(r, &req)
		if err != nil {
			reply(w, nil, err)
			return
		}
		if err := d.fedList(req.List); err != nil {
			reply(w, nil, err)
			return
		}
		d.mu.Lock()
		removed, err := d.fw.RevertList(req.List, prefixes)
		d.mu.Unlock()
		d.persistChanges()
		if owed, ferr := d.fw.FoldOwed(); ferr == nil {
			d.askFold(0, owed) // reverted changes the tables hold go at the fold
		}
		reply(w, map[string]any{"removed": nonNil(removed)}, err)
	})
	mux.HandleFunc("GET /v1/changes", func(w http.ResponseWriter, r *http.Request) {
		ops, err := d.fw.Changes()
		reply(w, map[string]any{"changes": nonNil(ops)}, err)
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		hooks, err := d.fw.Status()
		d.shown.Lock()
		st := map[string]any{"netns": d.fw.Netns(), "hooks": hooks, "policy": d.opt.PolicyFile, "generation": d.generation,
			"last_reload": d.lastReload, "last_reload_ok": d.lastOK, "last_reload_error": d.lastError,
			"reloads": map[string]int{"success": d.reloads[true], "failure": d.reloads[false]}}
		d.shown.Unlock()
		reply(w, st, err)
	})
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		snap, err := d.fw.Stats()
		reply(w, snap, err)
	})
	mux.HandleFunc("GET /v1/flowspec", func(w http.ResponseWriter, r *http.Request) {
		snap, err := d.fw.Stats()
		reply(w, d.flowspecShow(snap.Rows), err)
	})
	return mux
}

// listenAPI binds the API socket: 0600 for root alone, or 0660 with the
// group of --api-group.
func (d *Daemon) listenAPI() (net.Listener, error) {
	if name := d.opt.APIGroup; name != "" {
		g, err := user.LookupGroup(name)
		if err != nil {
			if g, err = user.LookupGroupId(name); err != nil {
				return nil, fmt.Errorf("--api-group %s: no such group (a name or a number from /etc/group)", name)
			}
		}
		if d.apiGID, err = strconv.Atoi(g.Gid); err != nil {
			return nil, fmt.Errorf("--api-group %s: gid %q: %w", name, g.Gid, err)
		}
	}
	ln, err := unixhttp.ListenGroup(d.opt.APISocket, d.apiGID)
	if err != nil {
		return nil, fmt.Errorf("--api: %w", err)
	}
	if d.apiGID >= 0 {
		d.warnUnreachable()
	}
	return ln, nil
}

// warnUnreachable logs a directory on the way to the socket that the
// members of --api-group cannot search: they could not connect at all.
func (d *Daemon) warnUnreachable() {
	abs, err := filepath.Abs(d.opt.APISocket)
	if err != nil {
		return
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		m := fi.Mode().Perm()
		if ok && m&0o001 == 0 && (int(st.Gid) != d.apiGID || m&0o010 == 0) {
			d.log.Warn("--api-group: its members cannot reach the API socket: give the group search permission on the directory (chgrp GROUP DIR; chmod g+x DIR) or put --api in one they can search",
				"dir", dir, "mode", fmt.Sprintf("%04o", m), "group", d.opt.APIGroup)
			return
		}
		if dir == "/" {
			return
		}
	}
}

type peerKey struct{}

// withPeer records the credentials of the process that connected, for
// authorize: the kernel's (SO_PEERCRED), not the socket's file mode,
// which anyone who can chmod it could widen.
func withPeer(ctx context.Context, c net.Conn) context.Context {
	p, err := unixhttp.PeerOf(c)
	if err != nil {
		return ctx // no peer: refused
	}
	return context.WithValue(ctx, peerKey{}, p)
}

// authorize answers root and the members of --api-group, and refuses
// anyone else with 403, logged and counted (rampart_api_refused_total).
func (d *Daemon) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := r.Context().Value(peerKey{}).(unixhttp.Peer)
		if ok && (p.UID == 0 || (d.apiGID >= 0 && p.InGroup(uint32(d.apiGID)))) {
			next.ServeHTTP(w, r)
			return
		}
		d.apiRefused.Add(1)
		who := []any{"method", r.Method, "path", r.URL.Path}
		if ok {
			who = append(who, "uid", p.UID, "gid", p.GID, "pid", p.PID)
		} else {
			who = append(who, "uid", "unknown (no peer credentials)")
		}
		d.log.Warn("API request refused: the client is neither root nor in --api-group", who...)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]string{"error": "forbidden: the API answers root and the members of rampart serve's --api-group only"})
	})
}

func nonNil(ops []policy.ListOp) []policy.ListOp {
	if ops == nil {
		return []policy.ListOp{}
	}
	return ops
}

// maxBanBody bounds a ban request: about 2 million addresses, as a feed
// sends them at startup.
const maxBanBody = 64 << 20

func decodeBan(r *http.Request, req *BanRequest) ([]netip.Prefix, time.Duration, error) {
	// Unknown fields are refused: a misspelt "ttl" would otherwise ban for
	// good. So is anything after the object.
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBanBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(req)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON object")
	}
	if err != nil {
		return nil, 0, fmt.Errorf("request body (one JSON object of at most %d MiB: split a larger change): %w", maxBanBody>>20, err)
	}
	var prefixes []netip.Prefix
	for _, s := range req.Prefixes {
		p, err := policy.ParsePrefix(s)
		if err != nil {
			return nil, 0, fmt.Errorf("prefix %q: %w", s, err)
		}
		prefixes = append(prefixes, p)
	}
	var ttl time.Duration
	if req.TTL != "" {
		var err error
		if ttl, err = time.ParseDuration(req.TTL); err != nil || ttl <= 0 {
			return nil, 0, fmt.Errorf("ttl %q: a positive duration such as 10m", req.TTL)
		}
	}
	return prefixes, ttl, nil
}

func (d *Daemon) change(w http.ResponseWriter, r *http.Request, add bool) {
	var req BanRequest
	prefixes, ttl, err := decodeBan(r, &req)
	if err == nil && (req.List == "" || len(prefixes) == 0) {
		err = errors.New("list and prefixes are required")
	}
	if err == nil {
		err = d.fedList(req.List)
	}
	if err != nil {
		reply(w, nil, err)
		return
	}
	res, err := d.changeList(engine.ListChange{List: req.List, Prefixes: prefixes, Add: add, TTL: ttl})
	d.persistChanges()
	if err != nil {
		reply(w, nil, err)
		return
	}
	d.askFold(res.Foldable, false)
	out := map[string]any{"hooks": res.Hooks}
	if !res.Expires.IsZero() {
		out["expires"] = res.Expires
	}
	reply(w, out, nil)
}

// changeList makes a change through the engine. A list without a bit of
// the membership mask (a static list, past 63 ways of naming lists) takes
// one first, by a reload (policy.Policy.Live), unless the bits are all
// taken by lists holding changes or fed by CrowdSec.
func (d *Daemon) changeList(c engine.ListChange) (*engine.ListChanged, error) {
	d.mu.Lock() // across the reload: a change racing it would find the list static
	defer d.mu.Unlock()
	res, err := d.fw.ChangeList(c)
	if !errors.Is(err, engine.ErrStaticList) {
		return res, err
	}
	// A bit for the reload; then the change the list holds keeps it one.
	d.live[c.List] = true
	defer delete(d.live, c.List)
	if rerr := d.reloadHeld(fmt.Sprintf("list %s changed in place", c.List)); rerr != nil {
		return nil, fmt.Errorf("%w; the reload that would give it a bit failed: %v", err, rerr)
	}
	return d.fw.ChangeList(c)
}

// fedList refuses changes by hand to the list CrowdSec feeds: the next
// answer of the LAPI would undo them, or they its decisions.
func (d *Daemon) fedList(list string) error {
	d.cs.mu.Lock()
	defer d.cs.mu.Unlock()
	if c := d.cs.cfg; c != nil && (d.cs.ownsList(list) || list == "") {
		return fmt.Errorf("list %q is fed by CrowdSec (%s): change its decisions there (cscli decisions add|delete)", c.List, c.URL)
	}
	return nil
}

func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	json.NewEncoder(w).Encode(v)
}

// Client talks to a running service's API.
type Client struct{ http *http.Client }

// DefaultSocket is where the service of a network namespace ("": the
// host's) answers by default: one socket per namespace, so that a command
// reaches the service of the namespace it names.
func DefaultSocket(stateRoot, netns string) string {
	return unixhttp.DefaultPath(stateRoot, "api", netns)
}

// Dial returns a client for the service answering on socket, or nil when
// none does. A service of another namespace than netns is an error: its
// changes would land there.
func Dial(socket, netns string) (*Client, error) {
	c := &Client{http: unixhttp.Client(socket, 30*time.Second)}
	var st struct{ Netns string }
	if err := c.Do("GET", "/v1/status", nil, &st); err != nil {
		// No socket, or nobody listening: no service. Anything else (a
		// refusal, a timeout) is a service that would not take the change,
		// which must not then go around it.
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, nil
		}
		return nil, fmt.Errorf("the service on %s: %w", socket, err)
	}
	if st.Netns != netns {
		return nil, fmt.Errorf("the service on %s filters %s, not %s: stop it, or give the namespace it serves", socket, nsName(st.Netns), nsName(netns))
	}
	return c, nil
}

func nsName(ns string) string {
	if ns == "" {
		return "the host's namespace"
	}
	return "network namespace " + ns
}

// Do sends a request and decodes the answer into out.
func (c *Client) Do(method, path string, in, out any) error {
	var body strings.Builder
	if in != nil {
		json.NewEncoder(&body).Encode(in)
	}
	req, err := http.NewRequest(method, "http://rampart"+path, strings.NewReader(body.String()))
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("rampart serve's API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		json.NewDecoder(resp.Body).Decode(&e)
		return errors.New(e.Error)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// The live list changes are kept under PersistDir too: /run (and the pins)
// are empty after a reboot, and the unexpired bans must come back.
func (d *Daemon) persistPath() string { return filepath.Join(d.opt.PersistDir, "list-changes.json") }

func (d *Daemon) persistChanges() {
	if d.opt.PersistDir == "" {
		return
	}
	ops, err := d.fw.Changes()
	if err == nil {
		err = os.MkdirAll(d.opt.PersistDir, 0o700)
	}
	if err == nil {
		var b []byte
		b, err = json.Marshal(nonNil(ops))
		tmp := d.persistPath() + ".tmp"
		if err == nil {
			err = os.WriteFile(tmp, b, 0o600)
		}
		if err == nil {
			err = os.Rename(tmp, d.persistPath())
		}
	}
	if err != nil {
		d.log.Error("keep live list changes", "dir", d.opt.PersistDir, "err", err)
	}
}

// savedChanges are the live list changes saved under PersistDir.
func (d *Daemon) savedChanges() ([]policy.ListOp, error) {
	if d.opt.PersistDir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(d.persistPath())
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ops []policy.ListOp
	if err := json.Unmarshal(b, &ops); err != nil {
		return nil, fmt.Errorf("%s: %w", d.persistPath(), err)
	}
	return ops, nil
}

// restoreChanges puts the saved changes back where /run lost them; their
// lists took bits at the start (Daemon.live), as far as there were bits.
func (d *Daemon) restoreChanges(ops []policy.ListOp) error {
	if len(ops) == 0 {
		return nil
	}
	n, err := d.fw.RestoreChanges(ops)
	if n > 0 {
		d.log.Info("live list changes restored", "changes", n, "from", d.persistPath())
	}
	d.askFold(n, false)
	return err
}
