/* Structures and constants shared between the BPF data plane and Go. The Go
 * side (internal/abi) is generated from the filter object's BTF, never
 * written by hand. */
#pragma once

#include <linux/types.h>

/* Every limit and constant Go needs is an enum: enums reach the object's BTF,
 * from which internal/abi is generated (#defines would not). */
enum limits {
	MAX_RULES = 1 << 17, /* rules of a policy; also its match entries */
	/* Lists a policy's entries test by membership, one bit each of a
	 * 64-bit mask; the top bit marks a class whose mask does not say all
	 * of its membership (Go's compile package). An inline prefix alone on
	 * its side of a rule takes no bit: its entries compare the address's
	 * bits. Lists past MAX_LISTS ways of naming them take no bit either:
	 * a rule's side checks them by a bit of its class's row (src_row). */
	MAX_LISTS = 63,
	MAX_ROW_BITS = 65535, /* struct rule's src_row is a __u16; 0 is none */
	/* VLAN tags the parser reads unrolled; more are walked in a loop. */
	VLAN_UNROLLED = 2,
	/* L4 header bytes a rule needs: ports are bytes 0-3 of TCP and UDP,
	 * the TCP flags byte 13. */
	L4_PORTS = 4,
	L4_FLAGS = 14,
	L4_ICMP = 2, /* ICMP and ICMPv6: type and code */
};

/* Counter slots: fixed slots first, then one per rule. */
enum slot {
	SLOT_MALFORMED = 0, /* IP frames whose L3 header is cut or invalid */
	SLOT_NON_IP = 1,
	SLOT_DEFAULT = 2,
	SLOT_UNPARSED = 3, /* IP frames whose verdict hangs on fields they do not carry */
	SLOT_RULE0 = 4, /* the counters map holds SLOT_RULE0 + rules slots */
};

enum action {
	ACTION_PASS = 0,
	ACTION_DROP = 1,
	ACTION_LIMIT = 2,     /* pass under the rule's limit, drop over it */
	ACTION_SYNCOOKIE = 3, /* answer TCP SYNs with a cookie; pass the rest */
};

/* Which fields of a rule take part in the match. */
enum match_field {
	MATCH_SRC = 1 << 0,
	MATCH_DST = 1 << 1,
	MATCH_PROTO = 1 << 2,
	MATCH_SPORT = 1 << 3,
	MATCH_DPORT = 1 << 4,
	MATCH_TCP_FLAGS = 1 << 5,
	MATCH_LENGTH = 1 << 6,
	MATCH_IPV4 = 1 << 7,
	MATCH_IPV6 = 1 << 8,
	MATCH_ICMP_TYPE = 1 << 9, /* ICMP or ICMPv6 type and code; checked in the leaf */
	MATCH_ICMP_CODE = 1 << 10,
	MATCH_DSCP = 1 << 11,
	MATCH_FRAGMENT = 1 << 12,
	MATCH_FLOW_LABEL = 1 << 13, /* IPv6's; an IPv4 frame has none and never matches */
	/* Bits of the address under a mask: an IPv6 prefix with an offset
	 * (RFC 8956 §3.1), which no list can hold, or an inline prefix; the
	 * entry's MATCH_IPV4 or MATCH_IPV6 says the family. */
	MATCH_SRC_BITS = 1 << 14,
	MATCH_DST_BITS = 1 << 15,
	/* TCP's byte 12 under the data offset: the reserved bits and NS, what
	 * a two-byte BGP FlowSpec TCP flags value tests besides the flags
	 * (RFC 8955 §4.2.2.9). Checked in the leaf, with MATCH_TCP_FLAGS. */
	MATCH_TCP_RES = 1 << 16,
};

/* A frame's fragment bits, as BGP FlowSpec names them (RFC 8955 §4.2.2.12). */
enum fragment {
	FRAG_DF = 1,    /* IPv4's don't-fragment */
	FRAG_IS = 2,    /* a fragment other than the first */
	FRAG_FIRST = 4, /* the first fragment */
	FRAG_LAST = 8,  /* the last fragment */
	FRAG_TCP_RES_SHIFT = 4, /* struct pkt's frag holds TCP's reserved bits past these */
};

