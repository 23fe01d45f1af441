"""Plot plumbing: figures on the Agg canvas, atomic multi-format saving, and label placement.

Separated from plots.py so that file reads as the pictures themselves. Labels go inside a bar where
they fit, else beside it with a leader line, measured with the renderer once the layout is frozen;
a label that would overlap an earlier one is dropped (longest kernels are placed first).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure

BarLabel = tuple[str, float, float, int, str]  # text, left, width, row, bar colour
BAR_HEIGHT = 0.62  # bar thickness, in row units
GREY = "#555555"
DPI = 150
FORMATS = ("png", "svg")
STYLE: Mapping[str, Any] = MappingProxyType({
    "figure.dpi": DPI, "savefig.dpi": DPI, "font.family": ("DejaVu Sans", "sans-serif"), "font.size": 9,
    "axes.titlesize": 9.5, "axes.titlelocation": "left", "axes.labelsize": 9, "xtick.labelsize": 8,
    "ytick.labelsize": 8.5, "legend.fontsize": 8, "legend.frameon": False, "figure.titlesize": 11,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.color": "#DDDDDD",
    "grid.linewidth": 0.6, "axes.axisbelow": True, "hatch.linewidth": 0.7, "svg.fonttype": "none",
    "svg.hashsalt": "moe-sim"})
METADATA: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {"png": MappingProxyType({}), "svg": MappingProxyType({"Date": None})})



# ============================================================================ labels


def _label_bars(ax: Axes, renderer: RendererBase, bars: Sequence[BarLabel]) -> None:
    """Name each bar inside it if the name fits upright; else in a lane beside its row (above row 0, below
    the others) with a leader; else vertically inside. Longest bars first; names never overlap."""
    placed: list[Any] = []
    to_points = abs(ax.transData.transform((0, 1))[1] - ax.transData.transform((0, 0))[1]) * 72 / ax.figure.dpi
    for text, left, width, row, face in sorted(bars, key=lambda b: -b[2]):
        if _label_in_bar(ax, renderer, left, width, row, text, face):
            continue
        up = 1 if row == 0 else -1  # rows grow downwards on screen
        edge = row - up * BAR_HEIGHT / 2
        shift = len(text) * 6.5 * 0.6  # ~ the name's width in points
        offsets = [(s * shift, up * lane * to_points) for s in (0, 0.6, -0.6, 1.2, -1.2) for lane in (0.16, 0.36)]
        if not _place_label(ax, renderer, (left + width / 2, edge), offsets, text, placed, GREY, center=True):
            _label_in_bar(ax, renderer, left, width, row, text, face, upright=False)


def _label_in_bar(ax: Axes, renderer: RendererBase, left: float, width: float, row: int, text: str, face: str,
                  upright: bool = True) -> bool:
    """Put `text` inside the bar if it fits: on one line or two (upright), or vertically; else leave it bare."""
    (x0, y0), (x1, y1) = ax.transData.transform([(left, row - BAR_HEIGHT / 2), (left + width, row + BAR_HEIGHT / 2)])
    room_w, room_h = abs(x1 - x0) - 6, abs(y1 - y0) - 4
    tries = [(text, 0, 7.5), (text, 0, 6.5), (_two_lines(text), 0, 7), (_two_lines(text), 0, 6)] if upright \
        else [(text, 90, 6.5)]
    for candidate, rotation, size in tries:
        label = ax.text(left + width / 2, row, candidate, ha="center", va="center", rotation=rotation, fontsize=size,
                        color=_ink_on(face), linespacing=1.0, clip_on=True,
                        bbox={"facecolor": face, "edgecolor": "none", "pad": 0.3})  # masks the hatching
        box = label.get_window_extent(renderer)
        if box.width <= room_w and box.height <= room_h:
            return True
        label.remove()
    return False


def _place_label(ax: Axes, renderer: RendererBase, anchor: tuple[float, float], offsets: Sequence[tuple[float, float]],
                 text: str, placed: list[Any], color: str, center: bool = False) -> bool:
    """Annotate `anchor` (data) at the first offset (points) where the text and its leader hit nothing in
    `placed` and stay inside the axes; add both to `placed`. Offsets beyond 7 points get a leader."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox
    origin, inside, px = ax.transData.transform(anchor), ax.get_window_extent(renderer), ax.figure.dpi / 72
    for dx, dy in offsets:
        leader = math.hypot(dx, dy) > 7.5
        label = ax.annotate(text, anchor, xytext=(dx, dy), textcoords="offset points", fontsize=6.5 if center else 7,
                            color=color, ha="center" if center else ("left" if dx >= 0 else "right"), va="center",
                            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.4, "alpha": 0.85},
                            arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.5, "alpha": 0.7,
                                        "shrinkA": 0, "shrinkB": 2} if leader else None)
        label.update_positions(renderer)
        box = Text.get_window_extent(label, renderer).padded(2)  # the text alone, not its leader
        dots = _segment_dots(origin, origin + (dx * px, dy * px), skip_px=6) if leader else []
        if inside.x0 <= box.x0 and box.x1 <= inside.x1 and not any(
                box.overlaps(o) or any(o.contains(*d) for d in dots) for o in placed):
            placed += [box] + [Bbox.from_bounds(d[0] - 1, d[1] - 1, 2, 2) for d in dots]
            return True
        label.remove()
    return False


def _segment_dots(start: Any, end: Any, skip_px: float = 0.0) -> list[Any]:
    """Points every 2 px along a display-space segment, leaving out the first skip_px (the marker)."""
    length = math.dist(start, end)
    n = max(2, int(length / 2))
    return [start + (end - start) * i / n for i in range(n + 1) if length * i / n >= skip_px]


def _two_lines(text: str) -> str:
    """Split a snake_case key at the underscore nearest its middle, never leaving a stub such as "o"."""
    cuts = [i for i, c in enumerate(text) if c == "_" and 3 <= i <= len(text) - 4]
    cut = min(cuts, key=lambda i: abs(i - len(text) / 2), default=None)
    return text if cut is None else f"{text[:cut]}\n{text[cut + 1:]}"


def _ink_on(face: str) -> str:
    """Black or white text, whichever reads better on `face` (relative luminance, WCAG weights)."""
    from matplotlib.colors import to_rgb
    r, g, b = to_rgb(face)
    return "#111111" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


# ============================================================================ figures and files


def _render(draw: Callable[[], Figure], out_dir: Path, stem: str) -> list[Path]:
    import matplotlib
    if not stem or os.sep in stem or (os.altsep and os.altsep in stem):
        raise ValueError(f"stem must be a bare file name without extension, got {stem!r}")
    with matplotlib.rc_context(dict(STYLE)):
        return _save(draw(), Path(out_dir), stem)


def _save(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """Write every format beside its target, then put them all in place; on failure or Ctrl-C remove them."""
    from contextlib import ExitStack

    from simulator.report.files import replacing
    targets = [out_dir / f"{stem}.{fmt}" for fmt in FORMATS]
    with ExitStack() as stack:
        for fmt, target in zip(FORMATS, targets):
            fig.savefig(stack.enter_context(replacing(target)), format=fmt, metadata=dict(METADATA[fmt]))
    return targets


def _figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas with constrained layout; no pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _freeze_layout(fig: Figure) -> RendererBase:
    """Run the layout once and keep it, so labels placed afterwards can be measured against their bars."""
    fig.canvas.draw()
    fig.set_layout_engine("none")
    return fig.canvas.get_renderer()


