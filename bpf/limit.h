/* Rate limits: the generic cell rate algorithm, per rule or per source
 * prefix in a keyed, fixed-size table. */
#pragma once

#include "parse.h"
#include "lists.h" /* TABLE */
#include "flood.h"
#include "siphash.h"

/* The limit rules' rates, by rule. */
TABLE(limits, struct limit);

/* Per-rule limits: one schedule per rule, shared by every CPU. */
GEN_MAP(limit_state, BPF_MAP_TYPE_ARRAY, __u32, __u64, 1, 0);

/* Per-source limits: set-associative, keyed by a SipHash of the rule and
 * the source prefix; sized once, never allocated per packet. */
GEN_MAP(limit_sources, BPF_MAP_TYPE_ARRAY, __u32, struct limit_bucket, 1, 0);

/* Generic cell rate algorithm on a schedule tat (the theoretical arrival
 * time of the next packet): a packet conforms when the schedule, brought up
 * to now, runs at most tolerance ahead of it; then the schedule moves on by
 * the packet's cost. CPUs share the schedule through compare-and-swap. */
static __always_inline int gcra(__u64 *tat, __u64 now, __u64 cost, __u64 tolerance)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u64 old = *(volatile __u64 *)tat;
		__u64 start = old > now ? old : now;
		if (start - now > tolerance)
			return 0;
		if (__sync_val_compare_and_swap(tat, old, start + cost) == old)
			return 1;
	}
	return 0; /* four CPUs raced for it: over, rather than spin */
}

/* The top bits of a 64-bit word. */
static __always_inline __u64 top_bits(__u64 v, __u32 n)
{
	return n >= 64 ? v : n == 0 ? 0 : v & (~0ULL << (64 - n));
}

/* One source prefix's schedule in limit_sources. A way whose schedule is
 * not ahead of now owes nothing: reusing it loses nothing (a new source
 * starts with the same full burst), so only sources over their rate are
 * kept from eviction, and a flood of random sources cannot push them out
 * of the table to clear their debt. When every way of the bucket owes, the
 * new source is over: the table is full of sources over their rate. */
static __always_inline int limit_source(const struct config *c, __u32 gen, __u32 rule, const struct limit *l, const struct pkt *p, __u64 now, __u64 cost)
{
	/* As few words as the key needs (each is a SipHash round): an IPv4
	 * prefix shares one with the rule (under 2^24, MAX_RULES) and family,
	 * an IPv6 one up to /64 takes a second, a longer one a third. */
	__u64 id = (__u64)rule << 8 | p->family, h;
	if (p->family == 4) {
		h = siphash13(top_bits((__u64)bpf_ntohl(*(__u32 *)p->saddr) << 32, l->prefix4) | id, 0, 0, 1);
	} else {
		__u64 hi, lo;
		__builtin_memcpy(&hi, p->saddr, 8);
		__builtin_memcpy(&lo, p->saddr + 8, 8);
		hi = bpf_be64_to_cpu(hi);
		lo = bpf_be64_to_cpu(lo);
		if (l->prefix6 <= 64)
			h = siphash13(id, top_bits(hi, l->prefix6), 0, 2);
		else
			h = siphash13(id, hi, top_bits(lo, l->prefix6 - 64), 3);
	}
	__u32 b = (h >> 32) & (c->limit_buckets - 1);
	struct limit_bucket *bk = gen_lookup(&limit_sources, gen, &b);
	if (!bk)
		return 1;
	__u64 tag = h | 1;
	/* A pointer, not an index: indexing the ways with a value chosen in
	 * the loop needs range tracking that only some verifiers do (6.12's
	 * rejects it), while a pointer to a constant offset passes every one. */
	struct limit_entry *victim = 0;
	__u64 oldest = ~0ULL;
#pragma unroll
	for (int i = 0; i < LIMIT_WAYS; i++) {
		struct limit_entry *e = &bk->way[i];
		__u64 t = e->tag;
		if (t == tag)
			return gcra(&e->tat, now, cost, l->tolerance);
		__u64 due = e->tat;
		if ((t == 0 || due <= now) && due < oldest) {
			victim = e;
			oldest = due;
		}
	}
	if (!victim)
		return 0;
	struct limit_entry *e = victim;
	__u64 old = e->tag;
	if (__sync_val_compare_and_swap(&e->tag, old, tag) != old)
		return 0; /* another CPU took the way this instant */
	e->tat = now + cost;
	return 1;
}

/* Whether a packet of bytes conforms to rule's limit. */
static __always_inline int limit_conforms(const struct config *c, __u32 gen, __u32 rule, const struct pkt *p, __u32 bytes)
{
	const struct limit *l = gen_lookup(&limits, gen, &rule);
	if (!l)
		return 1;
	/* A coarse clock: the fine one fences the TSC read on every limited
	 * packet, most of a limit's cost. It steps by a tick (1-10 ms), so the
	 * compiler gives every schedule a tolerance of at least one tick: a
	 * schedule brought up to a stepped now still runs the rate over time,
	 * as iptables' hashlimit does on jiffies. */
	__u64 now = clock_ns();
	__u64 cost = l->interval;
	if (l->flags & LIMIT_BYTES)
		cost = (bytes * l->interval) >> LIMIT_BYTE_SHIFT;
	if (l->flags & LIMIT_PER_SOURCE)
		return limit_source(c, gen, rule, l, p, now, cost);
	__u64 *tat = gen_lookup(&limit_state, gen, &rule);
	return tat ? gcra(tat, now, cost, l->tolerance) : 1;
}
