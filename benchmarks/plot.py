"""The benchmark's pictures, drawn with matplotlib (the ``bench`` extra, which
``scripts/bench.sh`` installs): every one with a title, axes labelled with their
units, and a legend.

- ``docs/pass_cost.png``: the reconciliation pass's time against the settled history;
- ``docs/stripes.png``: one hot organization's request rate against its number of
  period stripes, with the spread cycle and ``pgbench simple-update`` as references.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

Series = tuple[str, Sequence[float], Sequence[float]]  # label, x, y


def _finish(fig, ax, path: Path, note: str) -> None:
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def pass_cost(path: Path, series: Sequence[Series], *, orgs: int, note: str = "") -> None:
    """Pass time (s) against settled history (millions of requests)."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    markers = ["o", "s", "^", "D"]
    for k, (label, xs, ys) in enumerate(series):
        ax.plot([x / 1e6 for x in xs], ys, marker=markers[k % len(markers)], label=label)
    ax.set_title(f"Reconciliation pass time vs settled history ({orgs:,} organizations)")
    ax.set_xlabel("settled requests in history (millions)")
    ax.set_ylabel("time per pass (s)")
    ax.set_xlim(left=0)
    _finish(fig, ax, path, note)


def stripes(path: Path, counts: Sequence[int], rates: Sequence[float], *, spread: float,
            simple_update: float, clients: int, note: str = "") -> None:  # fmt: skip
    """Requests/s of one hot organization against its stripe count, with reference lines."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot(counts, rates, marker="o", label=f"one organization, {clients} clients")
    ax.axhline(spread, color="tab:green", linestyle="--", label="request cycle over 100 organizations (mean of two runs)")
    ax.axhline(simple_update, color="tab:gray", linestyle=":", label="pgbench simple-update (transactions/s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(counts), [str(c) for c in counts])
    ax.set_title("One hot organization: request rate vs period stripes")
    ax.set_xlabel("period stripes (llm.set_period_stripes)")
    ax.set_ylabel("requests per second (admit + settle)")
    _finish(fig, ax, path, note)
