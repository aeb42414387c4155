/* bpfel: little-endian whatever the build host is. */
#include <linux/byteorder/little_endian.h>
