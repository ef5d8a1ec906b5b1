#!/usr/bin/env python
"""Changes to the default ``slide train`` measured on points held out of the training files.

    python benchmarks/draws.py --sets yeast,scene,enron --points 400 --draws 0,1,2 \\
        --variant 'min_steps_25={"optimizer": {"lr_decay_min_steps": 25}}'
    python benchmarks/draws.py --sets yeast --points 1000 --draws 0,1 --ensemble 3

This is how a default is chosen here without reading a test file. A draw takes ``--points`` rows
of a set's training file at random (numpy seed ``[draw, 991]``) to train on, and scores P@1/3/5 on
up to ``--held`` (4,000) other rows of the same file. The default configuration and every
``--variant`` (a name and the JSON of the settings it overrides, merged into the default) train on
the same rows with ``training.seed`` = the draw, so that a draw compares them on equal terms; a
few hundred points is the regime where the defaults are least certain (the validation split of
``epochs: auto`` is a fifth of them).

``--ensemble K`` adds a row for a seed ensemble of the default: K networks of one network each
(``training.ensemble: 1``; ``training.seed`` = the draw, +1000, +2000, ...) whose probabilities
are averaged before ranking (the ``z + weight * cos`` scores each network ranks by, as a sigmoid
or softmax in float64). It costs K times the training; it needs an output layer of at most 4,096
labels (every label scored). The default itself merges three networks on a cheap problem
(``training.ensemble: auto``, slide/ensemble.py); ``--single`` trains every network of the run
with ``training.ensemble: 1``, the default before 2026-12-06 (the tables of benchmarks/README.md
measured before then are reproduced with it).

``--dense-net`` adds the dense PyTorch network of ``benchmarks/suite.py`` (the default network for
its fixed epoch count) trained and scored on the same rows: ``dense-net`` on the rows slide sees
and, on sets the default standardizes, ``dense-net-l2`` on the L2-normalised rows alone.

``--peers napkinxc,pecos`` adds the XMC libraries as ``benchmarks/suite.py`` runs them (their
default settings, the same input scaling as slide's default, ``training.seed`` = the draw; on sets
the default standardizes also ``NAME-l2`` on the L2-normalised rows alone), each in its own process
(PECOS under ``--pecos-python``, a Python with libpecos and NumPy<2), trained on the draw's rows and
scored with the same metric code on the same held-out rows: the suite's comparison, on rows of
data no default was tuned on.

Prints per set the mean P@1 over draws of each row and its change against the default, then the
change over sets (mean, sets up and down); writes every run to ``benchmarks/results/draws.json``
(``--out``). Sets are named as in ``benchmarks/suite.py`` (the 12 real sets; Bibtex and Delicious
from the project's ``datasets/``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from suite import L2_SUFFIX, data_paths, run_json, xmc_model  # noqa: E402

from slide.centroids import FULL_LABELS  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "draws.json"
ENSEMBLE_SEED_STEP = 1000
PEERS = ("napkinxc", "pecos")


def parse_variant(text: str):
    """``NAME={json}`` -> (name, overrides), with an error that says which part is wrong."""
    name, sep, body = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME={{json}}")
    try:
        over = json.loads(body)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--variant {name}: not JSON ({e})") from None
    if not isinstance(over, dict):
        raise argparse.ArgumentTypeError(f"--variant {name}: expected a JSON object of config sections")
    return name.strip(), over


def draw_rows(n_rows: int, points: int, held: int, draw: int):
    """The training rows and the held-out rows of one draw (sorted), disjoint."""
    if points >= n_rows:
        raise SystemExit(f"--points {points}: the training file has only {n_rows} rows "
                         "(some must be left to score on)")
    perm = np.random.default_rng([draw, 991]).permutation(n_rows)
    return np.sort(perm[:points]), np.sort(perm[points:points + held])


def probabilities(net, X) -> np.ndarray:
    """Every label's probability under ``net`` as it ranks labels (with its label-centroid term),
    float64, rows x labels."""
    from slide import centroids as C

    L = int(net.num_labels)
    arrays = net._convert(X.tocsr(), None)
    out = np.zeros((X.shape[0], L))
    weight = net.centroid_weight
    if weight:
        for s, e, _, _, z, sv in C.pools(net, arrays, net._centroids, "exact", 1):
            out[s:e] = (z.astype(np.float64) + weight * sv).reshape(e - s, L)
    else:
        for s, e, ip, ix, xv in C._chunks(arrays, 512):
            out[s:e] = C._all_logits(net._core, ip, ix, xv, e - s, L).reshape(e - s, L)
    if net.config.layers[-1].activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-np.clip(out, -700.0, 700.0)))
    out -= out.max(axis=1, keepdims=True)
    np.exp(out, out=out)
    return out / out.sum(axis=1, keepdims=True)


def _scores(top: np.ndarray, Y) -> dict:
    import slide

    m = slide.metrics.evaluate(top, Y, k=(1, 3, 5))
    return {k: float(m[k]) for k in ("P@1", "P@3", "P@5")}


def dense_net_rows(name: str, X, Y, a, b, draw: int, threads: int):
    """The dense PyTorch network of benchmarks/suite.py (the default network, ``TORCH_EPOCHS``
    epochs, ``training.seed`` = the draw) trained on rows ``a`` and scored on rows ``b``: on the
    rows slide sees, and where the default standardizes them also on the L2-normalised rows alone
    (``dense-net-l2``), as the suite runs it."""
    import slide
    from slide.baselines.torch_dense import TorchDenseTrainer
    from slide.scaling import wants_standardize
    from suite import L2_SUFFIX, TORCH_EPOCHS

    settings = [("dense-net", "auto")]
    if wants_standardize("auto", X[a]):
        settings.append(("dense-net" + L2_SUFFIX, False))
    rows = []
    for rname, standardize in settings:
        cfg = slide.Config.from_dict({"training": {"threads": threads, "seed": draw},
                                      "data": {"standardize": standardize}})
        model = TorchDenseTrainer(cfg, X.shape[1], Y.shape[1])
        t = time.perf_counter()
        model.fit_for(slide.Dataset(X[a], Y[a]), epochs=TORCH_EPOCHS)
        seconds = time.perf_counter() - t
        top = model.predict_topk(X[b], k=5)[0]
        rows.append({"set": name, "draw": draw, "points": len(a), "held": len(b), "variant": rname,
                     **_scores(top, Y[b]), "train_seconds": seconds})
    return rows


def peer_worker(system: str, folder: str, threads: int, seed: int) -> dict:
    """In a process of its own: trains ``system`` (``napkinxc`` or ``pecos``, with ``-l2``: on the
    L2-normalised rows alone) on ``folder``/train.npz's rows with the default input scaling,
    writes the top 5 labels of ``folder``/held.npz's rows to ``folder``/top.npy."""
    import scipy.sparse as sp

    import slide

    raw = system.endswith(L2_SUFFIX)
    base = system[:-len(L2_SUFFIX)] if raw else system
    if base not in PEERS:
        raise ValueError(f"unknown peer {system!r}; expected one of {', '.join(PEERS)}")
    cfg = slide.Config.from_dict({"training": {"threads": threads, "seed": seed},
                                  "data": {"standardize": False if raw else "auto"}})
    d = Path(folder)
    X, Y, H = (sp.load_npz(d / f).tocsr() for f in ("train.npz", "labels.npz", "held.npz"))
    model = xmc_model(base, cfg)
    t = time.perf_counter()
    model.fit((X, Y))
    seconds = time.perf_counter() - t
    np.save(d / "top.npy", np.asarray(model.predict_topk(H, k=5)[0], dtype=np.int32))
    return {"train_seconds": seconds}


