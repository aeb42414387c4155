// SPDX-License-Identifier: GPL-2.0
/* Programs for `rampart bench lookup`, run through BPF_PROG_TEST_RUN. Each
 * adds one step to the one before: a bare drop, parsing, the next source
 * address from a table of sources (the baseline every lookup pays), then a
 * lookup of it: in the kernel's LPM trie, in rampart's tables, or one read
 * from an array as big as rampart's tables (the cost of one miss at that
 * footprint). */
#include "parse.h"
#include "lists.h"

char __license[] SEC("license") = "GPL";

enum bench_structure {
	BENCH_BASELINE = 0,
	BENCH_KERNEL_LPM = 1,
	BENCH_RAMPART = 2,
	BENCH_ONE_READ = 3,
};

volatile const enum bench_structure structure = BENCH_BASELINE;
volatile const __u8 family = 4;
volatile const __u32 source_mask = 0;    /* sources' entries - 1, a power of two */
volatile const __u32 one_read_words = 1; /* one_read's entries */

/* The traffic: source addresses taken in turn (IPv4 in the first 4 bytes).
 * Read in order, so the hardware prefetches them. */
struct bench_source {
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct bench_source);
} sources SEC(".maps");

__u32 next_source;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} one_read SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_v4_key);
	__type(value, __u64);
} kernel_lpm_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_v6_key);
	__type(value, __u64);
} kernel_lpm_v6 SEC(".maps");

/* Per-CPU counts: [0] lookups, [1] lookups that found the address in some
 * list. Counted here, not from the runs asked for: a run the kernel cuts
 * short for a signal is run again. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} hits SEC(".maps");

SEC("xdp")
int bench_drop(struct xdp_md *ctx)
{
	return XDP_DROP;
}

SEC("xdp")
int bench_parse(struct xdp_md *ctx)
{
	struct pkt p = {};
	if (parse_frame_xdp(ctx, &p, 1) != PARSE_OK)
		return XDP_PASS;
	return XDP_DROP;
}

SEC("xdp")
int bench_lookup(struct xdp_md *ctx)
{
	struct pkt p = {};
	if (parse_frame_xdp(ctx, &p, 1) != PARSE_OK)
		return XDP_PASS;

	__u32 si = next_source++ & source_mask;
	struct bench_source *src = bpf_map_lookup_elem(&sources, &si);
	if (!src)
		return XDP_PASS;
	__builtin_memcpy(p.saddr, src->addr, 16);

	__u64 mask = 0;
	if (structure == BENCH_KERNEL_LPM) {
		__u64 *m;
		if (family == 4) {
			struct lpm_v4_key k = {.prefixlen = 32};
			__builtin_memcpy(k.addr, p.saddr, 4);
			m = bpf_map_lookup_elem(&kernel_lpm_v4, &k);
		} else {
			struct lpm_v6_key k = {.prefixlen = 128};
			__builtin_memcpy(k.addr, p.saddr, 16);
			m = bpf_map_lookup_elem(&kernel_lpm_v6, &k);
		}
		mask = m ? *m : 0;
	} else if (structure == BENCH_RAMPART) {
		mask = list_membership(0, family, p.saddr);
	} else if (structure == BENCH_ONE_READ) {
		__u32 x, y;
		__builtin_memcpy(&x, p.saddr, 4);
		__builtin_memcpy(&y, p.saddr + 12, 4);
		__u32 i = ((__u64)((x ^ y) * 0x9e3779b1u) * one_read_words) >> 32;
		__u32 *w = bpf_map_lookup_elem(&one_read, &i);
		mask = w ? *w : 0;
	} else {
		mask = p.saddr[0] == 0xff && p.saddr[3] == 0xff; /* keeps the source live */
	}
	__u32 k = 0;
	__u64 *n = bpf_map_lookup_elem(&hits, &k);
	if (n)
		(*n)++;
	if (mask) {
		k = 1;
		n = bpf_map_lookup_elem(&hits, &k);
		if (n)
			(*n)++;
	}
	return XDP_DROP;
}
