package engine

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// A change to what lists hold, the policy otherwise the same, needs no
// new tables: the live generation's tables, classifier and rules take the
// difference under an overlay of a new generation's own, as they take
// live changes (datapath.OverLists). A one-line change to a list of a
// million entries so skips the compile and the tables' writes (about 100
// ms of a 0.2 s apply).
//
// The difference is taken against what the tables were compiled from: an
// apply that compiles a policy with a large list keeps a copy of its
// lists' contents with its generation (their bases, in the generation's
// lists directory), and the generation records a digest of every list's
// contents and of the policy but its lists (skeleton). A later apply of a
// policy of the same skeleton and bits, whose changed lists all have a
// base and change by at most maxFileOps prefixes, and that would fold
// nothing the tables do not hold, makes a generation over the live one's
// maps; its record keeps the difference (FileOps), which its overlay
// holds before every live change, older than all of them: the live
// changes still decide the addresses they cover, as they do over a
// compiled file. Anything else compiles.

// maxFileOps is the most prefixes a change of lists is carried in by the
// overlay, about as many live changes as the daemon lets it hold before it
// folds them: past it the tables are compiled again.
const maxFileOps = 1024

// A policy keeps its lists' bases when one of its lists has baseRanges
// ranges or more (smaller policies compile in no time), those of the
// largest lists with a bit first, at most maxBases of them and
// maxBaseBytes in all: the state directory is in memory (/run). A
// variable for tests.
var baseRanges = 1 << 14

const (
	maxBaseBytes = 64 << 20
	maxBases     = 256
)

