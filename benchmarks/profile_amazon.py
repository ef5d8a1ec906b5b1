"""Where an amazon-670k-shaped epoch spends its time, against the machine's memory bandwidth.

    python benchmarks/profile_amazon.py [--train 20000] [--samples 60000] [--threads 1 2]
                                        [--compare "shared_negatives=False,rebuild_spread=1" "default"]

Generates amazon-670k-shaped synthetic data (``slide.datasets`` preset ``amazon-670k``: 135,909
features and all 670,091 labels; ``--train`` training points, ``--eval`` test points), then, for
each thread count and each setting, trains ``datasets/synth-amazon-670k.yaml`` (centroid init,
DWTA K=8 L=50, batch 256, Adam 1e-2) for ``--samples`` training samples with the engine's phase
profiler on (``core.profiling``), and prints per run:

* the share of the training time and the bytes moved per phase (hashing, candidate selection,
  forward, softmax, backward, fused Adam, table rebuilds, data shuffling), from ``core.profile()``;
* samples/s (samples / seconds inside ``train_batch``), bytes per sample, and the percentage of
  the bandwidth limit: bytes per sample x samples/s / the triad bandwidth measured in the same run
  at the same thread count (``slide._core.stream_triad``);
* the longest batch (a table rebuild at once stalls one batch for seconds);
* P@1 (exact scoring of the ``--eval`` test points) after each ``--marks`` training samples,
  so that two settings are compared per sample, not only per second.

A setting is a comma-separated list of engine settings set on the core before training
(``shared_negatives=False``, ``rebuild_spread=1``) and of dotted config keys set before the
network is built (``layers.-1.lsh.L=25``); ``default`` sets nothing. Runs of different
settings at one thread count follow each other back to back, so their ratio is measured under
the same load. Prints a table and writes benchmarks/results/profile_amazon.json.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "profile_amazon.json"
CONFIG = ROOT / "datasets" / "synth-amazon-670k.yaml"
PHASES = ("hashing", "selection", "forward", "softmax", "backward", "adam", "rebuild", "shuffle")


def _data(args):
    """(xtr, ytr, xte, yte), cached between runs in the temporary folder."""
    import tempfile
    cache = Path(tempfile.gettempdir()) / f"slide-profile-amazon-{args.train}-{args.eval}-{args.seed}"
    names = ("xtr", "ytr", "xte", "yte")
    if not all((cache / f"{n}.npz").exists() for n in names):
        from slide.datasets.synthetic import make_synthetic_arrays
        t = time.perf_counter()
        arrays = make_synthetic_arrays("amazon-670k", seed=args.seed, num_train=args.train, num_test=args.eval)
        cache.mkdir(parents=True, exist_ok=True)
        for n, a in zip(names, arrays):
            sp.save_npz(cache / f"{n}.npz", a)
        print(f"generated amazon-670k-shaped data ({args.train} train, {args.eval} test points) in "
              f"{time.perf_counter() - t:.0f} s", file=sys.stderr)
    return [sp.load_npz(cache / f"{n}.npz").tocsr() for n in names]


def parse_setting(text: str) -> dict:
    """'shared_negatives=False,rebuild_spread=1' -> {'shared_negatives': False, 'rebuild_spread': 1}."""
    if text.strip() in ("", "default"):
        return {}
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"setting {item!r}: expected name=value")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def _set_config(cfg, key: str, value) -> None:
    """cfg.layers[-1].lsh.L = value for key 'layers.-1.lsh.L' (list items by index)."""
    *path, last = key.split(".")
    obj = cfg
    for part in path:
        obj = obj[int(part)] if isinstance(obj, list) else getattr(obj, part)
    if not hasattr(obj, last):
        raise SystemExit(f"setting {key!r}: the config has no such key")
    setattr(obj, last, value)


def run_one(data, threads: int, setting: dict, args) -> dict:
    import slide
    from slide import metrics
    xtr, ytr, xte, yte = data
    cfg = slide.Config.from_yaml(CONFIG)
    cfg.data.train = cfg.data.test = None
    cfg.training.threads = threads
    cfg.training.seed = args.seed
    cfg.training.epochs = 10**6                       # --samples stops training
    cfg.training.eval_every = 0
    for key, value in setting.items():
        if "." in key:
            _set_config(cfg, key, value)
    batch = cfg.training.batch_size
    marks = sorted(set(args.marks))
    curve = []
    state = {"samples": 0, "next": 0, "wall": 0.0, "t": None}

    class Probe(slide.callbacks.Callback):
        def on_train_begin(self, net):
            core = net._core
            for k, v in setting.items():
                if "." not in k:
                    setattr(core, k, v)
            core.reset_profile()
            core.profiling = True
            state["t"] = time.perf_counter()

        def on_batch_end(self, net, step, loss):
            state["samples"] += batch
            if state["next"] < len(marks) and state["samples"] >= marks[state["next"]]:
                state["wall"] += time.perf_counter() - state["t"]
                top, _ = net.predict(xte, k=1)
                curve.append({"samples": state["samples"], "P@1": float(metrics.evaluate(top, yte, k=(1,))["P@1"]),
                              "loss": float(loss)})
                state["next"] += 1
                state["t"] = time.perf_counter()
            if state["samples"] >= args.samples:
                net.stop_training = True

    net = slide.Network(cfg)
    net.fit((xtr, ytr), callbacks=[Probe()])
    state["wall"] += time.perf_counter() - state["t"]
    core = net._core
    prof = core.profile()
    core.profiling = False
    total = prof["batch_seconds"] + prof["phases"]["shuffle"]["seconds"]
    samples = prof["samples"]
    phases = {}
    for name in PHASES:
        p = prof["phases"][name]
        phases[name] = {"seconds": p["seconds"], "share": p["seconds"] / total if total else 0.0,
                        "bytes_per_sample": p["bytes"] / samples if samples else 0.0}
    inside = sum(phases[n]["seconds"] for n in PHASES if n != "shuffle")
    phases["other"] = {"seconds": max(0.0, prof["batch_seconds"] - inside),
                       "share": max(0.0, prof["batch_seconds"] - inside) / total if total else 0.0,
                       "bytes_per_sample": 0.0}
    bytes_per_sample = sum(p["bytes"] for p in prof["phases"].values()) / samples
    return {"threads": threads, "setting": setting, "samples": samples, "batches": prof["batches"],
            "train_seconds": total, "samples_per_second": samples / total,
            "wall_samples_per_second": samples / state["wall"] if state["wall"] else float("nan"),
            "bytes_per_sample": bytes_per_sample, "longest_batch": prof["longest_batch"],
            "longest_batch_step": prof["longest_batch_step"], "phases": phases, "curve": curve,
            "kernels": core.kernel_isa, "memory_bytes": net.memory_report()["total"]}


def print_table(runs, triad) -> None:
    for r in runs:
        limit = triad[str(r["threads"])]
        pct = 100.0 * r["bytes_per_sample"] * r["samples_per_second"] / (limit * 1e9)
        r["bandwidth_gbs"] = limit
        r["percent_of_bandwidth_limit"] = pct
        r["bandwidth_limit_samples_per_second"] = limit * 1e9 / r["bytes_per_sample"]
    print()
    head = f"{'phase':<10}" + "".join(f"{_label(r):>22}" for r in runs)
    print(head)
    print("-" * len(head))
    for name in PHASES + ("other",):
        row = f"{name:<10}"
        for r in runs:
            p = r["phases"][name]
            row += f"{100 * p['share']:>8.1f}% {p['bytes_per_sample'] / 1e6:>8.3f} MB  "
        print(row)
    print("-" * len(head))
    lines = [
        ("samples/s", lambda r: f"{r['samples_per_second']:,.0f}"),
        ("MB/sample", lambda r: f"{r['bytes_per_sample'] / 1e6:.3f}"),
        ("triad GB/s", lambda r: f"{r['bandwidth_gbs']:.1f}"),
        ("% of limit", lambda r: f"{r['percent_of_bandwidth_limit']:.1f}%"),
        ("limit s/s", lambda r: f"{r['bandwidth_limit_samples_per_second']:,.0f}"),
        ("longest", lambda r: f"{r['longest_batch']:.3f} s"),
    ]
    for name, f in lines:
        print(f"{name:<10}" + "".join(f"{f(r):>22}" for r in runs))
    marks = sorted({c["samples"] for r in runs for c in r["curve"]})
    for m in marks:
        row = f"P@1 {m // 1000:>3}K "
        for r in runs:
            v = next((c["P@1"] for c in r["curve"] if c["samples"] == m), None)
            row += f"{'-' if v is None else f'{v:.4f}':>22}"
        print(row)


def _label(r) -> str:
    s = ",".join(f"{k}={v}" for k, v in r["setting"].items()) or "default"
    return f"{r['threads']}T {s}"[:21]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=20000, help="training points")
    ap.add_argument("--eval", type=int, default=1000, help="test points scored (exact) at each mark")
    ap.add_argument("--samples", type=int, default=60000, help="training samples per run")
    ap.add_argument("--marks", type=int, nargs="*", default=[10000, 20000, 30000, 40000, 50000, 60000],
                    help="training samples after which P@1 is measured")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--compare", nargs="*", default=["default"],
                    help="settings to run side by side, e.g. 'shared_negatives=False,rebuild_spread=1' default")
    ap.add_argument("--triad-mib", type=int, default=256, help="MiB per triad array")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    from slide import _core

    data = _data(args)
    settings = [parse_setting(s) for s in args.compare]
    runs, triad = [], {}
    for threads in args.threads:
        # The bandwidth at this thread count, measured next to its runs (best of two triads).
        triad[str(threads)] = _core.stream_triad(args.triad_mib, threads, 5)
        for setting in settings:
            print(f"training {args.samples} samples, {threads} thread(s), setting {setting or 'default'}",
                  file=sys.stderr)
            runs.append(run_one(data, threads, setting, args))
        triad[str(threads)] = max(triad[str(threads)], _core.stream_triad(args.triad_mib, threads, 5))
    print_table(runs, triad)
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "python": platform.python_version()},
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "triad_gbs": triad, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
