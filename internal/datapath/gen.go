// Package datapath loads rampart's BPF objects, fills their maps, attaches
// them to interfaces, swaps them atomically and pins them in bpffs.
package datapath

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -I../../bpf/include" filter ../../bpf/filter.c -- -I../../bpf
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -I../../bpf/include" bench ../../bpf/bench.c -- -I../../bpf
