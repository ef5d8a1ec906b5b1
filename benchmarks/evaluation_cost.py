"""What evaluations cost the default fit on a wide output layer.

    python benchmarks/evaluation_cost.py [--train 20000] [--test 10000] [--labels 20000] [--threads 2]

Generates data of the ``synth-20k`` shape (``slide.datasets.make_synthetic``, seed 0; 50,000
features, about 4 labels and 60 non-zeros a point) with ``--train`` training and ``--test`` test
points and ``--labels`` labels, and fits the default network on it with the test split, as
``slide train`` does (``epochs: auto``; the test split shown during training as
``training.test_every`` says). Reports the wall seconds of the fit against its training seconds,
the epochs that evaluated the test split and what those evaluations took, and the final test
P@1/3/5. Then, on the trained network and the test rows, times ``predict(k=5)`` (with the
label-centroid term the fit chose) and the term's choice of weight
(``slide.centroids.choose_weight``, as the search takes it at each new best), best of three.
Prints a table and writes ``benchmarks/results/evaluation_cost.json``.
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
RESULTS = ROOT / "benchmarks" / "results" / "evaluation_cost.json"


def best_of_three(fn) -> float:
    seconds = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t)
    return min(seconds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--test", type=int, default=10000)
    ap.add_argument("--labels", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    import slide
    from slide import centroids

    train, test = slide.datasets.make_synthetic("synth-20k", seed=0, num_train=args.train, num_test=args.test,
                                                num_labels=args.labels)
    net = slide.Network({"training": {"threads": args.threads}})
    t = time.perf_counter()
    history = net.fit(train, test=test)
    wall = time.perf_counter() - t
    tested = [r for r in history.records if "test/P@1" in r]
    final = net.evaluate(test)
    row = {"train": args.train, "test": args.test, "labels": args.labels, "threads": args.threads,
           "fit_wall_seconds": round(wall, 1), "train_seconds": round(net._train_seconds, 1),
           "epochs": len(history.records), "test_evaluations": len(tested),
           # (a build from before the test evaluations were timed has no figure)
           "test_evaluation_seconds": round(getattr(net, "_test_seconds", float("nan")), 1),
           "best_epoch": history.best_epoch, "refit_epochs": history.refit_epochs,
           "centroid_weight": net.centroid_weight,
           **{k: round(float(final[k]), 4) for k in ("P@1", "P@3", "P@5")}}
    arrays = net._convert(test.features.tocsr(), test.labels.tocsr())
    row["predict_seconds"] = round(best_of_three(lambda: net.predict(test.features, k=5)), 3)
    if net._centroids is not None:
        row["choose_weight_seconds"] = round(
            best_of_three(lambda: centroids.choose_weight(net, arrays, net._centroids)), 3)
    print(json.dumps(row), flush=True)
    print("\n| train / test points | labels | fit wall s | training s | epochs | test evaluations (s) "
          "| predict k=5 s | choose_weight s | test P@1 / P@3 / P@5 |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {row['train']:,} / {row['test']:,} | {row['labels']:,} | {row['fit_wall_seconds']} | "
          f"{row['train_seconds']} | {row['epochs']} | {row['test_evaluations']} ({row['test_evaluation_seconds']}) | "
          f"{row['predict_seconds']} | {row.get('choose_weight_seconds', '-')} | "
          f"{row['P@1']:.4f} / {row['P@3']:.4f} / {row['P@5']:.4f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(["python", "benchmarks/evaluation_cost.py"]
                                                               + list(argv if argv is not None else sys.argv[1:])),
                                          "machine": platform.processor() or platform.machine(),
                                          "cpus": os.cpu_count(), "rows": [row]}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
