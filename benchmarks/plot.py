"""Wait-time distributions drawn to a PNG (``tenure bench ... --plot FILE.png``).

Two panels share the libraries' colours: the cumulative distribution of
waits on a logarithmic time axis (where the median and the bulk are), and
the share of waits longer than t on log-log axes (where the worst waits
are, which a histogram hides). matplotlib comes with the ``bench`` extra
and is imported only here, with the non-interactive Agg backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks import require_peer

__all__ = ["plot_waits"]


def plot_waits(
    path: Path,
    *,
    title: str,
    subtitle: str,
    series: Mapping[str, Sequence[float]],
    unit: str = "ms",
) -> None:
    """Draw one curve per library from its waits (in ``unit``) and save ``path``."""
    matplotlib = require_peer("matplotlib", "matplotlib")
    matplotlib.use("Agg")
    pyplot = require_peer("matplotlib.pyplot", "matplotlib")
    figure, (cdf, tail) = pyplot.subplots(1, 2, figsize=(13, 5.2), constrained_layout=True)
    floor = 1e-3  # a wait of 0 cannot sit on a log axis: show it at 1 µs
    for label, values in series.items():
        ordered = sorted(max(value, floor) for value in values)
        if not ordered:
            continue
        count = len(ordered)
        below = [(index + 1) / count for index in range(count)]
        above = [1 - fraction + 1 / count for fraction in below]  # >= t, never 0 on a log axis
        median = ordered[count // 2]
        name = f"{label} (n={count:,}, p50 {median:.2f}, max {ordered[-1]:.1f} {unit})"
        (line,) = cdf.plot(ordered, below, drawstyle="steps-post", linewidth=1.6, label=name)
        tail.plot(ordered, above, drawstyle="steps-post", linewidth=1.6, color=line.get_color())
    cdf.set_xscale("log")
    cdf.set_xlabel(f"wait ({unit}, log scale)")
    cdf.set_ylabel("share of acquisitions that waited at most this long")
    cdf.set_ylim(0, 1.01)
    cdf.grid(True, which="both", alpha=0.3)
    tail.set_xscale("log")
    tail.set_yscale("log")
    tail.set_xlabel(f"wait ({unit}, log scale)")
    tail.set_ylabel("share of acquisitions that waited at least this long")
    tail.grid(True, which="both", alpha=0.3)
    figure.suptitle(f"{title}\n{subtitle}", fontsize=11)
    figure.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
