// Package serve is rampart as a service: it holds the engine, applies the
// policy at start and again whenever the policy or its lists change (or on
// SIGHUP), expires live list changes, follows the interfaces over netlink,
// keeps live list changes across reboots, and answers Prometheus and a
// local ban API.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Options configure the daemon.
type Options struct {
	PolicyFile   string
	Ifaces       []string
	Mode         datapath.Mode
	Egress       bool
	Listen       string // Prometheus /metrics, "" for none
	APISocket    string // the local API, "" for none
	APIGroup     string // a group whose members may use the API besides root, "" for none
	PersistDir   string // what outlives a reboot: live list changes
	DetachOnExit bool
	Reload       <-chan os.Signal // SIGHUP
	Log          *slog.Logger
	Ready        func() // called once serving
}

// Daemon is a running service.
type Daemon struct {
	fw  *engine.Firewall
	opt Options
	log *slog.Logger

	mu sync.Mutex // one apply or list change at a time
	// live: the lists about to take in-place changes (policy.Policy.Live),
	// under mu: those the saved changes name until they are restored, a
	// static list the ban API is asked to change for the reload that gives
	// it a bit. Once they hold changes, that keeps their bits.
	live map[string]bool
	// shown guards what scrapes and /v1/status read of the reloads, so
	// that they need not wait for a reload under way (mu): writes hold mu
	// then shown; a read needs either.
	shown      sync.Mutex
	generation int
	reloads    map[bool]int // by result
	lastReload time.Time
	lastOK     bool
	lastError  string
	// What the service keeps of the policy it applied: not the policy,
	// whose lists the kernel holds (millions of entries).
	listFiles []string
	listSizes map[string][2]int // entries by family

	apiGID     int           // --api-group's, -1 for none
	apiRefused atomic.Uint64 // API requests from neither root nor the group

	cs *feed   // the CrowdSec decision stream, when the policy has one
	fs *fsFeed // the BGP FlowSpec routes, when the policy has a speaker

	// foldNow asks for a reload that folds the live list changes into the
	// tables (engine's fold.go): the overlay has grown past overlayFoldAt,
	// or a folded change was reverted.
	foldNow chan struct{}
}

// overlayFoldAt is how many live changes the overlay may hold before a
// reload folds them into the tables: past a few, a listed address costs
// an overlay probe per prefix length beside the tables' read, and a
// change rewrites more of the journal.
const overlayFoldAt = 1000

// foldDelay batches the folds a burst of changes asks for into one reload.
const foldDelay = time.Second

// askFold asks for a fold when the overlay holds overlay changes or more,
// or a folded change was undone (owed).
func (d *Daemon) askFold(overlay int, owed bool) {
	if overlay >= overlayFoldAt || owed {
		select {
		case d.foldNow <- struct{}{}:
		default: // one is asked for already
		}
	}
}

