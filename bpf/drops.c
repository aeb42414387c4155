// SPDX-License-Identifier: GPL-2.0
/* Drop reasons for `rampart diagnose`: counts every skb the kernel frees as
 * dropped (the skb:kfree_skb tracepoint), keyed by reason, dropping call
 * site, interface and protocol, for one network namespace.
 *
 * The kernel structs below are cut down to the fields read here and marked
 * preserve_access_index, so libbpf relocates each access against the running
 * kernel's BTF (CO-RE): no vmlinux.h, and no offsets tied to one build. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char __license[] SEC("license") = "GPL";

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

typedef struct {
	struct net *net;
} possible_net_t;

struct net_device {
	int ifindex;
	possible_net_t nd_net;
} __attribute__((preserve_access_index));

struct sock_common {
	possible_net_t skc_net;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct sk_buff {
	struct net_device *dev;
	struct sock *sk;
	__be16 protocol;
	__u16 network_header;
	unsigned char *head;
} __attribute__((preserve_access_index));

/* The first reasons are not drops: SKB_NOT_DROPPED_YET, SKB_CONSUMED. */
#define FIRST_DROP_REASON 2

struct drop_key {
	__u64 location; /* address of the call site that freed the skb */
	__u32 reason;   /* enum skb_drop_reason */
	__u32 ifindex;  /* skb->dev, 0 when the skb had none */
	__u16 l3proto;  /* ethertype, host order */
	__u8 l4proto;   /* IP protocol or IPv6 next header, 0 when unknown */
	__u8 pad[5];
};

/* Only drops in this namespace are counted (its /proc/self/ns/net inode):
 * the counters diagnose reads are per namespace too. */
volatile const __u32 target_netns;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct drop_key);
	__type(value, __u64);
} drops SEC(".maps");

/* Drops that found the table full, so a report can say it is incomplete. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* Under a flood nearly every drop on a CPU has the same key: they are
 * counted here, per CPU, and added to the hash when the key changes or
 * FLUSH_EVERY have gathered, which keeps the hash's cost off most events.
 * Readers add the pending counts, so a read is at most FLUSH_EVERY per CPU
 * off, made good by the next one. */
#define FLUSH_EVERY 64

struct pending_drops {
	struct drop_key key;
	__u64 count;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pending_drops);
} pending SEC(".maps");

static __always_inline void flush(struct pending_drops *p)
{
	__u64 *n = bpf_map_lookup_elem(&drops, &p->key);

	if (!n && bpf_map_update_elem(&drops, &p->key, &p->count, BPF_NOEXIST) == 0)
		goto done;
	if (!n)
		n = bpf_map_lookup_elem(&drops, &p->key); /* another CPU's insert won */
	if (n) {
		*n += p->count;
	} else {
		__u32 zero = 0;
		__u64 *l = bpf_map_lookup_elem(&lost, &zero);
		if (l)
			*l += p->count;
	}
done:
	p->count = 0;
}

static __always_inline int same_key(const struct drop_key *a, const struct drop_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2];
}

static __always_inline __u32 inum_of(struct net *net)
{
	/* An RCU pointer: the verifier wants it null-checked before use. */
	if (!net)
		return 0;
	return net->ns.inum;
}

static __always_inline __u32 netns_of(struct sk_buff *skb)
{
	struct net_device *dev = skb->dev;
	struct sock *sk = skb->sk;

	/* Keep the checked value: a reloaded RCU pointer is unchecked again. */
	barrier_var(dev);
	barrier_var(sk);
	if (dev)
		return inum_of(dev->nd_net.net);
	if (sk)
		return inum_of(sk->__sk_common.skc_net.net);
	return 0;
}

/* The protocol byte of the network header: raw packet memory, not a BTF
 * type, so it is read with a helper. */
static __always_inline __u8 l4_of(struct sk_buff *skb, __u16 l3proto)
{
	__u16 nh = skb->network_header;
	__u8 proto = 0;

	if (nh == (__u16)~0U)
		return 0;
	if (l3proto == ETH_P_IP)
		bpf_probe_read_kernel(&proto, 1, skb->head + nh + 9);
	else if (l3proto == ETH_P_IPV6)
		bpf_probe_read_kernel(&proto, 1, skb->head + nh + 6);
	return proto;
}

/* Arguments since 5.17: skb, location, reason (6.11 added rx_sk). */
SEC("tp_btf/kfree_skb")
int BPF_PROG(count_drop, struct sk_buff *skb, void *location, unsigned int reason)
{
	if (reason < FIRST_DROP_REASON || netns_of(skb) != target_netns)
		return 0;

	struct drop_key key = {
		.location = (__u64)location,
		.reason = reason,
		.l3proto = bpf_ntohs(skb->protocol),
	};
	if (skb->dev)
		key.ifindex = skb->dev->ifindex;
	key.l4proto = l4_of(skb, key.l3proto);

	__u32 zero = 0;
	struct pending_drops *p = bpf_map_lookup_elem(&pending, &zero);
	if (!p)
		return 0;
	if (p->count && !same_key(&p->key, &key))
		flush(p);
	if (!p->count)
		p->key = key;
	if (++p->count >= FLUSH_EVERY)
		flush(p);
	return 0;
}
