/* Structures and constants shared between the BPF data plane and Go. The Go
 * side (internal/abi) is generated from the filter object's BTF, never
 * written by hand. */
#pragma once

#include <linux/types.h>

/* Every limit and constant Go needs is an enum: enums reach the object's BTF,
 * from which internal/abi is generated (#defines would not). */
enum limits {
	MAX_RULES = 256,
	MAX_LISTS = 64, /* list membership is one 64-bit mask */
	V6_MAX_LENS = 129, /* IPv6 prefix lengths 0 to 128 */
	/* VLAN tags the parser reads unrolled; more are walked in a loop. */
	VLAN_UNROLLED = 2,
	/* L4 header bytes a rule needs: ports are bytes 0-3 of TCP and UDP,
	 * the TCP flags byte 13. */
	L4_PORTS = 4,
	L4_FLAGS = 14,
};

/* Counter slots: fixed slots first, then one per rule. */
enum slot {
	SLOT_MALFORMED = 0, /* IP frames whose L3 header is cut or invalid */
	SLOT_NON_IP = 1,
	SLOT_DEFAULT = 2,
	SLOT_UNPARSED = 3, /* IP frames whose verdict hangs on fields they do not carry */
	SLOT_RULE0 = 4,
	NUM_SLOTS = SLOT_RULE0 + MAX_RULES,
};

enum action {
	ACTION_PASS = 0,
	ACTION_DROP = 1,
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
};

struct rule {
	__u64 src_lists; /* bitmask of list ids; matches if the source is in any */
	__u64 dst_lists;
	__u32 match; /* enum match_field bits */
	__u16 sport_lo, sport_hi;
	__u16 dport_lo, dport_hi;
	__u16 len_lo, len_hi; /* L3 length: IPv4 total length, IPv6 payload + 40 */
	__u8 proto;
	__u8 flags_set;   /* TCP flags that must be set */
	__u8 flags_clear; /* TCP flags that must be clear */
	__u8 action;      /* enum action */
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

/* IPv4 lists: a DIR-24-8 table, compressed. A bitmap says which /24 blocks
 * hold any listed address; only those have an entry, found by rank (the
 * count of set bits before the block's). An entry below V4_SPLIT is the
 * block's class (an index into the class table of list masks); otherwise
 * the block holds several classes and the entry indexes a second stage, a
 * bitmap (two classes) or a tbl8 (any mix). Entries are grouped 16 to an
 * array element: array elements are 8-byte aligned, so single u32 elements
 * would double the table. */
enum v4_table {
	V4_SPLIT = 1u << 31,
	V4_TBL8_FLAG = 1u << 30,
	V4_INDEX_MASK = V4_TBL8_FLAG - 1,
	V4_CHUNK = 16,
	V4_BLOCKS = 1u << 24,
};

struct v4_chunk {
	__u32 entry[V4_CHUNK];
};

/* A /24 block holding two classes: bit i set means address .i is in hit. */
struct v4_bitmap {
	__u16 base;
	__u16 hit;
	__u32 pad;
	__u64 bits[4];
};

struct v4_tbl8 {
	__u16 cls[256];
};

/* IPv6 lists: one hash keyed by (prefix length, masked address) per
 * populated length, probed longest first. */

/* In-place changes (rampart list add|del): the longest overlay prefix
 * covering an address sets and clears list bits over the base tables. */
struct overlay {
	__u64 set;
	__u64 clear;
};

struct lpm_v4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct lpm_v6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

