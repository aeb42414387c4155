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

	"github.com/rampart-fw/rampart/internal/lab"
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

// benchIf is the veth ApplyCost applies on, in a namespace of the run's own.
const benchIf = "bench0"

// ApplyCost writes, for every family, mix and size, the mix's prefixes as a
// list file and a policy dropping them, then runs `rampart check` and
// `rampart apply` on it as child processes (a veth in a namespace of its
// own, on pins and state of the run's own, named as the labs name theirs
// so that a killed run's are swept): a process each, so that its peak
// memory is the command's.
func ApplyCost(o ApplyOptions) ([]ApplyResult, error) {
	lab.SweepStale()
	ns, pins := fmt.Sprintf("%s%d-apply", lab.NetnsPrefix, os.Getpid()), lab.PinRoot()
	defer os.RemoveAll(pins)
	defer exec.Command("ip", "netns", "del", ns).Run()
	for _, c := range [][]string{{"ip", "netns", "add", ns}, {"ip", "-n", ns, "link", "add", benchIf, "type", "veth", "peer", "name", benchIf + "p"},
		{"ip", "-n", ns, "link", "set", benchIf, "up"}} {
		if err := lab.Run(c...); err != nil {
			return nil, err
		}
	}
	root := []string{"--netns", ns, "--pin-root", pins, "--state-root", filepath.Join(o.Dir, "state")}
	var res []ApplyResult
	for _, fam := range o.Families {
		for _, mix := range o.Mixes {
			for _, size := range o.Sizes {
				what := fmt.Sprintf("IPv%d %s %d", fam, mix, size)
				say(o.Progress, "%s: writing the list", what)
				pol, fileBytes, err := writeListPolicy(o.Dir, fam, mix, size)
				if err != nil {
					return res, err
				}
				check, out := o.measure(what, StepCheck, []string{"check", "--json", "-f", pol})
				apply, _ := o.measure(what, StepApply, slices.Concat(root, []string{"apply", "-f", pol, "--iface", benchIf}))
				var c struct {
					TableBytes uint64 `json:"table_bytes"`
				}
				if err := json.Unmarshal(out, &c); err != nil && check.Error == "" {
					check.Error = fmt.Sprintf("rampart check --json: %v", err)
				}
				for _, r := range []ApplyResult{check, apply} {
					r.Family, r.Mix, r.Size, r.FileBytes, r.TableBytes = fam, mix, size, fileBytes, c.TableBytes
					res = append(res, r)
				}
				if err := lab.Run(slices.Concat([]string{o.Exe}, root, []string{"detach", "--iface", benchIf})...); err != nil {
					return res, err
				}
				os.Remove(pol + ".list")
			}
		}
	}
	return res, nil
}

// measure runs one command o.Runs times: the median wall time with its
// min-max, the largest peak RSS, and the first run's standard output.
func (o ApplyOptions) measure(what, step string, args []string) (r ApplyResult, out []byte) {
	r.Step = step
	var secs []float64
	for run := range o.Runs {
		say(o.Progress, "%s: %s, run %d of %d", what, step, run+1, o.Runs)
		s, rss, stdout, err := timeChild(o.Exe, step, args)
		if err != nil {
			r.Error = err.Error()
			break
		}
		if run == 0 {
			out = stdout
		}
		secs = append(secs, s)
		r.PeakRSS = max(r.PeakRSS, rss)
	}
	if len(secs) > 0 {
		slices.Sort(secs)
		r.Seconds, r.SecondsMin, r.SecondsMax = secs[len(secs)/2], secs[0], secs[len(secs)-1]
	}
	return r, out
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

// timeChild runs the command and returns its wall time, peak RSS and
// standard output.
func timeChild(exe, step string, args []string) (float64, int64, []byte, error) {
	cmd := exec.Command(exe, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, nil, fmt.Errorf("rampart %s: %v: %s", step, err, bytes.TrimSpace(stderr.Bytes()))
	}
	secs := time.Since(start).Seconds()
	var rss int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = ru.Maxrss * 1024
	}
	return secs, rss, stdout.Bytes(), nil
}

func say(progress func(string), format string, args ...any) {
	if progress != nil {
		progress(fmt.Sprintf(format, args...))
	}
}
