"""The label-centroid term (``layers[-1].centroid_weight``, slide.centroids) on a wide synthetic shape.

    python benchmarks/centroid_mix.py [--shape amazon-670k] [--budget 300] [--model PATH]

On the split of ``benchmarks/wide_shapes.py`` (the same cached files: 90,000 points to fit,
10,000 held out for validation, 10,000 test points), trains ``datasets/synth-<shape>.yaml`` with
the term off for ``--budget`` seconds of training (2 threads; ``--model PATH`` saves the network
there, or loads it when the file exists, to measure again without training), then builds the
label centroids of the fitting points as ``fit`` does and chooses the weight on the validation
split with :func:`slide.centroids.choose_weight` (each weight of ``slide.centroids.WEIGHTS``).
The test split is scored once with the network alone and once with the chosen weight, in exact
and in index mode, with the seconds each took. Prints a table and writes
``benchmarks/results/centroid_mix_<shape>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wide_shapes import RESULTS, ROOT, _data  # noqa: E402  (the same cached split)


def main(argv=None) -> int:
    import slide
    from slide import centroids

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="amazon-670k")
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="save the trained network here, or load it if the file exists")
    a = ap.parse_args(argv)
    paths = _data(a.shape, 100_000, 10_000, 10_000, 0)
    fit, valid, test = (slide.load_dataset(paths[k]) for k in ("fit", "valid", "test"))
    train_s = None
    if a.model and os.path.exists(a.model):
        net = slide.Network.load(a.model, threads=a.threads)
    else:
        cfg = slide.Config.load(str(ROOT / "datasets" / f"synth-{a.shape}.yaml"))
        cfg.training.threads = a.threads
        cfg.training.time_budget = a.budget
        cfg.training.epochs = 10 ** 6      # the budget stops training
        cfg.training.eval_every = 0
        cfg.data.valid_fraction = 0.0
        cfg.layers[-1].centroid_weight = 0.0
        net = slide.Network(cfg)
        t = time.perf_counter()
        net.fit(fit)
        train_s = time.perf_counter() - t
        if a.model:
            net.save(a.model)
    t = time.perf_counter()
    net._build_centroids(net._convert(fit.features.tocsr(), fit.labels.tocsr()))
    build_s = time.perf_counter() - t
    valid_arrays = net._convert(valid.features.tocsr(), valid.labels.tocsr())
    t = time.perf_counter()
    weight, p1 = centroids.choose_weight(net, valid_arrays, net._centroids)
    choose_s = time.perf_counter() - t
    rows = []
    for mode in ("exact", "index"):
        for w in (0.0, weight):
            net.centroid_weight = w
            t = time.perf_counter()
            m = net.evaluate(test, mode=mode)
            rows.append({"mode": mode, "weight": w, "seconds": time.perf_counter() - t,
                         **{k: m[k] for k in ("P@1", "P@3", "P@5", "PSP@1", "PSP@5")}})
    out = {"shape": a.shape, "budget": a.budget, "threads": a.threads, "epochs": int(net.epoch),
           "train_seconds": train_s, "centroid_build_seconds": build_s, "centroid_nnz": int(net._centroids.nnz),
           "max_features": centroids.MAX_FEATURES if net.num_labels > centroids.FULL_LABELS else None,
           "pool": centroids.POOL, "choose_seconds": choose_s, "valid_P@1": {str(k): v for k, v in p1.items()},
           "chosen_weight": weight, "test": rows}
    path = RESULTS / f"centroid_mix_{a.shape}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"{net.epoch} epochs" + (f" in {train_s:.0f} s" if train_s else " (loaded)")
          + f"; centroids: {net._centroids.nnz:,} non-zeros built in {build_s:.1f} s; weight chosen in {choose_s:.0f} s")
    print("validation P@1 by weight: " + ", ".join(f"{k:g}: {v:.4f}" for k, v in p1.items()) + f" -> {weight:g}")
    print(f"{'mode':6} {'weight':>6} {'P@1':>7} {'P@3':>7} {'P@5':>7} {'PSP@1':>7} {'PSP@5':>7} {'test s':>7}")
    for r in rows:
        print(f"{r['mode']:6} {r['weight']:6g} {r['P@1']:7.4f} {r['P@3']:7.4f} {r['P@5']:7.4f} "
              f"{r['PSP@1']:7.4f} {r['PSP@5']:7.4f} {r['seconds']:7.1f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
