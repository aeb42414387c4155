package crowdsec

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Set is the decisions a Local API gave that are still active, by ID. Each
// expires on its own time, and a decision the LAPI sends again takes its new
// time: a block list refreshed upstream stays enforced (the failure of
// cs-firewall-bouncer's element timeouts, crowdsecurity/cs-firewall-bouncer
// #509, cannot happen here). A prefix is enforced while any decision of an
// enforced type holds it.
type Set struct {
	mu      sync.Mutex
	byID    map[int64]entry
	counts  map[Kind]int // active decisions by origin and type
	next    time.Time    // the earliest expiry, zero when none
	Enforce func(Decision) bool
}

// Kind is a decision's origin and type, a metric's labels.
type Kind struct{ Origin, Type string }

type entry struct {
	prefix  netip.Prefix
	kind    Kind
	expires int64 // unix nanoseconds
}

// NewSet is an empty set enforcing the decisions enforce accepts.
func NewSet(enforce func(Decision) bool) *Set {
	return &Set{byID: map[int64]entry{}, counts: map[Kind]int{}, Enforce: enforce}
}

// SetEnforce changes which decisions are enforced.
func (s *Set) SetEnforce(enforce func(Decision) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Enforce = enforce
}

// Len is how many decisions the set holds.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// Counts are the active decisions by origin and type.
func (s *Set) Counts() map[Kind]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[Kind]int, len(s.counts))
	for k, n := range s.counts {
		if n > 0 {
			out[k] = n
		}
	}
	return out
}

func (s *Set) put(d Decision) (added bool) {
	old, had := s.byID[d.ID]
	if had {
		s.counts[old.kind]--
	}
	e := entry{d.Prefix, Kind{d.Origin, d.Type}, d.Expires.UnixNano()}
	s.byID[d.ID] = e
	s.counts[e.kind]++
	if s.next.IsZero() || d.Expires.Before(s.next) {
		s.next = d.Expires
	}
	return !had || old.prefix != d.Prefix
}

func (s *Set) del(id int64) bool {
	e, ok := s.byID[id]
	if ok {
		delete(s.byID, id)
		s.counts[e.kind]--
	}
	return ok
}

// Replace makes the set what a startup answer says: every active decision.
// It says whether what is enforced may have changed (a decision came or
// went, or changed its prefix or type), not merely an expiry, and returns
// the enforced decisions that are new.
func (s *Set) Replace(a *Answer) (changed bool, fresh []Decision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.byID
	s.byID, s.counts, s.next = make(map[int64]entry, len(a.New)), map[Kind]int{}, time.Time{}
	for _, d := range a.New {
		s.put(d)
		if o, ok := old[d.ID]; (!ok || o.prefix != d.Prefix) && s.enforced(d.Prefix, d.Type) {
			fresh = append(fresh, d)
		}
	}
	if len(old) != len(s.byID) || len(fresh) > 0 {
		return true, fresh
	}
	for id, e := range s.byID {
		if o, ok := old[id]; !ok || o.kind.Type != e.kind.Type {
			return true, fresh
		}
	}
	return false, fresh
}

// Update applies a delta. It returns the new enforced decisions (their
// prefixes may be enforced already), and whether a decision went, which
// only rebuilding the list from the set can honour (another decision may
// still hold its prefix, or a range around it).
func (s *Set) Update(a *Answer) (adds []Decision, removed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range a.Deleted {
		removed = s.del(d.ID) || removed
	}
	for _, d := range a.New {
		if s.put(d) && s.enforced(d.Prefix, d.Type) {
			adds = append(adds, d)
		}
	}
	return adds, removed
}

func (s *Set) enforced(p netip.Prefix, typ string) bool {
	return s.Enforce == nil || s.Enforce(Decision{Prefix: p, Type: typ})
}

// Expire drops the decisions past their time; it says whether any went.
func (s *Set) Expire(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next.IsZero() || now.Before(s.next) {
		return false
	}
	n := now.UnixNano()
	var next int64
	removed := false
	for id, e := range s.byID {
		if e.expires <= n {
			delete(s.byID, id)
			s.counts[e.kind]--
			removed = true
		} else if next == 0 || e.expires < next {
			next = e.expires
		}
	}
	s.next = time.Time{}
	if next != 0 {
		s.next = time.Unix(0, next)
	}
	return removed
}

// Prefixes are the enforced prefixes (duplicates merge when a list is
// built of them).
func (s *Set) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, ps := range s.ByOrigin() {
		out = append(out, ps...)
	}
	return out
}

// ByOrigin are the enforced prefixes by the origin of their decisions.
func (s *Set) ByOrigin() map[string][]netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]netip.Prefix{}
	for _, e := range s.byID {
		if s.enforced(e.prefix, e.kind.Type) {
			out[e.kind.Origin] = append(out[e.kind.Origin], e.prefix)
		}
	}
	return out
}

// Save writes the set to path (a line per decision, in no order: id,
// expiry in unix nanoseconds, prefix, type, origin), replacing the file
// whole.
func (s *Set) Save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	// In the map's order, each line appended to one buffer: the service
	// saves after every change, and sorting the IDs, looking each up again
	// and formatting with fmt took a third of its CPU while a million
	// decisions were imported.
	var line []byte
	s.mu.Lock()
	for id, e := range s.byID {
		line = strconv.AppendInt(line[:0], id, 10)
		line = append(line, ' ')
		line = strconv.AppendInt(line, e.expires, 10)
		line = append(line, ' ')
		line = e.prefix.AppendTo(line)
		line = append(append(line, ' '), e.kind.Type...)
		line = append(append(line, ' '), e.kind.Origin...)
		line = append(line, '\n')
		w.Write(line)
	}
	s.mu.Unlock()
	err = w.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// Load reads a set Save wrote, keeping the decisions not expired by now.
// A missing file is an empty set.
func (s *Set) Load(path string, now time.Time) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var ds []Decision
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for line := 1; sc.Scan(); line++ {
		fs := strings.SplitN(sc.Text(), " ", 5) // the origin, last, is the rest of the line
		if len(fs) < 4 {
			return fmt.Errorf("%s:%d: want id, expiry, prefix, type and origin", path, line)
		}
		id, err1 := strconv.ParseInt(fs[0], 10, 64)
		exp, err2 := strconv.ParseInt(fs[1], 10, 64)
		p, err3 := netip.ParsePrefix(fs[2])
		if err1 != nil || err2 != nil || err3 != nil {
			return fmt.Errorf("%s:%d: not a saved decision", path, line)
		}
		d := Decision{ID: id, Prefix: p, Type: fs[3], Expires: time.Unix(0, exp)}
		if len(fs) == 5 {
			d.Origin = fs[4]
		}
		if d.Expires.After(now) {
			ds = append(ds, d)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	s.Replace(&Answer{New: ds})
	return nil
}
