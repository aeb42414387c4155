package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Hook is one attachment point of the firewall's namespace: an interface,
// one direction.
type Hook struct {
	Iface  string `json:"iface"`
	Egress bool   `json:"egress"`
}

// Direction is "ingress" or "egress".
func (h Hook) Direction() string {
	if h.Egress {
		return "egress"
	}
	return "ingress"
}

func (h Hook) String() string { return h.Iface + " " + h.Direction() }

// Layout, per hook:
//
//	<pin root>/<scope>/<iface>/<direction>/link, gen-N/{programs and maps}
//	<state root>/<scope>/<iface>/<direction>/gen-N.json, pending.json
func (fw *Firewall) pinDir(h Hook) string {
	return filepath.Join(fw.scopePins(), h.Iface, h.Direction())
}
func (fw *Firewall) stateDir(h Hook) string {
	return filepath.Join(fw.scopeState(), h.Iface, h.Direction())
}
func (fw *Firewall) genPins(h Hook, n int) string {
	return filepath.Join(fw.pinDir(h), "gen-"+strconv.Itoa(n))
}
func (fw *Firewall) genFile(h Hook, n int) string {
	return filepath.Join(fw.stateDir(h), "gen-"+strconv.Itoa(n)+".json")
}
func (fw *Firewall) pendingFile(h Hook) string { return filepath.Join(fw.stateDir(h), "pending.json") }

func (fw *Firewall) attachment(h Hook) datapath.Attachment {
	return datapath.Attachment{Netns: fw.netns, Iface: h.Iface, Egress: h.Egress, LinkPin: filepath.Join(fw.pinDir(h), "link")}
}

// RuleInfo names what a counter slot belongs to.
type RuleInfo struct {
	Name string `json:"name"`
	// Match is a digest of the rule's policy.MatchKey (matchDigest); the
	// records of releases before it hold the key itself.
	Match  string `json:"match"`
	Action string `json:"action"`
}

// ListInfo is a list of an applied policy: its bit in the tables, and the
// family its entries are restricted to (0: both).
type ListInfo struct {
	Bit    uint64 `json:"bit"`
	Family int    `json:"family,omitempty"`
	// Digest is of what the tables hold of the list; Base: the generation
	// keeps those contents, under the digest (listchange.go).
	Digest string `json:"digest,omitempty"`
	Base   bool   `json:"base,omitempty"`
}

// generation describes one pinned generation of a hook's objects.
type generation struct {
	N          int                 `json:"generation"`
	Mode       datapath.Mode       `json:"mode"`
	PolicyFile string              `json:"policy_file"`
	PolicyHash string              `json:"policy_hash"`
	AppliedAt  time.Time           `json:"applied_at"`
	Rules      []RuleInfo          `json:"rules"`
	Default    string              `json:"default"`
	Unparsed   string              `json:"unparsed"`
	Malformed  string              `json:"malformed"`
	Lists      map[string]ListInfo `json:"lists,omitempty"`
	// Carried holds, per counter slot, what earlier generations counted
	// (rules kept across a re-apply keep their counters).
	Carried []abi.Counter `json:"carried"`
	// CarriedEvents holds, per rule, the limit and cookie events earlier
	// generations counted.
	CarriedEvents []abi.RuleEvents `json:"carried_events,omitempty"`
	// FloodKey keys the program's SYN cookies and flood tables; the next
	// generation takes it over (state is root's alone, as the maps are).
	FloodKey [2]uint64 `json:"flood_key"`
	// FoldedSeq and Folded: the live list changes compiled into the
	// tables (fold.go), those without a TTL of the lists Folded names up
	// to FoldedSeq; Folded counts them by list.
	FoldedSeq uint64         `json:"folded_seq,omitempty"`
	Folded    map[string]int `json:"folded,omitempty"`
	// Skeleton is a digest of the policy but its lists' contents, BaseHash
	// the hash of the image the tables were compiled from, and FileOps
	// what the lists' files changed since, which the overlay holds before
	// every live change (listchange.go).
	Skeleton string          `json:"skeleton,omitempty"`
	BaseHash string          `json:"base_hash,omitempty"`
	FileOps  []policy.ListOp `json:"file_ops,omitempty"`
	// bases are the lists whose contents the generation keeps, for
	// keepBases to write.
	bases map[string]*policy.List
}

// syncookie reports whether the generation answers SYNs with cookies, which
// at XDP needs the cookie check at tc beside it.
func (g *generation) syncookie() bool {
	return slices.ContainsFunc(g.Rules, func(r RuleInfo) bool { return r.Action == policy.Syncookie.String() })
}

// pending is the journal of a transaction not yet confirmed: written before
// anything is swapped, removed when it is confirmed or rolled back.
type pending struct {
	Token    string    `json:"token"`
	Deadline time.Time `json:"deadline"`
	// Watched: applied with --confirm, a watchdog rolls it back at the
	// deadline. Otherwise the apply holds the lock until it confirms, so
	// whoever finds it with the lock held finds the leftovers of a crash.
	Watched  bool `json:"watched"`
	PID      int  `json:"pid"`
	Previous int  `json:"previous"` // the generation to go back to; 0: none
	Next     int  `json:"next"`
}

// writeGen writes g's record. Carried counts end at the last that is not
// zero (readers take a missing one as zero): a feed's 10,000 rules with
// no limit or cookie events made 560 KB of zeros in every record, read and
// written again by every apply.
func (fw *Firewall) writeGen(h Hook, g *generation) error {
	rec := *g
	rec.Carried = trimZeros(g.Carried)
	rec.CarriedEvents = trimZeros(g.CarriedEvents)
	return writeJSON(fw.genFile(h, g.N), &rec)
}

