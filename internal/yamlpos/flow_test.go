package yamlpos

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// flowLines are items of a policy: the simple ones flowItem reads, with
// every kind of scalar yaml.v3 tags differently, and others it leaves to
// yaml.v3.
var flowLines = []struct {
	line   string
	simple bool
}{
	{"- {name: r1, src: 192.0.2.0/24, proto: udp, dport: 53, action: drop}", true},
	{"  -   {name: my rule ,src: [10.0.0.0/8, 2001:db8::/32], dport: [80, 443],  action: drop}   # a comment", true},
	{"- {name: \"quoted # not a comment\", action: 'pass'}", true},
	{"- {a: true, b: False, c: null, d: NULL, e: 0x1F, f: -1, g: +2, h: 1e3, i: .5, j: 2001-12-14, k: 1_000, l: on, m: Yes, n: 07, o: 1.2.3.4}", true},
	{"- {a: -.inf, b: .NaN, c: 0o17, d: 0b101, e: 2001-12-14t21:59:43.10-05:00, f: 9223372036854775808, g: 99999999999999999999}", true},
	{"- {key with spaces: a - b, x: a-b-c, y: ::1/128}", false}, // a scalar cannot start with ":" in flow
	{"- {x: fe80::1, y: 2001:db8::}", false},                    // a colon before "," is left to yaml.v3
	{"- {x: a  b}", false},
	{"- {x: \"esc\\\"aped\"}", false},
	{"- {x: 'it''s'}", false},
	{"- {x: {y: z}}", false},
	{"- {x: []}", false},
	{"- {}", false},
	{"- {x: y,}", false},
	{"- {x: y,z: [a,b]}", true},
	{"- {x:y}", false},
	{"- {x: y}#c", false},
	{"- {x: \ty}", false},
	{"- {x: é}", false},
	{"- {x: &a y}", false},
	{"- {x: !!str 1}", false},
	{"- {x: @y}", false},
	{"- {x: y", false},
	{"- name: block", false},
	{"- {x: y}\n  more: z", false},
}

// TestFlowItem: an item of the simple form is read into exactly the nodes
// yaml.v3 makes of it; any other is left to yaml.v3.
func TestFlowItem(t *testing.T) {
	for _, c := range flowLines {
		text := c.line + "\n  # a comment line\n\n"
		var s slab
		got, ok := s.flowItem(text, 7)
		if ok != c.simple {
			t.Errorf("%q: simple %v, want %v", c.line, ok, c.simple)
		}
		if ok {
			checkSameItem(t, text, 7, got)
		}
	}
}

// checkSameItem fails unless n is what yaml.v3 decodes of text, an item
// at line.
func checkSameItem(t *testing.T, text string, line int, n *yaml.Node) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("%q: read as simple, but yaml.v3 refuses it: %v", text, err)
	}
	want := doc.Content[0].Content[0]
	offsetLines(want, line-1)
	uncomment(want)
	if !reflect.DeepEqual(want, n) {
		t.Errorf("%q: differs from yaml.v3:\n%s", text, firstDiff(want, n))
	}
}

// TestDecodeSplitMixed: a long sequence of simple items and others, in
// runs, decodes as yaml.v3 decodes it whole.
func TestDecodeSplitMixed(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range 4000 {
		c := flowLines[i%len(flowLines)]
		var n yaml.Node
		if yaml.Unmarshal([]byte(c.line), &n) != nil || strings.ContainsAny(c.line, "&\n") {
			c = flowLines[0] // what yaml.v3 refuses, an anchor, an item that goes on
		}
		if i%500 < 40 {
			c.line = "- name: block\n  dport: [1, 2]" // a run of block items
		}
		b.WriteString("  " + strings.ReplaceAll(strings.TrimLeft(c.line, " "), "\n", "\n  ") + "\n")
	}
	data := []byte(b.String())
	var whole yaml.Node
	if err := yaml.Unmarshal(data, &whole); err != nil {
		t.Fatal(err)
	}
	got, ok := decodeSplit(data, 3)
	if !ok {
		t.Fatal("not split")
	}
	uncomment(&whole)
	uncomment(got)
	if !reflect.DeepEqual(&whole, got) {
		t.Errorf("the pieces differ from the whole:\n%s", firstDiff(&whole, got))
	}
}

// FuzzFlowItem: whatever flowItem reads as simple, yaml.v3 reads into the
// same nodes.
func FuzzFlowItem(f *testing.F) {
	for _, c := range flowLines {
		f.Add(c.line, "  # after\n\n")
	}
	f.Fuzz(func(t *testing.T, line, after string) {
		if strings.ContainsAny(line, "\n\r") || strings.Contains(after, "\r") {
			return // a lone CR is a line break to yaml.v3; a document with one is never split
		}
		text := line + "\n" + after
		// As written, and with CRLF line ends.
		for _, text := range []string{text, strings.ReplaceAll(text, "\n", "\r\n")} {
			var s slab
			if n, ok := s.flowItem(text, 1); ok {
				checkSameItem(t, text, 1, n)
			}
		}
	})
}

// BenchmarkDecodeFeed: a feed's policy of 10,000 one-line rules, decoded
// by Decoder (in pieces, simple items read by flowItem) and by yaml.v3
// whole, side by side.
func BenchmarkDecodeFeed(b *testing.B) {
	var text strings.Builder
	text.WriteString("rules:\n")
	for i := range 10000 {
		fmt.Fprintf(&text, "  - {name: r%d, src: %d.%d.%d.0/24, proto: udp, dport: %d, action: drop}\n", i, 11+i%200, i>>8&255, i&255, 1+i*7%65535)
	}
	data := []byte(text.String())
	b.Run("rampart", func(b *testing.B) {
		for b.Loop() {
			var n yaml.Node
			if err := NewDecoder("feed.yaml", data).Decode(&n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("yaml.v3", func(b *testing.B) {
		for b.Loop() {
			var n yaml.Node
			if err := yaml.Unmarshal(data, &n); err != nil {
				b.Fatal(err)
			}
		}
	})
}
