package engine

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/abi"
)

// TestRecordDropsTrailingZeros: a generation's record ends its carried
// counts at the last that is not zero, and what the next generation
// carries from it is what it would carry from the whole.
func TestRecordDropsTrailingZeros(t *testing.T) {
	fw := &Firewall{stateRoot: t.TempDir()}
	h := Hook{Iface: "eth0"}
	rules := []RuleInfo{{Name: "a", Match: "proto=17", Action: "drop"}, {Name: "b", Match: "proto=6", Action: "pass"}, {Name: "c", Match: "", Action: "pass"}}
	g := generation{N: 3, Mode: "tc", AppliedAt: time.Now(), Rules: rules,
		Carried:       make([]abi.Counter, abi.SlotRule0+len(rules)),
		CarriedEvents: make([]abi.RuleEvents, len(rules))}
	g.Carried[0].Packets = 7
	g.Carried[abi.SlotRule0+1] = abi.Counter{Packets: 2, Bytes: 120}
	if err := fw.writeGen(h, &g); err != nil {
		t.Fatal(err)
	}
	back, err := fw.readGen(h, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Carried) != abi.SlotRule0+2 || len(back.CarriedEvents) != 0 {
		t.Errorf("record holds %d counts and %d events, want %d and 0", len(back.Carried), len(back.CarriedEvents), abi.SlotRule0+2)
	}
	if len(g.Carried) != abi.SlotRule0+len(rules) {
		t.Errorf("writing cut the generation's own counts to %d", len(g.Carried))
	}
	next := []RuleInfo{rules[2], rules[1], rules[0]}
	whole := &generation{Rules: next}
	addCounts(whole, carryIndex(g.Rules, next), g.Carried, g.CarriedEvents)
	trimmed := &generation{Rules: next}
	addCounts(trimmed, carryIndex(back.Rules, next), back.Carried, back.CarriedEvents)
	if !reflect.DeepEqual(whole.Carried, trimmed.Carried) || !reflect.DeepEqual(whole.CarriedEvents, trimmed.CarriedEvents) {
		t.Errorf("carried from the record %+v %+v, from the whole %+v %+v", trimmed.Carried, trimmed.CarriedEvents, whole.Carried, whole.CarriedEvents)
	}
	if trimmed.Carried[abi.SlotRule0+1] != (abi.Counter{Packets: 2, Bytes: 120}) {
		t.Errorf("rule b carried %+v", trimmed.Carried[abi.SlotRule0+1])
	}
}

// TestCarryFromKeyRecords: a record of a release that kept the match keys
// themselves carries its counts to a generation that keeps their digests,
// and back (a rollback to it).
func TestCarryFromKeyRecords(t *testing.T) {
	keys := []RuleInfo{{Name: "a", Match: "src=;dst=;family=0;proto=17;action=drop"}, {Name: "b", Match: "src=;dst=;family=0;proto=6;action=pass"}}
	digests := []RuleInfo{{Name: "b", Match: matchDigest(keys[1].Match)}, {Name: "a", Match: matchDigest(keys[0].Match)}, {Name: "a", Match: matchDigest("src=;dst=;family=0;proto=1;action=drop")}}
	if got := carryIndex(keys, digests); !reflect.DeepEqual(got, []int{1, 0, -1}) {
		t.Errorf("keys to digests: %v, want [1 0 -1]", got)
	}
	if got := carryIndex(digests, keys); !reflect.DeepEqual(got, []int{1, 0}) {
		t.Errorf("digests to keys: %v, want [1 0]", got)
	}
	if d := matchDigest(keys[0].Match); len(d) != 16 || strings.Contains(d, "=") {
		t.Errorf("digest %q", d)
	}
}
