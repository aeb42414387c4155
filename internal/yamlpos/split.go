package yamlpos

import (
	"bytes"
	"slices"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"
)

// yaml.v3 reads about 4 MB a second here: a policy of 10,000 rules
// (800 KB) took 0.18-0.21 s to decode, most of an apply. Its items are
// independent, so the longest block sequence under a top-level key is cut
// at item boundaries and the pieces decoded on every CPU, beside the rest
// of the document with that sequence's lines left empty (1.4-1.5× faster
// on two CPUs: decoding allocates, and the allocator is shared).
//
// A cut falls where the whole document starts an item at the sequence's
// indentation, or inside a quoted or flow scalar that a line starting
// "- " at that indentation continues: that piece ends unterminated and
// fails. When a piece fails for any reason (that, a syntax error), the
// document is decoded whole, which also locates the error.

// splitMin is the size of sequence worth cutting.
const splitMin = 64 << 10

// sequence is a block sequence under a top-level key: the key's line
// (1-based) and the byte offsets of its lines that start an item, and of
// its end.
type sequence struct {
	keyLine int
	items   []int
	end     int
}

// decodeSplit decodes data, one document, in up to pieces pieces beside the
// rest of it; false when it cannot, and data is to be decoded whole.
func decodeSplit(data []byte, pieces int) (*yaml.Node, bool) {
	s, ok := longestSequence(data)
	if !ok || pieces < 2 || len(s.items) < 2*pieces || s.end-s.items[0] < splitMin {
		return nil, false
	}
	// Cut at the first item past each share of the bytes: cuts are
	// indexes of items, and the sequence's end.
	start := s.items[0]
	items := append(s.items, s.end)
	cuts := []int{0}
	for i, k := 1, 0; i < pieces; i++ {
		at := start + (s.end-start)*i/pieces
		for k < len(s.items) && s.items[k] < at {
			k++
		}
		if k < len(s.items) && k > cuts[len(cuts)-1] {
			cuts = append(cuts, k)
		}
	}
	cuts = append(cuts, len(s.items))

	// The rest of the document, every line where it was: the sequence's
	// lines are left empty.
	blank := bytes.Repeat([]byte{'\n'}, bytes.Count(data[start:s.end], []byte{'\n'}))
	rest := slices.Concat(data[:start], blank, data[s.end:])
	var doc yaml.Node
	var restErr error
	seqs := make([][]*yaml.Node, len(cuts)-1) // a piece's items, nil if it failed
	var wg sync.WaitGroup
	wg.Go(func() { restErr = yaml.Unmarshal(rest, &doc) })
	for i := range seqs {
		wg.Go(func() { seqs[i] = decodeItems(data, items[cuts[i]:cuts[i+1]+1]) })
	}
	wg.Wait()
	if restErr != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, false
	}
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, p := range seqs {
		if p == nil {
			return nil, false
		}
		seq.Content = append(seq.Content, p...)
	}
	// The sequence is where its first item's "-" is.
	seq.Line = bytes.Count(data[:start], []byte{'\n'}) + 1
	seq.Column = len(data[start:]) - len(bytes.TrimLeft(data[start:], " ")) + 1
	// The key the sequence was under now holds a null: it gets the
	// sequence back.
	top := doc.Content[0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if k.Line == s.keyLine && k.Column == 1 && v.Kind == yaml.ScalarNode && v.Tag == "!!null" && v.Value == "" {
			top.Content[i+1] = seq
			return &doc, true
		}
	}
	return nil, false
}

// decodeItems decodes the items starting at bounds (each item ends where
// the next starts; the last bound ends the last): one of the simple form
// by flowItem, runs of others by yaml.v3. Nil when one fails.
func decodeItems(data []byte, bounds []int) []*yaml.Node {
	var s slab
	out := make([]*yaml.Node, 0, len(bounds)-1)
	// One string for the piece: the nodes' values are its substrings.
	base := bounds[0]
	str := string(data[base:bounds[len(bounds)-1]])
	line := bytes.Count(data[:base], []byte{'\n'}) + 1
	run, runLine := -1, 0 // the first item of a run left to yaml.v3, and its line
	for k := range len(bounds) - 1 {
		text := str[bounds[k]-base : bounds[k+1]-base]
		if n, ok := s.flowItem(text, line); ok {
			if run >= 0 && !decodeRun(data[bounds[run]:bounds[k]], runLine, &out) {
				return nil
			}
			run = -1
			out = append(out, n)
		} else if run < 0 {
			run, runLine = k, line
		}
		line += strings.Count(text, "\n")
	}
	if run >= 0 && !decodeRun(data[bounds[run]:bounds[len(bounds)-1]], runLine, &out) {
		return nil
	}
	return out
}

