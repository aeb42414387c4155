package diagnose

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
)

// DropKey is one kind of drop: where, why, on which interface, of what.
type DropKey = dropsDropKey

// Tracer counts the drops of one network namespace from the skb:kfree_skb
// tracepoint, with the kernel's run-time statistics switched on for as long
// as it runs so that its own cost can be reported.
type Tracer struct {
	objs    dropsObjects
	link    link.Link
	stats   io.Closer // nil when run-time statistics could not be enabled
	Reasons map[uint32]string
	symbols *Symbols
}

// ErrNeedRoot is returned when the kernel refuses the tracer for want of
// privilege.
var ErrNeedRoot = errors.New("drop reasons need root (CAP_BPF and CAP_PERFMON) to attach to the kfree_skb tracepoint; run rampart diagnose as root")

// StartTracer attaches the tracer for a named network namespace ("" for
// this process's).
func StartTracer(netns string) (*Tracer, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNeedRoot
	}
	if err := datapath.Require(datapath.FeatureKernelBTF); err != nil {
		return nil, err
	}
	ino, err := NetnsInode(netns)
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	symbols, err := ReadSymbols(f)
	if err != nil {
		return nil, fmt.Errorf("/proc/kallsyms: %w", err)
	}
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("kernel BTF (needed for drop reasons): %w", err)
	}
	reasons, err := DropReasonNames(kernel)
	if err != nil {
		return nil, err
	}
	spec, err := loadDrops()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables["target_netns"].Set(ino); err != nil {
		return nil, err
	}
	t := &Tracer{Reasons: reasons, symbols: symbols}
	if err := spec.LoadAndAssign(&t.objs, &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{KernelTypes: kernel}}); err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, ErrNeedRoot
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load drop tracer: %+v", ve)
		}
		return nil, fmt.Errorf("load drop tracer: %w", err)
	}
	t.link, err = link.AttachTracing(link.TracingOptions{Program: t.objs.CountDrop})
	if err != nil {
		t.objs.Close()
		return nil, fmt.Errorf("attach to tracepoint kfree_skb: %w", err)
	}
	// Failing to enable statistics leaves the overhead unreported, not the
	// diagnosis undone.
	t.stats, _ = ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	return t, nil
}

// Begin reads the counts at the start of a window. A nil tracer (none
// could be started) gives nil: no drop reasons.
func (t *Tracer) Begin() (*Drops, error) {
	if t == nil {
		return nil, nil
	}
	counts, _, err := t.Counts()
	if err != nil {
		return nil, err
	}
	d := &Drops{Before: counts, Reasons: t.Reasons, Symbols: t.symbols, Began: time.Now()}
	d.Overhead0, _ = t.Overhead()
	return d, nil
}

// End reads the counts at the end of the window into d.
func (t *Tracer) End(d *Drops) error {
	if t == nil {
		return nil
	}
	counts, lost, err := t.Counts()
	if err != nil {
		return err
	}
	d.After, d.Lost, d.Ended = counts, lost, time.Now()
	d.Overhead1, _ = t.Overhead()
	return nil
}

// Close detaches the tracer and switches statistics back off.
func (t *Tracer) Close() {
	t.link.Close()
	t.objs.Close()
	if t.stats != nil {
		t.stats.Close()
	}
}

// Counts reads the drops counted so far, summed over CPUs, and how many
// found the table full and were not counted. Each CPU may be up to 64
// drops off (bpf/drops.c FLUSH_EVERY); the next read makes it good.
func (t *Tracer) Counts() (map[DropKey]uint64, uint64, error) {
	out := map[DropKey]uint64{}
	var (
		key    DropKey
		values []uint64
	)
	it := t.objs.Drops.Iterate()
	for it.Next(&key, &values) {
		var n uint64
		for _, v := range values {
			n += v
		}
		out[key] = n
	}
	if err := it.Err(); err != nil {
		return nil, 0, fmt.Errorf("read drop counts: %w", err)
	}
	var pending []dropsPendingDrops // per CPU: counted, not yet in the hash
	if err := t.objs.Pending.Lookup(uint32(0), &pending); err != nil {
		return nil, 0, fmt.Errorf("read pending drop counts: %w", err)
	}
	for _, p := range pending {
		if p.Count > 0 {
			out[p.Key] += p.Count
		}
	}
	lost, err := datapath.SumPerCPU(t.objs.Lost)
	return out, lost, err
}

// Overhead is the tracer's own cost as the kernel measured it.
type Overhead struct {
	Events uint64        `json:"events"`
	Time   time.Duration `json:"run_time_ns"`
}

// Overhead reads the tracer program's run count and run time.
func (t *Tracer) Overhead() (Overhead, error) {
	if t.stats == nil {
		return Overhead{}, errors.New("run-time statistics could not be enabled")
	}
	s, err := t.objs.CountDrop.Stats()
	if err != nil {
		return Overhead{}, err
	}
	return Overhead{Events: s.RunCount, Time: s.Runtime}, nil
}

// DropReasonNames reads enum skb_drop_reason from the kernel's BTF, so the
// names are those of the running kernel, without the SKB_DROP_REASON_ prefix.
func DropReasonNames(kernel *btf.Spec) (map[uint32]string, error) {
	var enum *btf.Enum
	if err := kernel.TypeByName("skb_drop_reason", &enum); err != nil {
		return nil, fmt.Errorf("enum skb_drop_reason in kernel BTF (kernel 5.17 or later has it): %w", err)
	}
	out := make(map[uint32]string, len(enum.Values))
	for _, v := range enum.Values {
		out[uint32(v.Value)] = strings.TrimPrefix(strings.TrimPrefix(v.Name, "SKB_DROP_REASON_"), "SKB_")
	}
	return out, nil
}

// Symbols resolves kernel text addresses to function+offset from
// /proc/kallsyms.
type Symbols struct {
	addrs []uint64
	names []string
}

// ReadSymbols parses kallsyms text ("address type name [module]"), keeping
// text symbols. Without privilege every address reads as zero, and the
// result is empty.
func ReadSymbols(r io.Reader) (*Symbols, error) {
	type sym struct {
		addr uint64
		name string
	}
	var syms []sym
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || (f[1] != "t" && f[1] != "T") {
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		syms = append(syms, sym{a, f[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	s := &Symbols{addrs: make([]uint64, len(syms)), names: make([]string, len(syms))}
	for i, y := range syms {
		s.addrs[i], s.names[i] = y.addr, y.name
	}
	return s, nil
}

// Lookup gives the function containing addr and the offset into it, or the
// bare address when no symbol precedes it.
func (s *Symbols) Lookup(addr uint64) (fn string, offset uint64) {
	i := sort.Search(len(s.addrs), func(i int) bool { return s.addrs[i] > addr }) - 1
	if i < 0 {
		return fmt.Sprintf("0x%x", addr), 0
	}
	return s.names[i], addr - s.addrs[i]
}
