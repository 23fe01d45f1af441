"""Numba extensions: compiled forms of plain functions, written in LLVM IR.

    kernels.decode_block  one MXFP4 block decoded with one byte shuffle per nibble. Numba's own vectoriser
                        makes a 16-entry table lookup a gather or scalar loads; this form is 2.5-3x
                        faster (benchmarks/mxfp4_roofline.py)
    kernels.mxfp4_dot   one MXFP4 row times one token row in AVX-512 registers: `vpermps` / `vpermi2pd`
                        table lookups, FMAs, one scale per block, nothing written (hosts with AVX-512F;
                        elsewhere the weight-by-weight form compiles); for bfloat16 x (uint16 bits) on hosts
                        with AVX-512 BF16, `vpermw` lookups and `vdpbf16ps` dot products (mxfp4_dot_bf16)
    kernels.packed_at   the bytes at an address as an array (a packed expert where the store holds it)
    kernels.prefetch    `llvm.prefetch` of a cache line
    kernels.transpose_16  a 16 x 16 byte tile transposed with two-source byte shuffles (`vpermt2b` on
                        AVX-512 VBMI): byte pairs into W^T's rows (packer, fused draw), 0.26 -> 0.11 ns a weight
    rng._mulhi          the high half of a 64 x 64-bit product, one `mul` instruction on x86-64

Imported by `simulator/jit.py` when the kernels first compile (kernels.py and rng.py ask for it with
`on_compile`), never at start-up: it needs Numba and llvmlite. The plain forms stay the definitions, and
tests hold each pair equal. Numba's on-disk cache keys a kernel on its own source file only; jit.py adds a
digest of this file and of every kernel module to our kernels' cache stamps, so editing it recompiles them.
"""

from __future__ import annotations

from llvmlite import ir
import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from simulator.fast.kernels import (E2M1, E2M1_X2, FAST, STEP_WEIGHTS, STREAM_AHEAD, _dot_loops, decode_block,
                                    has_avx512, has_bf16_dot, lanes, mxfp4_dot, packed_at, prefetch,
                                    transpose_16)
from simulator.fast.rng import _mulhi


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
        nibbles = (builder.and_(codes, ir.Constant(bytes16, [15] * 16)),
                   builder.lshr(codes, ir.Constant(bytes16, [4] * 16)))
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


@overload(transpose_16, inline="always")
def _transpose_16_compiled(src, n0, dst, c0):  # type: ignore[no-untyped-def]
    return lambda src, n0, dst, c0: transpose_16_simd(src, n0, dst, c0)


@intrinsic
def transpose_16_simd(typingctx, src, n0, dst, c0):  # type: ignore[no-untyped-def]
    """`kernels.transpose_16` in LLVM vector IR: the 16 source rows' 16 bytes loaded, joined four rows to a
    64-byte vector, and each group of four output rows picked out of them by two-source shuffles (on
    AVX-512 VBMI, `vpermt2b`), then stored 16 bytes a row. Both arrays C-ordered uint8 [rows, columns]."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i8, i32 = ir.IntType(8), ir.IntType(32)
        v16 = ir.VectorType(i8, 16)

        def shuffle(a: ir.Value, b: ir.Value, picks: list[int]) -> ir.Value:
            return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, len(picks)), picks))

        s_arr = context.make_array(signature.args[0])(context, builder, args[0])
        d_arr = context.make_array(signature.args[2])(context, builder, args[2])
        s_stride = cgutils.unpack_tuple(builder, s_arr.strides, 2)[0]
        d_stride = cgutils.unpack_tuple(builder, d_arr.strides, 2)[0]
        rows = []
        for j in range(16):
            at = builder.add(builder.mul(s_stride, ir.Constant(s_stride.type, j)), args[1])
            rows.append(builder.load(builder.bitcast(builder.gep(s_arr.data, [at]), v16.as_pointer()), align=1))
        pair = [shuffle(rows[2 * i], rows[2 * i + 1], list(range(32))) for i in range(8)]
        quad = [shuffle(pair[2 * g], pair[2 * g + 1], list(range(64))) for g in range(4)]  # row 4g + r at 16 r + col
        for t in range(4):  # output rows n0 + 4t + c, c < 4: byte j is source row j's column 4t + c
            picks = [(j // 4) * 64 + (j % 4) * 16 + 4 * t + c for c in range(4) for j in range(8)]  # rows j < 8
            low, high = shuffle(quad[0], quad[1], picks), shuffle(quad[2], quad[3], picks)  # rows 8 + j from 2, 3
            out = shuffle(low, high, [c * 8 + j if j < 8 else 32 + c * 8 + j - 8 for c in range(4) for j in range(16)])
            for c in range(4):
                row = builder.add(args[1], ir.Constant(args[1].type, 4 * t + c))
                at = builder.add(builder.mul(row, d_stride), args[3])
                ptr = builder.bitcast(builder.gep(d_arr.data, [at]), v16.as_pointer())
                builder.store(shuffle(out, out, list(range(16 * c, 16 * c + 16))), ptr, align=1)
        return context.get_dummy_value()
    return types.void(src, types.int64, dst, types.int64), codegen


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


@overload(packed_at, inline="always")
def _packed_at_compiled(addr, nbytes):  # type: ignore[no-untyped-def]
    return lambda addr, nbytes: numba.carray(u8_pointer(addr), (nbytes,))


@intrinsic
def u8_pointer(typingctx, addr):  # type: ignore[no-untyped-def]
    """An integer address as a uint8 pointer."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.inttoptr(args[0], ir.PointerType(ir.IntType(8)))
    return types.CPointer(types.uint8)(types.int64), codegen


