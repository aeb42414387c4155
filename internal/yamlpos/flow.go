package yamlpos

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// A feed's policy is thousands of items of one line each, a flow mapping
// of plain scalars:
//
//	- {name: r1, src: 192.0.2.0/24, proto: udp, dport: [53, 123], action: drop}
//
// yaml.v3 spends about 20 µs on such a line (its scanner, parser and
// composer each allocate), most of what a 10,000-rule apply costs. A line
// of that simple form is read here into the nodes yaml.v3 makes of it
// (kind, style, tag, value, line and column, no comments: the tests hold
// the two to each other node for node, and fuzz the reader against
// yaml.v3); anything else (a quote with an escape, a nested mapping, a tab
// outside a comment, a character outside printable ASCII, a key without a
// space after its colon, a line that continues) is left to yaml.v3.

// slab hands out nodes and pointer slices in chunks: a flow item's few
// nodes would otherwise be as many allocations.
type slab struct {
	nodes []yaml.Node
	ptrs  []*yaml.Node
}

func (s *slab) node() *yaml.Node {
	if len(s.nodes) == cap(s.nodes) {
		s.nodes = make([]yaml.Node, 0, 1024)
	}
	s.nodes = s.nodes[:len(s.nodes)+1]
	return &s.nodes[len(s.nodes)-1]
}

// content is a slice of n pointers, empty, to append to.
func (s *slab) content(n int) []*yaml.Node {
	if cap(s.ptrs)-len(s.ptrs) < n {
		s.ptrs = make([]*yaml.Node, 0, max(4096, n))
	}
	out := s.ptrs[len(s.ptrs) : len(s.ptrs) : len(s.ptrs)+n]
	s.ptrs = s.ptrs[:len(s.ptrs)+n]
	return out
}

// flowItem reads text, one sequence item starting at line (its first line
// and any blank or comment-only lines after it), into the item's node;
// false when the item is not of the simple form.
func (s *slab) flowItem(text string, line int) (*yaml.Node, bool) {
	first, rest, _ := strings.Cut(text, "\n")
	first = strings.TrimSuffix(first, "\r")
	if !onlyComments(rest) {
		return nil, false
	}
	r := flowReader{s: s, text: first, line: line}
	for r.at < len(first) && first[r.at] == ' ' {
		r.at++
	}
	if !r.take('-') || !r.spaces() {
		return nil, false
	}
	m, ok := r.mapping()
	if !ok || !r.end() {
		return nil, false
	}
	return m, true
}

// onlyComments: every line of text is blank or a comment of printable
// ASCII and tabs (yaml.v3 refuses control characters and invalid UTF-8
// even there), its break LF or CRLF.
func onlyComments(text string) bool {
	for line := range strings.Lines(text) {
		body := strings.TrimLeft(strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), " ")
		if body == "" {
			continue
		}
		if body[0] != '#' || strings.ContainsFunc(body, func(c rune) bool { return (c < ' ' || c >= 0x7f) && c != '\t' }) {
			return false
		}
	}
	return true
}

type flowReader struct {
	s    *slab
	text string // a line: nodes' values are substrings of it
	at   int
	line int
}

func (r *flowReader) take(c byte) bool {
	if r.at < len(r.text) && r.text[r.at] == c {
		r.at++
		return true
	}
	return false
}

// spaces skips one space or more; false if there is none.
func (r *flowReader) spaces() bool {
	from := r.at
	for r.at < len(r.text) && r.text[r.at] == ' ' {
		r.at++
	}
	return r.at > from
}

// end: the rest of the line is nothing, or spaces and perhaps a comment.
func (r *flowReader) end() bool {
	return r.at == len(r.text) || r.spaces() && onlyComments(r.text[r.at:])
}

func (r *flowReader) newNode(kind yaml.Kind, style yaml.Style, tag string, at int) *yaml.Node {
	n := r.s.node()
	n.Kind, n.Style, n.Tag, n.Line, n.Column = kind, style, tag, r.line, at+1
	return n
}

// mapping reads "{key: value, …}" with at least one pair.
func (r *flowReader) mapping() (*yaml.Node, bool) {
	m := r.newNode(yaml.MappingNode, yaml.FlowStyle, "!!map", r.at)
	if !r.take('{') {
		return nil, false
	}
	r.spaces()
	// Pairs are counted by their separators, an upper bound: the content
	// is one slice of the slab.
	m.Content = r.s.content(2 * (1 + strings.Count(r.text[r.at:], ",")))
	for {
		from := r.at
		k, ok := r.scalar()
		// yaml.v3 takes no key longer than 1,024 characters.
		if !ok || r.at-from > 512 || !r.take(':') || !r.spaces() {
			return nil, false
		}
		var v *yaml.Node
		if r.at < len(r.text) && r.text[r.at] == '[' {
			v, ok = r.sequence()
		} else {
			v, ok = r.scalar()
		}
		if !ok {
			return nil, false
		}
		m.Content = append(m.Content, k, v)
		if done, ok := r.next('}'); done || !ok {
			return m, ok
		}
	}
}

