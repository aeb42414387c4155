package policy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
)

// utf8BOM is the byte order mark some editors start a text file with.
var utf8BOM = []byte("\xef\xbb\xbf")

// openRegular opens a file to read, refusing what is not a regular file: a
// FIFO would hang the reader, a device (/dev/zero) never end.
func openRegular(path string) (*os.File, os.FileInfo, error) {
	// O_NONBLOCK: opening a FIFO without a writer does not wait for one.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("not a regular file (%s): give a file", fileKind(st.Mode()))
	}
	return f, st, nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeSocket != 0:
		return "a socket"
	}
	return m.Type().String()
}

// readRegular reads a whole regular file, interruptibly.
func readRegular(path string, ctx context.Context) ([]byte, error) {
	f, _, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if ctx != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return io.ReadAll(f)
}

// One line of every format is one entry, optionally followed by a comment:
//
//	203.0.113.7                  plain address (a host prefix)
//	198.51.100.0/24              CIDR prefix, host bits cleared (FireHOL .netset)
//	192.0.2.0/24 ; SBL123456     Spamhaus DROP/EDROP: ';' starts a comment
//	192.0.2.10-192.0.2.99        inclusive range, either family
//	2001:db8::/32, 2001:DB8:0:0:0:0:0:1   IPv6 in any RFC 4291/5952 form
//	::ffff:198.51.100.7, ::ffff:198.51.100.0/120   IPv4-mapped: the IPv4 address or prefix
//
// '#' and ';' start comments; blank lines are ignored.

// readFile reads one list file into b. family 4 or 6 refuses entries of the
// other family. A big file is parsed in sections, one per CPU, each into a
// builder of its own; errors and skipped lines are reported with the line
// numbers of the whole file.
func (b *listBuilder) readFile(path string, family int, opt Options) error {
	f, st, err := openRegular(path)
	if err != nil {
		return fmt.Errorf("list file %s: %w", path, err)
	}
	defer f.Close()
	size := st.Size()
	if size == 0 {
		return &Error{File: path, Msg: "file is empty (0 bytes); an empty list file is usually a failed download (for an intentionally empty list, write prefixes: [])"}
	}
	bounds, err := sections(f, size, min(runtime.GOMAXPROCS(0), int(size/(4<<20))+1))
	if err != nil {
		return fmt.Errorf("list file %s: %w", path, err)
	}
	parts := make([]sectionResult, len(bounds)-1)
	var read atomic.Int64
	var wg sync.WaitGroup
	for i := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			progress := func(n int64) {
				total := read.Add(n)
				if i == 0 && opt.Progress != nil {
					opt.Progress(path, total, size)
				}
			}
			parts[i] = parseSection(io.NewSectionReader(f, bounds[i], bounds[i+1]-bounds[i]), i == 0, family, opt, progress)
		}()
	}
	wg.Wait()
	lines := 0 // lines before the section
	before := b.entries
	n4, n6 := len(b.v4), len(b.v6)
	for _, p := range parts {
		n4, n6 = n4+len(p.b.v4), n6+len(p.b.v6)
	}
	b.v4, b.v6 = withRoom(b.v4, n4), withRoom(b.v6, n6)
	for _, p := range parts {
		if p.err != nil {
			var e *Error
			switch {
			case errors.As(p.err, &e):
				e.File, e.Line = path, e.Line+lines
				return e
			case p.interruptedAt > 0:
				return fmt.Errorf("list file %s: interrupted at line %d: %w", path, p.interruptedAt+lines, p.err)
			}
			return fmt.Errorf("list file %s: %w", path, p.err)
		}
		if p.firstSkip != nil && b.firstSkip == "" {
			p.firstSkip.File, p.firstSkip.Line = path, p.firstSkip.Line+lines
			b.firstSkip = p.firstSkip.Error()
		}
		b.v4, b.v6 = append(b.v4, p.b.v4...), append(b.v6, p.b.v6...)
		b.entries += p.b.entries
		b.skipped += p.b.skipped
		lines += p.lines
	}
	if opt.Progress != nil {
		opt.Progress(path, size, size)
	}
	if b.entries == before {
		return &Error{File: path, Msg: "no entries in the file (for an intentionally empty list, write prefixes: [])"}
	}
	return nil
}