// skeleton is a digest of what a policy compiles to but what its lists
// hold: its rules (not the lines they are on), actions, lists' names,
// families and inline prefixes.
func skeleton(pol *policy.Policy) string {
	type list struct {
		Name   string
		Family int
		Inline netip.Prefix
	}
	s := struct {
		Rules                        []policy.Rule
		Default, Unparsed, Malformed policy.Action
		Room                         int
		Lists                        []list
	}{Rules: withoutLines(pol.Rules), Default: pol.Default, Unparsed: pol.Unparsed, Malformed: pol.MalformedAction()}
	if pol.FlowSpec != nil {
		for _, n := range pol.FlowSpec.Neighbors {
			s.Room += n.MaxRoutes
		}
	}
	for _, name := range pol.ListNames() {
		l := pol.Lists[name]
		s.Lists = append(s.Lists, list{name, l.Family, l.Inline})
	}
	b, err := json.Marshal(s)
	if err != nil {
		return "" // no skeleton: never taken for another's
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func withoutLines(rules []policy.Rule) []policy.Rule {
	out := slices.Clone(rules)
	for i := range out {
		out[i].Line, out[i].Alt = 0, withoutLines(out[i].Alt)
	}
	return out
}

// contentDigest is a digest of what a list holds, its ranges: 128 bits
// of SHA-256, since a list file is outside data, and contents made to
// collide with the last would keep those in the tables.
func contentDigest(l *policy.List) string {
	d := sha256.New()
	var n [16]byte
	binary.LittleEndian.PutUint64(n[:8], uint64(len(l.V4)))
	binary.LittleEndian.PutUint64(n[8:], uint64(len(l.V6)))
	d.Write(n[:])
	d.Write(compile.AsBytes(l.V4))
	d.Write(compile.AsBytes(l.V6))
	return hex.EncodeToString(d.Sum(nil)[:16])
}

// isDigest reports whether a record's base names a file of the lists
// directory, as contentDigest does, and nothing else.
func isDigest(s string) bool {
	_, err := hex.DecodeString(s)
	return len(s) == 32 && err == nil
}

// baseBytes is what a list's base takes.
func baseBytes(l *policy.List) int { return 24 + len(l.V4)*8 + len(l.V6)*32 }

// carries reports whether a policy keeps its lists' bases: whether a
// later change of its lists can be carried.
func carries(pol *policy.Policy) bool {
	for _, l := range pol.Lists {
		if !l.Inline.IsValid() && len(l.V4)+len(l.V6) >= baseRanges && baseBytes(l) <= maxBaseBytes {
			return true
		}
	}
	return false
}

// basesDir holds generation n's bases, each under its contents' digest.
func (fw *Firewall) basesDir(h Hook, n int) string {
	return filepath.Join(fw.stateDir(h), "gen-"+strconv.Itoa(n)+".lists")
}

// keepContents records what a compiled generation's tables hold of pol's
// lists (hash is their image's) when the policy keeps bases (carries):
// the digests of the lists, and which of them the generation keeps, the
// largest first, up to maxBases and maxBaseBytes; a static list's would
// serve nothing (its changes compile).
func (g *generation) keepContents(pol *policy.Policy, hash string) {
	if !carries(pol) {
		return
	}
	g.Skeleton, g.BaseHash, g.bases = skeleton(pol), hash, map[string]*policy.List{}
	names := slices.SortedFunc(maps.Keys(g.Lists), func(a, b string) int {
		return cmp.Or(cmp.Compare(baseBytes(pol.Lists[b]), baseBytes(pol.Lists[a])), cmp.Compare(a, b))
	})
	budget := maxBaseBytes
	for _, name := range names {
		info, l := g.Lists[name], pol.Lists[name]
		info.Digest = contentDigest(l)
		if info.Base = info.Bit != 0 && baseBytes(l) <= budget && len(g.bases) < maxBases; info.Base {
			budget -= baseBytes(l)
			g.bases[name] = l
		}
		g.Lists[name] = info
	}
}

// keepBases puts g's bases into its lists directory, best effort, once the
// generation is live. A base is there already when another list of the
// same contents put it; else it is linked from old's (nil: none) or from
// another hook's of this apply (written: by digest), else written from the
// lists g.bases holds. A base that cannot be kept is dropped from the
// record (a copy of g.Lists: hooks sharing a generation keep their bases
// apart), and a change to its list then compiles.
func (fw *Firewall) keepBases(h Hook, old, g *generation, written map[string]string) {
	g.Lists = maps.Clone(g.Lists)
	for name, info := range g.Lists {
		if !info.Base {
			continue
		}
		path := filepath.Join(fw.basesDir(h, g.N), info.Digest)
		link := func(from string) bool { return from != "" && os.Link(from, path) == nil }
		_, err := os.Lstat(path)
		kept := isDigest(info.Digest) && (err == nil || os.MkdirAll(filepath.Dir(path), 0o700) == nil &&
			(link(written[info.Digest]) || old != nil && link(filepath.Join(fw.basesDir(h, old.N), info.Digest)) ||
				g.bases[name] != nil && writeFile(path, encodeBase(g.bases[name])) == nil))
		if kept {
			written[info.Digest] = path
			continue
		}
		info.Base = false
		g.Lists[name] = info
	}
}

// dropBases removes g's bases, from its record and its lists directory.
func (fw *Firewall) dropBases(h Hook, g *generation) error {
	for name, info := range g.Lists {
		info.Base = false
		g.Lists[name] = info
	}
	return removeAll(fw.basesDir(h, g.N))
}

// peekLive is the record of the live generation of each of policy i's
// hooks, in hooks' order (as hooksOf), read ahead (olds) and left there
// for install; nil for a hook with an apply to confirm first, whose
// rollback takes the live changes only.
func peekLive(hooks []Hook, polOf map[string]int, i int, states []*hookState, olds []chan *generation) []*generation {
	var lives []*generation
	for j, h := range hooks {
		if polOf[h.Iface] != i {
			continue
		}
		g := <-olds[j]
		olds[j] <- g
		if states[j].pending != nil {
			g = nil
		}
		lives = append(lives, g)
	}
	return lives
}

// encodeBase is a base's file: the counts of IPv4 and IPv6 ranges, the
// ranges, and a checksum (XXH64) of what precedes it.
func encodeBase(l *policy.List) []byte {
	b := make([]byte, 0, baseBytes(l))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(l.V4)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(l.V6)))
	b = append(b, compile.AsBytes(l.V4)...)
	b = append(b, compile.AsBytes(l.V6)...)
	return binary.LittleEndian.AppendUint64(b, xxhash.Sum64(b))
}

