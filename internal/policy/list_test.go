package policy

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func readList(t *testing.T, family int, opt Options, files ...string) (*List, error) {
	t.Helper()
	var b listBuilder
	for _, f := range files {
		if err := b.readFile(f, family, opt); err != nil {
			return nil, err
		}
	}
	return b.build("l", family), nil
}

func writeList(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "list.txt")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestListFormats(t *testing.T) {
	for _, c := range []struct {
		file    string
		entries int
		in, out []string
	}{
		{"testdata/firehol.netset", 5, []string{"0.1.2.3", "1.10.31.255", "5.188.10.179", "223.254.9.9"}, []string{"1.10.32.0", "5.188.10.178", "1.20.0.0"}},
		{"testdata/spamhaus-drop.txt", 3, []string{"1.10.16.1", "2.57.122.255"}, []string{"2.57.123.0", "1.10.15.255"}},
		{"testdata/spamhaus-dropv6.txt", 2, []string{"2001:678:738:ffff::1", "2a06:5287:ffff::"}, []string{"2a06:5288::", "2001:678:739::"}},
		{"testdata/ranges.txt", 3, []string{"192.0.2.10", "192.0.2.20", "198.51.100.128", "2001:db8::1", "2001:db8::ff", "2001:db8::80"}, []string{"192.0.2.9", "192.0.2.21", "2001:db8::", "2001:db8::100"}},
	} {
		t.Run(filepath.Base(c.file), func(t *testing.T) {
			l, err := readList(t, 0, Options{}, c.file)
			if err != nil {
				t.Fatal(err)
			}
			if l.Entries != c.entries {
				t.Errorf("%d entries, want %d", l.Entries, c.entries)
			}
			for _, a := range c.in {
				if !l.Contains(netip.MustParseAddr(a)) {
					t.Errorf("%s not in the list", a)
				}
			}
			for _, a := range c.out {
				if l.Contains(netip.MustParseAddr(a)) {
					t.Errorf("%s in the list", a)
				}
			}
		})
	}
}

func TestIPv6Forms(t *testing.T) {
	p := writeList(t, "2001:DB8:0:0:0:0:0:1\n2001:db8::2/128\n::ffff:0:0/95\n2001:0db8:0000:0000:0000:0000:0000:0003\n2001:db8:1::/48 # comment\n\t  2001:db8::4  \r\n")
	l, err := readList(t, 6, Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"2001:db8::1", "2001:db8::2", "::fffe:0:1", "2001:db8::3", "2001:db8:1:ffff::", "2001:db8::4"} {
		if !l.Contains(netip.MustParseAddr(a)) {
			t.Errorf("%s not in the list", a)
		}
	}
	// Six entries; 2001:db8::1 to ::4 are adjacent and merge into one range.
	if len(l.V4) != 0 || len(l.V6) != 3 || l.Entries != 6 {
		t.Errorf("v4 %v v6 %v entries %d", l.V4, l.V6, l.Entries)
	}
}

// IPv4-mapped entries name IPv4 addresses: IPv4 traffic never carries an
// IPv6 header, so kept as IPv6 they would never match.
func TestIPv4MappedEntries(t *testing.T) {
	p := writeList(t, "::ffff:198.18.0.5\n::ffff:198.51.100.0/120\n::ffff:203.0.113.10-::ffff:203.0.113.20\n::FFFF:C000:0201\n")
	l, err := readList(t, 4, Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"198.18.0.5", "198.51.100.255", "203.0.113.10", "203.0.113.20", "192.0.2.1"} {
		if !l.Contains(netip.MustParseAddr(a)) {
			t.Errorf("%s not in the list", a)
		}
	}
	for _, a := range []string{"198.18.0.6", "203.0.113.21", "::ffff:198.18.0.5"} {
		if l.Contains(netip.MustParseAddr(a)) {
			t.Errorf("%s in the list", a)
		}
	}
	if len(l.V6) != 0 {
		t.Errorf("IPv6 entries %v", l.V6)
	}
	_, err = readList(t, 6, Options{}, writeList(t, "2001:db8::1\n::ffff:198.18.0.5\n"))
	if err == nil || !strings.Contains(err.Error(), `list.txt:2: IPv4 entry "::ffff:198.18.0.5" in an IPv6-only list`) {
		t.Errorf("mapped entry in an IPv6-only list: %v", err)
	}
	if got, err := ParseEntry("::ffff:198.18.0.0/120"); err != nil || len(got) != 1 || got[0] != netip.MustParsePrefix("198.18.0.0/24") {
		t.Errorf("ParseEntry: %v %v", got, err)
	}
}

