/* What the defences against floods (limit.h, syncookie.h) share with the
 * matcher: the policy's settings, and the per-rule counts of what limit and
 * syncookie rules did besides matching. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "common.h"

/* The policy's settings (bpf/common.h). The SipHash key is random for every
 * load: table slots and cookies cannot be aimed at by whoever lacks it. */
volatile const struct config cfg = {.limit_buckets = 1};

/* By rule: struct rule_events. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rule_events);
} rule_events SEC(".maps");

static __always_inline void count_event(__u32 rule, int which)
{
	struct rule_events *e = bpf_map_lookup_elem(&rule_events, &rule);
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
