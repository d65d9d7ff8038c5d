"""docs/pass_cost.png: reconciliation pass time against settled history size.

matplotlib draws it when it is importable (the optional ``bench`` extra);
otherwise a small built-in writer draws the same points and lines, with
numeric tick labels, as a PNG using only the standard library.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

Series = tuple[str, Sequence[float], Sequence[float]]  # label, x (requests), y (seconds)

TITLE = "Reconciliation pass time vs settled history"
XLABEL = "settled requests in history"
YLABEL = "seconds per pass"


def draw(path: Path, series: Sequence[Series], *, orgs: int, note: str = "") -> str:
    """Write the PNG; returns which renderer drew it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _draw_builtin(path, series)
        return "builtin"
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    markers = ["o", "s", "^", "D"]
    for k, (label, xs, ys) in enumerate(series):
        ax.plot([x / 1e6 for x in xs], ys, marker=markers[k % len(markers)], label=label)
    ax.set_title(f"{TITLE} ({orgs:,} organizations)")
    ax.set_xlabel(XLABEL + " (millions)")
    ax.set_ylabel(YLABEL)
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return "matplotlib"


# ---------------------------------------------------------------- built-in PNG

_FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "M": (5, 7, 7, 5, 5),
    "s": (0, 7, 4, 1, 7), "k": (4, 5, 6, 6, 5),
}  # fmt: skip
_COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]


def _draw_builtin(path: Path, series: Sequence[Series]) -> None:
    width, height, left, right, top, bottom = 700, 420, 70, 20, 20, 50
    pixels = bytearray(b"\xff" * (width * height * 3))

    def put(x: int, y: int, colour: tuple[int, int, int]) -> None:
        if 0 <= x < width and 0 <= y < height:
            i = (y * width + x) * 3
            pixels[i : i + 3] = bytes(colour)

    def line(x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for s in range(steps + 1):
            put(round(x0 + (x1 - x0) * s / steps), round(y0 + (y1 - y0) * s / steps), colour)

    def text(x: int, y: int, s: str, scale: int = 2) -> None:
        for ch in s:
            for row, bits in enumerate(_FONT.get(ch, (0,) * 5)):
                for col in range(3):
                    if bits & (4 >> col):
                        for dx in range(scale):
                            for dy in range(scale):
                                put(x + col * scale + dx, y + row * scale + dy, (0, 0, 0))
            x += 4 * scale

    xs_all = [x for _, xs, _ in series for x in xs] or [1.0]
    ys_all = [y for _, _, ys in series for y in ys] or [1.0]
    x_max, y_max = max(xs_all) * 1.05 or 1.0, max(ys_all) * 1.15 or 1.0
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float, y: float) -> tuple[int, int]:
        return left + round(x / x_max * plot_w), top + plot_h - round(y / y_max * plot_h)

    grey, black = (220, 220, 220), (0, 0, 0)
    for k in range(6):
        gy = y_max * k / 5
        _, yy = px(0, gy)
        line(left, yy, width - right, yy, grey)
        text(5, yy - 5, f"{gy:.2f}s" if y_max < 2 else f"{gy:.1f}s")
        gx = x_max * k / 5
        xx, _ = px(gx, 0)
        line(xx, top, xx, top + plot_h, grey)
        text(xx - 12, top + plot_h + 10, f"{gx / 1e6:.2f}M" if x_max < 2e6 else f"{gx / 1e6:.1f}M")
    line(left, top, left, top + plot_h, black)
    line(left, top + plot_h, width - right, top + plot_h, black)
    for k, (_, xs, ys) in enumerate(series):
        colour = _COLOURS[k % len(_COLOURS)]
        points = [px(x, y) for x, y in zip(xs, ys, strict=True)]
        for (a, b), (c, d) in zip(points, points[1:], strict=False):
            line(a, b, c, d, colour)
        for a, b in points:
            for dx in range(-3, 4):
                for dy in range(-3, 4):
                    put(a + dx, b + dy, colour)
    raw = b"".join(b"\x00" + bytes(pixels[y * width * 3 : (y + 1) * width * 3]) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    path.write_bytes(png)
