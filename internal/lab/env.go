package lab

import (
	"bufio"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// kernelRelease is the running kernel's version, as uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// cpuModel is the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// Host is the machine every study's numbers depend on.
type Host struct {
	Kernel   string `json:"kernel"`
	CPUModel string `json:"cpu_model"`
	CPUs     int    `json:"cpus"`
}

// ThisHost describes the running machine.
func ThisHost() Host {
	return Host{Kernel: kernelRelease(), CPUModel: cpuModel(), CPUs: runtime.NumCPU()}
}

// Progress, when set, hears what a lab run is doing.
type Progress func(msg string)

// Say passes msg on, when anyone listens.
func (p Progress) Say(msg string) {
	if p != nil {
		p(msg)
	}
}
