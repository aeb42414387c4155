// SPDX-License-Identifier: GPL-2.0
/* Programs for `rampart lab drop`: the in-kernel flood generator, and the bare
 * drop programs the socket-bpf, tc-bpf and XDP layers of the study attach.
 *
 * The generator runs through BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES:
 * the kernel hands it frames from a page pool initialised once with a
 * template, and every frame it redirects is transmitted for real. Pages come
 * back with whatever was last done to them, and not only by the generator: a
 * receiver that answers with XDP_TX (a SYN cookie) rewrites the frame in
 * place and sends the same page back. So each run first copies the headers
 * back from gen_template, then rewrites the source address and port. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "csum.h"

char __license[] SEC("license") = "GPL";

/* Generator configuration, set before load. */
volatile const __u32 out_ifindex;
volatile const __u8 gen_family = 4;
volatile const __u8 gen_proto = IPPROTO_UDP; /* or IPPROTO_TCP: the template is a SYN */

/* The frame's first bytes, its headers with valid checksums; the frame is
 * at most GEN_TEMPLATE bytes. */
#define GEN_TEMPLATE 80
volatile const __u64 gen_template[GEN_TEMPLATE / 8];

/* The flood's sources are src_count addresses spread over a range by an
 * odd multiplier, a bijection on the range's host bits, so the generator
 * needs no table and the lab's blocklist lists exactly them: source i is
 * src_base | ((i * src_mult) & src_mask). IPv4 varies the host bits of the
 * address; IPv6 varies bits 32-63 (one /64 per source, as IPv6 blocklists
 * list them) and takes the interface identifier at random. Host byte order. */
volatile const __u32 src_count = 1;
volatile const __u32 src_base;
volatile const __u32 src_mask;
volatile const __u32 src_mult = 1;
volatile const __u32 src6_hi; /* IPv6 bits 0-31, network order */

/* Flood destination, matched by the drop programs: the study's 198.18.0.0/24
 * and fd00::/64, UDP port 1234, set from Go. */
volatile const __u8 dst4_prefix[3];
volatile const __u8 dst6_prefix[8];
volatile const __u16 flood_port;

/* Frames generated; the generator runs on one CPU, so a plain global. */
__u64 generated;

/* Packets the drop programs dropped (or, for the socket filter, refused). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lab_drops SEC(".maps");

#define ETH_LEN 14
#define IP4_LEN 20
#define IP6_LEN 40

/* Random in [0, n) without a division. */
static __always_inline __u32 random_below(__u32 n)
{
	return ((__u64)bpf_get_prandom_u32() * n) >> 32;
}

SEC("xdp")
int lab_gen(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 host = (random_below(src_count) * src_mult) & src_mask;
	__u32 src = bpf_htonl(src_base | host);
	/* Source ports 1024-65535, like the study's random ports. */
	__u16 sport = bpf_htons(1024 + random_below(64512));

	/* Eight bytes at a time, then what is left of the last eight. */
#pragma unroll
	for (int i = 0; i < GEN_TEMPLATE / 8; i++) {
		if (data + 8 * (i + 1) > data_end) {
#pragma unroll
			for (int j = 0; j < 8; j++) {
				if (data + 8 * i + j + 1 > data_end)
					break;
				((__u8 *)data)[8 * i + j] = (__u8)(gen_template[i] >> (8 * j));
			}
			break;
		}
		((__u64 *)data)[i] = gen_template[i];
	}
	__u8 *udp; /* the L4 header, UDP or TCP: ports first in both */
	__u32 old_ports, new_ports;
	__u64 s;
	/* The checksum's offset in the L4 header, and how far it must reach. */
	const __u32 csum_off = gen_proto == IPPROTO_TCP ? 16 : 6;

	if (gen_family == 4) {
		__u8 *ip = data + ETH_LEN;
		udp = data + ETH_LEN + IP4_LEN;
		if ((void *)(udp + 20) > data_end)
			return XDP_ABORTED;
		__u32 old_addr = *(__u32 *)(ip + 12);
		__u16 *ip_check = (__u16 *)(ip + 10);
		*ip_check = csum_fold32(csum_add_change((__u16)~*ip_check, old_addr, src));
		*(__u32 *)(ip + 12) = src;
		s = csum_add_change((__u16)~*(__u16 *)(udp + csum_off), old_addr, src);
	} else {
		__u8 *ip = data + ETH_LEN;
		udp = data + ETH_LEN + IP6_LEN;
		if ((void *)(udp + 20) > data_end)
			return XDP_ABORTED;
		__u32 *a = (__u32 *)(ip + 8);
		__u32 w[4] = {src6_hi, src, bpf_get_prandom_u32(), bpf_get_prandom_u32()};
		s = (__u16)~*(__u16 *)(udp + csum_off);
		for (int i = 0; i < 4; i++) {
			s = csum_add_change(s, a[i], w[i]);
			a[i] = w[i];
		}
	}
	old_ports = *(__u32 *)udp;
	new_ports = old_ports;
	*(__u16 *)&new_ports = sport;
	__u16 c = csum_fold32(csum_add_change(s, old_ports, new_ports));
	if (gen_proto == IPPROTO_TCP) {
		/* A new sequence number for every SYN, as a flood tool sends. */
		__u32 old_seq = *(__u32 *)(udp + 4), seq = bpf_get_prandom_u32();
		c = csum_fold32(csum_add_change((__u16)~c, old_seq, seq));
		*(__u32 *)(udp + 4) = seq;
		*(__u16 *)(udp + 16) = c;
	} else {
		*(__u16 *)(udp + 6) = c ? c : 0xffff; /* 0 is "no checksum" in UDP */
	}
	*(__u32 *)udp = new_ports;
	generated++;
	return bpf_redirect(out_ifindex, 0);
}

