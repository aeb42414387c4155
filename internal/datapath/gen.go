// Package datapath loads rampart's BPF objects, fills their maps, attaches
// them to interfaces, swaps them atomically and pins them in bpffs.
package datapath

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" filter ../../bpf/filter.c -- -I../../bpf
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" bench ../../bpf/bench.c -- -I../../bpf
