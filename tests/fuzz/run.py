"""Run every fuzz target (or some) for a while; the long form of tests/test_fuzz.py.

    python tests/fuzz/run.py --minutes 10                 # all targets, 10 minutes shared
    python tests/fuzz/run.py --minutes 5 dataset          # one target
    python tests/fuzz/run.py --runs 2000 --out /tmp/fuzz  # fixed number of inputs each
    SLIDE_FUZZ_STRICT=1 python tests/fuzz/run.py ...      # known, reported issues fail too

Each target runs in its own process, so a crash (segfault, abort, sanitizer report)
is caught and its input kept: crashing inputs land in ``<out>/<target>/crash-*``,
new interesting inputs in ``<out>/<target>/corpus``. Replay one with
``python tests/fuzz/fuzz_<target>.py <crash-file>``. Exit status: 0 when every
target finished without a finding.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("config", "dataset", "checkpoint")


def command(target: str, out_dir: str, *, seconds: float = 0, runs: int = 0, extra=()) -> list:
    """The libFuzzer command line for one target; the first corpus folder receives new inputs."""
    corpus = os.path.join(out_dir, "corpus")
    os.makedirs(corpus, exist_ok=True)
    cmd = [sys.executable, os.path.join(HERE, f"fuzz_{target}.py"),
           f"-artifact_prefix={out_dir}{os.sep}", "-timeout=20", "-rss_limit_mb=3072",
           "-print_final_stats=1"]
    if seconds:
        cmd.append(f"-max_total_time={max(1, int(seconds))}")
    if runs:
        cmd.append(f"-atheris_runs={int(runs)}")
    dict_path = os.path.join(HERE, f"{target}.dict")
    if os.path.exists(dict_path):
        cmd.append(f"-dict={dict_path}")
    cmd += list(extra)
    seeds = os.path.join(HERE, "corpus", target)
    # git keeps no empty folders: the checkpoint target builds its seeds at start-up
    cmd += [corpus] + ([seeds] if os.path.isdir(seeds) else [])
    return cmd


def executions(output: str) -> int:
    """Inputs executed, from libFuzzer's final statistics or its 'Done N runs' line."""
    m = re.findall(r"stat::number_of_executed_units:\s*(\d+)", output) or re.findall(r"Done (\d+) (?:runs )?in", output)
    return int(m[-1]) if m else 0


def run_target(target: str, out_dir: str, *, seconds: float = 0, runs: int = 0, timeout: float = None):
    """Run one target; returns (returncode, executions, crash files, output)."""
    os.makedirs(out_dir, exist_ok=True)
    # the target's scratch files go inside out_dir: its process ends without Python's clean-up
    env = dict(os.environ, PYTHONUNBUFFERED="1", SLIDE_FUZZ_SCRATCH=os.path.join(out_dir, "scratch"))
    r = subprocess.run(command(target, out_dir, seconds=seconds, runs=runs), capture_output=True, text=True,
                       env=env, timeout=timeout, cwd=out_dir)
    output = r.stdout + r.stderr
    crashes = sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir)
                     if f.startswith(("crash-", "timeout-", "oom-", "leak-")))
    return r.returncode, executions(output), crashes, output


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help=f"targets to run ({', '.join(TARGETS)}; default all)")
    p.add_argument("--minutes", type=float, default=0, help="total time, shared equally by the targets")
    p.add_argument("--runs", type=int, default=0, help="inputs per target")
    p.add_argument("--out", help="folder for corpora and crashing inputs (default: a new temporary folder)")
    args = p.parse_args(argv)
    targets = args.targets or list(TARGETS)
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        p.error(f"unknown target(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    if not args.minutes and not args.runs:
        args.minutes = 10
    out = args.out or tempfile.mkdtemp(prefix="slide-fuzz-")
    seconds = args.minutes * 60 / len(targets) if args.minutes else 0
    failed = False
    for t in targets:
        start = time.time()
        rc, n, crashes, output = run_target(t, os.path.join(out, t), seconds=seconds, runs=args.runs)
        status = "ok" if rc == 0 and not crashes else "FINDING"
        failed |= status != "ok"
        print(f"{t:<11} {status:<8} {n:>9} inputs  {time.time() - start:7.1f} s", flush=True)
        if status != "ok":
            print(output[-4000:])
            for c in crashes:
                print(f"  input kept: {c}")
    print(f"corpora and findings: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
