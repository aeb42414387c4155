/* What the defences against floods (limit.h, syncookie.h) share with the
 * matcher: the policy's settings, and the per-rule counts of what limit and
 * syncookie rules did besides matching. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "common.h"
#include "lists.h" /* GEN_MAP */

/* The SipHash key: random, set before load and kept by every generation
 * (a new one would fail every cookie in flight), so that table slots and
 * cookies cannot be aimed at by whoever lacks it. */
volatile const __u64 flood_key[2] = {0, 0};

/* The kernel's tick in ns, set before load (internal/datapath's
 * kernelTick): clock_ns is jiffies in ns, the coarse clock's steps from
 * another start, which is all limits and cookies ask of a clock (their
 * state is a program's own). The verifier inlines bpf_jiffies64 into one
 * load on 64-bit JITs, where bpf_ktime_get_coarse_ns costs a call and a
 * return: 5% of the receiving core under lab flood's SYN flood, and about
 * 15 of a limited packet's 74-78 ns in bench rules. */
volatile const __u64 tick_ns = 4000000;

static __always_inline __u64 clock_ns(void)
{
	return bpf_jiffies64() * tick_ns;
}

/* By rule: struct rule_events. */
GEN_MAP(rule_events, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct rule_events, 1, 0);

static __always_inline void count_event(__u32 gen, __u32 rule, int which)
{
	struct rule_events *e = gen_lookup(&rule_events, gen, &rule);
	if (!e)
		return;
	switch (which) {
	case EVENT_OVER:
		e->over++;
		break;
	case EVENT_COOKIE_SENT:
		e->cookies_sent++;
		break;
	case EVENT_COOKIE_OK:
		e->cookies_ok++;
		break;
	default:
		e->cookies_bad++;
	}
}