// withRoom is s with room for n elements in all. Its new array comes
// from make, which clears only memory the heap used before, in pieces the
// collector can interrupt: slices.Grow clears the whole array at once,
// 8 MB for a million IPv4 ranges, while the collector spins waiting to
// stop the goroutine.
func withRoom[S ~[]E, E any](s S, n int) S {
	if cap(s) >= n {
		return s
	}
	t := make(S, len(s), n)
	copy(t, s)
	return t
}

// sections cuts a file into n parts that end at line ends: the offsets of
// their starts, and the size.
func sections(f io.ReaderAt, size int64, n int) ([]int64, error) {
	bounds := []int64{0}
	buf := make([]byte, 4096)
	for k := 1; k < n; k++ {
		at := max(size*int64(k)/int64(n), bounds[len(bounds)-1])
		for at < size {
			m, err := f.ReadAt(buf, at)
			if i := bytes.IndexByte(buf[:m], '\n'); i >= 0 {
				at += int64(i) + 1
				break
			}
			at += int64(m)
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
		}
		if at < size && at > bounds[len(bounds)-1] {
			bounds = append(bounds, at)
		}
	}
	return append(bounds, size), nil
}

// sectionResult is what parsing one section gave: its entries, its line
// count, and errors with line numbers counted from the section's start.
type sectionResult struct {
	b             listBuilder
	lines         int
	err           error
	interruptedAt int // the line where the context's end was seen
	firstSkip     *Error
}

// parseSection parses whole lines; first is the file's first section.
func parseSection(sr *io.SectionReader, first bool, family int, opt Options, progress func(int64)) (res sectionResult) {
	r := bufio.NewReaderSize(sr, 1<<20)
	// Room for the entries the section's first lines promise: growing the
	// slices would copy them, and touch fresh pages, several times over.
	if head, _ := r.Peek(64 << 10); len(head) > 0 {
		if n := bytes.Count(head, []byte{'\n'}); n > 0 {
			est := int(sr.Size() * int64(n) / int64(len(head)) * 9 / 8)
			if bytes.IndexByte(head, ':') >= 0 {
				res.b.v6 = make([]Range6, 0, est)
			} else {
				res.b.v4 = make([]Range4, 0, est)
			}
		}
	}
	var pending int64
	for line := 1; ; line++ {
		text, err := r.ReadSlice('\n')
		pending += int64(len(text))
		if errors.Is(err, bufio.ErrBufferFull) {
			res.err = &Error{Line: line, Msg: "line longer than 1 MiB: this is not a list file"}
			return res
		}
		if first && line == 1 {
			text = bytes.TrimPrefix(text, utf8BOM)
		}
		if len(text) > 0 {
			res.lines = line
		}
		switch {
		case len(text) == 0 || res.b.plainLine(text, family):
		case bytes.IndexByte(text, 0) >= 0:
			res.err = &Error{Line: line, Msg: "binary data (a NUL byte): this is not a text list file"}
			return res
		default:
			if perr := res.b.parseLine(text, family); perr != nil {
				if !opt.Lenient {
					res.err = &Error{Line: line, Msg: perr.Error() + " (--lenient skips bad lines)"}
					return res
				}
				res.b.skipped++
				if res.firstSkip == nil {
					res.firstSkip = &Error{Line: line, Msg: perr.Error()}
				}
			}
		}
		if line&(1<<16-1) == 0 {
			if opt.Context != nil && opt.Context.Err() != nil {
				res.err, res.interruptedAt = opt.Context.Err(), line
				return res
			}
			progress(pending)
			pending = 0
		}
		if err == io.EOF {
			progress(pending)
			return res
		}
		if err != nil {
			res.err = err
			return res
		}
	}
}

// parseLine adds the entry on one line, if any.
func (b *listBuilder) parseLine(line []byte, family int) error {
	for i, c := range line {
		if c == '#' || c == ';' {
			line = line[:i]
			break
		}
	}
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil
	}
	return b.parseEntry(line, family)
}

