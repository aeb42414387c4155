/* Prefix-list membership: which lists hold an address, answered by one
 * class per address whatever the size or number of the lists. Shared by
 * the filter and the lookup benchmark. Tables are filled from Go before the
 * program is attached (internal/compile builds them); see bpf/common.h for
 * their layout. */
#pragma once

#include "common.h"

/* Every table a policy fills belongs to a generation: an inner map in
 * slot gen (0 or 1) of an outer array of maps. An apply fills a new
 * generation's maps in the slot no frame reads, then flips live
 * (filter.c): the program stays loaded, and a frame, which reads live once,
 * meets one generation whole. The inner maps' max_entries is set before
 * load: the capacity of the program's shape, which a generation fills up
 * to. */
#define GEN_MAP(name, map_type, key_type, value_type, entries, flags)           \
	struct {                                                                \
		__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);                       \
		__uint(max_entries, 2);                                         \
		__type(key, __u32);                                             \
		__array(values, struct {                                        \
			__uint(type, map_type);                                 \
			__uint(max_entries, entries);                           \
			__uint(map_flags, flags);                               \
			__type(key, key_type);                                  \
			__type(value, value_type);                              \
		});                                                             \
	} name SEC(".maps")

/* A generation's array filled through mmap. */
#define TABLE(name, value_type) GEN_MAP(name, BPF_MAP_TYPE_ARRAY, __u32, value_type, 1, BPF_F_MMAPABLE)

/* An inner map's key and value types reach the object's BTF only through
 * pointers in an array, where clang emits forward declarations a loader
 * cannot size. gen_types, never called and never loaded, emits them whole. */
struct gen_types {
	struct config config;
	struct rule rule;
	struct class_eqs class_eqs;
	struct counter counter;
	struct rule_events rule_events;
	struct limit limit;
	struct limit_bucket limit_bucket;
	struct v4_bucket v4_bucket;
	struct v4_dense_bucket v4_dense_bucket;
	struct v4_tbl8 v4_tbl8;
	struct v6_bucket v6_bucket;
	struct v6_short_bucket v6_short_bucket;
	struct v6_long_bucket v6_long_bucket;
	struct overlay overlay;
	struct overlay_lengths overlay_lengths;
	struct lpm_v4_key lpm_v4_key;
	struct lpm_v6_key lpm_v6_key;
};

__attribute__((noinline)) int gen_types(struct gen_types *t)
{
	return t != 0;
}

/* A generation's map: the inner map in slot gen of outer, or NULL. */
static __always_inline void *gen_map(void *outer, __u32 gen)
{
	__u32 g = gen & 1;
	return bpf_map_lookup_elem(outer, &g);
}

/* An element of a generation's map, or NULL. */
static __always_inline void *gen_lookup(void *outer, __u32 gen, const void *key)
{
	void *m = gen_map(outer, gen);
	return m ? bpf_map_lookup_elem(m, key) : 0;
}

/* The value type of a generation's map. */
#define GEN_VALUE(name) typeof(*name.values[0]->value)

/* A generation's settings (struct config): one element. */
GEN_MAP(configs, BPF_MAP_TYPE_ARRAY, __u32, struct config, 1, 0);

static __always_inline const struct config *gen_config(__u32 gen)
{
	__u32 zero = 0;
	return gen_lookup(&configs, gen, &zero);
}

TABLE(v4_blocks, struct v4_bucket);
TABLE(v4_wide, struct v4_bucket);
TABLE(v4_dense, struct v4_dense_bucket);
TABLE(v4_tbl8s, struct v4_tbl8);
TABLE(v6_blocks, struct v6_bucket);
TABLE(v6_short, struct v6_short_bucket);
TABLE(v6_long, struct v6_long_bucket);
/* Class id -> bitmask of lists; class 0 is "in no list". */
TABLE(classes, __u64);

/* Changed in place; keys are masked to their length. */
GEN_MAP(overlay_v4, BPF_MAP_TYPE_HASH, struct lpm_v4_key, struct overlay, 1 << 20, BPF_F_NO_PREALLOC);
GEN_MAP(overlay_v6, BPF_MAP_TYPE_HASH, struct lpm_v6_key, struct overlay, 1 << 20, BPF_F_NO_PREALLOC);

