// How much of a small kernel's time does programmatic dependent launch (PDL) hide?
//
// The cost model (docs/cost-model.md 1.4, 1.6) splits a kernel boundary in CUDA-graph replay into the part
// PDL hides (launch_gap_us: idle gap + the next kernel's launch ramp; H200 read chain 1.62 us) and a floor
// PDL cannot hide (kernel_fixed_us 0.44 for a streaming kernel; larger for a norm, a top-k, a finalize).
// This program measures per-launch time t0 for chains of N dependent launches of one kernel type inside one
// CUDA graph, without and with PDL, so that t0(no PDL) - t0(PDL) is what PDL hides for that type.
//
// Kernels (fp32, decode sizes M = 8 rows, hidden 7168, 896 experts, top 16):
//   empty     one block, one store
//   copy      1 MiB streaming copy
//   rmsnorm   one block per row: sum of squares, block reduction, scale, write
//   topk      one block per row: 16 rounds of block arg-max over 896 scores in shared memory
//   finalize  out[m, :] = 0.5 prev[m, :] + sum_j w[m, j] slots[m, j, :] (k = 16 slots of 7168)
// Each kernel waits on its predecessor (griddepcontrol.wait) before touching memory and lets its dependent
// launch right away (griddepcontrol.launch_dependents): the most PDL can give. Buffers ping-pong, so every
// launch reads what the previous one wrote.
//
// Build and run: nvcc -O3 -arch=sm_90a -o pdl_floors pdl_floors.cu && ./pdl_floors [chain] [replays] [kinds...]
// (copy_<KiB> sweeps a streaming copy's size: ./pdl_floors 64 30 copy_64 copy_1024 copy_8192 copy_32768)

#include <cstring>

#include "pdl_common.cuh"


constexpr int M = 8, D = 7168, E = 896, K = 16, THREADS = 256;


__device__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) red[w] = v;
    __syncthreads();
    v = (threadIdx.x < blockDim.x / 32) ? red[threadIdx.x] : 0.f;
    if (w == 0) for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
    __syncthreads();
    float r = red[0];
    __syncthreads();
    return r;
}

__global__ void k_empty(const float* x, float* y) {
    pdl_wait(); pdl_launch_dependents();
    if (threadIdx.x == 0) y[0] = x[0] + 1.f;
}

__global__ void k_copy(const float4* x, float4* y, int n4) {
    pdl_wait(); pdl_launch_dependents();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) y[i] = x[i];
}

__global__ void k_rmsnorm(const float* x, float* y) {
    __shared__ float red[32];
    pdl_wait(); pdl_launch_dependents();
    const float* xr = x + (size_t)blockIdx.x * D;
    float* yr = y + (size_t)blockIdx.x * D;
    float s = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) { float v = xr[i]; s += v * v; }
    s = block_sum(s, red);
    float r = rsqrtf(s / D + 1e-6f);
    for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = xr[i] * r;
}

__global__ void k_topk(const float* x, float* y) {
    __shared__ float sc[E];
    __shared__ float bv[32];
    __shared__ int bi[32];
    __shared__ int chosen[K];
    pdl_wait(); pdl_launch_dependents();
    const float* xr = x + (size_t)blockIdx.x * E;
    float* yr = y + (size_t)blockIdx.x * E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) sc[i] = 1.f / (1.f + __expf(-xr[i]));
    __syncthreads();
    for (int r = 0; r < K; ++r) {
        float v = -1e30f; int idx = 0;
        for (int i = threadIdx.x; i < E; i += blockDim.x) if (sc[i] > v) { v = sc[i]; idx = i; }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, v, o); int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
        }
        int w = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) { bv[w] = v; bi[w] = idx; }
        __syncthreads();
        if (threadIdx.x == 0) {
            float best = bv[0]; int bidx = bi[0];
            for (int j = 1; j < blockDim.x / 32; ++j) if (bv[j] > best || (bv[j] == best && bi[j] < bidx)) { best = bv[j]; bidx = bi[j]; }
            chosen[r] = bidx; sc[bidx] = -1e30f;
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < E; i += blockDim.x) yr[i] = xr[i];
    __syncthreads();
    if (threadIdx.x < K) yr[chosen[threadIdx.x]] = xr[chosen[threadIdx.x]] - 1e-3f;  // next launch depends on this
}

