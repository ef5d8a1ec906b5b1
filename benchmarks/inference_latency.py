"""Inference latency, throughput and accuracy of predict's modes side by side: "exact" (every
label), "index" (the inference index over the output rows) and "lsh" (the training hash
tables), on one loaded process.

    python benchmarks/inference_latency.py [--train 20000] [--test 2000] [--epochs 3]
    python benchmarks/inference_latency.py --model run/model.slide --data test.txt [--exact-points 20000]

Without --model: generates amazon-670k-shaped synthetic data (``slide.datasets.make_synthetic``)
and trains a network with ``datasets/synth-amazon-670k.yaml`` settings for --epochs (model and
test split cached under ``runs/benchmarks/inference_latency/``, keyed by shape and seed;
--retrain ignores the cache). With --model: a saved network and a test file (XC or libsvm).

Measured, the modes interleaved so that all see the same load of a shared machine:

- index build: seconds and bytes of the inference index (``Network.build_index``);
- batch: ``predict(X, k=5, mode=...)`` on a seeded subset of --exact-points test points (all
  three modes: the ratios of points/s come from this subset), and on all test points (at most
  --points) for the fast modes; P@1 and P@5 of each;
- single query: ``predict(x_i, k=5, mode=...)`` for one row at a time (a 1-row CSR matrix, as a
  server holding one request would pass it): p50 / p99 milliseconds of wall-clock and of CPU
  time of the calling thread (on a shared machine the wall-clock p99 includes time-slices lost
  to other processes);
- mode index at each probe of --probes, and mode lsh at each candidates:prior of --settings
  (P@1, P@5 and points/s on the subset).

The load average of the machine is recorded before and after. Prints a table and writes
JSON to ``benchmarks/results/inference_latency.json`` (or --out).
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
MODES = ("exact", "index", "lsh")


def precision(labels, Y, k):
    """P@k of top-k labels (int32 [n, >=k], -1 = none) against a CSR label matrix."""
    Y = sp.csr_matrix(Y)
    top = labels[:, :k]
    hits = 0
    for i in range(Y.shape[0]):
        truth = Y.indices[Y.indptr[i]:Y.indptr[i + 1]]
        hits += np.isin(top[i][top[i] >= 0], truth).sum()
    return float(hits) / (k * Y.shape[0])


def synthetic_model_and_data(args):
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


def saved_model_and_data(args):
    from slide.data import load_dataset

    t0 = time.perf_counter()
    net = slide.Network.load(args.model, threads=args.threads)
    load = time.perf_counter() - t0
    ds = load_dataset(args.data, num_features=net.num_features, num_labels=net.num_labels)
    return net, ds.features, ds.labels, {"model": os.path.abspath(args.model), "data": os.path.abspath(args.data),
                                         "load_seconds": load}


def percentile_ms(times, q):
    return float(np.percentile(np.asarray(times) * 1e3, q))


def batch_run(net, X, Y, repeats, **kw):
    """(points/s of the fastest of `repeats` runs, P@1, P@5)."""
    sec = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        labels, _ = net.predict(X, k=5, **kw)
        sec.append(time.perf_counter() - t0)
    return X.shape[0] / min(sec), precision(labels, Y, 1), precision(labels, Y, 5)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a saved network (slide.Network.save); default: train a synthetic one")
    ap.add_argument("--data", help="test file for --model (XC or libsvm)")
    ap.add_argument("--train", type=int, default=20_000, help="synthetic: training points")
    ap.add_argument("--test", type=int, default=2_000, help="synthetic: test points")
    ap.add_argument("--epochs", type=int, default=3, help="synthetic: epochs")
    ap.add_argument("--retrain", action="store_true", help="synthetic: ignore the cached model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--exact-points", type=int, default=20_000,
                    help="seeded subset of test points that every mode predicts (exact is slow)")
    ap.add_argument("--points", type=int, default=0, help="test points for the fast modes (0 = all)")
    ap.add_argument("--queries", type=int, default=2000, help="single queries per fast mode")
    ap.add_argument("--exact-every", type=int, default=5, help="one exact single query per this many of a fast mode")
    ap.add_argument("--block", type=int, default=250, help="single queries of one mode in a row")
    ap.add_argument("--repeats", type=int, default=1, help="batch runs per mode on the subset (fastest counts)")
    ap.add_argument("--probes", default="16,32,64,128", help="comma-separated probes to score mode index with")
    ap.add_argument("--settings", default="0:0,3000:1000,3000:16000",
                    help="comma-separated candidates:prior pairs to score mode lsh with")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "inference_latency.json"))
    args = ap.parse_args(argv)
    if bool(args.model) != bool(args.data):
        ap.error("--model and --data go together")

    load_before = os.getloadavg()
    net, X, Y, build = (saved_model_and_data if args.model else synthetic_model_and_data)(args)
    X, Y = sp.csr_matrix(X), sp.csr_matrix(Y)
    n_all = X.shape[0] if args.points <= 0 else min(args.points, X.shape[0])
    rng = np.random.default_rng(args.seed)
    sub = np.sort(rng.choice(X.shape[0], min(args.exact_points, X.shape[0]), replace=False))
    Xs, Ys = X[sub], Y[sub]
    Xa, Ya = X[:n_all], Y[:n_all]

    index = net.build_index()
    rows = [X[i] for i in range(min(X.shape[0], args.queries))]
    # Warm-up: first calls fault in the model's pages and fill the prediction workspaces.
    for i in range(20):
        for mode in ("index", "lsh"):
            net.predict(rows[i % len(rows)], k=5, mode=mode)
    net.predict(rows[0], k=5, mode="exact")

    # Single queries: blocks of --block queries of each fast mode in turn, with one exact query
    # per --exact-every of them (an exact query sweeps the whole output matrix through the
    # caches; a server answers in one mode).
    single = {m: [] for m in MODES}
    cpu = {m: [] for m in MODES}
    q = 0
    while q < args.queries:
        block = min(args.block, args.queries - q)
        plan = [(m, rows[(q + j) % len(rows)]) for m in ("index", "lsh") for j in range(block)]
        plan += [("exact", rows[(q + j) % len(rows)]) for j in range(0, block, args.exact_every)]
        for mode, x in plan:
            t0, c0 = time.perf_counter(), time.thread_time()
            net.predict(x, k=5, mode=mode)
            single[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.thread_time() - c0)
        q += block

    results = {m: {} for m in MODES}
    for mode in MODES:  # warm-up of the batch path (workspaces, pages)
        net.predict(Xs[:256], k=5, mode=mode)
    for r in range(args.repeats):   # the subset: all modes, alternating order
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            pps, p1, p5 = batch_run(net, Xs, Ys, 1, mode=mode)
            res = results[mode]
            if pps > res.get("subset_points_per_second", 0):
                res.update(subset_points_per_second=pps, subset_P1=p1, subset_P5=p5)
    for mode in ("index", "lsh"):
        pps, p1, p5 = batch_run(net, Xa, Ya, 1, mode=mode)
        results[mode].update(all_points_per_second=pps, all_P1=p1, all_P5=p5)
    for mode in MODES:
        results[mode].update({
            "single_p50_ms": percentile_ms(single[mode], 50),
            "single_p99_ms": percentile_ms(single[mode], 99),
            "single_mean_ms": float(np.mean(single[mode]) * 1e3),
            "single_cpu_p50_ms": percentile_ms(cpu[mode], 50),
            "single_cpu_p99_ms": percentile_ms(cpu[mode], 99),
            "single_queries": len(single[mode]),
        })
    probes = {}
    for p in [int(v) for v in args.probes.split(",") if v]:
        pps, p1, p5 = batch_run(net, Xs, Ys, args.repeats, mode="index", probe=p)
        probes[str(p)] = {"probe": p, "P@1": p1, "P@5": p5, "points_per_second": pps}
    settings = {}
    for item in [v for v in args.settings.split(",") if v]:
        c, p = (int(v) for v in item.split(":"))
        pps, p1, p5 = batch_run(net, Xs, Ys, args.repeats, mode="lsh", candidates=c, prior=p)
        settings[item] = {"candidates": c, "prior": p, "P@1": p1, "P@5": p5, "points_per_second": pps}
    load_after = os.getloadavg()

    ex = results["exact"]
    what = (f"model {args.model}" if args.model else
            f"amazon-670k-shaped model: {args.train} training points, {args.epochs} epochs")
    print(f"{what}; {net.num_labels:,} labels; {Xs.shape[0]:,} test points (subset) / {n_all:,} (all); "
          f"{args.threads} threads, kernels {net._core.kernel_isa}; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after")
    print(f"index: {index['clusters']:,} clusters (largest {index['largest_cluster']}), "
          f"{index['bytes'] / 2**20:.1f} MiB, built in {index['build_seconds']:.1f} s")
    print(f"{'mode':<28} {'P@1':>7} {'P@5':>7} {'pts/s':>9} {'speed':>6} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'cpu p99':>7} {'P@1 all':>8} {'pts/s all':>10}")
    for mode in MODES:
        r = results[mode]
        all_cols = (f"{r['all_P1']:>8.4f} {r['all_points_per_second']:>10,.0f}" if "all_P1" in r else "")
        print(f"{mode:<28} {r['subset_P1']:>7.4f} {r['subset_P5']:>7.4f} {r['subset_points_per_second']:>9,.0f} "
              f"{r['subset_points_per_second'] / ex['subset_points_per_second']:>5.1f}x {r['single_p50_ms']:>7.3f} "
              f"{r['single_p99_ms']:>7.3f} {r['single_cpu_p99_ms']:>7.3f} {all_cols}")
    for r in probes.values():
        print(f"{'index probe=' + str(r['probe']):<28} {r['P@1']:>7.4f} {r['P@5']:>7.4f} "
              f"{r['points_per_second']:>9,.0f} {r['points_per_second'] / ex['subset_points_per_second']:>5.1f}x")
    for r in settings.values():
        name = f"lsh candidates={r['candidates']} prior={r['prior']}"
        print(f"{name:<28} {r['P@1']:>7.4f} {r['P@5']:>7.4f} {r['points_per_second']:>9,.0f} "
              f"{r['points_per_second'] / ex['subset_points_per_second']:>5.1f}x")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:])),
                   "args": vars(args), "build": build, "index": index, "results": results,
                   "probes": probes, "settings": settings, "subset_points": int(Xs.shape[0]),
                   "all_points": int(n_all), "load_average": {"before": load_before, "after": load_after},
                   "machine": platform.processor() or platform.machine(), "kernel_isa": net._core.kernel_isa,
                   "date": time.strftime("%Y-%m-%d")}, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
