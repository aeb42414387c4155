package yamlpos

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestSyntaxErrorLine: a syntax error names its line, the first one too
// (yaml.v3 alone says one line early, or nothing on the first).
func TestSyntaxErrorLine(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"a: [\n", "f.yaml:1: syntax:"},
		{"a: 1\nb:\n  - c: 1\n   d: 2\n", "f.yaml:4: syntax:"},
		{"\xef\xbb\xbfa: 1\nb: {\n", "f.yaml:2: syntax:"},
	} {
		var n yaml.Node
		err := NewDecoder("f.yaml", []byte(c.text)).Decode(&n)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: %v, want %s…", c.text, err, c.want)
		}
	}
}

// TestFields: unknown and duplicate keys are refused at the key's line.
func TestFields(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"a: 1\nc: 2\n", `f.yaml:2: top: unknown key "c" (allowed: a, b)`},
		{"a: 1\nb: 2\na: 3\n", `f.yaml:3: top: key "a" given twice`},
		{"- a\n", "f.yaml:1: top: must be a mapping of keys to values"},
	} {
		var n yaml.Node
		if err := NewDecoder("f.yaml", []byte(c.text)).Decode(&n); err != nil {
			t.Fatal(err)
		}
		if _, err := Fields("f.yaml", n.Content[0], "top", "a", "b"); err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %s", c.text, err, c.want)
		}
	}
}
