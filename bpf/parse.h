/* Frame parser shared by every entry point.
 *
 * It reads as far as the kernel does: IPv4 is validated as ip_rcv_core()
 * validates it (version, header length, total length against the header and
 * the frame), VLAN tag stacks and IPv6 header chains are walked to their
 * end, however long, within the frame and the datagram. What it cannot read
 * it says so (struct pkt's l4), and the matcher decides what such a frame
 * may match; nothing is ever read beyond the datagram.
 *
 * Headers are read in place when they are in the packet's linear part (all
 * of an XDP frame); the tc entry point copies a header that is not with
 * bpf_skb_load_bytes() and runs the same code over the copy, so non-linear
 * skbs are parsed without being pulled. The Go reference parser
 * (internal/policy/frame.go) mirrors this file rule for rule; the
 * differential tests hold the two together. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "common.h"

enum parse_result {
	PARSE_OK = 0,
	PARSE_NON_IP = 1,
	PARSE_MALFORMED = 2,
};

/* How much of the L4 header a frame carries. */
enum l4_state {
	L4_HEADER = 0,  /* the protocol is known; l4_len bytes of its header were read */
	L4_NONE = 1,    /* a non-first fragment: the protocol is known, there is no header */
	L4_UNKNOWN = 2, /* an IPv6 chain that does not end inside the datagram: protocol unknown */
};

struct pkt {
	__u8 saddr[16] __attribute__((aligned(8))); /* IPv4 uses the first 4 bytes */
	__u8 daddr[16] __attribute__((aligned(8)));
	__u32 len;      /* L3 length: IPv4 total length, IPv6 payload + 40 */
	__u16 sport;    /* host byte order */
	__u16 dport;
	__u16 l3_off;   /* where the IP header starts */
	__u16 l4_off;   /* where the TCP or UDP header starts (when l4_len) */
	__u8 family;    /* 4 or 6 */
	__u8 proto;     /* L4 protocol; for IPv6 the one at the end of the chain */
	__u8 tcp_flags;
	__u8 l4;        /* enum l4_state */
	__u8 l4_len;    /* TCP and UDP: 0, L4_PORTS or L4_FLAGS bytes read; ICMP: 0 or L4_ICMP */
	__u8 icmp_type; /* ICMP and ICMPv6, when l4_len */
	__u8 icmp_code;
	__u8 dscp;      /* IPv4's TOS, IPv6's traffic class, without ECN */
	/* enum fragment; IPv6: known unless l4 is L4_UNKNOWN. Past
	 * FRAG_TCP_RES_SHIFT, TCP's byte 12 under the data offset (reserved
	 * bits, NS): a byte of its own would take the struct past 56 bytes,
	 * and the chain of calls past the 512 bytes of stack Linux allows. */
	__u8 frag;
	__u8 flow[3];   /* IPv6's flow label, big-endian: the struct's padding */
};

/* Offsets up to this are read in place: the verifier wants a bound, and a
 * frame without XDP fragments never reaches it. */
#define DIRECT_MAX 0x3fff

/* One frame and how to read it. */
struct frame {
	void *ctx; /* struct xdp_md * or struct __sk_buff * */
	void *data;
	void *data_end;
	__u32 len; /* bytes in the frame: the XDP buffer, skb->len for tc */
};

/* Returns a pointer to n bytes at off in the packet's linear part, or NULL
 * when they are not all there. */
static __always_inline void *in_place(const struct frame *f, __u32 off, const __u32 n)
{
	if (off > DIRECT_MAX)
		return NULL;
	/* The verifier must see the bound on the register the pointer is built
	 * from; clang may rebuild it from an unchecked copy. */
	__u64 o = off;
	asm volatile("%0 &= %1" : "+r"(o) : "i"(DIRECT_MAX));
	void *p = f->data + o;
	return p + n <= f->data_end ? p : NULL;
}

/* Copies n bytes at off with the helper of the context (skb: any byte of the
 * frame; XDP: as the helper allows). 0 on success. */
