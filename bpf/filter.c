// SPDX-License-Identifier: GPL-2.0
/* rampart's data plane: one matcher, entry points for XDP and tc (ingress and
 * egress through tcx). The policy arrives as read-only globals set before load
 * (the rule array) and as maps (prefix lists, counters). */
#include "parse.h"
#include "lists.h"
#include "flood.h"
#include "limit.h"
#include "syncookie.h"

char __license[] SEC("license") = "GPL";

/* Set from Go before load, beside cfg (flood.h). Not const, so never dead
 * code to the verifier: when it removes a whole bpf_loop callback or
 * subprog as dead (the IPv6 walk's with no lookups, the SYN cookie code's
 * with no rules, the tree walk's with no rules), kernels up to 6.18 at least
 * can misplace the next subprog's start and fail the load ("verifier bug:
 * No program to jit"). The branch costs one cached load. */
volatile __u8 need_src_lookup = 0;
volatile __u8 need_dst_lookup = 0;
volatile __u32 num_trees = 0;

/* The rule entries, in policy order; max_entries of these tables is set to
 * their contents before load. */
TABLE(rules, struct rule);
/* Arrays of u32 words, two to an element: an array map's elements are
 * 8-byte aligned, and these are filled through mmap. */
TABLE(tree, __u64);
TABLE(field_eqs, __u64); /* FIELD_VALUES words: see enum field_base */
TABLE(class_eqs, struct class_eqs); /* by address class */

/* The eqs of the masks the overlay makes, as far as they are known. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, __u64);
	__type(value, struct class_eqs);
} mask_eqs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1); /* SLOT_RULE0 + rules, set before load */
	__type(key, __u32);
	__type(value, struct counter);
} counters SEC(".maps");

/* Word i of a u32 array (tree, field_eqs), or NULL past its end. */
static __always_inline __u32 *word(void *map, __u32 i)
{
	__u32 e = i >> 1;
	__u32 *w = bpf_map_lookup_elem(map, &e);
	return w ? w + (i & 1) : 0;
}

/* One frame's classification. */
struct match_ctx {
	struct pkt *p;
	__u64 src_mask;
	__u64 dst_mask;
	__u32 src_eq;
	__u32 dst_eq;
	__u32 node;       /* the tree walk's offset; then the leaf's */
	__u32 first;      /* the lowest entry that matches; NO_ENTRY */
	__u32 unknown[2]; /* the lowest that might have, had the frame carried
			   * the fields it needs: [0] would pass, [1] not */
};

#define NO_ENTRY 0xffffffffu

enum match_result {
	NO_MATCH = 0,
	MATCH = 1,
	MATCH_UNKNOWN = 2, /* every field read matches; one the frame lacks decides */
};

/* The fields the classifier's trees leave to the leaf besides DSCP (in
 * rule_matches): fragment bits, ICMP type and code (what BGP FlowSpec
 * routes match besides). */
static __always_inline int rule_matches_more(const struct rule *r, const struct pkt *p)
{
	__u32 f = r->match;
	if (f & MATCH_FRAGMENT) {
		/* IPv6's bits come from the chain's fragment header. */
		if (p->family == 6 && p->l4 == L4_UNKNOWN)
			return MATCH_UNKNOWN;
		if ((p->frag & r->frag_set) != r->frag_set || (p->frag & r->frag_clear))
			return NO_MATCH;
	}
	if (f & (MATCH_ICMP_TYPE | MATCH_ICMP_CODE)) {
		if (p->l4 == L4_NONE)
			return NO_MATCH;
		if (p->l4 == L4_UNKNOWN)
			return MATCH_UNKNOWN;
		if (p->proto != (p->family == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6))
			return NO_MATCH;
		if (p->l4_len < L4_ICMP)
			return MATCH_UNKNOWN;
		if ((f & MATCH_ICMP_TYPE) && (p->icmp_type < r->icmp_type_lo || p->icmp_type > r->icmp_type_hi))
			return NO_MATCH;
		if ((f & MATCH_ICMP_CODE) && (p->icmp_code < r->icmp_code_lo || p->icmp_code > r->icmp_code_hi))
			return NO_MATCH;
	}
	return MATCH;
}

