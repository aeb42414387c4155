package diagnose

// make generate sets the compiler and its flags (BPF2GO_*), the same for
// every object.
//go:generate sh -c "test -n '$BPF2GO_CFLAGS' || { echo 'BPF2GO_CFLAGS is unset: build the BPF objects with make generate' >&2; exit 1; }"
//go:generate go tool bpf2go -tags linux -target bpfel -type drop_key -type pending_drops drops ../../bpf/drops.c