struct rule {
	__u64 src_lists; /* bitmask of list ids; matches if the source is in any */
	__u64 dst_lists;
	__u32 match; /* enum match_field bits */
	__u16 sport_lo, sport_hi;
	__u16 dport_lo, dport_hi;
	__u16 len_lo, len_hi; /* L3 length: IPv4 total length, IPv6 payload + 40 */
	__u8 proto_lo; /* MATCH_PROTO: the protocols proto_lo to proto_hi */
	__u8 flags_set;   /* TCP flags that must be set */
	__u8 flags_clear; /* TCP flags that must be clear */
	__u8 action;      /* enum action */
	__u32 rule;       /* the policy's rule: a rule with port lists takes several entries */
	__u8 icmp_type_lo, icmp_type_hi;
	__u8 icmp_code_lo, icmp_code_hi;
	__u8 dscp_lo, dscp_hi;
	__u8 frag_set;   /* enum fragment bits that must be set */
	__u8 frag_clear; /* and clear */
	__u32 flow_lo, flow_hi; /* IPv6 flow label */
	__u8 res_set;   /* MATCH_TCP_RES: byte 12's low bits that must be set */
	__u8 res_clear; /* and clear */
	__u8 proto_hi;
	__u8 pad;
	/* A side's static lists (those without a bit, past MAX_LISTS ways of
	 * naming lists): bit src_row of the address class's row (struct
	 * config's sets_base), 0 for none. Matches if the mask or the row does. */
	__u16 src_row, dst_row;
	/* MATCH_SRC_BITS and MATCH_DST_BITS: the address, as two u64 loads of
	 * its bytes, under mask[i] equals bits[i]. */
	__u64 src_mask[2], src_bits[2];
	__u64 dst_mask[2], dst_bits[2];
};

/* The classifier. Rules are not scanned: each field of a frame maps to an
 * equivalence class (eq) of its values, one for every distinct way the rules
 * judge them, and decision trees over the fields' eqs lead to a leaf of the
 * few rule entries that may match, in policy order, which are then matched
 * whole. Rules are split into trees by the address fields they test, so that
 * a rule without a destination is not copied under every destination; a
 * frame walks every tree (at most MAX_TREES) and the lowest entry wins.
 *
 * The trees live in one u32 array, reached through refs: a ref's top bits
 * are the kind of what it points to (a field, or TREE_LEAF), the rest its
 * offset o. A node of field f: tree[o + eq] is the ref of the child for the
 * frame's eq of f, so a level costs one read of the tree. A leaf: tree[o]
 * is n, the n entry indices follow. */
enum field {
	FIELD_FAMILY = 0, /* 0: IPv4, 1: IPv6 */
	FIELD_SRC = 1,    /* the source address's class (class_eqs) */
	FIELD_DST = 2,
	FIELD_PROTO = 3, /* 0-255, or VALUE_UNKNOWN_PROTO */
	FIELD_SPORT = 4, /* 0-65535, VALUE_NO_PORTS or VALUE_UNKNOWN_PORTS */
	FIELD_DPORT = 5,
	FIELD_FLAGS = 6,  /* 0-255, VALUE_NO_FLAGS or VALUE_UNKNOWN_FLAGS */
	FIELD_LENGTH = 7, /* 0-65535, or VALUE_LONG */
	NUM_FIELDS = 8,
	/* Values past a field's own: what the frame does not carry. */
	VALUE_UNKNOWN_PROTO = 256, /* the L4 header was not found */
	VALUE_NO_PORTS = 65536,    /* not TCP or UDP, or a later fragment */
	VALUE_UNKNOWN_PORTS = 65537,
	VALUE_NO_FLAGS = 256, /* not TCP, or a later fragment */
	VALUE_UNKNOWN_FLAGS = 257,
	VALUE_LONG = 65536, /* an L3 length past 65535 */
	EQ_ANY = 0, /* a source or destination eq under which every rule stays */
	TREE_LEAF = NUM_FIELDS,   /* the kind of a leaf's ref */
	TREE_KIND_SHIFT = 28,     /* a ref: kind << TREE_KIND_SHIFT | offset */
	TREE_OFFSET_MASK = (1 << 28) - 1,
	MAX_TREES = 3,
	TREE_DEPTH = NUM_FIELDS + 1, /* a path tests each field once at most */
};

