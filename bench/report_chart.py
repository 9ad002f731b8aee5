"""The results chart (`<stem>.png`): drain rates per shape and the engine's scale curve.

Split out of `bench/report.py`, which writes it; matplotlib is optional (no chart without).
Redraw a chart from saved results, without running the benchmark again:

    python -m bench.report_chart bench/results/latest.json    # -> bench/results/latest.png
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from bench.report import COLUMNS


def _bars(axes: Any, shapes: dict[str, Any]) -> None:
    """Grouped bars, one group per shape and one bar per contender that ran (log scale)."""
    from matplotlib.patches import Patch

    names = [
        (key, title)
        for key, title in COLUMNS
        if any(key in shape["contenders"] for shape in shapes.values())
    ]
    width = 0.8 / max(len(names), 1)
    handles: list[Any] = []
    for offset, (key, title) in enumerate(names):
        xs, ys, capped = [], [], []
        for index, shape in enumerate(shapes.values()):
            result = shape["contenders"].get(key)
            if result and result["per_s"] > 0:
                xs.append(index + offset * width - 0.4 + width / 2)
                ys.append(result["per_s"])
                capped.append(not result["complete"])
        drawn = axes.bar(xs, ys, width, label=title)
        for rect, stopped in zip(drawn, capped, strict=True):
            if stopped:
                rect.set_hatch("//")
        if len(drawn):
            handles.append(Patch(facecolor=drawn[0].get_facecolor(), label=title))
    axes.set_yscale("log")
    axes.set_xticks(range(len(shapes)))
    # Shape titles are long: wrapped, so that neighbouring groups' labels never overlap.
    axes.set_xticklabels(
        [
            textwrap.fill(s["shape"]["title"], 24) + f"\n{s['shape']['rows']:,} rows"
            for s in shapes.values()
        ],
        fontsize=8,
    )
    axes.set_ylabel("rows retired per second (log)")
    axes.set_title("Drain rate, same rows and batch size (hatched: stopped at budget)")
    # Under the figure (see `chart`), not inside the axes, where it covered the last
    # group's bars.
    axes.figure.legend(
        handles=handles, fontsize=8, loc="lower center", ncol=min(len(handles), 5) or 1
    )
    axes.grid(axis="y", which="both", alpha=0.3)


def _curve(axes: Any, scale: dict[str, Any] | None) -> None:
    """The engine's drain rate against the backlog, or an empty panel without a scale run."""
    if not scale:
        axes.axis("off")
        return
    rows = [step["backlog_rows"] for step in scale["steps"]]
    rates = [step["per_s"] for step in scale["steps"]]
    axes.plot(rows, rates, marker="o")
    axes.set_xscale("log")
    axes.set_ylim(bottom=0)
    axes.set_xlabel("backlog rows (log)")
    axes.set_ylabel("rows per second")
    axes.set_title(f"Engine drain rate vs backlog ({scale['ratio'] or 0:.2f}x at largest)")
    axes.grid(alpha=0.3)


def chart(data: dict[str, Any], path: Path) -> bool:
    """Grouped bars of drain rates per shape (log scale) and the scale curve."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (bars, curve) = plt.subplots(1, 2, figsize=(13, 6), gridspec_kw={"width_ratios": [2.2, 1]})
    _bars(bars, data.get("shapes", {}))
    _curve(curve, data.get("scale"))
    fig.suptitle(
        f"django-outboxes benchmark ({data['mode']}, {data['timestamp']}, "
        f"backend {data['versions']['outbox_backend']})",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))  # the bottom tenth holds the legend
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/latest.json")
    if not chart(json.loads(results.read_text()), results.with_suffix(".png")):
        sys.exit("matplotlib is not installed")
    print(results.with_suffix(".png"))
