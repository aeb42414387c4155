package tune

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
)

// Side is the CPUs one kind of traffic's interrupts get.
type Side struct {
	Ifaces []string `json:"ifaces"` // bonds resolved to their slaves
	CPUs   string   `json:"cpus"`
	Nodes  []int    `json:"nodes"`
	Queues int      `json:"queues"` // queues with interrupts
}

// Assignment is one queue interrupt's CPUs.
type Assignment struct {
	Side  string `json:"side"`
	Iface string `json:"iface"`
	Queue int    `json:"queue"`
	IRQ   int    `json:"irq"`
	Name  string `json:"name"`
	CPUs  string `json:"cpus"`
}

// QueueCPUs is the RPS (receive) or XPS (transmit) CPUs of one queue; ""
// is none.
type QueueCPUs struct {
	Iface string `json:"iface"`
	Queue int    `json:"queue"`
	CPUs  string `json:"cpus"`
}

// IRQPlan keeps external and internal traffic's interrupts and packet
// processing on disjoint CPUs.
type IRQPlan struct {
	External    Side         `json:"external"`
	Internal    Side         `json:"internal"`
	Assignments []Assignment `json:"assignments"`
	RPS         []QueueCPUs  `json:"rps"`
	XPS         []QueueCPUs  `json:"xps"`
	IRQBalance  bool         `json:"irqbalance_running"`
	Notes       []string     `json:"notes"`
	maskWords   int
}

// PlanIRQ splits m's CPUs between the external NICs (named first in
// m.NICs, nExternal of them) and the internal ones: by NUMA node when there
// are several (each side on its NICs' node), otherwise by cores, SMT
// siblings never split between the sides. Each side's queue interrupts are
// spread one queue per CPU before any CPU takes a second, physical cores
// before their siblings, on the NIC's node where the side has CPUs there.
func PlanIRQ(m *Machine, nExternal int) (*IRQPlan, error) {
	p := &IRQPlan{IRQBalance: m.IRQBalance, Notes: []string{}, maskWords: m.MaskWords, Assignments: []Assignment{}, RPS: []QueueCPUs{}, XPS: []QueueCPUs{}}
	ext, in := m.NICs[:nExternal], m.NICs[nExternal:]
	for _, n := range m.NICs {
		if !n.Up {
			p.Notes = append(p.Notes, fmt.Sprintf("%s is down: planned too, so its queues are in place when it comes up", n.Name))
		}
	}
	extCPUs, inCPUs, note, err := splitCPUs(m, ext, in)
	if err != nil {
		return nil, err
	}
	if note != "" {
		p.Notes = append(p.Notes, note)
	}
	if len(m.Isolated) > 0 {
		p.Notes = append(p.Notes, "isolated CPUs "+m.Isolated.List()+" are left out")
	}
	if m.IRQBalance {
		p.Notes = append(p.Notes, "irqbalance is running and would move these interrupts: apply with --irqbalance ban (it leaves them alone) or --irqbalance stop")
	}
	p.External = p.side(m, "external", ext, extCPUs)
	p.Internal = p.side(m, "internal", in, inCPUs)
	return p, nil
}

// queuesWithIRQs counts distinct queues that have an interrupt.
func queuesWithIRQs(n NIC) int {
	seen := map[int]bool{}
	for _, q := range n.IRQs {
		seen[q.Queue] = true
	}
	return len(seen)
}

func (p *IRQPlan) side(m *Machine, name string, nics []NIC, cpus CPUSet) Side {
	s := Side{CPUs: cpus.List(), Nodes: []int{}}
	byID := map[int]CPU{}
	for _, c := range m.CPUs {
		byID[c.ID] = c
	}
	for _, id := range cpus {
		if !slices.Contains(s.Nodes, byID[id].Node) {
			s.Nodes = append(s.Nodes, byID[id].Node)
		}
	}
	sort.Ints(s.Nodes)
	for _, n := range nics {
		s.Ifaces = append(s.Ifaces, n.Name)
		s.Queues += queuesWithIRQs(n)
	}
	// Spread order: the first thread of every core, then the second…
	order := slices.Clone(cpus)
	rank := func(id int) int { return slices.Index(byID[id].Siblings, id) }
	sort.SliceStable(order, func(i, j int) bool { return rank(order[i]) < rank(order[j]) })
	bound := int(math.Ceil(float64(s.Queues)/float64(len(cpus)))) + 1
	load := map[int]int{}
	leastLoaded := func(among []int) int {
		best := -1
		for _, c := range among {
			if best < 0 || load[c] < load[best] {
				best = c
			}
		}
		return best
	}
	for _, n := range nics {
		var local []int
		for _, c := range order {
			if n.Node >= 0 && byID[c].Node == n.Node {
				local = append(local, c)
			}
		}
		cpuOf := map[int]int{}
		for _, q := range n.IRQs {
			c, ok := cpuOf[q.Queue]
			if !ok {
				c = leastLoaded(local)
				if c < 0 || load[c]+1 > bound {
					c = leastLoaded(order)
				}
				cpuOf[q.Queue] = c
				load[c]++
			}
			p.Assignments = append(p.Assignments, Assignment{Side: name, Iface: n.Name, Queue: q.Queue, IRQ: q.IRQ, Name: q.Name, CPUs: CPUSet{c}.List()})
		}
		// RPS spreads in software what the NIC cannot: a NIC with one
		// queue interrupt or none (veth, single-queue virtio) gets the
		// side's CPUs; RSS spreads the others, RPS off.
		rps := ""
		if len(cpuOf) < 2 {
			rps = cpus.List()
		}
		for q := range n.RxQueues {
			p.RPS = append(p.RPS, QueueCPUs{Iface: n.Name, Queue: q, CPUs: rps})
		}
		// XPS: every CPU sends on one queue of the NIC, the queue whose
		// interrupt it serves if any, else the next in turn.
		if n.HasXPS && n.TxQueues > 0 {
			xps := make([]CPUSet, n.TxQueues)
			mapped := CPUSet{}
			for _, q := range slices.Sorted(maps.Keys(cpuOf)) {
				if c := cpuOf[q]; q < n.TxQueues && !slices.Contains(mapped, c) {
					xps[q] = append(xps[q], c)
					mapped = append(mapped, c)
				}
			}
			next := 0
			for _, c := range m.CPUs {
				if !slices.Contains(mapped, c.ID) {
					xps[next%n.TxQueues] = append(xps[next%n.TxQueues], c.ID)
					next++
				}
			}
			for q, set := range xps {
				sort.Ints(set)
				p.XPS = append(p.XPS, QueueCPUs{Iface: n.Name, Queue: q, CPUs: set.List()})
			}
		}
	}
	return s
}