/* The lengths the overlay holds, per family (0: IPv4, 1: IPv6), kept by Go:
 * a length is added before its first entry and dropped after its last. */
GEN_MAP(overlay_lengths, BPF_MAP_TYPE_ARRAY, __u32, struct overlay_lengths, 2, 0);

/* A key's first bucket: multiply-shift, then a range reduction. */
static __always_inline __u32 first_bucket(__u32 digest, __u64 mul, __u32 buckets)
{
	return (((__u64)digest * mul) >> 32) * buckets >> 32;
}

/* Its second, in the first's page: four-slot tables (LOCAL); two-slot ones
 * take it anywhere (ANYWHERE), as Go's compile.shape says. */
#define LOCAL 1
#define ANYWHERE 0
static __always_inline __u32 second_bucket(__u32 first, __u32 digest, __u64 mul)
{
	return (first & ~(__u32)(PAGE_BUCKETS - 1)) | (((__u64)digest * mul) >> 58);
}

#define SLOTS(b) (sizeof((b)->slot) / sizeof((b)->slot[0]))

/* The slot s_ of a cuckoo table for which match holds, or NULL. The second
 * bucket is read before the first is compared, so that the two reads
 * overlap whatever the branch predictor guesses. (A second bucket past a
 * table's end cannot be: tables hold whole pages.) An empty table (0
 * buckets) is not read: a list of hosts leaves the others empty, and each
 * lookup is a chain of loads a frame waits on. */
#define CUCKOO_FIND(table, gen, buckets, mul, local, digest, match)             \
	({                                                                      \
		__u32 d_ = (digest);                                            \
		__u32 i_ = first_bucket(d_, (mul)[0], buckets);                 \
		__u32 j_ = (local) ? second_bucket(i_, d_, (mul)[1])            \
				   : first_bucket(d_, (mul)[1], buckets);         \
		void *t_ = (buckets) ? gen_map(&table, gen) : 0;                \
		GEN_VALUE(table) *x_ = t_ ? bpf_map_lookup_elem(t_, &i_) : 0;   \
		GEN_VALUE(table) *y_ = t_ ? bpf_map_lookup_elem(t_, &j_) : 0;   \
		typeof(&x_->slot[0]) found_ = 0;                                \
		if (x_ && y_) {                                                 \
			__u64 first_ = *(volatile __u64 *)y_;                   \
			(void)first_;                                           \
			for (int k_ = 0; k_ < SLOTS(x_); k_++) {                \
				typeof(found_) s_ = &x_->slot[k_];              \
				if (match)                                      \
					found_ = s_;                            \
			}                                                       \
			for (int k_ = 0; k_ < SLOTS(y_); k_++) {                \
				typeof(found_) s_ = &y_->slot[k_];              \
				if (match)                                      \
					found_ = s_;                            \
			}                                                       \
		}                                                               \
		found_;                                                         \
	})