func trimZeros[T comparable](s []T) []T {
	var zero T
	n := len(s)
	for n > 0 && s[n-1] == zero {
		n--
	}
	return s[:n]
}

func (fw *Firewall) readGen(h Hook, n int) (*generation, error) {
	var g generation
	ok, err := readJSON(fw.genFile(h, n), &g)
	if err != nil || !ok {
		return nil, err
	}
	// A record cut short (a full disk, an editor) parses as JSON but says
	// nothing true: no generation, no layer, no date.
	if g.N != n || g.Mode == "" || g.AppliedAt.IsZero() {
		return nil, fmt.Errorf("%s: an incomplete record (generation %d, mode %q, applied %s)", fw.genFile(h, n), g.N, g.Mode, g.AppliedAt.Format(time.RFC3339))
	}
	return &g, nil
}

func (fw *Firewall) readPending(h Hook) (*pending, error) {
	var p pending
	ok, err := readJSON(fw.pendingFile(h), &p)
	if err != nil || !ok {
		return nil, err
	}
	return &p, nil
}

// hooks lists the hooks of the namespace that have pins or state, in order.
func (fw *Firewall) hooks() ([]Hook, error) {
	seen := map[Hook]bool{}
	for _, root := range []string{fw.scopePins(), fw.scopeState()} {
		ifaces, err := os.ReadDir(root)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, needRoot(err)
		}
		for _, i := range ifaces {
			if !i.IsDir() {
				continue
			}
			for _, egress := range []bool{false, true} {
				h := Hook{Iface: i.Name(), Egress: egress}
				if _, err := os.Stat(filepath.Join(root, i.Name(), h.Direction())); err == nil {
					seen[h] = true
				}
			}
		}
	}
	out := make([]Hook, 0, len(seen))
	for h := range seen {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b Hook) int {
		if c := strings.Compare(a.Iface, b.Iface); c != 0 {
			return c
		}
		return map[bool]int{false: 0, true: 1}[a.Egress] - map[bool]int{false: 0, true: 1}[b.Egress]
	})
	return out, nil
}

// eachHook calls fn for every hook of the namespace with its state, going on
// past errors (one reading a hook's state among them) and returning them
// all. The caller holds the lock.
func (fw *Firewall) eachHook(fn func(h Hook, st *hookState) error) error {
	hooks, err := fw.hooks()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hooks {
		st, err := fw.state(h)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, fn(h, st))
	}
	return errors.Join(errs...)
}

// withHooks is eachHook with the lock held.
func (fw *Firewall) withHooks(fn func(h Hook, st *hookState) error) error {
	unlock, err := fw.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return fw.eachHook(fn)
}

// generations lists the generation numbers a hook has pins or a file for.
func (fw *Firewall) generations(h Hook) ([]int, error) {
	set := map[int]bool{}
	for _, dir := range []string{fw.pinDir(h), fw.stateDir(h)} {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, needRoot(err)
		}
		for _, e := range entries {
			name := strings.TrimSuffix(e.Name(), ".json")
			if n, err := strconv.Atoi(strings.TrimPrefix(name, "gen-")); err == nil && strings.HasPrefix(name, "gen-") {
				set[n] = true
			}
		}
	}
	var out []int
	for n := range set {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// hookState is what the kernel and the files say of a hook now.
type hookState struct {
	link    datapath.LinkState
	live    int // the generation the link runs; 0: none known
	gens    []int
	pending *pending
}

func (fw *Firewall) state(h Hook) (*hookState, error) {
	st := &hookState{}
	var err error
	if st.link, err = datapath.ReadLink(fw.attachment(h)); err != nil {
		return nil, fmt.Errorf("%s: read the link: %w", h, err)
	}
	if st.gens, err = fw.generations(h); err != nil {
		return nil, err
	}
	if st.pending, err = fw.readPending(h); err != nil {
		return nil, err
	}
	if st.link.Pinned {
		for _, n := range st.gens {
			if fw.runs(h, n, st.link.Program) {
				st.live = n
			}
		}
	}
	return st, nil
}

// runs reports whether generation n's pinned programs include id, and
// they read n's maps (generations share the programs of their shape).
func (fw *Firewall) runs(h Hook, n int, id ebpf.ProgramID) bool {
	dir := fw.genPins(h, n)
	return slices.Contains(datapath.PinnedPrograms(dir), id) && datapath.PinnedLive(dir)
}

// newest is the generation a hook would run: the live one, else the newest
// with both pins and a description.
func (fw *Firewall) newest(h Hook, st *hookState) int {
	if st.live != 0 {
		return st.live
	}
	for i := len(st.gens) - 1; i >= 0; i-- {
		n := st.gens[i]
		if _, err := os.Stat(fw.genPins(h, n)); err == nil {
			if g, err := fw.readGen(h, n); err == nil && g != nil {
				return n
			}
		}
	}
	return 0
}

// removeGen removes a generation's pins and description.
func (fw *Firewall) removeGen(h Hook, n int) error {
	// The bases first: a crash half way leaves the record, which a later
	// removal finds, not a lists directory no record names.
	return errors.Join(removeAll(fw.basesDir(h, n)), removeAll(fw.genPins(h, n)), removeFile(fw.genFile(h, n)))
}

func removeAll(path string) error {
	if err := os.RemoveAll(path); err != nil {
		return needRoot(err)
	}
	return nil
}

func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return needRoot(err)
	}
	return nil
}
