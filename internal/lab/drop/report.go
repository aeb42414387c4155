package drop

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/rampart-fw/rampart/internal/lab"
)

// Result is one row: a layer and a family.
type Result struct {
	Layer          string  `json:"layer"`
	Family         int     `json:"family"`
	Status         string  `json:"status"`
	Reason         string  `json:"reason,omitempty"`
	Mode           string  `json:"mode,omitempty"` // where the drop happened, e.g. the XDP mode the kernel reports
	MPPS           float64 `json:"mpps"`           // median of the windows, million packets dropped per second
	MPPSMin        float64 `json:"mpps_min"`
	MPPSMax        float64 `json:"mpps_max"`
	OfferedMPPS    float64 `json:"offered_mpps"`  // what the generator sent
	SetupSeconds   float64 `json:"setup_seconds"` // to set the layer up, its list loaded (median)
	IfaceRxMPPS    float64 `json:"iface_rx_mpps"` // what the receiving veth counted in
	CPUBusy        float64 `json:"cpu_busy"`      // receiving CPU, percent
	NsPerPacket    float64 `json:"ns_per_packet"` // receiving CPU time per dropped packet
	GeneratorBound bool    `json:"generator_bound"`
	Packets        uint64  `json:"packets"` // the layer's counter over all windows
	StudyMPPS      float64 `json:"study_mpps,omitempty"`
}

// Env is what the numbers depend on.
type Env struct {
	Kernel       string `json:"kernel"`
	JIT          bool   `json:"bpf_jit"`
	CPUModel     string `json:"cpu_model"`
	CPUs         int    `json:"cpus"`
	GeneratorCPU int    `json:"generator_cpu"`
	ReceiveCPU   int    `json:"receive_cpu"`
	AppCPU       int    `json:"app_cpu"`
	BatchSize    int    `json:"generator_batch"`
	Warmup       string `json:"warmup"`
	Window       string `json:"window"`
	Repeats      int    `json:"repeats"`
	Sources      int    `json:"list_size"` // the flood's sources, the list-based layers' list
	Src4         string `json:"sources_v4"`
	Src6         string `json:"sources_v6"`
	Iptables     string `json:"iptables"`
	// Unlisted: the list held none of the flood's sources (--unlisted).
	Unlisted bool `json:"unlisted,omitempty"`
	// Emulated: the CPU is a QEMU model, as in the kernel tier's guests:
	// the rates prove the layers work, they are no performance figures.
	Emulated bool `json:"emulated,omitempty"`
}

// Report is the whole run.
type Report struct {
	Env      Env         `json:"environment"`
	Results  []Result    `json:"results"`
	Checks   []lab.Check `json:"checks"`
	Ordering []string    `json:"ordering"` // where the order differs from the study's, and why
}

func (r *Report) find(layer string, family int) *Result {
	for i := range r.Results {
		if x := &r.Results[i]; x.Layer == layer && x.Family == family && x.Status == lab.StatusOK && x.MPPS > 0 {
			return x
		}
	}
	return nil
}

// finish computes the targets and the comparison with the study's order.
func (r *Report) finish() {
	r.Checks, r.Ordering = []lab.Check{}, []string{}
	for _, fam := range []int{4, 6} {
		native, rp, raw := r.find("xdp-native", fam), r.find("rampart", fam), r.find("iptables-raw", fam)
		if native != nil && rp != nil {
			v := rp.MPPS / native.MPPS
			r.Checks = append(r.Checks, lab.Check{Name: "rampart drop rate / xdp-native", Family: fam, Value: v, Target: ">= 0.95", Met: v >= 0.95})
			if native.NsPerPacket > 0 {
				v = rp.NsPerPacket / native.NsPerPacket
				r.Checks = append(r.Checks, lab.Check{Name: "rampart ns/packet / xdp-native", Family: fam, Value: v, Target: "<= 1.2", Met: v <= 1.2})
			}
		}
		if peer := r.bestListPeer(fam); rp != nil && peer != nil && peer.NsPerPacket > 0 {
			v := rp.NsPerPacket / peer.NsPerPacket
			r.Checks = append(r.Checks, lab.Check{Name: "rampart ns/packet / best list peer's (" + peer.Layer + ")", Family: fam, Value: v, Target: "<= 0.33", Met: v <= 1.0/3})
		}
		// The floor is one miss at the tables' footprint and a drop: what
		// rampart's row costs over it is the rest of its lookup and rules.
		if floor := r.find(floorLayer, fam); rp != nil && floor != nil && floor.NsPerPacket > 0 {
			v := rp.NsPerPacket / floor.NsPerPacket
			name := "rampart ns/packet / " + floorLayer
			if r.Env.Unlisted {
				name += ", unlisted sources"
			}
			r.Checks = append(r.Checks, lab.Check{Name: name, Family: fam, Value: v, Target: "<= 1.1", Met: v <= 1.1})
		}
		if native != nil && raw != nil {
			v := native.MPPS / raw.MPPS
			r.Checks = append(r.Checks, lab.Check{Name: "xdp-native / iptables-raw", Family: fam, Value: v, Target: ">= 4", Met: v >= 4})
			// A generator-bound xdp-native row's rate is a floor; what each
			// packet costs the receiving CPU still compares capacities.
			if native.GeneratorBound && native.NsPerPacket > 0 {
				v = raw.NsPerPacket / native.NsPerPacket
				r.Checks = append(r.Checks, lab.Check{Name: "xdp-native / iptables-raw capacity (ns/packet ratio)", Family: fam, Value: v, Target: ">= 4", Met: v >= 4})
			}
		}
		r.Ordering = append(r.Ordering, r.orderNotes(fam)...)
	}
}

