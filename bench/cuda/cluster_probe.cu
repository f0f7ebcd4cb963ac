/* Thread-block cluster probe (not a test): for 512-thread blocks with 100-220 KB of shared memory,
 * cudaOccupancyMaxActiveClusters for clusters of 8 and 16 and the cost of one cluster.sync()
 * (clock cycles, 100 in a row). On the H100 of docs/benchmarks.md (eighth session): one block an SM
 * fits 15 clusters of 8 and 7 of 16 (not 16 / 8: the GPCs differ in size); cluster.sync ~1,400
 * cycles. Run: build-dev/tests/cuda/cuda_cluster_probe */
#include <cstdio>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern __shared__ float4 smx[];
__global__ void __launch_bounds__(512, 1) kprobe(float *o, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cl = cg::this_cluster();
  smx[threadIdx.x] = make_float4(threadIdx.x, 0, 0, 0);
  unsigned long long t0 = clock64();
  for (int i = 0; i < n; i++) cl.sync();
  unsigned long long t1 = clock64();
  float v = cl.map_shared_rank((float *)smx, (cl.block_rank() + 1) % cl.num_blocks())[4 * threadIdx.x];
  cl.sync();
  if (threadIdx.x == 0) o[blockIdx.x] = (float)(t1 - t0) / (n > 0 ? n : 1) + v * 0.f;
#else
  (void)o; (void)n;
#endif
}
int main() {
  cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
  printf("%s sms=%d smemOptin=%zu l2=%d\n", p.name, p.multiProcessorCount, p.sharedMemPerBlockOptin, p.l2CacheSize);
  if (p.major < 9) { printf("clusters need sm_90\n"); return 0; }
  cudaFuncSetAttribute(kprobe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  float *o; cudaMalloc(&o, 4096 * 4);
  for (int smem : {100 * 1024, 190 * 1024, 200 * 1024, 220 * 1024}) {
    cudaFuncSetAttribute(kprobe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (int cs : {8, 16}) {
      cudaLaunchConfig_t cfg = {}; cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension; at[0].val.clusterDim.x = cs; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(cs * 8); cfg.blockDim = dim3(512); cfg.dynamicSmemBytes = smem; cfg.attrs = at; cfg.numAttrs = 1;
      int nc = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&nc, kprobe, &cfg);
      float ms = -1;
      if (e == cudaSuccess) {
        cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
        cudaLaunchKernelEx(&cfg, kprobe, o, 0); cudaDeviceSynchronize();
        cudaEventRecord(a); for (int r = 0; r < 20; r++) cudaLaunchKernelEx(&cfg, kprobe, o, 0); cudaEventRecord(b); cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms, a, b); ms /= 20;
        cudaLaunchKernelEx(&cfg, kprobe, o, 100); cudaDeviceSynchronize();
        float h[128]; cudaMemcpy(h, o, sizeof h, cudaMemcpyDeviceToHost);
        printf("smem=%dK cs=%d maxActiveClusters=%d launch(8 clusters) %.2f us  cluster.sync %.0f cycles  err=%s\n", smem / 1024, cs, nc, ms * 1000, h[0], cudaGetErrorString(cudaGetLastError()));
      } else printf("smem=%dK cs=%d occupancy error %s\n", smem / 1024, cs, cudaGetErrorString(e));
    }
  }
  return 0;
}