// readBase reads a base kept by generation n, checking its checksum.
func (fw *Firewall) readBase(h Hook, n int, name, digest string) (*policy.List, error) {
	path := filepath.Join(fw.basesDir(h, n), digest)
	if !isDigest(digest) {
		return nil, fmt.Errorf("%s: not a list's base", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	bad := fmt.Errorf("%s: not a list's base", path)
	if len(b) < 24 {
		return nil, bad
	}
	n4, n6 := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	if n4 > uint64(len(b))/8 || n6 > uint64(len(b))/32 || uint64(len(b)) != 24+n4*8+n6*32 ||
		binary.LittleEndian.Uint64(b[len(b)-8:]) != xxhash.Sum64(b[:len(b)-8]) {
		return nil, bad
	}
	l := &policy.List{Name: name, V4: make([]policy.Range4, n4), V6: make([]policy.Range6, n6)}
	rest := b[16:]
	rest = rest[copy(compile.AsBytes(l.V4), rest):]
	copy(compile.AsBytes(l.V6), rest)
	return l, nil
}

// overLists makes the generation that carries pol's change over the live
// generation of hooks (shape, opened from the first hook's pins; olds
// their records), when it is a change of lists' contents alone that the
// overlay can take; ok is false otherwise, and nothing is made. ops are
// the live changes, fold the apply's (nil: it folds none).
func (fw *Firewall) overLists(pol *policy.Policy, hooks []Hook, olds []*generation, shape *datapath.Objects, ops []policy.ListOp, fold func(list string) bool) (objs *datapath.Objects, meta generation, ok bool) {
	if shape == nil || len(olds) == 0 {
		return nil, meta, false
	}
	g := olds[0]
	for _, o := range olds {
		if o == nil || o.Skeleton == "" || !sameTables(o, g) {
			return nil, meta, false
		}
	}
	if g.Skeleton != skeleton(pol) || !sameBits(pol, g) {
		return nil, meta, false
	}
	meta = *g
	switch {
	case fold != nil && !g.foldsAll(ops, fold):
		return nil, meta, false // changes to fold: the tables are to be compiled
	case fold == nil && slices.ContainsFunc(ops, g.folded):
		return nil, meta, false // an apply that does not fold takes folded changes out of the tables
	case fold == nil:
		// Changes folded and reverted since, if any: the difference from
		// the tables undoes them.
		meta.Folded, meta.FoldedSeq = nil, 0
	}
	var fileOps []policy.ListOp
	for _, name := range slices.Sorted(maps.Keys(g.Lists)) {
		info, l := g.Lists[name], pol.Lists[name]
		if !info.Base {
			if contentDigest(l) != info.Digest {
				return nil, meta, false // changed, with no base to take the difference from
			}
			continue
		}
		base, err := fw.readBase(hooks[0], g.N, name, info.Digest)
		if err != nil {
			return nil, meta, false
		}
		diff, fits := policy.DiffList(base, l, maxFileOps-len(fileOps))
		switch {
		case !fits, len(diff) > 0 && info.Bit == 0: // a static list: the overlay cannot change it
			return nil, meta, false
		case slices.ContainsFunc(diff, func(op policy.ListOp) bool { return !op.Add }) && len(g.sharing(name)) > 0:
			return nil, meta, false // a removal would clear the other lists' bit too
		}
		fileOps = append(fileOps, diff...)
	}
	meta.FileOps = fileOps
	meta.PolicyHash = meta.BaseHash
	if len(fileOps) > 0 {
		b, _ := json.Marshal(fileOps) // ops cannot fail to encode
		sum := sha256.Sum256(append([]byte(meta.BaseHash), b...))
		meta.PolicyHash = hex.EncodeToString(sum[:])[:len(meta.BaseHash)]
	}
	if file, err := filepath.Abs(pol.File); err == nil {
		meta.PolicyFile = file
	}
	v4, v6 := meta.overlay(meta.overlayOps(ops))
	objs, err := datapath.OverLists(shape, v4, v6)
	if err != nil {
		return nil, meta, false // whatever failed, a compile may not
	}
	return objs, meta, true
}

// sameBits reports whether pol's lists take the bits g's have: which list
// gets one past 63 ways depends on the live changes and what the service
// favours (policy.ListUse), not only on the skeleton.
func sameBits(pol *policy.Policy, g *generation) bool {
	n := 0
	for name, bit := range pol.ListUse().Bits() {
		if pol.Lists[name].Inline.IsValid() {
			continue
		}
		if info, ok := g.Lists[name]; !ok || info.Bit != bit {
			return false
		}
		n++
	}
	return n == len(g.Lists)
}

// foldsAll reports whether the generation's tables hold every change of
// its lists an apply folding the lists fold names would take, and still
// hold every change they took (none was reverted since): such a fold
// would compile the tables the generation has, and record as much.
func (g *generation) foldsAll(ops []policy.ListOp, fold func(list string) bool) bool {
	for name := range g.Lists {
		if _, ok := g.Folded[name]; fold(name) && !ok {
			return false
		}
	}
	held := map[string]int{}
	for _, op := range ops {
		_, ours := g.Lists[op.List]
		switch {
		case g.folded(op):
			held[op.List]++
		case ours && fold(op.List) && op.Expires.IsZero():
			return false
		}
	}
	for list, n := range g.Folded {
		if held[list] < n {
			return false
		}
	}
	return true
}

// sameTables reports whether two hooks' records describe one generation
// of maps: one apply's, over one program.
func sameTables(a, b *generation) bool {
	return a.Skeleton == b.Skeleton && a.BaseHash == b.BaseHash && a.FoldedSeq == b.FoldedSeq &&
		reflect.DeepEqual(a.Folded, b.Folded) && reflect.DeepEqual(a.Lists, b.Lists) && reflect.DeepEqual(a.FileOps, b.FileOps)
}
