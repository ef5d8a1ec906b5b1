"""Inference latency and throughput: predict(mode="lsh") against mode="exact" on an
amazon-670k-shaped model.

    python benchmarks/inference_latency.py [--train 20000] [--test 2000] [--epochs 3]

Generates amazon-670k-shaped synthetic data (``slide.datasets.make_synthetic``), trains a
network with ``datasets/synth-amazon-670k.yaml`` settings for --epochs (the model and the
test split are cached under ``runs/benchmarks/inference_latency/``, keyed by the shape and
seed; --retrain ignores the cache), then measures on one loaded process, the modes
interleaved so that both see the same load of a shared machine:

- single query: ``predict(x_i, k=5, mode=...)`` for one row at a time (a 1-row CSR matrix,
  as a server holding one request would pass it): p50 / p99 / mean milliseconds;
- batch: ``predict(X_test, k=5, mode=...)`` on all test points: points per second;
- P@1 of each mode on the test points, and P@1 and batch points/s of mode lsh with the
  query-time settings of --settings (``predict(..., candidates=C, prior=P)`` for each C:P;
  0:0 selects as in training, the behaviour before these settings existed).

Single-query latency is also reported in CPU time of the calling thread (a query runs on it):
on a shared machine the wall-clock p99 includes time-slices lost to other processes.

Prints a table and writes ``benchmarks/results/inference_latency.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import scipy.sparse as sp

import slide
from slide.datasets import make_synthetic

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def p_at_1(labels, Y):
    Y = sp.csr_matrix(Y)
    top = labels[:, 0]
    hit = [top[i] >= 0 and Y[i, top[i]] != 0 for i in range(Y.shape[0])]
    return float(np.mean(hit))


def model_and_data(args):
    key = f"amazon-670k_n{args.train}_t{args.test}_e{args.epochs}_s{args.seed}"
    folder = os.path.join(ROOT, "runs", "benchmarks", "inference_latency")
    model_path = os.path.join(folder, key + ".slide")
    test_path = os.path.join(folder, key + "_test.npz")
    if not args.retrain and os.path.exists(model_path) and os.path.exists(test_path):
        z = np.load(test_path)
        X = sp.csr_matrix((z["x_data"], z["x_indices"], z["x_indptr"]), shape=tuple(z["x_shape"]))
        Y = sp.csr_matrix((z["y_data"], z["y_indices"], z["y_indptr"]), shape=tuple(z["y_shape"]))
        return slide.Network.load(model_path, threads=args.threads), X, Y, {"cached": model_path}
    t0 = time.perf_counter()
    train, test = make_synthetic("amazon-670k", seed=args.seed, num_train=args.train, num_test=args.test)
    gen = time.perf_counter() - t0
    net = slide.Network(os.path.join(ROOT, "datasets", "synth-amazon-670k.yaml"), epochs=args.epochs,
                        threads=args.threads, seed=args.seed)
    t0 = time.perf_counter()
    net.fit(train)
    fit = time.perf_counter() - t0
    os.makedirs(folder, exist_ok=True)
    net.save(model_path)
    X, Y = test.features, test.labels
    np.savez(test_path, x_data=X.data, x_indices=X.indices, x_indptr=X.indptr, x_shape=X.shape,
             y_data=Y.data, y_indices=Y.indices, y_indptr=Y.indptr, y_shape=Y.shape)
    return net, X, Y, {"generate_seconds": gen, "fit_seconds": fit}


def percentile_ms(times, q):
    return float(np.percentile(np.asarray(times) * 1e3, q))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--test", type=int, default=2_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--queries", type=int, default=2000, help="single queries in mode lsh")
    ap.add_argument("--exact-every", type=int, default=5, help="one exact single query per this many lsh ones")
    ap.add_argument("--block", type=int, default=250, help="single queries of one mode in a row")
    ap.add_argument("--repeats", type=int, default=2, help="batch runs per mode (alternating)")
    ap.add_argument("--settings", default="0:0,3000:0,3000:500,3000:1000,3000:2000,3000:4000",
                    help="comma-separated candidates:prior pairs to score P@1 with in mode lsh")
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "inference_latency.json"))
    args = ap.parse_args(argv)

    net, X, Y, build = model_and_data(args)
    n = X.shape[0]
    rows = [X[i] for i in range(n)]
    # Warm-up: first calls fault in the model's pages and fill the prediction workspaces.
    for i in range(20):
        net.predict(rows[i], k=5, mode="lsh")
    net.predict(rows[0], k=5, mode="exact")

    # Blocks of --block lsh queries alternate with blocks of exact ones (one exact query per
    # --exact-every lsh ones): both modes see the same load, and an lsh query rarely follows an
    # exact one, which sweeps the whole output matrix through the caches (a server answers in
    # one mode).
    single = {"lsh": [], "exact": []}
    cpu = {"lsh": [], "exact": []}
    q = 0
    while q < args.queries:
        block = min(args.block, args.queries - q)
        plan = [("lsh", rows[(q + j) % n]) for j in range(block)]
        plan += [("exact", rows[(q + j) % n]) for j in range(0, block, args.exact_every)]
        for mode, x in plan:
            t0, c0 = time.perf_counter(), time.thread_time()
            net.predict(x, k=5, mode=mode)
            single[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.thread_time() - c0)
        q += block

    batch = {"lsh": [], "exact": []}
    preds = {}
    for r in range(args.repeats):
        for mode in (("lsh", "exact") if r % 2 == 0 else ("exact", "lsh")):
            t0 = time.perf_counter()
            preds[mode] = net.predict(X, k=5, mode=mode)
            batch[mode].append(time.perf_counter() - t0)

    results = {}
    for mode in ("lsh", "exact"):
        results[mode] = {
            "single_p50_ms": percentile_ms(single[mode], 50),
            "single_p99_ms": percentile_ms(single[mode], 99),
            "single_mean_ms": float(np.mean(single[mode]) * 1e3),
            "single_cpu_p50_ms": percentile_ms(cpu[mode], 50),
            "single_cpu_p99_ms": percentile_ms(cpu[mode], 99),
            "single_queries": len(single[mode]),
            "batch_points_per_second": n / min(batch[mode]),
            "batch_seconds": batch[mode],
            "P@1": p_at_1(preds[mode][0], Y),
        }
    budgets = {}
    for item in [v for v in args.settings.split(",") if v]:
        c, p = (int(v) for v in item.split(":"))
        sec = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            lab, _ = net.predict(X, k=5, mode="lsh", candidates=c, prior=p)
            sec.append(time.perf_counter() - t0)
        budgets[item] = {"candidates": c, "prior": p, "P@1": p_at_1(lab, Y), "batch_points_per_second": n / min(sec)}

    ex, ls = results["exact"], results["lsh"]
    print(f"amazon-670k-shaped model: {args.train} training points, {args.epochs} epochs, {n} test points, "
          f"{args.threads} threads, kernels {net._core.kernel_isa}")
    print(f"{'mode':<30} {'p50 ms':>7} {'p99 ms':>7} {'cpu p99':>7} {'batch pts/s':>12} {'P@1':>7}")
    for mode in ("exact", "lsh"):
        r = results[mode]
        print(f"{mode + (' (defaults)' if mode == 'lsh' else ''):<30} {r['single_p50_ms']:>7.3f} "
              f"{r['single_p99_ms']:>7.3f} {r['single_cpu_p99_ms']:>7.3f} "
              f"{r['batch_points_per_second']:>12,.0f} {r['P@1']:>7.4f}")
    for r in budgets.values():
        name = f"lsh candidates={r['candidates']} prior={r['prior']}"
        print(f"{name:<30} {'':>7} {'':>7} {'':>7} {r['batch_points_per_second']:>12,.0f} {r['P@1']:>7.4f}")
    print(f"lsh / exact: batch {ls['batch_points_per_second'] / ex['batch_points_per_second']:.1f}x, "
          f"single-query p50 {ex['single_p50_ms'] / ls['single_p50_ms']:.1f}x, "
          f"P@1 {ls['P@1'] - ex['P@1']:+.4f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:])),
                   "args": vars(args), "build": build, "results": results,
                   "settings": budgets,
                   "machine": platform.processor() or platform.machine(), "kernel_isa": net._core.kernel_isa,
                   "date": time.strftime("%Y-%m-%d")}, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
