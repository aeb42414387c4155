// SPDX-License-Identifier: GPL-2.0
/* rampart's data plane: one matcher, entry points for XDP and tc (ingress and
 * egress through tcx). The policy arrives as read-only globals set before load
 * (the rule array) and as maps (prefix lists, counters). */
#include "parse.h"
#include "lists.h"
#include "flood.h"

char __license[] SEC("license") = "GPL";

/* Set from Go through CollectionSpec.Variables before load. */
volatile __u32 rule_count = 0; /* not const: see need_src_lookup */
volatile const __u8 default_action = ACTION_PASS;
/* For a frame whose verdict hangs on fields it does not carry. */
volatile const __u8 unparsed_action = ACTION_DROP;
/* For a malformed frame: the verdict every rule and the default agree on,
 * else unparsed_action (the compiler works it out). */
volatile const __u8 malformed_action = ACTION_DROP;
/* Not const, so never dead code to the verifier: when it removes a whole
 * bpf_loop callback or subprog as dead (the IPv6 walk's with no lookups,
 * the SYN cookie code's with no rules), kernels up to 6.18 at least can
 * misplace the next subprog's start and fail the load ("verifier bug: No
 * program to jit"). The branch costs one cached load. */
volatile __u8 need_src_lookup = 0;
volatile __u8 need_dst_lookup = 0;
volatile const __u8 need_l4 = 0; /* some rule looks at the protocol, ports or flags */
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
	__u32 entry; /* the matching rule entry */
	__u8 maybe;  /* bit per kind of action of the rules that might have matched */
};

enum match_result {
	NO_MATCH = 0,
	MATCH = 1,
	MATCH_UNKNOWN = 2, /* every field read matches; one the frame lacks decides */
};

static __always_inline int rule_matches(const volatile struct rule *r, struct match_ctx *m)
{
	struct pkt *p = m->p;
	__u32 f = r->match;

	if ((f & MATCH_IPV4) && p->family != 4)
		return NO_MATCH;
	if ((f & MATCH_IPV6) && p->family != 6)
		return NO_MATCH;
	if ((f & MATCH_SRC) && !(m->src_mask & r->src_lists))
		return NO_MATCH;
	if ((f & MATCH_DST) && !(m->dst_mask & r->dst_lists))
		return NO_MATCH;
	if ((f & MATCH_LENGTH) && (p->len < r->len_lo || p->len > r->len_hi))
		return NO_MATCH;
	if (f & MATCH_PROTO) {
		if (p->l4 == L4_UNKNOWN)
			return MATCH_UNKNOWN;
		if (p->proto != r->proto)
			return NO_MATCH;
	}
	if (f & (MATCH_SPORT | MATCH_DPORT | MATCH_TCP_FLAGS)) {
		/* A non-first fragment has no ports: its datagram was judged by
		 * its first fragment. */
		if (p->l4 == L4_NONE)
			return NO_MATCH;
		if (p->l4 == L4_UNKNOWN)
			return MATCH_UNKNOWN;
		if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
			return NO_MATCH;
		if ((f & MATCH_TCP_FLAGS) && p->proto != IPPROTO_TCP)
			return NO_MATCH;
		if (f & (MATCH_SPORT | MATCH_DPORT)) {
			if (p->l4_len < L4_PORTS)
				return MATCH_UNKNOWN;
			if ((f & MATCH_SPORT) && (p->sport < r->sport_lo || p->sport > r->sport_hi))
				return NO_MATCH;
			if ((f & MATCH_DPORT) && (p->dport < r->dport_lo || p->dport > r->dport_hi))
				return NO_MATCH;
		}
		if (f & MATCH_TCP_FLAGS) {
			if (p->l4_len < L4_FLAGS)
				return MATCH_UNKNOWN;
			if ((p->tcp_flags & r->flags_set) != r->flags_set)
				return NO_MATCH;
			if (p->tcp_flags & r->flags_clear)
				return NO_MATCH;
		}
	}
	return MATCH;
}

