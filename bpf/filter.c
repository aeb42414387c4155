// SPDX-License-Identifier: GPL-2.0
/* rampart's data plane: one matcher, entry points for XDP and tc (ingress and
 * egress through tcx). The program is loaded once for a shape (the maps'
 * capacities, the SYN cookie check); each policy is a generation of maps
 * (lists.h's GEN_MAP: rules, classifier, lists, counters, settings) that an
 * apply fills and swaps in under it by flipping live. */
#include "parse.h"
#include "lists.h"
#include "flood.h"
#include "limit.h"
#include "syncookie.h"

char __license[] SEC("license") = "GPL";

/* The generation frames meet (0 or 1), set by Go after the other slot of
 * every GEN_MAP is filled. An entry point reads it once, so that a frame is
 * judged by one generation whole. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct live);
} live SEC(".maps");

static __always_inline __u32 live_gen(void)
{
	__u32 zero = 0;
	struct live *l = bpf_map_lookup_elem(&live, &zero);
	return l ? l->gen & 1 : 0;
}

/* The rule entries, in policy order. */
TABLE(rules, struct rule);
/* Arrays of u32 words, two to an element: an array map's elements are
 * 8-byte aligned, and these are filled through mmap. */
TABLE(tree, __u64);
TABLE(field_eqs, __u64); /* FIELD_VALUES words: see enum field_base */
TABLE(class_eqs, struct class_eqs); /* by address class */

/* The eqs of the masks the overlay makes, as far as they are known. */
GEN_MAP(mask_eqs, BPF_MAP_TYPE_HASH, __u64, struct class_eqs, 1 << 16, BPF_F_NO_PREALLOC);

/* SLOT_RULE0 + rules slots. */
GEN_MAP(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct counter, 1, 0);

/* Word i of a u32 array (a generation's tree or field_eqs), or NULL past
 * its end. */
static __always_inline __u32 *word(void *map, __u32 i)
{
	__u32 e = i >> 1;
	__u32 *w = bpf_map_lookup_elem(map, &e);
	return w ? w + (i & 1) : 0;
}

/* What classify needs of an address. */
struct address {
	__u64 mask; /* its lists */
	__u32 eq;   /* its eq as a source or destination */
	__u32 set;  /* its class's set of static lists (static_rows), 0: none */
};

/* classify's answer in one word: the rule entry a frame matches first,
 * its rule (below MAX_RULES) and action, kept when it is found (looking
 * the entry up again after classify is two more loads the frame waits
 * on), and the kinds of action of earlier entries that might have matched
 * had the frame carried the fields they need (the maybe bits: bit 0 would
 * have passed it, bit 1 kept it from the stack: drop, or maybe limit or
 * syncookie). Two pointers out would spill into classify's frame, at the
 * 512 bytes of stack Linux 6.1 allows a chain of calls. */
#define HIT_ACTION_SHIFT 24
#define HIT_RULE_MASK ((1u << HIT_ACTION_SHIFT) - 1)
#define HIT_FOUND (1ULL << 32)
#define HIT_MAYBE_SHIFT 33
_Static_assert(MAX_RULES <= HIT_RULE_MASK + 1, "a rule's index must fit below HIT_ACTION_SHIFT");

/* A HIT_FOUND word's action, or -1 when no entry matched. */
static __always_inline int hit_action(__u64 hit)
{
	return hit & HIT_FOUND ? (int)((__u32)hit >> HIT_ACTION_SHIFT) : -1;
}

static __always_inline __u32 hit_rule(__u64 hit)
{
	return hit & HIT_RULE_MASK;
}

