#!/usr/bin/env python
"""The default ``slide train`` on every real data set against the XMC libraries and a dense net.

    python benchmarks/suite.py                                  # all sets, all systems found
    python benchmarks/suite.py --sets medical,scene --systems slide,napkinxc
    python benchmarks/suite.py --pecos-python /path/to/numpy1-venv/bin/python
    python benchmarks/suite.py --table-only                     # reprint from results/suite.json
    python benchmarks/suite.py --seeds 0,1,2,3,4 --sets yeast   # every system once per seed
    python benchmarks/suite.py --sets derived                   # sets derived from them (derived.py)
    python benchmarks/suite.py --sets generated                 # generated sets of two public shapes
    python benchmarks/suite.py --sets scene --merge             # rerun one set, keep the others' rows
    python benchmarks/suite.py --systems slide --merge          # rerun slide, keep the peers' rows

Data: the 12 sets of ``../shared/datasets`` (Bibtex and Delicious from the project's own
``datasets/``), their given train/test files, the same files for every system. ``--sets derived``:
the sets of ``benchmarks/derived.py``, built from those (tiny subsamples of their training
files, a 4,000-label text task, dense features), in regimes the 12 do not cover; results in
``benchmarks/results/suite_derived.json`` (with ``--seeds``: ``suite_derived_seeds.json``), also
when only some of them are named (``--sets densercv``). ``--sets generated``: two generated sets
at the full size of EUR-Lex-4K and Mediamill (derived.py), results in ``suite_generated.json``.

Systems, each run as a user would run it, in a fresh process of its own (so that peak RSS is
the system's own), with the same number of threads (``--threads``, default 2):

* ``slide``: ``slide train`` with the default configuration (nothing tuned per set).
* ``napkinxc``: napkinXC's PLT with its defaults (``slide.baselines.napkinxc_plt``).
* ``pecos``: PECOS XR-Linear (``slide.baselines.pecos_linear``); libpecos
  needs NumPy<2, so it runs under ``--pecos-python`` (a Python with libpecos and slide installed);
  without it the rows say "not run".
* ``torch``: the dense PyTorch network of the default configuration (``slide.baselines.torch_dense``)
  for the default's epoch count on the CPU, needs torch.

The peers see the rows slide sees: L2-normalised, and on sets of dense real-valued features
(``data.standardize: auto``: yeast and scene) standardized per feature first. There each peer
runs a second time on the L2-normalised rows alone (``napkinxc-l2``, ``pecos-l2``, ``torch-l2``),
and the gap column compares slide with the best peer row, whichever input suited it.

Every system is scored by ``slide.metrics`` on all test points (points without labels count as
misses): P@1/3/5 and PSP@1/3/5 (propensities A=0.55, B=1.5), with its training seconds and the
worker's peak RSS. Prints a markdown table (rows we lose included) and writes
``benchmarks/results/suite.json``.

``--seeds`` runs every system once per ``training.seed`` (slide's initialisation, shuffling,
dropout and validation split; the dense net's initialisation, shuffling and dropout; the seeds
of napkinXC's and PECOS's tree building) and prints P@1 as mean (min-max) per set and system,
with slide's mean minus the best peer's mean and the runs where slide is at or above that peer's
mean; it writes ``benchmarks/results/suite_seeds.json``. One seed is a single draw: on the
smallest sets one test point is 0.1-0.2% of P@1 and a seed moves P@1 by more than that.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import derived  # noqa: E402  (benchmarks/derived.py)

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "datasets"
RESULTS = ROOT / "benchmarks" / "results" / "suite.json"
SETS = ["bibtex", "delicious", "corel5k", "enron", "medical", "yeast", "scene", "tmc2007-500",
        "corel16k001", "rcv1subset2", "stackex-chemistry", "yahoo-arts"]
SYSTEMS = ["slide", "napkinxc", "pecos", "torch"]
# On sets whose features slide standardizes (data.standardize: auto, dense features), each peer
# also runs on the L2-normalised rows alone ("-l2"): the same input as slide's, and the input
# that suits the peer best, both in the table; the gap column takes the better.
L2_SUFFIX = "-l2"
KS = (1, 3, 5)
# The dense baseline trains the default network for this many epochs (slide's epochs are
# chosen per set by validation; the dense net is given the count the defaults used before).
TORCH_EPOCHS = 13


def data_paths(name: str):
    if name in derived.DERIVED + derived.GENERATED:   # built from the shared sets, or generated (derived.py)
        return derived.paths(name, data_paths)
    shipped = ROOT / "datasets" / name
    folder = shipped if (shipped / "train.txt").exists() else SHARED / name
    return str(folder / "train.txt"), str(folder / "test.txt")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def xmc_model(system: str, cfg):
    """An untrained XMC library model of ``system`` (``napkinxc`` or ``pecos``) with ``cfg``'s
    threads, seed and input scaling; None for another name."""
    if system == "napkinxc":
        from slide.baselines.napkinxc_plt import NapkinPLT

        return NapkinPLT(cfg)
    if system == "pecos":
        from slide.baselines.pecos_linear import PecosXLinear

        return PecosXLinear(cfg)
    return None


def run_json(cmd, threads: int, timeout: Optional[float] = None):
    """Runs ``cmd`` (a worker that prints its result as a JSON line) outside the checkout, so that
    the interpreter's installed slide is imported, not the source folder: (the last JSON line or
    None, the return code, the last line of its error output). TimeoutExpired is raised."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tempfile.gettempdir(),
                       env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    result = next((json.loads(line) for line in reversed(p.stdout.splitlines()) if line.startswith("{")), None)
    tail = ((p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"])[0]
    return result, p.returncode, tail


def worker(system: str, name: str, threads: int, seed=None) -> dict:
    """Train and score one system on one set in this process; returns the result row."""
    import slide

    train_path, test_path = data_paths(name)
    train, test = slide.load_dataset(train_path), slide.load_dataset(test_path)
    row = {"set": name, "system": system}
    # the same propensities for every system: from the training labels (as slide computes them)
    props = slide.metrics.propensities(train.labels, 0.55, 1.5)
    cfg = slide.Config.from_dict({"training": {"threads": threads}})
    if seed is not None:
        cfg.training.seed = row["seed"] = int(seed)
    if system.endswith(L2_SUFFIX):
        system = system[:-len(L2_SUFFIX)]
        cfg.data.standardize = False
    if system == "slide":
        model = slide.Network(cfg)
        train_call = model.fit
    elif system in ("napkinxc", "pecos"):
        model = xmc_model(system, cfg)
        train_call = model.fit
    elif system == "torch":
        from slide.baselines.torch_dense import TorchDenseTrainer

        model = TorchDenseTrainer(cfg, train.num_features, train.num_labels)
        train_call = lambda data: model.fit_for(data, epochs=TORCH_EPOCHS)  # noqa: E731
    else:
        raise ValueError(f"unknown system {system!r}")
    t0 = time.perf_counter()
    result = train_call(train)
    row["train_seconds"] = time.perf_counter() - t0
    top = model.predict(test, k=max(KS))[0] if system == "slide" else \
        model.predict_topk(test.features, k=max(KS))[0]
    row.update(_scores(top, test, props))
    if system == "slide":
        row["epochs"] = {"best": result.best_epoch, "refit": result.refit_epochs}
        row["centroid_weight"] = model.centroid_weight
        row["standardized"] = model.standardized
    row["peak_rss_bytes"] = _peak_rss()
    return row


def _standardized(name: str) -> bool:
    """Whether the default configuration standardizes this set's features."""
    import slide
    from slide.scaling import wants_standardize

    return wants_standardize(slide.Config.load(None).data.standardize, slide.load_dataset(data_paths(name)[0]).features)


def _scores(top, test, props) -> dict:
    """P@k and PSP@k by slide.metrics, the same code and propensities for every system."""
    from slide import metrics

    scores = metrics.evaluate(top, test.labels, k=KS, propensities=props)
    wanted = {f"P@{k}" for k in KS} | {f"PSP@{k}" for k in KS}
    return {k: float(v) for k, v in scores.items() if k in wanted}


def run_isolated(system: str, name: str, threads: int, python: str, timeout: float, seed=None) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--worker", system, name, "--threads", str(threads)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    try:
        result, code, tail = run_json(cmd, threads, timeout)
    except subprocess.TimeoutExpired:
        return {"set": name, "system": system, "error": f"timed out after {timeout:.0f} s"}
    return result if result is not None else {"set": name, "system": system, "error": f"exit {code}: {tail[:200]}"}


def _set_names(sets: str):
    """``--sets``: comma-separated names, ``derived`` and ``generated`` standing for those sets of
    derived.py."""
    groups = {"derived": derived.DERIVED, "generated": derived.GENERATED}
    return [n for part in sets.split(",") for n in groups.get(part, [part])]


def merge_rows(old, new):
    """``--merge``: the rows of ``old`` whose (set, system) ``new`` does not run, then ``new``."""
    done = {(r["set"], r["system"]) for r in new}
    return [r for r in old if (r["set"], r["system"]) not in done] + list(new)


def format_table(rows) -> str:
    by = {}
    for r in rows:
        by.setdefault(r["set"], {})[r["system"]] = r
    order = SYSTEMS + [s + L2_SUFFIX for s in SYSTEMS[1:]]
    systems = [s for s in order if any(s in v for v in by.values())]
    out = ["| set | system | P@1 | P@3 | P@5 | PSP@1 | PSP@3 | PSP@5 | train s | peak RSS MiB | slide P@1 - best peer |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in [s for s in SETS if s in by] + [s for s in by if s not in SETS]:
        peers = [by[name][s]["P@1"] for s in systems if s != "slide" and "P@1" in by[name].get(s, {})]
        for s in systems:
            r = by[name].get(s)
            if r is None:
                continue
            if "error" in r:
                out.append(f"| {name} | {s} | {r['error']} | | | | | | | | |")
                continue
            gap = ""
            if s == "slide" and peers:
                gap = f"{r['P@1'] - max(peers):+.4f}"
            out.append(f"| {name} | {s} | " + " | ".join(f"{r.get(m, float('nan')):.4f}" for m in
                                                        ("P@1", "P@3", "P@5", "PSP@1", "PSP@3", "PSP@5"))
                       + f" | {r['train_seconds']:.1f} | {r['peak_rss_bytes'] / 2**20:.0f} | {gap} |")
    return "\n".join(out)


def format_seeds_table(rows) -> str:
    """P@1 mean (min-max) over the seeds per set and system; slide's mean minus the best peer's."""
    import statistics

    by = {}
    for r in rows:
        if "P@1" in r:
            by.setdefault(r["set"], {}).setdefault(r["system"], []).append(r["P@1"])
    out = ["| set | system | seeds | P@1 mean (min-max) | slide mean - best peer mean | slide runs at or above that mean |",
           "|---|---|---|---|---|---|"]
    for name in [s for s in SETS if s in by] + [s for s in by if s not in SETS]:
        means = {s: statistics.mean(v) for s, v in by[name].items()}
        peers = {s: m for s, m in means.items() if s != "slide"}
        best = max(peers.values()) if peers else None
        for s, v in by[name].items():
            gap = at = ""
            if s == "slide" and best is not None:
                gap = f"{means[s] - best:+.4f}"
                at = f"{sum(x >= best - 1e-12 for x in v)} of {len(v)}"
            out.append(f"| {name} | {s} | {len(v)} | {means[s]:.4f} ({min(v):.4f}-{max(v):.4f}) | {gap} | {at} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default=",".join(SETS),
                    help="comma-separated set names; 'derived' and 'generated' = those sets of "
                         "benchmarks/derived.py")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pecos-python", default=os.environ.get("SLIDE_PECOS_PYTHON"),
                    help="a Python with libpecos (NumPy<2) and slide installed")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per system and set")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows already in --out of other sets and systems "
                         "(the set and system pairs run now replace theirs)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--seeds", help="comma-separated training.seed values: every system once per seed "
                                    "(writes results/suite_seeds.json unless --out is given)")
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "SET"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.threads, args.seed)), flush=True)
        return 0
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [None]
    names = _set_names(args.sets)
    if args.out == str(RESULTS):   # the default file of these sets and seeds
        # sets of benchmarks/derived.py alone (--sets derived or generated, or some by name) have their own file
        stem = "suite" + ("_derived" if all(n in derived.DERIVED for n in names) else
                          "_generated" if all(n in derived.GENERATED for n in names) else "") \
            + ("_seeds" if args.seeds else "")
        args.out = str(RESULTS.with_name(stem + ".json"))
    fmt = format_seeds_table if args.seeds else format_table
    if args.table_only:
        print(fmt(json.loads(Path(args.out).read_text())["rows"]))
        return 0
    rows = []
    for name in names:
        systems = args.systems.split(",")
        if _standardized(name):
            systems += [s + L2_SUFFIX for s in systems if s != "slide" and not s.endswith(L2_SUFFIX)]
        for system in systems:
            if system.startswith("pecos") and not args.pecos_python:
                rows.append({"set": name, "system": system,
                             "error": "not run (needs --pecos-python: libpecos wants NumPy<2)"})
                continue
            python = args.pecos_python if system.startswith("pecos") else sys.executable
            for seed in seeds:
                r = run_isolated(system, name, args.threads, python, args.timeout, seed)
                rows.append(r)
                shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                         if k in ("set", "system", "seed", "P@1", "train_seconds", "error")}
                print(json.dumps(shown), flush=True)
    if args.merge and Path(args.out).exists():
        rows = merge_rows(json.loads(Path(args.out).read_text())["rows"], rows)
    table = fmt(rows)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        # the PECOS interpreter's path is this machine's own: recorded as PY
        "command": " ".join(["python", "benchmarks/suite.py"] + [
            "PY" if a == args.pecos_python else a for a in (argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "threads": args.threads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
