"""Numba extensions: compiled forms of two plain functions, written in LLVM IR.

    fast.decode_block   one MXFP4 block decoded with one byte shuffle per nibble. Numba's own vectoriser
                        makes a 16-entry table lookup a gather or scalar loads; this form is 2.5-3x
                        faster (benchmarks/mxfp4_roofline.py)
    rng._mulhi          the high half of a 64 x 64-bit product, one `mul` instruction on x86-64

Imported by `simulator/jit.py` when the kernels first compile (fast.py and rng.py ask for it with
`on_compile`), never at start-up: it needs Numba and llvmlite. The plain forms stay the definitions, and
tests hold each pair equal.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from simulator.fast import E2M1_X2, FAST, decode_block
from simulator.rng import _mulhi


@overload(decode_block, jit_options={"fastmath": FAST})
def _decode_block_compiled(row, j, half_scale, even, odd):  # type: ignore[no-untyped-def]
    return lambda row, j, half_scale, even, odd: decode_block_simd(row, j, half_scale, even, odd)


@intrinsic
def decode_block_simd(typingctx, row, j, half_scale, even, odd):  # type: ignore[no-untyped-def]
    """`decode_block` in LLVM vector IR: load 16 bytes, split the nibbles, look each 16-lane vector up in
    the 16-entry table, widen to float32, scale, store. The lookup is written as 16 lane extracts from a
    constant vector, which LLVM turns into one `pshufb` (x86) or `tbl` (Arm); Numba's own vectoriser
    makes a table lookup a gather or scalar loads (2.5-3x slower: benchmarks/mxfp4_roofline.py)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i8, i32, f32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
        bytes16, floats16 = ir.VectorType(i8, 16), ir.VectorType(f32, 16)
        src = context.make_array(signature.args[0])(context, builder, args[0])
        codes = builder.load(builder.bitcast(builder.gep(src.data, [args[1]]), bytes16.as_pointer()), align=1)
        scale = builder.insert_element(ir.Constant(floats16, ir.Undefined), builder.fptrunc(args[2], f32)
                                       if signature.args[2] != types.float32 else args[2], ir.Constant(i32, 0))
        scale = builder.shuffle_vector(scale, scale, ir.Constant(ir.VectorType(i32, 16), [0] * 16))
        table = ir.Constant(bytes16, [int(v) for v in E2M1_X2])
        nibbles = (builder.and_(codes, ir.Constant(bytes16, [15] * 16)), builder.lshr(codes, ir.Constant(bytes16, [4] * 16)))
        for nib, arg, ty in zip(nibbles, args[3:], signature.args[3:]):
            looked = ir.Constant(bytes16, ir.Undefined)
            for lane in range(16):
                value = builder.extract_element(table, builder.extract_element(nib, ir.Constant(i32, lane)))
                looked = builder.insert_element(looked, value, ir.Constant(i32, lane))
            values = builder.fmul(builder.sitofp(looked, floats16), scale)
            dst = context.make_array(ty)(context, builder, arg)
            builder.store(values, builder.bitcast(builder.gep(dst.data, [args[1]]), floats16.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(row, j, half_scale, even, odd), codegen


@overload(_mulhi, inline="always")
def _mulhi_compiled(a, b):  # type: ignore[no-untyped-def]
    return lambda a, b: mulhi_llvm(a, b)


@intrinsic
def mulhi_llvm(typingctx, a, b):  # type: ignore[no-untyped-def]
    """High 64 bits of the 128-bit product a * b (one `mul` instruction on x86-64)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        wide = ir.IntType(128)
        product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        return builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))
    return types.uint64(types.uint64, types.uint64), codegen
