package crowdsec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// parseStream walks a decision stream answer held in memory and calls each
// for every decision of "new" and "deleted". A startup answer of 1M
// decisions is some 140 MB; encoding/json took 3.2 s over it here (a
// Decoder scans each value twice and reflects into every field), this
// scanner of flat objects a fraction of that. It checks the JSON it reads:
// anything but an object of arrays of flat objects is an error, nothing is
// applied, and strings with escapes are unquoted by encoding/json.
func parseStream(b []byte, each func(key string, w *wire)) error {
	s := &scanner{b: b}
	seen := map[string]bool{}
	if err := s.expect('{'); err != nil {
		return err
	}
	for first := true; ; first = false {
		if s.peek() == '}' {
			s.i++
			break
		}
		if !first {
			if err := s.expect(','); err != nil {
				return err
			}
		}
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		// Keys match as encoding/json matches them: case aside.
		switch {
		case strings.EqualFold(key, "new"):
			key = "new"
		case strings.EqualFold(key, "deleted"):
			key = "deleted"
		default:
			if err := s.skip(); err != nil {
				return err
			}
			continue
		}
		if seen[key] {
			return fmt.Errorf("%w: %q", errDuplicate, key)
		}
		seen[key] = true
		if s.literal("null") {
			continue
		}
		if err := s.expect('['); err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
		for n := 0; ; n++ {
			if s.peek() == ']' {
				s.i++
				break
			}
			if n > 0 {
				if err := s.expect(','); err != nil {
					return fmt.Errorf("%q: %w", key, err)
				}
			}
			var w wire
			if err := s.decision(&w); err != nil {
				return fmt.Errorf("%q: decision %d: %w", key, n+1, err)
			}
			each(key, &w)
		}
	}
	if s.peek(); s.i != len(s.b) {
		return fmt.Errorf("offset %d: more after the answer's object", s.i)
	}
	return nil
}

type scanner struct {
	b    []byte
	i    int
	seen map[string]*string
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// peek skips whitespace and returns the next byte, 0 at the end.
func (s *scanner) peek() byte {
	for s.i < len(s.b) && isSpace(s.b[s.i]) {
		s.i++
	}
	if s.i == len(s.b) {
		return 0
	}
	return s.b[s.i]
}

func (s *scanner) expect(c byte) error {
	if got := s.peek(); got != c {
		if got == 0 {
			return fmt.Errorf("the answer ends where %q is due", c)
		}
		return fmt.Errorf("offset %d: want %q, got %q", s.i, c, got)
	}
	s.i++
	return nil
}

func (s *scanner) literal(lit string) bool {
	s.peek()
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

var errDuplicate = errors.New("the answer gives a list twice")

var errString = errors.New("a string is not closed, or holds a control character")

// raw reads a string without copying it: its bytes, and whether they
// must be unquoted (escapes, or bytes that are not UTF-8, which
// encoding/json turns into U+FFFD).
func (s *scanner) raw() ([]byte, bool, error) {
	if err := s.expect('"'); err != nil {
		return nil, false, err
	}
	start, escaped := s.i, false
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '\\':
			escaped = true
			s.i++
		case c == '"':
			s.i++
			raw := s.b[start : s.i-1]
			return raw, escaped || !utf8.Valid(raw), nil
		case c < 0x20:
			return nil, false, errString
		}
	}
	return nil, false, errString
}

// str reads a string as encoding/json would.
func (s *scanner) str() (string, error) {
	start := s.i
	raw, unquote, err := s.raw()
	if err != nil || !unquote {
		return string(raw), err
	}
	var out string
	err = json.Unmarshal(s.b[start:s.i], &out)
	return out, err
}

