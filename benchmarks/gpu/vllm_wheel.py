"""vLLM's production kernels, loaded at measurement time from its released wheel (never from this repository).

    python benchmarks/gpu/vllm_wheel.py --wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl --out DIR

unpacks the few members the production measurements need (three compiled extensions, stripped of symbols
they do not need to load, three Python sources and vLLM's tuned H200 MoE tile files) into DIR, to be
carried to the GPU machine.
`Wheel(DIR, torch)` there registers the extensions' ops with torch.ops.load_library, imports the K3 Triton
KDA source with its four `vllm` helper imports answered by the small stand-in modules below (a platform
that reports PDL on compute capability >= 9 as vLLM's CUDA platform does, Triton's exp / log as FLA's
default ops, Triton itself, cdiv and next_power_of_2), and cuts the Triton MoE kernel and vLLM's default
tile rules out of fused_moe.py into a module of their own (with vLLM's tuned H200 tile configs beside), so
no other vLLM code runs.

The 92 MB `_C_stable_libtorch` (norms, activation, gptq_marlin_repack, fused_kda_decode) is not unpacked:
79 MB stripped, 63 MB compressed, past what one GPU call may carry; points.PRODUCTION_IMPLS names the
stand-ins.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

VERSION = "0.33.0"
LIBRARIES = ("vllm/_moe_C_stable_libtorch.abi3.so", "vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so")
SOURCES = ("vllm/scalar_type.py", "vllm/models/kimi_k3/nvidia/ops/third_party/kda/fused_recurrent.py",
           "vllm/model_executor/layers/fused_moe/fused_moe.py")
MOE_CONFIGS = "vllm/model_executor/layers/fused_moe/configs/"  # tuned Triton MoE tile configs, H200 ones unpacked
# from fused_moe.py only these functions run (the Triton kernel, its helper, vLLM's default tile rules)
FUSED_MOE_FUNCTIONS = ("write_zeros_to_output", "fused_moe_kernel", "get_default_config")


def unpack(wheel: Path, out: Path) -> list[Path]:
    """Extract LIBRARIES and SOURCES from the wheel into out (flat), strip the libraries; the paths written."""
    written = []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        missing = [m for m in LIBRARIES + SOURCES if m not in names]
        if missing:  # checked before anything is written
            raise ValueError(f"{wheel}: no member {missing[0]} (is this the vLLM {VERSION} wheel?)")
        out.mkdir(parents=True, exist_ok=True)
        for member in LIBRARIES + SOURCES:
            dest = out / Path(member).name
            with z.open(member) as src, dest.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            if dest.suffix == ".so" and shutil.which("strip"):
                subprocess.run(["strip", "--strip-unneeded", str(dest)], check=True)
            written.append(dest)
        for member in sorted(n for n in names if n.startswith(MOE_CONFIGS) and "device_name=NVIDIA_H200" in n):
            dest = out / "configs" / Path(member).name
            dest.parent.mkdir(exist_ok=True)
            dest.write_bytes(z.read(member))
            written.append(dest)
    (out / "VERSION").write_text(f"vllm=={VERSION} from {wheel.name}\n")
    return written


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _helper_modules(torch) -> None:
    """The four `vllm` modules fused_recurrent.py imports from, as small stand-ins (module docstring)."""
    import triton
    import triton.language as tl

    class Platform:
        @staticmethod
        def is_arch_support_pdl() -> bool:
            return torch.cuda.get_device_capability()[0] >= 9

    for name in ("vllm", "vllm.third_party", "vllm.third_party.flash_linear_attention",
                 "vllm.third_party.flash_linear_attention.ops", "vllm.utils"):
        sys.modules.setdefault(name, types.ModuleType(name))
    _module("vllm.platforms", current_platform=Platform())
    _module("vllm.triton_utils", tl=tl, triton=triton)
    _module("vllm.third_party.flash_linear_attention.ops.op", exp=tl.exp, log=tl.log)
    _module("vllm.utils.math_utils", cdiv=lambda a, b: -(a // -b),
            next_power_of_2=lambda n: 1 << (n - 1).bit_length() if n > 0 else 1)


def _source(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


FUSED_MOE_HEADER = """# generated at measurement time from vLLM's fused_moe.py: its Triton kernel and default tile
# rules only
import triton
import triton.language as tl
from types import SimpleNamespace

envs = SimpleNamespace(VLLM_BATCH_INVARIANT=False)
current_platform = SimpleNamespace(is_rocm=lambda: False)


def next_power_of_2(n):
    return 1 << (n - 1).bit_length() if n > 0 else 1


def should_moe_wna16_use_cuda(*args):
    return False


"""


def cut(path: Path, functions: tuple[str, ...], header: str, name: str) -> types.ModuleType:
    """The named top-level functions of a Python source (with their decorators) cut into a module file of
    their own after `header` (stand-ins for the few names they use), and imported (Triton reads the source)."""
    import ast
    import tempfile
    source = path.read_text()
    lines = source.splitlines()
    parts = [header]
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            parts.append("\n".join(lines[start - 1:node.end_lineno]) + "\n\n\n")
    if len(parts) != 1 + len(functions):
        raise RuntimeError(f"{path}: not all of {functions} found")
    out = Path(tempfile.mkdtemp(prefix="vllm_cut_")) / f"{name}.py"
    out.write_text("".join(parts))
    return _source(out, name)


def _fused_moe_module(folder: Path) -> types.ModuleType:
    """FUSED_MOE_FUNCTIONS cut out of fused_moe.py beside FUSED_MOE_HEADER's stand-ins."""
    return cut(folder / "fused_moe.py", FUSED_MOE_FUNCTIONS, FUSED_MOE_HEADER, "vllm_fused_moe_kernel")


def load(folder: Path, torch) -> "Wheel | None":
    """Wheel(folder), or None after one sentence on stderr saying why the kernels cannot load."""
    try:
        return Wheel(folder, torch)
    except (FileNotFoundError, OSError, RuntimeError) as exc:
        print(f"--wheel-dir {folder}: cannot load vLLM's kernels ({exc}).", file=sys.stderr)
        return None


class Wheel:
    """The loaded kernels: `ops` per extension (torch.ops namespaces), `kda` (the K3 Triton recurrent KDA
    module), `float4_e2m1f` (the scalar-type id Marlin takes for MXFP4 weights), `version`."""

    def __init__(self, folder: Path, torch) -> None:
        folder = Path(folder)
        missing = [n for n in map(lambda m: Path(m).name, LIBRARIES + SOURCES) if not (folder / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder}: missing {', '.join(missing)} (run vllm_wheel.py --wheel ... --out)")
        for lib in LIBRARIES:
            torch.ops.load_library(str(folder / Path(lib).name))
        self.moe = torch.ops._moe_C
        self.flashmla = torch.ops._flashmla_C
        self.flashmla_ext = torch.ops._flashmla_extension_C
        _helper_modules(torch)
        self.kda = _source(folder / "fused_recurrent.py", "vllm_k3_fused_recurrent")
        self.float4_e2m1f = _source(folder / "scalar_type.py", "vllm_scalar_type").scalar_types.float4_e2m1f.id
        self.fused_moe = _fused_moe_module(folder)
        self.moe_configs = folder / "configs"
        self.version = f"vllm=={VERSION}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not zipfile.is_zipfile(args.wheel):
        print(f"--wheel {args.wheel}: not a wheel (no such file, or not a zip archive).", file=sys.stderr)
        return 2
    try:
        written = unpack(args.wheel, args.out)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"unpacked {len(written)} members into {args.out}: "
          f"{sum(p.stat().st_size for p in written) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
