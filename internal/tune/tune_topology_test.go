package tune

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestReadMachineNamesBadFile: a topology file that cannot be read as what
// it should hold is an error naming that file (and the line, in
// /proc/interrupts), not a bare strconv error or a silent default.
func TestReadMachineNamesBadFile(t *testing.T) {
	for _, c := range []struct {
		file  string // under the root; "numa_node" is enp1s0's device's
		value string
		want  string // in the error, besides the file
	}{
		{"sys/devices/system/cpu/cpu1/topology/physical_package_id", "x", `"x" is not a number`},
		{"sys/devices/system/cpu/cpu2/topology/core_id", "x", `"x" is not a number`},
		{"sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "0-x", "is not a CPU list"},
		{"sys/devices/system/cpu/online", "0-x", "is not a CPU list"},
		{"sys/devices/system/cpu/online", "", "no CPU is online"},
		{"sys/devices/system/cpu/possible", "x", "is not a CPU list"},
		{"sys/devices/system/node/node0/cpulist", "x", "is not a CPU list"},
		{"numa_node", "x", `"x" is not a number`},
		{"proc/irq/41/smp_affinity_list", "x", "is not a CPU list"},
	} {
		root, f := fixtureRoot(t, "small-4cpu")
		file := c.file
		if file == "numa_node" {
			dev, err := filepath.EvalSymlinks(filepath.Join(root, "sys/class/net/enp1s0/device"))
			if err != nil {
				t.Fatal(err)
			}
			file, _ = filepath.Rel(root, filepath.Join(dev, "numa_node"))
		}
		if err := os.WriteFile(filepath.Join(root, file), []byte(c.value+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadMachine(root, slices.Concat(f.External, f.Internal))
		if err == nil || !strings.Contains(err.Error(), filepath.Join(root, file)) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s holding %q: %v, want an error naming the file and %q", file, c.value, err, c.want)
		}
	}

	// /proc/interrupts: a row numbered with something not a number.
	root, f := fixtureRoot(t, "small-4cpu")
	path := filepath.Join(root, "proc/interrupts")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	lines = slices.Insert(lines, 2, " 4x:          0          0          0          0  IR-PCI-MSIX-0000:01:00.0 9-edge      enp1s0-TxRx-9")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ReadMachine(root, slices.Concat(f.External, f.Internal))
	if want := path + ":" + strconv.Itoa(3) + `: "4x:" is not an interrupt number`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a bad /proc/interrupts row: %v, want %q", err, want)
	}
}
