/* The AMX GEMM of src/backend/cpu/kern_amx.c with its tile instructions emulated in C
 * (sm_amx_gemm_emu), so that test_cpu_int8 runs its tiling, strides and epilogue on CPUs without
 * AMX. */
#define SM_AMX_EMULATE 1
#include "backend/cpu/kern_amx.c"
