package tune

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// fixture describes a machine as sysfs and procfs show it; build writes
// the tree: CPU topology, NUMA nodes, NICs under their PCI (or virtio, or
// virtual) device with the class symlinks, msi_irqs, queues, bonds, and
// /proc/interrupts with each driver's interrupt names. One tree
// (captured-virtio-veth) is a copy of a real machine's files instead.
type fixture struct {
	About          string         `yaml:"about"`
	Sockets        int            `yaml:"sockets"`
	Cores          int            `yaml:"cores"` // per socket
	Threads        int            `yaml:"threads"`
	NodesPerSocket int            `yaml:"nodes_per_socket"`
	Numbering      string         `yaml:"numbering"` // linear (socket by socket) or interleaved (sockets alternate)
	Online         string         `yaml:"online"`
	Isolated       string         `yaml:"isolated"`
	NodeCPUs       map[int]string `yaml:"node_cpus"` // overrides the nodes computed from sockets
	IRQBalance     bool           `yaml:"irqbalance"`
	External       []string       `yaml:"external"`
	Internal       []string       `yaml:"internal"`
	NICs           []fixtureNIC   `yaml:"nics"`
}

type fixtureNIC struct {
	Name   string `yaml:"name"`
	Driver string `yaml:"driver"` // igb ixgbe i40e ice mlx5_core ena bnxt_en virtio_net veth
	Queues int    `yaml:"queues"`
	Node   int    `yaml:"node"`
	PCI    string `yaml:"pci"`
	Bond   string `yaml:"bond"`
	Down   bool   `yaml:"down"`
}

func loadFixture(t *testing.T, path string) fixture {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f fixture
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return f
}

// cpuID numbers a thread as Linux does on the two common BIOS layouts:
// first threads of every core before any second thread, sockets one
// after the other (linear) or alternating (interleaved).
func (f fixture) cpuID(socket, core, thread int) int {
	if f.Numbering == "interleaved" {
		return thread*f.Sockets*f.Cores + core*f.Sockets + socket
	}
	return thread*f.Sockets*f.Cores + socket*f.Cores + core
}

