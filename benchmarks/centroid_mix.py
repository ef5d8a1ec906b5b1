"""The network's logits plus a label-centroid score on the raw input, on a wide synthetic shape.

    python benchmarks/centroid_mix.py [--shape amazon-670k] [--budget 300] [--alphas 0,16,32,48,64,96,128,256]

On the split of ``benchmarks/wide_shapes.py`` (the same cached files: 90,000 points to fit,
10,000 held out for validation, 10,000 test points), trains ``datasets/synth-<shape>.yaml`` for
``--budget`` seconds of training (2 threads), then builds each label's centroid of the raw input
(the L2-normalised sum of the L2-normalised rows of its fitting points: a sparse label-by-feature
matrix, no training) and ranks every label by ``z + alpha * cos(x, centroid)`` where ``z`` is the
network's output logit. ``alpha`` is chosen on the validation split; the test split is scored
once, for alpha 0 (the network alone), the chosen alpha and the centroids alone. Prints a table
and writes ``benchmarks/results/centroid_mix_<shape>.json``. Exact scoring of every label: a few
minutes per 10,000 points on 2 cores.

This measures a model that is not part of slide (the centroid term is computed here, beside the
network): whether an input-space term adds what the hidden layer does not pass through.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wide_shapes import RESULTS, ROOT, _data  # noqa: E402  (the same cached split)


def _top1_hits(net_params, CT, ds, alphas):
    """P@1 of z + alpha * S for each alpha, and of S alone, on data set ``ds``."""
    from slide.scaling import normalize_rows

    W0, b0 = net_params["layers.0.weight"], net_params["layers.0.bias"]
    W1, b1 = net_params["layers.1.weight"], net_params["layers.1.bias"]
    X = normalize_rows(ds.features, "l2")
    Y = ds.labels.tocsr()
    H = np.maximum(X @ W0 + b0, 0).astype(np.float32)
    hits = {a: 0 for a in alphas}
    hits["centroids"] = 0
    for s in range(0, X.shape[0], 100):
        Z = H[s:s + 100] @ W1.T + b1
        S = (X[s:s + 100] @ CT).toarray()
        for i in range(Z.shape[0]):
            truth = set(Y.indices[Y.indptr[s + i]:Y.indptr[s + i + 1]].tolist())
            for a in alphas:
                hits[a] += int(np.argmax(Z[i] + a * S[i]) in truth)
            hits["centroids"] += int(np.argmax(S[i]) in truth)
    return {k: v / X.shape[0] for k, v in hits.items()}


def main(argv=None) -> int:
    import slide
    from slide.scaling import normalize_rows

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="amazon-670k")
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--alphas", default="0,16,32,48,64,96,128,256")
    a = ap.parse_args(argv)
    alphas = [float(x) for x in a.alphas.split(",")]
    if 0.0 not in alphas:
        alphas.insert(0, 0.0)
    paths = _data(a.shape, 100_000, 10_000, 10_000, 0)
    fit, valid, test = (slide.load_dataset(paths[k]) for k in ("fit", "valid", "test"))
    cfg = slide.Config.load(str(ROOT / "datasets" / f"synth-{a.shape}.yaml"))
    if len(cfg.layers) != 2:
        raise SystemExit("centroid_mix.py reads one hidden layer and the output layer")
    cfg.training.threads = a.threads
    cfg.training.time_budget = a.budget
    cfg.training.epochs = 10 ** 6      # the budget stops training
    cfg.training.eval_every = 0
    cfg.data.valid_fraction = 0.0
    net = slide.Network(cfg)
    t = time.perf_counter()
    net.fit(fit)
    train_s = time.perf_counter() - t
    t = time.perf_counter()
    X = normalize_rows(fit.features, "l2")
    C = normalize_rows((fit.labels.tocsr().T @ X).tocsr().astype(np.float32), "l2")
    CT = C.T.tocsr()
    build_s = time.perf_counter() - t
    params = net.parameters()
    v = _top1_hits(params, CT, valid, alphas)
    best = max(alphas, key=lambda x: v[x])
    te = _top1_hits(params, CT, test, [0.0, best])
    out = {"shape": a.shape, "budget": a.budget, "threads": a.threads, "epochs": int(net.epoch),
           "train_seconds": train_s, "centroid_build_seconds": build_s, "centroid_nnz": int(C.nnz),
           "valid_P@1": {str(k): x for k, x in v.items()}, "best_alpha": best,
           "test_P@1": {"network": te[0.0], "mix": te[best], "centroids": te["centroids"]}}
    path = RESULTS / f"centroid_mix_{a.shape}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"{net.epoch} epochs in {train_s:.0f} s; centroids: {C.nnz:,} non-zeros built in {build_s:.1f} s")
    print(f"{'alpha':>10} {'valid P@1':>9}")
    for k in alphas:
        print(f"{k:10g} {v[k]:9.4f}" + ("  <- chosen" if k == best else ""))
    print(f"{'centroids':>10} {v['centroids']:9.4f}")
    print(f"test P@1: network {te[0.0]:.4f}, network + {best:g} x centroid score {te[best]:.4f}, "
          f"centroids alone {te['centroids']:.4f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
