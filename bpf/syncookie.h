/* SYN cookies: SYN-ACKs answered from the data plane; the returning ACK
 * handed to the listener as a request socket, no state kept before. */
#pragma once

#include "csum.h"
#include "flood.h"
#include "parse.h"
#include "siphash.h"

volatile const __u8 cookie_wscale = 7; /* the window scale SYN-ACKs offer */

/* SYN cookies. The cookie is the SYN-ACK's sequence number: 24 bits of a
 * SipHash of the connection's addresses, ports, the client's sequence number
 * and a time slot of 68.7 s (cookie_slot), then the MSS index, ECN,
 * SACK and the client's window scale (0xf: none). With timestamps, 8 more
 * bits of the hash ride in the low byte of the SYN-ACK's TSval. The ACK
 * proves the cookie within two time slots. */
enum cookie_bits {
	COOKIE_WSCALE_NONE = 0xf,
	COOKIE_SACK = 1 << 4,
	COOKIE_ECN = 1 << 5,
	COOKIE_MSS_SHIFT = 6,
	COOKIE_HASH_MASK = ~0xffu,
	COOKIE_SLOT_SHIFT = 36, /* ns >> 36: slots of 68.7 s */
};

/* The cookie's time slot: 68.7 s of the coarse clock (flood.h). */
static __always_inline __u64 cookie_slot(void)
{
	return clock_ns() >> COOKIE_SLOT_SHIFT;
}

static const __u16 msstab4[4] = {536, 1300, 1440, 1460};
static const __u16 msstab6[4] = {1220, 1420, 1440, 8940};

/* A TCP header without its options. */
struct tcp_head {
	__be16 sport, dport;
	__be32 seq, ack_seq;
	__u8 doff_res; /* doff << 4 */
	__u8 flags;
	__be16 window, check, urg;
};

struct tcp_opts {
	__u32 tsval, tsecr;
	__u16 mss;
	__u8 wscale; /* COOKIE_WSCALE_NONE when absent */
	__u8 sack, ts;
};

/* A walk over a segment's options, one option per bpf_loop iteration: the
 * verifier checks the step once instead of every path through 40 bytes. */
struct opt_walk {
	__u8 opts[64]; /* 40 at most; 64 so that an index masked to 63 stays inside */
	struct tcp_opts o;
	__u32 optlen;
	__u32 i;
};

/* Byte i (masked to 63) of the options: the mask is applied after the
 * compiler has forgotten what it knows of i, so that it stays, and the
 * verifier sees every read inside the buffer. */
static __always_inline __u32 opt_byte(const struct opt_walk *w, __u32 i)
{
	asm volatile("" : "+r"(i));
	return w->opts[i & 63];
}

static long opt_step(__u32 n, void *arg)
{
	struct opt_walk *w = arg;
	__u32 i = w->i;
	if (i >= w->optlen || i >= 40)
		return 1;
	__u32 kind = opt_byte(w, i);
	if (kind == 0)
		return 1;
	if (kind == 1) {
		w->i = i + 1;
		return 0;
	}
	__u32 len = opt_byte(w, i + 1);
	if (len < 2 || i + len > w->optlen)
		return 1;
	if (kind == 2 && len == 4) {
		w->o.mss = opt_byte(w, i + 2) << 8 | opt_byte(w, i + 3);
	} else if (kind == 3 && len == 3) {
		__u32 ws = opt_byte(w, i + 2);
		w->o.wscale = ws > 14 ? 14 : ws;
	} else if (kind == 4 && len == 2) {
		w->o.sack = 1;
	} else if (kind == 8 && len == 10) {
		w->o.ts = 1;
		w->o.tsval = opt_byte(w, i + 2) << 24 | opt_byte(w, i + 3) << 16 | opt_byte(w, i + 4) << 8 | opt_byte(w, i + 5);
		w->o.tsecr = opt_byte(w, i + 6) << 24 | opt_byte(w, i + 7) << 16 | opt_byte(w, i + 8) << 8 | opt_byte(w, i + 9);
	}
	w->i = i + len;
	return 0;
}

static __always_inline void tcp_parse_opts(struct opt_walk *w)
{
	w->o.wscale = COOKIE_WSCALE_NONE;
	w->i = 0;
	bpf_loop(40, opt_step, w, 0);
}