/* The value tables of fields_eq, one after another: a field's eq is
 * field_eqs[base + value]. */
enum field_base {
	BASE_PROTO = 0,
	BASE_SPORT = BASE_PROTO + 257,
	BASE_DPORT = BASE_SPORT + 65538,
	BASE_FLAGS = BASE_DPORT + 65538,
	BASE_LENGTH = BASE_FLAGS + 258,
	FIELD_VALUES = BASE_LENGTH + 65537,
};

/* The cuckoo tables' parameters (lists.h): their buckets (0: empty, not
 * read), and the multipliers of their two hashes. */
struct list_params {
	__u32 v4_buckets;
	__u32 v4_wide_buckets;
	__u32 v4_dense_buckets;
	__u32 pad;
	__u32 v6_buckets;
	__u32 v6_short_buckets;
	__u32 v6_long_buckets;
	/* The IPv6 prefix length most entries have (0: none): probed before
	 * the block is known, so that its reads overlap the block's. */
	__u32 v6_hot_len;
	__u64 v4_block_mul[2];
	__u64 v4_wide_mul[2];
	__u64 v4_dense_mul[2];
	__u64 v6_block_mul[2];
	__u64 v6_short_mul[2];
	__u64 v6_long_mul[2];
};

/* A generation's settings: the one element of its config map, filled from
 * Go as abi.Config. */
struct config {
	struct list_params lists;
	__u32 tree_roots[MAX_TREES]; /* the refs of the classifier's trees */
	__u32 num_trees;
	__u32 limit_buckets;   /* limit_sources' buckets, a power of two */
	__u8 default_action;
	__u8 unparsed_action;  /* for a frame whose verdict hangs on fields it lacks */
	__u8 malformed_action; /* for a malformed frame: what every rule and the
				* default agree on, else unparsed_action */
	__u8 need_l4;          /* some rule looks at the protocol, ports or flags */
	__u8 need_src;         /* some rule looks at the source's lists */
	__u8 need_dst;
	__u8 pad[2];
	/* The rows of static lists (struct rule's src_row), in the tree
	 * array from word sets_base: the row of set s (struct class_eqs'
	 * set) at (s - 1) * row_words. */
	__u32 row_words;
	__u32 sets_base;
	__u32 gen; /* this generation's slot: what in_row looks its tree up in */
	__u32 pad2;
};

/* The one element of the live map (filter.c): the generation frames meet,
 * and which build of this object the program is (a hash of the object, set
 * at load), so that a release's new code is never left unloaded by an
 * apply that finds its maps' shape running. */
struct live {
	__u32 gen;
	__u8 static_rows; /* the program was loaded reading rows (filter.c) */
	__u8 pad[3];
	__u64 object;
};

/* An address class's lists and its eqs as a source and as a destination.
 * An address whose lists the overlay changed takes the eqs of its new mask
 * (mask_eqs), or EQ_ANY: every rule stays a candidate and the leaf
 * decides. */
struct class_eqs {
	__u64 mask; /* the class's lists (the classes table's entry), read with its eqs */
	__u32 src;
	__u32 dst;
	__u32 set; /* the class's set of static lists: its row, from 1 (0: none) */
	/* The first rule entry a source of the class can match, + 1: every
	 * entry before it tests the source and excludes the class.
	 * FIRST_NONE: every entry does; 0: not known, the trees decide. */
	__u32 src_first;
	__u32 dst_first; /* the same for a destination of the class */
	__u32 pad;       /* 32 bytes: no element straddles a cache line */
};

