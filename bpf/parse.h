/* Bounds-checked frame parser shared by every entry point.
 *
 * Every header is read at a scalar offset that is checked against
 * MAX_HDR_OFF and against the end of the frame before use, so the verifier
 * sees bounded offsets and the parser never reads past the data. The Go
 * reference parser (internal/policy/frame.go) mirrors this file rule for rule;
 * the differential tests hold the two together. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "common.h"

#define IPV6_MAX_EXT_HEADERS 8

enum parse_result {
	PARSE_OK = 0,
	PARSE_NON_IP = 1,
	PARSE_MALFORMED = 2,
};

struct pkt {
	__u8 saddr[16]; /* IPv4 uses the first 4 bytes */
	__u8 daddr[16];
	__u32 len;      /* L3 length from the header */
	__u16 sport;    /* host byte order */
	__u16 dport;
	__u8 family;    /* 4 or 6 */
	__u8 proto;     /* L4 protocol; for IPv6 the one after extension headers */
	__u8 tcp_flags;
	__u8 has_ports; /* TCP or UDP header parsed (first or only fragment) */
};

/* Returns a pointer to len bytes at off, or NULL when they are not all there. */
#define HDR_AT(data, data_end, off, len)                                       \
	({                                                                      \
		void *__p = (data) + (off);                                     \
		(__p + (len) > (data_end)) ? NULL : __p;                        \
	})

static __always_inline int parse_l4(void *data, void *data_end, __u32 off, struct pkt *p)
{
	if (off > MAX_HDR_OFF)
		return PARSE_MALFORMED;
	if (p->proto == IPPROTO_TCP) {
		__u8 *th = HDR_AT(data, data_end, off, 20);
		if (!th)
			return PARSE_MALFORMED;
		p->sport = (th[0] << 8) | th[1];
		p->dport = (th[2] << 8) | th[3];
		p->tcp_flags = th[13];
		p->has_ports = 1;
	} else if (p->proto == IPPROTO_UDP) {
		__u8 *uh = HDR_AT(data, data_end, off, 8);
		if (!uh)
			return PARSE_MALFORMED;
		p->sport = (uh[0] << 8) | uh[1];
		p->dport = (uh[2] << 8) | uh[3];
		p->has_ports = 1;
	}
	return PARSE_OK;
}

static __always_inline int parse_ipv4(void *data, void *data_end, __u32 off, struct pkt *p)
{
	__u8 *ip = HDR_AT(data, data_end, off, 20);
	if (!ip)
		return PARSE_MALFORMED;
	if ((ip[0] >> 4) != 4)
		return PARSE_MALFORMED;
	__u32 hlen = (ip[0] & 0xf) * 4;
	if (hlen < 20)
		return PARSE_MALFORMED;
	if (!HDR_AT(data, data_end, off, hlen))
		return PARSE_MALFORMED;

	p->family = 4;
	p->len = (ip[2] << 8) | ip[3];
	p->proto = ip[9];
	__builtin_memcpy(p->saddr, ip + 12, 4);
	__builtin_memcpy(p->daddr, ip + 16, 4);

	/* A non-first fragment carries no L4 header: only L3 matches apply. */
	if (((ip[6] << 8) | ip[7]) & 0x1fff)
		return PARSE_OK;
	return parse_l4(data, data_end, off + hlen, p);
}

static __always_inline int parse_ipv6(void *data, void *data_end, __u32 off, struct pkt *p)
{
	__u8 *ip6 = HDR_AT(data, data_end, off, 40);
	if (!ip6)
		return PARSE_MALFORMED;
	if ((ip6[0] >> 4) != 6)
		return PARSE_MALFORMED;

	p->family = 6;
	p->len = ((ip6[4] << 8) | ip6[5]) + 40;
	__builtin_memcpy(p->saddr, ip6 + 8, 16);
	__builtin_memcpy(p->daddr, ip6 + 24, 16);

	__u8 nh = ip6[6];
	off += 40;

	/* Up to IPV6_MAX_EXT_HEADERS headers, then the L4 one; a bounded loop the
	 * verifier walks once per iteration. */
	for (int i = 0; i <= IPV6_MAX_EXT_HEADERS; i++) {
		if (off > MAX_HDR_OFF)
			return PARSE_MALFORMED;
		__u8 *ext;
		switch (nh) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
			ext = HDR_AT(data, data_end, off, 2);
			if (!ext)
				return PARSE_MALFORMED;
			nh = ext[0];
			off += (ext[1] + 1) * 8;
			break;
		case IPPROTO_AH:
			ext = HDR_AT(data, data_end, off, 2);
			if (!ext)
				return PARSE_MALFORMED;
			nh = ext[0];
			off += (ext[1] + 2) * 4;
			break;
		case IPPROTO_FRAGMENT:
			ext = HDR_AT(data, data_end, off, 8);
			if (!ext)
				return PARSE_MALFORMED;
			nh = ext[0];
			off += 8;
			if (((ext[2] << 8) | ext[3]) & 0xfff8) {
				/* Non-first fragment: no L4 header follows. */
				p->proto = nh;
				return PARSE_OK;
			}
			break;
		default:
			p->proto = nh;
			return parse_l4(data, data_end, off, p);
		}
	}
	/* More extension headers than we follow. */
	return PARSE_MALFORMED;
}

static __always_inline int parse_frame(void *data, void *data_end, struct pkt *p)
{
	__u8 *eth = HDR_AT(data, data_end, 0, 14);
	if (!eth)
		return PARSE_MALFORMED;
	__u16 proto = (eth[12] << 8) | eth[13];
	__u32 off = 14;

	/* Up to two VLAN tags: 802.1ad outer, 802.1Q inner (or Q-in-Q). */
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != ETH_P_8021Q && proto != ETH_P_8021AD)
			break;
		__u8 *vlan = HDR_AT(data, data_end, off, 4);
		if (!vlan)
			return PARSE_MALFORMED;
		proto = (vlan[2] << 8) | vlan[3];
		off += 4;
	}

	switch (proto) {
	case ETH_P_IP:
		return parse_ipv4(data, data_end, off, p);
	case ETH_P_IPV6:
		return parse_ipv6(data, data_end, off, p);
	case ETH_P_8021Q:
	case ETH_P_8021AD:
		return PARSE_MALFORMED; /* a third tag */
	default:
		return PARSE_NON_IP;
	}
}
