"""The label-centroid term of the output layer (``layers[-1].centroid_weight``).

Each label's *centroid* is the L2-normalised sum of the L2-normalised (scaled) input rows of the
points it labels: a sparse label-by-feature matrix built in one pass over the training data, with
no training. A row ``x`` then ranks label ``l`` by

    z_l + w * cos(x, c_l)

where ``z_l`` is the output layer's logit and ``w`` the centroid weight. The network sees the
input only through its hidden layer; the centroid term scores it directly, like a nearest-centroid
classifier. With the default settings on the 12 shared real sets, ``auto`` chose a weight above 0
on six (ridge vectors on three: medical test P@1 0.8217 alone, 0.8310 with the centroids, 0.8496
with ridge vectors; README, Configuration) and 0 on six; on the amazon-670k synthetic shape a
weight of 16 raised test P@1 from 0.5151 to 0.5361 (README, Configuration; datasets/synthetic.md).

Ridge label vectors (``layers[-1].centroid_kind``): in place of the centroids, each label's
one-vs-rest ridge regression on the same L2-normalised rows (0/1 targets, penalty ``lambda``;
:func:`build_ridge`), a dense features x labels matrix, so that ``x / |x|`` times the label's
vector replaces ``cos(x, c_l)``. That is the per-label linear model that the linear XMC libraries
train, fitted in closed form: on a problem whose points are few it ranks better than the
centroids, and mixed with the network better than either. ``centroid_kind: auto`` (the default,
with ``centroid_weight: auto``) tries the centroids and, on a problem within
:func:`ridge_fits`, the ridge vectors at each penalty of :data:`RIDGE_LAMBDAS` (weights
:data:`RIDGE_WEIGHTS`), and keeps the ridge vectors when their best weight beats the centroids'
best by one standard error of the paired difference on the validation rows (:func:`choose`). With a set weight,
``auto`` means the centroids; ``ridge`` with a set weight uses :data:`RIDGE_DEFAULT_LAMBDA`.

``centroid_weight: auto`` (the default) chooses ``w`` on validation data with
:func:`choose_weight` (each weight of :data:`WEIGHTS`, and 0): the ``epochs: auto`` search
chooses at each new best validation score and keeps the choice of its best epoch (of the
learning rate ``lr_search`` kept); a count of epochs with validation data (``data.valid``,
``valid_fraction``) chooses at the end of training; without validation data the term stays off.
A number sets ``w`` (0 = off).

The choice is made on the one validation split of ``epochs: auto`` (80 points on a 400-point
set). Choosing instead on five folds of train pooled (the split plus four more networks, each
searched with another fifth held out, same rule on all the rows) was measured on 2026-12-06 and
not adopted. On points drawn from the training files of the shared sets, P@1 on up to 4,000
other training points: 400 points, ten sets (19 draws), +0.0018 on average, 5 up and 8 down
(from -0.031 on yahoo-arts to +0.057 on stackex-chemistry); 1,000 points, seven sets (13
draws), -0.0027, 1 up and 7 down. The pooled folds mostly turned the term off where the split
had kept it, and cost about twice the training time. Counting each validation row's top 3 as
well as its top 1 (ties of P@1 broken by top-3 hits, or both sets of rows in the one-standard-error
rule) was measured the same day, on the same networks with every choice scored on held-out
training rows, and not adopted: both sets of rows gained 0.0024 P@1 at 400 points (11 sets, 66
draws) but lost 0.0007 at 1,000 (33 draws) and 0.006 on medical; the tie-break moved less than
0.0005 either way (benchmarks/README.md, "Changes measured on rows held out of the training
files").

Which labels are scored: on an output layer of at most :data:`FULL_LABELS` labels, every label
(exact). On a wider one, the union per row of the network's top :data:`POOL` labels (from the
prediction mode asked for: exact, index or lsh) and the centroid term's top :data:`POOL` (ties
to the lower label id), each scored exactly (:meth:`slide._core.Network.label_logits`); a label in
neither pool is not ranked. The engine builds the pools (``slide._core.label_pools``: the term's
scores summed per row in a scratch of the layer's width, its best labels selected, the union
sorted), 2.4-2.8x faster than a scipy product and sort did in index mode on the amazon-670k shape
(benchmarks/README.md, "Evaluations").
Scores are ``sigmoid(z + w cos)`` on a sigmoid output layer, else the softmax of ``z + w cos``
over the scored labels.
"""
from __future__ import annotations