static __always_inline __u32 v4_class(const struct list_params *lp, __u32 gen, const __u8 *addr)
{
	__u32 a = (__u32)addr[0] << 24 | (__u32)addr[1] << 16 | (__u32)addr[2] << 8 | addr[3];
	__u32 key = (a >> 8) + 1, wkey = (a >> 16) + 1;
	struct v4_block *b = CUCKOO_FIND(v4_blocks, gen, lp->v4_buckets, lp->v4_block_mul, LOCAL, key, s_->key == key);
	/* Read beside the block's buckets: a dense block, a /16 wholly in one
	 * class. */
	struct v4_dense *d = CUCKOO_FIND(v4_dense, gen, lp->v4_dense_buckets, lp->v4_dense_mul, ANYWHERE, key, s_->key == key);
	struct v4_block *w = CUCKOO_FIND(v4_wide, gen, lp->v4_wide_buckets, lp->v4_wide_mul, LOCAL, wkey, s_->key == wkey);
	__u32 lo = a & 0xff;
	if (d)
		return (d->bits[lo >> 6] >> (lo & 63)) & 1 ? d->hit : d->base;
	if (!b)
		return w ? (__u32)w->entry : 0;
	__u64 e = b->entry;
	switch (e >> V4E_TYPE_SHIFT) {
	case V4E_CLASS:
		return (__u32)e;
	case V4E_INLINE: {
		/* Is lo one of the eight octets? A zero byte in octets ^ lo. */
		__u32 x = (__u32)(e >> V4E_OCTETS_SHIFT) ^ (lo * 0x01010101u);
		__u32 y = b->octets ^ (lo * 0x01010101u);
		__u32 mask = (1u << V4_INLINE_CLASS_BITS) - 1;
		if (((x - 0x01010101u) & ~x & 0x80808080u) | ((y - 0x01010101u) & ~y & 0x80808080u))
			return (e >> V4E_HIT_SHIFT) & mask;
		return e & mask;
	}
	case V4E_PAIRS: {
		__u32 mask = (1u << V4_INLINE_CLASS_BITS) - 1;
		__u64 p0 = e >> V4E_PAIRS_SHIFT, p1 = p0 >> V4_PAIR_BITS;
		if ((p0 & 0xff) == lo)
			return (p0 >> 8) & mask;
		if ((p1 & 0xff) == lo)
			return (p1 >> 8) & mask;
		if ((b->octets & 0xff) == lo)
			return (b->octets >> 8) & mask;
		return e & mask;
	}
	default: {
		__u32 ti = (__u32)e;
		struct v4_tbl8 *t = gen_lookup(&v4_tbl8s, gen, &ti);
		return t ? t->cls[lo] : 0;
	}
	}
}

/* The digest of an IPv6 prefix key (Go's compile.digest6 is the same). */
static __always_inline __u32 v6_digest(__u64 hi, __u64 lo, __u32 len)
{
	__u64 h = hi * 0x9e3779b97f4a7c15ULL;
	h ^= lo + len;
	h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ULL;
	return h ^ (h >> 32);
}

static __always_inline __u64 mask_top(__u64 v, __u32 bits)
{
	return bits >= 64 ? v : bits == 0 ? 0 : v & (~0ULL << (64 - bits));
}

/* The class of the prefix of length len (25 to 64) holding hi, or -1. */
static __always_inline long v6_probe_short(const struct list_params *lp, __u32 gen, __u64 hi, __u32 len)
{
	__u64 key = mask_top(hi, len);
	struct v6_slot *s = CUCKOO_FIND(v6_short, gen, lp->v6_short_buckets, lp->v6_short_mul, LOCAL, v6_digest(key, 0, len),
					s_->len == len && s_->key == key);
	return s ? (long)s->cls : -1; /* not s->cls : -1, which is unsigned */
}

/* The class of the prefix of length len (65 to 128) holding hi:lo, or -1. */
static __always_inline long v6_probe_long(const struct list_params *lp, __u32 gen, __u64 hi, __u64 lo, __u32 len)
{
	__u64 klo = mask_top(lo, len - 64);
	struct v6_long_slot *s = CUCKOO_FIND(v6_long, gen, lp->v6_long_buckets, lp->v6_long_mul, ANYWHERE, v6_digest(hi, klo, len),
					     s_->len == len && s_->hi == hi && s_->lo == klo);
	return s ? (long)s->cls : -1; /* not s->cls : -1, which is unsigned */
}

static __always_inline long v6_probe(const struct list_params *lp, __u32 gen, __u64 hi, __u64 lo, __u32 len)
{
	return len > 64 ? v6_probe_long(lp, gen, hi, lo, len) : v6_probe_short(lp, gen, hi, len);
}

/* The walk over the lengths present under a /24, longest first. */
struct v6_walk {
	__u64 hi, lo;
	__u64 short_lens, long_lens;
	long cls;
	long hot; /* the probe of the hot length, made up front */
	__u32 gen;
};

static __always_inline int highest(__u64 v)
{
	return 63 - __builtin_clzll(v);
}

