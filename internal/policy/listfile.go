package policy

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// ReadListFile reads a prefix list: one CIDR prefix or address per line,
// '#' starts a comment, blank lines are ignored.
func ReadListFile(path string) ([]netip.Prefix, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("list file %s: %w", path, err)
	}
	defer f.Close()
	var out []netip.Prefix
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		pfx, err := ParsePrefix(text)
		if err != nil {
			return nil, &Error{File: path, Line: line, Msg: err.Error()}
		}
		out = append(out, pfx)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("list file %s: %w", path, err)
	}
	return out, nil
}
