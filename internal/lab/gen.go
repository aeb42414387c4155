// Package lab reproduces classic packet-filtering studies inside network
// namespaces of its own: topology, in-kernel generator, one setup per layer,
// measurement, and the report with its charts.
package lab

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -I../../bpf/include" lab ../../bpf/lab.c -- -I../../bpf
