package compile

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/rampart-fw/rampart/internal/abi"
)

// Image is everything one policy puts into the kernel: the read-only rule
// array and configuration, and the contents of the prefix-list maps, in the
// ABI's types. internal/datapath turns it into a program and maps.
type Image struct {
	Rules           []abi.Rule
	DefaultAction   uint8
	UnparsedAction  uint8 // for frames whose verdict hangs on fields they lack
	MalformedAction uint8 // for frames whose L3 header is cut or invalid
	NeedSrc         bool  // some rule matches a source list
	NeedDst         bool
	NeedL4          bool // some rule looks at the protocol, ports or flags
	// Lists gives each list the rules refer to its bit in the masks.
	Lists map[string]uint64
	// Limits are the rate limits; PerSource: some rule
	// limits per source (the source table is needed); Syncookie: some rule
	// answers SYNs (the tc cookie check is needed).
	Limits    []abi.Limit // by policy rule
	PerSource bool
	Syncookie bool
	// Room is the rules a feed may add to the policy (its flowspec
	// section's max_routes): a program is loaded with room for them, so
	// that a feed filling up changes maps, not programs.
	Room int
	Tables
	Classifier
}

// Tables are the contents of the prefix-list maps (see bpf/common.h).
type Tables struct {
	V4Blocks   []abi.V4Bucket // the cuckoo hash of /24 blocks holding anything
	V4BlockMul [2]uint64      // its two hashes' multipliers
	V4Wide     []abi.V4Bucket // the cuckoo hash of /16s wholly in one class
	V4WideMul  [2]uint64
	V4Dense    []abi.V4DenseBucket // the cuckoo hash of dense blocks (two classes in a bitmap)
	V4DenseMul [2]uint64
	V4Tbl8s    []abi.V4Tbl8
	V6Blocks   []abi.V6Bucket // the same, of the top 24 bits of IPv6
	V6BlockMul [2]uint64
	V6Short    []abi.V6ShortBucket // the cuckoo hash of prefixes /25 to /64
	V6ShortMul [2]uint64
	V6Long     []abi.V6LongBucket // of prefixes /65 to /128
	V6LongMul  [2]uint64
	V6HotLen   uint32   // the length most IPv6 prefixes past /24 have (0: none)
	Classes    []uint64 // class id -> list mask; class 0 is no list
	// classPrefix: class id -> the longest inline prefix holding its
	// addresses (0: none); prefixParent: inline prefix id -> the longest
	// other one holding it, as the sweeps meet them. The classifier's,
	// not the kernel's.
	classPrefix, prefixParent []uint32
	// classStatic: class id -> the set of static ways (policy.ListUse)
	// holding its addresses, one of sets.
	classStatic []uint32
	sets        *staticSets
	// releaseRanges: the build drops the lists' ranges once done with
	// them (BuildReleasingRanges).
	releaseRanges bool
	OverlayV4     []OverlayEntry[abi.LPMKeyV4]
	OverlayV6     []OverlayEntry[abi.LPMKeyV6]
}

// Entry is one prefix and the bitmask of the lists holding it.
type Entry[K abi.LPMKeyV4 | abi.LPMKeyV6] struct {
	Key  K
	Mask uint64
}

// OverlayEntry is one prefix of the in-place overlay.
type OverlayEntry[K abi.LPMKeyV4 | abi.LPMKeyV6] struct {
	Key K
	abi.Overlay
}

// Hash identifies the policy an image holds: equal hashes, equal behaviour.
// It names, it does not authenticate: 64 bits of xxHash over the tables,
// which for a list of a million addresses are tens of MB (SHA-256 took
// 105 ms of CPU over them here, xxHash a few).
func (img *Image) Hash() string {
	h := xxhash.New()
	// The rules' bytes as they are in memory: what binary.Write would write
	// on this little-endian layout (no padding), without its reflection,
	// which took 14 ms for 10,000 rules.
	h.Write(AsBytes(img.Rules))
	binary.Write(h, binary.LittleEndian, []bool{img.NeedSrc, img.NeedDst, img.NeedL4})
	binary.Write(h, binary.LittleEndian, []uint8{img.DefaultAction, img.UnparsedAction, img.MalformedAction})
	h.Write(AsBytes(img.Limits))
	if img.RowWords > 0 { // the classes' static lists, which their masks do not say
		rows, sets := AsBytes(img.Tree[img.SetsBase:]), AsBytes(img.ClassEqs)
		binary.Write(h, binary.LittleEndian, []uint64{uint64(img.RowWords), uint64(len(rows)), uint64(len(sets))})
		h.Write(rows)
		h.Write(sets)
	}
	t := &img.Tables
	for _, part := range [][]byte{AsBytes(t.V4Blocks), AsBytes(t.V4BlockMul[:]), AsBytes(t.V4Wide), AsBytes(t.V4WideMul[:]),
		AsBytes(t.V4Dense), AsBytes(t.V4DenseMul[:]), AsBytes(t.V4Tbl8s), AsBytes(t.V6Blocks), AsBytes(t.V6BlockMul[:]), AsBytes(t.V6Short),
		AsBytes(t.V6ShortMul[:]), AsBytes(t.V6Long), AsBytes(t.V6LongMul[:]), AsBytes([]uint32{t.V6HotLen}), AsBytes(t.Classes)} {
		binary.Write(h, binary.LittleEndian, uint64(len(part)))
		h.Write(part)
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// KernelBytes estimates the kernel memory the tables take once loaded.
func (t *Tables) KernelBytes() uint64 {
	const lpmNode = 64
	return uint64(len(t.V4Blocks)+len(t.V4Wide)+len(t.V6Blocks))*64 + uint64(len(t.V4Dense))*128 +
		uint64(len(t.V4Tbl8s))*1024 + uint64(len(t.V6Short)+len(t.V6Long))*64 +
		uint64(len(t.Classes))*8 + uint64(len(t.OverlayV4)+len(t.OverlayV6))*lpmNode
}

// V4DenseBlocks counts the dense blocks the tables hold.
func (t *Tables) V4DenseBlocks() int {
	n := 0
	for _, b := range t.V4Dense {
		for _, s := range b.Slot {
			n += b2i(s.Key != 0)
		}
	}
	return n
}

// V6Prefixes counts the IPv6 prefixes the tables hold after aggregation.
func (t *Tables) V6Prefixes() int {
	n := 0
	for _, b := range t.V6Short {
		for _, s := range b.Slot {
			if s.Len != 0 {
				n++
			}
		}
	}
	for _, b := range t.V6Long {
		for _, s := range b.Slot {
			if s.Len != 0 {
				n++
			}
		}
	}
	return n
}

// AsBytes is a table's memory: the ABI's types are laid out as the kernel's
// maps hold them (structs.HostLayout), so this is what the maps are filled
// with and what an image's hash covers. Reflection (encoding/binary) takes
// a quarter of a second for a million-entry table; this takes none.
func AsBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// KernelBytes estimates the kernel memory of the image's maps.
func (img *Image) KernelBytes() uint64 {
	return img.Tables.KernelBytes() + img.Classifier.KernelBytes() + uint64(len(img.Rules))*uint64(unsafe.Sizeof(abi.Rule{}))
}