/* One length of the walk; 1 when the walk is over. */
static __always_inline long v6_next_length(struct v6_walk *w)
{
	__u32 len;
	if (w->long_lens) {
		int b = highest(w->long_lens);
		w->long_lens &= ~(1ULL << b);
		len = V6_LONG_MIN + b;
	} else if (w->short_lens) {
		int b = highest(w->short_lens);
		w->short_lens &= ~(1ULL << b);
		len = V6_SHORT_MIN + b;
	} else {
		return 1;
	}
	const struct config *c = gen_config(w->gen);
	if (!c)
		return 1;
	w->cls = len == c->lists.v6_hot_len ? w->hot : v6_probe(&c->lists, w->gen, w->hi, w->lo, len);
	return w->cls >= 0;
}

/* The loop's callback. The first step is inlined instead of being a direct
 * call of this function: a static function both called and passed to
 * bpf_loop makes the kernel's JIT fail when the verifier removes it as dead
 * code ("No program to jit", seen on 6.18). */
static long v6_step(__u32 i, void *arg)
{
	return v6_next_length(arg);
}

/* An address's two halves in host order. */
static __always_inline void v6_halves(const __u8 *addr, __u64 *hi, __u64 *lo)
{
	__builtin_memcpy(hi, addr, 8);
	__builtin_memcpy(lo, addr + 8, 8);
	*hi = bpf_be64_to_cpu(*hi);
	*lo = bpf_be64_to_cpu(*lo);
}

/* The probe of the hot length, made before the block's read, which it does
 * not wait on. */
static __always_inline long v6_hot(const struct list_params *lp, __u32 gen, __u64 hi, __u64 lo)
{
	return lp->v6_hot_len ? v6_probe(lp, gen, hi, lo, lp->v6_hot_len) : -1;
}

/* The block of hi's /24, or NULL. */
static __always_inline struct v6_block *v6_block_of(const struct list_params *lp, __u32 gen, __u64 hi)
{
	__u32 key = (hi >> 40) + 1;
	return CUCKOO_FIND(v6_blocks, gen, lp->v6_buckets, lp->v6_block_mul, ANYWHERE, key, s_->key == key);
}

/* The class of an address in block n (NULL: none) when the block decides
 * it without a walk: it holds no length, or only the hot one, whose probe
 * is hot. Else -1. */
static __always_inline long v6_block_class(const struct list_params *lp, const struct v6_block *n, long hot)
{
	if (!n)
		return 0;
	if (!(n->short_lens | n->long_lens))
		return n->base;
	__u32 len = lp->v6_hot_len;
	__u64 short_bit = len >= V6_SHORT_MIN && len < V6_LONG_MIN ? 1ULL << ((len - V6_SHORT_MIN) & 63) : 0;
	__u64 long_bit = len >= V6_LONG_MIN && len <= 128 ? 1ULL << ((len - V6_LONG_MIN) & 63) : 0;
	if ((short_bit | long_bit) && n->short_lens == short_bit && n->long_lens == long_bit)
		return hot >= 0 ? hot : n->base;
	return -1;
}

/* The class of hi:lo, given hot, its hot length's probe: the block's, or
 * the walk's over the lengths it holds, longest first. */
static __always_inline __u32 v6_class_walk(const struct list_params *lp, __u32 gen, __u64 hi, __u64 lo, long hot)
{
	struct v6_block *n = v6_block_of(lp, gen, hi);
	long cls = v6_block_class(lp, n, hot);
	if (cls >= 0 || !n)
		return cls;
	struct v6_walk w = {.hi = hi, .lo = lo, .short_lens = n->short_lens, .long_lens = n->long_lens, .cls = -1, .hot = hot, .gen = gen};
	/* The common case, one length, without the loop's call. */
	if (!v6_next_length(&w) && (w.short_lens | w.long_lens))
		bpf_loop(64 + 40, v6_step, &w, 0);
	return w.cls >= 0 ? w.cls : n->base;
}

static __always_inline __u32 v6_class(const struct list_params *lp, __u32 gen, const __u8 *addr)
{
	__u64 hi, lo;
	v6_halves(addr, &hi, &lo);
	return v6_class_walk(lp, gen, hi, lo, v6_hot(lp, gen, hi, lo));
}