import logging
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from . import _core
from ._util import clear_gain
from .scaling import normalize_rows

log = logging.getLogger("slide")

# The weights centroid_weight: auto tries (besides 0, the network alone).
WEIGHTS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
# Up to this many labels, every label is scored with the centroid term.
FULL_LABELS = 4096
# A wider output layer re-ranks, per row, the network's and the centroid term's top POOL labels,
# and keeps only the MAX_FEATURES largest entries of each centroid: frequent features are in the
# centroids of most labels, so that a row's full scores touch a third of 670,091 labels
# (benchmarks/centroid_mix.py: pruned to 32, 3,900 a row; validation P@1 within 0.001 of 64).
POOL = 100
MAX_FEATURES = 32
# The label-by-feature product is built this many stored products at a time (bounds the memory
# of the sparse product on wide data).
_BUILD_BLOCK = 1 << 24

# centroid_kind ridge: the ridge penalties auto tries (the rows have unit length, so that the
# penalty compares with a row's own contribution, 1), the one used without validation data,
# and the weights tried besides 0 (the largest ones let the ridge scores rank alone).
RIDGE_LAMBDAS = (0.1, 0.3, 1.0, 3.0)
RIDGE_DEFAULT_LAMBDA = 0.3
RIDGE_WEIGHTS = WEIGHTS + (256.0, 4096.0)
# Ridge label vectors are dense (features x labels float32) and solved through a Cholesky
# factor of min(points, features) squared: auto tries them only on a problem within both.
RIDGE_MAX_DIM = 6000
RIDGE_MAX_ENTRIES = 1 << 25
# On a layer of at most FULL_LABELS labels with at most this many features x labels, sparse
# label centroids are scored through a dense float32 copy (kept on the network): the product
# of the query rows with a dense matrix is about 4x faster than the sparse product with
# centroids of 5% density (4,000 labels, 5,000 features: 0.15 s against 0.56 s for 3,000 rows).
DENSE_MAX_ENTRIES = RIDGE_MAX_ENTRIES
# choose keeps the label vectors' validation scores between calls up to this many bytes
SCORE_CACHE_BYTES = 1 << 28


def ridge_fits(n: int, num_features: int, num_labels: int) -> bool:
    """Whether the ridge label vectors of n points are small enough to build (see RIDGE_MAX_*)."""
    return (num_labels <= FULL_LABELS and min(n, num_features) <= RIDGE_MAX_DIM
            and num_features * num_labels <= RIDGE_MAX_ENTRIES)


def dense_scoring(num_features: int, num_labels: int) -> bool:
    """Whether sparse label centroids of this shape are scored through a dense copy."""
    return num_labels <= FULL_LABELS and num_features * num_labels <= DENSE_MAX_ENTRIES


def _scoring_vectors(net, CT):
    """The label vectors as :func:`_query_scores` multiplies them: a dense copy of sparse
    centroids where :func:`dense_scoring` allows (kept on the network while ``CT`` is the same
    matrix), else ``CT`` itself."""
    if isinstance(CT, np.ndarray) or not dense_scoring(*CT.shape):
        return CT
    cached = net._dense_vectors
    if cached is None or cached[0] is not CT:
        net._dense_vectors = None          # the copy of other vectors is freed first
        net._dense_vectors = cached = (CT, CT.toarray().astype(np.float32, copy=False))
    return cached[1]


