"""Label-sharded training on 1, 2 and 4 MPI ranks, on the amazon-670k shape.

    python benchmarks/scale_out.py [--ranks 1 2 4] [--train 20000] [--test 2000] [--seconds 90]
    python benchmarks/scale_out.py --plan      # the scaling plan table, anchored on the JSON

Generates synthetic data with the shape of Amazon-670K (135,909 features, 670,091 labels;
``--train`` / ``--test`` points), then trains ``datasets/synth-amazon-670k.yaml`` (one thread per
rank) for ``--seconds`` of training time on each number of ranks: one process without MPI, then
``mpiexec -n R`` (oversubscribed when R exceeds the cores). Reports samples/s, test P@1 after each
epoch (over training seconds), peak RSS and the engine's output-layer state per rank, and the
bytes each rank put into the training allreduces per batch, measured, next to the formula
(slide.distributed.bytes_per_batch). Prints a table and writes benchmarks/results/scale_out.json.
Needs the mpi extra (pip install -e ".[mpi]").
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "scale_out.json"
CONFIG = ROOT / "datasets" / "synth-amazon-670k.yaml"


def worker(data_dir: Path, seconds: float, out: Path) -> None:
    import slide
    from slide._util import peak_rss_bytes
    from slide.distributed import bytes_per_batch, world

    comm = world()
    rank = comm.Get_rank() if comm is not None else 0
    xtr, ytr, xte, yte = [sp.load_npz(data_dir / f"{n}.npz").tocsr() for n in ("xtr", "ytr", "xte", "yte")]
    cfg = slide.Config.from_yaml(CONFIG)
    cfg.data.train = cfg.data.test = None
    cfg.training.threads = 1
    cfg.training.epochs = 1000          # the time budget stops training
    cfg.training.time_budget = seconds
    net = slide.Network(cfg, comm=comm)
    t0 = time.perf_counter()
    hist = net.fit((xtr, ytr), test=(xte, yte))
    wall = time.perf_counter() - t0
    core = net._core
    rep = net.memory_report()
    row = {
        "rank": rank,
        "peak_rss_bytes": peak_rss_bytes(),
        "weights_bytes": rep["weights"], "optimizer_bytes": rep["optimizer"], "tables_bytes": rep["tables"],
        "output_rows": int(getattr(core, "end", net.num_labels) - getattr(core, "begin", 0)),
    }
    rows = comm.gather(row, root=0) if comm is not None else [row]
    if rank != 0:
        return
    records = [{"seconds": r["seconds"], "epoch": r["epoch"], "P@1": r.get("test/P@1")} for r in hist.records]
    train_seconds = hist.records[-1]["seconds"] if hist.records else wall
    batches = getattr(core, "batches", 0)
    dh = int(core.shard_dh_dim) if comm is not None else 0
    result = {
        "ranks": net.ranks,
        "samples_per_second": net.samples_trained / train_seconds,
        "train_seconds": train_seconds,
        "epochs": net.epoch,
        "final_P@1": records[-1]["P@1"] if records else None,
        "curve": records,
        "per_rank": rows,
        "bytes_per_batch_measured": (core.train_bytes / batches) if batches else 0,
        "mean_batch": net.samples_trained / max(1, net.step),
        "bytes_per_batch_formula": bytes_per_batch(net.samples_trained / max(1, net.step), dh) if comm else 0,
    }
    out.write_text(json.dumps(result))


def generate(data_dir: Path, n_train: int, n_test: int, seed: int) -> None:
    from slide.datasets import make_synthetic_arrays

    arrays = make_synthetic_arrays("amazon-670k", seed=seed, num_train=n_train, num_test=n_test)
    for name, a in zip(("xtr", "ytr", "xte", "yte"), arrays):
        sp.save_npz(data_dir / f"{name}.npz", a, compressed=False)


def plan(anchor: Path) -> None:
    """Memory per rank, bytes per batch and the bandwidth that keeps the measured samples/s, for
    10^6-10^8 labels at hidden 128 and 512 (slide.memory.estimate with the amazon-670k config)."""
    import slide
    from slide.distributed import bytes_per_batch
    from slide.memory import estimate

    sps = None
    if anchor.exists():
        doc = json.loads(anchor.read_text())
        one = [r for r in doc["results"] if r["ranks"] == 1]
        sps = one[0]["samples_per_second"] if one else None
    sps = sps or 3000.0
    cfg = slide.Config.from_yaml(CONFIG)
    b = cfg.training.batch_size
    nf = 135_909
    print(f"anchor: {sps:.0f} samples/s on one rank here (1 thread; {anchor.name}); batch {b}; "
          f"{nf} features; memory = weights + Adam + hash tables + batch scratch per rank (GiB)")
    ranks = [1, 2, 4, 8, 16, 32, 64]
    print(f"{'labels':>7} {'hidden':>6} " + " ".join(f"{'R=' + str(r):>7}" for r in ranks)
          + f" {'KiB/batch':>9} {'MB/s at anchor':>14} {'MB/s at 30K/s':>13}")
    for labels in (10**6, 10**7, 10**8):
        for hidden in (128, 512):
            c = cfg.copy()
            c.layers[0].size = hidden
            mem = []
            for r in ranks:
                e = estimate(c, nf, -(-labels // r), sampling=["dense", "lsh"])
                mem.append(e["total"] / 2**30)
            payload = bytes_per_batch(b, hidden)
            # a ring allreduce sends about twice the payload per rank; per second at sps samples
            rate = 2 * payload * sps / b / 1e6
            rate30 = 2 * payload * 30_000 / b / 1e6
            print(f"{labels:>7.0e} {hidden:>6} " + " ".join(f"{m:>7.1f}" for m in mem)
                  + f" {payload / 1024:>9.0f} {rate:>14.1f} {rate30:>13.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--test", type=int, default=2_000)
    ap.add_argument("--seconds", type=float, default=90.0, help="training seconds per run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--plan", action="store_true", help="print the scaling plan table and exit")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.data, args.seconds, args.worker)
        return
    if args.plan:
        plan(args.out)
        return
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if mpiexec is None and any(r > 1 for r in args.ranks):
        sys.exit('scale_out: mpiexec not found; pip install -e ".[mpi]"')
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        generate(tmp, args.train, args.test, args.seed)
        print(f"data: amazon-670k shape, {args.train} train / {args.test} test points "
              f"({time.perf_counter() - t:.0f} s to generate)", flush=True)
        for r in args.ranks:
            out = tmp / f"r{r}.json"
            cmd = [sys.executable, __file__, "--worker", str(out), "--data", str(tmp), "--seconds", str(args.seconds)]
            if r > 1:
                cmd = [mpiexec, "--oversubscribe", "-n", str(r)] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + cmd
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"scale_out: {r} ranks failed:\n{p.stderr[-3000:]}")
            res = json.loads(out.read_text())
            results.append(res)
            print(f"  {r} rank(s): {res['samples_per_second']:.0f} samples/s, P@1 {res['final_P@1']:.4f}", flush=True)
    cpu = os.cpu_count()
    print(f"\n{'ranks':>5} {'samples/s':>10} {'epochs':>6} {'P@1':>7} {'out rows/rank':>13} "
          f"{'state/rank MiB':>14} {'peak RSS/rank MiB':>17} {'bytes/batch':>11} {'formula':>9}")
    for res in results:
        pr = res["per_rank"]
        state = max(x["weights_bytes"] + x["optimizer_bytes"] + x["tables_bytes"] for x in pr) / 2**20
        rss = max(x["peak_rss_bytes"] for x in pr) / 2**20
        print(f"{res['ranks']:>5} {res['samples_per_second']:>10.0f} {res['epochs']:>6} {res['final_P@1']:>7.4f} "
              f"{max(x['output_rows'] for x in pr):>13} {state:>14.0f} {rss:>17.0f} "
              f"{res['bytes_per_batch_measured']:>11.0f} {res['bytes_per_batch_formula']:>9.0f}")
    print("\nP@1 over training seconds:")
    for res in results:
        print(f"  {res['ranks']} rank(s): " + ", ".join(f"{c['seconds']:.0f}s {c['P@1']:.3f}" for c in res["curve"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"cpus": cpu, "platform": platform.platform()},
                                    "train": args.train, "test": args.test, "seconds": args.seconds,
                                    "results": results}, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