func TestListErrors(t *testing.T) {
	for _, c := range []struct {
		name, content string
		family        int
		want          string
	}{
		{"malformed", "192.0.2.1\nnot-an-address\n", 0, "list.txt:2: bad range"},
		{"garbage", "192.0.2.1\n\n# c\nhello\n", 0, `list.txt:4: bad address "hello"`},
		{"ipv6 in ipv4-only", "192.0.2.1\n2001:db8::1\n", 4, `list.txt:2: IPv6 entry "2001:db8::1" in an IPv4-only list`},
		{"ipv4 in ipv6-only", "2001:db8::1\n192.0.2.1\n", 6, `list.txt:2: IPv4 entry "192.0.2.1" in an IPv6-only list`},
		{"/33", "192.0.2.0/33\n", 0, `list.txt:1: bad prefix "192.0.2.0/33"`},
		{"/129", "2001:db8::/129\n", 0, `list.txt:1: bad prefix "2001:db8::/129"`},
		{"range backwards", "192.0.2.9-192.0.2.1\n", 0, "list.txt:1: range 192.0.2.9-192.0.2.1: start is above end"},
		{"range mixed", "192.0.2.1-2001:db8::1\n", 0, "list.txt:1: range 192.0.2.1-2001:db8::1 mixes IPv4 and IPv6"},
		{"empty file", "", 0, "list.txt: file is empty (0 bytes)"},
		{"only comments", "# nothing\n; here\n\n", 0, "list.txt: no entries"},
		{"binary", "192.0.2.1\n\x7fELF\x02\x01\x01\x00\x00\x00\n", 0, "list.txt:2: binary data"},
		{"leading zeros", "192.0.02.1\n", 0, `list.txt:1: bad address "192.0.02.1"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := readList(t, c.family, Options{}, writeList(t, c.content))
			var le *Error
			if err == nil || !errors.As(err, &le) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

func TestLenient(t *testing.T) {
	p := writeList(t, "192.0.2.1\nbogus\n192.0.2.3/33\n2001:db8::1\n198.51.100.0/24\n")
	if _, err := readList(t, 4, Options{}, p); err == nil || !strings.Contains(err.Error(), "--lenient") {
		t.Fatalf("strict read: %v", err)
	}
	l, err := readList(t, 4, Options{Lenient: true}, p)
	if err != nil {
		t.Fatal(err)
	}
	if l.Skipped != 3 || l.Entries != 2 || !strings.Contains(l.FirstSkipped, "list.txt:2:") {
		t.Errorf("skipped %d (first %q), entries %d", l.Skipped, l.FirstSkipped, l.Entries)
	}
	// Binary data is never skipped: the file is not a list at all.
	if _, err := readList(t, 0, Options{Lenient: true}, writeList(t, "1.2.3.4\n\x00\x00\n")); err == nil {
		t.Error("lenient read of a binary file succeeded")
	}
}

func TestProgress(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 600_000; i++ {
		b.WriteString("10.0.0.1\n")
	}
	p := writeList(t, b.String())
	var calls int
	var last, total int64
	_, err := readList(t, 0, Options{Progress: func(_ string, read, size int64) { calls++; last, total = read, size }}, p)
	if err != nil {
		t.Fatal(err)
	}
	if calls < 3 || last != total || total != int64(b.Len()) {
		t.Errorf("progress: %d calls, last %d of %d", calls, last, total)
	}
}

// TestMergeRanges checks sorting (radix and comparison) and merging against
// a bitmap of a small address space.
func TestMergeRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{10, 1000, 200_000} {
		const space = 1 << 20
		var rs []Range4
		in := make([]bool, space+1)
		for i := 0; i < n; i++ {
			lo := rng.Uint32N(space)
			hi := min(lo+rng.Uint32N(64), space-1)
			if rng.IntN(50) == 0 {
				hi = min(lo+rng.Uint32N(1<<14), space-1)
			}
			rs = append(rs, Range4{lo, hi})
			for a := lo; a <= hi; a++ {
				in[a] = true
			}
		}
		m := MergeRanges4(rs)
		if !slices.IsSortedFunc(m, func(a, b Range4) int { return int(a.Lo) - int(b.Lo) }) {
			t.Fatalf("n=%d: not sorted", n)
		}
		for i := 1; i < len(m); i++ {
			if m[i].Lo <= m[i-1].Hi+1 {
				t.Fatalf("n=%d: ranges %v and %v overlap or touch", n, m[i-1], m[i])
			}
		}
		l := &List{V4: m}
		for a := uint32(0); a < space; a += 1 + rng.Uint32N(7) {
			if got := l.baseContains(UintToV4(a)); got != in[a] {
				t.Fatalf("n=%d: %d: merged %v, want %v", n, a, got, in[a])
			}
		}
	}
}

func TestRangePrefixes(t *testing.T) {
	for _, c := range []struct{ lo, hi, want string }{
		{"192.0.2.0", "192.0.2.255", "192.0.2.0/24"},
		{"192.0.2.1", "192.0.2.6", "192.0.2.1/32 192.0.2.2/31 192.0.2.4/31 192.0.2.6/32"},
		{"0.0.0.0", "255.255.255.255", "0.0.0.0/0"},
		{"2001:db8::", "2001:db8::1:0", "2001:db8::/112 2001:db8::1:0/128"},
	} {
		var got []string
		for _, p := range RangePrefixes(netip.MustParseAddr(c.lo), netip.MustParseAddr(c.hi)) {
			got = append(got, p.String())
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s-%s: %v, want %s", c.lo, c.hi, got, c.want)
		}
	}
}

// fuzzList reads data as a list file and checks what any reader of any
// format must hold: no panic, and when it reads, every entry it accepted is
// in the list, the IPv4 ranges are sorted and disjoint, and the list is
// exactly its lines read one by one through netip.
func fuzzList(t *testing.T, data []byte) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, lenient := range []bool{false, true} {
		l, err := readList(t, 0, Options{Lenient: lenient}, p)
		if err != nil {
			var le *Error
			if !errors.As(err, &le) || le.File != p {
				t.Fatalf("error without file and line: %v", err)
			}
			continue
		}
		for i := 1; i < len(l.V4); i++ {
			if l.V4[i].Lo <= l.V4[i-1].Hi {
				t.Fatalf("ranges out of order: %v", l.V4)
			}
		}
		for i := 1; i < len(l.V6); i++ {
			if l.V6[i].Lo.Cmp(l.V6[i-1].Hi.Add1()) <= 0 {
				t.Fatalf("IPv6 ranges out of order or not merged: %v", l.V6)
			}
		}
		// The reference reads a line without a range through netip
		// (ParsePrefix), not through the fast path it checks.
		var all listBuilder
		for _, line := range strings.Split(string(bytes.TrimPrefix(data, utf8BOM)), "\n") {
			entry, _, _ := strings.Cut(line, "#")
			entry, _, _ = strings.Cut(entry, ";")
			if strings.Contains(entry, "-") || strings.TrimSpace(entry) == "" {
				all.parseLine([]byte(line), 0)
			} else if p, err := ParsePrefix(entry); err == nil {
				all.addPrefix(p)
			}
		}
		if want := all.build("", 0); !slices.Equal(l.V4, want.V4) || !slices.Equal(l.V6, want.V6) {
			t.Fatalf("the file read %v %v, its lines one by one %v %v", l.V4, l.V6, want.V4, want.V6)
		}
		for _, line := range strings.Split(string(data), "\n") {
			var one listBuilder
			if one.parseLine([]byte(line), 0) != nil {
				continue
			}
			for _, r := range one.v4 {
				if !l.Contains(UintToV4(r.Lo)) || !l.Contains(UintToV4(r.Hi)) {
					t.Fatalf("line %q: %v not in the list", line, r)
				}
			}
			for _, r := range one.v6 {
				if !l.Contains(r.Lo.Addr()) || !l.Contains(r.Hi.Addr()) {
					t.Fatalf("line %q: %v not in the list", line, r)
				}
			}
		}
	}
}

func FuzzPlainList(f *testing.F) {
	f.Add([]byte("192.0.2.1\n198.51.100.0/24\n2001:db8::/32\n"))
	f.Add([]byte("10.0.0.0/8\n\n10.1.0.0/16\r\n"))
	f.Fuzz(fuzzList)
}

func FuzzNetset(f *testing.F) {
	b, _ := os.ReadFile("testdata/firehol.netset")
	f.Add(b)
	f.Add([]byte("# header\n#\n0.0.0.0/8\n5.188.10.179\n"))
	f.Fuzz(fuzzList)
}

func FuzzSpamhaus(f *testing.F) {
	for _, n := range []string{"testdata/spamhaus-drop.txt", "testdata/spamhaus-dropv6.txt"} {
		b, _ := os.ReadFile(n)
		f.Add(b)
	}
	f.Fuzz(fuzzList)
}

func FuzzRanges(f *testing.F) {
	b, _ := os.ReadFile("testdata/ranges.txt")
	f.Add(b)
	f.Add([]byte("0.0.0.0-255.255.255.255\n::-ffff::\n"))
	f.Fuzz(fuzzList)
}

// netipPrefix is what netip reads in a list entry without a range.
func netipPrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen()), err
}

// FuzzParseV6 holds the allocation-free IPv6 parser to netip's rules: what
// it accepts, netip parses to the same prefix (it may leave forms to netip).
func FuzzParseV6(f *testing.F) {
	for _, s := range []string{"2001:db8::1", "2001:DB8::/32", "::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::8", "1::2::3",
		"::ffff:1.2.3.4", "::ffff:102:304", "12345::", "2001:db8::/129", "2001:db8::/032", "fe80::1%eth0", ":1::", "1:", "2001:db8:0:0:0:0:0:0/64"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, bits, ok := parseV6([]byte(s))
		if !ok {
			return
		}
		want, err := netipPrefix(s)
		if err != nil || !want.Addr().Is6() || want.Addr().Is4In6() || want.Addr().Zone() != "" {
			t.Fatalf("parseV6(%q) accepted what netip refuses or reads otherwise (%v, %v)", s, want, err)
		}
		if a.Addr() != want.Addr() || bits != want.Bits() {
			t.Fatalf("parseV6(%q) = %v/%d, netip %v", s, a.Addr(), bits, want)
		}
	})
}

// FuzzParseV4 holds the allocation-free IPv4 parser to netip's rules.
func FuzzParseV4(f *testing.F) {
	for _, s := range []string{"1.2.3.4", "1.2.3.4/24", "01.2.3.4", "1.2.3.4/033", "255.255.255.255/32", "1.2.3", "1.2.3.4/", "256.1.1.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, bits, ok := parseV4([]byte(s))
		want, err := netipPrefix(s)
		wantOK := err == nil && want.Addr().Is4()
		if ok && !wantOK {
			t.Fatalf("parseV4(%q) accepted what netip refuses (%v)", s, err)
		}
		if ok && (UintToV4(a) != want.Addr() || bits != want.Bits()) {
			t.Fatalf("parseV4(%q) = %v/%d, netip %v", s, UintToV4(a), bits, want)
		}
	})
}

// TestSectionLineNumbers: a file big enough to be parsed in sections
// reports errors and skipped lines with the whole file's line numbers, and
// loses and doubles no entry at the sections' seams.
func TestSectionLineNumbers(t *testing.T) {
	runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0))) // sections even on one CPU
	const lines, bad = 1_000_000, 876_543
	var b strings.Builder
	for i := 1; i <= lines; i++ {
		switch {
		case i == bad:
			b.WriteString("not-an-address\n")
		case i%1000 == 0:
			b.WriteString("\n# a comment\n") // two lines
			i++
		default:
			b.WriteString(UintToV4(uint32(0x0a000000+i)).String() + "\n")
		}
	}
	if b.Len() < 8<<20 {
		t.Fatalf("the file is %d bytes: too small to be cut in sections", b.Len())
	}
	file := writeList(t, b.String())
	_, err := readList(t, 4, Options{}, file)
	var e *Error
	if !errors.As(err, &e) || e.Line != bad || e.File != file {
		t.Fatalf("error %v, want one at %s:%d", err, file, bad)
	}
	l, err := readList(t, 4, Options{Lenient: true}, file)
	if err != nil {
		t.Fatal(err)
	}
	want := lines - 1 - (2*(lines/1000) - 1) // the bad line; each comment pair replaces two addresses, the last one
	if l.Skipped != 1 || !strings.Contains(l.FirstSkipped, fmt.Sprintf(":%d:", bad)) || l.Entries != want {
		t.Errorf("lenient: %d skipped (%s), %d entries, want 1 at line %d and %d", l.Skipped, l.FirstSkipped, l.Entries, bad, want)
	}
}

// TestSortRanges6 checks the radix sort of big IPv6 range sets against a
// comparison sort, with many ranges sharing their high 64 bits.
func TestSortRanges6(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rs := make([]Range6, 200_000)
	for i := range rs {
		hi := rng.Uint64()
		if i%3 == 0 {
			hi = uint64(rng.IntN(50)) << 32 // ties in the high bits
		}
		rs[i].Lo = U128{hi, rng.Uint64()}
		rs[i].Hi = rs[i].Lo
	}
	want := slices.Clone(rs)
	slices.SortFunc(want, func(a, b Range6) int { return a.Lo.Cmp(b.Lo) })
	sortRanges6(rs)
	if !slices.Equal(rs, want) {
		t.Error("the radix sort disagrees with a comparison sort")
	}
	// /48s of one /32: the digits every range shares are passes skipped.
	for i := range rs {
		rs[i].Lo = U128{0x20010db8<<32 | rng.Uint64()&0xffff0000, 0}
		rs[i].Hi = rs[i].Lo.Or(LowMask(80))
	}
	want = slices.Clone(rs)
	slices.SortStableFunc(want, func(a, b Range6) int { return a.Lo.Cmp(b.Lo) })
	sortRanges6(rs)
	if !slices.Equal(rs, want) {
		t.Error("the radix sort of one /32's /48s disagrees with a comparison sort")
	}
}

// TestParseV6Forms: the fast path takes the plain forms and leaves the rest.
func TestParseV6Forms(t *testing.T) {
	for s, want := range map[string]bool{
		"2001:db8::1": true, "::": true, "::1": true, "1::": true, "1:2:3:4:5:6:7:8": true, "2001:DB8::/32": true, "2001:db8::/0": true,
		"::ffff:1.2.3.4": false, "::ffff:102:304": false, "1::2::3": false, "fe80::1%eth0": false, "12345::": false, "1:2:3:4:5:6:7:8:9": false,
		"2001:db8::/129": false, "2001:db8::/032": false, ":1::": false, "1:": false, "": false,
	} {
		if _, _, ok := parseV6([]byte(s)); ok != want {
			t.Errorf("parseV6(%q) ok = %v, want %v", s, ok, want)
		}
	}
}

// TestSectionsGathered: a list of two files, each big enough to be parsed
// in sections, holds every entry once: with comments between them, IPv6
// lines no section's first lines show, and a last line without its end.
func TestSectionsGathered(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0)))) // sections even on one CPU
	rng := rand.New(rand.NewPCG(7, 7))
	var want4 []Range4
	var want6 []Range6
	entries := 0
	file := func(n int, v6Every int, v6Tail int, end string) string {
		var b strings.Builder
		for i := range n + v6Tail {
			switch {
			case i%997 == 0:
				b.WriteString("# a comment\n\n")
			case i >= n || (v6Every > 0 && i%v6Every == 0):
				a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 4: byte(i >> 24), 5: byte(i >> 16), 6: byte(i >> 8), 7: byte(i), 15: byte(rng.Uint32())})
				b.WriteString(a.String() + "\n")
				want6 = append(want6, Range6{U128Of(a), U128Of(a)})
				entries++
			default:
				a := rng.Uint32()
				b.WriteString(UintToV4(a).String() + "\n")
				want4 = append(want4, Range4{a, a})
				entries++
			}
		}
		return strings.TrimSuffix(b.String(), "\n") + end
	}
	one := file(800_000, 0, 3, "\n") // IPv6 only in the last lines
	two := file(600_000, 50, 0, "")  // both families from the start
	if len(one) < 8<<20 || len(two) < 8<<20 {
		t.Fatalf("files of %d and %d bytes: too small to be cut in sections", len(one), len(two))
	}
	l, err := readList(t, 0, Options{}, writeList(t, one), writeList(t, two))
	if err != nil {
		t.Fatal(err)
	}
	if l.Entries != entries {
		t.Errorf("%d entries, want %d", l.Entries, entries)
	}
	if !slices.Equal(l.V4, MergeRanges4(want4)) || !slices.Equal(l.V6, MergeRanges6(want6)) {
		t.Errorf("the list's ranges (%d IPv4, %d IPv6) differ from the files' (%d, %d)", len(l.V4), len(l.V6), len(MergeRanges4(want4)), len(MergeRanges6(want6)))
	}
}
