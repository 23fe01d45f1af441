// What does PDL hide for a kernel with independent work? A chain of GEMVs y_i = W_i x_{i-1}.
//
// Each W_i (N x K fp32, 16 MiB at N = K = 2048) is its own matrix from a pool 4x the L2, so weights are cold;
// x_{i-1} is the previous kernel's output, so only 8 KiB of each kernel's input depends on its predecessor.
// Three variants, each timed without and with programmatic dependent launch, 64 launches per CUDA graph:
//   wait_first   griddepcontrol.wait, then stream W and x (nothing overlaps but the launch)
//   prefetch     prefetch this block's W rows into L2 (prefetch.global.L2), then wait, then compute: what
//                vLLM's specialized path does with weights while a predecessor or a collective runs
//   (both release their dependents at kernel start.)
// Output: one JSON line per variant: t0_us (no PDL), t0_pdl_us, hidden_us = the difference.
//
// nvcc -O3 -arch=sm_90a -o pdl_prefetch pdl_prefetch.cu && ./pdl_prefetch [chain] [replays] [N rows]

#include "pdl_common.cuh"


constexpr int K = 2048, ROWS_PER_BLOCK = 8, THREADS = 256;
int N = 2048;  // rows: 16 MiB of weights at 2048 (argv[3])


template <bool PREFETCH>
__global__ void gemv(const float* __restrict__ W, const float* __restrict__ x, float* __restrict__ y) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row = blockIdx.x * ROWS_PER_BLOCK + warp;
    const float* w = W + (size_t)row * K;
    pdl_launch_dependents();
    if (PREFETCH)  // 128-byte lines: each lane prefetches every 32nd line of its warp's row
        for (int i = lane * 32; i < K; i += 32 * 32) asm volatile("prefetch.global.L2 [%0];" :: "l"(w + i));
    pdl_wait();
    float acc = 0.f;
    for (int i = lane * 4; i < K; i += 32 * 4) {
        float4 a = *reinterpret_cast<const float4*>(w + i), b = *reinterpret_cast<const float4*>(x + i);
        acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[row] = acc * (1.0f / K) + 0.5f;  // keeps the chain's values bounded
}

template <bool PREFETCH>
double per_launch_us(bool pdl, int chain, const std::vector<float*>& pool, float* xa, float* xb, int replays) {
    return graph_per_launch_us(chain, replays, 5, [&](cudaStream_t s, int i) {
        Launch l(s, pdl, dim3(N / ROWS_PER_BLOCK), dim3(THREADS));
        CK(cudaLaunchKernelEx(&l.cfg, gemv<PREFETCH>, (const float*)pool[i % pool.size()],
                              (const float*)((i % 2) ? xb : xa), (i % 2) ? xa : xb));
    });
}

int main(int argc, char** argv) {
    int chain = argc > 1 ? atoi(argv[1]) : 64, replays = argc > 2 ? atoi(argv[2]) : 30;
    if (argc > 3) N = atoi(argv[3]);
    size_t bytes = (size_t)N * K * 4;
    std::vector<float*> pool(std::max<size_t>(16, (256u << 20) / bytes));  // >= 4x the 60 MB L2: cold weights
    std::vector<float> h((size_t)N * K);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 0.001f * (float)(i % 1009);
    for (auto& p : pool) { CK(cudaMalloc(&p, h.size() * sizeof(float))); CK(cudaMemcpy(p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice)); }
    float *xa, *xb; CK(cudaMalloc(&xa, K * sizeof(float))); CK(cudaMalloc(&xb, K * sizeof(float)));
    CK(cudaMemcpy(xa, h.data(), K * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xb, h.data(), K * sizeof(float), cudaMemcpyHostToDevice));
    const double mb = (double)N * K * 4 / 1e6;
    for (int v = 0; v < 2; ++v) {
        double plain = v ? per_launch_us<true>(false, chain, pool, xa, xb, replays) : per_launch_us<false>(false, chain, pool, xa, xb, replays);
        double pdl = v ? per_launch_us<true>(true, chain, pool, xa, xb, replays) : per_launch_us<false>(true, chain, pool, xa, xb, replays);
        printf("{\"kernel\": \"gemv_%s\", \"weight_mb\": %.2f, \"chain\": %d, \"replays\": %d, \"t0_us\": %.4f, \"t0_pdl_us\": %.4f, \"hidden_us\": %.4f}\n",
               v ? "prefetch" : "wait_first", mb, chain, replays, plain, pdl, plain - pdl);
        fflush(stdout);
    }
    return 0;
}
