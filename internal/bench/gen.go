package bench

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -tags linux -target bpfel -no-global-types -type bench_structure -cflags "-O2 -g -Wall -Werror -I../../bpf/include" bench ../../bpf/bench.c -- -I../../bpf
