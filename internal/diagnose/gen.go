package diagnose

//go:generate go tool bpf2go -tags linux -target bpfel -type drop_key -type pending_drops -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" drops ../../bpf/drops.c -- -I../../bpf