// decodeRun decodes text, items of a sequence whose first is at line, by
// yaml.v3, and appends them to out.
func decodeRun(text []byte, line int, out *[]*yaml.Node) bool {
	var piece yaml.Node
	if yaml.Unmarshal(text, &piece) != nil || len(piece.Content) != 1 || piece.Content[0].Kind != yaml.SequenceNode {
		return false
	}
	offsetLines(piece.Content[0], line-1)
	*out = append(*out, piece.Content[0].Content...)
	return true
}

// offsetLines moves n and everything under it down by lines.
func offsetLines(n *yaml.Node, lines int) {
	n.Line += lines
	for _, c := range n.Content {
		offsetLines(c, lines)
	}
}

// longestSequence finds the longest block sequence under a top-level key
// (a line "key:" at column 0, then items "- " at one indentation). False
// when data has what a cut could misread: a document marker or directive,
// a tab in an indentation, a line less indented than the items that
// neither starts a key at column 0 nor is a comment; an anchor or an
// alias (an anchor redefined in one piece changes what an alias in
// another means); a line break other than LF and CRLF (yaml.v3 counts a
// lone CR, NEL, LS and PS too: the pieces' lines would drift).
func longestSequence(data []byte) (sequence, bool) {
	// One fast pass a character: ContainsAny of a set with multibyte
	// characters reads data a rune at a time.
	for _, c := range []string{"&", "*", "\u0085", "\u2028", "\u2029"} {
		if bytes.Contains(data, []byte(c)) {
			return sequence{}, false
		}
	}
	if bytes.Count(data, []byte("\r")) != bytes.Count(data, []byte("\r\n")) {
		return sequence{}, false
	}
	var best, cur sequence
	indent := -1 // the items' indentation while in a sequence
	closeSeq := func(at int) {
		if indent >= 0 && len(cur.items) > 0 {
			cur.end = at
			if best.items == nil || cur.end-cur.items[0] > best.end-best.items[0] {
				best = cur
			}
		}
		indent = -1
	}
	keyLine := 0 // the line of a key with nothing after it, before its value's first line
	for line, off := 1, 0; off < len(data); line++ {
		next := bytes.IndexByte(data[off:], '\n') + off + 1
		if next == off { // the last line has no newline
			next = len(data)
		}
		l := bytes.TrimRight(data[off:next], "\r\n")
		ind := len(l) - len(bytes.TrimLeft(l, " "))
		body := l[ind:]
		switch {
		case ind == 0 && (bytes.HasPrefix(l, []byte("---")) || bytes.HasPrefix(l, []byte("...")) || bytes.HasPrefix(l, []byte("%"))),
			len(body) > 0 && body[0] == '\t':
			return sequence{}, false
		case len(body) == 0 || body[0] == '#':
			// blank or a comment: in whatever holds it
		case indent >= 0 && ind > indent:
			// inside an item
		case indent >= 0 && ind == indent && isItem(body):
			cur.items = append(cur.items, off)
		case keyLine > 0 && isItem(body):
			indent, cur = ind, sequence{keyLine: keyLine, items: []int{off}}
			keyLine = 0
		case ind == 0:
			closeSeq(off)
			keyLine = 0
			if isBareKey(l) {
				keyLine = line
			}
		case indent >= 0:
			return sequence{}, false
		default:
			keyLine = 0 // a key's value on lines of their own: not a sequence here
		}
		off = next
	}
	closeSeq(len(data))
	return best, best.items != nil
}

// isItem: a line's text after its indentation starts a sequence item.
func isItem(body []byte) bool {
	return len(body) > 0 && body[0] == '-' && (len(body) == 1 || body[1] == ' ')
}

// isBareKey: a line is a plain key and a colon, then nothing but a comment.
func isBareKey(l []byte) bool {
	i := bytes.IndexByte(l, ':')
	if i <= 0 {
		return false
	}
	for _, c := range l[:i] {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	after := bytes.TrimLeft(l[i+1:], " ")
	return len(after) == 0 || after[0] == '#'
}
