"""FlashAttention 3 as vLLM 0.33.0 ships it (vllm/vllm_flash_attn/_vllm_fa3_C), carried to the GPU machine and called
as the FLASH_ATTN backend calls it for a paged decode (gqa_rows.py's kernel rows, gptoss_replay.py --fa3).

The library (172 MB) travels xz-compressed (about 11 MB) and is unpacked into a temporary folder there; it calls only
torch's stable C shims (aoti_torch_*), so it loads on another torch than the one vLLM pins. Never committed.
"""

from __future__ import annotations

import lzma
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

FA3_MEMBER = "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
FA3_XZ = "_vllm_fa3_C.abi3.so.xz"
FA3_SPLITS = 32  # vLLM's flash_attn_max_num_splits_for_cuda_graph (config/attention.py)


def unpack_fa3(wheel: Path, out: Path) -> Path:
    """The FA3 library from the vLLM wheel, xz-compressed into out (what a GPU call carries)."""
    with zipfile.ZipFile(wheel) as z:
        if FA3_MEMBER not in z.namelist():
            raise ValueError(f"{wheel}: no member {FA3_MEMBER} (is this the vLLM 0.33.0 wheel?)")
        out.mkdir(parents=True, exist_ok=True)
        dest = out / FA3_XZ
        with z.open(FA3_MEMBER) as src, lzma.open(dest, "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst)
    return dest


def load_fa3(folder: Path, torch) -> Any:
    """torch.ops._vllm_fa3_C after unpacking the carried library into a temporary folder."""
    lib = Path(tempfile.mkdtemp()) / FA3_XZ.removesuffix(".xz")
    with lzma.open(folder / FA3_XZ) as src, lib.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    torch.ops.load_library(str(lib))
    return torch.ops._vllm_fa3_C


def fa3_call(fa3, x: dict, g: dict, table):
    left = g["window"] - 1 if g["window"] else -1
    return lambda: fa3.fwd(x["q"], x["kc"], x["vc"], None, None, None, x["out"], x["cu"], None, None, None, x["lens"],
                           1, x["n"], table, None, None, None, None, None, None, None, None, g["scale"], True, left,
                           0 if g["window"] else -1, 0.0, True, None, FA3_SPLITS, None, 0, x["sinks"], 1, 0, None)