static __always_inline int load_bytes(void *ctx, __u32 off, void *buf, const __u32 n, const int skb)
{
	return skb ? bpf_skb_load_bytes(ctx, off, buf, n) : bpf_xdp_load_bytes(ctx, off, buf, n);
}

/* Reads a big-endian u16 at off into *v; 0 on success. */
static __always_inline int load_be16(const struct frame *f, __u32 off, __u16 *v, const int skb)
{
	__be16 *p = in_place(f, off, 2);
	if (p) {
		*v = bpf_ntohs(*p);
		return 0;
	}
	__be16 b;
	if (!skb || off >= f->len || f->len - off < 2 || load_bytes(f->ctx, off, &b, 2, 1))
		return -1;
	*v = bpf_ntohs(b);
	return 0;
}

static __always_inline int is_ipv6_ext(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_FRAGMENT ||
	       nh == IPPROTO_DSTOPTS || nh == IPPROTO_AH;
}

/* The first L4_FLAGS bytes of TCP and UDP: ports, and TCP's flags bytes. */
struct l4_head {
	__be16 sport;
	__be16 dport;
	__u8 pad[L4_FLAGS - 6];
	__u8 offset_res; /* data offset, reserved bits, NS */
	__u8 flags;
};

static __always_inline void read_l4(const struct l4_head *h, __u32 n, struct pkt *p)
{
	p->sport = bpf_ntohs(h->sport);
	p->dport = bpf_ntohs(h->dport);
	if (n == L4_FLAGS) {
		p->tcp_flags = h->flags;
		p->frag |= (h->offset_res & 0x0f) << FRAG_TCP_RES_SHIFT;
	}
	p->l4_len = n;
}

/* Reads the ports and flags of a TCP or UDP header at off, as far as the
 * datagram (ending at end) holds them. */
static __always_inline void parse_l4(const struct frame *f, __u32 off, __u32 end, struct pkt *p, const int skb)
{
	p->l4 = L4_HEADER;
	p->l4_off = off;
	__u32 avail = end > off ? end - off : 0;
	if (p->proto == (p->family == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6)) {
		__u8 icmp[L4_ICMP], *ih;
		if (avail < L4_ICMP)
			return;
		ih = in_place(f, off, L4_ICMP);
		if (!ih) {
			if (load_bytes(f->ctx, off, icmp, L4_ICMP, skb))
				return;
			ih = icmp;
		}
		p->icmp_type = ih[0];
		p->icmp_code = ih[1];
		p->l4_len = L4_ICMP;
		return;
	}
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return;
	if (avail < L4_PORTS)
		return;
	/* Each branch reads exactly the bytes it checked. */
	struct l4_head copy, *h;
	if (avail >= L4_FLAGS) {
		h = in_place(f, off, L4_FLAGS);
		if (h)
			read_l4(h, L4_FLAGS, p);
		else if (!load_bytes(f->ctx, off, &copy, L4_FLAGS, skb))
			read_l4(&copy, L4_FLAGS, p);
	} else {
		h = in_place(f, off, L4_PORTS);
		if (h)
			read_l4(h, L4_PORTS, p);
		else if (!load_bytes(f->ctx, off, &copy, L4_PORTS, skb))
			read_l4(&copy, L4_PORTS, p);
	}
}

/* IPv4, validated as ip_rcv_core() does; ip is the header at off, in place
 * or copied. */
