// SPDX-License-Identifier: GPL-2.0
/* Programs for `rampart bench lookup`, run through BPF_PROG_TEST_RUN. Each
 * adds one step to the one before: a bare drop, parsing, a random source
 * address per packet (the baseline every lookup pays), then a lookup in the
 * kernel's LPM trie or in rampart's tables. */
#include "parse.h"
#include "lists.h"

char __license[] SEC("license") = "GPL";

enum bench_structure {
	BENCH_BASELINE = 0,
	BENCH_KERNEL_LPM = 1,
	BENCH_RAMPART = 2,
};

volatile const enum bench_structure structure = BENCH_BASELINE;
volatile const __u8 family = 4;
/* IPv6 sources are v6_base with the low 32 bits random: the same density
 * of hits as IPv4 for lists drawn the same way. */
volatile const __u8 v6_base_addr[16];

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

/* Per-CPU count of lookups that found the address in some list. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
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
	if (parse_xdp(ctx, &p, 1) != PARSE_OK)
		return XDP_PASS;
	return XDP_DROP;
}

SEC("xdp")
int bench_lookup(struct xdp_md *ctx)
{
	struct pkt p = {};
	if (parse_xdp(ctx, &p, 1) != PARSE_OK)
		return XDP_PASS;

	__u32 r = bpf_get_prandom_u32();
	struct lpm_v6_key k = {};
	if (family == 4) {
		k.prefixlen = 32;
		__builtin_memcpy(k.addr, &r, 4);
	} else {
		k.prefixlen = 128;
		for (int i = 0; i < 12; i++)
			k.addr[i] = v6_base_addr[i];
		__builtin_memcpy(k.addr + 12, &r, 4);
	}
	__builtin_memcpy(p.saddr, k.addr, 16);

	__u64 mask = 0;
	if (structure == BENCH_KERNEL_LPM) {
		__u64 *m;
		if (family == 4) {
			struct lpm_v4_key k4 = {.prefixlen = 32};
			__builtin_memcpy(k4.addr, &r, 4);
			m = bpf_map_lookup_elem(&kernel_lpm_v4, &k4);
		} else {
			m = bpf_map_lookup_elem(&kernel_lpm_v6, &k);
		}
		mask = m ? *m : 0;
	} else if (structure == BENCH_RAMPART) {
		mask = list_membership(p.family, p.saddr);
	} else {
		mask = p.saddr[0] == 0xff && p.saddr[3] == 0xff; /* keeps r live */
	}
	if (mask) {
		__u32 zero = 0;
		__u64 *h = bpf_map_lookup_elem(&hits, &zero);
		if (h)
			(*h)++;
	}
	return XDP_DROP;
}
