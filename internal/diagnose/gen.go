package diagnose

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -tags linux -target bpfel -type drop_key -type pending_drops -cflags "-O2 -g -Wall -Werror -I../../bpf/include" drops ../../bpf/drops.c -- -I../../bpf
