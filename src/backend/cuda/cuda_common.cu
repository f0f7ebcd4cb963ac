/* The launch helpers of cuda_common.cuh that are not inline. */
#include <mutex>
#include "backend/cuda/cuda_common.cuh"

/* the kernels whose carveout attribute was set, and to which value (a CUDA function attribute is
 * per process) */
void cu_carve(const void *kern, int val) {
  static std::mutex mu;
  static const void *done[1024];
  static int nd = 0, cur = -2;
  std::lock_guard<std::mutex> lk(mu);
  if (val < 0 && cur == -2) return; /* never set: the driver's choice stands */
  if (val != cur) { nd = 0; cur = val; } /* changed (another model, tests): set every kernel again */
  for (int i = 0; i < nd; i++)
    if (done[i] == kern) return;
  cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, val < 0 ? -1 : val);
  if (nd < 1024) done[nd++] = kern;
}
