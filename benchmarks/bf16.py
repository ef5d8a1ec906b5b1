"""bf16 storage against float32, side by side in one run: accuracy, model state, speed.

    python benchmarks/bf16.py [--threads 2] [--repeats 2] [--amazon-train 20000] [--quick]

For each data set the same configuration is trained twice per repeat, once with every
layer that may store bf16 (the first and the output layer) at ``precision: fp32`` and once at
``precision: bf16``, alternating fp32/bf16 then bf16/fp32 so that drift of a shared machine
falls on both. Reported per precision: test P@1 (exact scoring, first repeat), model state
(weights, biases and Adam moments from ``memory_report``), training samples per second (the
median over the repeats) and the kernels that ran. Data:

* Delicious (bundled, ``datasets/delicious.yaml``): the default network (1024 ReLU, dense
  983-label output; the batched dense path), ``--delicious-epochs`` epochs;
* Amazon-670K-shaped synthetic data (``slide.datasets.make_synthetic("amazon-670k")`` with
  ``--amazon-train`` / ``--amazon-test`` points) trained with ``datasets/synth-amazon-670k.yaml``
  (128 ReLU, hash-sampled 670,091-label output), ``--amazon-epochs`` epochs.

Prints a table and writes benchmarks/results/bf16.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import slide  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bf16.json"


def _run(cfg, train, test, precision, threads, epochs):
    net = slide.Network(cfg, precision=precision, threads=threads, epochs=epochs, seed=0)
    t0 = time.perf_counter()
    hist = net.fit(train)
    wall = time.perf_counter() - t0
    rec = hist.records[-1] if hist.records else {}
    samples = epochs * len(train)
    rep = net.memory_report()
    state = int(rep["weights"] + rep["optimizer"])
    t1 = time.perf_counter()
    p1 = float(net.evaluate(test, k=1)["P@1"])
    eval_s = time.perf_counter() - t1
    sps = float(rec.get("samples_per_second", samples / wall))
    return {"P@1": p1, "state_bytes": state, "samples_per_second": sps, "fit_seconds": wall,
            "eval_seconds": eval_s, "bf16_kernels": net._core.bf16_isa, "kernels": net._core.kernel_isa,
            # the engine defaults for wide output layers (README: engine settings)
            "shared_negatives": bool(net._core.uses_shared_negatives),
            "rebuild_spread": int(net._core.rebuild_spread)}


def _compare(name, cfg, train, test, threads, epochs, repeats):
    runs = {"fp32": [], "bf16": []}
    for r in range(repeats):
        order = ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")
        for prec in order:
            res = _run(cfg, train, test, prec, threads, epochs)
            print(f"  {name} repeat {r} {prec}: P@1 {res['P@1']:.4f}  {res['samples_per_second']:.0f} samples/s  "
                  f"state {res['state_bytes'] / 2**20:.1f} MiB", flush=True)
            runs[prec].append(res)
    out = {}
    for prec, rs in runs.items():
        out[prec] = dict(rs[0])
        out[prec]["samples_per_second"] = statistics.median(x["samples_per_second"] for x in rs)
        out[prec]["samples_per_second_runs"] = [x["samples_per_second"] for x in rs]
        out[prec]["P@1_runs"] = [x["P@1"] for x in rs]
    out["ratio"] = {
        "P@1_diff": out["bf16"]["P@1"] - out["fp32"]["P@1"],
        "state_bytes": out["bf16"]["state_bytes"] / out["fp32"]["state_bytes"],
        "samples_per_second": out["bf16"]["samples_per_second"] / out["fp32"]["samples_per_second"],
    }
    out["epochs"], out["train_points"], out["test_points"] = epochs, len(train), len(test)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--delicious-epochs", type=int, default=5)
    ap.add_argument("--amazon-train", type=int, default=20000)
    ap.add_argument("--amazon-test", type=int, default=2000)
    ap.add_argument("--amazon-epochs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 1 epoch each, 5,000 amazon points (a smoke run)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.delicious_epochs, args.amazon_epochs, args.amazon_train = 1, 1, 1, 5000

    results = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
               "cpu_features": dict(slide._core.cpu_features()), "repeats": args.repeats, "sets": {}}
    print("Delicious", flush=True)
    cfg = slide.Config.from_yaml(ROOT / "datasets" / "delicious.yaml")
    train = slide.load_dataset(str(ROOT / "datasets" / "delicious" / "train.txt"))
    test = slide.load_dataset(str(ROOT / "datasets" / "delicious" / "test.txt"))
    results["sets"]["delicious"] = _compare("delicious", cfg, train, test, args.threads, args.delicious_epochs,
                                            args.repeats)
    print("Amazon-670K-shaped", flush=True)
    t0 = time.perf_counter()
    train, test = slide.datasets.make_synthetic("amazon-670k", num_train=args.amazon_train, num_test=args.amazon_test)
    print(f"  generated in {time.perf_counter() - t0:.0f} s", flush=True)
    cfg = slide.Config.from_yaml(ROOT / "datasets" / "synth-amazon-670k.yaml")
    results["sets"]["amazon-670k-shaped"] = _compare("amazon", cfg, train, test, args.threads, args.amazon_epochs,
                                                     args.repeats)

    print()
    print(f"{'data':<20} {'precision':<9} {'P@1':>7} {'state MiB':>10} {'samples/s':>10} {'kernels':>12}")
    for name, r in results["sets"].items():
        for prec in ("fp32", "bf16"):
            x = r[prec]
            print(f"{name:<20} {prec:<9} {x['P@1']:>7.4f} {x['state_bytes'] / 2**20:>10.1f} "
                  f"{x['samples_per_second']:>10.0f} {x['bf16_kernels'] if prec == 'bf16' else x['kernels']:>12}")
        q = r["ratio"]
        print(f"{name:<20} {'bf16/fp32':<9} {q['P@1_diff']:>+7.4f} {q['state_bytes']:>9.2f}x "
              f"{q['samples_per_second']:>9.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
