package engine

import (
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// CheckReport is what a policy compiles to, as `rampart check` shows it.
type CheckReport struct {
	Rules         int            `json:"rules"`
	Lists         []ListReport   `json:"lists"`
	ListBits      int            `json:"list_bits"`    // of the membership mask's policy.MaxLists
	BitsShared    bool           `json:"bits_shared"`  // lists the same rules name share a bit (policy.ListUse)
	StaticLists   int            `json:"static_lists"` // lists past the ways that take bits: no in-place changes
	Entries       int            `json:"entries"`
	SkippedLines  int            `json:"skipped_lines"`
	V4SplitBlocks int            `json:"v4_split_blocks"`
	V6Prefixes    int            `json:"v6_prefixes"`
	TableBytes    uint64         `json:"table_bytes"`
	Default       string         `json:"default"`
	Unparsed      string         `json:"unparsed"`
	PolicyHash    string         `json:"policy_hash"`
	Warnings      []policy.Error `json:"warnings"`
}

// ListReport is one list of a checked policy: the entries read and what
// they cover once merged.
type ListReport struct {
	Name        string  `json:"name"`
	Entries     int     `json:"entries"`
	Skipped     int     `json:"skipped_lines"`
	V4Ranges    int     `json:"ipv4_ranges"`
	V4Addresses uint64  `json:"ipv4_addresses"`
	V6Ranges    int     `json:"ipv6_ranges"`
	V6Addresses float64 `json:"ipv6_addresses"`
}

// Check compiles a policy as Apply would and refuses what Apply would refuse
// before touching the host (tables over the memory there is or over
// maxTableBytes, the operator's cap as in Options), without changing
// anything on the host. It reports the lists first, then frees their
// ranges as it compiles (compile.BuildReleasingRanges): its caller is
// done with them.
func Check(pol *policy.Policy, maxTableBytes uint64) (*CheckReport, error) {
	lists := []ListReport{}
	entries, skipped := 0, 0
	for _, name := range pol.ListNames() {
		l := pol.Lists[name]
		if l.Inline.IsValid() { // a rule's prefix, no list
			continue
		}
		entries += l.Entries
		skipped += l.Skipped
		v4, v6 := l.Addresses()
		lists = append(lists, ListReport{Name: name, Entries: l.Entries, Skipped: l.Skipped,
			V4Ranges: len(l.V4), V4Addresses: v4, V6Ranges: len(l.V6), V6Addresses: v6})
	}
	img := compile.BuildReleasingRanges(pol)
	if err := datapath.CheckCap(img.KernelBytes(), maxTableBytes); err != nil {
		return nil, err
	}
	if err := datapath.CheckMemory(img.KernelBytes()); err != nil {
		return nil, err
	}
	t := &img.Tables
	r := &CheckReport{Rules: len(pol.Rules), V4SplitBlocks: t.V4DenseBlocks() + len(t.V4Tbl8s), V6Prefixes: t.V6Prefixes(),
		TableBytes: img.KernelBytes(), Default: pol.Default.String(), Unparsed: pol.Unparsed.String(), PolicyHash: img.Hash(),
		Warnings: pol.Warnings, Lists: lists, Entries: entries, SkippedLines: skipped}
	bits := map[uint64]bool{}
	for _, b := range img.Lists {
		if b != 0 {
			bits[b] = true
		} else {
			r.StaticLists++
		}
	}
	r.ListBits, r.BitsShared = len(bits), len(bits) < len(img.Lists)-r.StaticLists
	if r.Warnings == nil {
		r.Warnings = []policy.Error{}
	}
	return r, nil
}
