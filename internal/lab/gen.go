// Package lab is what the studies under it share: the namespaces and veth
// pair they run in, the in-kernel traffic generator and the lab's BPF
// objects, the tools they drive in a namespace, rampart applied on roots of
// the run's own, CPU accounting, summaries and checks, and the report files
// and charts they write. Each study is a package of its own: drop, flood,
// egress and proxy.
package lab

// make generate sets the compiler and its flags (BPF2GO_*), the same for
// every object.
//go:generate sh -c "test -n '$BPF2GO_CFLAGS' || { echo 'BPF2GO_CFLAGS is unset: build the BPF objects with make generate' >&2; exit 1; }"
//go:generate go tool bpf2go -tags linux -target bpfel lab ../../bpf/lab.c
