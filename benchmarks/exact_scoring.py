"""Throughput of exact scoring (``predict(X, k=5, mode="exact")``) on wide dense output layers.

    python benchmarks/exact_scoring.py [--shapes 50000:20000:1024,135909:670091:128] [--points 2000,1000]
        [--threads 2] [--save-scores DIR | --compare DIR]

For each shape FEATURES:LABELS:HIDDEN, builds a network with one hidden layer and a dense output
layer (one epoch on 256 random points, seed 0, one thread, so that every run scores with the same
weights; scoring time does not depend on what was learned), loads it with --threads threads,
draws random rows of 60 non-zeros (numpy seed 0) and times ``predict`` on them three times,
after a warm-up; the best and the median of the three give points/s and GFLOP/s (2 x labels x
hidden per point, the output layer's product). ``--save-scores DIR`` writes each shape's top-5
scores; ``--compare DIR`` checks them against an earlier run's (for a change of the scoring
code that must keep every score: run one build with --save-scores, the other with --compare).
Prints a table and writes ``benchmarks/results/exact_scoring.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "exact_scoring.json"
NNZ = 60


def random_rows(rng, n: int, d: int) -> sp.csr_matrix:
    cols = np.sort(rng.choice(d, size=(n, NNZ)), axis=1)
    X = sp.csr_matrix((rng.random(n * NNZ).astype(np.float32), cols.ravel(), np.arange(0, n * NNZ + 1, NNZ)),
                      shape=(n, d))
    X.sum_duplicates()
    return X


def measure(features: int, labels: int, hidden: int, points: int, threads: int) -> tuple:
    import slide

    rng = np.random.default_rng(0)
    Y = sp.csr_matrix((np.ones(256, np.float32), rng.integers(0, labels, 256), np.arange(257)), shape=(256, labels))
    net = slide.Network({"layers": [{"size": hidden}, {"size": None, "sampling": "dense"}],
                         "training": {"threads": 1, "seed": 0}})   # one thread: the same weights every run
    net.fit(slide.Dataset(random_rows(rng, 256, features), Y, num_features=features, num_labels=labels), epochs=1)
    with tempfile.TemporaryDirectory(prefix="slide-exact-") as tmp:
        net.save(os.path.join(tmp, "model.slide"))
        net = slide.Network.load(os.path.join(tmp, "model.slide"), threads=threads)
    X = random_rows(rng, points, features)
    net.predict(X[:64], k=5)
    seconds, scores = [], None
    for _ in range(3):
        t = time.perf_counter()
        _, scores = net.predict(X, k=5)
        seconds.append(time.perf_counter() - t)
    best, median = min(seconds), sorted(seconds)[1]
    flop = 2.0 * labels * hidden * points
    row = {"features": features, "labels": labels, "hidden": hidden, "points": points,
           "points_per_second": round(points / best, 1), "points_per_second_median": round(points / median, 1),
           "gflops": round(flop / best / 1e9, 1)}
    return row, scores


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="50000:20000:1024,135909:670091:128")
    ap.add_argument("--points", default="2000,1000", help="test points per shape (one value, or one per shape)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-scores", metavar="DIR")
    ap.add_argument("--compare", metavar="DIR")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",") if s]
    points = [int(p) for p in args.points.split(",")]
    points = points * len(shapes) if len(points) == 1 else points
    if len(points) != len(shapes):
        ap.error(f"--points: {len(points)} values for {len(shapes)} shapes")
    rows, same = [], True
    for (d, L, h), n in zip(shapes, points):
        row, scores = measure(d, L, h, n, args.threads)
        name = f"{d}-{L}-{h}-{n}.npy"
        if args.save_scores:
            os.makedirs(args.save_scores, exist_ok=True)
            np.save(os.path.join(args.save_scores, name), scores)
        if args.compare:
            row["same_scores"] = bool(np.array_equal(np.load(os.path.join(args.compare, name)), scores))
            same &= row["same_scores"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| features | labels | hidden | points | points/s (best of 3) | median | GFLOP/s |"
          + (" same scores |" if args.compare else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.compare else ""))
    for r in rows:
        print(f"| {r['features']:,} | {r['labels']:,} | {r['hidden']} | {r['points']:,} | "
              f"{r['points_per_second']:,.0f} | {r['points_per_second_median']:,.0f} | {r['gflops']:.1f} |"
              + (f" {'yes' if r['same_scores'] else 'NO'} |" if args.compare else ""))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                          "cpus": os.cpu_count(), "threads": args.threads, "rows": rows},
                                         indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
