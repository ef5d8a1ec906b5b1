"""Peak memory of an amazon-670k-shaped training run, phase by phase, against the model state.

    python benchmarks/memory_peak.py [--train 20000] [--batches 300] [--threads 2]
                                     [--data TRAIN.txt [--test TEST.txt --eval-points 20000]]

Generates amazon-670k-shaped synthetic data (135,909 features, all 670,091 labels, ``--train``
points), builds ``datasets/synth-amazon-670k.yaml`` (DWTA tables, centroid rows) and
measures, in this process, the resident set (``VmRSS``) after each phase and its peak during the
phase (``VmHWM``, reset through ``/proc/self/clear_refs`` before each phase; Linux only):
building the network (weights, Adam moments, first tables), the centroid initialisation of the
output rows (ends with a table rebuild), ``--batches`` training batches (scheduled table rebuilds
included), an at-once rebuild of the tables, and a checkpoint save. The model state is
``memory_report()['total']`` (weights, Adam moments, tables). Prints a table and writes
``benchmarks/results/memory_peak.json``; the issue's goal is a peak of at most 1.3x the model state
(the training data comes on top: it is measured here too, before the network is built).

With ``--data`` the training points are read from a file instead (e.g. the full amazon-670k
preset written by ``slide datasets synth amazon-670k``), as ``slide train`` reads them; with
``--test`` the test file is read too (after the training data, as ``slide train`` holds both)
and a last phase scores ``--eval-points`` of its points exactly. Like ``slide train``, the probe
lets fit scale the training values in place (``fit(copy=False)``); ``--copy`` measures the copying
default of ``Network.fit``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _status() -> tuple:
    cur = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return cur, hwm


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copy", action="store_true",
                    help="train on a scaled copy of the training values (Network.fit's default) instead of "
                         "scaling them in place as slide train does")
    ap.add_argument("--data", help="a training file to read instead of generating --train points")
    ap.add_argument("--test", help="with --data: a test file, read and scored (--eval-points of it)")
    ap.add_argument("--eval-points", type=int, default=20000)
    ap.add_argument("--out", default=str(RESULTS / "memory_peak.json"))
    a = ap.parse_args(argv)
    if not os.path.exists("/proc/self/clear_refs"):
        print("needs Linux (/proc/self/clear_refs)", file=sys.stderr)
        return 2
    import slide
    from slide.callbacks import StopAfter

    rows = []

    def record(name, seconds):
        cur, hwm = _status()
        rows.append({"phase": name, "seconds": None if seconds is None else round(seconds, 1), "rss": cur,
                     "peak": hwm})
        took = "" if seconds is None else f"{seconds:6.1f} s"
        print(f"{name:34} {took:8}  RSS {cur / 2**20:7.0f} MiB  peak {hwm / 2**20:7.0f} MiB", flush=True)

    def phase(name, fn):
        _reset_peak()
        t0 = time.perf_counter()
        out = fn()
        record(name, time.perf_counter() - t0)
        return out

    base = _status()[0]
    test = None
    if a.data:
        train = phase("training data (read)", lambda: slide.load_dataset(a.data))
        if a.test:
            test = phase("test data (read)", lambda: slide.load_dataset(a.test))
    else:
        train, _ = phase("synthetic data", lambda: slide.datasets.make_synthetic(
            "amazon-670k", num_train=a.train, num_test=10))
    data = _status()[0] - base
    n_data = len(rows)
    cfg = slide.Config.load(str(ROOT / "datasets" / "synth-amazon-670k.yaml"))
    cfg.training.threads = a.threads
    net = slide.Network(cfg)
    phase("build (weights, moments, tables)", lambda: net._ensure_built(train.num_features, train.num_labels))
    state = net.memory_report()["total"]

    class Begin:  # fit's preparation ends here: the data arrays and the centroid rows (and their tables)
        def on_train_begin(self, _net):
            record("fit set-up, centroid rows, rebuild", None)
            _reset_peak()

    phase(f"{a.batches} batches (scheduled rebuilds)",
          lambda: net.fit(train, epochs=-(-a.batches * cfg.training.batch_size // train.features.shape[0]),
                          callbacks=[Begin(), StopAfter(a.batches)], progress=False, copy=a.copy))
    phase("table rebuild at once", net._core.rebuild_tables)
    with tempfile.TemporaryDirectory() as d:
        phase("checkpoint save", lambda: net.save(os.path.join(d, "m.slide")))
    if test is not None:
        n_eval = min(a.eval_points, test.features.shape[0])
        phase(f"score {n_eval} test points (exact)", lambda: net.evaluate(test[np.arange(n_eval)]))
    peak = max(r["peak"] for r in rows[n_data:])
    print(f"model state {state / 2**20:.0f} MiB; training data {data / 2**20:.0f} MiB; peak RSS {peak / 2**20:.0f} MiB "
          f"= {peak / state:.2f}x the model state ({(peak - data) / state:.2f}x without the data)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"train": train.features.shape[0], "data_file": a.data, "test_file": a.test,
                                       "batches": a.batches, "threads": a.threads,
                                       "model_state": state, "data": data, "peak": peak, "phases": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