/* The overlay's probe of an address: lengths left, longest first. */
struct overlay_probe {
	__u64 lens[3];
	__u64 hi, lo; /* the address in host order (IPv4: in hi's top 32 bits) */
	struct overlay *found;
	__u8 v6;
	__u32 gen;
};

/* Probes the longest length left; 1 when done. */
static __always_inline long overlay_probe(struct overlay_probe *pr)
{
	int w = pr->lens[2] ? 2 : pr->lens[1] ? 1 : 0;
	if (!pr->lens[w & 3])
		return 1;
	int b = highest(pr->lens[w & 3]);
	pr->lens[w & 3] &= ~(1ULL << b);
	__u32 len = w * 64 + b;
	if (pr->v6) {
		struct lpm_v6_key k = {.prefixlen = len};
		__u64 hi = bpf_cpu_to_be64(mask_top(pr->hi, len));
		__u64 lo = bpf_cpu_to_be64(len > 64 ? mask_top(pr->lo, len - 64) : 0);
		__builtin_memcpy(k.addr, &hi, 8);
		__builtin_memcpy(k.addr + 8, &lo, 8);
		pr->found = gen_lookup(&overlay_v6, pr->gen, &k);
	} else {
		struct lpm_v4_key k = {.prefixlen = len};
		__u32 a = bpf_htonl((__u32)(mask_top(pr->hi, len) >> 32));
		__builtin_memcpy(k.addr, &a, 4);
		pr->found = gen_lookup(&overlay_v4, pr->gen, &k);
	}
	return pr->found != 0;
}

/* The loop's callback; the first probe is made inline (see v6_step). */
static long overlay_step(__u32 i, void *arg)
{
	return overlay_probe(arg);
}

/* An address's class in generation gen's tables, whose settings are c. */
static __always_inline __u32 address_class(const struct config *c, __u32 gen, __u8 family, const __u8 *addr)
{
	return family == 4 ? v4_class(&c->lists, gen, addr) : v6_class(&c->lists, gen, addr);
}

/* The lengths generation gen's overlay holds for a family, or NULL when
 * it holds none. */
static __always_inline struct overlay_lengths *overlay_lengths_of(__u32 gen, __u8 family)
{
	__u32 fi = family == 4 ? 0 : 1;
	struct overlay_lengths *lens = gen_lookup(&overlay_lengths, gen, &fi);
	return lens && (lens->bits[0] | lens->bits[1] | lens->bits[2]) ? lens : 0;
}

/* Applies generation gen's overlay for addr to *mask, the lists of the
 * address's class. Returns whether the overlay changed them. */
static __always_inline int overlay_mask(__u32 gen, __u8 family, const __u8 *addr, __u64 *mask)
{
	struct overlay_lengths *lens = overlay_lengths_of(gen, family);
	if (!lens)
		return 0;
	struct overlay_probe pr = {.lens = {lens->bits[0], lens->bits[1], lens->bits[2]}, .v6 = family != 4, .gen = gen};
	if (family == 4) {
		__u32 a;
		__builtin_memcpy(&a, addr, 4);
		pr.hi = (__u64)bpf_ntohl(a) << 32;
	} else {
		__builtin_memcpy(&pr.hi, addr, 8);
		__builtin_memcpy(&pr.lo, addr + 8, 8);
		pr.hi = bpf_be64_to_cpu(pr.hi);
		pr.lo = bpf_be64_to_cpu(pr.lo);
	}
	if (!overlay_probe(&pr))
		bpf_loop(128, overlay_step, &pr, 0);
	if (!pr.found)
		return 0;
	*mask = (*mask & ~pr.found->clear) | pr.found->set;
	return 1;
}

/* The lists holding addr (4 or 16 bytes, network order) in generation gen. */
static __always_inline __u64 list_membership(__u32 gen, __u8 family, const __u8 *addr)
{
	const struct config *c = gen_config(gen);
	if (!c)
		return 0;
	__u32 cls = address_class(c, gen, family, addr);
	__u64 *m = gen_lookup(&classes, gen, &cls);
	__u64 mask = m ? *m : 0;
	overlay_mask(gen, family, addr, &mask);
	return mask;
}