/* lab_sink, on the generator's side of the veth, takes what the receiving
 * namespace sends back (SYN-ACKs, replies and errors to the flood's made-up
 * sources) off the wire before the generator's stack spends anything on
 * it; what is for the legitimate clients' network passes, to be routed to
 * them. It also gives that side the XDP program a veth needs before it
 * delivers what its peer's XDP transmits. */
volatile const __u8 client4_prefix[3];
volatile const __u8 client6_prefix[8];

SEC("xdp")
int lab_sink(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 *ip = data + ETH_LEN;
	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		if ((void *)(ip + IP4_LEN) > data_end)
			return XDP_PASS;
		return ip[16] == client4_prefix[0] && ip[17] == client4_prefix[1] && ip[18] == client4_prefix[2] ? XDP_PASS : XDP_DROP;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		if ((void *)(ip + IP6_LEN) > data_end)
			return XDP_PASS;
		if (ip[6] == 58 && (void *)(ip + IP6_LEN + 1) <= data_end && ip[IP6_LEN] >= 133 && ip[IP6_LEN] <= 137)
			return XDP_PASS; /* neighbour discovery */
		for (int i = 0; i < 8; i++)
			if (ip[24 + i] != client6_prefix[i])
				return XDP_DROP;
		return XDP_PASS;
	}
	return XDP_PASS;
}

/* flood_match is the study's XDP filter: IPv4 or IPv6 UDP to the flood's
 * destination prefix and port. No VLAN, no IPv6 extension headers: the flood
 * has none, and anything else passes. */
static __always_inline int flood_match(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return 0;
	__u8 *ip = data + ETH_LEN;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		if ((void *)(ip + IP4_LEN) > data_end)
			return 0;
		__u32 ihl = (ip[0] & 0x0f) * 4;
		if (ip[9] != IPPROTO_UDP || ihl < IP4_LEN)
			return 0;
		if (ip[16] != dst4_prefix[0] || ip[17] != dst4_prefix[1] || ip[18] != dst4_prefix[2])
			return 0;
		__u8 *udp = ip + ihl;
		if ((void *)(udp + 8) > data_end)
			return 0;
		return *(__u16 *)(udp + 2) == bpf_htons(flood_port);
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		__u8 *udp = ip + IP6_LEN;
		if ((void *)(udp + 8) > data_end)
			return 0;
		if (ip[6] != IPPROTO_UDP)
			return 0;
		for (int i = 0; i < 8; i++)
			if (ip[24 + i] != dst6_prefix[i])
				return 0;
		return *(__u16 *)(udp + 2) == bpf_htons(flood_port);
	}
	return 0;
}

