"""Choose slide's default training settings on validation splits of the training sets only.

    python benchmarks/tune_defaults.py [--rounds 2] [--seeds 2] [--workers 2]

The candidates are scored on the two bundled real data sets (``datasets/bibtex``,
``datasets/delicious``): each training set is split 80/20 into a fitting part and a validation
part (``--seeds`` different splits, each also seeding the network), a network is trained on the
fitting part for up to ``--max-epochs`` epochs and its validation P@1 is recorded after every
epoch. A candidate's score is the mean validation P@1 over data sets and splits at the epoch
count where that mean is highest (so ``training.epochs`` is chosen too).

Search: coordinate-wise from ``START`` (one setting at a time over its values in ``AXES``,
for ``--rounds`` rounds); a value replaces the current one only when it raises the score by at
least ``--min-gain`` (0.001: differences below that are within the spread of the splits, and the
search should not change a setting on noise). The test files are read only after the search has
finished: the chosen settings are trained on the full training sets (three seeds) and evaluated
once, next to the starting point, so the table shows what the search changed on unseen data.

Prints the search log and the final table; writes ``benchmarks/results/tune_defaults.json``.
Every run uses one thread (bit-identical runs); ``--workers`` runs that many at once.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "tune_defaults.json"
DATASETS = ("bibtex", "delicious")

# The settings searched, with the values tried for each (keys of slide.Network keyword arguments).
AXES = {
    "hidden": [256, 512, 1024],
    "dropout": [0.4, 0.5, 0.6, 0.7],
    "lr": [2e-3, 4e-3, 8e-3],
    "lr_decay": [0.8, 0.85, 0.9, 1.0],
    "weight_decay": [0.0, 0.01, 0.1],
    "normalize": ["none", "l2", "tfidf_l2"],
}
# Where the search starts: the defaults before this search was run.
START = {"hidden": 512, "dropout": 0.6, "lr": 4e-3, "lr_decay": 0.85, "weight_decay": 0.0, "normalize": "l2"}

_CACHE = {}


def _data(name: str, part: str):
    import slide

    key = (name, part)
    if key not in _CACHE:
        _CACHE[key] = slide.load_dataset(ROOT / "datasets" / name / f"{part}.txt")
    return _CACHE[key]


def _split(n: int, seed: int):
    perm = np.random.default_rng([seed, 0x5E1EC7]).permutation(n)
    cut = n // 5
    return np.sort(perm[cut:]), np.sort(perm[:cut])


def validation_curve(job):
    """Validation P@1 after each epoch for one (data set, split seed, settings)."""
    import slide

    name, seed, params, max_epochs = job
    train = _data(name, "train")
    fit_rows, valid_rows = _split(len(train), seed)
    net = slide.Network(threads=1, seed=seed, epochs=max_epochs, restore_best=False, **params)
    hist = net.fit(train[fit_rows], valid=train[valid_rows])
    return [float(v) for v in hist["valid/P@1"]]


def test_scores(job):
    """Test P@1/3/5 after training on the full training set (read only after the search)."""
    import slide

    name, seed, params, epochs = job
    net = slide.Network(threads=1, seed=seed, epochs=epochs, **params)
    t = time.perf_counter()
    net.fit(_data(name, "train"))
    seconds = time.perf_counter() - t
    m = net.evaluate(_data(name, "test"))
    return {"P@1": m["P@1"], "P@3": m["P@3"], "P@5": m["P@5"], "train_seconds": seconds}


def _key(params) -> str:
    return json.dumps(params, sort_keys=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2, help="validation splits per data set")
    ap.add_argument("--max-epochs", type=int, default=15)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--min-gain", type=float, default=0.001,
                    help="smallest gain in mean validation P@1 that changes a setting")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    scored = {}  # settings key -> {"params", "curve" (mean over runs), "score", "epochs"}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:

        def score_all(candidates):
            todo = [p for p in candidates if _key(p) not in scored]
            jobs = [(name, seed, p, args.max_epochs) for p in todo for name in DATASETS for seed in range(args.seeds)]
            curves = list(pool.map(validation_curve, jobs))
            per = len(DATASETS) * args.seeds
            for i, p in enumerate(todo):
                runs = np.array(curves[i * per:(i + 1) * per])
                mean = runs.mean(axis=0)
                best = int(np.argmax(mean))
                by_data = {name: runs[j * args.seeds:(j + 1) * args.seeds, best].mean().round(4).item()
                           for j, name in enumerate(DATASETS)}
                scored[_key(p)] = {"params": p, "curve": mean.round(4).tolist(), "score": float(mean[best]),
                                   "epochs": best + 1, "valid_P@1": by_data}
            return [scored[_key(p)] for p in candidates]

        current = dict(START)
        best = score_all([current])[0]
        print(f"start {current}: valid P@1 {best['score']:.4f} at {best['epochs']} epochs", flush=True)
        log = [{"round": 0, "axis": None, "params": dict(current), "score": best["score"]}]
        for rnd in range(1, args.rounds + 1):
            changed = False
            for axis, values in AXES.items():
                candidates = [dict(current, **{axis: v}) for v in values]
                results = score_all(candidates)
                here = scored[_key(current)]["score"]
                top = max(results, key=lambda r: (r["score"], r["params"] == current))
                if top["score"] < here + args.min_gain:
                    top = scored[_key(current)]
                cells = "  ".join(f"{r['params'][axis]}: {r['score']:.4f}@{r['epochs']}" for r in results)
                print(f"round {rnd} {axis:12} {cells}  -> {top['params'][axis]}", flush=True)
                if top["params"] != current:
                    changed = True
                current = dict(top["params"])
                log.append({"round": rnd, "axis": axis, "params": dict(current), "score": top["score"],
                            "tried": {str(r["params"][axis]): r["score"] for r in results}})
            if not changed:
                break
        chosen = scored[_key(current)]
        start = scored[_key(START)]
        search_seconds = time.perf_counter() - t0
        print(f"chosen {current}: valid P@1 {chosen['score']:.4f} at {chosen['epochs']} epochs "
              f"({len(scored)} settings, {search_seconds:.0f} s)", flush=True)

        # The test files are opened from here on only.
        final = {}
        for label, entry in (("start", start), ("chosen", chosen)):
            jobs = [(name, seed, entry["params"], entry["epochs"]) for name in DATASETS for seed in range(3)]
            res = list(pool.map(test_scores, jobs))
            final[label] = {name: res[j * 3:(j + 1) * 3] for j, name in enumerate(DATASETS)}

    print()
    print("| settings | epochs | data set | valid P@1 (search) | test P@1 (3 seeds: mean, min-max) | P@3 | P@5 |")
    print("|---|---|---|---|---|---|---|")
    for label, entry in (("start", start), ("chosen", chosen)):
        for name in DATASETS:
            runs = final[label][name]
            p1 = [r["P@1"] for r in runs]
            print(f"| {label} | {entry['epochs']} | {name} | {entry['valid_P@1'][name]:.4f} | "
                  f"{np.mean(p1):.4f} ({min(p1):.4f}-{max(p1):.4f}) | "
                  f"{np.mean([r['P@3'] for r in runs]):.4f} | {np.mean([r['P@5'] for r in runs]):.4f} |")

    out = {"version": 1, "date": time.strftime("%Y-%m-%d"), "machine": {"platform": platform.platform(),
                                                                          "cpus": os.cpu_count()},
           "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
           "axes": AXES, "start": START, "max_epochs": args.max_epochs, "seeds": args.seeds,
           "min_gain": args.min_gain,
           "search_seconds": round(search_seconds, 1), "log": log,
           "chosen": {"params": current, "epochs": chosen["epochs"], "valid_score": chosen["score"],
                      "valid_P@1": chosen["valid_P@1"]},
           "scored": list(scored.values()), "test": final}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