def build_ridge(x_indptr: np.ndarray, x_indices: np.ndarray, x_values: np.ndarray, y_indptr: np.ndarray,
                y_indices: np.ndarray, num_features: int, num_labels: int,
                lambdas=RIDGE_LAMBDAS) -> Dict[float, np.ndarray]:
    """Each label's one-vs-rest ridge regression on the L2-normalised (scaled) rows, for each
    penalty: ``W = argmin ||X W - Y||^2 + lambda ||W||^2`` (0/1 targets, no intercept), a dense
    features x labels float32 matrix per penalty. Solved in the smaller of the two spaces:
    ``(X^T X + lambda I)^-1 X^T Y`` or ``X^T (X X^T + lambda I)^-1 Y``."""
    n = len(x_indptr) - 1
    # float32 throughout (the Gram matrix of up to RIDGE_MAX_DIM^2 is the memory that counts):
    # with unit rows and a penalty from 0.1 the systems are well conditioned
    X = normalize_rows(sp.csr_matrix((x_values, x_indices, x_indptr), shape=(n, num_features)), "l2")
    Y = sp.csr_matrix((np.ones(len(y_indices), dtype=np.float32), y_indices, y_indptr), shape=(n, num_labels))
    dual = n <= num_features
    G = (X @ X.T if dual else X.T @ X).toarray()
    B = Y.toarray() if dual else (X.T @ Y).toarray()
    work = np.empty_like(G, order="F")
    diag = np.diag_indices(G.shape[0])
    out = {}
    for lam in lambdas:
        work[...] = G
        work[diag] += np.float32(lam)
        A = sla.cho_solve(sla.cho_factor(work, lower=True, overwrite_a=True, check_finite=False), B,
                          check_finite=False)
        W = X.T @ A if dual else A
        out[float(lam)] = np.ascontiguousarray(W, dtype=np.float32)
    return out


def _keep_largest(C: sp.csr_matrix, m: int) -> sp.csr_matrix:
    """Each row's m largest entries (all of a row with at most m)."""
    counts = np.diff(C.indptr)
    if counts.max(initial=0) <= m:
        return C
    keep = np.ones(C.nnz, dtype=bool)
    for r in np.flatnonzero(counts > m):
        lo, hi = C.indptr[r], C.indptr[r + 1]
        keep[lo:hi] = False
        keep[lo + np.argpartition(C.data[lo:hi], hi - lo - m)[hi - lo - m:]] = True
    rows = np.repeat(np.arange(C.shape[0]), counts)[keep]
    return sp.csr_matrix((C.data[keep], C.indices[keep], np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=C.shape[0]))])),
                         shape=C.shape)


def build(x_indptr: np.ndarray, x_indices: np.ndarray, x_values: np.ndarray, y_indptr: np.ndarray,
          y_indices: np.ndarray, num_features: int, num_labels: int,
          max_features: Optional[int] = None) -> sp.csr_matrix:
    """The centroids of the training arrays (scaled features, labels) as a feature-by-label CSR
    matrix (float32): column ``l`` is label ``l``'s centroid, zero for a label without points.
    ``max_features``: keep each centroid's largest entries only (then scaled to length 1)."""
    n = len(x_indptr) - 1
    X = normalize_rows(sp.csr_matrix((x_values, x_indices, x_indptr), shape=(n, num_features)), "l2")
    Y = sp.csr_matrix((np.ones(len(y_indices), dtype=np.float32), y_indices, y_indptr), shape=(n, num_labels))
    YT = Y.T.tocsr()
    # Stored products of each label's block (its points' non-zero features) stay near _BUILD_BLOCK.
    cum = np.cumsum(YT @ np.diff(X.indptr).astype(np.float64))
    blocks, start = [], 0
    while start < num_labels:
        done = cum[start - 1] if start else 0.0
        end = min(num_labels, max(start + 1, int(np.searchsorted(cum, done + _BUILD_BLOCK, side="right"))))
        block = normalize_rows((YT[start:end] @ X).tocsr().astype(np.float32), "l2")
        if max_features:
            block = normalize_rows(_keep_largest(block, int(max_features)), "l2")
        blocks.append(block)
        start = end
    C = sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((num_labels, num_features), dtype=np.float32)
    CT = C.T.tocsr()
    CT.sort_indices()
    return CT


def _query_scores(CT, x_indptr, x_indices, x_values) -> np.ndarray:
    """Every row's score of every label as a dense rows x labels float32 array (a layer of at most
    FULL_LABELS labels): cos(x, c_l) with sparse centroids, x / |x| times each vector with dense
    label vectors (ridge, or the dense copy of the centroids). A wider layer scores each row's
    pool instead (:func:`pools`, ``slide._core.label_pools``)."""
    n = len(x_indptr) - 1
    X = normalize_rows(sp.csr_matrix((x_values, x_indices, x_indptr - x_indptr[0]), shape=(n, CT.shape[0])), "l2")
    if isinstance(CT, np.ndarray):
        return np.asarray(X @ CT, dtype=np.float32)
    return (X @ CT).toarray().astype(np.float32, copy=False)   # toarray reads unsorted ids as well