func (f fixture) build(t *testing.T, root string) {
	t.Helper()
	put := func(path, text string) {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(path, target string) {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	n := f.Sockets * f.Cores * f.Threads
	all := make(CPUSet, n)
	for i := range all {
		all[i] = i
	}
	online := all
	if f.Online != "" {
		var err error
		if online, err = ParseCPUList(f.Online); err != nil {
			t.Fatal(err)
		}
	}
	nps := max(f.NodesPerSocket, 1)
	nodes := map[int]CPUSet{}
	for s := range f.Sockets {
		for c := range f.Cores {
			var siblings CPUSet
			for th := range f.Threads {
				siblings = append(siblings, f.cpuID(s, c, th))
			}
			siblings = siblings.Intersect(online)
			for _, id := range siblings {
				dir := fmt.Sprintf("sys/devices/system/cpu/cpu%d/topology/", id)
				put(dir+"physical_package_id", fmt.Sprint(s))
				put(dir+"core_id", fmt.Sprint(c))
				put(dir+"thread_siblings_list", siblings.List())
				node := s*nps + c/(f.Cores/nps)
				nodes[node] = append(nodes[node], id)
			}
		}
	}
	if f.NodeCPUs != nil {
		nodes = map[int]CPUSet{}
		for node, list := range f.NodeCPUs {
			set, err := ParseCPUList(list)
			if err != nil {
				t.Fatal(err)
			}
			nodes[node] = set.Intersect(online)
		}
	}
	for node, cpus := range nodes {
		slices.Sort(cpus)
		put(fmt.Sprintf("sys/devices/system/node/node%d/cpulist", node), cpus.List())
	}
	put("sys/devices/system/cpu/online", online.List())
	put("sys/devices/system/cpu/possible", all.List())
	put("sys/devices/system/cpu/isolated", f.Isolated)
	if f.IRQBalance {
		put("proc/1234/comm", "irqbalance")
	}
	put("proc/1/comm", "systemd")
	mask := all.Mask(0)
	var interrupts strings.Builder
	interrupts.WriteString("    ")
	for _, c := range online {
		fmt.Fprintf(&interrupts, "       CPU%d", c)
	}
	interrupts.WriteString("\n")
	irq := 40
	vector := func(pci, name string, index int) {
		fmt.Fprintf(&interrupts, "%4d:", irq)
		for range online {
			interrupts.WriteString("          0")
		}
		fmt.Fprintf(&interrupts, "  IR-PCI-MSIX-%s %d-edge      %s\n", pci, index, name)
		put(fmt.Sprintf("proc/irq/%d/smp_affinity_list", irq), online.List())
		irq++
	}
	bonds := map[string][]string{}
	for i, nic := range f.NICs {
		q := max(nic.Queues, 1)
		pci := nic.PCI
		if pci == "" {
			pci = fmt.Sprintf("0000:%02x:00.0", 0x10+i)
		}
		devDir := fmt.Sprintf("sys/devices/pci0000:%02x/%s", 0x10*nic.Node&0xff, pci)
		netDir := devDir + "/net/" + nic.Name
		switch nic.Driver {
		case "veth":
			devDir, netDir = "", "sys/devices/virtual/net/"+nic.Name
		case "virtio_net":
			virtio := fmt.Sprintf("virtio%d", i+1)
			netDir = devDir + "/" + virtio + "/net/" + nic.Name
			link(netDir+"/device", "../../../"+virtio)
			link(devDir+"/"+virtio+"/driver", "../../../../bus/virtio/drivers/virtio_net")
		default:
			link(netDir+"/device", "../../../"+pci)
			link(devDir+"/driver", "../../../bus/pci/drivers/"+nic.Driver)
		}
		link("sys/class/net/"+nic.Name, strings.Repeat("../", 2)+strings.TrimPrefix(netDir, "sys/"))
		state := "up"
		if nic.Down {
			state = "down"
		}
		put(netDir+"/operstate", state)
		for j := range q {
			put(fmt.Sprintf("%s/queues/rx-%d/rps_cpus", netDir, j), "0"+strings.Repeat(",0", strings.Count(mask, ",")))
			if q > 1 || nic.Driver == "veth" {
				put(fmt.Sprintf("%s/queues/tx-%d/xps_cpus", netDir, j), "0"+strings.Repeat(",0", strings.Count(mask, ",")))
			}
		}
		if nic.Bond != "" {
			bonds[nic.Bond] = append(bonds[nic.Bond], nic.Name)
		}
		if devDir == "" {
			continue
		}
		put(devDir+"/numa_node", fmt.Sprint(nic.Node))
		msi := func(name string) {
			put(fmt.Sprintf("%s/msi_irqs/%d", devDir, irq), "msix")
			vector(pci, name, 0)
		}
		switch nic.Driver {
		case "igb", "ixgbe", "bnxt_en":
			msi(nic.Name)
			for j := range q {
				msi(fmt.Sprintf("%s-TxRx-%d", nic.Name, j))
			}
		case "i40e", "ice":
			msi(fmt.Sprintf("%s-%s:misc", nic.Driver, pci))
			for j := range q {
				msi(fmt.Sprintf("%s-%s-TxRx-%d", nic.Driver, nic.Name, j))
			}
		case "mlx5_core":
			msi("mlx5_async0@pci:" + pci)
			for j := range q {
				msi(fmt.Sprintf("mlx5_comp%d@pci:%s", j, pci))
			}
		case "ena":
			msi("ena-mgmnt@pci:" + pci)
			for j := range q {
				msi(fmt.Sprintf("%s-Tx-Rx-%d", nic.Name, j))
			}
		case "virtio_net":
			virtio := fmt.Sprintf("virtio%d", i+1)
			msi(virtio + "-config")
			for j := range q {
				msi(fmt.Sprintf("%s-input.%d", virtio, j))
				msi(fmt.Sprintf("%s-output.%d", virtio, j))
			}
		default:
			t.Fatalf("driver %q is not modelled", nic.Driver)
		}
	}
	for bond, slaves := range bonds {
		dir := "sys/devices/virtual/net/" + bond
		put(dir+"/bonding/slaves", strings.Join(slaves, " "))
		put(dir+"/operstate", "up")
		link("sys/class/net/"+bond, "../../devices/virtual/net/"+bond)
	}
	put("proc/interrupts", strings.TrimRight(interrupts.String(), "\n"))
}
