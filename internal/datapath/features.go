package datapath

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// A Feature is a kernel capability rampart needs, probed before anything
// changes: a missing one is one line naming it and the kernel that has it.
type Feature struct {
	Name   string
	Kernel string // the first Linux release with it
	probe  func() error
	once   sync.Once
	err    error
}

// Require returns an error naming the first feature the kernel lacks.
func Require(fs ...*Feature) error {
	for _, f := range fs {
		if err := f.Check(); err != nil {
			return err
		}
	}
	return nil
}

// Check probes the feature once: nil when the kernel has it, else one line
// naming it and the kernel that has it (or why the probe failed).
func (f *Feature) Check() error {
	f.once.Do(func() { f.err = f.probe() })
	if errors.Is(f.err, ebpf.ErrNotSupported) {
		return fmt.Errorf("this kernel lacks %s (Linux %s or newer)", f.Name, f.Kernel)
	}
	if f.err != nil {
		return fmt.Errorf("probe for %s: %w", f.Name, f.err)
	}
	return nil
}

func helper(t ebpf.ProgramType, fn asm.BuiltinFunc) func() error {
	return func() error { return features.HaveProgramHelper(t, fn) }
}

var (
	// The parser walks VLAN stacks and IPv6 header chains with bpf_loop.
	FeatureLoop = &Feature{Name: "the bpf_loop helper", Kernel: "5.17", probe: helper(ebpf.XDP, asm.FnLoop)}
	// The walks read through bpf_xdp_load_bytes.
	FeatureXDPLoadBytes = &Feature{Name: "the bpf_xdp_load_bytes helper", Kernel: "5.18", probe: helper(ebpf.XDP, asm.FnXdpLoadBytes)}
	// tc programs attach through tcx links where the kernel has them, else
	// as a clsact filter (clsact.go).
	FeatureTCX = &Feature{Name: "tcx links", Kernel: "6.6", probe: probeTCX}
	// The filter's programs as a whole.
	FeaturesFilter = []*Feature{FeatureLoop, FeatureXDPLoadBytes}
	// The lab's generator runs XDP programs on live frames.
	FeatureLiveFrames = &Feature{Name: "XDP live frames (BPF_F_TEST_XDP_LIVE_FRAMES)", Kernel: "5.18", probe: probeLiveFrames}
	// syncookie rules hand a validated ACK to the listener as a request
	// socket.
	FeatureTCPReqsk = &Feature{Name: "the bpf_sk_assign_tcp_reqsk kfunc", Kernel: "6.9", probe: kfunc("bpf_sk_assign_tcp_reqsk")}
	// diagnose's tracer is a tp_btf program: it needs the kernel's BTF.
	FeatureKernelBTF = &Feature{Name: "kernel BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)", Kernel: "5.5", probe: probeKernelBTF}

	// Features is every feature rampart probes, for `rampart version`.
	Features = []*Feature{FeatureLoop, FeatureXDPLoadBytes, FeatureTCX, FeatureLiveFrames, FeatureTCPReqsk, FeatureKernelBTF}
)

// probeLiveFrames runs a program that drops, once, in live-frames mode.
func probeLiveFrames() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		return err
	}
	defer prog.Close()
	_, err = prog.Run(&ebpf.RunOptions{Data: make([]byte, 64), Repeat: 1, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES})
	if errors.Is(err, unix.EINVAL) || errors.Is(err, ebpf.ErrNotSupported) {
		return ebpf.ErrNotSupported
	}
	return err
}

func probeKernelBTF() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); errors.Is(err, os.ErrNotExist) {
		return ebpf.ErrNotSupported
	}
	return nil
}

// probeTCX asks for a tcx link on an interface that cannot exist: a kernel
// with tcx says so (no such device), one without it cannot parse the
// request. Nothing is attached either way.
func probeTCX() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		return err
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: 0x7fffffff, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close()
		return nil
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	return nil
}

// kfunc probes the kernel's BTF for a kfunc.
func kfunc(name string) func() error {
	return func() error {
		spec, err := btf.LoadKernelSpec()
		if err != nil {
			return ebpf.ErrNotSupported
		}
		var fn *btf.Func
		if err := spec.TypeByName(name, &fn); err != nil {
			return ebpf.ErrNotSupported
		}
		return nil
	}
}