def peer_rows(name: str, X, Y, a, b, draw: int, threads: int, peers, pecos_python: Optional[str]):
    """The XMC libraries (``peers``) trained on rows ``a`` and scored on rows ``b``, each in its
    own process (:func:`peer_worker`); on sets the default standardizes also on the L2-normalised
    rows alone (``NAME-l2``), as benchmarks/suite.py runs them."""
    import scipy.sparse as sp

    from slide.scaling import wants_standardize

    systems = list(peers) + ([p + L2_SUFFIX for p in peers] if wants_standardize("auto", X[a]) else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="slide-draw-") as folder:
        for f, M in (("train.npz", X[a]), ("labels.npz", Y[a]), ("held.npz", X[b])):
            sp.save_npz(os.path.join(folder, f), M.tocsr())
        for system in systems:
            python = pecos_python if system.startswith("pecos") else sys.executable
            cmd = [python, str(Path(__file__).resolve()), "--peer-worker", system, folder,
                   "--threads", str(threads), "--seed", str(draw)]
            result, code, tail = run_json(cmd, threads)
            if code != 0 or result is None:
                raise SystemExit(f"--peers: {system} on {name} draw {draw} failed (exit {code}): {tail[:300]}")
            top = np.load(os.path.join(folder, "top.npy"))
            rows.append({"set": name, "draw": draw, "points": len(a), "held": len(b), "variant": system,
                         **_scores(top, Y[b]), "train_seconds": result["train_seconds"]})
    return rows


