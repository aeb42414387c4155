package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
)

// ErrOtherBuild is a generation whose programs another build of rampart
// loaded: what its maps mean goes with that build's code.
var ErrOtherBuild = errors.New("the programs are another build's")

// ownMaps are the maps a generation made by OverLists has of its own; it
// shares the others (its tables and classifier) with the generation it is
// made over. The settings say which slot a generation is in, counters and
// events are carried from one generation into the next, limits' state
// starts afresh with every generation, and the overlay is what differs.
var ownMaps = map[string]bool{
	filterMapConfigs: true, filterMapCounters: true, filterMapRuleEvents: true, filterMapLimitState: true,
	filterMapLimitSources: true, filterMapOverlayV4: true, filterMapOverlayV6: true, filterMapOverlayLengths: true,
}

// OverLists makes a new generation of live's programs that reads live's
// tables, classifier and rules, the same maps, under an overlay of its own
// holding v4 and v6: a change to the contents of lists, which the overlay
// carries as it carries live changes, with nothing compiled, written into
// a table or verified. Its settings are a copy of live's. It is not live
// until Activate.
func OverLists(live *Objects, v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) (*Objects, error) {
	if !live.ours() {
		return nil, ErrOtherBuild
	}
	spec, err := parsedFilter()
	if err != nil {
		return nil, err
	}
	o := &Objects{}
	if err := live.shareShape(o); err != nil {
		return nil, err
	}
	from := live.generation()
	for i, g := range o.generation() {
		had := *from[i].inner
		if !ownMaps[g.name] {
			*g.inner, err = had.Clone()
		} else {
			ms := spec.Maps[g.name].InnerMap.Copy()
			switch g.name {
			case filterMapOverlayV4:
				ms.MaxEntries = overlayCapacity(len(v4), ms.MaxEntries)
			case filterMapOverlayV6:
				ms.MaxEntries = overlayCapacity(len(v6), ms.MaxEntries)
			default:
				ms.MaxEntries = had.MaxEntries()
			}
			*g.inner, err = ebpf.NewMap(ms)
		}
		if err != nil {
			o.Close()
			return nil, fmt.Errorf("a generation over %s: %w", g.name, err)
		}
	}
	var cfg abi.Config
	if err := live.Configs.Lookup(uint32(0), &cfg); err != nil {
		o.Close()
		return nil, fmt.Errorf("read the live settings: %w", err)
	}
	if err := o.Configs.Put(uint32(0), cfg); err != nil {
		o.Close()
		return nil, fmt.Errorf("write the settings: %w", err)
	}
	// The masks' eqs are shared: a mask's eqs are fixed for the life of
	// the classes, which are live's.
	if err := errors.Join(o.addMaskEqs(v4, v6), o.tables().writeOverlay(v4, v6, true, [2]grower{})); err != nil {
		o.Close()
		return nil, fmt.Errorf("write the overlay: %w", err)
	}
	return o, nil
}