/* Whether an IPv6 address's bits under mask are bits (an IPv4 frame's
 * never are: the rule is IPv6's). */
static __always_inline int bits_match(const struct pkt *p, const __u8 *addr, const __u64 *mask, const __u64 *bits)
{
	const __u64 *a = (const __u64 *)addr;
	return p->family == 6 && (a[0] & mask[0]) == bits[0] && (a[1] & mask[1]) == bits[1];
}

static __always_inline int rule_matches(const struct rule *r, struct match_ctx *m)
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
	if ((f & MATCH_SRC_BITS) && !bits_match(p, p->saddr, r->src_mask, r->src_bits))
		return NO_MATCH;
	if ((f & MATCH_DST_BITS) && !bits_match(p, p->daddr, r->dst_mask, r->dst_bits))
		return NO_MATCH;
	if ((f & MATCH_LENGTH) && (p->len < r->len_lo || p->len > r->len_hi))
		return NO_MATCH;
	/* DSCP and the flow label are the IP header's: known whatever follows. */
	if ((f & MATCH_DSCP) && (p->dscp < r->dscp_lo || p->dscp > r->dscp_hi))
		return NO_MATCH;
	if (f & MATCH_FLOW_LABEL) {
		__u32 flow = (__u32)p->flow[0] << 16 | (__u32)p->flow[1] << 8 | p->flow[2];
		if (p->family != 6 || flow < r->flow_lo || flow > r->flow_hi)
			return NO_MATCH;
	}
	if (f & MATCH_PROTO) {
		if (p->l4 == L4_UNKNOWN)
			return MATCH_UNKNOWN;
		if (p->proto != r->proto)
			return NO_MATCH;
	}
	if (f & (MATCH_FRAGMENT | MATCH_ICMP_TYPE | MATCH_ICMP_CODE)) {
		int res = rule_matches_more(r, p);
		if (res != MATCH)
			return res;
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

/* The frame's value of a field, as an eq. */
static __always_inline __u32 field_eq(__u32 field, const struct match_ctx *m)
{
	const struct pkt *p = m->p;
	__u32 v;
	switch (field) {
	case FIELD_FAMILY:
		return p->family == 6;
	case FIELD_SRC:
		return m->src_eq;
	case FIELD_DST:
		return m->dst_eq;
	case FIELD_PROTO:
		v = BASE_PROTO + (p->l4 == L4_UNKNOWN ? VALUE_UNKNOWN_PROTO : p->proto);
		break;
	case FIELD_SPORT:
	case FIELD_DPORT:
		/* As rule_matches judges ports. */
		if (p->l4 == L4_UNKNOWN)
			v = VALUE_UNKNOWN_PORTS;
		else if (p->l4 == L4_NONE || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP))
			v = VALUE_NO_PORTS;
		else if (p->l4_len < L4_PORTS)
			v = VALUE_UNKNOWN_PORTS;
		else
			v = field == FIELD_SPORT ? p->sport : p->dport;
		v += field == FIELD_SPORT ? BASE_SPORT : BASE_DPORT;
		break;
	case FIELD_FLAGS:
		if (p->l4 == L4_UNKNOWN)
			v = VALUE_UNKNOWN_FLAGS;
		else if (p->l4 == L4_NONE || p->proto != IPPROTO_TCP)
			v = VALUE_NO_FLAGS;
		else if (p->l4_len < L4_FLAGS)
			v = VALUE_UNKNOWN_FLAGS;
		else
			v = p->tcp_flags;
		v += BASE_FLAGS;
		break;
	default:
		v = BASE_LENGTH + (p->len > VALUE_LONG ? VALUE_LONG : p->len);
	}
	__u32 *eq = word(&field_eqs, v);
	return eq ? *eq : 0;
}