enum side_first {
	FIRST_NONE = 0xffffffffu,
};

/* Rate limits: the generic cell rate algorithm. A packet costs interval ns
 * (per byte, scaled by 2^LIMIT_BYTE_SHIFT, for a bit rate) of the schedule,
 * which may run up to tolerance ns ahead of now: the burst. */
enum limit_flags {
	LIMIT_PER_SOURCE = 1,
	LIMIT_BYTES = 2,
	LIMIT_BYTE_SHIFT = 16,
	LIMIT_WAYS = 4, /* per-source schedules per bucket */
};

struct limit {
	__u64 interval;
	__u64 tolerance;
	__u8 flags;
	__u8 prefix4; /* per source: the prefix one schedule covers */
	__u8 prefix6;
	__u8 pad[5];
};

struct limit_entry {
	__u64 tag; /* SipHash of rule and source prefix, low bit set; 0: empty */
	__u64 tat; /* the schedule: theoretical arrival time, ns */
};

struct limit_bucket {
	struct limit_entry way[LIMIT_WAYS];
};

/* What limit and syncookie rules did besides matching, per rule. */
enum rule_event {
	EVENT_OVER = 0,
	EVENT_COOKIE_SENT = 1,
	EVENT_COOKIE_OK = 2,
	EVENT_COOKIE_BAD = 3,
};

