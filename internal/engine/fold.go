package engine

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Folding: an apply that asks for it (ApplyRequest.Fold, which the daemon
// sets) compiles the live changes of the lists it names into their tables,
// so that they cost a frame what the files' entries cost, instead of the
// overlay's probes. The generation records what it took: the changes of
// those lists, without a TTL, up to a sequence number. Its overlay holds the
// rest: the changes after that, the ones with a TTL (they expire by
// themselves, which a table cannot), and each folded change that overlaps
// one of those and may be the later (the overlay's answer must be the
// latest change covering an address). A folded change that is reverted
// cannot be undone in the overlay: the tables are owed a rebuild
// (FoldOwed), and until then the change holds, never the other way.

// folds reports whether the generation's apply folds changes like op: of
// a list it folds, without a TTL.
func (g *generation) folds(op policy.ListOp) bool {
	_, ok := g.Folded[op.List]
	return ok && op.Expires.IsZero()
}

// folded reports whether the generation compiled op into its tables.
func (g *generation) folded(op policy.ListOp) bool {
	return g.folds(op) && op.Seq <= g.FoldedSeq
}

// foldable reports whether a fold by the generation's apply would take op
// and has not.
func (g *generation) foldable(op policy.ListOp) bool {
	return g.folds(op) && op.Seq > g.FoldedSeq
}

// overlay is what ops make of the generation's overlay: entries under the
// bits its lists have.
func (g *generation) overlay(ops []policy.ListOp) ([]compile.OverlayEntry[abi.LPMKeyV4], []compile.OverlayEntry[abi.LPMKeyV6]) {
	bits := make(map[string]uint64, len(g.Lists))
	for name, info := range g.Lists {
		bits[name] = info.Bit
	}
	return compile.Overlay(bits, ops)
}

// overlayOps are the ops the generation's overlay holds (see above), after
// the changes of its lists' files since its tables were compiled (FileOps),
// which are older than any.
func (g *generation) overlayOps(ops []policy.ListOp) []policy.ListOp {
	if len(g.Folded) == 0 {
		return append(slices.Clip(g.FileOps), ops...)
	}
	held := slices.Clone(g.FileOps)
	folded := map[string][]policy.ListOp{} // by list
	old := map[string][]netip.Prefix{}     // unfolded changes no later than the folded ones
	for _, op := range g.FileOps {
		old[op.List] = append(old[op.List], op.Prefix)
	}
	for _, op := range ops {
		switch {
		case g.folded(op):
			folded[op.List] = append(folded[op.List], op)
		case op.Seq <= g.FoldedSeq:
			old[op.List] = append(old[op.List], op.Prefix)
			fallthrough
		default:
			held = append(held, op)
		}
	}
	// Folded changes overlapping an older one the overlay holds go there
	// too, and so on from those: whatever the order, the overlay then
	// holds every change over the addresses it answers for.
	for list, frontier := range old {
		rest := folded[list]
		for len(frontier) > 0 && len(rest) > 0 {
			hits := overlapping(rest, frontier)
			pulled := make(map[uint64]bool, len(hits))
			frontier = nil
			for _, op := range hits {
				pulled[op.Seq] = true
				frontier = append(frontier, op.Prefix)
			}
			held = append(held, hits...)
			rest = slices.DeleteFunc(rest, func(op policy.ListOp) bool { return pulled[op.Seq] })
		}
	}
	// In the journal's order: the overlay's answer is the latest change.
	slices.SortFunc(held, func(a, b policy.ListOp) int { return cmp.Compare(a.Seq, b.Seq) })
	return held
}

// fold is what an apply compiles into the tables of the lists it folds.
type fold struct {
	seq   uint64         // the last change taken
	count map[string]int // changes taken, by list
}

// foldOps compiles the live changes of the policies' lists that want
// says to fold into those lists, in place of the lists (whose ops are the
// overlay's then); a list the policies share is folded once. It returns
// what it took, nil when want is.
func foldOps(ops []policy.ListOp, pols []*policy.Policy, want func(list string) bool) *fold {
	if want == nil {
		return nil
	}
	f := &fold{count: map[string]int{}}
	for _, pol := range pols {
		for name, l := range pol.Lists {
			if !l.Inline.IsValid() && want(name) {
				f.count[name] = 0
			}
		}
	}
	for _, op := range ops {
		f.seq = max(f.seq, op.Seq)
	}
	g := &generation{FoldedSeq: f.seq, Folded: f.count}
	take := map[string][]policy.ListOp{}
	for _, op := range ops {
		if g.folded(op) {
			take[op.List] = append(take[op.List], op)
			f.count[op.List]++
		}
	}
	held := g.overlayOps(ops)
	done := map[*policy.List]*policy.List{}
	for _, pol := range pols {
		for name, l := range pol.Lists {
			if l.Inline.IsValid() {
				continue
			}
			if _, ok := f.count[name]; !ok {
				continue
			}
			if done[l] == nil {
				folded := l.Fold(take[name])
				for _, op := range held {
					if op.List == name {
						folded.Ops = append(folded.Ops, op)
					}
				}
				done[l] = folded
			}
			pol.Lists[name] = done[l]
		}
	}
	return f
}

// of is the fold of the lists img's rules use (img.Lists), as its
// generation records it.
func (f *fold) of(img *compile.Image) (uint64, map[string]int) {
	if f == nil {
		return 0, nil
	}
	count := map[string]int{}
	for name, n := range f.count {
		if _, ok := img.Lists[name]; ok {
			count[name] = n
		}
	}
	return f.seq, count
}

// FoldOwed reports whether a generation live on some hook holds folded
// changes that were reverted since: its tables are owed a rebuild (an
// apply with Fold).
func (fw *Firewall) FoldOwed() (bool, error) {
	unlock, err := fw.lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	ops, err := fw.liveOps()
	if err != nil {
		return false, err
	}
	hooks, err := fw.hooks()
	if err != nil {
		return false, err
	}
	for _, h := range hooks {
		st, err := fw.state(h)
		if err != nil {
			return false, err
		}
		g, err := fw.readGen(h, fw.newest(h, st))
		if err != nil || g == nil || len(g.Folded) == 0 {
			continue
		}
		held := map[string]int{}
		for _, op := range ops {
			if g.folded(op) {
				held[op.List]++
			}
		}
		for list, n := range g.Folded {
			if held[list] < n {
				return true, nil
			}
		}
	}
	return false, nil
}
