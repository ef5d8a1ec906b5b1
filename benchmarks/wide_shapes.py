"""Settings for the wide synthetic shapes, chosen on a validation split of train, next to the XMC peers.

    python benchmarks/wide_shapes.py [--shape amazon-670k] [--num-train 100000] [--num-test 10000]
        [--valid 10000] [--budget 300] [--variants NAME,NAME,...] [--peers napkinxc,pecos]
        [--epochs N] [--tag SUFFIX]

Generates the shape's synthetic set once (``slide.datasets.write_synthetic``, cached under
``benchmarks/results/wide/<shape>-<n>/``), holds out ``--valid`` training points (seeded) as the
validation split, and trains every variant of ``VARIANTS`` on the rest for ``--budget`` seconds of
training, one after the other, each in a fresh process (peak RSS is its own). Validation P@1 is
taken at the marks of ``slide.baselines.compare.default_marks`` (evaluation time not counted), and
the test set is read once, after training, for the final model of each system. With ``--epochs N``
each variant trains N epochs instead, and ``--curve-points`` validation and training points are
scored after every epoch (curves per epoch do not depend on the load of the machine; the
training-subset P@1 shows how much of the training set the model has memorised). The peers (napkinXC
PLT, PECOS XR-Linear from its own environment) train to completion on the same fitting split and
are scored by the same metric code. Writes ``benchmarks/results/wide_<shape>.json`` (curves
included) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# Overrides of datasets/synth-<shape>.yaml as it is now, by name: dotted config keys. The runs in
# datasets/synthetic.md before 2026-12-06 were made on configs without the label-centroid term
# (add "layers.-1.centroid_weight": 0.0 to a variant to measure it as it was then).
VARIANTS: Dict[str, Dict[str, Any]] = {
    "config": {},                                          # the config as it is now
    "config-cw0": {"layers.-1.centroid_weight": 0.0},      # ... without the label-centroid term
    # the config when it was softmax with 128 hidden units (before the label-centroid term)
    "softmax-centroid": {"layers.0.size": 128, "layers.-1.activation": "softmax", "layers.-1.centroid_weight": 0.0},
    "softmax-h128-cw16": {"layers.0.size": 128, "layers.-1.activation": "softmax", "layers.-1.centroid_weight": 16.0},
    "softmax-h128-cw32": {"layers.0.size": 128, "layers.-1.activation": "softmax", "layers.-1.centroid_weight": 32.0},
    # the amazon-670k config of 2026-12-05 (binary loss, 256 hidden units, the term at 16)
    "sigmoid-h256-cw16": {"layers.0.size": 256, "layers.-1.activation": "sigmoid", "layers.-1.centroid_weight": 16.0},
    "softmax-random": {"layers.-1.init": "glorot"},
    "sigmoid-centroid": {"layers.-1.activation": "sigmoid"},
    "sigmoid-random": {"layers.-1.activation": "sigmoid", "layers.-1.init": "glorot"},
    "sigmoid-importance": {"layers.-1.activation": "sigmoid", "layers.-1.lsh.negative_weight": 0.0},
    "sigmoid-w0.1": {"layers.-1.activation": "sigmoid", "layers.-1.lsh.negative_weight": 0.1},
    "sigmoid-w10": {"layers.-1.activation": "sigmoid", "layers.-1.lsh.negative_weight": 10.0},
    "softmax-h256": {"layers.0.size": 256},
    "softmax-h512": {"layers.0.size": 512},
    "softmax-h256-lr2.5e-3": {"layers.0.size": 256, "optimizer.lr": 2.5e-3},
    "softmax-h512-lr1.25e-3": {"layers.0.size": 512, "optimizer.lr": 1.25e-3},
    "softmax-h512-lr2.5e-3": {"layers.0.size": 512, "optimizer.lr": 2.5e-3},
    "sigmoid-h256": {"layers.-1.activation": "sigmoid", "layers.0.size": 256},
    "sigmoid-h512": {"layers.-1.activation": "sigmoid", "layers.0.size": 512},
    "softmax-lr3e-3": {"optimizer.lr": 3e-3},
    "softmax-lr3e-2": {"optimizer.lr": 3e-2},
    "sigmoid-lr3e-3": {"layers.-1.activation": "sigmoid", "optimizer.lr": 3e-3},
    "sigmoid-lr3e-2": {"layers.-1.activation": "sigmoid", "optimizer.lr": 3e-2},
    "softmax-lr2e-2": {"optimizer.lr": 2e-2},
    "softmax-lr5e-3": {"optimizer.lr": 5e-3},
    "softmax-decay0.75": {"optimizer.lr_decay": 0.75},
    "softmax-batch128": {"training.batch_size": 128},
    "softmax-dropout0.2": {"training.dropout": 0.2},
    "softmax-dropout0.5": {"training.dropout": 0.5},
    "softmax-eps1e-3": {"optimizer.eps": 1e-3},
    "softmax-eps1e-2": {"optimizer.eps": 1e-2},
    "softmax-dropout0.5-eps1e-3": {"training.dropout": 0.5, "optimizer.eps": 1e-3},
    "softmax-wd0.1": {"optimizer.weight_decay": 0.1},
    "softmax-h512-bf16": {"layers.0.size": 512, "layers.-1.precision": "bf16"},
    "softmax-range15": {"layers.-1.lsh.range_pow": 15},
    "softmax-L25": {"layers.-1.lsh.L": 25},
    "softmax-L12": {"layers.-1.lsh.L": 12},
    "softmax-lr3e-3-L12": {"optimizer.lr": 3e-3, "layers.-1.lsh.L": 12},
    "sigmoid-lr1e-2": {"layers.-1.activation": "sigmoid", "optimizer.lr": 1e-2},
    "sigmoid-lr1e-3": {"layers.-1.activation": "sigmoid", "optimizer.lr": 1e-3},
    "sigmoid-h256-lr1e-3": {"layers.-1.activation": "sigmoid", "layers.0.size": 256, "optimizer.lr": 1e-3},
    "sigmoid-h512-lr2.5e-3": {"layers.-1.activation": "sigmoid", "layers.0.size": 512, "optimizer.lr": 2.5e-3},
    "sigmoid-h256-L1": {"layers.-1.activation": "sigmoid", "layers.0.size": 256, "layers.-1.lsh.L": 1},
    "sigmoid-h256-lr2.5e-3": {"layers.-1.activation": "sigmoid", "layers.0.size": 256, "optimizer.lr": 2.5e-3},
}


def _set(d: Dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        d = d[int(p)] if isinstance(d, list) else d.setdefault(p, {})
    last = parts[-1]
    if isinstance(d, list):
        d[int(last)] = value
    else:
        d[last] = value


def _data(shape: str, num_train: int, num_test: int, valid: int, seed: int) -> Dict[str, str]:
    """Paths of the fitting split, the validation split and the test set (written once)."""
    import slide
    from slide.datasets import write_synthetic

    folder = RESULTS / "wide" / f"{shape}-{num_train}"
    paths = {"fit": folder / "fit.txt", "valid": folder / "valid.txt", "test": folder / "test.txt",
             "train": folder / "train.txt"}
    if not paths["valid"].exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_synthetic(shape, folder, seed=seed, num_train=num_train, num_test=num_test)
        train = slide.load_dataset(str(paths["train"]))
        order = np.random.default_rng([seed, 0x5A11D]).permutation(len(train))
        train[np.sort(order[valid:])].save(str(paths["fit"]))
        train[np.sort(order[:valid])].save(str(paths["valid"]))
    return {k: str(v) for k, v in paths.items()}


def _config(shape: str, overrides: Dict[str, Any], threads: int) -> Dict[str, Any]:
    from slide import Config

    d = Config.load(str(ROOT / "datasets" / f"synth-{shape}.yaml")).to_dict()
    for key, value in overrides.items():
        _set(d, key, value)
    d["training"]["threads"] = threads
    return d


def _curve_subset(n: int, points: int) -> np.ndarray:
    """The seeded validation points scored at the marks before the end (sorted)."""
    return np.sort(np.random.default_rng(0).choice(n, min(n, points), replace=False))


def run_slide(job: Dict[str, Any]) -> Dict[str, Any]:
    """One slide variant: train on fit for the budget, validation curve, test at the end."""
    import slide
    from slide.baselines.compare import _MarkClock, _RssSampler, default_marks
    from slide._util import peak_rss_bytes
    from slide.metrics import evaluate

    cfg = slide.Config.from_dict(job["config"])
    per_epoch = int(job.get("epochs") or 0)
    cfg.training.epochs = per_epoch or 10 ** 9  # else the time budget stops training
    cfg.training.eval_every = 0
    cfg.training.patience = 0
    cfg.data.valid_fraction = 0.0
    cfg.training.restore_best = False
    fit, valid, test = (slide.load_dataset(job[k]) for k in ("fit", "valid", "test"))
    budget = float(job["budget"])
    marks = [m for m in job.get("marks") or default_marks(budget) if m < budget]
    clock = _MarkClock(marks, budget)
    curve: List[Dict[str, float]] = []
    # Exact scoring of 670K labels costs about 10 ms a point on 2 cores: the curve before the
    # end is taken on a seeded subset of the validation split, the end on all of it.
    sub = _curve_subset(len(valid), job["curve_points"])
    valid_sub = valid[sub]

    def score(ds) -> float:
        top, _ = net.predict(ds.features, k=1)
        return float(evaluate(top, ds.labels, k=(1,))["P@1"])

    # --epochs: a fixed number of epochs, both splits scored after each (load-independent curves)
    train_sub = fit[np.sort(np.random.default_rng(1).choice(len(fit), min(len(fit), job["curve_points"]),
                                                           replace=False))]

    class Epochs:
        def on_train_begin(self, net):
            clock.start()

        def on_epoch_end(self, net, epoch):
            t0 = time.perf_counter()
            top, _ = net.predict(valid_sub.features, k=5)
            m = evaluate(top, valid_sub.labels, k=(1, 5))
            top, _ = net.predict(train_sub.features, k=1)
            tr = evaluate(top, train_sub.labels, k=(1,))["P@1"]
            curve.append({"epoch": int(epoch), "seconds": round(clock.elapsed(), 1), "valid_P@1": float(m["P@1"]),
                          "valid_P@5": float(m["P@5"]), "train_P@1": float(tr), "valid_points": len(valid_sub)})
            print(f"{job['name']:20} epoch {epoch:3d}  valid P@1 {m['P@1']:.4f}  train P@1 {tr:.4f}",
                  file=sys.stderr, flush=True)
            clock.paused += time.perf_counter() - t0

    class Marks:
        def on_train_begin(self, net):
            clock.start()

        def on_batch_end(self, net, step, loss):
            elapsed = clock.elapsed()
            mark = clock.due(elapsed)
            if mark is not None or elapsed >= budget:
                t0 = time.perf_counter()
                final = elapsed >= budget
                curve.append({"seconds": round(elapsed, 1), "valid_P@1": score(valid if final else valid_sub),
                              "valid_points": len(valid) if final else len(valid_sub), "epoch": int(net.epoch)})
                print(f"{job['name']:20} {elapsed:7.1f}s  valid P@1 {curve[-1]['valid_P@1']:.4f}",
                      file=sys.stderr, flush=True)
                clock.paused += time.perf_counter() - t0
            if elapsed >= budget:
                net.stop_training = True

    with _RssSampler() as rss:
        net = slide.Network(cfg)
        net.fit(fit, callbacks=[Epochs() if per_epoch else Marks()], progress=False)
        seconds = clock.elapsed()
        top, _ = net.predict(test.features, k=5)
        test_metrics = evaluate(top, test.labels, k=(1, 3, 5))
    return {"name": job["name"], "train_seconds": round(seconds, 1), "curve": curve,
            "valid_P@1": curve[-1]["valid_P@1"] if curve else None,
            "test": {k: float(v) for k, v in test_metrics.items()},
            "peak_rss_gb": round(max(rss.peak, peak_rss_bytes()) / 2 ** 30, 2)}


def run_peer(job: Dict[str, Any]) -> Dict[str, Any]:
    """napkinXC PLT or PECOS XR-Linear, trained to completion on fit; valid and test scored."""
    import slide
    from slide.baselines.compare import _RssSampler
    from slide._util import peak_rss_bytes
    from slide.metrics import evaluate

    cfg = slide.Config.from_dict(job["config"])
    fit, valid, test = (slide.load_dataset(job[k]) for k in ("fit", "valid", "test"))
    if job["name"] == "pecos":
        from slide.baselines.pecos_linear import PecosXLinear, import_pecos
        import_pecos()
        model = PecosXLinear(cfg)
    else:
        from slide.baselines.napkinxc_plt import NapkinPLT, import_napkinxc
        import_napkinxc()
        model = NapkinPLT(cfg)
    with _RssSampler() as rss:
        t0 = time.perf_counter()
        model.fit(fit)
        seconds = time.perf_counter() - t0
        out = {}
        for part, ds in (("valid", valid), ("test", test)):
            top, _ = model.predict_topk(ds.features, 5)
            out[part] = {k: float(v) for k, v in evaluate(top, ds.labels, k=(1, 3, 5)).items()}
            if part == "valid":   # the subset the slide curves score before their end, to compare marks
                sub = _curve_subset(len(valid), job["curve_points"])
                out["valid_curve_points"] = float(evaluate(top[sub], ds.labels[sub], k=(1,))["P@1"])
    if hasattr(model, "close"):
        model.close()
    print(f"{job['name']:20} {seconds:7.1f}s  valid P@1 {out['valid']['P@1']:.4f} "
          f"({out['valid_curve_points']:.4f} on the points of the curves)", file=sys.stderr, flush=True)
    return {"name": job["name"], "train_seconds": round(seconds, 1), "valid_P@1": out["valid"]["P@1"],
            "valid_P@1_curve_points": out["valid_curve_points"], "test": out["test"],
            "peak_rss_gb": round(max(rss.peak, peak_rss_bytes()) / 2 ** 30, 2)}


def _isolated(job: Dict[str, Any], tmp: Path, python: str = sys.executable) -> Dict[str, Any]:
    spec, result = tmp / f"{job['name']}.job.json", tmp / f"{job['name']}.result.json"
    spec.write_text(json.dumps(job))
    result.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONSAFEPATH="1")
    subprocess.run([python, str(Path(__file__).resolve()), "--job", str(spec), str(result)], env=env,
                   check=False)
    if not result.exists():
        return {"name": job["name"], "error": "the process ended before reporting"}
    return json.loads(result.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="amazon-670k")
    ap.add_argument("--num-train", type=int, default=100_000)
    ap.add_argument("--num-test", type=int, default=10_000)
    ap.add_argument("--valid", type=int, default=10_000)
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--marks", default="60,150", help="training seconds of the curve points before the end")
    ap.add_argument("--curve-points", type=int, default=2000, help="validation points scored before the end")
    ap.add_argument("--epochs", type=int, default=0,
                    help="train each slide variant for this many epochs instead of --budget seconds, scoring "
                         "--curve-points validation and training points after every epoch")
    ap.add_argument("--variants", default="softmax-centroid,sigmoid-centroid")
    ap.add_argument("--peers", default="", help="comma-separated: napkinxc, pecos")
    ap.add_argument("--pecos-python", default=os.environ.get("SLIDE_PECOS_PYTHON", sys.executable),
                    help="a Python with libpecos (NumPy<2) and slide importable")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="", help="suffix of the result file")
    ap.add_argument("--job", nargs=2, metavar=("JOB.json", "RESULT.json"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.job:
        job = json.loads(Path(a.job[0]).read_text())
        res = run_peer(job) if job.get("peer") else run_slide(job)
        Path(a.job[1]).write_text(json.dumps(res))
        return 0

    paths = _data(a.shape, a.num_train, a.num_test, a.valid, a.seed)
    tmp = RESULTS / "wide" / "jobs"
    tmp.mkdir(parents=True, exist_ok=True)
    results = []
    for name in [v for v in a.variants.split(",") if v]:
        job = dict(paths, name=name, budget=a.budget, config=_config(a.shape, VARIANTS[name], a.threads),
                   overrides=VARIANTS[name], marks=[float(m) for m in a.marks.split(",") if m],
                   curve_points=a.curve_points, epochs=a.epochs)
        results.append(dict(_isolated(job, tmp), overrides=VARIANTS[name]))
    for peer in [p for p in a.peers.split(",") if p]:
        job = dict(paths, name=peer, peer=True, config=_config(a.shape, {}, a.threads), curve_points=a.curve_points)
        results.append(_isolated(job, tmp, a.pecos_python if peer == "pecos" else sys.executable))
    out = RESULTS / f"wide_{a.shape}{a.tag}.json"
    out.write_text(json.dumps({"shape": a.shape, "num_train": a.num_train - a.valid, "valid": a.valid,
                               "num_test": a.num_test, "budget": a.budget, "threads": a.threads,
                               "results": results}, indent=1))
    print(f"{'system':22} {'valid P@1':>9} {'test P@1':>8} {'P@3':>6} {'P@5':>6} {'train s':>8} {'RSS GB':>6}")
    for r in results:
        if "error" in r:
            print(f"{r['name']:22} failed: {r['error']}")
            continue
        t = r["test"]
        print(f"{r['name']:22} {r['valid_P@1']:9.4f} {t['P@1']:8.4f} {t['P@3']:6.4f} {t['P@5']:6.4f} "
              f"{r['train_seconds']:8.1f} {r['peak_rss_gb']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
