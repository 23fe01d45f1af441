"""The CPU fast path: compiled replacements of the ops and packed weights, an annex to the NumPy core.

    kernels.py       Numba kernels: MXFP4 and bf16 products on packed weights, the norms, top-k, the packer
    numba_ext.py     their LLVM-IR forms (byte shuffles, AVX-512 dots, prefetch), loaded at the first compile
    rng.py           NumPy's PCG64 + ziggurat in Numba: the weight store's draws, packed as they are drawn
    packed.py        MXFP4Weight, BF16Weight, grouped_matmul: `x @ W` on the held bytes
    kda.py           the fused KDA decode as one Numba program per (sequence, head)
    experts.py       the routed-expert ops over packed experts, streamed a chunk at a time, all ranks at once
    replacements.py  REPLACEMENTS: op of simulator/ops -> its compiled replacement
    backend.py       FastBackend: what `execute.run_plan(..., backend="fast")` does differently

Nothing in simulator/ops, simulator/plans or simulator/cost imports this package (tests/test_replacements.py
holds it so); the NumPy forms there are the definitions, and every replacement is tested against its op.
"""