/* The cookie's hash: of the addresses, the ports with the client's initial
 * sequence number, and the time slot, each in words of its own (IPv4: three
 * words, twelve rounds; IPv6: six, eighteen). The slot keeps a word apart:
 * XORed into the IPv6 source's low half, as it once was, a client could
 * move an old cookie into a new slot by choosing its address in its /64. */
static __always_inline __u64 cookie_hash(const struct pkt *p, __u16 sport, __u16 dport, __u32 isn, __u64 slot)
{
	__u64 ports = (__u64)sport << 48 | (__u64)dport << 32 | isn;
	if (p->family == 4) {
		__u64 m[3] = {(__u64)*(__u32 *)p->saddr << 32 | *(__u32 *)p->daddr, ports, slot};
		return siphash24(m, 3);
	}
	__u64 m[6];
	__builtin_memcpy(m, p->saddr, 16);
	__builtin_memcpy(&m[2], p->daddr, 16);
	m[4] = ports;
	m[5] = slot;
	return siphash24(m, 6);
}

/* The cookie for a SYN from the client's view: p's source is the client.
 * *tsval is the SYN-ACK's timestamp: more of the hash, whose low byte the
 * returning ACK echoes. */
static __always_inline __u32 make_cookie(const struct pkt *p, __u32 isn, const struct tcp_opts *o, __u32 *tsval, __u64 slot)
{
	const __u16 *tab = p->family == 4 ? msstab4 : msstab6;
	__u32 mssind = 0;
#pragma unroll
	for (int i = 3; i > 0; i--) {
		if (o->mss >= tab[i]) {
			mssind = i;
			break;
		}
	}
	__u64 h = cookie_hash(p, p->sport, p->dport, isn, slot);
	*tsval = h >> 32;
	return ((__u32)h & COOKIE_HASH_MASK) | mssind << COOKIE_MSS_SHIFT | (o->sack ? COOKIE_SACK : 0) | (o->wscale & 0xf);
}

/* The reply built on the stack: an IP header without options or extension
 * headers, then TCP with its options. */
struct synack {
	union {
		struct iphdr ip4;
		struct ipv6hdr ip6;
	};
	struct tcp_head tcp;
	__u8 opts[40];
};

/* Builds the SYN-ACK for SYN s (with options o) of packet p; returns the
 * L3+L4 length written at the start of r. */
static __always_inline __u32 build_synack(const struct pkt *p, const struct tcp_head *s, const struct tcp_opts *o, struct synack *r, __u64 slot)
{
	__u32 tsval;
	__u32 isn = bpf_ntohl(s->seq);
	__u32 cookie = make_cookie(p, isn, o, &tsval, slot);
	const __u16 *tab = p->family == 4 ? msstab4 : msstab6;
	__u16 mss = tab[(cookie >> COOKIE_MSS_SHIFT) & 3];

	/* Options: MSS; SACK-permitted and timestamps; window scale: only
	 * those the client offered, as a listener would. */
	__u8 *op = r->opts;
	__u32 n = 0;
	op[0] = 2;
	op[1] = 4;
	op[2] = mss >> 8;
	op[3] = mss & 0xff;
	n = 4;
	if (o->ts) {
		op[4] = o->sack ? 4 : 1;
		op[5] = o->sack ? 2 : 1;
		op[6] = 8;
		op[7] = 10;
		*(__be32 *)(op + 8) = bpf_htonl(tsval);
		*(__be32 *)(op + 12) = bpf_htonl(o->tsval);
		n = 16;
	} else if (o->sack) {
		op[4] = 1;
		op[5] = 1;
		op[6] = 4;
		op[7] = 2;
		n = 8;
	}
	if (o->wscale != COOKIE_WSCALE_NONE) {
		op[n & 31] = 1;
		op[(n + 1) & 31] = 3;
		op[(n + 2) & 31] = 3;
		op[(n + 3) & 31] = cookie_wscale;
		n += 4;
	}
	r->tcp.sport = s->dport;
	r->tcp.dport = s->sport;
	r->tcp.seq = bpf_htonl(cookie);
	r->tcp.ack_seq = bpf_htonl(isn + 1);
	r->tcp.doff_res = ((20 + n) / 4) << 4;
	r->tcp.flags = 0x12; /* SYN, ACK */
	r->tcp.window = bpf_htons(65535);
	r->tcp.check = 0;
	r->tcp.urg = 0;
	__u32 tcplen = 20 + n;

	/* The pseudo-header, then the segment. */
	__u64 sum = bpf_htons(IPPROTO_TCP) + bpf_htons(tcplen);
	__u32 l3;
	if (p->family == 4) {
		struct iphdr *ip = &r->ip4;
		ip->version = 4;
		ip->ihl = 5;
		ip->tos = 0;
		ip->tot_len = bpf_htons(20 + tcplen);
		ip->id = 0;
		ip->frag_off = bpf_htons(0x4000); /* DF */
		ip->ttl = 64;
		ip->protocol = IPPROTO_TCP;
		ip->check = 0;
		__builtin_memcpy(&ip->saddr, p->daddr, 4);
		__builtin_memcpy(&ip->daddr, p->saddr, 4);
		ip->check = csum_fold32(csum_words((__u8 *)ip, 20));
		sum += csum_words((__u8 *)&ip->saddr, 8);
		l3 = 20;
	} else {
		struct ipv6hdr *ip6 = &r->ip6;
		*(__be32 *)ip6 = bpf_htonl(0x60000000);
		ip6->payload_len = bpf_htons(tcplen);
		ip6->nexthdr = IPPROTO_TCP;
		ip6->hop_limit = 64;
		__builtin_memcpy(&ip6->saddr, p->daddr, 16);
		__builtin_memcpy(&ip6->daddr, p->saddr, 16);
		sum += csum_words((__u8 *)&ip6->saddr, 32);
		l3 = 40;
	}
	sum += csum_words((__u8 *)&r->tcp, tcplen);
	r->tcp.check = csum_fold32(sum);
	return l3 + tcplen;
}