// plainLine adds a line that is an address or a prefix alone, the lines
// of most published lists, in one pass and without allocating: parseLine's
// passes for comments, spaces and ranges took about as long as reading the
// address. It leaves any other line, and an entry of the family the list
// refuses, to parseLine.
func (b *listBuilder) plainLine(line []byte, family int) bool {
	line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
	if family != 6 {
		if a, bits, ok := parseV4(line); ok {
			b.addV4(a, bits)
			return true
		}
	}
	if family != 4 {
		if a, bits, ok := parseV6(line); ok {
			b.addV6(a, bits)
			return true
		}
	}
	return false
}

func (b *listBuilder) addV4(a uint32, bits int) {
	b.entries++
	mask := uint32(uint64(1)<<(32-bits) - 1)
	b.v4 = append(b.v4, Range4{a &^ mask, a | mask})
}

func (b *listBuilder) addV6(a U128, bits int) {
	b.entries++
	host := LowMask(128 - bits)
	b.v6 = append(b.v6, Range6{U128{a.Hi &^ host.Hi, a.Lo &^ host.Lo}, a.Or(host)})
}

// parseEntry adds one address, prefix or range.
func (b *listBuilder) parseEntry(s []byte, family int) error {
	if b.plainLine(s, family) {
		return nil
	}
	if lo, hi, ok := bytes.Cut(s, []byte("-")); ok {
		return b.parseRange(bytes.TrimSpace(lo), bytes.TrimSpace(hi), family)
	}
	p, err := ParsePrefix(string(s))
	if err != nil {
		return err
	}
	if err := checkFamily(p.Addr(), s, family); err != nil {
		return err
	}
	b.addPrefix(p)
	return nil
}

func checkFamily(a netip.Addr, s []byte, family int) error {
	if family == 4 && !a.Is4() {
		return fmt.Errorf("IPv6 entry %q in an IPv4-only list", s)
	}
	if family == 6 && a.Is4() {
		return fmt.Errorf("IPv4 entry %q in an IPv6-only list", s)
	}
	return nil
}

func (b *listBuilder) parseRange(los, his []byte, family int) error {
	lo, err1 := netip.ParseAddr(string(los))
	hi, err2 := netip.ParseAddr(string(his))
	if err1 != nil || err2 != nil || lo.Zone() != "" || hi.Zone() != "" {
		return fmt.Errorf("bad range %q: expected two addresses, first-last", string(los)+"-"+string(his))
	}
	lo, hi = lo.Unmap(), hi.Unmap() // IPv4-mapped ends name IPv4 addresses
	if lo.Is4() != hi.Is4() {
		return fmt.Errorf("range %s-%s mixes IPv4 and IPv6", lo, hi)
	}
	if hi.Less(lo) {
		return fmt.Errorf("range %s-%s: start is above end", lo, hi)
	}
	if err := checkFamily(lo, los, family); err != nil {
		return err
	}
	b.entries++
	if lo.Is4() {
		b.v4 = append(b.v4, Range4{V4ToUint(lo), V4ToUint(hi)})
	} else {
		b.v6 = append(b.v6, Range6{U128Of(lo), U128Of(hi)})
	}
	return nil
}

// RangePrefixes splits an inclusive address range into the fewest prefixes
// that cover exactly it.
func RangePrefixes(lo, hi netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	if lo.Is4() {
		Cover(U128{0, uint64(V4ToUint(lo))}, U128{0, uint64(V4ToUint(hi))}, 32, func(first U128, length int) {
			out = append(out, netip.PrefixFrom(UintToV4(uint32(first.Lo)), length))
		})
		return out
	}
	Cover(U128Of(lo), U128Of(hi), 128, func(first U128, length int) {
		out = append(out, netip.PrefixFrom(first.Addr(), length))
	})
	return out
}

