package compile

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

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
	Tables
}

// Tables are the contents of the prefix-list maps (see bpf/lists.h).
type Tables struct {
	V4Present []uint64 // which /24 blocks have an entry; trailing empty words left out
	V4Rank    []uint64 // per word of V4Present, the entries before it
	V4Tbl24   []uint32 // the entries of the blocks present, in block order
	V4Bitmaps []abi.V4Bitmap
	V4Tbl8s   []abi.V4Tbl8
	V4Classes []uint64 // class id -> list mask; class 0 is no list
	V6        []Entry[abi.LPMKeyV6]
	V6Lens    []uint8 // populated IPv6 prefix lengths, longest first
	OverlayV4 []OverlayEntry[abi.LPMKeyV4]
	OverlayV6 []OverlayEntry[abi.LPMKeyV6]
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
func (img *Image) Hash() string {
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, img.Rules)
	binary.Write(h, binary.LittleEndian, []bool{img.NeedSrc, img.NeedDst, img.NeedL4})
	binary.Write(h, binary.LittleEndian, []uint8{img.DefaultAction, img.UnparsedAction, img.MalformedAction})
	t := &img.Tables
	for _, part := range []any{t.V4Present, t.V4Rank, t.V4Tbl24, t.V4Bitmaps, t.V4Tbl8s, t.V4Classes, t.V6, t.V6Lens} {
		binary.Write(h, binary.LittleEndian, part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// KernelBytes estimates the kernel memory the tables take once loaded.
func (t *Tables) KernelBytes() uint64 {
	const hashElem = 64 // htab_elem header + key + value, rounded
	const lpmNode = 64
	chunks := (len(t.V4Tbl24) + abi.V4Chunk - 1) / abi.V4Chunk
	return uint64(len(t.V4Present))*16 + uint64(chunks)*abi.V4Chunk*4 + uint64(len(t.V4Bitmaps))*40 + uint64(len(t.V4Tbl8s))*512 +
		uint64(len(t.V4Classes))*8 + uint64(len(t.V6))*hashElem + uint64(len(t.OverlayV4)+len(t.OverlayV6))*lpmNode
}
