"""What one rank runs in the MPI tests (tests/test_mpi.py): trains a network over the ranks of
MPI.COMM_WORLD (or in one process without mpiexec) and writes what the test compares as .npz.

    python tests/mpi_worker.py CASE OUT.npz
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import slide  # noqa: E402
from slide.datasets import make_synthetic  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def bibtex():
    return (slide.load_dataset(os.path.join(ROOT, "datasets", "bibtex", "train.txt")),
            slide.load_dataset(os.path.join(ROOT, "datasets", "bibtex", "test.txt")))


def delicious():
    return (slide.load_dataset(os.path.join(ROOT, "datasets", "delicious", "train.txt")),
            slide.load_dataset(os.path.join(ROOT, "datasets", "delicious", "test.txt")))


def synth():
    # the delicious-200k preset cut to fit a test: 20,000 labels, many labels per point
    return make_synthetic("delicious-200k", seed=3, num_features=30_000, num_labels=20_000, num_train=6_000,
                          num_test=1_000, avg_labels=10.0, avg_nnz=80.0)


LSH = {"family": "simhash", "K": 6, "L": 20, "min_active": 200, "max_active": 600}

CASES = {
    # dense output layer (the default per-label sigmoid, and softmax): R ranks compute what
    # one does, up to float summation order
    "dense": dict(data=bibtex, kw=dict(epochs=2, hidden=64, sampling="dense")),
    "dense-softmax": dict(data=bibtex, kw=dict(epochs=2, hidden=64, sampling="dense"), activation="softmax"),
    # output rows started from label centroids: each rank sets its own labels' rows
    "centroid": dict(data=bibtex, kw=dict(epochs=1, hidden=64, sampling="dense"), activation="softmax",
                     init="centroid"),
    # a bf16 output layer: each rank rounds its rows as one process rounds them
    "dense-bf16": dict(data=bibtex, kw=dict(epochs=2, hidden=64, sampling="dense"), activation="softmax",
                       precision="bf16"),
    # hash-sampled output layers: each rank samples its own labels
    "lsh-delicious": dict(data=delicious, kw=dict(epochs=4, hidden=128, sampling="lsh"), lsh=LSH),
    "lsh-synth": dict(data=synth, kw=dict(epochs=6, hidden=128, sampling="lsh", lr=5e-3, dropout=0.0),
                      lsh={"family": "simhash", "K": 8, "L": 30, "min_active": 500, "max_active": 1500}),
    # the ranks disagree on the configuration
    "mismatch": dict(data=bibtex, kw=dict(epochs=1, sampling="dense")),
}


def main(case: str, out: str) -> None:
    from slide.distributed import world

    comm = world()
    rank = comm.Get_rank() if comm is not None else 0
    spec = CASES[case]
    train, test = spec["data"]()
    kw = dict(spec["kw"], threads=1)
    if case == "mismatch":
        kw["hidden"] = 32 + rank
    cfg = slide.Config()
    if "init" in spec:
        cfg.layers[-1].init = spec["init"]
    if "activation" in spec:
        cfg.layers[-1].activation = spec["activation"]
    if "precision" in spec:
        cfg.layers[-1].precision = spec["precision"]
    if "lsh" in spec:
        for k, v in spec["lsh"].items():
            setattr(cfg.layers[-1].lsh, k, v)
    net = slide.Network(cfg, comm=comm, **kw)
    try:
        net.fit(train)
    except ValueError as e:
        with open(f"{out}.rank{rank}.err", "w") as fh:
            fh.write(str(e))
        return
    metrics = net.evaluate(test)
    labels, scores = net.predict(test.features[:300], k=5)
    params = {k: np.array(v) for k, v in net.parameters().items()}
    report = net.memory_report()
    saved = {f"param/{k}": v for k, v in params.items()}
    saved.update(labels=labels, scores=scores,
                 info=np.frombuffer(json.dumps({
                     "metrics": metrics, "ranks": net.ranks, "rank": rank,
                     "labels": report.get("labels"), "weights": report["weights"],
                     "optimizer": report["optimizer"], "tables": report["tables"],
                     "bytes_sent": getattr(net._core, "bytes_sent", 0),
                     "batches": getattr(net._core, "batches", 0),
                     "dh_dim": int(net._core.shard_dh_dim) if net.ranks > 1 else None,
                 }).encode(), dtype=np.uint8))
    np.savez(f"{out}.rank{rank}.npz", **saved)
    if net.ranks > 1:
        net.save(out + ".model")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
