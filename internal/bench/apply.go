package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// Commands ApplyRuns times: `rampart check` reads the list and builds the
// tables; `rampart apply` does that and loads them into the kernel.
const (
	StepCheck = "check"
	StepApply = "apply"
)

// ApplyOptions choose what ApplyCost measures.
type ApplyOptions struct {
	Families []int
	Mixes    []string
	Sizes    []int
	Runs     int    // runs of each command; the median is reported
	Exe      string // the rampart binary to run
	Dir      string // for the list files, the policies and rampart's state
	Progress func(msg string)
}

// ApplyResult is one command on one list: wall time and the peak resident
// memory of its process.
type ApplyResult struct {
	Step       string  `json:"step"`
	Family     int     `json:"family"`
	Mix        string  `json:"mix"`
	Size       int     `json:"size"`
	FileBytes  int64   `json:"file_bytes"`
	TableBytes uint64  `json:"table_bytes"` // the tables' kernel memory, as check says
	Seconds    float64 `json:"seconds"`     // median over runs
	SecondsMin float64 `json:"seconds_min"`
	SecondsMax float64 `json:"seconds_max"`
	PeakRSS    int64   `json:"peak_rss_bytes"` // the largest of the runs
	Error      string  `json:"error,omitempty"`
}

// benchNetns is the namespace ApplyCost applies in, with its pid.
const benchNetns = "rampart-bench-"

// ApplyCost writes, for every family, mix and size, the mix's prefixes as a
// list file and a policy dropping them, then runs `rampart check` and
// `rampart apply` on it as child processes (a veth in a namespace of its
// own, on pins and state of the run's own): a process each, so that its
// peak memory is the command's.
func ApplyCost(o ApplyOptions) ([]ApplyResult, error) {
	ns := fmt.Sprintf("%s%d", benchNetns, os.Getpid())
	pins := "/sys/fs/bpf/" + ns
	defer os.RemoveAll(pins)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", ns, err, bytes.TrimSpace(out))
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	if out, err := exec.Command("ip", "-n", ns, "link", "add", "bench0", "type", "veth", "peer", "name", "bench1").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("veth in %s: %v: %s", ns, err, bytes.TrimSpace(out))
	}
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "bench0", "up").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("veth in %s: %v: %s", ns, err, bytes.TrimSpace(out))
	}
	root := []string{"--netns", ns, "--pin-root", pins, "--state-root", filepath.Join(o.Dir, "state")}
	var res []ApplyResult
	for _, fam := range o.Families {
		for _, mix := range o.Mixes {
			for _, size := range o.Sizes {
				say(o.Progress, "IPv%d %s %d: writing the list", fam, mix, size)
				pol, fileBytes, err := writeListPolicy(o.Dir, fam, mix, size)
				if err != nil {
					return res, err
				}
				tables, err := checkTables(o.Exe, pol)
				for _, step := range []string{StepCheck, StepApply} {
					r := ApplyResult{Step: step, Family: fam, Mix: mix, Size: size, FileBytes: fileBytes, TableBytes: tables}
					if err != nil {
						r.Error = err.Error()
						res = append(res, r)
						continue
					}
					args := []string{"check", "-f", pol}
					if step == StepApply {
						args = slices.Concat(root, []string{"apply", "-f", pol, "--iface", "bench0"})
					}
					var secs []float64
					for run := range o.Runs {
						say(o.Progress, "IPv%d %s %d: %s, run %d of %d", fam, mix, size, step, run+1, o.Runs)
						s, rss, err := timeChild(o.Exe, step, args)
						if err != nil {
							r.Error = err.Error()
							break
						}
						secs = append(secs, s)
						r.PeakRSS = max(r.PeakRSS, rss)
					}
					if len(secs) > 0 {
						slices.Sort(secs)
						r.Seconds, r.SecondsMin, r.SecondsMax = secs[len(secs)/2], secs[0], secs[len(secs)-1]
					}
					res = append(res, r)
				}
				if out, err := exec.Command(o.Exe, append(root, "detach", "--iface", "bench0")...).CombinedOutput(); err != nil {
					return res, fmt.Errorf("rampart detach: %v: %s", err, bytes.TrimSpace(out))
				}
				os.Remove(pol + ".list")
			}
		}
	}
	return res, nil
}

// writeListPolicy writes the list file and a policy that drops its
// sources, returning the policy's path and the list's size.
func writeListPolicy(dir string, fam int, mix string, size int) (string, int64, error) {
	pol := filepath.Join(dir, fmt.Sprintf("v%d-%s-%d.yaml", fam, mix, size))
	f, err := os.Create(pol + ".list")
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	// One prefix at a time: this process's memory stays small, and its
	// children's peak RSS starts from it (Go starts them on its own
	// memory, and the kernel counts that in their maximum).
	var line []byte
	eachPrefix(fam, mix, size, func(p netip.Prefix) {
		line = append(p.AppendTo(line[:0]), '\n')
		w.Write(line)
	})
	if err := w.Flush(); err != nil {
		return "", 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	text := fmt.Sprintf("lists:\n  listed: {files: [%q]}\nrules:\n  - {name: drop-listed, src: listed, action: drop}\n", pol+".list")
	return pol, st.Size(), os.WriteFile(pol, []byte(text), 0o644)
}

// checkTables is the tables' kernel memory, from `rampart check --json`.
func checkTables(exe, pol string) (uint64, error) {
	out, err := exec.Command(exe, "check", "--json", "-f", pol).Output()
	if err != nil {
		return 0, fmt.Errorf("rampart check: %w", err)
	}
	var c struct {
		TableBytes uint64 `json:"table_bytes"`
	}
	if err := json.Unmarshal(out, &c); err != nil {
		return 0, fmt.Errorf("rampart check --json: %w", err)
	}
	return c.TableBytes, nil
}

// timeChild runs the command and returns its wall time and peak RSS.
func timeChild(exe, step string, args []string) (float64, int64, error) {
	cmd := exec.Command(exe, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, fmt.Errorf("rampart %s: %v: %s", step, err, bytes.TrimSpace(stderr.Bytes()))
	}
	secs := time.Since(start).Seconds()
	ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if ru == nil {
		return secs, 0, nil
	}
	return secs, ru.Maxrss * 1024, nil
}

func say(progress func(string), format string, args ...any) {
	if progress != nil {
		progress(fmt.Sprintf(format, args...))
	}
}