def _chunks(arrays, rows_per_chunk: int) -> Iterator[Tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
    n = len(arrays.x_indptr) - 1
    for s in range(0, n, rows_per_chunk):
        e = min(n, s + rows_per_chunk)
        a, b = arrays.x_indptr[s], arrays.x_indptr[e]
        yield s, e, np.ascontiguousarray(arrays.x_indptr[s:e + 1] - a), arrays.x_indices[a:b], arrays.x_values[a:b]


def _all_logits(core, ip, ix, xv, m: int, L: int) -> np.ndarray:
    """Every label's logit for m rows: the batched dense path where the network has it."""
    z = core.all_logits(ip, ix, xv)
    if z is None:
        z = core.label_logits(ip, ix, xv, np.arange(m + 1, dtype=np.int64) * L, np.tile(np.arange(L, dtype=np.int32), m))
    return np.asarray(z)


def _pick_weight(hits) -> int:
    """The index of the weight kept from validation hits by weight (the weight 0 first): the
    most hits, above 0 only by at least one more validation point, ties to the smaller."""
    best = 0
    for j in range(1, len(hits)):
        if hits[j] >= hits[best] + (1 if best == 0 else 1e-9):
            best = j
    return best


def pools(net, arrays, CT: sp.csr_matrix, mode: str = "exact", k: int = 1, top: Optional[np.ndarray] = None,
          **query) -> Iterator[Tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per chunk of rows: ``(start, end, cand_indptr, cand, z, s)``: the labels scored for each
    row (sorted ids), their logits and their centroid scores. On a layer of at most FULL_LABELS
    labels every row scores every label: ``cand_indptr`` and ``cand`` are None and ``z``, ``s``
    hold ``(end - start) x labels`` values in label order. ``top``: the network's best labels of
    every row in ``mode`` (rows x at least POOL, best first, as ``predict_topk`` gives them),
    when the caller has them already (the validation pass of a search: see ``choose``)."""
    core, L = net._core, int(net.num_labels)
    full = L <= FULL_LABELS
    rows_per_chunk = max(1, min(1024, (1 << 18) // L)) if full else 1024
    pool = min(L, max(int(k), POOL))
    if not full:   # the label vectors as the engine reads them (slide._core.label_pools)
        ct_indptr = CT.indptr.astype(np.int64)
        ct_indices = CT.indices.astype(np.int32, copy=False)
        ct_values = CT.data.astype(np.float32, copy=False)
    for s, e, ip, ix, xv in _chunks(arrays, rows_per_chunk):
        m = e - s
        if full:
            S = _query_scores(_scoring_vectors(net, CT), ip, ix, xv)
            z = _all_logits(core, ip, ix, xv, m, L).reshape(-1)
            yield s, e, None, None, z, S.reshape(-1)
            continue
        best = top[s:e, :pool] if top is not None else core.predict_topk(ip, ix, xv, pool, mode, **query)[0]
        Q = normalize_rows(sp.csr_matrix((xv, ix, ip), shape=(m, CT.shape[0])), "l2")
        cand_indptr, cand, sv = _core.label_pools(
            Q.indptr.astype(np.int64), Q.indices.astype(np.int32, copy=False), Q.data.astype(np.float32, copy=False),
            ct_indptr, ct_indices, ct_values, L, np.ascontiguousarray(best, dtype=np.int32), pool, core.num_threads)
        z = core.label_logits(ip, ix, xv, cand_indptr, cand)
        yield s, e, cand_indptr, cand, z, sv


def _top_sorted(M: np.ndarray, k: int) -> np.ndarray:
    """Each row's k largest columns, higher first and ties to the lower column (as a stable
    descending sort would give them), from a partial selection instead of a sort of the row."""
    if k >= M.shape[1]:
        return np.argsort(-M, axis=1, kind="stable")
    kth = -np.partition(-M, k - 1, axis=1)[:, k - 1]          # each row's k-th largest value
    rows, cols = np.nonzero(M >= kth[:, None])                  # k of them, more only on ties
    order = np.lexsort((cols, -M[rows, cols], rows))
    rows, cols = rows[order], cols[order]
    rank = np.arange(len(rows)) - np.searchsorted(rows, rows)
    top = cols[rank < k]
    if top.size != M.shape[0] * k:   # a row with NaN scores: the full sort orders them last
        return np.argsort(-M, axis=1, kind="stable")[:, :k]
    return top.reshape(M.shape[0], k)


def _best(m: int, L: int, cip: Optional[np.ndarray], cand: Optional[np.ndarray], mixed: np.ndarray,
          k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's k best scored labels of a chunk of :func:`pools` (higher ``mixed`` first, ties
    to the lower label id): their rows, ranks, positions in ``mixed`` and labels."""
    if cip is None:   # every row scores every label, in label order
        M = mixed.reshape(m, L)
        order = (np.argmax(M, axis=1)[:, None] if k == 1     # the first maximum: the lower id
                 else _top_sorted(M, k))
        rows = np.repeat(np.arange(m, dtype=np.int64), order.shape[1])
        labels = order.reshape(-1)
        return rows, np.tile(np.arange(order.shape[1]), m), rows * L + labels, labels
    lens = np.diff(cip)
    owner = np.repeat(np.arange(m, dtype=np.int64), lens)
    # Each row's scores in a row of a padded matrix, in label order and NaN after the row's end:
    # _top_sorted's stable order (higher first, ties to the lower column, NaN last) is then the
    # order of the label ids, with the row's own NaN scores before the padding, at a fraction of
    # a sort of every scored label (a search chooses the weight on thousands of rows, once per
    # weight tried).
    width = int(lens.max(initial=0))
    if width == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, np.zeros(0, dtype=cand.dtype)
    M = np.full((m, width), np.nan)
    M[owner, np.arange(len(mixed)) - cip[owner]] = mixed
    kk = min(int(k), width)
    cols = _top_sorted(M, kk)
    keep = cols < lens[:, None]            # a row with fewer than k labels has fewer
    rows = np.repeat(np.arange(m, dtype=np.int64), kk).reshape(m, kk)[keep]
    rank = np.tile(np.arange(kk, dtype=np.int64), m).reshape(m, kk)[keep]
    pos = cip[rows] + cols[keep]
    return rows, rank, pos, cand[pos]


def predict(net, arrays, k: int, mode: str, weight: float, CT: sp.csr_matrix,
            **query) -> Tuple[np.ndarray, np.ndarray]:
    """Top-k labels and scores of ``z + weight * cos`` (see the module doc)."""
    n = len(arrays.x_indptr) - 1
    sigmoid = net.config.layers[-1].activation == "sigmoid"
    labels = np.full((n, k), -1, dtype=np.int32)
    scores = np.zeros((n, k), dtype=np.float32)
    L = int(net.num_labels)
    for s, e, cip, cand, z, sv in pools(net, arrays, CT, mode, k, **query):
        m = e - s
        mixed = z.astype(np.float64) + weight * sv
        rows, rank, pos, best = _best(m, L, cip, cand, mixed, k)
        labels[s + rows, rank] = best
        if sigmoid:
            scores[s + rows, rank] = 1.0 / (1.0 + np.exp(-mixed[pos]))
            continue
        # softmax over each row's scored labels
        owner = np.repeat(np.arange(m, dtype=np.int64), L if cip is None else np.diff(cip))
        mx = np.full(m, -np.inf)
        np.maximum.at(mx, owner, mixed)
        total = np.zeros(m)
        np.add.at(total, owner, np.exp(mixed - mx[owner]))
        scores[s + rows, rank] = np.exp(mixed[pos] - mx[rows]) / total[rows]
    return labels, scores


def choose_weight(net, valid, CT: sp.csr_matrix, weights=WEIGHTS,
                  top: Optional[np.ndarray] = None) -> Tuple[float, Dict[float, float]]:
    """The weight of the best validation P@1 among 0 and ``weights`` (exact mode), and the P@1
    of each. A weight must beat 0 by at least one validation point; ties go to the smaller."""
    ws = [0.0] + [float(w) for w in weights if w > 0]
    hits = np.zeros(len(ws))
    L = int(net.num_labels)
    truth_rows = np.repeat(np.arange(valid.n, dtype=np.int64), np.diff(valid.y_indptr))
    truth = np.sort(truth_rows * L + valid.y_indices)
    for s, e, cip, cand, z, sv in pools(net, valid, CT, "exact", 1, top=top):
        z64 = z.astype(np.float64)
        for j, w in enumerate(ws):
            rows, _, _, best = _best(e - s, L, cip, cand, z64 + w * sv, 1)
            hits[j] += float(np.isin((s + rows) * L + best, truth).sum())
    p1 = {w: float(h / max(1, valid.n)) for w, h in zip(ws, hits)}
    return ws[_pick_weight(hits)], p1


class Choice(NamedTuple):
    """What ``centroid_weight: auto`` chose: the weight, the validation P@1 of each weight tried
    with the chosen label vectors, their kind (mean | ridge) and the ridge penalty (None: mean)."""
    weight: float
    p1: Dict[float, float]
    kind: str
    lam: Optional[float]


def _hits_full(net, valid, candidates) -> list:
    """(weights, validation rows right at P@1: a weights x rows boolean matrix) per candidate,
    the weight 0 first, on a layer of at most FULL_LABELS labels: the network's logits computed
    once per chunk for all."""
    core, L = net._core, int(net.num_labels)
    grids = [[0.0] + [float(w) for w in (RIDGE_WEIGHTS if kind == "ridge" else WEIGHTS)] for kind, _, _ in candidates]
    # The label vectors' scores of the validation rows do not change while a search chooses at
    # each new best: kept on the network (up to SCORE_CACHE_BYTES) for the same rows and vectors.
    key = [valid] + [CT for _, _, CT in candidates]
    cached = net._score_cache
    cache = cached[1] if cached is not None and len(cached[0]) == len(key) and all(
        a is b for a, b in zip(cached[0], key)) else None
    store = {} if cache is None and valid.n * L * len(candidates) * 4 <= SCORE_CACHE_BYTES else None
    hits = [np.zeros((len(g), valid.n), dtype=bool) for g in grids]
    rows_per_chunk = max(1, min(1024, (1 << 18) // L))
    for s, e, ip, ix, xv in _chunks(valid, rows_per_chunk):
        m = e - s
        z = _all_logits(core, ip, ix, xv, m, L).astype(np.float64).reshape(m, L)
        truth = np.zeros((m, L), dtype=bool)
        lo, hi = valid.y_indptr[s], valid.y_indptr[e]
        truth[np.repeat(np.arange(m), np.diff(valid.y_indptr[s:e + 1])), valid.y_indices[lo:hi]] = True
        for c, ((_, _, CT), grid, h) in enumerate(zip(candidates, grids, hits)):
            if cache is not None:
                S = cache[s, c]
            else:
                S = _query_scores(_scoring_vectors(net, CT), ip, ix, xv)
                if store is not None:
                    store[s, c] = S
            for j, w in enumerate(grid):
                h[j, s:e] = truth[np.arange(m), np.argmax(z + w * S, axis=1)]
    if store is not None:
        net._score_cache = (key, store)
    return list(zip(grids, hits))


def choose(net, valid, candidates, top: Optional[np.ndarray] = None) -> Choice:
    """The best of ``candidates`` ((kind, lambda, label vectors), the label centroids first) by
    validation P@1: for each, its weight as :func:`choose_weight` picks it (at least one more
    validation point right than 0, ties to the smaller). A later candidate replaces the leader
    only when it is right on ``b`` validation rows where the leader is wrong and wrong on ``c``
    where the leader is right with ``b - c >= max(1, sqrt(b + c))``: one standard error of the
    paired difference (a McNemar test at one sigma), so that the 40 ridge options do not win on
    the noise of a few rows (see the module doc). ``top``: on a wide layer, the network's best
    labels of the validation rows in exact mode, when the caller has them (:func:`pools`)."""
    if int(net.num_labels) > FULL_LABELS:   # the centroids alone (ridge needs a narrow layer)
        (kind, lam, CT), = candidates
        weight, p1 = choose_weight(net, valid, CT, WEIGHTS, top=top)
        return Choice(weight, p1, kind, lam)
    best, best_rows = None, None
    for (kind, lam, _), (grid, right) in zip(candidates, _hits_full(net, valid, candidates)):
        hits = right.sum(axis=1)
        j = _pick_weight(hits)
        if best is not None and not clear_gain(right[j], best_rows)[0]:
            continue
        p1 = {w: float(h / max(1, valid.n)) for w, h in zip(grid, hits)}
        best, best_rows = Choice(grid[j], p1, kind, lam), right[j]
    return best