__global__ void k_finalize(const float* prev, const float* slots, const float* w, float* out) {
    pdl_wait(); pdl_launch_dependents();
    int m = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    float acc = 0.5f * prev[(size_t)m * D + d];
    for (int j = 0; j < K; ++j) acc += w[m * K + j] * slots[((size_t)m * K + j) * D + d];
    out[(size_t)m * D + d] = acc;
}

struct Bufs { float *a, *b, *slots, *w; size_t n; };

void launch(const char* kind, bool pdl, cudaStream_t s, const float* in, float* out, const Bufs& bf) {
    Launch l(s, pdl, dim3(1), dim3(THREADS));
    cudaLaunchConfig_t& cfg = l.cfg;
    if (!strcmp(kind, "empty")) { cfg.gridDim = dim3(1); CK(cudaLaunchKernelEx(&cfg, k_empty, in, out)); }
    else if (!strcmp(kind, "copy")) {
        int n4 = (1 << 20) / 16; cfg.gridDim = dim3(264);
        CK(cudaLaunchKernelEx(&cfg, k_copy, (const float4*)in, (float4*)out, n4));
    } else if (!strncmp(kind, "copy_", 5)) {  // copy_<KiB>: a streaming copy of that size, grid sized to it
        int n4 = atoi(kind + 5) * 1024 / 16; cfg.gridDim = dim3(std::min(132 * 8, std::max(1, n4 / THREADS)));
        CK(cudaLaunchKernelEx(&cfg, k_copy, (const float4*)in, (float4*)out, n4));
    } else if (!strcmp(kind, "rmsnorm")) { cfg.gridDim = dim3(M); CK(cudaLaunchKernelEx(&cfg, k_rmsnorm, in, out)); }
    else if (!strcmp(kind, "topk")) { cfg.gridDim = dim3(M); CK(cudaLaunchKernelEx(&cfg, k_topk, in, out)); }
    else if (!strcmp(kind, "finalize")) {
        cfg.gridDim = dim3((D + THREADS - 1) / THREADS, M);
        CK(cudaLaunchKernelEx(&cfg, k_finalize, in, (const float*)bf.slots, (const float*)bf.w, out));
    } else { fprintf(stderr, "unknown kind %s\n", kind); exit(2); }
}

double per_launch_us(const char* kind, bool pdl, int chain, const Bufs& bf, int replays) {
    return graph_per_launch_us(chain, replays, 5, [&](cudaStream_t s, int i) {
        launch(kind, pdl, s, (i % 2) ? bf.b : bf.a, (i % 2) ? bf.a : bf.b, bf);
    });
}

int main(int argc, char** argv) {
    int chain = argc > 1 ? atoi(argv[1]) : 64, replays = argc > 2 ? atoi(argv[2]) : 30;
    Bufs bf; bf.n = (size_t)(32 << 20);  // >= M * D and >= the largest copy (128 MiB of floats)
    CK(cudaMalloc(&bf.a, bf.n * sizeof(float))); CK(cudaMalloc(&bf.b, bf.n * sizeof(float)));
    CK(cudaMalloc(&bf.slots, (size_t)M * K * D * sizeof(float))); CK(cudaMalloc(&bf.w, M * K * sizeof(float)));
    std::vector<float> h(bf.n);
    for (size_t i = 0; i < bf.n; ++i) h[i] = 0.5f + 0.001f * (float)(i % 997);
    CK(cudaMemcpy(bf.a, h.data(), bf.n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bf.b, h.data(), bf.n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bf.slots, h.data(), (size_t)M * K * D * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bf.w, h.data(), M * K * sizeof(float), cudaMemcpyHostToDevice));
    std::vector<const char*> kinds = {"empty", "copy", "rmsnorm", "topk", "finalize"};
    if (argc > 3) kinds.assign(argv + 3, argv + argc);  // e.g. copy_64 copy_8192: sizes in KiB
    for (const char* k : kinds) {
        double plain = per_launch_us(k, false, chain, bf, replays);
        double pdl = per_launch_us(k, true, chain, bf, replays);
        printf("{\"kernel\": \"%s\", \"chain\": %d, \"replays\": %d, \"t0_us\": %.4f, \"t0_pdl_us\": %.4f, \"hidden_us\": %.4f}\n",
               k, chain, replays, plain, pdl, plain - pdl);
        fflush(stdout);
    }
    return 0;
}
