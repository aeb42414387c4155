package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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

// Commands ApplyCost times: `rampart check` reads the policy and its list
// and builds the tables; `rampart apply` does that and loads them into the
// kernel; then `rampart apply` again after one change, over the program the
// first loaded: one entry added to the list file or taken out again (a
// feed: one rule's port changed or changed back).
const (
	StepCheck  = "check"
	StepApply  = "apply"
	StepChange = "apply-change"
)

// MixFeed is bench apply's policy of rules rather than a list: a BGP
// FlowSpec feed's, --sizes of them, each dropping UDP to a port of its own
// from a prefix of its own (an IPv4 /24, an IPv6 /64).
const MixFeed = "feed"

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
	// Generation and PolicyHash: what the first run of an apply made live.
	Generation int    `json:"generation,omitempty"`
	PolicyHash string `json:"policy_hash,omitempty"`
	Error      string `json:"error,omitempty"`
}

// appliedBy takes the generation and policy hash from the output of
// `rampart apply --json`.
func (r *ApplyResult) appliedBy(out []byte) {
	var a struct {
		Applied []struct {
			Generation int    `json:"generation"`
			PolicyHash string `json:"policy_hash"`
		} `json:"applied"`
	}
	if json.Unmarshal(out, &a) == nil && len(a.Applied) > 0 {
		r.Generation, r.PolicyHash = a.Applied[0].Generation, a.Applied[0].PolicyHash
	} else if r.Error == "" {
		r.Error = fmt.Sprintf("rampart apply --json printed no applied hook: %.200s", out)
	}
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
				say(o.Progress, "%s: writing the policy", what)
				write := writeListPolicy
				if mix == MixFeed {
					write = writeFeedPolicy
				}
				pol, change, fileBytes, err := write(o.Dir, fam, mix, size)
				if err != nil {
					return res, err
				}
				applyArgs := slices.Concat(root, []string{"apply", "--json", "-f", pol, "--iface", benchIf})
				check, out := o.measure(what, StepCheck, []string{"check", "--json", "-f", pol}, nil)
				// Every run of apply loads the program afresh: the hook is
				// detached before it (a run over the last would fill a new
				// generation of its program, which apply-change measures).
				detach := func(run int) error {
					if run == 0 {
						return nil
					}
					return lab.Run(slices.Concat([]string{o.Exe}, root, []string{"detach", "--iface", benchIf})...)
				}
				apply, applied := o.measure(what, StepApply, applyArgs, detach)
				apply.appliedBy(applied)
				changed := ApplyResult{Step: StepChange, Error: apply.Error}
				if apply.Error == "" {
					changed, applied = o.measure(what, StepChange, applyArgs, change)
					changed.appliedBy(applied)
				}
				var c struct {
					TableBytes uint64 `json:"table_bytes"`
				}
				if err := json.Unmarshal(out, &c); err != nil && check.Error == "" {
					check.Error = fmt.Sprintf("rampart check --json: %v", err)
				}
				for _, r := range []ApplyResult{check, apply, changed} {
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

// measure runs one command o.Runs times, each after before(run) when
// given: the median wall time with its min-max, the largest peak RSS, and
// the first run's standard output.
func (o ApplyOptions) measure(what, step string, args []string, before func(run int) error) (r ApplyResult, out []byte) {
	r.Step = step
	var secs []float64
	for run := range o.Runs {
		say(o.Progress, "%s: %s, run %d of %d", what, step, run+1, o.Runs)
		if before != nil {
			if err := before(run); err != nil {
				r.Error = err.Error()
				break
			}
		}
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
// sources, returning the policy's path, the change for run n (an entry
// appended to the list file, or cut off it again) and the list's size.
func writeListPolicy(dir string, fam int, mix string, size int) (string, func(n int) error, int64, error) {
	pol := filepath.Join(dir, fmt.Sprintf("v%d-%s-%d.yaml", fam, mix, size))
	f, err := os.Create(pol + ".list")
	if err != nil {
		return "", nil, 0, err
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
		return "", nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return "", nil, 0, err
	}
	extra := map[int]string{4: "192.0.2.1\n", 6: "2001:db8::1\n"}[fam] // documentation addresses
	change := func(n int) error {
		if n%2 == 1 {
			return os.Truncate(pol+".list", st.Size())
		}
		f, err := os.OpenFile(pol+".list", os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString(extra)
		return errors.Join(err, f.Close())
	}
	text := fmt.Sprintf("lists:\n  listed: {files: [%q]}\nrules:\n  - {name: drop-listed, src: listed, action: drop}\n", pol+".list")
	return pol, change, st.Size(), os.WriteFile(pol, []byte(text), 0o644)
}

// writeFeedPolicy writes a policy of size rules as a FlowSpec feed sends
// them (MixFeed), returning its path, the change for run n (the first
// rule's port changed, or changed back) and its size.
func writeFeedPolicy(dir string, fam int, mix string, size int) (string, func(n int) error, int64, error) {
	pol := filepath.Join(dir, fmt.Sprintf("v%d-%s-%d.yaml", fam, mix, size))
	text := func(firstPort int) []byte {
		var b bytes.Buffer
		b.WriteString("rules:\n")
		for i := range size {
			src := fmt.Sprintf("%d.%d.%d.0/24", 10+i>>16&127, i>>8&255, i&255)
			if fam == 6 {
				src = fmt.Sprintf("2001:db8:%x:%x::/64", i>>16&0xffff, i&0xffff)
			}
			port := 1 + i%65535
			if i == 0 {
				port = firstPort
			}
			fmt.Fprintf(&b, "  - {name: r%d, src: %s, proto: udp, dport: %d, action: drop}\n", i, src, port)
		}
		return b.Bytes()
	}
	base, changed := text(1), text(2)
	change := func(n int) error {
		return os.WriteFile(pol, [][]byte{changed, base}[n%2], 0o644)
	}
	return pol, change, int64(len(base)), os.WriteFile(pol, base, 0o644)
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