/* Copies p's TCP header and options out; returns the options' length, or -1
 * when the header is cut. */
static __always_inline int read_tcp(void *ctx, const struct pkt *p, struct tcp_head *h, struct opt_walk *w, const int skb)
{
	if (p->l4_len < L4_FLAGS || load_bytes(ctx, p->l4_off, h, 20, skb))
		return -1;
	__u32 hl = (h->doff_res >> 4) * 4;
	if (hl < 20 || p->l4_off + hl > p->l3_off + p->len) /* options past the datagram: the kernel drops it */
		return -1;
	__u64 optlen = hl - 20; /* 64 bits: checked and used in one register */
	if (optlen == 0)
		return 0;
	/* Opaque to the compiler, so that the check below stays as written:
	 * the verifier needs the length's bounds in this register, the lower
	 * one too (Linux 6.1's learns nothing from optlen != 0). */
	asm volatile("" : "+r"(optlen));
	if (optlen < 4 || optlen > 40 || load_bytes(ctx, p->l4_off + 20, w->opts, optlen, skb))
		return -1;
	w->optlen = optlen;
	return optlen;
}

static __always_inline int is_syn(const struct pkt *p)
{
	return (p->tcp_flags & 0x17) == 0x02; /* SYN; not ACK, RST, FIN */
}

/* The kernel's request-socket kfunc (Linux 6.9): weak, so that the filter
 * loads on kernels without it; a policy with syncookie rules is refused
 * there before anything loads. */
struct bpf_tcp_req_attrs {
	__u32 rcv_tsval;
	__u32 rcv_tsecr;
	__u16 mss;
	__u8 rcv_wscale;
	__u8 snd_wscale;
	__u8 ecn_ok;
	__u8 wscale_ok;
	__u8 sack_ok;
	__u8 tstamp_ok;
	__u8 usec_ts_ok;
	__u8 reserved[3];
};

/* The kernel's, opaque here; a full declaration, as the kfunc's signature
 * is checked against the kernel's by kind. */
struct sock {
};

/* Room off the stack, which the parser, the matcher and the option walk
 * fill: the reply being built, and the ACK check's TCP header, socket
 * tuple and request attributes (on the stack, the header took the chain
 * of rampart_tc, cookie_ack and its option callback past the 512 bytes
 * Linux 6.1 allows). */
struct cookie_scratch {
	struct synack reply;
	struct tcp_head ack;
	struct bpf_sock_tuple tuple;
	struct bpf_tcp_req_attrs attrs;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cookie_scratch);
} cookie_scratch SEC(".maps");

extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk, struct bpf_tcp_req_attrs *attrs, int attrs__sz) __ksym __weak;

/* Writes the SYN-ACK for SYN p over the frame, in place: MACs swapped, the
 * IP header (without options or extension headers) and TCP rewritten, the
 * frame cut or grown to fit. Returns the reply's length, 0 on failure. */