static __always_inline int ipv4_header(const struct frame *f, __u32 off, const struct iphdr *ip, struct pkt *p, int need_l4, const int skb)
{
	if (ip->version != 4)
		return PARSE_MALFORMED;
	__u32 hlen = ip->ihl * 4;
	if (hlen < 20 || off + hlen > f->len)
		return PARSE_MALFORMED;
	__u32 tot = bpf_ntohs(ip->tot_len);
	if (tot == 0) /* a GSO packet larger than 64 KiB (BIG TCP): the frame says */
		tot = f->len - off;
	if (tot < hlen || off + tot > f->len)
		return PARSE_MALFORMED;

	p->family = 4;
	p->l3_off = off;
	p->len = tot;
	p->proto = ip->protocol;
	p->dscp = ip->tos >> 2;
	*(__u32 *)p->saddr = ip->saddr;
	*(__u32 *)p->daddr = ip->daddr;
	__u16 frag = bpf_ntohs(ip->frag_off);
	p->frag = (frag & 0x4000 ? FRAG_DF : 0) | (frag & 0x1fff ? (frag & 0x2000 ? FRAG_IS : FRAG_IS | FRAG_LAST) : (frag & 0x2000 ? FRAG_FIRST : 0));

	/* A non-first fragment carries no L4 header: only L3 matches apply. */
	if (frag & 0x1fff) {
		p->l4 = L4_NONE;
		return PARSE_OK;
	}
	if (need_l4)
		parse_l4(f, off + hlen, off + tot, p, skb);
	return PARSE_OK;
}

static __always_inline int parse_ipv4(const struct frame *f, __u32 off, struct pkt *p, int need_l4, const int skb)
{
	struct iphdr *ip = in_place(f, off, sizeof(*ip));
	if (ip)
		return ipv4_header(f, off, ip, p, need_l4, skb);
	struct iphdr copy;
	if (!skb || load_bytes(f->ctx, off, &copy, sizeof(copy), 1))
		return PARSE_MALFORMED;
	return ipv4_header(f, off, &copy, p, need_l4, skb);
}

/* The walk of an IPv6 extension-header chain, one header per bpf_loop
 * iteration: every header is at least 8 bytes, so a datagram of n bytes
 * needs at most n/8 + 1 iterations and the chain is followed to its end.
 *
 * The walk reads through the load-bytes helpers only: the verifier checks a
 * bpf_loop callback by simulating iterations until their states converge,
 * and an offset used for direct packet access must be tracked precisely, so
 * it would never converge. */
struct ext_walk {
	void *ctx;
	__u32 off; /* of the header whose type is nh */
	__u32 end; /* of the datagram */
	__u8 nh;
	__u8 state; /* enum ext_state */
	__u8 frag;  /* enum fragment, from a fragment header */
};

enum ext_state {
	EXT_WALKING = 0,
	EXT_END = 1,      /* nh is the L4 protocol, at off */
	EXT_NONFIRST = 2, /* a non-first fragment: nh is the protocol, no header */
	EXT_CUT = 3,      /* a header does not fit in the datagram */
};

static __always_inline long ext_step(struct ext_walk *w, const int skb)
{
	__u8 h[8];
	__u32 off = w->off;
	if (off > w->end || w->end - off < 8 || load_bytes(w->ctx, off, h, 8, skb)) {
		w->state = EXT_CUT;
		return 1;
	}
	__u8 nh = w->nh;
	w->nh = h[0];
	if (nh == IPPROTO_AH)
		off += (h[1] + 2) * 4;
	else if (nh == IPPROTO_FRAGMENT)
		off += 8;
	else
		off += (h[1] + 1) * 8;
	if (off > w->end) {
		w->state = EXT_CUT;
		return 1;
	}
	w->off = off;
	if (nh == IPPROTO_FRAGMENT) {
		__u16 fo = (h[2] << 8) | h[3];
		w->frag = fo & 0xfff8 ? (fo & 1 ? FRAG_IS : FRAG_IS | FRAG_LAST) : (fo & 1 ? FRAG_FIRST : 0);
		if (fo & 0xfff8) {
			w->state = EXT_NONFIRST;
			return 1;
		}
	}
	if (!is_ipv6_ext(w->nh)) {
		w->state = EXT_END;
		return 1;
	}
	return 0;
}

