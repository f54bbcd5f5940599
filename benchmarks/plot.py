"""PNG plots of a comparison run, for docs/benchmarks.md.

    python -m benchmarks.compare --json compare.json
    python -m benchmarks.plot compare.json --out docs/img

Writes ``compare-throughput.png`` (records/s per workload and system, log scale),
``compare-latency.png`` (random-read p50 / p99) and ``compare-targets.png`` (each speed
target's measured value over its goal). Needs matplotlib.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

COLORS = {"pylog": "#000000"}


def _rows(data: dict[str, Any], dataset: str, workload: str) -> list[dict[str, Any]]:
    return [r for r in data["rows"] if r["dataset"] == dataset and r["workload"] == workload]


def throughput(data: dict[str, Any], out: str, plt: Any) -> str:
    datasets = [d for d in dict.fromkeys(r["dataset"] for r in data["rows"]) if "records x" in d]
    workloads = ["append (each)", "append (batch)", "scan"]
    fig, axes = plt.subplots(len(datasets), 1, figsize=(10.5, 3.6 * len(datasets)), squeeze=False)
    for ax, ds in zip(axes[:, 0], datasets):
        systems = list(dict.fromkeys(r["system"] for r in data["rows"] if r["dataset"] == ds and r["rate"]
                                     and r["workload"] in workloads))
        width = 0.8 / max(len(systems), 1)
        for i, sysname in enumerate(systems):
            xs, ys = [], []
            for j, wl in enumerate(workloads):
                for r in _rows(data, ds, wl):
                    if r["system"] == sysname and r["rate"]:
                        xs.append(j + i * width)
                        ys.append(r["rate"])
            ax.bar(xs, ys, width, label=sysname, color=COLORS.get(sysname))
        ax.set_yscale("log")
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(workloads))])
        ax.set_xticklabels(workloads)
        ax.set_ylabel("records/s (log)")
        ax.set_title(f"{ds}, fsync off, warm page cache (median of repetitions)")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not over them
    fig.tight_layout()
    path = os.path.join(out, "compare-throughput.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def latency(data: dict[str, Any], out: str, plt: Any) -> str:
    rows = [r for r in data["rows"] if r["workload"] == "random read" and r["p50_us"]]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        rs = [r for r in rows if r["dataset"] == ds]
        names = [r["system"] for r in rs]
        x = range(len(rs))
        ax.bar([i - 0.2 for i in x], [r["p50_us"] for r in rs], 0.4, label="p50",
               color=[COLORS.get(n, "#1f77b4") for n in names])
        ax.bar([i + 0.2 for i in x], [r["p99_us"] for r in rs], 0.4, label="p99", color="#aaaaaa")
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("microseconds (log)")
        ax.set_title(f"random read, {ds}", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out, "compare-latency.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def targets(data: dict[str, Any], out: str, plt: Any) -> str:
    ts = [t for t in data["targets"] if not t.get("skipped")]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(ts) + 1))
    names, vals, colors = [], [], []
    for t in ts:
        m = t["measured"]
        if m is None:
            score = 0.0
        elif t["kind"] == ">=":
            score = m / t["goal"]
        else:
            score = t["goal"] / m if m else 0.0
        names.append(t["name"])
        vals.append(score)
        colors.append("#2ca02c" if t["ok"] else "#d62728")
    ax.barh(range(len(ts)), vals, color=colors)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_yticks(range(len(ts)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("measured / goal (>= 1 meets the target; log scale)")
    issues = sorted({t["issue"] for t in data["targets"] if t.get("issue")})
    commit = data.get("conditions", {}).get("commit", "")
    ax.set_title(f"speed targets of issues {', '.join(map(str, issues))}, one run"
                 + (f" (commit {commit})" if commit else ""))
    fig.tight_layout()
    path = os.path.join(out, "compare-targets.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.plot")
    ap.add_argument("json", help="a file written by python -m benchmarks.compare --json")
    ap.add_argument("--out", default=os.path.join("docs", "img"), help="directory for the PNGs")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.json) as f:
        data = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    for fn in (throughput, latency, targets):
        print(fn(data, args.out, plt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