/* One frame's classification. */
struct match_ctx {
	struct pkt *p;
	const struct config *c;
	/* The generation's maps the walk reads at every step, looked up once. */
	void *tree;
	void *field_eqs;
	void *rules;
	struct address src; /* looked up by lookup_address */
	struct address dst;
	__u32 node;       /* the tree walk's offset; then the leaf's */
	__u32 first;      /* the lowest entry that matches; NO_ENTRY */
	__u32 hit;        /* its rule | its action << HIT_ACTION_SHIFT */
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

/* Whether an address's bits under mask are bits. The entry's family bit
 * was checked before: an IPv4 address is the first 4 bytes, the only ones
 * its mask covers. */
static __always_inline int bits_match(const __u8 *addr, const __u64 *mask, const __u64 *bits)
{
	const __u64 *a = (const __u64 *)addr;
	return (a[0] & mask[0]) == bits[0] && (a[1] & mask[1]) == bits[1];
}

/* Set at load for policies with static lists: without, the verifier
 * drops the row checks as dead code, which took a third more of a load's
 * verification. */
volatile const __u8 static_rows = 0;

/* Whether bit b of word i of generation gen's tree array is set: a side's
 * static lists (struct rule's src_row) meet the address's set of them, in
 * its row. A global function: the verifier checks it once, not at every
 * call in every state of the leaf scans; inlined, it took classify past
 * the 512 bytes of stack a chain of calls may take. */
__noinline int in_row(__u32 gen, __u32 i, __u32 b)
{
	void *words = gen_map(&tree, gen);
	__u32 *w = words ? word(words, i) : 0;
	return w && (*w >> (b & 31)) & 1;
}

/* Whether side row meets address a's static lists. */
static __always_inline int row_meets(const struct config *c, const struct address *a, __u16 row)
{
	return static_rows && row && a->set && in_row(c->gen, c->sets_base + (a->set - 1) * c->row_words + (row >> 5), row);
}

/* Whether entry r matches frame p, its addresses src and dst as looked
 * up under settings c. */
static __always_inline int rule_matches(const struct rule *r, const struct pkt *p, const struct address *src,
					const struct address *dst, const struct config *c)
{
	__u32 f = r->match;

	if ((f & MATCH_IPV4) && p->family != 4)
		return NO_MATCH;
	if ((f & MATCH_IPV6) && p->family != 6)
		return NO_MATCH;
	if ((f & MATCH_SRC) && !(src->mask & r->src_lists) && !row_meets(c, src, r->src_row))
		return NO_MATCH;
	if ((f & MATCH_DST) && !(dst->mask & r->dst_lists) && !row_meets(c, dst, r->dst_row))
		return NO_MATCH;
	if ((f & MATCH_SRC_BITS) && !bits_match(p->saddr, r->src_mask, r->src_bits))
		return NO_MATCH;
	if ((f & MATCH_DST_BITS) && !bits_match(p->daddr, r->dst_mask, r->dst_bits))
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
		if (p->proto < r->proto_lo || p->proto > r->proto_hi)
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
			if (f & MATCH_TCP_RES) {
				__u8 res = p->frag >> FRAG_TCP_RES_SHIFT;
				if ((res & r->res_set) != r->res_set || (res & r->res_clear))
					return NO_MATCH;
			}
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
		return m->src.eq;
	case FIELD_DST:
		return m->dst.eq;
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
	__u32 *eq = word(m->field_eqs, v);
	return eq ? *eq : 0;
}

/* Entry i of the leaf at m->node, in policy order; 1 when the scan is over.
 * The first entry and the first level below are taken inline, the rest in
 * bpf_loop callbacks: a static function both called and passed to bpf_loop
 * makes the kernel's JIT fail when the verifier removes it as dead code
 * ("No program to jit", seen on 6.18), so each step has an inline body. */
static __always_inline long scan_entry(struct match_ctx *m, __u32 i)
{
	__u32 *e = word(m->tree, m->node + 1 + i);
	if (!e || *e >= m->first)
		return 1; /* an earlier entry of another tree matched */
	__u32 entry = *e;
	struct rule *r = bpf_map_lookup_elem(m->rules, &entry);
	if (!r)
		return 1;
	int res = rule_matches(r, m->p, &m->src, &m->dst, m->c);
	if (res == MATCH) {
		m->first = entry;
		m->hit = r->rule | (__u32)r->action << HIT_ACTION_SHIFT;
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
	__u32 *child = word(m->tree, (m->node & TREE_OFFSET_MASK) + field_eq(kind, m));
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

/* An address's lists, eq and static lists as its class has them: ce is
 * the class's eqs, which carry its lists (one read). Returns the class's
 * first entry as that side (src_first or dst_first). */
static __always_inline __u32 class_address(struct address *out, const struct class_eqs *ce, int dst)
{
	out->mask = ce ? ce->mask : 0;
	out->eq = ce ? (dst ? ce->dst : ce->src) : EQ_ANY;
	out->set = static_rows && ce ? ce->set : 0;
	return ce ? (dst ? ce->dst_first : ce->src_first) : 0;
}

/* Applies generation gen's overlay to an address of a class: the lists it
 * changes, and the eqs and first entry of its new mask as a class with it
 * has them (mask_eqs), or EQ_ANY and 0 for a mask no class has. An address
 * the overlay changed keeps its class's static lists. Returns the
 * address's first entry: first, its class's, if the overlay left it. */
static __always_inline __u32 overlay_address(struct address *out, __u32 gen, __u8 family, const __u8 *a, int dst, __u32 first)
{
	__u64 mask = out->mask;
	if (!overlay_mask(gen, family, a, &mask))
		return first;
	__u32 set = out->set;
	first = class_address(out, gen_lookup(&mask_eqs, gen, &mask), dst);
	out->mask = mask;
	out->set = set;
	return first;
}

/* The parts of an address lookup with loops of their own, the IPv6 walk
 * and the overlay's probe, are global functions: the verifier checks each
 * once per program, not once per address, and their frames are not the
 * caller's, within the 512 bytes of stack Linux 6.1 allows a chain of
 * calls, each frame rounded up to 32. The deepest come to 480: an entry
 * point, write_synack or cookie_ack, and an option callback (192 + 256 +
 * 32); main, one of these and a callback come to 448. */

/* Looks up p's IPv6 source (dst 0) or destination in generation gen,
 * walking the lengths of its /24's block; hot is its hot length's probe.
 * Returns the address's first entry. */
__noinline __u32 address_lookup_v6(const struct pkt *p, int dst, struct address *out, __u32 gen, long hot)
{
	const struct config *c = gen_config(gen);
	if (!p || !out || !c)
		return 0;
	const __u8 *a = dst ? p->daddr : p->saddr;
	__u64 hi, lo;
	v6_halves(a, &hi, &lo);
	__u32 cls = v6_class_walk(&c->lists, gen, hi, lo, hot);
	__u32 first = class_address(out, gen_lookup(&class_eqs, gen, &cls), dst);
	return overlay_address(out, gen, 6, a, dst, first);
}

/* Applies generation gen's overlay to p's source (dst 0) or destination,
 * looked up as its class has it, first its class's first entry. Returns
 * the address's. */
__noinline __u32 address_overlay(const struct pkt *p, int dst, struct address *out, __u32 gen, __u32 first)
{
	if (!p || !out)
		return 0;
	return overlay_address(out, gen, p->family, dst ? p->daddr : p->saddr, dst, first);
}

/* Looks up p's source (dst 0) or destination in generation gen, and
 * returns its first entry (struct class_eqs' src_first or dst_first). The
 * class is looked up inline, in the caller's frame, unless an IPv6 block needs a
 * walk of its lengths: a call and return cost more than the lookup where
 * returns go through a thunk (BPF_PROG_TEST_RUN on AMD EPYC with Safe RET:
 * 11-14 ns an IPv4 frame, about 16 an IPv6 one). */
static __always_inline __u32 lookup_address(const struct pkt *p, int dst, struct address *out, const struct config *c, __u32 gen)
{
	const __u8 *a = dst ? p->daddr : p->saddr;
	long cls;
	if (p->family == 4) {
		cls = v4_class(&c->lists, gen, a);
	} else {
		__u64 hi, lo;
		v6_halves(a, &hi, &lo);
		long hot = v6_hot(&c->lists, gen, hi, lo);
		cls = v6_block_class(&c->lists, v6_block_of(&c->lists, gen, hi), hot);
		if (cls < 0) {
			/* It finds the block again, from the cache: its
			 * arguments are five at most. */
			return address_lookup_v6(p, dst, out, gen, hot);
		}
	}
	__u32 k = cls;
	__u32 first = class_address(out, gen_lookup(&class_eqs, gen, &k), dst);
	/* overlay_mask reads the lengths again, one cached read on a path of
	 * hash probes: cheaper than a map value through the call. */
	if (overlay_lengths_of(gen, p->family))
		first = address_overlay(p, dst, out, gen, first);
	return first;
}

/* The first rule entry a parsed frame matches, as a HIT_ word, its
 * addresses looked up, when their classes alone do not tell
 * (classify_frame). A global function: the verifier
 * checks it once per program, whatever states the inline lookups before it
 * leave (static, it was checked again for each, and a load verified 272k
 * instructions instead of 166k); and its state lives in its own frame, not
 * beside write_synack's, within the 512 bytes of stack Linux 6.1 allows a
 * chain of calls. */
__noinline __u64 classify(struct pkt *p, __u32 gen, const struct config *c, const struct address *src, const struct address *dst)
{
	if (!p || !c || !src || !dst)
		return 0;
	struct match_ctx m = {.p = p, .src = *src, .dst = *dst};
	m.first = m.unknown[0] = m.unknown[1] = NO_ENTRY;
	m.c = c; /* the entry point's: looked up once a frame */
	m.tree = gen_map(&tree, gen);
	m.field_eqs = gen_map(&field_eqs, gen);
	m.rules = gen_map(&rules, gen);
	if (!m.tree || !m.field_eqs || !m.rules)
		return 0;
	for (__u32 t = 0; t < MAX_TREES; t++) {
		if (t >= m.c->num_trees)
			break;
		m.node = m.c->tree_roots[t];
		/* Two levels inline: most trees are that deep. */
		if (!walk_step(&m) && !walk_step(&m))
			bpf_loop(TREE_DEPTH - 2, walk_rest, &m, 0);
		if (m.node >> TREE_KIND_SHIFT != TREE_LEAF)
			continue;
		m.node &= TREE_OFFSET_MASK;
		__u32 *n = word(m.tree, m.node);
		if (n && *n && !scan_entry(&m, 0))
			bpf_loop(*n - 1, scan_rest, &m, 0);
	}
	__u64 maybe = (m.unknown[0] < m.first) | (m.unknown[1] < m.first) << 1;
	return maybe << HIT_MAYBE_SHIFT | (m.first == NO_ENTRY ? 0 : HIT_FOUND | m.hit);
}

/* The hit word of entry e if it matches p whole, its addresses src and
 * dst; 0 if not, or if e needs the destination's lists and dst is not
 * looked up yet (dst_known 0). */
static __always_inline __u64 entry_hit(const struct pkt *p, __u32 gen, const struct config *c, const struct address *src,
				       const struct address *dst, int dst_known, __u32 e)
{
	struct rule *r = gen_lookup(&rules, gen, &e);
	if (!r || (!dst_known && (r->match & MATCH_DST)))
		return 0;
	if (rule_matches(r, p, src, dst, c) != MATCH)
		return 0;
	return HIT_FOUND | r->rule | (__u32)r->action << HIT_ACTION_SHIFT;
}

/* The first rule entry p matches: its addresses looked up in the caller's
 * frame, then classify. Each address's class names the first entry it
 * can match (struct class_eqs' src_first, dst_first): every entry before
 * the later of the two is excluded by one side, whatever the frame's other
 * fields, and is never one that might have matched (classify's maybe
 * bits). When a side leaves none, or that entry matches the frame whole,
 * it is the answer, and the call and the walk are saved: a frame from a
 * list of sources the first rule drops, to a list of destinations an
 * egress policy's first rule drops, from or to none of a policy's lists.
 * The source's entry is tried before the destination is looked up. One
 * that needs the destination's lists is left to classify: judging it again
 * after the lookup took the instructions a load verifies from 169k to 186k
 * (lab drop's policy), for frames classify answers as well. */
static __always_inline __u64 classify_frame(struct pkt *p, __u32 gen, const struct config *c)
{
	struct address src = {.eq = EQ_ANY}, dst = {.eq = EQ_ANY};
	__u32 first = 0;
	if (c->need_src) {
		first = lookup_address(p, 0, &src, c, gen);
		if (first == FIRST_NONE)
			return 0;
		__u64 hit = first ? entry_hit(p, gen, c, &src, &dst, 0, first - 1) : 0;
		if (hit)
			return hit;
	}
	if (c->need_dst) {
		__u32 d = lookup_address(p, 1, &dst, c, gen);
		if (d == FIRST_NONE)
			return 0;
		__u64 hit = d > first ? entry_hit(p, gen, c, &src, &dst, 1, d - 1) : 0;
		if (hit)
			return hit;
	}
	return classify(p, gen, c, &src, &dst);
}

static __always_inline void count(__u32 gen, __u32 slot, __u64 bytes)
{
	struct counter *c = gen_lookup(&counters, gen, &slot);
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
static __always_inline int decide(const struct config *c, __u32 gen, __u32 bytes, int parsed, struct pkt *p, __u32 *rule)
{
	if (parsed == PARSE_NON_IP) {
		count(gen, SLOT_NON_IP, bytes);
		return VERDICT_PASS;
	}
	if (parsed != PARSE_OK) {
		count(gen, SLOT_MALFORMED, bytes);
		return c->malformed_action;
	}

	__u64 hit = classify_frame(p, gen, c);
	__u32 maybe = hit >> HIT_MAYBE_SHIFT;
	__u8 act = c->default_action;
	__u32 slot = SLOT_DEFAULT;
	if (hit_action(hit) >= 0) {
		act = hit_action(hit);
		*rule = hit_rule(hit);
		slot = SLOT_RULE0 + *rule;
	}
	if (maybe & ~(1 << (act != ACTION_PASS))) {
		count(gen, SLOT_UNPARSED, bytes);
		return c->unparsed_action;
	}
	switch (act) {
	case ACTION_LIMIT:
		if (!limit_conforms(c, gen, *rule, p, bytes)) {
			count_event(gen, *rule, EVENT_OVER);
			return VERDICT_DROP;
		}
		count(gen, slot, bytes);
		return VERDICT_PASS;
	case ACTION_SYNCOOKIE:
		count(gen, slot, bytes);
		return VERDICT_SYNCOOKIE;
	}
	count(gen, slot, bytes);
	return act == ACTION_DROP ? VERDICT_DROP : VERDICT_PASS;
}

SEC("xdp")
int rampart_xdp(struct xdp_md *ctx)
{
	__u32 gen = live_gen();
	const struct config *c = gen_config(gen);
	if (!c)
		return XDP_PASS; /* cannot be: a generation is filled before attach */
	struct pkt p = {};
	__u32 rule = 0;
	int parsed = parse_frame_xdp(ctx, &p, c->need_l4);
	__u32 bytes = ctx->data_end - ctx->data;
	switch (decide(c, gen, bytes, parsed, &p, &rule)) {
	case VERDICT_DROP:
		return XDP_DROP;
	case VERDICT_SYNCOOKIE:
		/* SYNs are answered here; the ACK that returns a cookie is
		 * checked by rampart_tc_cookie, at tc. */
		if (is_syn(&p))
			return synack_in_place(ctx, &p, gen, rule) || write_synack(ctx, &p, gen, rule, 0) ? XDP_TX : XDP_DROP;
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
	enum side_first side_first;
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
	__u32 gen = live_gen();
	const struct config *c = gen_config(gen);
	if (!c)
		return TCX_NEXT; /* cannot be: a generation is filled before attach */
	struct pkt p = {};
	__u32 rule = 0;
	int parsed = parse_frame_skb(skb, &p, c->need_l4);
	switch (decide(c, gen, skb->len, parsed, &p, &rule)) {
	case VERDICT_DROP:
		return TCX_DROP;
	case VERDICT_SYNCOOKIE:
		if (is_syn(&p))
			return write_synack(skb, &p, gen, rule, 1) ? bpf_redirect(skb->ifindex, 0) : TCX_DROP;
		return cookie_ack(skb, &p, gen, rule) ? TCX_NEXT : TCX_DROP;
	}
	return TCX_NEXT;
}

/* Beside rampart_xdp, when the policy has syncookie rules: checks the ACKs
 * that XDP passed on. The rules are matched again, uncounted (XDP counted
 * the frame). */
SEC("tc")
int rampart_tc_cookie(struct __sk_buff *skb)
{
	__u32 gen = live_gen();
	const struct config *c = gen_config(gen);
	struct pkt p = {};
	if (!c || parse_frame_skb(skb, &p, 1) != PARSE_OK || p.proto != IPPROTO_TCP || is_syn(&p))
		return TCX_NEXT;
	__u64 hit = classify_frame(&p, gen, c);
	if (hit_action(hit) != ACTION_SYNCOOKIE)
		return TCX_NEXT;
	return cookie_ack(skb, &p, gen, hit_rule(hit)) ? TCX_NEXT : TCX_DROP;
}
