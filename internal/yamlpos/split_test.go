package yamlpos

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// bigSeq is n items made by item(i), each a line or more at indent.
func bigSeq(n int, item func(i int) string) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(item(i))
	}
	return b.String()
}

// TestDecodeSplit: a document decoded in pieces is the document decoded
// whole, node for node (lines and columns too; comments aside), and one a
// cut could misread is decoded whole.
func TestDecodeSplit(t *testing.T) {
	flow := func(i int) string {
		return fmt.Sprintf("  - {name: r%d, src: 10.%d.%d.0/24, proto: udp, dport: %d, action: drop}\n", i, i>>8&255, i&255, i%65536)
	}
	block := func(i int) string {
		s := fmt.Sprintf("  - name: r%d\n    dport: [%d, %d]\n", i, i, i+1)
		if i%97 == 0 {
			s += "# a comment at column 0\n\n"
		}
		if i%89 == 0 {
			s += "    note: |\n      a block scalar\n        - not an item\n"
		}
		return s
	}
	unindented := func(i int) string {
		return fmt.Sprintf("- name: r%d\n  src: [10.0.%d.0/24, 10.1.%d.0/24]\n", i, i&255, i&255)
	}
	const n = 3000
	for _, c := range []struct {
		name  string
		text  string
		split bool
	}{
		{"flow items", "lists:\n  a: {prefixes: [10.0.0.0/8]}\nrules:\n" + bigSeq(n, flow) + "default: pass\n", true},
		{"block items", "# head\nrules:\n\n  # first\n" + bigSeq(n, block) + "unparsed: pass\n", true},
		{"items at the key's indentation", "rules:\n" + bigSeq(n, unindented) + "other:\n- 1\n", true},
		{"CRLF", strings.ReplaceAll("rules:\n"+bigSeq(n, flow), "\n", "\r\n"), true},
		// A quoted scalar continued by a line that looks like an item.
		{"quoted across an item", "rules:\n" + bigSeq(n/2, flow) + "  - {name: \"x\n  - y\"}\n" + bigSeq(n/2, flow), false},
		{"alias across pieces", "rules:\n  - &first {name: a}\n" + bigSeq(n, flow) + "  - *first\n", false},
		{"alias of an anchor outside", "x: &y {name: a}\nrules:\n" + bigSeq(n, flow) + "  - *y\n", false},
		// Decoded whole, *a is the later anchor, inside the sequence.
		{"anchor redefined in a piece", "default: &a pass\nrules:\n  - {name: r, action: &a drop}\n" + bigSeq(n, flow) + "unparsed: *a\n", false},
		// yaml.v3 counts a lone CR as a line break: the pieces' lines would drift.
		{"a lone CR", "rules:\n  - {name: \"a\rb\"}\n" + bigSeq(n, flow) + "default: pass\n", false},
		{"a line separator", "rules:\n  - {name: \"a\u2028b\"}\n" + bigSeq(n, flow) + "default: pass\n", false},
		{"two documents", "rules:\n" + bigSeq(n, flow) + "---\nrules: []\n", false},
		{"a line less indented", "rules:\n" + bigSeq(n, flow) + " oops: 1\n" + bigSeq(n, flow), false},
		{"small", "rules:\n" + bigSeq(10, flow), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := []byte(c.text)
			var whole yaml.Node
			wholeErr := yaml.Unmarshal(data, &whole)
			got, ok := decodeSplit(data, 4)
			if ok != c.split {
				t.Fatalf("split: %v, want %v", ok, c.split)
			}
			if !ok {
				return
			}
			if wholeErr != nil {
				t.Fatalf("split a document that does not decode: %v", wholeErr)
			}
			uncomment(&whole)
			uncomment(got)
			if !reflect.DeepEqual(&whole, got) {
				t.Errorf("the pieces differ from the whole:\n%s", firstDiff(&whole, got))
			}
		})
	}
	// Through the Decoder: the one document, then io.EOF.
	d := NewDecoder("f.yaml", []byte("rules:\n"+bigSeq(n, flow)))
	var doc, next yaml.Node
	if err := d.Decode(&doc); err != nil || d.split != 1 || len(doc.Content[0].Content[1].Content) != n {
		t.Fatalf("decoder: %v, split %d", err, d.split)
	}
	if err := d.Decode(&next); err == nil {
		t.Error("a second document after a split one")
	}
}

// TestDecodeSplitError: a syntax error inside a long sequence is located
// as the whole decode locates it.
func TestDecodeSplitError(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range 3000 {
		if i == 2500 {
			b.WriteString("  - {name: broken\n")
			continue
		}
		fmt.Fprintf(&b, "  - {name: r%d, src: 10.0.%d.0/24, action: drop}\n", i, i&255)
	}
	var n yaml.Node
	err := NewDecoder("f.yaml", []byte(b.String())).Decode(&n)
	if err == nil || !strings.HasPrefix(err.Error(), "f.yaml:2503: syntax:") && !strings.HasPrefix(err.Error(), "f.yaml:2502: syntax:") {
		t.Errorf("got %v, want an error at the broken item (line 2502)", err)
	}
}

func uncomment(n *yaml.Node) {
	n.HeadComment, n.LineComment, n.FootComment = "", "", ""
	for _, c := range n.Content {
		uncomment(c)
	}
}

// firstDiff names the first node where a and b differ.
func firstDiff(a, b *yaml.Node) string {
	if a.Kind != b.Kind || a.Tag != b.Tag || a.Value != b.Value || a.Line != b.Line || a.Column != b.Column || a.Style != b.Style || len(a.Content) != len(b.Content) {
		return fmt.Sprintf("whole %d:%d %v %q %q (%d children), pieces %d:%d %v %q %q (%d children)",
			a.Line, a.Column, a.Kind, a.Tag, a.Value, len(a.Content), b.Line, b.Column, b.Kind, b.Tag, b.Value, len(b.Content))
	}
	for i := range a.Content {
		if d := firstDiff(a.Content[i], b.Content[i]); d != "" {
			return d
		}
	}
	return ""
}
