"""Amazon-670K-shaped data: slide against the dense PyTorch baseline on the same threads.

    python benchmarks/bench_amazon.py [--budget 120] [--torch-budget 1200] [--train 40000] [--threads 2]

Generates synthetic data with the shape of Amazon-670K (``slide.datasets`` preset
``amazon-670k``: 135,909 features, 670,091 labels; ``--train`` / ``--test`` points), then trains,
each in its own subprocess (so that each peak RSS is clean):

* slide: the shipped ``datasets/synth-amazon-670k.yaml`` (hash-sampled output layer);
* torch: :class:`slide.baselines.torch_dense.TorchDenseTrainer` with the same config (the same
  network trained on every output neuron with fused Adam).

slide trains for ``--budget`` seconds of training time (the clock pauses while evaluating), the
dense network for ``--torch-budget`` seconds (default: the same), and both report P@1 on the same ``--eval`` test points at the marks ``--marks`` (default 30, 60, 120
seconds and the end of each budget), training samples per second and peak RSS, and when slide
first reached the dense network's final P@1. The most-frequent-labels answer is printed for
reference. Prints a table and writes benchmarks/results/amazon.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "amazon.json"
CONFIG = ROOT / "datasets" / "synth-amazon-670k.yaml"


def _load(data_dir: Path):
    return [sp.load_npz(data_dir / f"{n}.npz").tocsr() for n in ("xtr", "ytr", "xte", "yte")]


def _config(threads: int, seed: int):
    import slide
    cfg = slide.Config.from_yaml(CONFIG)
    cfg.data.train = cfg.data.test = None
    cfg.training.threads = threads
    cfg.training.seed = seed
    cfg.training.epochs = 1000  # the time budget stops training
    return cfg


def _peak_rss_mb() -> float:
    from slide._util import peak_rss_bytes

    return peak_rss_bytes() / 2**20


# ----------------------------------------------------------------------------- workers


def run_slide(args, data_dir: Path) -> dict:
    import slide
    from slide import metrics
    xtr, ytr, xte, yte = _load(data_dir)
    cfg = _config(args.threads, args.seed)
    marks = sorted(m for m in args.marks if m < args.budget) + [args.budget]
    records = []

    class Clock(slide.callbacks.Callback):
        def __init__(self):
            self.start = time.perf_counter()
            self.paused = 0.0
            self.samples = 0
            self.next = 0

        def on_batch_end(self, net, step, loss):
            self.samples += cfg.training.batch_size
            seconds = time.perf_counter() - self.start - self.paused
            if seconds < marks[self.next]:
                return
            t = time.perf_counter()
            top, _ = net.predict(xte, k=5)
            m = metrics.evaluate(top, yte)
            self.paused += time.perf_counter() - t
            records.append({"seconds": seconds, "step": int(step), "samples": self.samples,
                            "samples_per_second": self.samples / seconds, "loss": float(loss),
                            "P@1": float(m["P@1"]), "P@5": float(m["P@5"])})
            while self.next < len(marks) and seconds >= marks[self.next]:
                self.next += 1
            if self.next == len(marks):
                net.stop_training = True

    net = slide.Network(cfg)
    net.fit((xtr, ytr), callbacks=[Clock()])
    return {"records": records, "peak_rss_mb": _peak_rss_mb(), "config": cfg.to_dict()}


def run_torch(args, data_dir: Path) -> dict:
    from slide.baselines.torch_dense import TorchDenseTrainer
    xtr, ytr, xte, yte = _load(data_dir)
    cfg = _config(args.threads, args.seed)
    trainer = TorchDenseTrainer(cfg, xtr.shape[1], ytr.shape[1], device="cpu")
    marks = sorted(m for m in args.marks if m < args.budget)
    recs = trainer.fit_for((xtr, ytr), seconds=args.budget, test=(xte, yte), eval_at=marks,
                           propensities=np.ones(ytr.shape[1]))
    records = [{"seconds": r["seconds"], "step": r["step"], "samples": r["samples"],
                "samples_per_second": r["samples"] / r["seconds"] if r["seconds"] else float("nan"),
                "loss": float(r["loss"]), "P@1": float(r["P@1"]), "P@5": float(r["P@5"])}
               for r in recs]
    return {"records": records, "peak_rss_mb": _peak_rss_mb(), "optimizer": trainer.optimizer_impl}


# ----------------------------------------------------------------------------- driver


def _at(records, mark):
    """P@1 of the evaluation at `mark` seconds: the first one at or past it (both systems
    evaluate at the first batch boundary past each mark); None when training ended before."""
    for r in records:
        if r["seconds"] >= mark - 1e-6:
            return r["P@1"]
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=120.0, help="training seconds of slide (and torch by default)")
    ap.add_argument("--torch-budget", type=float, default=None, help="training seconds of the dense network")
    ap.add_argument("--train", type=int, default=40000, help="training points")
    ap.add_argument("--test", type=int, default=500, help="test points evaluated at each mark")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--marks", type=float, nargs="*", default=[30.0, 60.0, 120.0])
    ap.add_argument("--systems", nargs="*", default=["slide", "torch"], choices=["slide", "torch"])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--worker", choices=["slide", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        result = (run_slide if args.worker == "slide" else run_torch)(args, args.data)
        print("RESULT " + json.dumps(result))
        return 0

    from slide import metrics
    from slide.datasets.synthetic import make_synthetic_arrays
    t0 = time.perf_counter()
    xtr, ytr, xte, yte = make_synthetic_arrays("amazon-670k", seed=args.seed, num_train=args.train,
                                               num_test=args.test)
    gen_seconds = time.perf_counter() - t0
    frequent = np.argsort(-np.asarray(ytr.sum(axis=0)).ravel(), kind="stable")[:5]
    baseline = metrics.evaluate(np.tile(frequent, (xte.shape[0], 1)), yte)["P@1"]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-amazon-") as tmp:
        data_dir = Path(tmp)
        for name, m in (("xtr", xtr), ("ytr", ytr), ("xte", xte), ("yte", yte)):
            sp.save_npz(data_dir / f"{name}.npz", m)
        budgets = {"slide": args.budget, "torch": args.torch_budget or args.budget}
        passthrough = ["--threads", str(args.threads), "--seed", str(args.seed), "--marks", *map(str, args.marks)]
        for system in args.systems:
            cmd = [sys.executable, __file__, "--worker", system, "--data", str(data_dir), "--budget",
                   str(budgets[system]), *passthrough]
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                print(f"{system} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
                return 1
            results[system] = json.loads(lines[-1][len("RESULT "):])
            results[system]["wall_seconds"] = time.perf_counter() - t

    longest = max(budgets[system] for system in args.systems)
    marks = sorted(set(m for m in args.marks if m < longest) | {budgets[system] for system in args.systems})
    header = f"{'system':8} {'samples/s':>10} {'peak RSS MB':>12} " + " ".join(f"{'P@1 ' + format(m, 'g') + 's':>10}" for m in marks)
    print(f"amazon-670k-shaped synthetic: {args.train} train / {args.test} test points, "
          f"{xtr.shape[1]} features, {ytr.shape[1]} labels, {args.threads} threads")
    print(f"most-frequent-labels P@1: {baseline:.4f}")
    print(header)
    for system, r in results.items():
        last = r["records"][-1] if r["records"] else {}
        cells = " ".join(f"{_at(r['records'], m) if _at(r['records'], m) is not None else float('nan'):>10.4f}"
                         for m in marks)
        print(f"{system:8} {last.get('samples_per_second', float('nan')):>10.0f} {r['peak_rss_mb']:>12.0f} {cells}")
    if "slide" in results and "torch" in results:
        s = results["slide"]["records"][-1]["samples_per_second"]
        t = results["torch"]["records"][-1]["samples_per_second"]
        print(f"slide / torch samples per second: {s / t:.1f}x")
        target = results["torch"]["records"][-1]["P@1"]
        reached = next((r["seconds"] for r in results["slide"]["records"] if r["P@1"] >= target), None)
        results["slide"]["seconds_to_torch_final_P@1"] = reached
        print(f"torch's final P@1 ({target:.4f} after {budgets['torch']:g} s): slide first reached it at "
              + (f"{reached:.0f} s" if reached is not None else "- (not within its budget)"))

    out = {
        "version": 1,
        "dataset": {"preset": "amazon-670k", "train_points": args.train, "test_points": args.test,
                    "num_features": int(xtr.shape[1]), "num_labels": int(ytr.shape[1]),
                    "generate_seconds": round(gen_seconds, 2)},
        "budget_seconds": {system: budgets[system] for system in args.systems}, "marks": marks, "threads": args.threads, "seed": args.seed,
        "most_frequent_P@1": baseline,
        "command": "python benchmarks/bench_amazon.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "systems": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
