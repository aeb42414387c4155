// Package abi is the kernel ABI of rampart's filter: the structs and
// constants of bpf/common.h, generated from the filter object's BTF by ./gen
// (never written by hand). It imports nothing of the kernel and builds for
// any GOOS, so the packages that compute map contents (policy, compile) do
// too.
package abi

// The filter's loader (bpf2go, without types: they are here) goes to
// internal/datapath; this package's types come from that object, so one
// directive list keeps the order.
// make generate sets the compiler and its flags (BPF2GO_*), the same for
// every object.
//go:generate sh -c "test -n '$BPF2GO_CFLAGS' || { echo 'BPF2GO_CFLAGS is unset: build the BPF objects with make generate' >&2; exit 1; }"
//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -go-package datapath -output-dir ../datapath filter ../../bpf/filter.c
//go:generate go run ./gen -o abi_gen.go ../datapath/filter_bpfel.o
