#!/usr/bin/env python
"""What the label-centroid term adds to the default network, and which label vectors it chose.

    python benchmarks/label_term.py                         # all 12 real sets, 2 threads
    python benchmarks/label_term.py --sets medical,bibtex --threads 1

For each set (the files of ``benchmarks/suite.py``): the default ``slide.Network`` trained on
train (``epochs: auto``, ``centroid_weight: auto``, ``centroid_kind: auto``), then the same
trained network scored on test with the term as chosen and without it (``net.centroid_weight =
0``), P@1 and PSP@1 (propensities A=0.55, B=1.5). The choice itself is made on the search's
validation split only (its P@1 with and without the term is in the JSON); test is read after
training. Prints a markdown table and writes
``benchmarks/results/label_term.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from suite import SETS, data_paths  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "label_term.json"


def measure(name: str, threads: int) -> dict:
    import slide

    train_path, test_path = data_paths(name)
    train, test = slide.load_dataset(train_path), slide.load_dataset(test_path)
    t = time.perf_counter()
    net = slide.Network(threads=threads)
    h = net.fit(train)
    seconds = time.perf_counter() - t
    props = slide.metrics.propensities(train.labels, 0.55, 1.5)

    def score() -> dict:
        labels, _ = net.predict(test.features, k=1)
        m = slide.metrics.evaluate(labels, test.labels, k=1, propensities=props)
        return {"P@1": m["P@1"], "PSP@1": m["PSP@1"]}

    row = {"set": name, "kind": net.centroid_kind if net.centroid_weight else None,
           "ridge_lambda": net._ridge_lambda if net.centroid_weight and net.centroid_kind == "ridge" else None,
           "weight": net.centroid_weight, "train_seconds": seconds,
           "valid_without": h.centroid_search.get(0.0), "valid_with": h.centroid_search.get(net.centroid_weight),
           "with": score()}
    chosen = net.centroid_weight
    net.centroid_weight = 0.0
    row["without"] = score()
    net.centroid_weight = chosen
    return row


def table(rows) -> str:
    out = ["| set | chosen | test P@1 without / with | PSP@1 without / with | train s |",
           "|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "ridge":
            chosen = f"ridge, lambda {r['ridge_lambda']:g}, weight {r['weight']:g}"
        elif r["kind"] == "mean":
            chosen = f"centroids, weight {r['weight']:g}"
        else:
            chosen = "off"
        out.append(f"| {r['set']} | {chosen} | {r['without']['P@1']:.4f} / {r['with']['P@1']:.4f} | "
                   f"{r['without']['PSP@1']:.4f} / {r['with']['PSP@1']:.4f} | {r['train_seconds']:.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    rows = []
    for name in args.sets.split(","):
        rows.append(measure(name, args.threads))
        print(json.dumps({k: rows[-1][k] for k in ("set", "kind", "ridge_lambda", "weight", "with", "without")}),
              flush=True)
    print(table(rows))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "command": " ".join(["python", "benchmarks/label_term.py"] + list(argv or sys.argv[1:])),
        "date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "threads": args.threads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