def run_draw(name: str, X, Y, draw: int, points: int, held: int, variants, ensemble: int, threads: int,
             single: bool = False, dense_net: bool = False, peers=(), pecos_python: Optional[str] = None):
    """One draw of one set: a row per variant (the default first), the ensemble's and, with
    ``dense_net``, the dense PyTorch network's, with ``peers`` the XMC libraries'. ``single``:
    every network with ``training.ensemble: 1``."""
    import slide

    a, b = draw_rows(X.shape[0], points, held, draw)
    rows, probs, ensemble_seconds = [], [], 0.0
    one = {"ensemble": 1} if single else {}

    def train(over, seed, extra):
        net = slide.Network(over, threads=threads, seed=seed, **extra)
        t = time.perf_counter()
        h = net.fit((X[a], Y[a]))
        return net, h, time.perf_counter() - t

    for vname, over in variants:
        net, h, seconds = train(over, draw, one)
        top, _ = net.predict(X[b], k=5)
        rows.append({"set": name, "draw": draw, "points": points, "held": len(b), "variant": vname,
                     **_scores(top, Y[b]), "train_seconds": seconds, "best_epoch": h.best_epoch,
                     "refit_epochs": h.refit_epochs, "centroid_weight": net.centroid_weight,
                     "centroid_kind": net.centroid_kind if net.centroid_weight else None})
        if vname != "default" or ensemble < 2:
            continue
        for i in range(ensemble):   # single networks; with single, the row's network is the first
            m, _, secs = (net, h, seconds) if i == 0 and single else train(
                over, draw + ENSEMBLE_SEED_STEP * i, {"ensemble": 1})
            probs.append(probabilities(m, X[b]))
            ensemble_seconds += secs
    if ensemble > 1:
        P = sum(probs) / len(probs)
        top = np.argsort(-P, axis=1, kind="stable")[:, :5].astype(np.int32)
        rows.append({"set": name, "draw": draw, "points": points, "held": len(b),
                     "variant": f"ensemble_{ensemble}", **_scores(top, Y[b]), "train_seconds": ensemble_seconds})
    if dense_net:
        rows += dense_net_rows(name, X, Y, a, b, draw, threads)
    if peers:
        rows += peer_rows(name, X, Y, a, b, draw, threads, peers, pecos_python)
    return rows


