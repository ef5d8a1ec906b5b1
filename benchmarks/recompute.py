"""training.recompute: activation memory and time per batch against the stored path.

    python benchmarks/recompute.py [--hidden 4096] [--depth 3] [--batch 1024] [--batches 4]

Builds two networks with the same seed (hidden layers of --hidden ReLU units, dropout 0.5,
dense softmax output; trained on the batched dense path), one storing every activation and
one with ``training.recompute: true``, and trains them batch for batch on the same random
sparse data, alternating which goes first, so that both see the same load of a shared
machine. Prints a table (median seconds per batch, activation bytes from the engine's memory
report) and writes ``benchmarks/results/recompute.json``. It also checks that both networks
end with the same weights (the recompute path is meant to give the same bits).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import scipy.sparse as sp

import slide

HERE = os.path.dirname(os.path.abspath(__file__))


def make_data(n, features, labels, nnz, seed):
    rng = np.random.default_rng(seed)
    indptr = np.arange(0, (n + 1) * nnz, nnz, dtype=np.int64)
    indices = np.sort(np.stack([rng.choice(features, nnz, replace=False) for _ in range(n)]), axis=1)
    X = sp.csr_matrix((rng.random(n * nnz, dtype=np.float32), indices.ravel().astype(np.int32), indptr),
                      shape=(n, features))
    y = rng.integers(0, labels, n).astype(np.int32)
    return X, y


def build(args, recompute):
    cfg = {
        "layers": [{"size": args.hidden, "activation": "relu", "sampling": "dense"}] * args.depth
        + [{"size": None, "activation": "softmax", "sampling": "dense"}],
        "training": {"recompute": recompute, "threads": args.threads, "seed": 0, "dropout": 0.5,
                     "batch_size": args.batch},
        "optimizer": {"lr": 1e-3},
    }
    return slide.Network(cfg, num_features=args.features, num_labels=args.labels)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=3, help="hidden layers")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=4, help="timed batches per mode (after one warm-up)")
    ap.add_argument("--features", type=int, default=5000)
    ap.add_argument("--labels", type=int, default=1000)
    ap.add_argument("--nnz", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "recompute.json"))
    args = ap.parse_args(argv)

    X, y = make_data(args.batch * (args.batches + 1), args.features, args.labels, args.nnz, seed=1)
    xp, xi, xv = (np.ascontiguousarray(a) for a in (X.indptr.astype(np.int64), X.indices, X.data))
    yp = np.arange(len(y) + 1, dtype=np.int64)
    nets = {"stored": build(args, False), "recompute": build(args, True)}
    seconds = {m: [] for m in nets}
    for b in range(args.batches + 1):
        rows = np.arange(b * args.batch, (b + 1) * args.batch, dtype=np.int64)
        order = list(nets) if b % 2 == 0 else list(nets)[::-1]
        for mode in order:
            t0 = time.perf_counter()
            nets[mode]._core.train_batch(xp, xi, xv, yp, y, rows, 1e-3)
            if b > 0:   # the first batch allocates
                seconds[mode].append(time.perf_counter() - t0)
    params = {m: n.parameters() for m, n in nets.items()}
    same = all(np.array_equal(v, params["recompute"][k]) for k, v in params["stored"].items())
    rows = {}
    for mode, net in nets.items():
        rep = net.memory_report()
        rows[mode] = {"seconds_per_batch": statistics.median(seconds[mode]), "seconds": seconds[mode],
                      "activation_bytes": rep["activations"], "model_bytes": rep["weights"] + rep["optimizer"]}
    base = rows["stored"]
    for r in rows.values():
        r["time_ratio"] = r["seconds_per_batch"] / base["seconds_per_batch"]
        r["activation_ratio"] = r["activation_bytes"] / base["activation_bytes"]

    print(f"{args.depth} hidden layers of {args.hidden}, batch {args.batch}, {args.labels} labels, "
          f"{args.threads} threads, {args.batches} timed batches each (alternating)")
    print(f"{'mode':<10} {'s/batch':>8} {'time':>7} {'activations':>12} {'ratio':>6}")
    for mode, r in rows.items():
        print(f"{mode:<10} {r['seconds_per_batch']:>8.3f} {r['time_ratio']:>6.2f}x "
              f"{r['activation_bytes'] / 2**20:>8.1f} MiB {r['activation_ratio']:>6.2f}")
    print(f"same weights after {args.batches + 1} batches: {'yes' if same else 'NO'}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:])),
                   "args": vars(args), "results": rows, "same_weights": same,
                   "machine": platform.processor() or platform.machine(),
                   "kernel_isa": nets["stored"]._core.kernel_isa, "date": time.strftime("%Y-%m-%d")},
                  fh, indent=1)
    print(f"wrote {args.out}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
