"""Small inline-SVG charts for the artifact store's index pages.

An index page must show its figures when it is opened on its own (downloaded out of S3, mailed, opened
from a cache): an `<svg>` element inside the HTML needs no other file, no script and no matplotlib. Two
shapes cover the pages: lines (training curves, pass@k) and means with intervals (a sweep's pivot).
"""

from __future__ import annotations

import html
import math

W, H = 520, 260
PAD_L, PAD_R, PAD_T, PAD_B = 52, 14, 26, 38
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _frame(title: str, xlabel: str, ylabel: str, y_lo: float, y_hi: float, yv) -> list[str]:
    """The SVG head, title, axis labels, y grid lines."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'role="img" aria-label="{html.escape(title)}" style="font:11px sans-serif">',
           f"<title>{html.escape(title)}</title>",
           f'<text x="{W / 2}" y="16" text-anchor="middle" style="font-weight:bold">{html.escape(title)}</text>',
           f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle">{html.escape(xlabel)}</text>',
           f'<text x="12" y="{H / 2}" text-anchor="middle" transform="rotate(-90 12 {H / 2})">{html.escape(ylabel)}</text>']
    for t in _ticks(y_lo, y_hi):
        y = yv(t)
        out.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    return out


def _range(values: list[float], lo: float | None, hi: float | None) -> tuple[float, float]:
    a = min(values) if lo is None else lo
    b = max(values) if hi is None else hi
    if b <= a:
        a, b = a - 0.5, b + 0.5
    return a, b


def line_chart(series: dict[str, list[tuple[float, float]]], *, title: str, xlabel: str, ylabel: str,
               log2_x: bool = False, y_range: tuple[float | None, float | None] = (None, None)) -> str:
    """One polyline per series (points sorted by x), with a legend; '' when there is nothing to draw."""
    series = {k: sorted((x, y) for x, y in pts if y is not None and not math.isnan(y)) for k, pts in series.items()}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return ""
    tx = (lambda x: math.log2(x)) if log2_x else (lambda x: x)
    xs = [tx(x) for pts in series.values() for x, _ in pts]
    x_lo, x_hi = _range(xs, None, None)
    y_lo, y_hi = _range([y for pts in series.values() for _, y in pts], *y_range)
    xv = lambda x: PAD_L + (tx(x) - x_lo) / (x_hi - x_lo) * (W - PAD_L - PAD_R)  # noqa: E731
    yv = lambda y: H - PAD_B - (y - y_lo) / (y_hi - y_lo) * (H - PAD_T - PAD_B)  # noqa: E731
    out = _frame(title, xlabel, ylabel, y_lo, y_hi, yv)
    ticks = range(math.ceil(x_lo), math.floor(x_hi) + 1) if log2_x else _ticks(x_lo, x_hi, 6)
    if all(float(x).is_integer() for x in xs):  # steps, k: no tick between two whole numbers
        ticks = [t for t in ticks if float(t).is_integer()]
    for t in ticks:  # in the drawn (log2 or plain) space
        x = PAD_L + (t - x_lo) / (x_hi - x_lo) * (W - PAD_L - PAD_R)
        out.append(f'<text x="{x:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{_fmt(2 ** t if log2_x else t)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        c = COLOURS[i % len(COLOURS)]
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.6" points="'
                   + " ".join(f"{xv(x):.1f},{yv(y):.1f}" for x, y in pts) + '"/>')
        if len(pts) <= 20:
            out += [f'<circle cx="{xv(x):.1f}" cy="{yv(y):.1f}" r="2.5" fill="{c}"/>' for x, y in pts]
        out.append(f'<text x="{W - PAD_R - 4}" y="{PAD_T + 12 + 13 * i}" text-anchor="end" fill="{c}">'
                   f"{html.escape(name)}</text>")
    return "\n".join(out + ["</svg>"])


def fitted_range(values: list[float], margin: float = 0.12) -> tuple[float, float]:
    """The axis range of a set of values: their min to max, widened by `margin` of the span on each side (a
    fixed 0–1 axis flattens cells that differ by a few points). A single value gets ±`margin` of itself."""
    lo, hi = min(values), max(values)
    pad = (hi - lo) * margin if hi > lo else max(abs(hi) * margin, 0.01)
    return lo - pad, hi + pad


def interval_chart(rows: list[tuple[str, float, float | None, float | None]], *, title: str, ylabel: str,
                   decimals: int = 3) -> str:
    """One point per row (label, mean, low, high) with its interval as an error bar; the y axis spans the
    points and intervals (`fitted_range`); each point is labelled with its mean to `decimals`. '' when empty."""
    rows = [r for r in rows if r[1] is not None]
    if not rows:
        return ""
    y_lo, y_hi = fitted_range([v for _, m, lo, hi in rows for v in (m, lo, hi) if v is not None])
    step = (W - PAD_L - PAD_R) / len(rows)
    yv = lambda y: H - PAD_B - (y - y_lo) / (y_hi - y_lo) * (H - PAD_T - PAD_B)  # noqa: E731
    out = _frame(title, "", ylabel, y_lo, y_hi, yv)  # the cells' labels take the x-axis label's room
    for i, (label, mean, lo, hi) in enumerate(rows):
        x = PAD_L + step * (i + 0.5)
        ci = ""
        if lo is not None and hi is not None:
            ci = f" [{lo:.{decimals}f}, {hi:.{decimals}f}]"
            out += [f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{yv(lo):.1f}" y2="{yv(hi):.1f}" stroke="#555" '
                    f'stroke-width="2"/>'] + [f'<line x1="{x - 6:.1f}" x2="{x + 6:.1f}" y1="{yv(v):.1f}" '
                                              f'y2="{yv(v):.1f}" stroke="#555" stroke-width="2"/>' for v in (lo, hi)]
        out.append(f'<circle cx="{x:.1f}" cy="{yv(mean):.1f}" r="4" fill="{COLOURS[0]}"><title>'
                   f"{html.escape(label)}: {mean:.{decimals}f}{ci}</title></circle>"
                   f'<text x="{x + 8:.1f}" y="{yv(mean) + 4:.1f}">{mean:.{decimals}f}</text>'
                   + _cell_label(label, x, step))
    return "\n".join(out + ["</svg>"])


def _cell_label(label: str, x: float, width: float) -> str:
    """A cell's label under its point: one line per `key=value` (at most 3), cut to the cell's width, so
    neighbouring labels never overlap."""
    chars = max(4, int(width / 6.2))  # ~6 px per character at 11 px sans-serif
    parts = [p if len(p) <= chars else p[: chars - 1] + "…" for p in label.split()][:3]
    lines = "".join(f'<tspan x="{x:.1f}" dy="{0 if i == 0 else 11}">{html.escape(p)}</tspan>'
                    for i, p in enumerate(parts))
    return f'<text x="{x:.1f}" y="{H - PAD_B + 13}" text-anchor="middle">{lines}</text>'
