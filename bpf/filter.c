// SPDX-License-Identifier: GPL-2.0
/* rampart's data plane: one matcher, entry points for XDP and tc (ingress and
 * egress through tcx). The policy arrives as read-only globals set before load
 * (the rule array) and as maps (prefix lists, counters). */
#include "parse.h"
#include "lists.h"

char __license[] SEC("license") = "GPL";

/* Set from Go through CollectionSpec.Variables before load. */
volatile const __u32 rule_count = 0;
volatile const __u8 default_action = ACTION_PASS;
volatile const __u8 need_src_lookup = 0;
volatile const __u8 need_dst_lookup = 0;
volatile const struct rule rules[MAX_RULES];

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NUM_SLOTS);
	__type(key, __u32);
	__type(value, struct counter);
} counters SEC(".maps");

struct match_ctx {
	struct pkt *p;
	__u64 src_mask;
	__u64 dst_mask;
	__u32 slot;
};

static __always_inline int rule_matches(const volatile struct rule *r, struct match_ctx *m)
{
	struct pkt *p = m->p;
	__u32 f = r->match;

	if ((f & MATCH_IPV4) && p->family != 4)
		return 0;
	if ((f & MATCH_IPV6) && p->family != 6)
		return 0;
	if ((f & MATCH_SRC) && !(m->src_mask & r->src_lists))
		return 0;
	if ((f & MATCH_DST) && !(m->dst_mask & r->dst_lists))
		return 0;
	if ((f & MATCH_PROTO) && p->proto != r->proto)
		return 0;
	if ((f & MATCH_LENGTH) && (p->len < r->len_lo || p->len > r->len_hi))
		return 0;
	if (f & (MATCH_SPORT | MATCH_DPORT | MATCH_TCP_FLAGS)) {
		if (!p->has_ports)
			return 0;
		if ((f & MATCH_SPORT) && (p->sport < r->sport_lo || p->sport > r->sport_hi))
			return 0;
		if ((f & MATCH_DPORT) && (p->dport < r->dport_lo || p->dport > r->dport_hi))
			return 0;
		if (f & MATCH_TCP_FLAGS) {
			if (p->proto != IPPROTO_TCP)
				return 0;
			if ((p->tcp_flags & r->flags_set) != r->flags_set)
				return 0;
			if (p->tcp_flags & r->flags_clear)
				return 0;
		}
	}
	return 1;
}

/* bpf_loop callback: the verifier checks the body once, not once per rule. */
static long match_one(__u32 i, void *arg)
{
	struct match_ctx *m = arg;
	if (i >= MAX_RULES)
		return 1;
	if (rule_matches(&rules[i], m)) {
		m->slot = SLOT_RULE0 + i;
		return 1;
	}
	return 0;
}

static __always_inline void count(__u32 slot, __u64 bytes)
{
	struct counter *c = bpf_map_lookup_elem(&counters, &slot);
	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
}

/* Returns the action for a frame and counts it in exactly one slot. */
static __always_inline int decide(void *data, void *data_end, __u64 bytes, int parsed, struct pkt *p)
{
	if (parsed != PARSE_OK) {
		count(parsed == PARSE_NON_IP ? SLOT_NON_IP : SLOT_MALFORMED, bytes);
		return ACTION_PASS;
	}

	struct match_ctx m = {.p = p, .slot = SLOT_DEFAULT};
	if (need_src_lookup)
		m.src_mask = list_membership(p->family, p->saddr);
	if (need_dst_lookup)
		m.dst_mask = list_membership(p->family, p->daddr);

	bpf_loop(rule_count, match_one, &m, 0);
	count(m.slot, bytes);

	if (m.slot == SLOT_DEFAULT)
		return default_action;
	__u32 i = m.slot - SLOT_RULE0;
	if (i >= MAX_RULES)
		return ACTION_PASS;
	return rules[i].action;
}

SEC("xdp")
int rampart_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct pkt p = {};
	int parsed = parse_frame(data, data_end, &p);
	int act = decide(data, data_end, data_end - data, parsed, &p);
	return act == ACTION_DROP ? XDP_DROP : XDP_PASS;
}

/* tcx return codes; TCX_NEXT lets programs attached after ours run. */
#define TCX_NEXT -1
#define TCX_DROP 2

SEC("tc")
int rampart_tc(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct pkt p = {};
	int parsed = parse_frame(data, data_end, &p);

	/* Headers outside the linear area: pull them in and parse again. */
	if (parsed == PARSE_MALFORMED && skb->len > data_end - data) {
		__u32 want = skb->len < MAX_HDR_OFF + 64 ? skb->len : MAX_HDR_OFF + 64;
		if (bpf_skb_pull_data(skb, want) == 0) {
			data = (void *)(long)skb->data;
			data_end = (void *)(long)skb->data_end;
			__builtin_memset(&p, 0, sizeof(p));
			parsed = parse_frame(data, data_end, &p);
		}
	}

	int act = decide(data, data_end, skb->len, parsed, &p);
	return act == ACTION_DROP ? TCX_DROP : TCX_NEXT;
}
