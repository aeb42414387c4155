/* Prefix-list membership: which lists hold an address, answered by one
 * class per address whatever the size or number of the lists. Shared by
 * the filter and the lookup benchmark. Tables are filled from Go before the
 * program is attached (internal/compile builds them); see bpf/common.h for
 * their layout. */
#pragma once

#include "common.h"

/* The IPv6 hash tables' sizes (log2 of their slots) and hash seed. */
volatile const __u32 v6_short_bits = 0;
volatile const __u32 v6_long_bits = 0;
volatile const __u64 v6_seed = 0;

/* max_entries of every table is set to its contents before load. */
#define TABLE(name, value_type)                                                 \
	struct {                                                                \
		__uint(type, BPF_MAP_TYPE_ARRAY);                               \
		__uint(max_entries, 1);                                         \
		__uint(map_flags, BPF_F_MMAPABLE);                              \
		__type(key, __u32);                                             \
		__type(value, value_type);                                      \
	} name SEC(".maps")

TABLE(v4_dir, struct dir_node);
TABLE(v4_entries, __u64);
TABLE(v4_bitmaps, struct v4_bitmap);
TABLE(v4_tbl8s, struct v4_tbl8);
TABLE(v6_dir, struct dir_node);
TABLE(v6_nodes, struct v6_node);
TABLE(v6_short, struct v6_slot);
TABLE(v6_long, struct v6_long_slot);
/* Class id -> bitmask of lists; class 0 is "in no list". */
TABLE(classes, __u64);

/* Small and changed in place; looked up only while it holds entries
 * (overlay_entries, per family, kept by Go). */
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

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} overlay_entries SEC(".maps");

/* The directory's entry index for a /24 block; -1 when it is not present. */
static __always_inline long dir_index(void *dir, __u32 blk)
{
	__u32 n = blk >> 6;
	struct dir_node *d = bpf_map_lookup_elem(dir, &n);
	if (!d)
		return -1;
	__u64 bit = 1ULL << (blk & 63);
	if (!(d->bits & bit))
		return -1;
	return d->rank + __builtin_popcountll(d->bits & (bit - 1));
}

static __always_inline __u32 v4_class(const __u8 *addr)
{
	__u32 a = (__u32)addr[0] << 24 | (__u32)addr[1] << 16 | (__u32)addr[2] << 8 | addr[3];
	long idx = dir_index(&v4_dir, a >> 8);
	if (idx < 0)
		return 0;
	__u32 i = idx;
	__u64 *ep = bpf_map_lookup_elem(&v4_entries, &i);
	if (!ep)
		return 0;
	__u64 e = *ep;
	__u32 lo = a & 0xff;
	switch (e >> V4E_TYPE_SHIFT) {
	case V4E_CLASS:
		return (__u32)e;
	case V4E_INLINE: {
		/* Is lo one of the four octets? A zero byte in octets ^ lo. */
		__u32 x = (__u32)(e >> V4E_OCTETS_SHIFT) ^ (lo * 0x01010101u);
		__u32 mask = (1u << V4_INLINE_CLASS_BITS) - 1;
		if ((x - 0x01010101u) & ~x & 0x80808080u)
			return (e >> V4E_HIT_SHIFT) & mask;
		return e & mask;
	}
	case V4E_BITMAP: {
		__u32 bi = (__u32)e;
		struct v4_bitmap *b = bpf_map_lookup_elem(&v4_bitmaps, &bi);
		if (!b)
			return 0;
		return (b->bits[lo >> 6] >> (lo & 63)) & 1 ? b->hit : b->base;
	}
	default: {
		__u32 ti = (__u32)e;
		struct v4_tbl8 *t = bpf_map_lookup_elem(&v4_tbl8s, &ti);
		return t ? t->cls[lo] : 0;
	}
	}
}

/* The multiply-shift hash of the IPv6 tables (Go's compile/v6.go has the
 * same): keys are lists' prefixes, never the packets', and the build keeps
 * every key within V6_MAX_PROBE slots of its home. */
