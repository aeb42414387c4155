package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
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
// FlowSpec feed's as bench rules has it, --sizes of them, each dropping
// UDP to a destination address and a port of its own.
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
	// Generation and PolicyHash: what an apply made live (apply: its last
	// run; apply-change: its first).
	Generation int    `json:"generation,omitempty"`
	PolicyHash string `json:"policy_hash,omitempty"`
	Error      string `json:"error,omitempty"`
}

// applied reads the generation and policy hash `rampart apply --json`
// printed.
func applied(out []byte) (generation int, hash string, err error) {
	var a struct {
		Applied []struct {
			Generation int    `json:"generation"`
			PolicyHash string `json:"policy_hash"`
		} `json:"applied"`
	}
	if json.Unmarshal(out, &a) != nil || len(a.Applied) == 0 {
		return 0, "", fmt.Errorf("rampart apply --json printed no applied hook: %.200s", out)
	}
	return a.Applied[0].Generation, a.Applied[0].PolicyHash, nil
}

// checkChanges checks that every run of apply-change made the next
// generation live over the same program (prog, the XDP program's ID
// before and after), of another policy than apply's for a change and of
// apply's again for its undoing: else it timed something else.
func checkChanges(apply, changed *ApplyResult, outs [][]byte, prog [2]int) {
	if changed.Error != "" {
		return
	}
	for n, out := range outs {
		gen, hash, err := applied(out)
		switch {
		case err != nil:
			changed.Error = err.Error()
		case gen != apply.Generation+1+n:
			changed.Error = fmt.Sprintf("run %d made generation %d live, not %d", n+1, gen, apply.Generation+1+n)
		case (hash == apply.PolicyHash) != (n%2 == 1):
			changed.Error = fmt.Sprintf("run %d made policy %s live after apply's %s: the change did not change the policy, or its undoing did not restore it", n+1, hash, apply.PolicyHash)
		}
		if n == 0 {
			changed.Generation, changed.PolicyHash = gen, hash
		}
		if changed.Error != "" {
			return
		}
	}
	switch {
	case prog[0] == 0 || prog[1] == 0:
		changed.Error = "no XDP program on the bench's veth to compare: apply used tc"
	case prog[0] != prog[1]:
		changed.Error = fmt.Sprintf("the hook's XDP program went from ID %d to %d: the change loaded a program", prog[0], prog[1])
	}
}

// xdpProgram is the ID of the XDP program running on the bench's veth
// (0 for none), as `ip link` shows it.
func xdpProgram(ns string) int {
	out, err := exec.Command("ip", "-n", ns, "-j", "link", "show", "dev", benchIf).Output()
	var links []struct {
		XDP struct {
			Prog struct {
				ID int `json:"id"`
			} `json:"prog"`
		} `json:"xdp"`
	}
	if err != nil || json.Unmarshal(out, &links) != nil || len(links) == 0 {
		return 0
	}
	return links[0].XDP.Prog.ID
}

// benchIf is the veth ApplyCost applies on, in a namespace of the run's own.
const benchIf = "bench0"

// ApplyCost writes, for every family, mix and size, the mix's prefixes as a
// list file and a policy dropping them (a feed: its rules), then runs
// `rampart check`, `rampart apply` and apply-change on it as child
// processes (a veth in a namespace of its own, on pins and state of the
// run's own, named as the labs name theirs so that a killed run's are
// swept): a process each, so that its peak memory is the command's.
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
				apply, outs := o.measure(what, StepApply, applyArgs, detach)
				if apply.Error == "" { // the last run's: the one apply-change follows
					var err error
					if apply.Generation, apply.PolicyHash, err = applied(outs[len(outs)-1]); err != nil {
						apply.Error = err.Error()
					}
				}
				changed := ApplyResult{Step: StepChange, Error: "not run: apply failed"}
				if apply.Error == "" {
					prog := [2]int{xdpProgram(ns)}
					changed, outs = o.measure(what, StepChange, applyArgs, change)
					prog[1] = xdpProgram(ns)
					checkChanges(&apply, &changed, outs, prog)
				}
				var c struct {
					TableBytes uint64 `json:"table_bytes"`
				}
				if check.Error == "" {
					if err := json.Unmarshal(out[0], &c); err != nil {
						check.Error = fmt.Sprintf("rampart check --json: %v", err)
					}
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
// each run's standard output.
func (o ApplyOptions) measure(what, step string, args []string, before func(run int) error) (r ApplyResult, outs [][]byte) {
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
		outs = append(outs, stdout)
		secs = append(secs, s)
		r.PeakRSS = max(r.PeakRSS, rss)
	}
	if len(secs) > 0 {
		slices.Sort(secs)
		r.Seconds, r.SecondsMin, r.SecondsMax = secs[len(secs)/2], secs[0], secs[len(secs)-1]
	}
	return r, outs
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
	cands := changeCandidates(fam)
	covered := make([]bool, len(cands))
	eachPrefix(fam, mix, size, func(p netip.Prefix) {
		line = append(p.AppendTo(line[:0]), '\n')
		w.Write(line)
		for i, a := range cands {
			covered[i] = covered[i] || p.Contains(a)
		}
	})
	if err := w.Flush(); err != nil {
		return "", nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return "", nil, 0, err
	}
	// The entry added is an address no listed prefix holds: one inside a
	// listed network merges into it, and the policy stays as it was (a
	// list of ten million networks leaves none).
	extra := ""
	if i := slices.Index(covered, false); i >= 0 {
		extra = cands[i].String() + "\n"
	}
	change := func(n int) error {
		if extra == "" {
			return fmt.Errorf("the %d addresses tried all lie in listed prefixes: no one-entry change alters this list's tables", len(cands))
		}
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

// changeCandidates are the addresses a list's change may add: the
// documentation ones, then random ones.
func changeCandidates(fam int) []netip.Addr {
	out := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("203.0.113.1")}
	if fam == 6 {
		out = []netip.Addr{netip.MustParseAddr("2001:db8::1")}
	}
	rng := rand.New(rand.NewPCG(7, uint64(fam)))
	for len(out) < 64 {
		out = append(out, randomAddr(fam, rng))
	}
	return out
}

// writeFeedPolicy writes a policy of size rules as bench rules' feed
// (scalePolicy with victims), returning its path, the change for run n
// (the first rule's destination port 1 made 2, or 1 again, in place) and
// its size.
func writeFeedPolicy(dir string, fam int, mix string, size int) (string, func(n int) error, int64, error) {
	pol := filepath.Join(dir, fmt.Sprintf("v%d-%s-%d.yaml", fam, mix, size))
	f, err := os.Create(pol)
	if err != nil {
		return "", nil, 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	writeScalePolicy(w, size, fam, true, ScaleLists)
	if err := w.Flush(); err != nil {
		return "", nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return "", nil, 0, err
	}
	head := make([]byte, min(st.Size(), 64<<10))
	if _, err := f.ReadAt(head, 0); err != nil {
		return "", nil, 0, err
	}
	first := bytes.Index(head, []byte("{name: r0,"))
	port := bytes.Index(head[max(first, 0):], []byte("dport: 1,"))
	if first < 0 || port < 0 {
		return "", nil, 0, fmt.Errorf("%s: no first rule of destination port 1", pol)
	}
	at := int64(first + port + len("dport: "))
	change := func(n int) error {
		f, err := os.OpenFile(pol, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteAt([]byte{"21"[n%2]}, at)
		return errors.Join(err, f.Close())
	}
	return pol, change, st.Size(), nil
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
