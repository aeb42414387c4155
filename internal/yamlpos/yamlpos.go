// Package yamlpos reads YAML files into yaml.v3 nodes so that every error
// names the file, line and field it is about: syntax errors at their line,
// unknown and duplicate keys at the key.
package yamlpos

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"

	goccy "github.com/goccy/go-yaml"
	goccyparser "github.com/goccy/go-yaml/parser"
	"gopkg.in/yaml.v3"
)

// Error is a problem in a file, located by file, line and field.
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
}

func (e *Error) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", loc, e.Field, e.Msg)
	}
	return fmt.Sprintf("%s: %s", loc, e.Msg)
}

// Errorf is an Error at n's line.
func Errorf(file string, n *yaml.Node, field, format string, args ...any) error {
	return &Error{File: file, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Decoder reads the YAML documents of one file.
type Decoder struct {
	file  string
	data  []byte
	dec   *yaml.Decoder
	split int // 0 before the first document; 1 when decodeSplit read it (the only one), else -1
}

var utf8BOM = []byte("\xef\xbb\xbf")

// NewDecoder reads data, the text of file (a byte order mark is skipped).
func NewDecoder(file string, data []byte) *Decoder {
	data = bytes.TrimPrefix(data, utf8BOM)
	return &Decoder{file: file, data: data, dec: yaml.NewDecoder(bytes.NewReader(data))}
}

// Decode reads the next document into n: io.EOF after the last, an Error
// at its line for a syntax error.
func (d *Decoder) Decode(n *yaml.Node) error {
	switch {
	case d.split > 0:
		return io.EOF
	case d.split == 0:
		d.split = -1
		if doc, ok := decodeSplit(d.data, runtime.GOMAXPROCS(0)); ok {
			d.split, *n = 1, *doc
			return nil
		}
	}
	err := d.dec.Decode(n)
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	return d.syntaxError(err)
}

// syntaxError locates a YAML syntax error. yaml.v3, which reads the file
// into nodes, reports a parser error at a 0-based mark (one line early, or
// with no line when it is on the first); goccy/go-yaml's parser, which
// keeps every token's position, locates it instead.
func (d *Decoder) syntaxError(err error) error {
	var se *goccy.SyntaxError
	if _, perr := goccyparser.ParseBytes(d.data, 0); errors.As(perr, &se) && se.Token != nil && se.Token.Position.Line >= 1 {
		n, msg := se.Token.Position.Line, se.Message
		if lines := strings.Split(string(d.data), "\n"); n <= len(lines) && strings.TrimSpace(lines[n-1]) != "" {
			msg += fmt.Sprintf(" (%q)", strings.TrimSpace(lines[n-1]))
		}
		return &Error{File: d.file, Line: n, Field: "syntax", Msg: msg}
	}
	return &Error{File: d.file, Line: 1, Field: "syntax", Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
}

// Fields walks a mapping of file, refusing keys outside allowed and
// duplicate keys with an Error at the key's line; what names the mapping
// in errors.
func Fields(file string, n *yaml.Node, what string, allowed ...string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, Errorf(file, n, what, "must be a mapping of keys to values")
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !slices.Contains(allowed, k.Value) {
			return nil, Errorf(file, k, what, "unknown key %q (allowed: %s)", k.Value, strings.Join(allowed, ", "))
		}
		if _, dup := out[k.Value]; dup {
			return nil, Errorf(file, k, what, "key %q given twice", k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}