// nodeOf is the NUMA node all of nics sit on, -1 if they do not agree or
// the firmware does not say.
func nodeOf(nics []NIC) int {
	node := -2
	for _, n := range nics {
		switch {
		case n.Node < 0:
			return -1
		case node == -2:
			node = n.Node
		case node != n.Node:
			return -1
		}
	}
	return max(node, -1)
}

func weight(nics []NIC) int {
	w := 0
	for _, n := range nics {
		w += max(queuesWithIRQs(n), 1)
	}
	return w
}

// share is how many of total units the external side gets, in proportion
// to its queues, at least one for each side.
func share(total, wExt, wIn int) int {
	k := int(math.Round(float64(total) * float64(wExt) / float64(wExt+wIn)))
	return min(max(k, 1), total-1)
}

// splitCPUs gives each side its CPUs. The internal side takes the first
// ones: CPU 0 carries the host's housekeeping, which must keep running
// while a flood saturates the external side's CPUs.
func splitCPUs(m *Machine, ext, in []NIC) (extCPUs, inCPUs CPUSet, note string, err error) {
	var nodes []int
	for n, cpus := range m.Nodes {
		if len(cpus) > 0 {
			nodes = append(nodes, n)
		}
	}
	sort.Ints(nodes)
	has := func(n int) bool { return n >= 0 && len(m.Nodes[n]) > 0 }
	pe, pi := nodeOf(ext), nodeOf(in)
	wE, wI := weight(ext), weight(in)
	if len(nodes) >= 2 {
		switch {
		case has(pe) && has(pi) && pe != pi:
			return m.Nodes[pe], m.Nodes[pi], fmt.Sprintf("external on node %d and internal on node %d, their NICs' nodes", pe, pi), nil
		case has(pe) && has(pi):
			e, i, err := splitCores(m, m.Nodes[pe], wE, wI)
			return e, i, fmt.Sprintf("both sides' NICs are on node %d: its cores are split between them", pe), err
		case has(pe) || has(pi):
			known, other := pe, &inCPUs
			if !has(pe) {
				known, other = pi, &extCPUs
			}
			for _, n := range nodes {
				if n != known {
					*other = other.Union(m.Nodes[n])
				}
			}
			if has(pe) {
				extCPUs = m.Nodes[pe]
			} else {
				inCPUs = m.Nodes[pi]
			}
			return extCPUs, inCPUs, fmt.Sprintf("node %d, its NICs' node, for one side; the other nodes for the side whose NICs' node is unknown or mixed", known), nil
		default:
			k := share(len(nodes), wE, wI)
			for j, n := range nodes {
				if j < len(nodes)-k {
					inCPUs = inCPUs.Union(m.Nodes[n])
				} else {
					extCPUs = extCPUs.Union(m.Nodes[n])
				}
			}
			return extCPUs, inCPUs, "the NICs' nodes are unknown or mixed: whole nodes split between the sides by their queues", nil
		}
	}
	var all CPUSet
	for _, c := range m.CPUs {
		all = append(all, c.ID)
	}
	e, i, err := splitCores(m, all, wE, wI)
	return e, i, "one NUMA node: its cores are split between the sides by their queues", err
}

// splitCores splits cpus by whole cores (SMT siblings stay together) in
// proportion to the sides' queues; one core alone is split by threads.
func splitCores(m *Machine, cpus CPUSet, wE, wI int) (CPUSet, CPUSet, error) {
	var cores []CPUSet
	for _, c := range m.CPUs {
		if !slices.Contains(cpus, c.ID) {
			continue
		}
		core := c.Siblings.Intersect(cpus)
		if !slices.ContainsFunc(cores, func(x CPUSet) bool { return slices.Equal(x, core) }) {
			cores = append(cores, core)
		}
	}
	if len(cores) == 1 {
		cores = nil
		for _, c := range cpus {
			cores = append(cores, CPUSet{c})
		}
	}
	if len(cores) < 2 {
		return nil, nil, errors.New("one CPU: external and internal interrupts cannot be put on different CPUs")
	}
	k := share(len(cores), wE, wI)
	var e, i CPUSet
	for j, c := range cores {
		if j < len(cores)-k {
			i = i.Union(c)
		} else {
			e = e.Union(c)
		}
	}
	return e, i, nil
}