/* bpf_loop callbacks cannot be inlined: one per kind of context. */
static long ext_step_xdp(__u32 i, void *arg) { return ext_step(arg, 0); }
static long ext_step_skb(__u32 i, void *arg) { return ext_step(arg, 1); }

/* IPv6; ip6 is the header at off, in place or copied. */
static __always_inline int ipv6_header(const struct frame *f, __u32 off, const struct ipv6hdr *ip6, struct pkt *p, int need_l4, const int skb, const int walk)
{
	if (ip6->version != 6)
		return PARSE_MALFORMED;
	p->l3_off = off;
	__u32 plen = bpf_ntohs(ip6->payload_len);
	__u32 end = off + 40 + plen;
	if (plen == 0) /* a jumbogram or a BIG TCP packet: the frame says */
		end = f->len;
	if (end > f->len)
		return PARSE_MALFORMED;

	p->family = 6;
	p->len = end - off;
	p->dscp = ((ip6->priority << 4) | (ip6->flow_lbl[0] >> 4)) >> 2;
	p->flow[0] = ip6->flow_lbl[0] & 0x0f;
	p->flow[1] = ip6->flow_lbl[1];
	p->flow[2] = ip6->flow_lbl[2];
	__builtin_memcpy(p->saddr, &ip6->saddr, 16);
	__builtin_memcpy(p->daddr, &ip6->daddr, 16);
	p->proto = ip6->nexthdr;
	off += 40;
	if (!need_l4) {
		p->l4 = L4_UNKNOWN; /* no rule looks at L4: no walk */
		return PARSE_OK;
	}
	if (walk && is_ipv6_ext(p->proto)) {
		struct ext_walk w = {.ctx = f->ctx, .off = off, .end = end, .nh = p->proto};
		bpf_loop((end - off) / 8 + 1, skb ? ext_step_skb : ext_step_xdp, &w, 0);
		p->proto = w.nh;
		p->frag = w.frag;
		if (w.state == EXT_NONFIRST) {
			p->l4 = L4_NONE;
			return PARSE_OK;
		}
		if (w.state != EXT_END) {
			p->proto = 0;
			p->l4 = L4_UNKNOWN;
			return PARSE_OK;
		}
		off = w.off;
	}
	parse_l4(f, off, end, p, skb);
	return PARSE_OK;
}

static __always_inline int parse_ipv6(const struct frame *f, __u32 off, struct pkt *p, int need_l4, const int skb)
{
	struct ipv6hdr *ip6 = in_place(f, off, sizeof(*ip6));
	if (ip6)
		return ipv6_header(f, off, ip6, p, need_l4, skb, 1);
	struct ipv6hdr copy;
	if (!skb || load_bytes(f->ctx, off, &copy, sizeof(copy), 1))
		return PARSE_MALFORMED;
	return ipv6_header(f, off, &copy, p, need_l4, skb, 1);
}

static __always_inline int is_vlan(__u16 proto)
{
	return proto == ETH_P_8021Q || proto == ETH_P_8021AD;
}

/* The walk of a VLAN tag stack past the first VLAN_UNROLLED tags, one tag
 * per bpf_loop iteration, to the end of the frame: the kernel strips
 * priority tags (VLAN id 0) one after another, however many there are, and
 * delivers what they carry. Reads go through the helpers, as in ext_walk. */
struct vlan_walk {
	void *ctx;
	__u32 off; /* of the tag */
	__u32 len; /* of the frame */
	__u16 proto;
	__u8 cut;
};

static __always_inline long vlan_step(struct vlan_walk *w, const int skb)
{
	__u8 tag[4];
	if (w->off > w->len || w->len - w->off < 4 || load_bytes(w->ctx, w->off, tag, 4, skb)) {
		w->cut = 1;
		return 1;
	}
	w->proto = (tag[2] << 8) | tag[3];
	w->off += 4;
	return !is_vlan(w->proto);
}

static long vlan_step_xdp(__u32 i, void *arg) { return vlan_step(arg, 0); }
static long vlan_step_skb(__u32 i, void *arg) { return vlan_step(arg, 1); }

