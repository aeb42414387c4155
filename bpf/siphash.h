/* SipHash under the policy's key (flood_key): table slots and SYN
 * cookies that whoever lacks the key cannot aim at. */
#pragma once

#include "flood.h"

#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                \
	do {                                                                    \
		v0 += v1; v1 = ROTL64(v1, 13); v1 ^= v0; v0 = ROTL64(v0, 32);   \
		v2 += v3; v3 = ROTL64(v3, 16); v3 ^= v2;                        \
		v0 += v3; v3 = ROTL64(v3, 21); v3 ^= v0;                        \
		v2 += v1; v1 = ROTL64(v1, 17); v1 ^= v2; v2 = ROTL64(v2, 32);   \
	} while (0)
#define SIPWORD(m)                                                              \
	do {                                                                    \
		v3 ^= (m); SIPROUND; SIPROUND; v0 ^= (m);                       \
	} while (0)

/* SipHash-2-4 of n 64-bit words (a constant, at most 6) under
 * flood_key. */
static __always_inline __u64 siphash24(const __u64 *m, const int n)
{
	__u64 v0 = flood_key[0] ^ 0x736f6d6570736575ULL, v1 = flood_key[1] ^ 0x646f72616e646f6dULL;
	__u64 v2 = flood_key[0] ^ 0x6c7967656e657261ULL, v3 = flood_key[1] ^ 0x7465646279746573ULL;
#pragma unroll
	for (int i = 0; i < 6; i++) {
		if (i >= n)
			break;
		SIPWORD(m[i]);
	}
	SIPWORD((__u64)(8 * n) << 56);
	v2 ^= 0xff;
	SIPROUND; SIPROUND; SIPROUND; SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* SipHash-1-3 (the kernel's hsiphash on 64-bit) of n words (1 to 3, a
 * constant): for table slots, where it is enough that an attacker cannot aim
 * at a bucket without the key, and each round matters at every packet of a
 * flood. Cookies keep SipHash-2-4. Inputs of different lengths never
 * collide by construction: the length is hashed in. */
static __always_inline __u64 siphash13(__u64 a, __u64 b, __u64 c, int n)
{
	__u64 v0 = flood_key[0] ^ 0x736f6d6570736575ULL, v1 = flood_key[1] ^ 0x646f72616e646f6dULL;
	__u64 v2 = flood_key[0] ^ 0x6c7967656e657261ULL, v3 = flood_key[1] ^ 0x7465646279746573ULL;
	v3 ^= a; SIPROUND; v0 ^= a;
	if (n > 1) {
		v3 ^= b; SIPROUND; v0 ^= b;
	}
	if (n > 2) {
		v3 ^= c; SIPROUND; v0 ^= c;
	}
	__u64 m = (__u64)(8 * n) << 56;
	v3 ^= m; SIPROUND; v0 ^= m;
	v2 ^= 0xff;
	SIPROUND; SIPROUND; SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}