/* Entry i of the leaf at m->node, in policy order; 1 when the scan is over.
 * The first entry and the first level below are taken inline, the rest in
 * bpf_loop callbacks: a static function both called and passed to bpf_loop
 * makes the kernel's JIT fail when the verifier removes it as dead code
 * ("No program to jit", seen on 6.18), so each step has an inline body. */
static __always_inline long scan_entry(struct match_ctx *m, __u32 i)
{
	__u32 *e = word(&tree, m->node + 1 + i);
	if (!e || *e >= m->first)
		return 1; /* an earlier entry of another tree matched */
	__u32 entry = *e;
	struct rule *r = bpf_map_lookup_elem(&rules, &entry);
	if (!r)
		return 1;
	int res = rule_matches(r, m);
	if (res == MATCH) {
		m->first = entry;
		return 1;
	}
	if (res == MATCH_UNKNOWN) {
		__u32 kind = r->action != ACTION_PASS;
		if (entry < m->unknown[kind & 1])
			m->unknown[kind & 1] = entry;
	}
	return 0;
}

static long scan_rest(__u32 i, void *arg)
{
	return scan_entry(arg, i + 1);
}

/* One step down a tree, until m->node is a leaf's ref; 1 when there. */
static __always_inline long walk_step(struct match_ctx *m)
{
	__u32 kind = m->node >> TREE_KIND_SHIFT;
	if (kind >= NUM_FIELDS)
		return 1;
	__u32 *child = word(&tree, (m->node & TREE_OFFSET_MASK) + field_eq(kind, m));
	if (!child) {
		m->node = 0; /* cannot be: the field's node, never a leaf */
		return 1;
	}
	m->node = *child;
	return 0;
}

/* (The leaf is scanned by the caller, not from this callback: a bpf_loop
 * nested in another's callback adds a frame to the stack Linux 6.1 allows.) */
static long walk_rest(__u32 i, void *arg)
{
	return walk_step(arg);
}

/* What classify needs of an address. */
struct address {
	__u64 mask; /* its lists */
	__u32 eq;   /* its eq as a source or destination */
};

/* Looks up p's source (dst 0) or destination. A global function: the
 * verifier checks it once per program, not once per address, and its frame
 * (the IPv6 walk's, the overlay probe's) is not classify's, within the 512
 * bytes of stack Linux 6.1 allows a chain of calls (main 160, classify 120,
 * this 184, a callback 24: at the limit; measure before growing any). */
__noinline int address_lookup(const struct pkt *p, int dst, struct address *out)
{
	if (!p || !out)
		return 0;
	__u64 mask;
	__u32 cls;
	struct class_eqs *e;
	if (lookup_membership(p->family, dst ? p->daddr : p->saddr, &mask, &cls))
		e = bpf_map_lookup_elem(&mask_eqs, &mask);
	else
		e = bpf_map_lookup_elem(&class_eqs, &cls);
	out->mask = mask;
	out->eq = e ? (dst ? e->dst : e->src) : EQ_ANY;
	return 0;
}

/* The first rule entry a parsed frame matches (NO_ENTRY: none), and in
 * *maybe the kinds of action of earlier entries that might have matched had
 * it carried the fields they need: bit 0 would have passed it, bit 1 kept it
 * from the stack (drop, or maybe: limit, syncookie). Not inlined: its state
 * lives in its own frame, not beside write_synack's, within the 512 bytes
 * of stack Linux 6.1 allows a chain of calls. */