static __always_inline void frame_xdp(struct frame *f, struct xdp_md *ctx)
{
	f->ctx = ctx;
	f->data = (void *)(long)ctx->data;
	f->data_end = (void *)(long)ctx->data_end;
	f->len = f->data_end - f->data;
}

static __always_inline void frame_skb(struct frame *f, struct __sk_buff *skb)
{
	f->ctx = skb;
	f->data = (void *)(long)skb->data;
	f->data_end = (void *)(long)skb->data_end;
	f->len = skb->len;
}

/* The generic parser is made of global functions, one set per kind of
 * context: the verifier checks a global function once, on its own, with its
 * arguments unknown, instead of once per path of its caller (the VLAN tags
 * alone leave several offsets). That keeps the paths through the filter
 * few. */
#define PARSE_FUNCS(kind, ctx_type, skb)                                                \
	__noinline int parse_ipv4_##kind(ctx_type *ctx, __u32 off, struct pkt *p, int need_l4) \
	{                                                                               \
		struct frame f;                                                         \
		frame_##kind(&f, ctx);                                                  \
		return p ? parse_ipv4(&f, off, p, need_l4, skb) : PARSE_MALFORMED;      \
	}                                                                               \
	__noinline int parse_ipv6_##kind(ctx_type *ctx, __u32 off, struct pkt *p, int need_l4) \
	{                                                                               \
		struct frame f;                                                         \
		frame_##kind(&f, ctx);                                                  \
		return p ? parse_ipv6(&f, off, p, need_l4, skb) : PARSE_MALFORMED;      \
	}                                                                               \
	__noinline int parse_generic_##kind(ctx_type *ctx, struct pkt *p, int need_l4) \
	{                                                                               \
		struct frame f;                                                         \
		__u16 proto;                                                            \
		frame_##kind(&f, ctx);                                                  \
		if (f.len < 14 || load_be16(&f, 12, &proto, skb))                       \
			return PARSE_MALFORMED;                                         \
		__u32 off = 14;                                                         \
		/* VLAN tags, 802.1ad or 802.1Q: the common few unrolled, the   \
		 * rest walked. */                                              \
		for (int i = 0; i < VLAN_UNROLLED; i++) {                       \
			if (!is_vlan(proto))                                    \
				break;                                          \
			if (load_be16(&f, off + 2, &proto, skb))                \
				return PARSE_MALFORMED;                         \
			off += 4;                                               \
		}                                                               \
		if (is_vlan(proto)) {                                           \
			struct vlan_walk w = {.ctx = ctx, .off = off, .len = f.len, .proto = proto}; \
			bpf_loop((f.len - off) / 4 + 1, skb ? vlan_step_skb : vlan_step_xdp, &w, 0); \
			if (w.cut || is_vlan(w.proto))                          \
				return PARSE_MALFORMED;                         \
			proto = w.proto;                                        \
			off = w.off;                                            \
		}                                                               \
		switch (proto) {                                                        \
		case ETH_P_IP:                                                          \
			return parse_ipv4_##kind(ctx, off, p, need_l4);                 \
		case ETH_P_IPV6:                                                        \
			return parse_ipv6_##kind(ctx, off, p, need_l4);                 \
		default:                                                                \
			return PARSE_NON_IP;                                            \
		}                                                                       \
	}

PARSE_FUNCS(xdp, struct xdp_md, 0)
PARSE_FUNCS(skb, struct __sk_buff, 1)

#define PARSE_GENERIC -1

/* An IPv4 header, or an IPv6 header without an extension header a rule
 * would need walked, at off in the linear part (proto: the EtherType
 * before it); PARSE_GENERIC, having written nothing, for anything else
 * that may be IP. */
