"""A grouped bar chart as inline SVG: drawn on the server, no script, no CDN."""

from __future__ import annotations

from html import escape

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def grouped_bars(groups: list[str], series: list[tuple[str, list[float | None]]], title: str,
                 ylabel: str) -> str:
    """One group per name in `groups`, one bar per (legend, values) in `series` (a value per group;
    None draws nothing). The y axis runs from 0 to the largest value (at least 1 for rates)."""
    group_px = max(70, 28 * len(series) + 24)
    width, height, left, top, bottom = max(480, group_px * len(groups) + 90), 330, 56, 34, 110
    plot_w, plot_h = width - left - 20, height - top - bottom
    peak = max([v for _, vals in series for v in vals if v is not None] or [1.0])
    ymax = 1.0 if peak <= 1.0 else _nice(peak)
    group_w = plot_w / max(1, len(groups))
    bar_w = group_w * 0.8 / max(1, len(series))
    full_height = height + 22 * len(series) + 16
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' class='chart' width='{width}' height='{full_height}' "
             f"viewBox='0 0 {width} {full_height}' "
             f"role='img' aria-label='{escape(title)}'>",
             f"<text x='{left}' y='18' class='chart-title'>{escape(title)}</text>"]
    for i in range(5):
        value = ymax * i / 4
        y = top + plot_h - plot_h * i / 4
        parts.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' stroke='#e3e3e8'/>")
        parts.append(f"<text x='{left - 6}' y='{y + 4:.1f}' text-anchor='end' class='tick'>{value:.3g}</text>")
    parts.append(f"<text x='14' y='{top + plot_h / 2:.0f}' transform='rotate(-90 14 {top + plot_h / 2:.0f})' "
                 f"text-anchor='middle' class='tick'>{escape(ylabel)}</text>")
    for g, name in enumerate(groups):
        x0 = left + g * group_w + group_w * 0.1
        for s, (legend, values) in enumerate(series):
            value = values[g] if g < len(values) else None
            if value is None:
                continue
            h = plot_h * max(0.0, value) / ymax
            x = x0 + s * bar_w
            parts.append(f"<rect x='{x:.1f}' y='{top + plot_h - h:.1f}' width='{bar_w * 0.92:.1f}' height='{h:.1f}' "
                         f"fill='{PALETTE[s % len(PALETTE)]}'><title>{escape(legend)} · {escape(name)}: "
                         f"{value:.4g}</title></rect>")
            if bar_w >= 18:
                parts.append(f"<text x='{x + bar_w * 0.46:.1f}' y='{top + plot_h - h - 3:.1f}' text-anchor='middle' "
                             f"class='value'>{value:.3g}</text>")
        cx = left + g * group_w + group_w / 2
        ly = top + plot_h + 14
        parts.append(f"<text x='{cx:.1f}' y='{ly}' text-anchor='end' transform='rotate(-30 {cx:.1f} {ly})' "
                     f"class='tick'>{escape(_short(name))}</text>")
    for s, (legend, _) in enumerate(series):
        y = height + 22 * s + 8
        parts.append(f"<rect x='{left}' y='{y - 10}' width='12' height='12' fill='{PALETTE[s % len(PALETTE)]}'/>")
        parts.append(f"<text x='{left + 18}' y='{y}' class='legend'>{escape(legend)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _nice(value: float) -> float:
    from math import ceil, floor, log10

    step = 10 ** floor(log10(value))
    return ceil(value / step) * step


def _short(text: str, n: int = 28) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
