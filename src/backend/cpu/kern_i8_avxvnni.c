/* AVX-VNNI kernels of the int8 path (Alder Lake, Sapphire Rapids and later without AVX-512 use):
 * kern_i8_avx2.c compiled with vpdpbusd (VEX) as its dot product. */
#define SM_I8_AVXVNNI 1
#include "kern_i8_avx2.c"
