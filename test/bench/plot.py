#!/usr/bin/env python3
"""test/bench/plot.py DIR: the benchmark's plots from DIR/results.csv and DIR/build.csv.

Writes DIR/recall_qps.png (recall@k against QPS, one panel per client count
and data set, one curve per system and knob, QPS on a log axis, as
ann-benchmarks draws them: up and to the right is better) and DIR/build.png
(build time and index size per system and data set).  A merged DIR (test/bench/run
--merge) holds several data sets.  Called by test/bench/run; exits with status 3 when
matplotlib cannot be imported so that the caller can say the plots were
skipped.
"""
import csv
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # the caller reports the skip
    print(f"matplotlib is not available: {e}", file=sys.stderr)
    sys.exit(3)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def curve_label(r):
    label = f"{r['system']} ({r['knob']})"
    if r["system"].startswith("gpuivf"):
        label = f"{r['system']} {r['device']} ({r['knob']})"
    return label


def datasets(rows):
    """The (rows, dims) data sets of a (possibly merged) result file, in order of appearance."""
    seen = []
    for r in rows:
        key = (r["rows"], r["dims"])
        if key not in seen:
            seen.append(key)
    return seen


def plot_recall_qps(rows, out, k):
    sets = datasets(rows)
    clients = sorted({int(r["clients"]) for r in rows})
    fig, axes = plt.subplots(len(sets), len(clients), figsize=(6.5 * len(clients), 5.2 * len(sets)),
                             squeeze=False)
    labels = sorted({curve_label(r) for r in rows})
    colours = {lab: plt.cm.tab10(i % 10) for i, lab in enumerate(labels)}
    for row_axes, (n, d) in zip(axes, sets):
        for ax, c in zip(row_axes, clients):
            for lab in labels:
                pts = [r for r in rows if int(r["clients"]) == c and curve_label(r) == lab
                       and (r["rows"], r["dims"]) == (n, d)]
                if not pts:
                    continue
                pts.sort(key=lambda r: float(r["value"]))
                x = [float(r[f"recall_at_{k}"]) for r in pts]
                y = [max(float(r["qps"]), 1e-3) for r in pts]
                style = "--" if "target_recall" in lab else "-"
                ax.plot(x, y, style, marker="o", color=colours[lab], label=lab)
                for r, xi, yi in zip(pts, x, y):
                    ax.annotate(r["value"], (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7,
                                color=colours[lab])
            ax.set_yscale("log")
            ax.set_xlabel(f"recall@{k}")
            ax.set_ylabel("queries per second (log)")
            ax.set_title(f"{n} x {d}, {c} client{'s' if c != 1 else ''}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8, loc="lower left")
    meta = rows[0]
    fig.suptitle(f"recall@{k} vs QPS: {meta['queries']} queries, metric {meta['metric']} (labels: knob values)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_build(builds, out):
    sets = datasets(builds)
    fig, axes = plt.subplots(len(sets), 2, figsize=(11, 4.2 * len(sets)), squeeze=False)
    for (a1, a2), (n, d) in zip(axes, sets):
        sel = [b for b in builds if (b["rows"], b["dims"]) == (n, d)]
        names = [b["system"] for b in sel]
        secs = [float(b["build_s"]) for b in sel]
        mb = [int(b["index_bytes"]) / 1048576 for b in sel]
        bars = a1.bar(names, secs, width=0.5, color="tab:blue")
        a1.bar_label(bars, fmt="%.1f s")
        a1.set_ylabel("build time (s)")
        a1.set_title(f"index build time, {n} x {d}")
        bars = a2.bar(names, mb, width=0.5, color="tab:orange")
        a2.bar_label(bars, fmt="%.1f MB")
        a2.set_ylabel("index size (MB)")
        a2.set_title(f"index size, {n} x {d}")
        for ax, vals in ((a1, secs), (a2, mb)):
            ax.set_xlim(-0.5 - 0.5 / len(names), len(names) - 0.5 + 0.5 / len(names))
            ax.set_ylim(0, max(vals + [1e-9]) * 1.15)
            ax.tick_params(axis="x", labelrotation=15)
            ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) != 2:
        print("usage: plot.py DIR", file=sys.stderr)
        return 2
    d = sys.argv[1]
    rows = read_csv(os.path.join(d, "results.csv"))
    builds = read_csv(os.path.join(d, "build.csv"))
    k = next((c.split("_")[-1] for c in rows[0] if c.startswith("recall_at_")), "10") if rows else "10"
    written = []
    if rows:
        plot_recall_qps(rows, os.path.join(d, "recall_qps.png"), k)
        written.append("recall_qps.png")
    if builds:
        plot_build(builds, os.path.join(d, "build.png"))
        written.append("build.png")
    print("plots: " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
