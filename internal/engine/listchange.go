package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
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
// apply that compiles keeps a copy of each large list's contents with its
// generation (its base, in the generation's lists directory), and the
// generation records a digest of every list's contents and of the policy
// but its lists (skeleton). A later apply of a policy of the same skeleton
// whose changed lists all have a base and change by at most
// maxFileOps prefixes makes a generation over the live one's maps; its
// record keeps the difference (FileOps), which its overlay holds before
// every live change, older than all of them: the live changes still
// decide the addresses they cover, as they do over a compiled file.
// Anything else compiles.

// maxFileOps is the most prefixes a change of lists is carried in by the
// overlay, about as many live changes as the daemon lets it hold before it
// folds them: past it the tables are compiled again.
const maxFileOps = 1024

// Lists of fewer ranges than baseRanges compile in no time and keep no
// base; neither do lists whose base would take more than maxBaseBytes of
// the state directory, which is in memory (/run). A variable for tests.
var baseRanges = 1 << 14

const maxBaseBytes = 64 << 20

// skeleton is a digest of what a policy compiles to but what its lists
// hold: its rules, actions, lists' names, families and inline prefixes.
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
	}{Rules: pol.Rules, Default: pol.Default, Unparsed: pol.Unparsed, Malformed: pol.MalformedAction()}
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

// contentDigest is a digest of what a list holds, its ranges (64 bits of
// XXH64: a collision would take a changed list for an unchanged one, and
// the tables would keep its old contents until the next compile).
func contentDigest(l *policy.List) string {
	return fmt.Sprintf("%016x", baseSum(l))
}

func baseSum(l *policy.List) uint64 {
	d := xxhash.New()
	var n [16]byte
	binary.LittleEndian.PutUint64(n[:8], uint64(len(l.V4)))
	binary.LittleEndian.PutUint64(n[8:], uint64(len(l.V6)))
	d.Write(n[:])
	d.Write(compile.AsBytes(l.V4))
	d.Write(compile.AsBytes(l.V6))
	return d.Sum64()
}

// keepsBase reports whether a list's contents are kept as its
// generation's base.
func keepsBase(l *policy.List) bool {
	bytes := len(l.V4)*8 + len(l.V6)*32
	return !l.Inline.IsValid() && len(l.V4)+len(l.V6) >= baseRanges && bytes <= maxBaseBytes
}

// basesDir holds generation n's bases, each under its contents' digest.
func (fw *Firewall) basesDir(h Hook, n int) string {
	return filepath.Join(fw.stateDir(h), "gen-"+strconv.Itoa(n)+".lists")
}

// keepBases puts g's bases into its lists directory: linked from old's
// (nil: none) when it has them, else written from the lists g.bases holds.
// A base that cannot be kept is dropped from the record, and a change to
// its list then compiles.
func (fw *Firewall) keepBases(h Hook, old, g *generation) {
	for name, info := range g.Lists {
		if info.Base == "" {
			continue
		}
		path := filepath.Join(fw.basesDir(h, g.N), info.Base)
		err := os.MkdirAll(filepath.Dir(path), 0o700)
		if err == nil && old != nil {
			err = os.Link(filepath.Join(fw.basesDir(h, old.N), info.Base), path)
			if err == nil || errors.Is(err, fs.ErrExist) {
				continue
			}
			err = nil
		}
		if l := g.bases[name]; err == nil && l != nil {
			err = writeFile(path, encodeBase(l))
		} else if err == nil {
			err = errors.New("no contents to keep")
		}
		if err != nil {
			info.Base = ""
			g.Lists[name] = info
		}
	}
}

// encodeBase is a base's file: the counts of IPv4 and IPv6 ranges, the
// ranges, and their digest.
func encodeBase(l *policy.List) []byte {
	b := make([]byte, 0, 24+len(l.V4)*8+len(l.V6)*32)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(l.V4)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(l.V6)))
	b = append(b, compile.AsBytes(l.V4)...)
	b = append(b, compile.AsBytes(l.V6)...)
	return binary.LittleEndian.AppendUint64(b, baseSum(l))
}