static __always_inline __u64 v6_hash(__u64 hi, __u64 lo, __u32 len)
{
	__u64 h = (hi ^ v6_seed) * 0x9e3779b97f4a7c15ULL;
	h ^= lo + len;
	return (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ULL;
}

static __always_inline __u64 mask_top(__u64 v, __u32 bits)
{
	return bits >= 64 ? v : bits == 0 ? 0 : v & (~0ULL << (64 - bits));
}

/* The class of the prefix of length len (25 to 64) holding hi, or -1. */
static __always_inline long v6_probe_short(__u64 hi, __u32 len)
{
	__u64 key = mask_top(hi, len);
	__u32 mask = (1u << v6_short_bits) - 1;
	__u32 i = v6_hash(key, 0, len) >> (64 - v6_short_bits);
#pragma unroll
	for (int k = 0; k < V6_MAX_PROBE; k++) {
		__u32 slot = (i + k) & mask;
		struct v6_slot *s = bpf_map_lookup_elem(&v6_short, &slot);
		if (!s || !s->len)
			return -1;
		if (s->len == len && s->key == key)
			return s->cls;
	}
	return -1;
}

/* The class of the prefix of length len (65 to 128) holding hi:lo, or -1. */
static __always_inline long v6_probe_long(__u64 hi, __u64 lo, __u32 len)
{
	__u64 klo = mask_top(lo, len - 64);
	__u32 mask = (1u << v6_long_bits) - 1;
	__u32 i = v6_hash(hi, klo, len) >> (64 - v6_long_bits);
#pragma unroll
	for (int k = 0; k < V6_MAX_PROBE; k++) {
		__u32 slot = (i + k) & mask;
		struct v6_long_slot *s = bpf_map_lookup_elem(&v6_long, &slot);
		if (!s || !s->len)
			return -1;
		if (s->len == len && s->hi == hi && s->lo == klo)
			return s->cls;
	}
	return -1;
}

/* The walk over the lengths present under a /24, longest first. */
struct v6_walk {
	__u64 hi, lo;
	__u64 short_lens, long_lens;
	long cls;
};

static __always_inline int highest(__u64 v)
{
	return 63 - __builtin_clzll(v);
}

static long v6_step(__u32 i, void *arg)
{
	struct v6_walk *w = arg;
	if (w->long_lens) {
		int b = highest(w->long_lens);
		w->long_lens &= ~(1ULL << b);
		w->cls = v6_probe_long(w->hi, w->lo, V6_LONG_MIN + b);
	} else if (w->short_lens) {
		int b = highest(w->short_lens);
		w->short_lens &= ~(1ULL << b);
		w->cls = v6_probe_short(w->hi, V6_SHORT_MIN + b);
	} else {
		return 1;
	}
	return w->cls >= 0;
}

static __always_inline __u32 v6_class(const __u8 *addr)
{
	__u64 hi, lo;
	__builtin_memcpy(&hi, addr, 8);
	__builtin_memcpy(&lo, addr + 8, 8);
	hi = bpf_be64_to_cpu(hi);
	lo = bpf_be64_to_cpu(lo);
	long idx = dir_index(&v6_dir, hi >> 40);
	if (idx < 0)
		return 0;
	__u32 i = idx;
	struct v6_node *n = bpf_map_lookup_elem(&v6_nodes, &i);
	if (!n)
		return 0;
	if (!(n->short_lens | n->long_lens))
		return n->base;
	struct v6_walk w = {.hi = hi, .lo = lo, .short_lens = n->short_lens, .long_lens = n->long_lens, .cls = -1};
	/* The common case, one length, without the loop's call. */
	if (!v6_step(0, &w) && (w.short_lens | w.long_lens))
		bpf_loop(64 + 40, v6_step, &w, 0);
	return w.cls >= 0 ? w.cls : n->base;
}

/* The lists holding addr (4 or 16 bytes, network order). */
static __always_inline __u64 list_membership(__u8 family, const __u8 *addr)
{
	__u32 cls = family == 4 ? v4_class(addr) : v6_class(addr);
	__u64 *m = bpf_map_lookup_elem(&classes, &cls);
	__u64 mask = m ? *m : 0;

	__u32 fi = family == 4 ? 0 : 1;
	__u32 *live = bpf_map_lookup_elem(&overlay_entries, &fi);
	if (!live || !*live)
		return mask;
	struct overlay *o;
	if (family == 4) {
		struct lpm_v4_key k = {.prefixlen = 32};
		__builtin_memcpy(k.addr, addr, 4);
		o = bpf_map_lookup_elem(&overlay_v4, &k);
	} else {
		struct lpm_v6_key k = {.prefixlen = 128};
		__builtin_memcpy(k.addr, addr, 16);
		o = bpf_map_lookup_elem(&overlay_v6, &k);
	}
	if (o)
		mask = (mask & ~o->clear) | o->set;
	return mask;
}
