package diagnose

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Qdisc is one queueing discipline's statistics. Drops, Overlimits and
// Requeues are counters; Backlog and Qlen are what is queued now.
type Qdisc struct {
	Ifindex    int    `json:"ifindex"`
	Iface      string `json:"iface"`
	Kind       string `json:"kind"`
	Handle     string `json:"handle"`
	Parent     string `json:"parent"`
	Packets    uint64 `json:"packets"`
	Bytes      uint64 `json:"bytes"`
	Drops      uint64 `json:"drops"`
	Overlimits uint64 `json:"overlimits"`
	Requeues   uint64 `json:"requeues"`
	Backlog    uint64 `json:"backlog_bytes"`
	Qlen       uint64 `json:"qlen"`
	// Limit is the queue's size, in LimitUnit ("packets" or "bytes"), for
	// the kinds whose options carry one; FlowLimit is fq's per-flow limit.
	Limit     uint64 `json:"limit,omitempty"`
	LimitUnit string `json:"limit_unit,omitempty"`
	FlowLimit uint64 `json:"flow_limit,omitempty"`
	// Extra holds the kind-specific counters (TCA_XSTATS), e.g. fq's
	// flows_plimit: drops because one flow had flow_limit packets queued.
	Extra map[string]uint64 `json:"extra,omitempty"`
}

// Qdiscs dumps every qdisc of the current network namespace.
// vishvananda/netlink decodes the generic statistics but not the
// kind-specific TCA_XSTATS nor the limits, which are what a diagnosis
// needs, so the dump is decoded here from its raw messages.
func Qdiscs() ([]Qdisc, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETQDISC, unix.NLM_F_DUMP)
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL})
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWQDISC)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("dump qdiscs: %w", err)
	}
	out := make([]Qdisc, 0, len(msgs))
	for _, m := range msgs {
		q, err := ParseQdisc(m)
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, nil
}

// ParseQdisc decodes one RTM_NEWQDISC message body: struct tcmsg, then
// attributes.
func ParseQdisc(b []byte) (Qdisc, error) {
	if len(b) < nl.SizeofTcMsg {
		return Qdisc{}, fmt.Errorf("qdisc message of %d bytes, shorter than struct tcmsg", len(b))
	}
	msg := nl.DeserializeTcMsg(b)
	q := Qdisc{Ifindex: int(msg.Ifindex), Handle: handleString(msg.Handle), Parent: handleString(msg.Parent)}
	attrs, err := nl.ParseRouteAttr(b[nl.SizeofTcMsg:])
	if err != nil {
		return q, fmt.Errorf("qdisc on ifindex %d: %w", q.Ifindex, err)
	}
	var options, xstats []byte
	for _, a := range attrs {
		switch a.Attr.Type {
		case nl.TCA_KIND:
			q.Kind = cString(a.Value)
		case nl.TCA_OPTIONS:
			options = a.Value
		case nl.TCA_XSTATS:
			xstats = a.Value
		case nl.TCA_STATS2:
			if err := q.parseStats2(a.Value); err != nil {
				return q, fmt.Errorf("qdisc %s on ifindex %d: %w", q.Kind, q.Ifindex, err)
			}
		}
	}
	q.parseOptions(options)
	q.Extra = parseXstats(q.Kind, xstats)
	return q, nil
}

func (q *Qdisc) parseStats2(b []byte) error {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	for _, a := range attrs {
		v := a.Value
		switch a.Attr.Type {
		case nl.TCA_STATS_BASIC: // struct gnet_stats_basic: u64 bytes, u32 packets
			if len(v) >= 12 {
				q.Bytes = le.Uint64(v)
				if q.Packets == 0 {
					q.Packets = uint64(le.Uint32(v[8:]))
				}
			}
		case nl.TCA_STATS_PKT64: // the packet count past 2^32
			if len(v) >= 8 {
				q.Packets = le.Uint64(v)
			}
		case nl.TCA_STATS_QUEUE: // struct gnet_stats_queue
			if len(v) >= 20 {
				q.Qlen = uint64(le.Uint32(v))
				q.Backlog = uint64(le.Uint32(v[4:]))
				q.Drops = uint64(le.Uint32(v[8:]))
				q.Requeues = uint64(le.Uint32(v[12:]))
				q.Overlimits = uint64(le.Uint32(v[16:]))
			}
		}
	}
	return nil
}

// parseOptions reads the queue limit of the kinds that have one.
func (q *Qdisc) parseOptions(b []byte) {
	le := binary.LittleEndian
	switch q.Kind {
	case "pfifo", "bfifo": // struct tc_fifo_qopt { u32 limit; }
		if len(b) >= 4 {
			q.Limit, q.LimitUnit = uint64(le.Uint32(b)), "packets"
			if q.Kind == "bfifo" {
				q.LimitUnit = "bytes"
			}
		}
	case "tbf": // TCA_TBF_PARMS: two struct tc_ratespec (12 bytes each), then u32 limit
		for _, a := range nested(b) {
			if a.Attr.Type == nl.TCA_TBF_PARMS && len(a.Value) >= 28 {
				q.Limit, q.LimitUnit = uint64(le.Uint32(a.Value[24:])), "bytes"
			}
		}
	case "fq":
		for _, a := range nested(b) {
			if len(a.Value) < 4 {
				continue
			}
			switch a.Attr.Type {
			case nl.TCA_FQ_PLIMIT:
				q.Limit, q.LimitUnit = uint64(le.Uint32(a.Value)), "packets"
			case nl.TCA_FQ_FLOW_PLIMIT:
				q.FlowLimit = uint64(le.Uint32(a.Value))
			}
		}
	}
}

// xstatsFields names the leading fields of the TCA_XSTATS structs a
// diagnosis uses, in order, with their sizes (struct tc_fq_qd_stats,
// struct tc_fq_codel_xstats).
var xstatsFields = map[string][]struct {
	name string
	size int
}{
	"fq": {{"gc_flows", 8}, {"highprio_packets", 8}, {"tcp_retrans", 8}, {"throttled", 8},
		{"flows_plimit", 8}, {"pkts_too_long", 8}, {"allocation_errors", 8}},
	"fq_codel": {{"type", 4}, {"maxpacket", 4}, {"drop_overlimit", 4}, {"ecn_mark", 4},
		{"new_flow_count", 4}, {"new_flows_len", 4}, {"old_flows_len", 4}, {"ce_mark", 4},
		{"memory_usage", 4}, {"drop_overmemory", 4}},
}

func parseXstats(kind string, b []byte) map[string]uint64 {
	fields, ok := xstatsFields[kind]
	if !ok || len(b) == 0 {
		return nil
	}
	out := map[string]uint64{}
	le := binary.LittleEndian
	off := 0
	for _, f := range fields {
		if off+f.size > len(b) {
			break
		}
		if f.size == 8 {
			out[f.name] = le.Uint64(b[off:])
		} else {
			out[f.name] = uint64(le.Uint32(b[off:]))
		}
		off += f.size
	}
	delete(out, "type")
	return out
}

func nested(b []byte) []syscall.NetlinkRouteAttr {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return nil
	}
	return attrs
}

// handleString prints a handle as tc does.
func handleString(h uint32) string {
	if h == netlink.HANDLE_ROOT {
		return "root"
	}
	if h&0xffff == 0 {
		return fmt.Sprintf("%x:", h>>16)
	}
	return fmt.Sprintf("%x:%x", h>>16, h&0xffff)
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
