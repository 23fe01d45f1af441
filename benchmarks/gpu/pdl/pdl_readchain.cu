// The docs/sources.md 3.1 read chain, rebuilt: does PDL hide a boundary only when a kernel has independent
// work to start before its wait?
//
// Chain of R kernels in one CUDA graph; kernel i streams its own S bytes (a distinct slab of a pool larger
// than L2, so every read is cold) and adds a scalar its predecessor wrote. Two variants, each timed without
// and with programmatic dependent launch (dependents released at kernel start):
//   stream_then_wait   stream the S bytes, then griddepcontrol.wait, then read the scalar (independent
//                      work before the wait: what a GEMM's weight loads are)
//   wait_then_stream   wait first, then stream (nothing to overlap but the launch)
// Output: one JSON line per (variant, S): t0_us (per launch, no PDL), t0_pdl_us, hidden_us.
//
// nvcc -O3 -arch=sm_90a -o pdl_readchain pdl_readchain.cu && ./pdl_readchain [chain] [replays]

#include "pdl_common.cuh"


constexpr int THREADS = 256, BLOCKS = 132 * 4;


template <bool STREAM_FIRST>
__global__ void read_chain(const float4* __restrict__ slab, size_t n4, const float* prev, float* next) {
    pdl_launch_dependents();
    float acc = 0.f;
    if (!STREAM_FIRST) pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = slab[i]; acc += v.x + v.y + v.z + v.w;
    }
    if (STREAM_FIRST) pdl_wait();
    float p = *prev;  // the only byte that depends on the predecessor
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && acc == 12345.678f) next[1] = acc;  // keep the loads alive
    if (blockIdx.x == 0 && threadIdx.x == 0) *next = p * 0.5f + 1.f;
}

template <bool STREAM_FIRST>
double per_launch_us(bool pdl, int chain, const float* pool, size_t slab_bytes, float* sa, float* sb, int replays) {
    size_t n4 = slab_bytes / 16;
    return graph_per_launch_us(chain, replays, 3, [&](cudaStream_t s, int i) {
        Launch l(s, pdl, dim3(BLOCKS), dim3(THREADS));
        const float4* slab = reinterpret_cast<const float4*>(pool + (size_t)i * (slab_bytes / 4));
        CK(cudaLaunchKernelEx(&l.cfg, read_chain<STREAM_FIRST>, slab, n4, (const float*)((i % 2) ? sb : sa),
                              (i % 2) ? sa : sb));
    });
}

int main(int argc, char** argv) {
    int chain = argc > 1 ? atoi(argv[1]) : 64, replays = argc > 2 ? atoi(argv[2]) : 20;
    const size_t sizes_mb[] = {1, 8, 32};
    size_t pool_bytes = (size_t)chain * (32u << 20);
    float* pool; CK(cudaMalloc(&pool, pool_bytes)); CK(cudaMemset(pool, 0, pool_bytes));
    float *sa, *sb; CK(cudaMalloc(&sa, 64)); CK(cudaMalloc(&sb, 64)); CK(cudaMemset(sa, 0, 64)); CK(cudaMemset(sb, 0, 64));
    for (size_t mb : sizes_mb) {
        size_t bytes = mb << 20;
        for (int v = 0; v < 2; ++v) {
            double plain = v ? per_launch_us<false>(false, chain, pool, bytes, sa, sb, replays) : per_launch_us<true>(false, chain, pool, bytes, sa, sb, replays);
            double pdl = v ? per_launch_us<false>(true, chain, pool, bytes, sa, sb, replays) : per_launch_us<true>(true, chain, pool, bytes, sa, sb, replays);
            printf("{\"kernel\": \"%s\", \"mib\": %zu, \"chain\": %d, \"replays\": %d, \"t0_us\": %.4f, \"t0_pdl_us\": %.4f, \"hidden_us\": %.4f}\n",
                   v ? "wait_then_stream" : "stream_then_wait", mb, chain, replays, plain, pdl, plain - pdl);
            fflush(stdout);
        }
    }
    return 0;
}