// Run serves until ctx ends.
func Run(ctx context.Context, fw *engine.Firewall, opt Options) error {
	d := &Daemon{fw: fw, opt: opt, log: opt.Log, reloads: map[bool]int{}, apiGID: -1, cs: newFeed(), fs: newFSFeed(), live: map[string]bool{},
		foldNow: make(chan struct{}, 1)}
	if d.log == nil {
		d.log = slog.Default()
	}
	// What can fail on its own (an address in use, a path taken, no
	// inotify instance left) is set up before the policy changes the host:
	// a service that cannot serve must not leave a filter behind.
	var servers []*http.Server
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close() // a server closes its own too; the unix socket is removed once
		}
	}()
	if opt.Listen != "" {
		ln, err := net.Listen("tcp", opt.Listen)
		if err != nil {
			return fmt.Errorf("--listen %s: %w", opt.Listen, err)
		}
		lns = append(lns, ln)
		servers = append(servers, &http.Server{Handler: d.metricsHandler(), ReadHeaderTimeout: 5 * time.Second})
	}
	if opt.APISocket != "" {
		ln, err := d.listenAPI()
		if err != nil {
			return err
		}
		lns = append(lns, ln)
		servers = append(servers, &http.Server{Handler: d.authorize(d.apiHandler()), ReadHeaderTimeout: 5 * time.Second,
			ConnContext: withPeer})
	}
	watch, err := newWatcher()
	if err != nil {
		return err
	}
	defer watch.Close()

	links := make(chan netlink.LinkUpdate, 64)
	linkDone := make(chan struct{})
	defer close(linkDone)
	var subOpt netlink.LinkSubscribeOptions
	if ns := fw.Netns(); ns != "" {
		h, err := netns.Open(ns)
		if err != nil {
			return err
		}
		defer h.Close()
		subOpt.Namespace = &h
	}
	if err := netlink.LinkSubscribeWithOptions(links, linkDone, subOpt); err != nil {
		return fmt.Errorf("follow interfaces over netlink: %w", err)
	}

	defer d.stopFlowSpec() // whatever ends the service ends its BGP sessions
	saved, err := d.savedChanges()
	if err != nil {
		d.log.Error("read the saved live list changes", "err", err)
	}
	now := time.Now()
	for _, op := range saved {
		if op.Expires.IsZero() || op.Expires.After(now) {
			d.live[op.List] = true // their lists take bits, to take them
		}
	}
	if err := d.reload("start"); err != nil {
		return err // nothing runs yet: a bad policy at start is fatal
	}
	if err := d.restoreChanges(saved); err != nil {
		d.log.Error("restore live list changes", "err", err)
	}
	d.mu.Lock()
	clear(d.live) // restored, their lists hold changes
	d.mu.Unlock()
	d.rewatch(watch)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer func() {
		for _, s := range servers {
			s.Close()
		}
		wg.Wait()
	}()
	for i, s := range servers {
		wg.Go(func() { s.Serve(lns[i]) })
	}
	wg.Go(func() { d.followCrowdSec(ctx) })
	wg.Go(func() { d.followFlowSpec(ctx) })
	wg.Go(func() {
		if err := fw.ServeExpiry(ctx, func(err error) { d.log.Error("expire list changes", "err", err) }); err != nil {
			d.log.Error("expire list changes", "err", err)
		}
	})
	if opt.Ready != nil {
		opt.Ready()
	}
	d.log.Info("serving", "policy", opt.PolicyFile, "ifaces", opt.Ifaces, "metrics", opt.Listen, "api", opt.APISocket)
	var debounce, fold <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return d.stop()
		case <-opt.Reload:
			// The operator asked, and so vouches for the files: reload even
			// if one seems to be written still, and forget that it was (a
			// writer that never closes must not block later reloads).
			clear(watch.writing)
			d.reload("SIGHUP")
			d.rewatch(watch)
		case ev, ok := <-watch.events:
			if !ok {
				return errors.New("file watcher closed")
			}
			if watch.handle(ev) {
				debounce = time.After(100 * time.Millisecond) // a deploy changes several files
			}
		case <-debounce:
			debounce = nil
			if f := watch.busy(); f != "" {
				// Its close is an event of its own, which reloads.
				d.log.Info("reload waits: a file is open for writing", "file", f)
				continue
			}
			// Watched before reading, so that a change made while the
			// policy is read is an event; again after, for new lists.
			d.rewatch(watch)
			d.reload("file changed")
			d.rewatch(watch)
		case u := <-links:
			d.link(u)
		case <-d.foldNow:
			if fold == nil {
				fold = time.After(foldDelay)
			}
		case <-fold:
			fold = nil
			d.reload("fold live list changes")
		}
	}
}

// reload loads the policy and applies it on every interface, all or
// nothing: a bad file is logged with its file and line, counted, and the
// running policy stays.
func (d *Daemon) reload(why string) error {
	err := d.reloadLocked(why)
	// The parsed lists are garbage now (the kernel holds the tables): give
	// them back, outside the lock so that scrapes do not wait for it.
	freeBigHeap()
	return err
}

// freeBigHeap returns the heap to the OS when it holds more than 32 MB:
// what a list of a million or more leaves after its reload, which the
// next collection, paced on the heap the parse left, would keep for long
// (a 1M-entry list's: RSS 100-117 MB kept, 48 MB given back). A 256-rule
// policy's heap is 11-14 MB after its reload, and a forced collection
// would cost that reload 12 ms more (it takes 40).
func freeBigHeap() {
	held := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}, {Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(held)
	var n uint64
	for _, s := range held {
		if s.Value.Kind() == metrics.KindUint64 {
			n += s.Value.Uint64()
		}
	}
	if n > 32<<20 {
		debug.FreeOSMemory()
	}
}