static __always_inline int parse_ip(const struct frame *f, __u32 off, __u16 proto, struct pkt *p, int need_l4, const int skb)
{
	if (proto == ETH_P_IP) {
		struct iphdr *ip = in_place(f, off, sizeof(*ip));
		return ip ? ipv4_header(f, off, ip, p, need_l4, skb) : PARSE_GENERIC;
	}
	if (proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = in_place(f, off, sizeof(*ip6));
		if (!ip6 || (need_l4 && is_ipv6_ext(ip6->nexthdr)))
			return PARSE_GENERIC;
		return ipv6_header(f, off, ip6, p, need_l4, skb, 0);
	}
	return is_vlan(proto) ? PARSE_GENERIC : PARSE_NON_IP;
}

/* The common frame, read in place and inlined into the caller: Ethernet, at
 * most VLAN_UNROLLED tags, then parse_ip. It returns PARSE_GENERIC, having
 * written nothing, for anything else. */
static __always_inline int parse_common(const struct frame *f, struct pkt *p, int need_l4, const int skb)
{
	__be16 *et = in_place(f, 12, 2);
	if (!et)
		return PARSE_GENERIC;
	__u16 proto = bpf_ntohs(*et);
	__u32 off = 14;
#pragma unroll
	for (int i = 0; i < VLAN_UNROLLED; i++) {
		if (!is_vlan(proto))
			break;
		__be16 *t = in_place(f, off + 2, 2);
		if (!t)
			return PARSE_GENERIC;
		proto = bpf_ntohs(*t);
		off += 4;
	}
	return parse_ip(f, off, proto, p, need_l4, skb);
}

/* The commonest frame, untagged, parsed by the entry point itself rather
 * than by a call: on CPUs whose returns are mitigated (AMD's Safe RET) a
 * call and its return cost a frame more than this parse. Its one offset
 * keeps the states the verifier carries from it into the matcher few.
 * PARSE_GENERIC, having written nothing, for anything else. */
static __always_inline int parse_untagged(const struct frame *f, struct pkt *p, int need_l4, const int skb)
{
	__be16 *et = in_place(f, 12, 2);
	return et && !is_vlan(bpf_ntohs(*et)) ? parse_ip(f, 14, bpf_ntohs(*et), p, need_l4, skb) : PARSE_GENERIC;
}

/* Parses a frame into p. need_l4: some rule looks at the protocol, ports or
 * flags (without it an IPv6 chain is not walked). A global function too: the
 * paths through the parser leave different constants in p, and the matcher
 * would keep every one of them apart. */
__noinline int parse_xdp(struct xdp_md *ctx, struct pkt *p, int need_l4)
{
	struct frame f;
	if (!p)
		return PARSE_MALFORMED;
	frame_xdp(&f, ctx);
	int r = parse_common(&f, p, need_l4, 0);
	return r == PARSE_GENERIC ? parse_generic_xdp(ctx, p, need_l4) : r;
}

__noinline int parse_skb(struct __sk_buff *skb, struct pkt *p, int need_l4)
{
	struct frame f;
	if (!p)
		return PARSE_MALFORMED;
	frame_skb(&f, skb);
	int r = parse_common(&f, p, need_l4, 1);
	return r == PARSE_GENERIC ? parse_generic_skb(skb, p, need_l4) : r;
}

/* What an entry point calls: an untagged frame parsed inline
 * (parse_untagged), any other through the global functions. */
static __always_inline int parse_frame_xdp(struct xdp_md *ctx, struct pkt *p, int need_l4)
{
	struct frame f;
	frame_xdp(&f, ctx);
	int r = parse_untagged(&f, p, need_l4, 0);
	return r == PARSE_GENERIC ? parse_xdp(ctx, p, need_l4) : r;
}

static __always_inline int parse_frame_skb(struct __sk_buff *skb, struct pkt *p, int need_l4)
{
	struct frame f;
	frame_skb(&f, skb);
	int r = parse_untagged(&f, p, need_l4, 1);
	return r == PARSE_GENERIC ? parse_skb(skb, p, need_l4) : r;
}