struct rule_events {
	__u64 over;         /* dropped over the limit */
	__u64 cookies_sent; /* SYN-ACKs answered with a cookie */
	__u64 cookies_ok;   /* ACKs whose cookie held: connections handed on */
	__u64 cookies_bad;  /* ACKs to a listener whose cookie did not */
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

/* Prefix lists. Every family is swept into disjoint segments of equal
 * membership; each distinct membership (a set of lists) is a class, and one
 * lookup per address answers for every list: the address's class, then the
 * class's mask of lists (classes[]).
 *
 * Blocks are the /24s of IPv4 (and the top 24 bits of IPv6) that hold
 * anything; IPv4 /16s wholly in one class are one wide block instead of
 * 256; IPv6 prefixes longer than /24 are keyed by length and address. All
 * sit in bucketized cuckoo hashes: a key is in one of two 64-byte buckets,
 * both computed from a 32-bit digest of the key, so a lookup reads the two
 * cache lines at once and waits for one miss, not a chain. In tables of
 * four-slot buckets the second bucket is in the first's 4 KiB page, so a
 * lookup also pays one TLB miss at most (lists.h's bucket functions and
 * Go's compile package must agree).
 * An empty slot has key (blocks) or len (prefixes) 0. */
enum cuckoo {
	V4_BLOCK_SLOTS = 4, /* struct v4_block per bucket */
	V4_DENSE_SLOTS = 2, /* struct v4_dense per bucket (two cache lines) */
	V6_BLOCK_SLOTS = 2, /* struct v6_block per bucket */
	V6_SHORT_SLOTS = 4, /* struct v6_slot per bucket */
	V6_LONG_SLOTS = 2,  /* struct v6_long_slot per bucket */
	PAGE_BUCKETS = 64,  /* buckets per 4 KiB page; tables hold whole pages */
};

/* IPv4: a block's entry. Its top two bits say what the rest is:
 *  CLASS   the whole block's class;
 *  INLINE  a block holding at most V4_INLINE addresses of one class on a
 *          base class: both classes and the addresses' last octets (four
 *          here, four more in the slot's octets), so the common sparse
 *          block (a few listed hosts) needs no second read;
 *  PAIRS   a block holding at most V4_PAIRS addresses of classes other
 *          than a base class, each of its own: the base class, then an
 *          octet and its class per address (two in the entry, one in the
 *          slot's octets; unused ones repeat the first), so that hosts of
 *          several lists sharing a /24 need no second read either;
 *  TBL8    any mix: an index into v4_tbl8s.
 * A block of two classes in any other pattern is a dense block instead: in
 * a cuckoo hash of its own (struct v4_dense), read beside the blocks' so
 * that its bitmap costs no second read. */
enum v4_entry {
	V4E_TYPE_SHIFT = 62,
	V4E_CLASS = 0,
	V4E_INLINE = 1,
	V4E_PAIRS = 2,
	V4E_TBL8 = 3,
	V4_INLINE = 8,             /* last octets of an INLINE block */
	V4_INLINE_CLASS_BITS = 12, /* an INLINE entry's classes are below 4096 */
	V4E_HIT_SHIFT = 12,        /* bits 0-11 base class, 12-23 hit class, */
	V4E_OCTETS_SHIFT = 24,     /* 24-55 octets 0-3 (unused ones repeat the first) */
	V4_PAIRS = 3,              /* addresses of a PAIRS block */
	V4_PAIR_BITS = 20,         /* a pair: its octet, then its class (12 bits), */
	V4E_PAIRS_SHIFT = 12,      /* from bit 12 of the entry, and the third in octets */
	V4_BLOCKS = 1u << 24,
};

struct v4_block {
	__u32 key;    /* block + 1; 0: empty */
	__u32 octets; /* an INLINE block's octets 4-7 */
	__u64 entry;
};

struct v4_bucket {
	struct v4_block slot[V4_BLOCK_SLOTS];
};

/* A dense block: a /24 holding two classes in a pattern INLINE cannot
 * hold; bit i set means address .i is in hit. A cache line each, two a
 * bucket: one slot a bucket would fill to a third at best. */
struct v4_dense {
	__u32 key; /* block + 1; 0: empty */
	__u32 base;
	__u32 hit;
	__u32 pad;
	__u64 bits[4];
	__u64 pad2[2];
};

struct v4_dense_bucket {
	struct v4_dense slot[V4_DENSE_SLOTS];
};

struct v4_tbl8 {
	__u32 cls[256];
};

/* IPv6: per block, the lengths of the prefixes below it and the class of
 * the longest prefix up to /24 holding it. The prefixes themselves are in
 * two hashes keyed by (length, masked address): lengths up to 64 by the top
 * 64 bits, longer ones by all 128. A lookup probes only the lengths present
 * under its block, longest first. */
struct v6_block {
	__u32 key;        /* block + 1; 0: empty */
	__u32 base;       /* the class when no longer prefix holds the address */
	__u64 short_lens; /* bit i: length 25+i (25 to 64) */
	__u64 long_lens;  /* bit i: length 65+i (65 to 128) */
	__u64 pad;
};

struct v6_bucket {
	struct v6_block slot[V6_BLOCK_SLOTS];
};

struct v6_slot {
	__u64 key; /* the top 64 bits, masked to len */
	__u32 len; /* 0: empty */
	__u32 cls;
};

struct v6_long_slot {
	__u64 hi;
	__u64 lo;
	__u32 len; /* 0: empty */
	__u32 cls;
	__u64 pad;
};

struct v6_short_bucket {
	struct v6_slot slot[V6_SHORT_SLOTS];
};

struct v6_long_bucket {
	struct v6_long_slot slot[V6_LONG_SLOTS];
};

enum v6_table {
	V6_SHORT_MIN = 25,
	V6_LONG_MIN = 65,
};

/* In-place changes (rampart list add|del): the longest overlay prefix
 * covering an address sets and clears list bits over the base tables. The
 * prefixes are in hash tables keyed by (length, masked address), probed
 * only at the lengths present (overlay_lengths), longest first: a lookup
 * costs a probe per length, not a walk of a trie as deep as its entries. */
struct overlay {
	__u64 set;
	__u64 clear;
};

struct overlay_lengths {
	__u64 bits[3]; /* bit i: prefixes of length i (0 to 128) are present */
};

/* A prefix as the kernel's LPM tries take it (the benchmarks' trie); the
 * overlay's hash tables key on it too, the address masked to the length. */
struct lpm_v4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct lpm_v6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

