"""Where ``sampling: auto`` switches the output layer to LSH: dense against hash-sampled, by label count.

    python benchmarks/sampling_auto.py [--labels 5000,10000,20000] [--hidden 1024] [--epochs 3]
        [--extra 10000:128,20000:128]

For each label count, generates ``make_synthetic("synth-20k", num_labels=N)`` (50,000 features,
50,000 training points, about 4 labels and 60 non-zeros a point, seed 0), holds out 10,000
training points as the validation split (numpy seed 7) and trains the default configuration
on the other 40,000 for ``--epochs`` epochs twice, each in a fresh process, one after the other:
with ``layers.1.sampling: dense`` (what ``auto`` gives a dense output layer: per-label sigmoid)
and with ``lsh`` (softmax over the hash-selected neurons, the default lsh settings). Validation
P@1 after every epoch and the training seconds (evaluations not counted) are recorded; the
test file is never read. ``--extra N:H`` adds the same pair with ``H`` hidden units on N labels.

``--whole N:T`` (default ``12000:3000``, empty to skip) runs the whole default ``fit`` (epochs
auto, refit, label term) both ways on a small generated set of N labels and T training points
(seed 1; its 1,000 generated test points, drawn like the training points, score it): the regime
of few points a label, where a dense output layer has the fewest samples to spend its cost on.
Prints a table and writes ``benchmarks/results/sampling_auto.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "sampling_auto.json"
VALID, SPLIT_SEED = 10_000, 7


def worker(data: str, sampling: str, hidden: int, epochs: int, threads: int) -> dict:
    """Train one network on the fitting split of ``data``; its validation curve as a dict."""
    import numpy as np

    import slide

    train = slide.load_dataset(os.path.join(data, "train.txt"))
    idx = np.random.default_rng(SPLIT_SEED).permutation(train.num_points)
    valid, fit = idx[:VALID], idx[VALID:]
    X, Y = train.features, train.labels
    net = slide.Network(None, hidden=hidden, sampling=sampling, threads=threads)
    h = net.fit((X[fit], Y[fit]), epochs=epochs, valid=(X[valid], Y[valid]))
    return {"sampling": net.resolved_sampling[-1], "activation": net.config.layers[-1].activation,
            "hidden": hidden, "valid_P@1": [r["valid/P@1"] for r in h.records],
            "train_seconds": [round(r["seconds"], 2) for r in h.records]}


def whole(labels: int, points: int, sampling: str, threads: int) -> dict:
    """The default fit (epochs auto) on a small generated set; test P@1 and seconds."""
    import time

    import slide

    train, test = slide.datasets.make_synthetic("synth-20k", seed=1, num_labels=labels, num_train=points,
                                                num_test=1000)
    net = slide.Network(None, sampling=sampling, threads=threads)
    t = time.perf_counter()
    h = net.fit(train)
    seconds = time.perf_counter() - t
    return {"labels": labels, "train_points": points, "sampling": net.resolved_sampling[-1],
            "activation": net.config.layers[-1].activation, "fit_seconds": round(seconds, 1),
            "best_epoch": h.best_epoch, "refit_epochs": h.refit_epochs,
            "P@1": net.evaluate(test)["P@1"]}


def run_worker(args: list, what: str, cwd: str) -> dict:
    """Runs this script with ``args`` (a worker flag and its values) in a fresh process; its row."""
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=cwd)
    if p.returncode != 0:
        raise SystemExit(f"{what}: {p.stderr.strip()[-2000:]}")
    row = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", default="5000,10000,20000")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--extra", default="10000:128,20000:128", help="N:H pairs run with H hidden units")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--whole", default="12000:3000", help="N:T pairs: the whole default fit, dense and lsh")
    ap.add_argument("--worker", nargs=3, metavar=("DATA", "SAMPLING", "HIDDEN"), help=argparse.SUPPRESS)
    ap.add_argument("--whole-worker", nargs=3, metavar=("N", "T", "SAMPLING"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        data, sampling, hidden = args.worker
        print(json.dumps(worker(data, sampling, int(hidden), args.epochs, args.threads)))
        return 0
    if args.whole_worker:
        n, t, sampling = args.whole_worker
        print(json.dumps(whole(int(n), int(t), sampling, args.threads)))
        return 0
    import slide

    runs = [(int(n), args.hidden) for n in args.labels.split(",") if n]
    runs += [tuple(int(v) for v in pair.split(":")) for pair in args.extra.split(",") if pair]
    rows = []
    with tempfile.TemporaryDirectory(prefix="slide-sampling-") as tmp:
        for labels, hidden in runs:
            data = os.path.join(tmp, f"labels-{labels}")
            if not os.path.exists(data):
                slide.datasets.write_synthetic("synth-20k", data, num_labels=labels)
            for sampling in ("dense", "lsh"):
                row = run_worker(["--worker", data, sampling, str(hidden), "--epochs", str(args.epochs),
                                  "--threads", str(args.threads)], f"{labels} labels, {sampling}", tmp)
                rows.append({"labels": labels, **row})
    whole_rows = []
    for pair in [p for p in args.whole.split(",") if p]:
        n, t = pair.split(":")
        for sampling in ("dense", "lsh"):
            whole_rows.append(run_worker(["--whole-worker", n, t, sampling, "--threads", str(args.threads)],
                                         f"--whole {pair}, {sampling}", tempfile.gettempdir()))
    print(f"\nvalidation P@1 after each of {args.epochs} epochs (training seconds at the end)\n")
    print("| labels | hidden | output layer | validation P@1 by epoch | train s |")
    print("|---|---|---|---|---|")
    for r in rows:
        curve = " / ".join(f"{p:.4f}" for p in r["valid_P@1"])
        print(f"| {r['labels']:,} | {r['hidden']} | {r['activation']} ({r['sampling']}) | {curve} | "
              f"{r['train_seconds'][-1]:.1f} |")
    if whole_rows:
        print("\nthe whole default fit (epochs auto) on a small set, scored on its generated test points\n")
        print("| labels | training points | output layer | fit s | best epoch | refit epochs | P@1 |")
        print("|---|---|---|---|---|---|---|")
        for r in whole_rows:
            print(f"| {r['labels']:,} | {r['train_points']:,} | {r['activation']} ({r['sampling']}) | "
                  f"{r['fit_seconds']:.1f} | {r['best_epoch']} | {r['refit_epochs']} | {r['P@1']:.4f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                          "cpus": os.cpu_count(), "threads": args.threads,
                                          "epochs": args.epochs, "rows": rows,
                                          "whole": whole_rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
