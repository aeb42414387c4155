// Package lab reproduces classic packet-filtering studies inside network
// namespaces of its own: topology, in-kernel generator, one setup per layer,
// measurement, and the report with its charts.
package lab

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" lab ../../bpf/lab.c -- -I../../bpf
