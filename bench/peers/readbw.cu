// Physical read ceiling of the GPU: a pure streaming read (16-byte loads, several in flight)
// over a buffer far larger than L2; best over grid sizes. Prints GB/s read.
// Build: nvcc -O3 -gencode arch=compute_90,code=sm_90 -o build-peers/readbw bench/peers/readbw.cu
#include <cuda_runtime.h>

#include <cstdio>
#define CK(x)                                        \
  do {                                               \
    cudaError_t e = (x);                             \
    if (e != cudaSuccess) {                          \
      printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      return 1;                                      \
    }                                                \
  } while (0)

template <int UNROLL>
__global__ void readk(const int4* __restrict__ p, size_t n, int* sink) {
  int acc = 0;
  size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
    int4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) v[u] = __ldg(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    int4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

int main() {
  const size_t bytes = size_t(4) << 30, n = bytes / 16;
  int4* p;
  int* sink;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(p, 1, bytes));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  double best = 0;
  int best_blocks = 0, best_threads = 0;
  for (int threads : {256, 512, 1024})
    for (int per_sm : {1, 2, 4, 8, 16}) {
      int blocks = prop.multiProcessorCount * per_sm;
      if (threads * per_sm > 2048) continue;
      readk<4><<<blocks, threads>>>(p, n, sink);
      CK(cudaDeviceSynchronize());
      float ms_best = 1e9;
      for (int r = 0; r < 10; r++) {
        cudaEventRecord(a);
        readk<4><<<blocks, threads>>>(p, n, sink);
        cudaEventRecord(b);
        CK(cudaEventSynchronize(b));
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        if (ms < ms_best) ms_best = ms;
      }
      double gbps = bytes / (ms_best * 1e-3) / 1e9;
      if (gbps > best) {
        best = gbps;
        best_blocks = blocks;
        best_threads = threads;
      }
    }
  printf("%s SMs=%d L2=%d MB read ceiling %.0f GB/s (blocks %d x %d threads, best of 10)\n",
         prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, best, best_blocks,
         best_threads);
  return 0;
}
