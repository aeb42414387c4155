package policy

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNotRegularFiles: a FIFO would hang the reader and /dev/zero never
// end; both are refused at once, naming what they are.
func TestNotRegularFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "list.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{fifo: "not a regular file (a FIFO)", "/dev/zero": "not a regular file (a character device)", t.TempDir(): "not a regular file (a directory)"} {
		done := make(chan error, 1)
		go func() {
			_, err := readList(t, 0, Options{}, file)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want %q", file, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the reader hangs", file)
		}
		if _, err := Load(file, Options{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("policy %s: %v, want %q", file, err, want)
		}
	}
}

// TestReadInterrupted: reading a big list stops when its context ends.
func TestReadInterrupted(t *testing.T) {
	var b strings.Builder
	for i := range 300_000 {
		b.WriteString(UintToV4(uint32(0x0a000000+i)).String() + "\n")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := readList(t, 0, Options{Context: ctx}, writeList(t, b.String()))
	if err == nil || !strings.Contains(err.Error(), "interrupted at line") {
		t.Errorf("a cancelled read: %v", err)
	}
}

// TestByteOrderMark: a BOM at the start of a list or policy file is text
// encoding, not a bad address.
func TestByteOrderMark(t *testing.T) {
	l, err := readList(t, 0, Options{}, writeList(t, "\xef\xbb\xbf192.0.2.1\n192.0.2.2\n"))
	if err != nil || l.Entries != 2 {
		t.Fatalf("list with a BOM: %v %+v", err, l)
	}
	if _, err := Parse("p.yaml", []byte("\xef\xbb\xbfrules: []\n")); err != nil {
		t.Errorf("policy with a BOM: %v", err)
	}
}

// TestZones: a zone is refused in every form, never dropped silently.
func TestZones(t *testing.T) {
	for _, e := range []string{"fe80::1%eth0", "fe80::1%eth0/64", "fe80::1%eth0-fe80::9%eth0"} {
		_, err := ParseEntry(e)
		if err == nil || !strings.Contains(err.Error(), "zone") && !strings.Contains(err.Error(), "bad range") {
			t.Errorf("%s: %v, want a refusal", e, err)
		}
	}
	_, err := readList(t, 0, Options{}, writeList(t, "2001:db8::1\nfe80::1%eth0\n"))
	if err == nil || !strings.Contains(err.Error(), "list.txt:2:") || !strings.Contains(err.Error(), "zone") {
		t.Errorf("a zone in a list file: %v", err)
	}
}

// TestYAMLErrorLines: syntax errors name the line they are on.
func TestYAMLErrorLines(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"lists: {a: [}\n", "p.yaml:1: syntax:"},
		{"rules:\n  - {name: a, action: drop}\n  - {name: b action: drop\n", "p.yaml:3: syntax:"},
		{"rules:\n  - {name: a, action: drop}\n  - {name: b, action: drop\n  - {name: c, action: drop}\n", "p.yaml:4: syntax:"},
		{"rules:\n  - name: a\n   action: drop\n", "p.yaml:3: syntax:"},
		{"rules:\n  - {name: a, action: drop}\n\tdefault: pass\n", "p.yaml:3: syntax:"},
		{"lists:\n  a: {prefixes: [192.0.2.1]\nrules: []\n", "p.yaml:3: syntax:"},
	} {
		_, err := Parse("p.yaml", []byte(c.text))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.text, err, c.want)
		}
	}
}

// TestSecondDocument: a policy is one YAML document; a second is refused,
// not ignored.
func TestSecondDocument(t *testing.T) {
	_, err := Parse("p.yaml", []byte("rules: []\ndefault: pass\n---\nrules:\n  - {name: a, action: drop}\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "p.yaml:3: a second YAML document starts here") {
		t.Errorf("two documents: %v", err)
	}
	if _, err := Parse("p.yaml", []byte("---\nrules: []\n")); err != nil {
		t.Errorf("one document with its marker: %v", err)
	}
}

// TestUnreachableRules warns of rules that can never match.
func TestUnreachableRules(t *testing.T) {
	pol, err := Parse("p.yaml", []byte(`lists:
  v6: {prefixes: ["2001:db8::/32"]}
  v4: {prefixes: [192.0.2.0/24]}
rules:
  - {name: a, src: v6, family: 4, action: drop}
  - {name: b, src: v4, dst: v6, action: drop}
  - {name: c, proto: udp, dport: 53, action: pass}
  - {name: d, proto: udp, dport: 53, action: drop}
  - {name: all, action: pass}
  - {name: e, src: 198.51.100.0/24, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`p.yaml:5: rule: rule "a" can never match: family 4, but its source lists (v6) hold no IPv4 address`,
		`p.yaml:6: rule: rule "b" can never match: its source lists and its destination lists hold addresses of different families`,
		`p.yaml:8: rule: rule "d" can never match: rule "c" (line 7) before it matches the same frames`,
		`p.yaml:10: rule: rule "e" can never match: rule "all" (line 9) before it matches every IP frame`,
	}
	if len(pol.Warnings) != len(want) {
		t.Fatalf("warnings %v", pol.Warnings)
	}
	for i, w := range pol.Warnings {
		if w.Error() != want[i] {
			t.Errorf("warning %d: %q, want %q", i, w.Error(), want[i])
		}
	}
}