// next reads what follows an element of a collection: its closing
// bracket (done) or a comma.
func (r *flowReader) next(closing byte) (done, ok bool) {
	r.spaces()
	if r.take(closing) {
		return true, true
	}
	ok = r.take(',')
	r.spaces()
	return false, ok
}

// sequence reads "[scalar, …]" with at least one scalar.
func (r *flowReader) sequence() (*yaml.Node, bool) {
	q := r.newNode(yaml.SequenceNode, yaml.FlowStyle, "!!seq", r.at)
	r.at++ // '['
	r.spaces()
	n := 1
	if end := strings.IndexByte(r.text[r.at:], ']'); end >= 0 {
		n += strings.Count(r.text[r.at:r.at+end], ",")
	}
	q.Content = r.s.content(n)
	for {
		v, ok := r.scalar()
		if !ok {
			return nil, false
		}
		q.Content = append(q.Content, v)
		if done, ok := r.next(']'); done || !ok {
			return q, ok
		}
	}
}

// scalar reads a plain scalar of plain characters, words separated by
// single spaces, or a quoted one without escapes.
func (r *flowReader) scalar() (*yaml.Node, bool) {
	from := r.at
	if r.at < len(r.text) && (r.text[r.at] == '"' || r.text[r.at] == '\'') {
		q := r.text[r.at]
		end := r.at + 1
		for end < len(r.text) && r.text[end] != q && r.text[end] != '\\' && r.text[end] >= ' ' && r.text[end] < 0x7f {
			end++
		}
		if end == len(r.text) || r.text[end] != q {
			return nil, false
		}
		style := yaml.DoubleQuotedStyle
		if q == '\'' {
			style = yaml.SingleQuotedStyle
		}
		n := r.newNode(yaml.ScalarNode, style, "!!str", from)
		n.Value = r.text[from+1 : end]
		r.at = end + 1
		return n, true
	}
	// A plain scalar may not start with an indicator; "-" followed by a
	// plain character is a scalar ("-1").
	if r.at == len(r.text) || !plainChar(r.text[r.at]) || r.text[r.at] == ':' ||
		r.text[r.at] == '-' && (r.at+1 == len(r.text) || !plainChar(r.text[r.at+1])) {
		return nil, false
	}
	end := r.at
	for {
		for end < len(r.text) && plainChar(r.text[end]) {
			// A colon ends the scalar when a space follows (a key's);
			// before anything else but a plain character, leave it to
			// yaml.v3.
			if r.text[end] == ':' && (end+1 == len(r.text) || !plainChar(r.text[end+1])) {
				break
			}
			end++
		}
		// One space between words: "my rule".
		if end+1 < len(r.text) && r.text[end] == ' ' && plainChar(r.text[end+1]) && r.text[end+1] != ':' {
			end++
			continue
		}
		break
	}
	n := r.newNode(yaml.ScalarNode, 0, "", from)
	n.Value = r.text[from:end]
	n.Tag = plainTag(n)
	r.at = end
	return n, true
}

// plainChar is a character a plain scalar of this reader may hold: a
// letter, a digit or one of "._/:+-" (no indicator, quote, space or
// comment's start).
func plainChar(c byte) bool { return plainChars[c] }

var plainChars = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._/:+-", byte(c)) >= 0
	}
	return t
}()

// plainTag resolves a plain scalar's tag as yaml.v3 does (Node.ShortTag),
// without its cost (a timestamp's parse, a regular expression's match) for
// a feed's common scalars: yaml.v3 itself takes a scalar whose first
// character no number, bool or null starts with for a string; one with a
// slash is no number, time, bool or null; a decimal of up to 18 digits
// without a leading zero is an int.
func plainTag(n *yaml.Node) string {
	v := n.Value
	switch {
	case strings.IndexByte("+-0123456789yYnNtTfFoO~.", v[0]) < 0 || strings.IndexByte(v, '/') >= 0:
		return "!!str"
	case len(v) <= 18 && (v[0] != '0' || len(v) == 1) && strings.Trim(v, "0123456789") == "":
		return "!!int"
	}
	return n.ShortTag()
}