// readBase reads a base kept by generation n, checking its digest.
func (fw *Firewall) readBase(h Hook, n int, name, digest string) (*policy.List, error) {
	path := filepath.Join(fw.basesDir(h, n), digest)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	bad := fmt.Errorf("%s: not a list's base", path)
	if len(b) < 24 {
		return nil, bad
	}
	n4, n6 := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	if n4 > uint64(len(b))/8 || n6 > uint64(len(b))/32 || uint64(len(b)) != 24+n4*8+n6*32 {
		return nil, bad
	}
	l := &policy.List{Name: name, V4: make([]policy.Range4, n4), V6: make([]policy.Range6, n6)}
	rest := b[16:]
	rest = rest[copy(compile.AsBytes(l.V4), rest):]
	rest = rest[copy(compile.AsBytes(l.V6), rest):]
	if contentDigest(l) != digest || binary.LittleEndian.Uint64(rest) != baseSum(l) {
		return nil, bad
	}
	return l, nil
}

// overLists makes the generation that carries pol's change over the live
// generation of hooks (shape, opened from the first hook's pins; olds
// their records), when it is a change of lists' contents alone that the
// overlay can take; ok is false otherwise, and nothing is made. ops are
// the live changes.
func (fw *Firewall) overLists(pol *policy.Policy, hooks []Hook, olds []*generation, shape *datapath.Objects, ops []policy.ListOp, fold func(list string) bool) (objs *datapath.Objects, meta generation, ok bool, err error) {
	if shape == nil || len(olds) == 0 {
		return nil, meta, false, nil
	}
	g := olds[0]
	for _, o := range olds {
		if o == nil || o.Skeleton == "" || !sameTables(o, g) {
			return nil, meta, false, nil
		}
	}
	switch {
	case fold != nil && !g.foldsAll(ops, fold):
		return nil, meta, false, nil // changes to fold: the tables are to be compiled
	case fold == nil && slices.ContainsFunc(ops, g.folded):
		return nil, meta, false, nil // an apply that does not fold takes folded changes out of the tables
	}
	if g.Skeleton != skeleton(pol) {
		return nil, meta, false, nil
	}
	var fileOps []policy.ListOp
	for name, info := range g.Lists {
		l := pol.Lists[name]
		if l == nil || contentDigest(l) == info.Digest {
			continue
		}
		if info.Base == "" || info.Bit == 0 {
			return nil, meta, false, nil // no base, or a static list: the overlay cannot change it
		}
		base, err := fw.readBase(hooks[0], g.N, name, info.Base)
		if err != nil {
			return nil, meta, false, nil
		}
		diff, fits := policy.DiffList(base, l, maxFileOps-len(fileOps))
		if !fits {
			return nil, meta, false, nil
		}
		if len(g.sharing(name)) > 0 && slices.ContainsFunc(diff, func(op policy.ListOp) bool { return !op.Add }) {
			return nil, meta, false, nil // a removal would clear the other lists' bit too
		}
		fileOps = append(fileOps, diff...)
	}
	meta = *g
	meta.Lists = maps.Clone(g.Lists)
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
	objs, err = datapath.OverLists(shape, v4, v6)
	if errors.Is(err, datapath.ErrOtherBuild) {
		return nil, meta, false, nil
	}
	return objs, meta, err == nil, err
}

// foldsAll reports whether the generation's tables hold every change an
// apply folding the lists fold names would take, and still hold every
// change they took (none was reverted since): a fold would compile the
// tables the generation has.
func (g *generation) foldsAll(ops []policy.ListOp, fold func(list string) bool) bool {
	held := map[string]int{}
	for _, op := range ops {
		switch {
		case g.folded(op):
			held[op.List]++
		case fold(op.List) && op.Expires.IsZero():
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
