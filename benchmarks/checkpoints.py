"""What checkpoints cost the default ``slide train``: its wall time under each checkpoint policy.

    python benchmarks/checkpoints.py [--sets rcv1subset2,bibtex,yahoo-arts,delicious] [--policies auto,1,0]

For each set (names as in ``benchmarks/suite.py``) runs the default command, ``slide train`` on
the set's train and test files with ``--set training.checkpoint_every=P``, once per policy P, each in a
fresh process, a set's policies back to back (so that they share the machine's load), and records the process's wall time, the training seconds and the seconds with
evaluations and checkpoints from ``summary.json``, the bytes of one checkpoint and the test
P@1 (which no policy may change). Prints a table and writes
``benchmarks/results/checkpoints.json``.
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
from typing import Tuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import ROOT, data_paths  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "checkpoints.json"


def train_command(cfg: Path, out: Path, setting: str) -> Tuple[float, dict]:
    """Runs ``slide train CFG --set SETTING`` into ``out`` in a fresh process: (its wall
    seconds, its summary.json); a failed run ends the benchmark with its last error line."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "slide", "train", str(cfg), "--quiet", "--out", str(out),
                        "--set", setting], capture_output=True, text=True, cwd=cfg.parent)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{cfg.name} ({setting}): slide train failed: "
                         f"{(p.stderr.strip().splitlines() or ['no output'])[-1]}")
    return wall, json.loads((out / "summary.json").read_text())


def run_once(name: str, policy: str, threads: int, work: Path) -> dict:
    train, test = data_paths(name)
    cfg = work / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"train": train, "test": test},
                                   "training": {"threads": threads}}))
    out = work / f"{name}-{policy}"
    wall, s = train_command(cfg, out, f"training.checkpoint_every={policy}")
    ckpts = sorted((out / "checkpoints").glob("*.json"))
    size = json.loads(ckpts[-1].read_text())["model_bytes"] if ckpts else 0
    subprocess.run(["rm", "-rf", str(out)], check=True)   # a run folder of rcv1subset2 holds 1.3 GB
    return {"set": name, "policy": policy, "process_seconds": round(wall, 2),
            "train_seconds": round(s["train_seconds"], 2),
            "with_evaluations_and_checkpoints": round(s["wall_seconds"], 2),
            "checkpoint_bytes": size, "P@1": s["P@1"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="rcv1subset2,bibtex,yahoo-arts,delicious")
    ap.add_argument("--policies", default="auto,1,0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="slide-ckpt-") as tmp:
        for name in args.sets.split(","):
            for policy in args.policies.split(","):
                row = run_once(name, policy, args.threads, Path(tmp))
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("| set | checkpoint_every | process s | train s | with evaluations and checkpoints s "
          "| one checkpoint MB | P@1 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['set']} | {r['policy']} | {r['process_seconds']:.1f} | {r['train_seconds']:.1f} | "
              f"{r['with_evaluations_and_checkpoints']:.1f} | {r['checkpoint_bytes'] / 1e6:.0f} | "
              f"{r['P@1']:.4f} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                          "threads": args.threads, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
