/* Prefix-list membership: which of up to 64 lists hold an address, answered
 * with a cost that does not grow with the size of the lists. Shared by the
 * filter and the lookup benchmark. Tables are filled from Go before the
 * program is attached (internal/compile builds them). */
#pragma once

#include "common.h"

/* Populated IPv6 prefix lengths, longest first. */
volatile const __u32 v6_len_count = 0;
volatile const __u8 v6_lens[V6_MAX_LENS];

/* max_entries of every table is set to its contents before load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct v4_chunk);
} v4_tbl24 SEC(".maps");

/* Bit per /24 block, 64 to a word: 2 MiB for the whole address space, so
 * it stays in cache and within the TLB's reach, and most lookups of most
 * lists end here. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} v4_present SEC(".maps");

/* Per word of v4_present, the number of listed blocks before it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} v4_rank SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct v4_bitmap);
} v4_bitmaps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct v4_tbl8);
} v4_tbl8s SEC(".maps");

/* Class id -> bitmask of lists; class 0 is "in no list". */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} v4_classes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, struct lpm_v6_key);
	__type(value, __u64);
} v6_prefixes SEC(".maps");

/* Small and changed in place; an empty trie costs next to nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_v4_key);
	__type(value, struct overlay);
} overlay_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_v6_key);
	__type(value, struct overlay);
} overlay_v6 SEC(".maps");

static __always_inline __u64 v4_base(const __u8 *addr)
{
	__u32 a = (__u32)addr[0] << 24 | (__u32)addr[1] << 16 | (__u32)addr[2] << 8 | addr[3];
	__u32 blk = a >> 8, word = blk >> 6, lo = a & 0xff, cls;
	__u64 *bits = bpf_map_lookup_elem(&v4_present, &word);
	if (!bits || !((*bits >> (blk & 63)) & 1))
		return 0;
	__u64 *rank = bpf_map_lookup_elem(&v4_rank, &word);
	if (!rank)
		return 0;
	__u32 idx = *rank + __builtin_popcountll(*bits & ((1ULL << (blk & 63)) - 1));
	__u32 chunk = idx / V4_CHUNK;
	struct v4_chunk *c = bpf_map_lookup_elem(&v4_tbl24, &chunk);
	if (!c)
		return 0;
	__u32 e = c->entry[idx & (V4_CHUNK - 1)];
	if (!(e & V4_SPLIT)) {
		cls = e;
	} else {
		__u32 idx = e & V4_INDEX_MASK;
		if (e & V4_TBL8_FLAG) {
			struct v4_tbl8 *t = bpf_map_lookup_elem(&v4_tbl8s, &idx);
			if (!t)
				return 0;
			cls = t->cls[lo];
		} else {
			struct v4_bitmap *b = bpf_map_lookup_elem(&v4_bitmaps, &idx);
			if (!b)
				return 0;
			cls = (b->bits[lo >> 6] >> (lo & 63)) & 1 ? b->hit : b->base;
		}
	}
	if (!cls)
		return 0;
	__u64 *m = bpf_map_lookup_elem(&v4_classes, &cls);
	return m ? *m : 0;
}

struct v6_probe {
	__u64 hi, lo; /* the address in host order */
	struct lpm_v6_key key;
	__u64 mask;
};

/* bpf_loop callback: probe one populated length; stop at the first hit,
 * which is the longest and carries its ancestors' lists too. */
static long v6_probe_len(__u32 i, void *arg)
{
	struct v6_probe *pr = arg;
	if (i >= V6_MAX_LENS)
		return 1;
	__u32 len = v6_lens[i];
	__u64 hi = pr->hi, lo = pr->lo;
	if (len == 0) {
		hi = lo = 0;
	} else if (len < 64) {
		hi &= ~0ULL << (64 - len);
		lo = 0;
	} else if (len == 64) {
		lo = 0;
	} else if (len < 128) {
		lo &= ~0ULL << (128 - len);
	}
	pr->key.prefixlen = len;
	hi = bpf_cpu_to_be64(hi);
	lo = bpf_cpu_to_be64(lo);
	__builtin_memcpy(pr->key.addr, &hi, 8);
	__builtin_memcpy(pr->key.addr + 8, &lo, 8);
	__u64 *m = bpf_map_lookup_elem(&v6_prefixes, &pr->key);
	if (m) {
		pr->mask = *m;
		return 1;
	}
	return 0;
}

static __always_inline __u64 v6_base(const __u8 *addr)
{
	if (!v6_len_count)
		return 0;
	struct v6_probe pr = {};
	__u64 hi, lo;
	__builtin_memcpy(&hi, addr, 8);
	__builtin_memcpy(&lo, addr + 8, 8);
	pr.hi = bpf_be64_to_cpu(hi);
	pr.lo = bpf_be64_to_cpu(lo);
	bpf_loop(v6_len_count, v6_probe_len, &pr, 0);
	return pr.mask;
}

/* The lists holding addr (4 or 16 bytes, network order). */
static __always_inline __u64 list_membership(__u8 family, const __u8 *addr)
{
	__u64 mask;
	struct overlay *o;
	if (family == 4) {
		struct lpm_v4_key k = {.prefixlen = 32};
		__builtin_memcpy(k.addr, addr, 4);
		mask = v4_base(addr);
		o = bpf_map_lookup_elem(&overlay_v4, &k);
	} else {
		struct lpm_v6_key k = {.prefixlen = 128};
		__builtin_memcpy(k.addr, addr, 16);
		mask = v6_base(addr);
		o = bpf_map_lookup_elem(&overlay_v6, &k);
	}
	if (o)
		mask = (mask & ~o->clear) | o->set;
	return mask;
}
