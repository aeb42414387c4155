#include <asm-generic/types.h>