// text reads a string: shared when it is one seen before (origins,
// scopes and types repeat a million times in a startup answer).
func (s *scanner) text(seen map[string]*string) (*string, error) {
	start := s.i
	raw, unquote, err := s.raw()
	if err != nil {
		return nil, err
	}
	if !unquote {
		if p, ok := seen[string(raw)]; ok {
			return p, nil
		}
		v := string(raw)
		if len(seen) < 1024 {
			seen[v] = &v
		}
		return &v, nil
	}
	var out string
	err = json.Unmarshal(s.b[start:s.i], &out)
	return &out, err
}

// skip passes over any value, nested or not.
func (s *scanner) skip() error {
	switch c := s.peek(); c {
	case '"':
		start := s.i
		_, unquote, err := s.raw()
		if err == nil && unquote && !json.Valid(s.b[start:s.i]) {
			err = fmt.Errorf("offset %d: a string with a bad escape", start)
		}
		return err
	case '{', '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		s.i++
		for n := 0; ; n++ {
			if s.peek() == end {
				s.i++
				return nil
			}
			if n > 0 {
				if err := s.expect(','); err != nil {
					return err
				}
			}
			if c == '{' {
				if _, err := s.str(); err != nil {
					return err
				}
				if err := s.expect(':'); err != nil {
					return err
				}
			}
			if err := s.skip(); err != nil {
				return err
			}
		}
	case 0:
		return errors.New("the answer ends where a value is due")
	}
	start := s.i
	for s.i < len(s.b) && (s.b[s.i] == '-' || s.b[s.i] == '+' || s.b[s.i] == '.' || s.b[s.i] >= '0' && s.b[s.i] <= '9' || s.b[s.i] >= 'a' && s.b[s.i] <= 'z' || s.b[s.i] == 'E') {
		s.i++
	}
	if start == s.i || !json.Valid(s.b[start:s.i]) {
		return fmt.Errorf("offset %d: not a JSON value", start)
	}
	return nil
}

// decision reads one flat decision object; fields it does not use are
// skipped whatever they hold.
func (s *scanner) decision(w *wire) error {
	if s.seen == nil {
		s.seen = map[string]*string{}
	}
	if err := s.expect('{'); err != nil {
		return err
	}
	for n := 0; ; n++ {
		if s.peek() == '}' {
			s.i++
			return nil
		}
		if n > 0 {
			if err := s.expect(','); err != nil {
				return err
			}
		}
		start := s.i
		key, unquote, err := s.raw()
		if err != nil {
			return err
		}
		if unquote {
			k, err := (&scanner{b: s.b[start:s.i]}).str()
			if err != nil {
				return err
			}
			key = []byte(k)
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		var to **string
		shared := false // repeated names, not addresses
		switch {
		case bytes.EqualFold(key, keyOrigin):
			to, shared = &w.Origin, true
		case bytes.EqualFold(key, keyScope):
			to, shared = &w.Scope, true
		case bytes.EqualFold(key, keyType):
			to, shared = &w.Type, true
		case bytes.EqualFold(key, keyValue):
			to = &w.Value
		case bytes.EqualFold(key, keyDuration):
			to = &w.Duration
		case bytes.EqualFold(key, keyID):
			if s.literal("null") {
				continue
			}
			s.peek()
			start := s.i
			if err := s.skip(); err != nil {
				return err
			}
			if w.ID, err = strconv.ParseInt(string(s.b[start:s.i]), 10, 64); err != nil {
				return fmt.Errorf("id %q: %w", s.b[start:s.i], err)
			}
			continue
		}
		if to == nil || s.peek() != '"' {
			if s.literal("null") {
				continue
			}
			if to != nil {
				return fmt.Errorf("%q: want a string", key)
			}
			if err := s.skip(); err != nil {
				return err
			}
			continue
		}
		if shared {
			if *to, err = s.text(s.seen); err != nil {
				return err
			}
			continue
		}
		v, err := s.str()
		if err != nil {
			return err
		}
		*to = &v
	}
}

var (
	keyOrigin   = []byte("origin")
	keyScope    = []byte("scope")
	keyType     = []byte("type")
	keyValue    = []byte("value")
	keyDuration = []byte("duration")
	keyID       = []byte("id")
)