@overload(prefetch, inline="always")
def _prefetch_compiled(addr):  # type: ignore[no-untyped-def]
    return lambda addr: prefetch_llvm(addr)


@intrinsic
def prefetch_llvm(typingctx, addr):  # type: ignore[no-untyped-def]
    """llvm.prefetch of the line at an integer address: read, keep in all cache levels."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        _prefetch_line(builder, builder.inttoptr(args[0], ir.PointerType(ir.IntType(8))))
        return context.get_dummy_value()
    return types.void(types.int64), codegen


def _prefetch_line(builder: ir.IRBuilder, ptr: ir.Value) -> None:
    """llvm.prefetch of the line at an i8 pointer: read, keep in all cache levels (never faults)."""
    i8p, i32 = ir.PointerType(ir.IntType(8)), ir.IntType(32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                        "llvm.prefetch.p0")
    builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


@overload(mxfp4_dot, inline="always")
def _mxfp4_dot_compiled(codes, c0, scales, s0, lut, xp, x0, nbytes):  # type: ignore[no-untyped-def]
    if has_bf16_dot() and xp.dtype == types.uint16:
        return lambda codes, c0, scales, s0, lut, xp, x0, nbytes: mxfp4_dot_bf16(codes, c0, scales, s0, lut, xp, x0,
                                                                                  nbytes)
    if has_avx512() and xp.dtype in (types.float32, types.float64):
        return lambda codes, c0, scales, s0, lut, xp, x0, nbytes: mxfp4_dot_avx512(codes, c0, scales, s0, xp, x0,
                                                                                    nbytes)
    return lambda codes, c0, scales, s0, lut, xp, x0, nbytes: _dot_loops(codes, c0, scales, s0, lut, xp, x0, nbytes,
                                                                          False)


@intrinsic
def mxfp4_dot_avx512(typingctx, codes, c0, scales, s0, xp, x0, nbytes):  # type: ignore[no-untyped-def]
    """`mxfp4_dot` in AVX-512, nothing written but the result. A step loads 64 code bytes as L lanes (16
    dwords for float32, 8 qwords for float64); for each nibble j of a lane, a shift right by 4j puts it in
    the lane's low 4 bits, which is all `vpermps` (float32: a 16-entry table in one register) or
    `vpermi2pd` (float64: the table in two) look at; an FMA with the permuted x (`kernels.permute_x`) adds it
    to one of 2 partial sums. The step's 4 blocks sit in lanes L/4 apart: their E8M0 bits, broadcast and
    shifted per lane, become 2^(e - 127) by moving e into the exponent field, and one FMA per step scales
    the partial sums into the accumulator. A tail of 1 or 3 blocks loads with a lane mask; a tail of 2 (where
    the TP16 down projection's 192-weight slices end) loads as L lanes of half the width, zero-extended: half the
    nibbles a lane, half the work (`permute_x` lays that step's x out to match)."""
    dtype = xp.dtype
    f32 = dtype == types.float32

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        width = lanes("float32" if f32 else "float64")
        nib = STEP_WEIGHTS // width  # nibbles per lane
        flt, lane_int = (ir.FloatType(), ir.IntType(32)) if f32 else (ir.DoubleType(), ir.IntType(64))
        i1, i32, i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
        vf, vi = ir.VectorType(flt, width), ir.VectorType(lane_int, width)
        flt_bits = 32 if f32 else 64
        mod = builder.module

        def splat(v: int) -> ir.Constant:
            return ir.Constant(vi, [v] * width)

        def broadcast(v: ir.Value) -> ir.Value:  # a lane-sized value into every lane
            one = builder.insert_element(ir.Constant(vi, ir.Undefined), v, ir.Constant(i32, 0))
            lane0 = ir.Constant(ir.VectorType(i32, width), [0] * width)
            return builder.shuffle_vector(one, ir.Constant(vi, ir.Undefined), lane0)

        def vector_fn(name: str, args: list[ir.Type]) -> ir.Function:  # an LLVM intrinsic returning vf
            return cgutils.get_or_insert_function(mod, ir.FunctionType(vf, args), name)

        fma = vector_fn(f"llvm.fma.v{width}f{flt_bits}", [vf, vf, vf])
        masked_load = cgutils.get_or_insert_function(
            mod, ir.FunctionType(vi, [vi.as_pointer(), i32, ir.VectorType(i1, width), vi]),
            f"llvm.masked.load.v{width}i{lane_int.width}.p0")
        if f32:
            permute = vector_fn("llvm.x86.avx512.permvar.sf.512", [vf, vi])
            values = ir.Constant(vf, [float(v) for v in E2M1])
            lookup = lambda idx: builder.call(permute, [values, idx])  # noqa: E731
        else:
            permute = vector_fn("llvm.x86.avx512.vpermi2var.pd.512", [vf, vi, vf])
            low, high = ir.Constant(vf, [float(v) for v in E2M1[:8]]), ir.Constant(vf, [float(v) for v in E2M1[8:]])
            lookup = lambda idx: builder.call(permute, [low, idx, high])  # noqa: E731
        cbase, sbase = _row_bases(context, builder, signature, args)
        xbase = builder.gep(context.make_array(signature.args[4])(context, builder, args[4]).data, [args[5]])
        nbytes = args[6]
        steps, tail = builder.lshr(nbytes, ir.Constant(i64, 6)), builder.and_(nbytes, ir.Constant(i64, 63))
        acc = cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * width))
        def step(c: ir.Value, codes: ir.Value, word: ir.Value, nib: int = nib) -> None:  # nib: nibbles a lane
            blocks_per_vector = 4 * nib // (STEP_WEIGHTS // width)  # 4, or 2 for a half step
            scale = _block_scales(builder, word, vf, width // blocks_per_vector)
            xrow = builder.gep(xbase, [builder.mul(c, ir.Constant(i64, STEP_WEIGHTS))])
            odd = builder.lshr(codes, splat(4))  # the high nibbles of every byte in its low bits
            chains: list[ir.Value] = []
            for j in range(nib):
                src, t = (codes, odd)[j % 2], j // 2  # nibble j is byte t's low or high half
                idx = builder.lshr(src, splat(8 * t)) if t else src
                xv = builder.load(builder.bitcast(builder.gep(xrow, [ir.Constant(i64, j * width)]), vf.as_pointer()),
                                  align=4 if f32 else 8)
                term = lookup(idx)
                if j < 2:
                    chains.append(builder.fmul(xv, term))
                else:
                    chains[j % 2] = builder.call(fma, [xv, term, chains[j % 2]])
            partial = builder.fadd(chains[0], chains[1])
            builder.store(builder.call(fma, [partial, scale, builder.load(acc)]), acc)

        with cgutils.for_range(builder, steps) as loop:
            c = loop.index
            _stream_ahead(builder, cbase, sbase, builder.mul(c, ir.Constant(i64, 64)))
            codes = builder.load(builder.bitcast(builder.gep(cbase, [builder.mul(c, ir.Constant(i64, 64))]),
                                                 vi.as_pointer()), align=1)
            word = builder.load(builder.bitcast(builder.gep(sbase, [builder.mul(c, ir.Constant(i64, 4))]),
                                                i32.as_pointer()), align=1)
            step(c, codes, word)
        ctail = builder.gep(cbase, [builder.mul(steps, ir.Constant(i64, 64))])  # the tail's code and scale bytes
        stail = builder.gep(sbase, [builder.mul(steps, ir.Constant(i64, 4))])
        half = builder.icmp_unsigned("==", tail, ir.Constant(i64, 32))
        with builder.if_then(half):  # two blocks: lanes of half the width (x in `permute_x`'s half step)
            halves = ir.VectorType(ir.IntType(lane_int.width // 2), width)
            codes = builder.zext(builder.load(builder.bitcast(ctail, halves.as_pointer()), align=1), vi)
            step(steps, codes, _scale_word(builder, stail, ir.Constant(i64, 2)), nib // 2)
        with builder.if_then(builder.and_(builder.icmp_unsigned("!=", tail, ir.Constant(i64, 0)), builder.not_(half))):
            live = builder.trunc(builder.udiv(tail, ir.Constant(i64, 64 // width)), lane_int)
            mask = builder.icmp_unsigned("<", ir.Constant(vi, list(range(width))), broadcast(live))
            codes = builder.call(masked_load, [builder.bitcast(ctail, vi.as_pointer()), ir.Constant(i32, 1), mask,
                                               ir.Constant(vi, [0] * width)])
            step(steps, codes, _scale_word(builder, stail, builder.lshr(tail, ir.Constant(i64, 4))))  # 1 or 3 blocks
        return _lane_sum(builder, builder.load(acc), width)
    return dtype(codes, types.int64, scales, types.int64, xp, types.int64, types.int64), codegen


def _block_scales(builder: ir.IRBuilder, word: ir.Value, vf: ir.VectorType, lanes_per_block: int) -> ir.Value:
    """2^(e - 127) of the E8M0 bytes of a little-endian 32-bit word, byte b in lanes b L .. (b + 1) L - 1 of a
    float32 or float64 vector (L = lanes_per_block), made by putting e in the exponent field; in float32, e = 0
    is the subnormal 2^-127 (bit 22) and e = 255 comes out infinite, as `kernels.value_lut` has them."""
    f32 = vf.element == ir.FloatType()
    lane = ir.IntType(32 if f32 else 64)
    vi = ir.VectorType(lane, vf.count)

    def splat(v: int) -> ir.Constant:
        return ir.Constant(vi, [v] * vf.count)
    one = builder.insert_element(ir.Constant(vi, ir.Undefined), word if f32 else builder.zext(word, lane),
                                 ir.Constant(ir.IntType(32), 0))
    every = builder.shuffle_vector(one, ir.Constant(vi, ir.Undefined),
                                   ir.Constant(ir.VectorType(ir.IntType(32), vf.count), [0] * vf.count))
    e = builder.and_(builder.lshr(every, ir.Constant(vi, [8 * (i // lanes_per_block) for i in range(vf.count)])),
                     splat(255))
    if f32:
        bits = builder.select(builder.icmp_unsigned("==", e, splat(0)), splat(1 << 22), builder.shl(e, splat(23)))
    else:
        bits = builder.shl(builder.add(e, splat(1023 - 127)), splat(52))
    return builder.bitcast(bits, vf)


def _stream_ahead(builder: ir.IRBuilder, cbase: ir.Value, sbase: ir.Value, offset: ir.Value) -> None:
    """Ask for the code line `kernels.STREAM_AHEAD` bytes past offset, and its scales' line, while this step runs
    (every 64 code bytes: the scales' line is asked for 16 times, which costs a load slot each, not a miss)."""
    i64 = ir.IntType(64)
    ahead = builder.add(offset, ir.Constant(i64, STREAM_AHEAD))
    _prefetch_line(builder, builder.gep(cbase, [ahead]))
    _prefetch_line(builder, builder.gep(sbase, [builder.lshr(ahead, ir.Constant(i64, 4))]))


def _scale_word(builder: ir.IRBuilder, sptr: ir.Value, blocks: ir.Value) -> ir.Value:
    """The E8M0 bytes of a 1-3 block tail as one little-endian word, zero past the last block; every byte read
    is one of the tail's own (byte t read at min(t, blocks - 1)), so nothing past the row is touched."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    word = ir.Constant(i32, 0)
    for t in range(3):
        has = builder.icmp_unsigned(">", blocks, ir.Constant(i64, t))
        at = builder.select(has, ir.Constant(i64, t), builder.sub(blocks, ir.Constant(i64, 1)))
        byte = builder.zext(builder.load(builder.gep(sptr, [at])), i32)
        byte = builder.select(has, byte, ir.Constant(i32, 0))
        word = builder.or_(word, builder.shl(byte, ir.Constant(i32, 8 * t)))
    return word


def _row_bases(context, builder, signature, args):  # type: ignore[no-untyped-def]
    """Pointers to a dot's first code byte and first scale byte: (codes, c0, scales, s0, ...) -> (&codes[c0],
    &scales[s0])."""
    code_arr = context.make_array(signature.args[0])(context, builder, args[0])
    scale_arr = context.make_array(signature.args[2])(context, builder, args[2])
    return builder.gep(code_arr.data, [args[1]]), builder.gep(scale_arr.data, [args[3]])


def _lane_sum(builder: ir.IRBuilder, total: ir.Value, width: int) -> ir.Value:
    """The sum of a vector's lanes by a fixed tree (lanes i and i + size/2), so every host adds in one order."""
    i32 = ir.IntType(32)
    size = width
    while size > 1:
        size //= 2
        lo, hi = (builder.shuffle_vector(total, total, ir.Constant(ir.VectorType(i32, size), list(range(k, k + size))))
                  for k in (0, size))
        total = builder.fadd(lo, hi)
    return builder.extract_element(total, ir.Constant(i32, 0))


class _BFloat(ir.Type):
    """LLVM's bfloat, which llvmlite's IR builder does not name: the element type of `vdpbf16ps`'s operands."""
    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BFloat)

    def __hash__(self) -> int:
        return hash(_BFloat)


E2M1_BF16 = E2M1.astype(np.float32).view(np.uint32) >> 16  # the E2M1 values as bfloat16 bits (exact)


@intrinsic
def mxfp4_dot_bf16(typingctx, codes, c0, scales, s0, lut, xb, x0, nbytes):  # type: ignore[no-untyped-def]
    """`mxfp4_dot` for bfloat16 x (bits in `kernels.permute_x_bf16`'s order) with AVX-512 BF16, float32 sums.

    A step is 32 code bytes (2 blocks) = 64 weights as 16 words of 4 nibbles; the loop takes two steps at once,
    64 bytes in one 512-bit vector (lanes 0-7 step 2p, 8-15 step 2p + 1). For nibble j of every word, a shift
    right by 4j puts it in the word's low bits, and `vpermw` returns the 32 weights 4i + j as bfloat16 (E2M1
    values are exact in bfloat16) from a 32-entry table: the 16 values twice, so the next nibble's low bit,
    which `vpermw` also reads, picks the same value. `vdpbf16ps` then adds x_2l w_2l + x_2l+1 w_2l+1 into
    float32 lane l: 32 products an instruction, each exact (an 8-bit by a 2-bit significand), each sum rounded
    as an FMA rounds it. Lanes 4b..4b+3 hold block b of the four, so one FMA scales the partial sums by each
    block's 2^(e - 127) (made from its E8M0 bits, as the float kernel does). An odd last step runs as a
    256-bit step into lanes 0-7, a 16-byte tail (one block) as half of one into lanes 8-15; then the halves
    are added and the 8 lanes summed by a fixed tree.

    Per 128 weights: 4 `vpermw` + 3 shifts + 4 `vdpbf16ps` + the scale. `vdpbf16ps` issues at about the same
    rate whatever its width on the CPUs measured (docs/history/fast-path.md), so two 256-bit steps run as one
    512-bit instruction: the same products summed in the same order lane by lane, the same bits. `vdpbf16ps`
    treats subnormal inputs and results as zero (x below 2^-126, or a partial sum of such terms, which the
    float path keeps)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i1, i8, i16, i32, i64, f32 = (ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64),
                                      ir.FloatType())
        mod = builder.module

        def fn(name: str, ret: ir.Type, params: list[ir.Type]) -> ir.Function:
            return cgutils.get_or_insert_function(mod, ir.FunctionType(ret, params), name)

        def vec(t: ir.Type, n: int, values: list) -> ir.Constant:  # type: ignore[type-arg]
            return ir.Constant(ir.VectorType(t, n), values)

        cbase, sbase = _row_bases(context, builder, signature, args)
        xbase = builder.gep(context.make_array(signature.args[5])(context, builder, args[5]).data, [args[6]])
        nbytes = args[7]
        steps = builder.lshr(nbytes, ir.Constant(i64, 5))  # whole 32-byte steps
        pairs = builder.lshr(steps, ir.Constant(i64, 1))

        def step(width: int, words: ir.Value, scale: ir.Value, xrow: ir.Value, acc: ir.Value) -> ir.Value:
            """acc + (sum over the 4 nibbles of every word of x w) * scale, in `width` float32 lanes."""
            vw, vf = ir.VectorType(i16, 2 * width), ir.VectorType(f32, width)
            bf = ir.VectorType(_BFloat(), 2 * width)
            permw = fn(f"llvm.x86.avx512.permvar.hi.{32 * width}", vw, [vw, vw])
            dot = fn(f"llvm.x86.avx512bf16.dpbf16ps.{32 * width}", vf, [vf, bf, bf])
            fma = fn(f"llvm.fma.v{width}f32", vf, [vf, vf, vf])
            table = vec(i16, 2 * width, [int(v) for v in E2M1_BF16] * (width // 8))  # vpermw reads 4 or 5 bits
            zero = vec(f32, width, [0.0] * width)
            sums = []
            for j in range(4):  # nibble j of every 16-bit word: weight 4 i + j of its step
                idx = builder.lshr(words, vec(i16, 2 * width, [4 * j] * 2 * width)) if j else words
                w = builder.bitcast(builder.call(permw, [table, idx]), bf)
                xv = builder.load(builder.gep(builder.bitcast(xrow, bf.as_pointer()), [ir.Constant(i64, j)]), align=2)
                sums.append(builder.call(dot, [zero, w, xv]) if j < 2 else builder.call(dot, [sums[j % 2], w, xv]))
            partial = builder.fadd(sums[2], sums[3])
            return builder.call(fma, [partial, scale, acc])

        def scale256(c: ir.Value, blocks: int) -> ir.Value:  # lanes 0-3 block 2c's 2^(e - 127), 4-7 block 2c + 1's
            word = builder.load(builder.bitcast(builder.gep(sbase, [builder.shl(c, ir.Constant(i64, 1))]),
                                                ir.IntType(8 * blocks).as_pointer()), align=1)  # its own bytes only
            return _block_scales(builder, builder.zext(word, i32), ir.VectorType(f32, 8), 8 // blocks)  # 1: all 8

        acc = cgutils.alloca_once_value(builder, vec(f32, 16, [0.0] * 16))
        with cgutils.for_range(builder, pairs) as loop:
            p = loop.index
            at = builder.shl(p, ir.Constant(i64, 6))  # 64 code bytes a pair
            _stream_ahead(builder, cbase, sbase, at)
            words = builder.load(builder.bitcast(builder.gep(cbase, [at]), ir.VectorType(i16, 32).as_pointer()),
                                 align=1)
            word = builder.load(builder.bitcast(builder.gep(sbase, [builder.shl(p, ir.Constant(i64, 2))]),
                                                i32.as_pointer()), align=1)  # the pair's 4 E8M0 bytes
            scale = _block_scales(builder, word, ir.VectorType(f32, 16), 4)  # = lut[e] for every e, 255 (inf) too
            xrow = builder.gep(xbase, [builder.shl(p, ir.Constant(i64, 7))])  # 128 x values a pair
            builder.store(step(16, words, scale, xrow, builder.load(acc)), acc)
        total = builder.load(acc)
        halves = [cgutils.alloca_once_value(builder, builder.shuffle_vector(total, total,
                                                                            vec(i32, 8, list(range(k, k + 8)))))
                  for k in (0, 8)]  # even steps' sums, odd steps'
        last = builder.sub(steps, ir.Constant(i64, 1))
        with builder.if_then(builder.trunc(steps, i1)):  # an odd step count: the last one, a 256-bit step
            words = builder.load(builder.bitcast(builder.gep(cbase, [builder.shl(last, ir.Constant(i64, 5))]),
                                                 ir.VectorType(i16, 16).as_pointer()), align=1)
            xrow = builder.gep(xbase, [builder.shl(last, ir.Constant(i64, 6))])
            builder.store(step(8, words, scale256(last, 2), xrow, builder.load(halves[0])), halves[0])
        tail = builder.and_(nbytes, ir.Constant(i64, 31))
        with builder.if_then(builder.icmp_unsigned("!=", tail, ir.Constant(i64, 0))):  # one block: 16 bytes
            half = builder.load(builder.bitcast(builder.gep(cbase, [builder.shl(steps, ir.Constant(i64, 5))]),
                                                ir.VectorType(i8, 16).as_pointer()), align=1)
            codes16 = builder.shuffle_vector(half, ir.Constant(ir.VectorType(i8, 16), [0] * 16),
                                             vec(i32, 32, list(range(32))))  # the missing block's codes zero
            words = builder.bitcast(codes16, ir.VectorType(i16, 16))
            xrow = builder.gep(xbase, [builder.shl(steps, ir.Constant(i64, 6))])
            builder.store(step(8, words, scale256(steps, 1), xrow, builder.load(halves[1])), halves[1])
        return _lane_sum(builder, builder.fadd(builder.load(halves[0]), builder.load(halves[1])), 8)
    return types.float32(codes, types.int64, scales, types.int64, lut, xb, types.int64, types.int64), codegen
