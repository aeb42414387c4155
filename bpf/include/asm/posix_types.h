#include <asm-generic/posix_types.h>
