package tune

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// CPU is one online CPU and where it sits.
type CPU struct {
	ID, Package, Core, Node int
	Siblings                CPUSet // its SMT siblings, itself included
}

// QueueIRQ is an interrupt that serves one queue of a NIC (virtio has two
// per queue pair: input and output).
type QueueIRQ struct {
	Queue, IRQ int
	Name       string
}

// NIC is a network interface with its queues and interrupts.
type NIC struct {
	Name       string
	Node       int // NUMA node of its device, -1 when the firmware does not say
	RxQueues   int
	TxQueues   int
	HasXPS     bool // xps_cpus reads: single-queue devices answer ENOENT
	IRQs       []QueueIRQ
	Bond       string // the bond it is a slave of, if any
	Up         bool
	Affinities map[int]CPUSet // current smp_affinity_list of each IRQ
}

// Machine is what the planner reads from a root: CPUs, NUMA nodes and the
// NICs asked for.
type Machine struct {
	CPUs       []CPU  // online and not isolated
	Isolated   CPUSet // left out of every plan
	Nodes      map[int]CPUSet
	MaskWords  int // 32-bit words in a CPU mask (nr_cpu_ids)
	NICs       []NIC
	IRQBalance bool // an irqbalance process runs
}

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// readInt reads a file holding one number; errors name the file.
func readInt(path string) (int, error) {
	s, err := readTrim(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", path, s)
	}
	return n, nil
}

// ReadMachine reads the topology under root and the NICs of ifaces, bonds
// resolved to all their slaves (up or down: a slave that comes back up
// must not find its queues on the other side's CPUs).
func ReadMachine(root string, ifaces []string) (*Machine, error) {
	m := &Machine{Nodes: map[int]CPUSet{}}
	cpuDir := filepath.Join(root, "sys/devices/system/cpu")
	onlineList, err := readTrim(filepath.Join(cpuDir, "online"))
	if err != nil {
		return nil, fmt.Errorf("read the CPUs: %w", err)
	}
	online, err := ParseCPUList(onlineList)
	if err != nil {
		return nil, fmt.Errorf("%s/online: %w", cpuDir, err)
	}
	if s, err := readTrim(filepath.Join(cpuDir, "isolated")); err == nil {
		if m.Isolated, err = ParseCPUList(s); err != nil {
			return nil, fmt.Errorf("%s/isolated: %w", cpuDir, err)
		}
	}
	if len(online) == 0 {
		return nil, fmt.Errorf("%s/online: no CPU is online", cpuDir)
	}
	possible := online
	if s, err := readTrim(filepath.Join(cpuDir, "possible")); err == nil {
		p, err := ParseCPUList(s)
		if err != nil {
			return nil, fmt.Errorf("%s/possible: %w", cpuDir, err)
		}
		if len(p) > 0 {
			possible = p
		}
	}
	m.MaskWords = (possible[len(possible)-1] + 32) / 32
	nodeOf := map[int]int{}
	nodeDirs, _ := filepath.Glob(filepath.Join(root, "sys/devices/system/node/node[0-9]*"))
	for _, d := range nodeDirs {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "node"))
		if err != nil {
			return nil, fmt.Errorf("%s: not a NUMA node's directory (node and a number)", d)
		}
		s, err := readTrim(filepath.Join(d, "cpulist"))
		if err != nil {
			return nil, err
		}
		cpus, err := ParseCPUList(s)
		if err != nil {
			return nil, fmt.Errorf("%s/cpulist: %w", d, err)
		}
		for _, c := range cpus {
			nodeOf[c] = n
		}
	}
	for _, id := range online.Without(m.Isolated) {
		topo := filepath.Join(cpuDir, fmt.Sprintf("cpu%d/topology", id))
		c := CPU{ID: id, Node: nodeOf[id]}
		if c.Package, err = readInt(filepath.Join(topo, "physical_package_id")); err != nil {
			return nil, err
		}
		if c.Core, err = readInt(filepath.Join(topo, "core_id")); err != nil {
			return nil, err
		}
		s, err := readTrim(filepath.Join(topo, "thread_siblings_list"))
		if err != nil {
			return nil, err
		}
		if c.Siblings, err = ParseCPUList(s); err != nil {
			return nil, fmt.Errorf("%s/thread_siblings_list: %w", topo, err)
		}
		m.CPUs = append(m.CPUs, c)
		m.Nodes[c.Node] = append(m.Nodes[c.Node], id)
	}
	if len(m.CPUs) == 0 {
		return nil, errors.New("no online CPU is left once the isolated ones are set aside")
	}
	names, err := readInterruptNames(root)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, name := range ifaces {
		if err := m.addNIC(root, name, "", names, seen); err != nil {
			return nil, err
		}
	}
	m.IRQBalance = irqbalanceRuns(root)
	return m, nil
}

