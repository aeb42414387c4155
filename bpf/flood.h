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