static __noinline __u32 write_synack(void *ctx, const struct pkt *p, __u32 gen, __u32 rule, const int skb)
{
	struct tcp_head h;
	struct opt_walk w = {};
	if (read_tcp(ctx, p, &h, &w, skb) < 0)
		return 0;
	tcp_parse_opts(&w);
	__u32 zero = 0;
	struct cookie_scratch *sc = bpf_map_lookup_elem(&cookie_scratch, &zero);
	if (!sc)
		return 0;
	struct synack *rp = &sc->reply;
	__builtin_memset(rp, 0, sizeof(*rp));
	__u32 len = build_synack(p, &h, &w.o, rp, cookie_slot());
	__u32 l3 = p->family == 4 ? 20 : 40;
	__u32 want = p->l3_off + len;
	if (want > 0xffff || len < l3 + 20 || len > l3 + 60)
		return 0;
	if (skb) {
		if (bpf_skb_change_tail(ctx, want, 0))
			return 0;
	} else {
		int have = bpf_xdp_get_buff_len(ctx);
		if (bpf_xdp_adjust_tail(ctx, (int)want - have))
			return 0;
	}
	__u8 mac[12], swapped[12];
	if (load_bytes(ctx, 0, mac, 12, skb))
		return 0;
	__builtin_memcpy(swapped, mac + 6, 6);
	__builtin_memcpy(swapped + 6, mac, 6);
	long err;
	if (skb) {
		err = bpf_skb_store_bytes(ctx, 0, swapped, 12, 0);
		err |= p->family == 4 ? bpf_skb_store_bytes(ctx, p->l3_off, &rp->ip4, 20, 0)
				      : bpf_skb_store_bytes(ctx, p->l3_off, &rp->ip6, 40, 0);
		err |= bpf_skb_store_bytes(ctx, p->l3_off + l3, &rp->tcp, len - l3, 0);
	} else {
		err = bpf_xdp_store_bytes(ctx, 0, swapped, 12);
		err |= p->family == 4 ? bpf_xdp_store_bytes(ctx, p->l3_off, &rp->ip4, 20)
				      : bpf_xdp_store_bytes(ctx, p->l3_off, &rp->ip6, 40);
		err |= bpf_xdp_store_bytes(ctx, p->l3_off + l3, &rp->tcp, len - l3);
	}
	if (err)
		return 0;
	count_event(gen, rule, EVENT_COOKIE_SENT);
	return len;
}

/* The options of the SYNs answered in place (synack_in_place): none; an
 * MSS alone, as flood tools send; Linux's twenty bytes (MSS, SACK-permitted
 * or two NOPs, timestamps, NOP, window scale). Read as opt_step reads them;
 * returns 0 for any other shape. */
static __always_inline int fast_opts(const __u8 *op, const void *end, __u32 optlen, struct tcp_opts *o)
{
	o->wscale = COOKIE_WSCALE_NONE;
	if (optlen == 0)
		return 1;
	if ((void *)(op + 4) > end || op[0] != 2 || op[1] != 4)
		return 0;
	o->mss = op[2] << 8 | op[3];
	if (optlen == 4)
		return 1;
	if (optlen != 20 || (void *)(op + 20) > end)
		return 0;
	__u16 sack = op[4] << 8 | op[5];
	if ((sack != 0x0402 && sack != 0x0101) || op[6] != 8 || op[7] != 10 || op[16] != 1 || op[17] != 3 || op[18] != 3)
		return 0;
	o->sack = sack == 0x0402;
	o->ts = 1;
	o->tsval = op[8] << 24 | op[9] << 16 | op[10] << 8 | op[11];
	o->tsecr = op[12] << 24 | op[13] << 16 | op[14] << 8 | op[15];
	__u32 ws = op[19];
	o->wscale = ws > 14 ? 14 : ws;
	return 1;
}

/* The reply's own values, worked out once from the SYN before any copy of
 * answer_in_place writes them. */
struct in_place {
	struct tcp_opts o;
	__u32 isn, cookie, tsval;
};

/* Writes the SYN-ACK over a SYN of the common frame (Ethernet, IP header
 * of l4 - 14 bytes) whose reply options take n bytes (4: the MSS alone;
 * 20: with timestamps and window scale, as build_synack lays them out):
 * the same bytes as write_synack's, written in place. v6 and n are
 * constants, so that every offset is one for the verifier. */
