"""What evaluations cost the default fit on a wide output layer.

    python benchmarks/evaluation_cost.py [--train 20000] [--test 10000] [--labels 20000] [--threads 2]
    python benchmarks/evaluation_cost.py --preset amazon-670k --config datasets/synth-amazon-670k.yaml \
        --train 100000 --test 5000 --epochs 1 --modes index,exact
    python benchmarks/evaluation_cost.py --set training.refit=false     # the fit that keeps a best copy

Generates data of a preset's shape (``slide.datasets.make_synthetic``, seed 0; by default
``synth-20k``: 50,000 features, about 4 labels and 60 non-zeros a point) with ``--train`` training
and ``--test`` test points (and ``--labels`` labels), and fits the default network on it (or
``--config``'s layers and settings, its data section ignored, then each ``--set KEY=VALUE``, as
``slide train --set`` takes them) with the test split, as ``slide train`` does (``--epochs``, default ``auto``; the test split shown during training as
``training.test_every`` says). Reports the wall seconds of the fit against its training seconds,
the epochs that evaluated the test split and what those evaluations took, the process's peak
RSS after the fit, and the final test P@1/3/5. Then, on the trained network and the test rows, times ``predict(k=5)`` in each of
``--modes`` (with the label-centroid term the fit chose or the config sets) and, on a network
with the term, its choice of weight (``slide.centroids.choose_weight``, as the search takes it at
each new best), best of three. Prints a table and writes ``benchmarks/results/evaluation_cost.json``.
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
    ap.add_argument("--preset", default="synth-20k")
    ap.add_argument("--config", help="a yaml whose layers and settings to train (its data section is ignored)")
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--test", type=int, default=10000)
    ap.add_argument("--labels", type=int, help="labels (default: the preset's)")
    ap.add_argument("--epochs", default="auto", help="auto (default) or a number")
    ap.add_argument("--modes", default="exact", help="prediction modes timed (exact, index, lsh)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config setting on top of --config (repeatable), e.g. training.refit=false")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    import slide
    from slide import centroids

    shape = {"num_labels": args.labels} if args.labels else {}
    train, test = slide.datasets.make_synthetic(args.preset, seed=0, num_train=args.train, num_test=args.test,
                                                **shape)
    spec = {}
    if args.config:
        import yaml

        spec = yaml.safe_load(Path(args.config).read_text()) or {}
        spec.pop("data", None)
    spec.setdefault("training", {})["threads"] = args.threads
    net = slide.Network(slide.Config.from_dict(spec).with_overrides(args.set))
    epochs = args.epochs if args.epochs == "auto" else int(args.epochs)
    t = time.perf_counter()
    history = net.fit(train, epochs=epochs, test=test)
    wall = time.perf_counter() - t
    from slide._util import peak_rss_bytes

    peak_mib = peak_rss_bytes() / 2 ** 20
    tested = [r for r in history.records if "test/P@1" in r]
    final = net.evaluate(test)
    row = {"preset": args.preset, "config": args.config, "set": args.set, "train": args.train, "test": args.test,
           "labels": int(net.num_labels), "threads": args.threads, "epochs_asked": args.epochs,
           "fit_wall_seconds": round(wall, 1), "train_seconds": round(net._train_seconds, 1),
           "epochs": len(history.records), "test_evaluations": len(tested),
           # (a build from before the test evaluations were timed has no figure)
           "test_evaluation_seconds": round(getattr(net, "_test_seconds", float("nan")), 1),
           "best_epoch": history.best_epoch, "refit_epochs": history.refit_epochs,
           "centroid_weight": net.centroid_weight, "peak_rss_mib": round(peak_mib),
           **{k: round(float(final[k]), 4) for k in ("P@1", "P@3", "P@5")}}
    arrays = net._convert(test.features.tocsr(), test.labels.tocsr())
    for mode in args.modes.split(","):
        row[f"predict_{mode}_seconds"] = round(best_of_three(lambda: net.predict(test.features, k=5, mode=mode)), 3)
    if net._centroids is not None and net.centroid_weight:
        row["choose_weight_seconds"] = round(
            best_of_three(lambda: centroids.choose_weight(net, arrays, net._centroids)), 3)
    print(json.dumps(row), flush=True)
    modes = args.modes.split(",")
    print("\n| preset | train / test points | labels | fit wall s | training s | epochs | test evaluations (s) | "
          + " | ".join(f"predict {m} s" for m in modes) + " | choose_weight s | peak RSS MiB | test P@1 / P@3 / P@5 |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(modes) + "---|---|---|")
    print(f"| {row['preset']} | {row['train']:,} / {row['test']:,} | {row['labels']:,} | {row['fit_wall_seconds']} | "
          f"{row['train_seconds']} | {row['epochs']} | {row['test_evaluations']} ({row['test_evaluation_seconds']}) | "
          + " | ".join(str(row[f"predict_{m}_seconds"]) for m in modes)
          + f" | {row.get('choose_weight_seconds', '-')} | {row['peak_rss_mib']} | {row['P@1']:.4f} / {row['P@3']:.4f} / {row['P@5']:.4f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(["python", "benchmarks/evaluation_cost.py"]
                                                               + list(argv if argv is not None else sys.argv[1:])),
                                          "machine": platform.processor() or platform.machine(),
                                          "cpus": os.cpu_count(), "rows": [row]}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
