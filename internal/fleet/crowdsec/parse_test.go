package crowdsec

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// viaJSON is parseStream's reference: encoding/json over the same text.
func viaJSON(b []byte) (map[string][]wire, error) {
	var top struct{ New, Deleted json.RawMessage }
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("not an object") // json reads null into a struct
	}
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, err
	}
	out := map[string][]wire{}
	for k, raw := range map[string]json.RawMessage{"new": top.New, "deleted": top.Deleted} {
		if raw != nil {
			var ws []wire
			if err := json.Unmarshal(raw, &ws); err != nil {
				return nil, err
			}
			out[k] = ws
		}
	}
	return out, nil
}

func viaScanner(b []byte) (map[string][]wire, error) {
	out := map[string][]wire{}
	err := parseStream(b, func(k string, w *wire) { out[k] = append(out[k], *w) })
	return out, err
}

func same(a, b map[string][]wire) bool {
	for _, k := range []string{"new", "deleted"} {
		if len(a[k]) != len(b[k]) {
			return false
		}
		for i := range a[k] {
			if !reflect.DeepEqual(a[k][i], b[k][i]) {
				return false
			}
		}
	}
	return true
}

var parseSeeds = []string{
	`{"deleted":null,"new":null}`,
	`{"new":[{"duration":"1h","id":1,"origin":"cscli","scenario":"manual \"ban\" from 'x'","scope":"Ip","type":"ban","value":"192.0.2.7","simulated":false,"until":"2026-11-24T12:00:00Z","uuid":"a-b"}],"deleted":[]}`,
	" {\n \"new\" : [ { \"id\" : 7 , \"value\" : \"2001:db8::/32\" , \"extra\" : {\"a\":[1,2.5e3,{\"b\":null}]} } ] } ",
	`{"new":[{"id":1,"value":"\u0031.2.3.4"}]}`,
	`{"new":[{"id":1,"scope":5}]}`,
	`{"new":[{"id":1.5}]}`,
	`{"new":{"id":1}}`,
	`{"new":[{"id":1}]}{}`,
	`{"new":[{"id":1,"value":null,"type":null}],"x":nan}`,
	`{"new":[{"id":1}`,
	`[]`,
	`{"a":"\x01"}`,
	`{"new":[{"id":1,"id":2,"value":"a","value":"b"}]}`,
	`{"NEW":[{"ID":3,"Value":"192.0.2.1","durAtion":"1h"}]}`,
}

// TestParseAgreesWithJSON: the scanner and encoding/json read the same
// decisions from every seed, and refuse the same texts.
func TestParseAgreesWithJSON(t *testing.T) {
	for _, s := range parseSeeds {
		want, werr := viaJSON([]byte(s))
		got, gerr := viaScanner([]byte(s))
		if (werr == nil) != (gerr == nil) || werr == nil && !same(got, want) {
			t.Errorf("%s\nscanner %+v, %v\nencoding/json %+v, %v", s, got, gerr, want, werr)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, werr := viaJSON(b)
		got, gerr := viaScanner(b)
		if gerr == nil && !json.Valid(b) {
			t.Fatalf("the scanner took text that is not JSON: %q", b)
		}
		if werr == nil && gerr == nil && !same(got, want) {
			t.Fatalf("%q: scanner %+v, encoding/json %+v", b, got, want)
		}
		if werr == nil && gerr != nil && !errors.Is(gerr, errDuplicate) {
			t.Fatalf("%q: encoding/json read it, the scanner refused: %v", b, gerr)
		}
	})
}