static __noinline __u32 classify(struct pkt *p, __u32 *maybe)
{
	struct match_ctx m = {.p = p, .src_eq = EQ_ANY, .dst_eq = EQ_ANY};
	m.first = m.unknown[0] = m.unknown[1] = NO_ENTRY;
	struct address a;
	if (need_src_lookup) {
		address_lookup(p, 0, &a);
		m.src_mask = a.mask;
		m.src_eq = a.eq;
	}
	if (need_dst_lookup) {
		address_lookup(p, 1, &a);
		m.dst_mask = a.mask;
		m.dst_eq = a.eq;
	}
	for (__u32 t = 0; t < MAX_TREES; t++) {
		if (t >= num_trees)
			break;
		m.node = cfg.tree_roots[t];
		/* Two levels inline: most trees are that deep. */
		if (!walk_step(&m) && !walk_step(&m))
			bpf_loop(TREE_DEPTH - 2, walk_rest, &m, 0);
		if (m.node >> TREE_KIND_SHIFT != TREE_LEAF)
			continue;
		m.node &= TREE_OFFSET_MASK;
		__u32 *n = word(&tree, m.node);
		if (n && *n && !scan_entry(&m, 0))
			bpf_loop(*n - 1, scan_rest, &m, 0);
	}
	*maybe = (m.unknown[0] < m.first) | (m.unknown[1] < m.first) << 1;
	return m.first;
}

/* The rule entry a parsed frame matches first, NULL when none does; in
 * *maybe, as classify says, the kinds of action of earlier entries that
 * might have. Inlined: a frame of its own would add to the stack of the
 * chain of calls through classify, at the 512 bytes Linux 6.1 allows. */
static __always_inline struct rule *first_rule(struct pkt *p, __u32 *maybe)
{
	__u32 first = classify(p, maybe);
	return first == NO_ENTRY ? 0 : bpf_map_lookup_elem(&rules, &first);
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
		return cfg.malformed_action;
	}

	__u32 maybe = 0;
	struct rule *r = first_rule(p, &maybe);

	__u8 act = cfg.default_action;
	__u32 slot = SLOT_DEFAULT;
	if (r) {
		act = r->action;
		*rule = r->rule;
		slot = SLOT_RULE0 + r->rule;
	}
	if (maybe & ~(1 << (act != ACTION_PASS))) {
		count(SLOT_UNPARSED, bytes);
		return cfg.unparsed_action;
	}
	switch (act) {
	case ACTION_LIMIT:
		if (!limit_conforms(*rule, p, bytes)) {
			count_event(*rule, EVENT_OVER);
			return VERDICT_DROP;
		}
		count(slot, bytes);
		return VERDICT_PASS;
	case ACTION_SYNCOOKIE:
		count(slot, bytes);
		return VERDICT_SYNCOOKIE;
	}
	count(slot, bytes);
	return act == ACTION_DROP ? VERDICT_DROP : VERDICT_PASS;
}

SEC("xdp")
int rampart_xdp(struct xdp_md *ctx)
{
	struct pkt p = {};
	__u32 rule = 0;
	int parsed = parse_xdp(ctx, &p, cfg.need_l4);
	__u32 bytes = ctx->data_end - ctx->data;
	switch (decide(bytes, parsed, &p, &rule)) {
	case VERDICT_DROP:
		return XDP_DROP;
	case VERDICT_SYNCOOKIE:
		/* SYNs are answered here; the ACK that returns a cookie is
		 * checked by rampart_tc_cookie, at tc. */
		if (is_syn(&p))
			return synack_in_place(ctx, &p, rule) || write_synack(ctx, &p, rule, 0) ? XDP_TX : XDP_DROP;
	}
	return XDP_PASS;
}

/* The enums of common.h that internal/abi/gen turns into Go constants, in
 * this order. abi_enums, never called, never loaded, puts them into the
 * object's BTF: BTF keeps no trace of types only constants use. */
struct abi_enums {
	enum limits limits;
	enum slot slot;
	enum action action;
	enum match_field match_field;
	enum fragment fragment;
	enum cuckoo cuckoo;
	enum v4_entry v4_entry;
	enum v6_table v6_table;
	enum limit_flags limit_flags;
	enum rule_event rule_event;
	enum field field;
	enum field_base field_base;
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
	int parsed = parse_skb(skb, &p, cfg.need_l4);
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
	__u32 maybe = 0;
	struct rule *r = first_rule(&p, &maybe);
	if (!r || r->action != ACTION_SYNCOOKIE)
		return TCX_NEXT;
	return cookie_ack(skb, &p, r->rule) ? TCX_NEXT : TCX_DROP;
}