static __always_inline int answer_in_place(struct xdp_md *ctx, const struct in_place *a, const int v6, const __u32 n)
{
	const __u32 l4 = v6 ? 54 : 34, want = l4 + 20 + n;
	int have = bpf_xdp_get_buff_len(ctx);
	if (have != want && bpf_xdp_adjust_tail(ctx, (int)want - have))
		return 0;
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + want > end)
		return 0;
	struct tcp_head *th = data + l4;
	const struct tcp_opts *o = &a->o;
	__u32 isn = a->isn, cookie = a->cookie;
	__u16 mss = (v6 ? msstab6 : msstab4)[(cookie >> COOKIE_MSS_SHIFT) & 3];

	__be16 port = th->sport;
	th->sport = th->dport;
	th->dport = port;
	th->seq = bpf_htonl(cookie);
	th->ack_seq = bpf_htonl(isn + 1);
	th->doff_res = ((20 + n) / 4) << 4;
	th->flags = 0x12; /* SYN, ACK */
	th->window = bpf_htons(65535);
	th->check = 0;
	th->urg = 0;
	__u8 *op = (__u8 *)(th + 1);
	op[0] = 2;
	op[1] = 4;
	op[2] = mss >> 8;
	op[3] = mss & 0xff;
	if (n == 20) {
		op[4] = o->sack ? 4 : 1;
		op[5] = o->sack ? 2 : 1;
		op[6] = 8;
		op[7] = 10;
		*(__be32 *)(op + 8) = bpf_htonl(a->tsval);
		*(__be32 *)(op + 12) = bpf_htonl(o->tsval);
		op[16] = 1;
		op[17] = 3;
		op[18] = 3;
		op[19] = cookie_wscale;
	}

	__u64 sum = bpf_htons(IPPROTO_TCP) + bpf_htons(20 + n);
	if (v6) {
		struct ipv6hdr *ip6 = data + 14;
		__u64 a[2];
		__builtin_memcpy(a, &ip6->saddr, 16);
		__builtin_memcpy(&ip6->saddr, &ip6->daddr, 16);
		__builtin_memcpy(&ip6->daddr, a, 16);
		*(__be32 *)ip6 = bpf_htonl(0x60000000);
		ip6->payload_len = bpf_htons(20 + n);
		ip6->nexthdr = IPPROTO_TCP;
		ip6->hop_limit = 64;
		sum += csum_words((__u8 *)&ip6->saddr, 32);
	} else {
		struct iphdr *ip = data + 14;
		__be32 addr = ip->saddr;
		ip->saddr = ip->daddr;
		ip->daddr = addr;
		*(__u8 *)ip = 0x45;
		ip->tos = 0;
		ip->tot_len = bpf_htons(40 + n);
		ip->id = 0;
		ip->frag_off = bpf_htons(0x4000); /* DF */
		ip->ttl = 64;
		ip->check = 0;
		ip->check = csum_fold32(csum_words((__u8 *)ip, 20));
		sum += csum_words((__u8 *)&ip->saddr, 8);
	}
	sum += csum_words((__u8 *)th, 20 + n);
	th->check = csum_fold32(sum);

	__u8 mac[6];
	__builtin_memcpy(mac, data, 6);
	__builtin_memcpy(data, data + 6, 6);
	__builtin_memcpy(data + 6, mac, 6);
	return 1;
}

/* Answers a SYN at XDP in place when its frame is the common one (no VLAN
 * tag, IPv4 without options or IPv6 without extension headers, options
 * fast_opts reads): direct reads and writes, no helper copies and no
 * scratch map, which were a third of an answer's cost. Returns 1 when the
 * frame is the reply, else 0 with the headers untouched (its tail may have
 * been cut or grown to the reply's length): write_synack answers it. */
static __noinline int synack_in_place(struct xdp_md *ctx, const struct pkt *p, __u32 gen, __u32 rule)
{
	const int v6 = p->family == 6;
	const __u32 l4 = v6 ? 54 : 34;
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	const struct tcp_head *th = data + l4;
	if (p->l3_off != 14 || p->l4_off != l4 || (void *)(th + 1) > end)
		return 0;
	__u32 hl = (th->doff_res >> 4) * 4;
	struct in_place a = {};
	if (hl < 20 || l4 + hl > 14 + p->len || !fast_opts((const __u8 *)(th + 1), end, hl - 20, &a.o))
		return 0;
	/* The tail may move below; the header does not. */
	a.isn = bpf_ntohl(th->seq);
	a.cookie = make_cookie(p, a.isn, &a.o, &a.tsval, cookie_slot());
	int ok;
	if (v6)
		ok = a.o.ts ? answer_in_place(ctx, &a, 1, 20) : answer_in_place(ctx, &a, 1, 4);
	else
		ok = a.o.ts ? answer_in_place(ctx, &a, 0, 20) : answer_in_place(ctx, &a, 0, 4);
	if (ok)
		count_event(gen, rule, EVENT_COOKIE_SENT);
	return ok;
}