def summarize(rows) -> str:
    """Markdown: mean P@1 per set and row (change against the default), then over the sets that
    have the row ("-" where a set has none: ``dense-net-l2`` on sets not standardized)."""
    sets = list(dict.fromkeys(r["set"] for r in rows))
    names = list(dict.fromkeys(r["variant"] for r in rows))
    mean = {}
    for s in sets:
        for v in names:
            p1 = [r["P@1"] for r in rows if r["set"] == s and r["variant"] == v]
            if p1:
                mean[s, v] = float(np.mean(p1))
    draws = {s: len({r["draw"] for r in rows if r["set"] == s}) for s in sets}
    out = ["| set | draws | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for s in sets:
        cells = [f"{mean[s, 'default']:.4f}"] + [
            f"{mean[s, v]:.4f} ({mean[s, v] - mean[s, 'default']:+.4f})" if (s, v) in mean else "-"
            for v in names[1:]]
        out.append(f"| {s} | {draws[s]} | " + " | ".join(cells) + " |")
    summary = []
    for v in names[1:]:
        have = [s for s in sets if (s, v) in mean]
        d = np.array([mean[s, v] - mean[s, "default"] for s in have])
        summary.append(f"{v}: mean change {d.mean():+.4f} P@1 over {len(have)} set{'s' if len(have) != 1 else ''}, "
                       f"up on {(d > 0).sum()}, down on {(d < 0).sum()}")
    return "\n".join(out) + "\n\n" + "\n".join(summary)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", help="comma-separated set names (as in benchmarks/suite.py)")
    ap.add_argument("--points", type=int, default=400, help="training rows per draw (default 400)")
    ap.add_argument("--held", type=int, default=4000, help="at most this many other rows scored (default 4000)")
    ap.add_argument("--draws", default="0,1,2", help="comma-separated draw numbers (default 0,1,2)")
    ap.add_argument("--variant", action="append", type=parse_variant, default=[],
                    help='NAME={"section": {"key": value}}: settings merged into the default (repeatable)')
    ap.add_argument("--ensemble", type=int, default=1, help="also a seed ensemble of this many default networks")
    ap.add_argument("--single", action="store_true",
                    help="every network with training.ensemble: 1 (the default before 2026-12-06)")
    ap.add_argument("--dense-net", action="store_true",
                    help="also the dense PyTorch network of benchmarks/suite.py on the same rows (needs torch)")
    ap.add_argument("--peers", default="",
                    help="comma-separated XMC libraries trained and scored on the same rows: napkinxc, pecos")
    ap.add_argument("--pecos-python", default=os.environ.get("SLIDE_PECOS_PYTHON"),
                    help="a Python with libpecos (NumPy<2) and slide installed, for --peers pecos")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--peer-worker", nargs=2, metavar=("SYSTEM", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer_worker:
        print(json.dumps(peer_worker(args.peer_worker[0], args.peer_worker[1], args.threads, args.seed)),
              flush=True)
        return 0
    if not args.sets:
        ap.error("--sets is required")
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        ap.error(f"--peers {','.join(unknown)}: expected some of {', '.join(PEERS)}")
    if "pecos" in peers and not args.pecos_python:
        ap.error("--peers pecos needs --pecos-python (or SLIDE_PECOS_PYTHON): a Python with libpecos, "
                 "which wants NumPy<2, and slide installed")
    if args.points < 2 or args.held < 1 or args.ensemble < 1:
        ap.error("--points must be at least 2, --held and --ensemble at least 1")
    try:
        draws = [int(d) for d in args.draws.split(",")]
    except ValueError:
        ap.error(f"--draws {args.draws!r}: expected comma-separated integers")
    variants = [("default", {})] + args.variant
    if len({v for v, _ in variants}) < len(variants):
        ap.error("--variant: every name must be new (and not 'default')")
    if args.ensemble < 2 and len(variants) == 1 and not args.dense_net and not peers:
        ap.error("nothing to compare: give --variant, --ensemble 2 or more, --dense-net or --peers")
    if args.dense_net:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            ap.error('--dense-net needs PyTorch: pip install ".[torch]"')

    import slide

    for vname, over in variants[1:]:   # a mistyped setting fails here, not after hours of runs
        try:
            slide.Config.from_dict(over)
        except slide.ConfigError as e:
            ap.error(f"--variant {vname}: {e}")

    rows = []
    for name in [s for s in args.sets.split(",") if s]:
        train_path, _ = data_paths(name)
        if not os.path.exists(train_path):
            raise SystemExit(f"--sets {name}: no training file at {train_path}")
        data = slide.load_dataset(train_path)
        X, Y = data.features.tocsr(), data.labels.tocsr()
        if args.ensemble > 1 and Y.shape[1] > FULL_LABELS:
            raise SystemExit(f"--ensemble: {name} has {Y.shape[1]} labels; seed ensembles are measured "
                             f"on at most {FULL_LABELS} (every label scored)")
        for draw in draws:
            new = run_draw(name, X, Y, draw, args.points, args.held, variants, args.ensemble, args.threads,
                           args.single, args.dense_net, peers, args.pecos_python)
            for r in new:
                print(f"{name} draw {draw} {r['variant']}: P@1 {r['P@1']:.4f}", flush=True)
            rows += new
    table = summarize(rows)
    print("\n" + table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    # the PECOS interpreter's path is this machine's own: recorded as PY
    command = " ".join(["python", "benchmarks/draws.py"] + [
        "PY" if x == args.pecos_python else x for x in (argv or sys.argv[1:])])
    tmp.write_text(json.dumps({"command": command, "threads": args.threads,
                               "variants": {v: o for v, o in variants}, "ensemble": args.ensemble,
                               "single": args.single, "dense_net": args.dense_net, "peers": peers,
                               "machine": platform.processor() or platform.machine(),
                               "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))
    os.replace(tmp, out)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
