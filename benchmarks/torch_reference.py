"""Is the dense PyTorch baseline what a careful user would get? Check it against a plain script.

    python benchmarks/torch_reference.py [--labels 670091] [--batches 12] [--rounds 2] [--threads 2]

`slide compare --baseline torch` trains :class:`slide.baselines.torch_dense.TorchDenseTrainer`.
A comparison won against a slow or memory-hungry peer is worth nothing, so this script trains,
on the same amazon-670k-shaped synthetic batches (``slide.datasets.make_synthetic``), both

* **plain**: the script a user would write: ``nn.EmbeddingBag`` (sum, per-sample weights) to 128,
  ReLU, ``nn.Linear(128, labels)``, ``F.cross_entropy`` against soft targets (mass ``1/|y|`` on
  each true label, as a dense ``batch x labels`` tensor), fused Adam, batch 256;
* **baseline**: ``TorchDenseTrainer`` with the settings of ``datasets/synth-amazon-670k.yaml``
  (same layers, loss, batch, optimizer),

each in its own fresh process (so each peak RSS is its own), alternating which goes first over
``--rounds``. Each process trains one warm-up batch and then ``--batches`` timed batches, and
then scores 2,000 test points (the baseline in its chunks, the plain script in chunks of
2^24 scores, 25 rows at 670,091 labels, as a careful user would). Prints a table (median samples/s, peak RSS during training and
after scoring) and writes ``benchmarks/results/torch_reference.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIG = os.path.join(ROOT, "datasets", "synth-amazon-670k.yaml")


def _rss_mib() -> float:
    from slide._util import peak_rss_bytes
    return peak_rss_bytes() / 2**20


def _worker(kind: str, data: str, batches: int, threads: int) -> dict:
    import scipy.sparse as sp
    import torch

    torch.set_num_threads(threads)
    x = sp.load_npz(os.path.join(data, "xtr.npz")).tocsr()
    y = sp.load_npz(os.path.join(data, "ytr.npz")).tocsr()
    xte = sp.load_npz(os.path.join(data, "xte.npz")).tocsr()
    n_features, n_labels = x.shape[1], y.shape[1]
    bs = 256
    rng = np.random.default_rng(0)
    keep = np.flatnonzero(np.diff(y.indptr) > 0)
    order = keep[rng.permutation(keep.size)]
    times = []
    if kind == "baseline":
        import slide
        from slide.baselines.torch_dense import TorchDenseTrainer

        cfg = slide.Config.from_yaml(CONFIG)
        cfg.data.train = cfg.data.test = None
        cfg.training.threads = threads
        cfg.training.batch_size = bs
        tr = TorchDenseTrainer(cfg, num_features=n_features, num_labels=n_labels)
        sub_x, sub_y = x[order[: (batches + 1) * bs]], y[order[: (batches + 1) * bs]]
        # each fit_for call trains one epoch of one batch; the first is the warm-up
        t0 = time.perf_counter()
        tr.fit_for((sub_x[:bs], sub_y[:bs]), epochs=1)
        warm = time.perf_counter() - t0
        for b in range(1, batches + 1):
            t0 = time.perf_counter()
            tr.fit_for((sub_x[b * bs:(b + 1) * bs], sub_y[b * bs:(b + 1) * bs]), epochs=1)
            times.append(time.perf_counter() - t0)
        train_peak = _rss_mib()
        t0 = time.perf_counter()
        tr.predict_topk(xte, 5)
        score_s = time.perf_counter() - t0
        impl = tr.optimizer_impl
    else:
        import torch.nn.functional as F
        from torch import nn

        from slide.scaling import normalize_rows

        x = normalize_rows(x, "l2")
        xte = normalize_rows(xte, "l2")
        torch.manual_seed(0)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.EmbeddingBag(n_features, 128, mode="sum")
                self.out = nn.Linear(128, n_labels)

            def forward(self, ind, off, val):
                return self.out(torch.relu(self.embed(ind, off, per_sample_weights=val)))

        def tensors(sub):
            return (torch.from_numpy(sub.indices.astype(np.int64)),
                    torch.from_numpy(sub.indptr[:-1].astype(np.int64)),
                    torch.from_numpy(sub.data.astype(np.float32)))

        net = Net()
        opt = torch.optim.Adam(net.parameters(), lr=1e-2, fused=True)
        impl = "fused"
        for b in range(batches + 1):
            rows = order[b * bs:(b + 1) * bs]
            t0 = time.perf_counter()
            yb = y[rows]
            target = torch.zeros(len(rows), n_labels)
            counts = np.diff(yb.indptr)
            r = np.repeat(np.arange(len(rows)), counts)
            target[torch.from_numpy(r), torch.from_numpy(yb.indices.astype(np.int64))] = \
                torch.from_numpy(np.repeat(1.0 / counts, counts).astype(np.float32))
            loss = F.cross_entropy(net(*tensors(x[rows])), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            if b == 0:
                warm = dt
            else:
                times.append(dt)
        train_peak = _rss_mib()
        t0 = time.perf_counter()
        with torch.no_grad():
            chunk = max(1, 2**24 // n_labels)  # 25 rows at 670,091 labels
            for a in range(0, xte.shape[0], chunk):
                torch.topk(net(*tensors(xte[a:a + chunk])), 5, dim=1)
        score_s = time.perf_counter() - t0
    return {"kind": kind, "warmup_s": warm, "batch_s": times,
            "samples_per_second": bs / statistics.median(times),
            "peak_rss_train_mib": train_peak, "peak_rss_mib": _rss_mib(),
            "score_points_per_second": xte.shape[0] / score_s, "optimizer": impl}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, default=670091, help="output width (amazon-670k: 670,091)")
    ap.add_argument("--train", type=int, default=5000, help="training points generated")
    ap.add_argument("--batches", type=int, default=12, help="timed batches per process")
    ap.add_argument("--rounds", type=int, default=2, help="processes per kind, alternating")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "torch_reference.json"))
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "DATA"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        print(json.dumps(_worker(args.worker[0], args.worker[1], args.batches, args.threads)))
        return 0

    import scipy.sparse as sp

    import slide

    tmp = tempfile.mkdtemp(prefix="slide-torchref-")
    arrays = slide.datasets.make_synthetic_arrays("amazon-670k", seed=3, num_train=args.train,
                                                  num_test=2000, num_labels=args.labels)
    for name, m in zip(("xtr", "ytr", "xte", "yte"), arrays):
        sp.save_npz(os.path.join(tmp, f"{name}.npz"), m.tocsr())
    runs = {"plain": [], "baseline": []}
    kinds = ["plain", "baseline"]
    for r in range(args.rounds):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, tmp,
                   "--batches", str(args.batches), "--threads", str(args.threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rec = json.loads(out.strip().splitlines()[-1])
            runs[kind].append(rec)
            print(f"  {kind:8s} round {r}: {rec['samples_per_second']:.1f} samples/s, "
                  f"peak {rec['peak_rss_mib']:.0f} MiB", flush=True)

    rows = []
    for kind in kinds:
        rs = runs[kind]
        rows.append({
            "system": kind,
            "samples_per_second": statistics.median(x["samples_per_second"] for x in rs),
            "peak_rss_train_mib": max(x["peak_rss_train_mib"] for x in rs),
            "peak_rss_mib": max(x["peak_rss_mib"] for x in rs),
            "score_points_per_second": statistics.median(x["score_points_per_second"] for x in rs),
            "optimizer": rs[0]["optimizer"],
        })
    ratio = rows[1]["samples_per_second"] / rows[0]["samples_per_second"]
    print()
    print(f"| system | samples/s | peak RSS training MiB | peak RSS with scoring MiB | scoring points/s | Adam |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['system']} | {r['samples_per_second']:.1f} | {r['peak_rss_train_mib']:.0f} | "
              f"{r['peak_rss_mib']:.0f} | {r['score_points_per_second']:.0f} | {r['optimizer']} |")
    print(f"\nbaseline / plain samples/s: {ratio:.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"labels": args.labels, "threads": args.threads, "batches": args.batches,
                   "rounds": args.rounds, "batch_size": 256, "rows": rows, "runs": runs,
                   "baseline_over_plain": ratio,
                   "benchmark": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                 "cpu": platform.machine(), "cpu_count": os.cpu_count(),
                                 "load": os.getloadavg()}}, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