/* Checks the ACK that may return a cookie, in tc. Segments for a socket
 * that is not listening, and segments to no socket, go on to the kernel as
 * they are. An ACK to a listener whose cookie holds becomes a request socket
 * the kernel completes into a connection; one whose cookie does not is
 * dropped. Returns whether to pass the segment. */
static __noinline int cookie_ack(struct __sk_buff *skb, const struct pkt *p, __u32 gen, __u32 rule)
{
	if (!bpf_sk_assign_tcp_reqsk)
		return 1;
	__u32 zero = 0;
	struct cookie_scratch *sc = bpf_map_lookup_elem(&cookie_scratch, &zero);
	if (!sc)
		return 1;
	struct opt_walk w = {};
	if (read_tcp(skb, p, &sc->ack, &w, 1) < 0)
		return 1;
	const struct tcp_head *s = &sc->ack;
	struct bpf_sock_tuple *t = &sc->tuple;
	__builtin_memset(t, 0, sizeof(*t));
	__u32 tlen;
	if (p->family == 4) {
		t->ipv4.saddr = *(__u32 *)p->saddr;
		t->ipv4.daddr = *(__u32 *)p->daddr;
		t->ipv4.sport = s->sport;
		t->ipv4.dport = s->dport;
		tlen = sizeof(t->ipv4);
	} else {
		__builtin_memcpy(t->ipv6.saddr, p->saddr, 16);
		__builtin_memcpy(t->ipv6.daddr, p->daddr, 16);
		t->ipv6.sport = s->sport;
		t->ipv6.dport = s->dport;
		tlen = sizeof(t->ipv6);
	}
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, t, tlen, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 1;
	int pass = 1;
	if (sk->state != BPF_TCP_LISTEN)
		goto out;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		goto out;
	tcp_parse_opts(&w);
	const struct tcp_opts *o = &w.o;
	__u32 cookie = bpf_ntohl(s->ack_seq) - 1, isn = bpf_ntohl(s->seq) - 1;
	__u64 slot = cookie_slot();
	int ok = 0;
#pragma unroll
	for (int k = 0; k < 2; k++) {
		__u64 h = cookie_hash(p, p->sport, p->dport, isn, slot - k);
		if ((cookie & COOKIE_HASH_MASK) == ((__u32)h & COOKIE_HASH_MASK) && (!o->ts || (o->tsecr & 0xff) == ((h >> 32) & 0xff)))
			ok = 1;
	}
	pass = 0;
	if (!ok) {
		count_event(gen, rule, EVENT_COOKIE_BAD);
		goto out;
	}
	const __u16 *tab = p->family == 4 ? msstab4 : msstab6;
	struct bpf_tcp_req_attrs *a = &sc->attrs;
	__builtin_memset(a, 0, sizeof(*a));
	a->mss = tab[(cookie >> COOKIE_MSS_SHIFT) & 3];
	a->sack_ok = !!(cookie & COOKIE_SACK);
	a->ecn_ok = !!(cookie & COOKIE_ECN);
	if ((cookie & 0xf) != COOKIE_WSCALE_NONE) {
		a->wscale_ok = 1;
		a->snd_wscale = cookie & 0xf;
		a->rcv_wscale = cookie_wscale;
	}
	if (o->ts) {
		a->tstamp_ok = 1;
		a->rcv_tsval = o->tsval;
		a->rcv_tsecr = o->tsecr;
	}
	if (bpf_sk_assign_tcp_reqsk(skb, (struct sock *)tp, a, sizeof(*a)) < 0) {
		/* A listener the kernel will not hand a request socket: an
		 * MPTCP one (Go's listeners are, from Go 1.24), or options
		 * its sysctls turn off. The kernel answers the ACK itself
		 * (with a reset): the client learns at once. */
		count_event(gen, rule, EVENT_COOKIE_BAD);
		pass = 1;
		goto out;
	}
	count_event(gen, rule, EVENT_COOKIE_OK);
	pass = 1;
out:
	bpf_sk_release(sk);
	return pass;
}
