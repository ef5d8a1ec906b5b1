"""``init: centroid``: the output layer started from label centroids (see the README)."""
from __future__ import annotations

import logging
import time

import numpy as np

from . import _bf16

log = logging.getLogger("slide")

# init: centroid: the length of each label's initial output row. Chosen on an amazon-670k-shaped
# validation split (16,000 / 4,000 points, 43-49 s of training): lengths 3, 10, 30 and 100 reached
# P@1 0.408, 0.433, 0.302 and 0.025 (glorot rows: 0.326); 30 and 100 start high and then diverge.
CENTROID_NORM = 10.0


def init_output_centroids(net, arrays) -> float:
    """Before the first batch of ``net`` (a :class:`slide.Network`, built), each label's row of
    the output layer becomes the mean representation (the last hidden layer's output, at the
    initial weights, without dropout) of the points of ``arrays`` that carry the label, scaled
    to length CENTROID_NORM; rows of labels without points keep their random weights. On a
    label shard, this rank's labels only. Returns the seconds it took.

    A sigmoid output layer scores each label on its own, so the rows must also tell labels
    apart in absolute terms, not only relative to each other as softmax does: each row
    becomes the direction from the mean representation m of all points to the label's
    centroid (length CENTROID_NORM), and its bias puts the score of m at the base rate of a
    label (labels per point / labels). With softmax's rows (every centroid of non-negative
    ReLU outputs points the same way) every label starts near sigmoid 1 and training
    collapses: measured test P@1 0.003 after 8 epochs on make_synthetic("small")."""
    cfg = net.config
    t0 = time.perf_counter()
    nl = len(cfg.layers)
    params = {k: (_bf16.to_float32(v) if _bf16.is_bf16(v) else v) for k, v in net._core.parameters().items()}
    W = params[f"layers.{nl - 1}.weight"]          # this rank's rows (labels begin..end)
    W_store = net._core.parameters()[f"layers.{nl - 1}.weight"]  # bf16 layers: the bits, written at the end
    begin = int(getattr(net._core, "begin", 0))
    end = begin + W.shape[0]
    Y = arrays.labels
    labels = Y.indices[(Y.indices >= begin) & (Y.indices < end)] - begin
    has = np.bincount(labels, minlength=end - begin) > 0
    W[has] = 0.0
    sigmoid = cfg.layers[-1].activation == "sigmoid"
    total = np.zeros(W.shape[1], dtype=np.float64)  # sum of all points' representations
    chunk = max(1, (1 << 22) // max(1, W.shape[1]))   # rows of hidden output per step (16 MB)
    for a in range(0, arrays.n, chunk):
        b = min(arrays.n, a + chunk)
        H = arrays.X[a:b] @ params["layers.0.weight"] + params["layers.0.bias"]
        for i in range(1, nl):
            if cfg.layers[i - 1].activation == "relu":
                np.maximum(H, 0.0, out=H)
            if i < nl - 1:
                H = H @ params[f"layers.{i}.weight"].T + params[f"layers.{i}.bias"]
        if sigmoid:
            total += H.sum(axis=0, dtype=np.float64)
        Yt = Y[a:b][:, begin:end].T.tocsr()          # labels x points of this chunk
        Yt.data[:] = 1.0
        rows = np.flatnonzero(np.diff(Yt.indptr))
        # a block of labels at a time: the chunk's points carry up to ~10^5 distinct labels on a
        # wide layer, and W[rows] and its update would be two dense copies of them (each row's
        # sum is computed the same way whatever the block)
        for r in range(0, rows.size, chunk):
            rs = rows[r:r + chunk]
            W[rs] += np.asarray(Yt[rs] @ H, dtype=np.float32)
    # In place, a block of rows at a time: indexing W[has] would copy most of a wide layer
    # (hundreds of MiB at 670K labels) while training's own state is already allocated.
    counts = np.bincount(labels, minlength=end - begin).astype(np.float32)
    mean = (total / max(arrays.n, 1)).astype(np.float32)
    if sigmoid:
        base_rate = min(0.5, max(Y.nnz, 1) / (max(arrays.n, 1) * float(max(Y.shape[1], 1))))
        bias = params[f"layers.{nl - 1}.bias"]
    for r0 in range(0, W.shape[0], chunk):
        r1 = min(W.shape[0], r0 + chunk)
        Wb, hb = W[r0:r1], has[r0:r1]
        if sigmoid:
            Wb[hb] /= counts[r0:r1][hb, None]
            Wb[hb] -= mean
        norms = np.linalg.norm(Wb, axis=1)
        Wb *= np.where(hb, CENTROID_NORM / np.maximum(norms, 1e-30), 1.0).astype(np.float32)[:, None]
        if sigmoid:
            bias[r0:r1][hb] = -(Wb[hb] @ mean) + np.float32(np.log(base_rate / (1.0 - base_rate)))
    if _bf16.is_bf16(W_store):
        W_store[...] = _bf16.from_float32(W)
    if net.resolved_sampling and "lsh" in net.resolved_sampling:
        net._core.rebuild_tables()
    seconds = time.perf_counter() - t0
    log.info("init: centroid: %d output rows set from label centroids in %.1f s", int(has.sum()), seconds)
    return seconds
