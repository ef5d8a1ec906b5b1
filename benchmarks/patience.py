"""``training.patience_samples`` on large data: the default ``slide train`` with and without it.

    python benchmarks/patience.py [--train 70000] [--caps 250000,0]

Generates a set larger than any of the shared ones (``slide.datasets.make_synthetic``: 2,150
features, 208 labels, about 2 labels and 120 non-zeros a point, seed 0; ``--train`` training and a
quarter as many test points, the shape of a bookmarking set), then runs the default command on it
once per cap (``--set training.patience_samples=C``), each in a fresh process, one after the other.
Records the process's wall time, the training seconds, the epochs the search ran, its best epoch
and the test P@1. Prints a table and writes ``benchmarks/results/patience.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoints import ROOT, train_command  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "patience.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=70_000)
    ap.add_argument("--caps", default="250000,0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    import slide

    rows = []
    with tempfile.TemporaryDirectory(prefix="slide-patience-") as tmp:
        work = Path(tmp)
        train, test = slide.datasets.make_synthetic(num_features=2150, num_labels=208, num_train=args.train,
                                                    num_test=args.train // 4, avg_labels=2, avg_nnz=120, seed=0)
        train.save(work / "train.txt")
        test.save(work / "test.txt")
        cfg = work / "set.yaml"
        cfg.write_text(yaml.safe_dump({"data": {"train": str(work / "train.txt"), "test": str(work / "test.txt")},
                                       "training": {"threads": args.threads}}))
        for cap in args.caps.split(","):
            out = work / f"run-{cap}"
            wall, s = train_command(cfg, out, f"training.patience_samples={cap}")
            search = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            search = [r for r in search if r.get("phase") == "search"]
            row = {"patience_samples": int(cap), "process_seconds": round(wall, 2),
                   "train_seconds": round(s["train_seconds"], 2), "search_epochs": len(search),
                   "best_epoch": s["best_epoch"], "refit_epochs": s["refit_epochs"], "P@1": s["P@1"],
                   "P@5": s["P@5"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("| patience_samples | process s | train s | search epochs | best epoch | P@1 | P@5 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['patience_samples']:,} | {r['process_seconds']:.1f} | {r['train_seconds']:.1f} | "
              f"{r['search_epochs']} | {r['best_epoch']} | {r['P@1']:.4f} | {r['P@5']:.4f} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                          "threads": args.threads, "train": args.train, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
