/* The BPF target is 64-bit whatever the build host is. */
#define __BITS_PER_LONG 64
#include <asm-generic/bitsperlong.h>