func (d *Daemon) reloadLocked(why string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reloadHeld(why)
}

// reloadHeld is reloadLocked for a caller holding mu.
func (d *Daemon) reloadHeld(why string) error {
	start := time.Now()
	pol, err := policy.Load(d.opt.PolicyFile, policy.Options{})
	if err == nil {
		pol.Live = maps.Clone(d.live)
	}
	var res *engine.ApplyResult
	var policyOf map[string]*policy.Policy
	if err == nil {
		d.crowdsecList(pol)
		policyOf, err = d.flowspecRules(pol, why == "start")
	}
	if err == nil {
		// Every list's live changes are folded in, but the CrowdSec
		// feed's: its rebuilds put them in the list itself.
		d.cs.mu.Lock()
		cs := d.cs.cfg
		d.cs.mu.Unlock()
		fold := func(list string) bool { return !cs.Feeds(list) }
		res, err = d.fw.Apply(engine.ApplyRequest{Policy: pol, PolicyOf: policyOf, Ifaces: d.opt.Ifaces, Mode: d.opt.Mode, Egress: d.opt.Egress, Fold: fold})
	}
	now := time.Now()
	if err != nil {
		d.shown.Lock()
		d.lastReload, d.lastOK, d.lastError = now, false, err.Error()
		d.reloads[false]++
		d.shown.Unlock()
		d.log.Error("reload failed: the running policy stays", "why", why, "err", err)
		return err
	}
	d.afterReload(pol)
	d.flowspecApplied()
	sizes := map[string][2]int{}
	for name, l := range pol.Lists {
		if !l.Inline.IsValid() { // a rule's prefix (a FlowSpec route's) is no list
			sizes[name] = [2]int{len(l.V4), len(l.V6)}
		}
	}
	// Published at once: a reader sees the reload whole or not at all.
	d.shown.Lock()
	d.lastReload, d.lastOK, d.lastError = now, true, ""
	d.reloads[true]++
	d.listFiles, d.listSizes = pol.ListFiles, sizes
	for _, a := range res.Applied {
		d.generation = max(d.generation, a.Generation)
	}
	generation := d.generation
	d.shown.Unlock()
	d.log.Info("policy applied", "why", why, "rules", len(pol.Rules), "lists", len(sizes), "generation", generation, "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// files are the policy file and the list files it read last, absolute.
func (d *Daemon) files() []string {
	files := []string{d.opt.PolicyFile}
	d.shown.Lock()
	files = append(files, d.listFiles...)
	d.shown.Unlock()
	for i, f := range files {
		if abs, err := filepath.Abs(f); err == nil {
			files[i] = abs
		}
	}
	return files
}

// rewatch points the watcher at the files again: the policy may name
// other lists now, and a link may resolve elsewhere.
func (d *Daemon) rewatch(w *watcher) {
	for dir, err := range w.set(d.files()) {
		d.log.Error("watch: changes there are not seen until SIGHUP", "dir", dir, "err", err)
	}
}

// link follows an interface of the service: one that disappears is
// reported; one that comes back (a new index under the same name) gets
// the policy again.
func (d *Daemon) link(u netlink.LinkUpdate) {
	name := u.Attrs().Name
	if !slices.Contains(d.opt.Ifaces, name) {
		return
	}
	switch u.Header.Type {
	case unix.RTM_DELLINK:
		d.log.Warn("interface disappeared: nothing filters it until it comes back", "iface", name)
	case unix.RTM_NEWLINK:
		d.mu.Lock()
		done, err := d.fw.Reattach([]string{name})
		d.mu.Unlock()
		if err != nil {
			d.log.Error("reattach", "iface", name, "err", err)
		}
		for _, a := range done {
			d.log.Info("interface back: policy attached again", "iface", name, "hook", a.Hook.String(), "generation", a.Generation)
		}
	}
}

// stop leaves the filter running unless told to detach.
func (d *Daemon) stop() error {
	d.stopFlowSpec()
	d.persistChanges()
	if !d.opt.DetachOnExit {
		d.log.Info("stopping; the filter keeps running (rampart detach removes it)")
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, err := d.fw.Detach(d.opt.Ifaces)
	d.log.Info("stopped and detached", "ifaces", d.opt.Ifaces, "err", err)
	return err
}
