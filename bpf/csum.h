/* One's-complement checksums (IPv4 header, TCP, UDP), summed inline: the
 * bpf_csum_diff helper costs more than the sums it would replace. */
#pragma once

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

/* One's-complement checksum update (RFC 1624: HC' = ~(~HC + ~m + m')).
 * Words are summed as loaded; the one's-complement sum does not depend on
 * byte order. */
static __always_inline __u64 csum_add_change(__u64 s, __u32 old, __u32 new)
{
	return s + (__u32)~old + new;
}

/* Folds a sum below 2^47 (of 16- or 32-bit words) into a 16-bit
 * one's-complement checksum. */
static __always_inline __u16 csum_fold32(__u64 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~s;
}

/* Sum of n 16-bit words (n even bytes, at most 60) at buf. */
static __always_inline __u64 csum_words(const __u8 *buf, __u32 n)
{
	__u64 s = 0;
#pragma unroll
	for (int i = 0; i < 30; i++) {
		if (2 * i >= n)
			break;
		s += *(__u16 *)(buf + 2 * i);
	}
	return s;
}
