#!/usr/bin/env python3
"""Draws bench/pipeline's (or bench/pipeline_cuda's) JSON lines as one SVG: speedup (top row) and
stall_reduction (bottom row) against each swept variable (the base point belongs to every sweep).
Only the measured runs' lines are drawn: pipeline_cuda's calibration, emulated twins and
agreement lines are left out. No dependencies.

    python3 bench/plot_pipeline.py results.jsonl out.svg
"""
import json
import sys

SWEEPS = [
    ("topk_ratio", "topk_ratio", "topk_ratio"),
    ("update_interval", "update_interval", "update_interval (steps)"),
    ("compute", "compute_over_host_update", "compute / ZeRO-Offload host update"),
    ("link", "link_gbps", "link GB/s per direction"),
]
ROWS = [("speedup", "speedup vs ZeRO-Offload", 2.0), ("stall_reduction", "stall reduction", 0.85)]
W, H, PAD_L, PAD_B, PAD_T = 250, 190, 52, 42, 22


def series(lines, sweep, key):
    pts = [d for d in lines if d["sweep"] in (sweep, "base")]
    return sorted((d[key], d) for d in pts)


def panel(x0, y0, pts, ykey, xlabel, ylabel, goal):
    out = []
    xs = [p[0] for p in pts]
    ys = [p[1][ykey] for p in pts]
    lo = min(ys + [goal, 0.0])
    hi = max(ys + [goal]) * 1.1 or 1.0
    iw, ih = W - PAD_L - 10, H - PAD_B - PAD_T
    def px(i):
        return x0 + PAD_L + (iw * i / (len(xs) - 1) if len(xs) > 1 else iw / 2)
    def py(v):
        return y0 + PAD_T + ih * (1 - (v - lo) / (hi - lo))
    out.append(f'<rect x="{x0 + PAD_L}" y="{y0 + PAD_T}" width="{iw}" height="{ih}" fill="none" stroke="#888"/>')
    gy = py(goal)
    out.append(f'<line x1="{x0 + PAD_L}" x2="{x0 + PAD_L + iw}" y1="{gy:.1f}" y2="{gy:.1f}" stroke="#c33" stroke-dasharray="4,3"/>')
    out.append(f'<text x="{x0 + PAD_L + iw - 2}" y="{gy - 3:.1f}" font-size="9" fill="#c33" text-anchor="end">goal {goal:g}</text>')
    for v in (lo, (lo + hi) / 2, hi):
        out.append(f'<text x="{x0 + PAD_L - 4}" y="{py(v) + 3:.1f}" font-size="9" text-anchor="end">{v:.2f}</text>')
    path = " ".join(f"{'M' if i == 0 else 'L'}{px(i):.1f},{py(y):.1f}" for i, y in enumerate(ys))
    out.append(f'<path d="{path}" fill="none" stroke="#2563eb" stroke-width="1.5"/>')
    for i, (x, y) in enumerate(zip(xs, ys)):
        out.append(f'<circle cx="{px(i):.1f}" cy="{py(y):.1f}" r="2.5" fill="#2563eb"/>')
        out.append(f'<text x="{px(i):.1f}" y="{y0 + PAD_T + ih + 12}" font-size="9" text-anchor="middle">{x:g}</text>')
        out.append(f'<text x="{px(i):.1f}" y="{py(y) - 5:.1f}" font-size="8" text-anchor="middle">{y:.2f}</text>')
    out.append(f'<text x="{x0 + PAD_L + iw / 2}" y="{y0 + H - 10}" font-size="10" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text x="{x0 + 12}" y="{y0 + PAD_T + ih / 2}" font-size="10" text-anchor="middle" '
               f'transform="rotate(-90 {x0 + 12} {y0 + PAD_T + ih / 2})">{ylabel}</text>')
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
    lines = [d for d in lines if d.get("bench") == "pipeline" and not d["device"].startswith("emulated twin")]
    if not lines:
        sys.exit("no bench/pipeline JSON lines in " + sys.argv[1])
    first = lines[0]
    emulated = first["device"].startswith("emulated")
    where = (f"emulated device (base: topk 0.1, U 4, compute 0.5x host update, 25 GB/s)" if emulated else
             f"{first['device']} (base: topk 0.1, U 4, compute 0.5x host update)")
    title = f"zenflow vs ZeRO-Offload, {first['params'] / 1e6:.0f}M params bf16, {where}"
    body = [f'<text x="10" y="16" font-size="12" font-weight="bold">{title}</text>']
    for c, (sweep, key, label) in enumerate(SWEEPS):
        pts = series(lines, sweep, key)
        for r, (ykey, ylabel, goal) in enumerate(ROWS):
            body += panel(c * W, 20 + r * H, pts, ykey, label, ylabel, goal)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{len(SWEEPS) * W}" height="{20 + len(ROWS) * H}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>' + "".join(body) + "</svg>\n")
    open(sys.argv[2], "w").write(svg)


if __name__ == "__main__":
    main()