static __always_inline void count_drop(void)
{
	__u32 k = 0;
	__u64 *n = bpf_map_lookup_elem(&lab_drops, &k);
	if (n)
		*n += 1;
}

SEC("xdp")
int lab_xdp_drop(struct xdp_md *ctx)
{
	if (!flood_match((void *)(long)ctx->data, (void *)(long)ctx->data_end))
		return XDP_PASS;
	count_drop();
	return XDP_DROP;
}

SEC("tc")
int lab_tc_drop(struct __sk_buff *skb)
{
	if (!flood_match((void *)(long)skb->data, (void *)(long)skb->data_end))
		return TC_ACT_OK;
	count_drop();
	return TC_ACT_SHOT;
}

/* Attached with SO_ATTACH_BPF to the flood's socket: refuses everything. */
SEC("socket")
int lab_sock_drop(struct __sk_buff *skb)
{
	count_drop();
	return 0;
}

/* The study's eBPF filter by list: the source looked up in the kernel's
 * LPM trie (filled from Go with the flood's sources), beside the same
 * destination match as lab_xdp_drop. */
struct lab_lpm_v4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct lab_lpm_v6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1); /* the list's size, set from Go */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lab_lpm_v4_key);
	__type(value, __u8);
} lab_lpm_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lab_lpm_v6_key);
	__type(value, __u8);
} lab_lpm_v6 SEC(".maps");

SEC("xdp")
int lab_xdp_lpm(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	if (!flood_match(data, data_end))
		return XDP_PASS;
	__u8 *ip = data + ETH_LEN;
	void *hit;
	if (gen_family == 4) {
		struct lab_lpm_v4_key k = {.prefixlen = 32};
		if ((void *)(ip + IP4_LEN) > data_end)
			return XDP_PASS;
		__builtin_memcpy(k.addr, ip + 12, 4);
		hit = bpf_map_lookup_elem(&lab_lpm_v4, &k);
	} else {
		struct lab_lpm_v6_key k = {.prefixlen = 128};
		if ((void *)(ip + IP6_LEN) > data_end)
			return XDP_PASS;
		__builtin_memcpy(k.addr, ip + 8, 16);
		hit = bpf_map_lookup_elem(&lab_lpm_v6, &k);
	}
	if (!hit)
		return XDP_PASS;
	count_drop();
	return XDP_DROP;
}

/* The floor of any list lookup: one dependent random read, keyed by the
 * source, from an array as large as rampart's tables for the run's list
 * (sized from Go), then the drop. Nothing writes the array, so the
 * sentinel never matches; comparing with it keeps the read live. */
volatile const __u32 floor_words = 1; /* lab_floor's entries */
#define FLOOR_NEVER 0xffffffffu

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} lab_floor SEC(".maps");

SEC("xdp")
int lab_xdp_floor(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	if (!flood_match(data, data_end))
		return XDP_PASS;
	__u32 *a = data + ETH_LEN + (gen_family == 4 ? 12 : 8);
	if ((void *)(a + 2) > data_end)
		return XDP_PASS;
	/* IPv4: the address; IPv6: its /64 folded, as the list holds /64s. */
	__u32 src = gen_family == 4 ? a[0] : a[0] ^ a[1];
	__u32 i = ((__u64)(src * 0x9e3779b1u) * floor_words) >> 32;
	__u32 *w = bpf_map_lookup_elem(&lab_floor, &i);
	if (!w || *w == FLOOR_NEVER)
		return XDP_PASS;
	count_drop();
	return XDP_DROP;
}

/* `lab egress`'s tc-lpm method, the egress study's own filter: on the
 * client's clsact egress, an IPv4 packet whose destination the kernel's LPM
 * trie holds is dropped. */
SEC("tc")
int lab_tc_lpm_dst(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u8 *ip = data + ETH_LEN;
	if ((void *)(ip + IP4_LEN) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct lab_lpm_v4_key k = {.prefixlen = 32};
	__builtin_memcpy(k.addr, ip + 16, 4);
	if (!bpf_map_lookup_elem(&lab_lpm_v4, &k))
		return TC_ACT_OK;
	count_drop();
	return TC_ACT_SHOT;
}
