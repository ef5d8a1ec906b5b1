#!/usr/bin/env python
"""Regenerate the slide-vs-baseline comparison table of benchmarks/README.md.

For each data set, ``slide.baselines.compare.run_compare`` trains slide and the baseline (dense PyTorch
network of the same architecture by default) for the same training-time budget, each in its own
process, and measures both with the same metric code on the same test points. One JSON per data
set is written to ``benchmarks/results/compare_<dataset>_<baseline>.json`` and the table between
the ``results`` markers of ``benchmarks/README.md`` is rebuilt from all JSON files there.

Examples::

    python benchmarks/run_all.py --datasets bibtex,delicious --budget 60
    python benchmarks/run_all.py --datasets synth-20k --budget 300 --max-train 50000
    python benchmarks/run_all.py --datasets amazon-670k --budget 600 --max-train 50000 --eval-samples 5000
    python benchmarks/run_all.py --datasets bibtex,delicious --budget 30 --seeds 0,1,2
    python benchmarks/run_all.py --baseline napkinxc --datasets bibtex,delicious --budget 30
    python benchmarks/run_all.py --table-only          # rebuild the README table from results/

Real data sets (bibtex, delicious) are read from ``--data-root`` (default: ``../shared/datasets``
beside the repository, else the repository's ``datasets/``). Synthetic sets come from
``slide.datasets.make_synthetic``; ``--max-train``/``--max-test`` cut them (the JSON and the
table say how many points were used).

``--seeds 0,1,2`` repeats each comparison with ``training.seed`` set to each seed (for both
systems: initialisation, shuffling, dropout), writes ``results/seeds/compare_<dataset>_<baseline>_seed<s>.json``
and rebuilds the second table of the README (between the ``seeds`` markers): the spread over
seeds of both systems' final and best P@1 and of the samples/s ratio.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import sys
import tempfile
from typing import Any, Dict, List, Optional

from slide.baselines.compare import BASELINES, ONE_CALL

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
README = os.path.join(HERE, "README.md")
REAL = ("bibtex", "delicious")
SYNTHETIC = ("synth-20k", "amazon-670k", "delicious-200k")
SEEDS_DIR = os.path.join(RESULTS, "seeds")
START, END = "<!-- results:start -->", "<!-- results:end -->"
SEEDS_START, SEEDS_END = "<!-- seeds:start -->", "<!-- seeds:end -->"


def _real_dir(name: str, data_root: Optional[str]) -> str:
    roots = [data_root] if data_root else [os.path.join(os.path.dirname(ROOT), "shared", "datasets"),
                                          os.path.join(ROOT, "datasets")]
    for r in roots:
        d = os.path.join(r, name)
        if os.path.exists(os.path.join(d, "train.txt")) and os.path.exists(os.path.join(d, "test.txt")):
            return d
    raise FileNotFoundError(f"{name}: no train.txt/test.txt under {', '.join(roots)}")


def _config(name: str, args, extra: Optional[List[str]] = None):
    """The data set's shipped training config (architecture, LSH, batch, lr) when there is one:
    for a synthetic preset its ``synth-<name>.yaml`` first (settings for the synthetic data),
    else ``<name>.yaml``."""
    from slide.config import Config
    from slide.datasets import config_path

    cfg = Config()
    source = "defaults"
    for candidate in ([] if name in REAL else [f"synth-{name}"]) + [name]:
        try:
            p = config_path(candidate)
        except (FileNotFoundError, ValueError):
            continue
        if p and os.path.exists(p):
            cfg = Config.from_yaml(p)
            source = os.path.relpath(p, ROOT)
            break
    if args.threads is not None:
        cfg.training.threads = args.threads
    sets = list(args.set) + list(extra or [])
    if sets:
        cfg = cfg.with_overrides(sets)
        source += " with " + " ".join(sets)
    d = cfg.to_dict()
    d["data"]["train"] = d["data"]["test"] = d["data"]["valid"] = None
    return d, source


def run_one(name: str, args, seed: Optional[int] = None) -> Dict[str, Any]:
    from slide.baselines.compare import run_compare

    cfg, source = _config(name, args, [] if seed is None else [f"training.seed={seed}"])
    notes: List[str] = []
    train = test = None
    if name in REAL:
        d = _real_dir(name, args.data_root)
        cfg["data"]["train"] = os.path.join(d, "train.txt")
        cfg["data"]["test"] = os.path.join(d, "test.txt")
    else:
        from slide.datasets import PRESETS, make_synthetic
        spec = PRESETS[name]
        shape = {}
        if args.max_train and args.max_train < spec.num_train:
            shape["num_train"] = args.max_train
            notes.append(f"{args.max_train} of {spec.num_train} train points")
        if args.max_test and args.max_test < spec.num_test:
            shape["num_test"] = args.max_test
            notes.append(f"{args.max_test} of {spec.num_test} test points")
        train, test = make_synthetic(name, seed=args.seed, **shape)
    tag = f"{name}_{args.baseline}" + ("" if seed is None else f"_seed{seed}")
    out = os.path.join(ROOT, "runs", "benchmarks", tag)
    result = run_compare(cfg, baseline=args.baseline, budget_seconds=args.budget, device=args.device,
                         out_dir=out, progress=not args.quiet, train=train, test=test,
                         eval_samples=args.eval_samples, dataset_name=name,
                         marks=[round(f * args.budget, 3) for f in args.marks] if args.marks else None)
    ds = result["dataset"]
    if ds["eval_points"] != ds["test_points"]:
        notes.append(f"evaluated on {ds['eval_points']} of {ds['test_points']} test points")
    result["benchmark"] = {
        "command": " ".join(["python", "benchmarks/run_all.py"] + sys.argv[1:]),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "config_source": source,
        "notes": notes,
        "plot": os.path.relpath(result["plot"], ROOT),
    }
    _relative_paths(result)
    if seed is not None:
        result["benchmark"]["seed"] = seed
    folder = RESULTS if seed is None else SEEDS_DIR
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"compare_{tag}.json")
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as fh:
        json.dump(result, fh, indent=1)
    os.chmod(fh.name, 0o644)
    os.replace(fh.name, path)
    return result


def _relative_paths(result: Dict[str, Any]) -> None:
    """Paths in a committed result are relative to the repository (no machine's folders)."""
    def rel(p):
        return os.path.relpath(p, ROOT) if isinstance(p, str) and os.path.isabs(p) else p
    result["plot"] = rel(result.get("plot"))
    for k in ("train", "test"):
        result["dataset"][k] = rel(result["dataset"].get(k))
    for k in ("train", "test", "valid"):
        result["config"]["data"][k] = rel(result["config"]["data"].get(k))


# ---------------------------------------------------------------------- table

def _f(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def _p1_at(records, mark):
    r = [x for x in records if x.get("mark") == mark]
    return r[0]["P@1"] if r else None


def _mib(v):
    return "-" if v is None else f"{v / 2**20:.0f}"


def table_rows(results: List[Dict[str, Any]]) -> str:
    head = ("| data set | points (train/test eval) | labels | baseline | budget s | samples/s slide | "
            "samples/s baseline | ratio | P@1 slide @½ / @end | P@1 baseline @½ / @end | P@5 slide / baseline @end | "
            "baseline best P@1 | slide time to it | baseline time to it | peak RSS MiB slide / baseline | notes |")
    sep = "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"
    lines = [head, sep]
    for r in results:
        b = r["baseline"]
        s, t = r["systems"].get("slide", {}), r["systems"].get(b, {})
        ss, ts = s.get("summary", {}), t.get("summary", {})
        marks = r["marks"]
        half = min(marks, key=lambda m: abs(m - r["budget_seconds"] / 2)) if marks else None
        end = marks[-1] if marks else None
        c = r["comparison"]
        ds = r["dataset"]
        notes = list(r.get("benchmark", {}).get("notes", []))
        src = r.get("benchmark", {}).get("config_source", "")
        if " with " in src:
            notes.append("config: " + src)
        cfg = r.get("config", {})
        try:
            hidden = "x".join(str(l["size"]) for l in cfg["layers"][:-1]) or "none"
            notes.append(f"hidden {hidden}, batch {cfg['training']['batch_size']}, "
                         f"lr {cfg['optimizer']['lr']:g}, dropout {cfg['training']['dropout']:g}")
        except (KeyError, TypeError):
            pass
        threads = {ss.get("threads"), ts.get("threads")} - {None}
        if threads:
            notes.append("threads " + "/".join(str(t) for t in sorted(threads)))
        for n, sysr in (("slide", s), (b, t)):
            if "error" in sysr:
                notes.append(f"{n} failed: {sysr['error'].splitlines()[0][:80]}")
        if c.get("slide_seconds_to_target") is None and c.get("target_P@1") is not None:
            notes.append("slide did not reach the baseline's best within the budget")
        lines.append("| " + " | ".join([
            ds["name"], f"{ds['train_points']}/{ds['eval_points']}", str(ds["num_labels"]), b,
            _f(r["budget_seconds"], "g"),
            _f(ss.get("samples_per_second"), ".0f"), _f(ts.get("samples_per_second"), ".0f"),
            _f(c.get("samples_per_second_ratio"), ".2f") if b not in ONE_CALL else "- (one pass)",
            f"{_f(_p1_at(s.get('records', []), half))} / {_f(_p1_at(s.get('records', []), end))}",
            f"{_f(_p1_at(t.get('records', []), half))} / {_f(_p1_at(t.get('records', []), end))}"
            if b not in ONE_CALL else f"- / {_f(ts.get('best_P@1'))}",
            f"{_f(ss.get('final', {}).get('P@5'))} / {_f(ts.get('final', {}).get('P@5'))}",
            _f(c.get("target_P@1")),
            _f(c.get("slide_seconds_to_target"), ".1f"), _f(c.get("baseline_seconds_to_target"), ".1f"),
            f"{_mib(ss.get('peak_rss_bytes'))} / {_mib(ts.get('peak_rss_bytes'))}",
            "; ".join(notes) or "",
        ]) + " |")
    return "\n".join(lines)


def _spread(values: List[float], spec: str = ".3f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return format(mean, spec)
    return f"{format(mean, spec)} ({format(min(values), spec)}-{format(max(values), spec)})"


def seed_rows(results: List[Dict[str, Any]]) -> str:
    """One row per data set and baseline: mean (min-max) over the seeds' runs."""
    head = ("| data set | baseline | seeds | budget s | P@1 slide @end | P@1 baseline @end | best P@1 slide | "
            "best P@1 baseline | samples/s ratio | runs where slide ends at or above the baseline |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["dataset"]["name"], r["baseline"], r["budget_seconds"]), []).append(r)
    for (name, b, budget), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r.get("benchmark", {}).get("seed", 0))

        def final(r, system):
            return r["systems"].get(system, {}).get("summary", {}).get("final", {}).get("P@1")

        def best(r, system):
            return r["systems"].get(system, {}).get("summary", {}).get("best_P@1")

        sf, bf = [final(r, "slide") for r in rs], [final(r, b) for r in rs]
        wins = sum(1 for x, y in zip(sf, bf) if x is not None and y is not None and round(x, 4) >= round(y, 4))
        lines.append("| " + " | ".join([
            name, b, ",".join(str(r.get("benchmark", {}).get("seed", "?")) for r in rs), _f(budget, "g"),
            _spread(sf), _spread(bf), _spread([best(r, "slide") for r in rs]), _spread([best(r, b) for r in rs]),
            _spread([r["comparison"].get("samples_per_second_ratio") for r in rs], ".2f") if b not in ONE_CALL else "-",
            f"{wins} of {len(rs)}",
        ]) + " |")
    return "\n".join(lines)


def _load(folder: str) -> List[Dict[str, Any]]:
    out = []
    if os.path.isdir(folder):
        for fn in sorted(os.listdir(folder)):
            if fn.startswith("compare_") and fn.endswith(".json"):
                with open(os.path.join(folder, fn), "r", encoding="utf-8") as fh:
                    out.append(json.load(fh))
    return out


def _replace(text: str, start: str, end: str, body: str) -> str:
    if start not in text or end not in text:
        raise SystemExit(f"{README}: the markers {start} / {end} are missing")
    return re.sub(re.escape(start) + r".*?" + re.escape(end), lambda m: f"{start}\n{body}\n{end}", text, flags=re.S)


def update_readme() -> str:
    results = _load(RESULTS)
    table = table_rows(results) if results else "(no results yet: run benchmarks/run_all.py)"
    seeded = _load(SEEDS_DIR)
    seeds = seed_rows(seeded) if seeded else "(no results yet: run benchmarks/run_all.py --seeds 0,1,2)"
    with open(README, "r", encoding="utf-8") as fh:
        text = fh.read()
    new = _replace(text, START, END, table)
    if SEEDS_START in text:
        new = _replace(new, SEEDS_START, SEEDS_END, seeds)
    with open(README, "w", encoding="utf-8") as fh:
        fh.write(new)
    return table + ("\n\n" + seeds if seeded else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="bibtex,delicious",
                   help=f"comma-separated, from {', '.join(REAL + SYNTHETIC)} (default: bibtex,delicious)")
    p.add_argument("--budget", type=float, default=60.0, help="training seconds per system (default 60)")
    p.add_argument("--baseline", choices=BASELINES, default="torch")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    p.add_argument("--threads", type=int, default=None, help="override training.threads (0 = all cores)")
    p.add_argument("--max-train", type=int, default=0, help="cut synthetic train sets to this many points")
    p.add_argument("--max-test", type=int, default=0, help="cut synthetic test sets to this many points")
    p.add_argument("--eval-samples", type=int, default=None,
                   help="evaluate on this many test points (0 = all; default: training.eval_samples)")
    p.add_argument("--marks", type=lambda t: [float(v) for v in t.split(",")], default=None,
                   metavar="F1,F2,...", help="evaluation marks as fractions of the budget "
                   "(default: slide.baselines.compare.default_marks); fewer marks = less evaluation time")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configuration key for both systems, e.g. layers.1.lsh.range_pow=16 "
                   "(repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    p.add_argument("--data-root", default=None, help="folder holding bibtex/ and delicious/")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--seeds", type=lambda t: [int(v) for v in t.split(",")], default=None, metavar="S1,S2,...",
                   help="repeat each comparison with training.seed set to each of these (results/seeds/)")
    p.add_argument("--table-only", action="store_true", help="only rebuild the README tables")
    args = p.parse_args(argv)
    if not args.table_only:
        names = [n.strip() for n in args.datasets.split(",") if n.strip()]
        unknown = [n for n in names if n not in REAL + SYNTHETIC]
        if unknown:
            p.error(f"unknown data set(s) {', '.join(unknown)}; choose from {', '.join(REAL + SYNTHETIC)}")
        for n in names:
            for seed in (args.seeds if args.seeds else [None]):
                run_one(n, args, seed)
    print(update_readme())
    return 0


if __name__ == "__main__":
    sys.exit(main())