/* bpf_loop callback: the verifier checks the body once, not once per rule. */
static long match_one(__u32 i, void *arg)
{
	struct match_ctx *m = arg;
	if (i >= MAX_RULES)
		return 1;
	int res = rule_matches(&rules[i], m);
	if (res == MATCH) {
		m->entry = i;
		m->slot = SLOT_RULE0 + rules[i].rule;
		return 1;
	}
	/* Bit 0: the rule would have passed it; bit 1: kept it from the
	 * stack (drop, or maybe: limit, syncookie). */
	if (res == MATCH_UNKNOWN)
		m->maybe |= 1 << (rules[i].action != ACTION_PASS);
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

/* What decide() tells the entry points to do. */
enum verdict {
	VERDICT_PASS = 0,
	VERDICT_DROP = 1,
	VERDICT_SYNCOOKIE = 2, /* a syncookie rule matched: *rule says which */
};

/* Decides a frame and counts it in exactly one slot. A frame takes the
 * verdict the first matching rule (or the default) gives, unless an earlier
 * rule that might have matched, had the frame carried the fields it needs,
 * would have given another kind: then the frame is unparsed. A limit rule
 * passes under its rate and drops over it (counted apart, in rule_events). */
static __always_inline int decide(__u32 bytes, int parsed, struct pkt *p, __u32 *rule)
{
	if (parsed == PARSE_NON_IP) {
		count(SLOT_NON_IP, bytes);
		return VERDICT_PASS;
	}
	if (parsed != PARSE_OK) {
		count(SLOT_MALFORMED, bytes);
		return malformed_action;
	}

	struct match_ctx m = {.p = p, .slot = SLOT_DEFAULT};
	if (need_src_lookup)
		m.src_mask = list_membership(p->family, p->saddr);
	if (need_dst_lookup)
		m.dst_mask = list_membership(p->family, p->daddr);

	bpf_loop(rule_count, match_one, &m, 0);

	__u8 act = default_action;
	if (m.slot != SLOT_DEFAULT) {
		if (m.entry >= MAX_RULES)
			return VERDICT_PASS;
		act = rules[m.entry].action;
		*rule = rules[m.entry].rule;
	}
	if (m.maybe & ~(1 << (act != ACTION_PASS))) {
		count(SLOT_UNPARSED, bytes);
		return unparsed_action;
	}
	switch (act) {
	case ACTION_LIMIT:
		if (!limit_conforms(*rule, p, bytes)) {
			count_event(*rule, EVENT_OVER);
			return VERDICT_DROP;
		}
		count(m.slot, bytes);
		return VERDICT_PASS;
	case ACTION_SYNCOOKIE:
		count(m.slot, bytes);
		return VERDICT_SYNCOOKIE;
	}
	count(m.slot, bytes);
	return act == ACTION_DROP ? VERDICT_DROP : VERDICT_PASS;
}

SEC("xdp")
int rampart_xdp(struct xdp_md *ctx)
{
	struct pkt p = {};
	__u32 rule = 0;
	int parsed = parse_xdp(ctx, &p, need_l4);
	__u32 bytes = ctx->data_end - ctx->data;
	switch (decide(bytes, parsed, &p, &rule)) {
	case VERDICT_DROP:
		return XDP_DROP;
	case VERDICT_SYNCOOKIE:
		/* SYNs are answered here; the ACK that returns a cookie is
		 * checked by rampart_tc_cookie, at tc. */
		if (is_syn(&p))
			return write_synack(ctx, &p, rule, 0) ? XDP_TX : XDP_DROP;
	}
	return XDP_PASS;
}

/* Never called, never loaded: its signature puts the enums of common.h into
 * the object's BTF, from which internal/abi is generated (BTF keeps no trace
 * of types only constants use). */
struct abi_enums {
	enum limits a;
	enum slot b;
	enum action c;
	enum match_field d;
	enum v4_entry e;
	enum v6_table f;
	enum cuckoo g;
	enum limit_flags h;
	enum rule_event i;
};

__attribute__((noinline)) int abi_enums(struct abi_enums *e)
{
	return e != 0;
}

/* tcx return codes; TCX_NEXT lets programs attached after ours run. */
#define TCX_NEXT -1
#define TCX_DROP 2

SEC("tc")
int rampart_tc(struct __sk_buff *skb)
{
	struct pkt p = {};
	__u32 rule = 0;
	int parsed = parse_skb(skb, &p, need_l4);
	switch (decide(skb->len, parsed, &p, &rule)) {
	case VERDICT_DROP:
		return TCX_DROP;
	case VERDICT_SYNCOOKIE:
		if (is_syn(&p))
			return write_synack(skb, &p, rule, 1) ? bpf_redirect(skb->ifindex, 0) : TCX_DROP;
		return cookie_ack(skb, &p, rule) ? TCX_NEXT : TCX_DROP;
	}
	return TCX_NEXT;
}

/* Beside rampart_xdp, when the policy has syncookie rules: checks the ACKs
 * that XDP passed on. The rules are matched again, uncounted (XDP counted
 * the frame). */
SEC("tc")
int rampart_tc_cookie(struct __sk_buff *skb)
{
	struct pkt p = {};
	if (parse_skb(skb, &p, 1) != PARSE_OK || p.proto != IPPROTO_TCP || is_syn(&p))
		return TCX_NEXT;
	struct match_ctx m = {.p = &p, .slot = SLOT_DEFAULT};
	if (need_src_lookup)
		m.src_mask = list_membership(p.family, p.saddr);
	if (need_dst_lookup)
		m.dst_mask = list_membership(p.family, p.daddr);
	bpf_loop(rule_count, match_one, &m, 0);
	if (m.slot == SLOT_DEFAULT || m.entry >= MAX_RULES || rules[m.entry].action != ACTION_SYNCOOKIE)
		return TCX_NEXT;
	return cookie_ack(skb, &p, rules[m.entry].rule) ? TCX_NEXT : TCX_DROP;
}