// bestListPeer is the list-based layer that dropped for the least
// receiving-CPU time per packet.
func (r *Report) bestListPeer(fam int) *Result {
	var best *Result
	for _, name := range listPeers {
		if x := r.find(name, fam); x != nil && x.NsPerPacket > 0 && (best == nil || x.NsPerPacket < best.NsPerPacket) {
			best = x
		}
	}
	return best
}

// orderNotes compares, pair by pair, the layers the study measured with
// the study's own order, and says for each inversion what the run shows
// about it.
func (r *Report) orderNotes(fam int) []string {
	type ranked struct {
		*Result
		study float64
	}
	var rows []ranked
	for _, l := range layers {
		if x := r.find(l.name, fam); x != nil && l.study > 0 {
			rows = append(rows, ranked{x, l.study})
		}
	}
	var notes []string
	for i := range rows {
		for j := i + 1; j < len(rows); j++ {
			a, b := rows[i], rows[j]
			sa, sb := a.study, b.study
			if (sa < sb) == (a.MPPS < b.MPPS) {
				continue
			}
			why := "the ranges do not overlap: a real difference on this machine"
			switch {
			case a.GeneratorBound && b.GeneratorBound:
				why = "both dropped all the generator offered, so the run does not order them"
			case a.MPPSMin <= b.MPPSMax && b.MPPSMin <= a.MPPSMax:
				why = "their min-max ranges overlap: the order is within this run's noise"
			}
			notes = append(notes, fmt.Sprintf("IPv%d: %s %.3f Mpps vs %s %.3f Mpps, the study had %.3f vs %.3f; %s",
				fam, a.Layer, a.MPPS, b.Layer, b.MPPS, sa, sb, why))
		}
	}
	return notes
}

// csvHeader is the CSV's first line, one column per Result field.
var csvHeader = []string{"layer", "family", "status", "reason", "mode", "mpps", "mpps_min", "mpps_max", "offered_mpps",
	"iface_rx_mpps", "cpu_busy", "ns_per_packet", "generator_bound", "packets", "study_mpps", "setup_seconds"}

// WriteCSV writes one line per row.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write(csvHeader)
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, x := range r.Results {
		cw.Write([]string{x.Layer, strconv.Itoa(x.Family), x.Status, x.Reason, x.Mode, f(x.MPPS), f(x.MPPSMin), f(x.MPPSMax),
			f(x.OfferedMPPS), f(x.IfaceRxMPPS), f(x.CPUBusy), f(x.NsPerPacket), strconv.FormatBool(x.GeneratorBound),
			strconv.FormatUint(x.Packets, 10), f(x.StudyMPPS), f(x.SetupSeconds)})
	}
	cw.Flush()
	return cw.Error()
}

// WriteFiles writes drop.json, drop.csv and the chart, drop.png and
// drop.svg, into dir and returns their paths.
func (r *Report) WriteFiles(dir string) ([]string, error) {
	f := &lab.Files{Dir: dir}
	err := errors.Join(f.JSON("drop.json", r), f.CSV("drop.csv", r.WriteCSV), f.Charts("drop", r.Chart))
	return f.Paths, err
}

// families lists the families that have rows, in order.
func (r *Report) families() []int {
	var f []int
	for _, x := range r.Results {
		if !slices.Contains(f, x.Family) {
			f = append(f, x.Family)
		}
	}
	slices.Sort(f)
	return f
}
