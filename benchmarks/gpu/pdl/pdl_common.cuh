// What the PDL microbenchmarks share: error checks, the two griddepcontrol instructions, a launch config
// with or without programmatic dependent launch, and the CUDA-graph timing of a chain of launches.
#pragma once

#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// A launch on stream s, with PDL (programmatic stream serialization) when asked.
struct Launch {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    Launch(cudaStream_t s, bool pdl, dim3 grid, dim3 block) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.stream = s; cfg.gridDim = grid; cfg.blockDim = block;
        cfg.attrs = pdl ? attr : nullptr; cfg.numAttrs = pdl ? 1 : 0;
    }
};

// Median over `replays` of (graph replay time / chain) in us: `capture(s, i)` launches the i-th of `chain`
// kernels on s while the stream is captured; the graph is replayed `warmup` times first.
template <class Capture>
double graph_per_launch_us(int chain, int replays, int warmup, Capture capture) {
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < chain; ++i) capture(s, i);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < warmup; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int r = 0; r < replays; ++r) {
        CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms * 1000.0 / chain);
    }
    std::sort(t.begin(), t.end());
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaStreamDestroy(s));
    return t[t.size() / 2];
}