func (m *Machine) addNIC(root, name, bond string, irqNames map[int]string, seen map[string]bool) error {
	if seen[name] {
		return fmt.Errorf("%s is named twice (or is a slave of a bond named too)", name)
	}
	seen[name] = true
	dir := filepath.Join(root, "sys/class/net", name)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("no interface %s (%s)", name, dir)
	}
	if s, err := readTrim(filepath.Join(dir, "bonding/slaves")); err == nil {
		slaves := strings.Fields(s)
		if len(slaves) == 0 {
			return fmt.Errorf("bond %s has no slaves to plan for", name)
		}
		for _, sl := range slaves {
			if err := m.addNIC(root, sl, name, irqNames, seen); err != nil {
				return err
			}
		}
		return nil
	}
	n := NIC{Name: name, Node: -1, Bond: bond, Affinities: map[int]CPUSet{}}
	state, _ := readTrim(filepath.Join(dir, "operstate"))
	n.Up = state == "up" || state == "unknown"
	queues, _ := filepath.Glob(filepath.Join(dir, "queues/*"))
	for _, q := range queues {
		switch {
		case strings.HasPrefix(filepath.Base(q), "rx-"):
			n.RxQueues++
		case strings.HasPrefix(filepath.Base(q), "tx-"):
			n.TxQueues++
			if _, err := os.ReadFile(filepath.Join(q, "xps_cpus")); err == nil {
				n.HasXPS = true
			}
		}
	}
	// A PCI NIC's device has numa_node and msi_irqs; virtio-net's device
	// is a virtio bus device whose PCI parent has them.
	if dev, err := filepath.EvalSymlinks(filepath.Join(dir, "device")); err == nil {
		for _, d := range []string{dev, filepath.Dir(dev)} {
			irqs, err := os.ReadDir(filepath.Join(d, "msi_irqs"))
			if err != nil {
				continue
			}
			// Absent, the node is unknown; present, it must be a number.
			node, err := readInt(filepath.Join(d, "numa_node"))
			if err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err == nil && node >= 0 {
				n.Node = node
			}
			for _, e := range irqs {
				irq, err := strconv.Atoi(e.Name())
				if err != nil {
					continue
				}
				if q, ok := queueOf(irqNames[irq], name, filepath.Base(dev)); ok {
					n.IRQs = append(n.IRQs, QueueIRQ{Queue: q, IRQ: irq, Name: irqNames[irq]})
				}
			}
			break
		}
	}
	sort.Slice(n.IRQs, func(i, j int) bool {
		a, b := n.IRQs[i], n.IRQs[j]
		return a.Queue < b.Queue || a.Queue == b.Queue && a.IRQ < b.IRQ
	})
	for _, q := range n.IRQs {
		path := filepath.Join(root, fmt.Sprintf("proc/irq/%d/smp_affinity_list", q.IRQ))
		s, err := readTrim(path)
		if err != nil {
			return fmt.Errorf("IRQ %d of %s: %w", q.IRQ, name, err)
		}
		if n.Affinities[q.IRQ], err = ParseCPUList(s); err != nil {
			return fmt.Errorf("IRQ %d of %s: %s: %w", q.IRQ, name, path, err)
		}
	}
	m.NICs = append(m.NICs, n)
	return nil
}

// Queue interrupts as drivers name them in /proc/interrupts: ixgbe, igb,
// bnxt "eth0-TxRx-3"; i40e, ice "i40e-eth0-TxRx-3"; ENA "eth0-Tx-Rx-3";
// igb without pairing "eth0-rx-3"/"eth0-tx-3"; mlx5 "mlx5_comp3@pci:…";
// virtio-net "virtio2-input.3"/"virtio2-output.3". Control vectors (misc,
// async, config, mgmnt, the bare name) serve no queue.
var (
	queueByIface  = regexp.MustCompile(`^(.+)-(?:TxRx|Tx-Rx|rx|tx|fp)-(\d+)$`)
	queueByDevice = regexp.MustCompile(`^(?:mlx5_comp(\d+)@|(virtio\d+)-(?:input|output)\.(\d+)$)`)
)

func queueOf(irqName, iface, device string) (int, bool) {
	if m := queueByIface.FindStringSubmatch(irqName); m != nil && (m[1] == iface || strings.HasSuffix(m[1], "-"+iface)) {
		q, _ := strconv.Atoi(m[2])
		return q, true
	}
	if m := queueByDevice.FindStringSubmatch(irqName); m != nil {
		if m[1] != "" {
			q, _ := strconv.Atoi(m[1])
			return q, true
		}
		if m[2] == device {
			q, _ := strconv.Atoi(m[3])
			return q, true
		}
	}
	return 0, false
}

// readInterruptNames maps each numbered interrupt of /proc/interrupts to
// its name (the last field). Rows named by letters (NMI, LOC, the CPU
// header) are the kernel's counters, skipped; a row that starts with a
// digit but is no number is an error naming its line.
func readInterruptNames(root string) (map[int]string, error) {
	path := filepath.Join(root, "proc/interrupts")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	names := map[int]string{}
	for i, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0][0] < '0' || f[0][0] > '9' {
			continue
		}
		irq, err := strconv.Atoi(strings.TrimSuffix(f[0], ":"))
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %q is not an interrupt number", path, i+1, f[0])
		}
		names[irq] = f[len(f)-1]
	}
	return names, nil
}

func irqbalanceRuns(root string) bool {
	comms, _ := filepath.Glob(filepath.Join(root, "proc/[0-9]*/comm"))
	return slices.ContainsFunc(comms, func(p string) bool {
		s, _ := readTrim(p)
		return s == "irqbalance"
	})
}