// hexDigit is each byte's value as a hex digit, notHex for the others: a
// load instead of three range tests, whose branches a random address's
// mix of digits and letters mispredicts.
var hexDigit = func() (t [256]uint8) {
	for c := range t {
		switch {
		case c >= '0' && c <= '9':
			t[c] = uint8(c - '0')
		case c >= 'a' && c <= 'f':
			t[c] = uint8(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			t[c] = uint8(c - 'A' + 10)
		default:
			t[c] = notHex
		}
	}
	return t
}()

const notHex = 0xff

// parseV6 parses the plain IPv6 forms (hex groups, at most one "::", an
// optional length) without allocating; anything else (a dotted IPv4 tail, a
// zone, IPv4-mapped addresses, which are IPv4) is left to netip.
func parseV6(s []byte) (addr U128, bits int, ok bool) {
	var g [8]uint16
	n, gap := 0, -1 // groups seen; where "::" stands
	i := 0
	if len(s) >= 2 && s[0] == ':' && s[1] == ':' {
		gap, i = 0, 2
	}
	for i < len(s) && s[i] != '/' {
		if n == 8 {
			return addr, 0, false
		}
		v, d := 0, 0
		for ; i < len(s) && d < 5; i, d = i+1, d+1 {
			x := hexDigit[s[i]]
			if x == notHex {
				break
			}
			v = v<<4 | int(x)
		}
		if d == 0 || d > 4 {
			return addr, 0, false
		}
		g[n] = uint16(v)
		n++
		if i == len(s) || s[i] == '/' {
			break
		}
		if s[i] != ':' {
			return addr, 0, false
		}
		i++
		if i < len(s) && s[i] == ':' {
			if gap >= 0 {
				return addr, 0, false
			}
			gap = n
			i++
			if i == len(s) || s[i] == '/' {
				break
			}
		} else if i == len(s) || s[i] == '/' {
			return addr, 0, false // a trailing single ':'
		}
	}
	switch {
	case gap < 0 && n != 8, gap >= 0 && n > 7:
		return addr, 0, false
	case gap >= 0:
		copy(g[8-(n-gap):], g[gap:n])
		clear(g[gap : 8-(n-gap)])
	}
	for k := 0; k < 4; k++ {
		addr.Hi = addr.Hi<<16 | uint64(g[k])
		addr.Lo = addr.Lo<<16 | uint64(g[k+4])
	}
	if addr.Hi == 0 && addr.Lo>>32 == 0xffff {
		return addr, 0, false // IPv4-mapped: netip's path unmaps it
	}
	bits = 128
	if i < len(s) {
		l := s[i+1:]
		if len(l) == 0 || len(l) > 3 || (l[0] == '0' && len(l) > 1) {
			return addr, 0, false
		}
		bits = 0
		for _, c := range l {
			if c < '0' || c > '9' {
				return addr, 0, false
			}
			bits = bits*10 + int(c-'0')
		}
		if bits > 128 {
			return addr, 0, false
		}
	}
	return addr, bits, true
}

// parseV4 reads "a.b.c.d" or "a.b.c.d/n" with the same rules as netip (no
// leading zeros) without allocating; anything else is left to netip.
func parseV4(s []byte) (addr uint32, bits int, ok bool) {
	bits = 32
	i := 0
	for part := 0; part < 4; part++ {
		if part > 0 {
			if i >= len(s) || s[i] != '.' {
				return 0, 0, false
			}
			i++
		}
		v, n := 0, 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if n > 0 && v == 0 {
				return 0, 0, false // leading zero
			}
			v = v*10 + int(s[i]-'0')
			i++
			n++
			if v > 255 {
				return 0, 0, false
			}
		}
		if n == 0 {
			return 0, 0, false
		}
		addr = addr<<8 | uint32(v)
	}
	if i == len(s) {
		return addr, bits, true
	}
	if s[i] != '/' || i+1 == len(s) || len(s)-i-1 > 2 {
		return 0, 0, false
	}
	bits = 0
	for _, c := range s[i+1:] {
		if c < '0' || c > '9' {
			return 0, 0, false
		}
		bits = bits*10 + int(c-'0')
	}
	if bits > 32 || (s[i+1] == '0' && len(s)-i-1 > 1) {
		return 0, 0, false
	}
	return addr, bits, true
}

// ParseEntry reads one list entry given on a command line: an address, a
// prefix or a range, as the prefixes that cover it.
func ParseEntry(s string) ([]netip.Prefix, error) {
	var b listBuilder
	if err := b.parseEntry([]byte(s), 0); err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, r := range b.v4 {
		out = append(out, RangePrefixes(UintToV4(r.Lo), UintToV4(r.Hi))...)
	}
	for _, r := range b.v6 {
		out = append(out, RangePrefixes(r.Lo.Addr(), r.Hi.Addr())...)
	}
	return out, nil
}
