"""Ranking metrics for extreme multi-label classification.

All functions take the same two inputs:

``top_labels``
    integer array ``[n, k']``: for each point the predicted label ids, best first. Rows may be
    padded with ``-1`` (fewer than ``k'`` predictions); a ``-1`` is never a hit. ``k'`` must be at
    least the largest ``k`` asked for, unless it ranks all ``L`` labels (missing positions are then
    misses). A label id may appear at most once among a row's first ``k`` predictions: a repeated
    id would be counted twice by P@k (precision above 1 is possible), so duplicates are rejected
    with a ``ValueError`` naming the row, rather than silently counted once. ``-1`` padding may
    repeat.
``labels``
    the true labels, a scipy sparse matrix ``[n, L]`` (any non-zero entry is a positive label),
    or an object with a ``.labels`` attribute such as :class:`slide.Dataset`.

Definitions (``y_i`` is the set of true labels of point ``i``, ``r_ij = 1`` if the ``j``-th
prediction of point ``i`` is in ``y_i``, positions ``j = 1..k``):

* ``P@k = mean_i (1/k) sum_j r_ij``.
* ``nDCG@k = mean_i DCG_i@k / IDCG_i@k`` with ``DCG_i@k = sum_j r_ij / log2(j + 1)`` and
  ``IDCG_i@k`` the DCG of a perfect ranking, ``sum_{j <= min(k, |y_i|)} 1 / log2(j + 1)``.
* ``R@k = mean_i |top-k_i intersect y_i| / |y_i|``.
* ``PSP@k`` and ``PSnDCG@k`` (Jain, Prabhu, Varma, KDD 2016) weight each hit on label ``l`` by
  ``1 / p_l``, the inverse propensity of the label (see :func:`propensities`), so that rare labels
  count more. The raw values ``mean_i (1/k) sum_j r_ij / p_lij`` and
  ``mean_i [sum_j (r_ij / p_lij) / log2(j + 1)] / IDCG_i@k`` are divided by their best achievable
  value on the same data: the same mean for the ranking that puts each point's true labels first,
  in decreasing order of ``1 / p_l``. The normalisation is over the data set (a ratio of means,
  the convention of the Extreme Classification Repository's evaluation code), not per point, so
  1.0 is the best possible score and the values are comparable with published tables.

Points with no true label are kept and counted in ``n``: they contribute 0 to P@k, nDCG@k, R@k
and to both the numerator and the best value of PSP@k/PSnDCG@k (a predictor cannot do better on
them, so the ideal P@k of a data set with empty points is below 1).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import scipy.sparse as sp

__all__ = [
    "propensities",
    "precision_at_k",
    "ndcg_at_k",
    "recall_at_k",
    "psp_at_k",
    "psndcg_at_k",
    "evaluate",
]

#: Propensity model parameters (A, B) recommended by Jain et al. (2016) per data set family.
PROPENSITY_DEFAULTS = {"default": (0.55, 1.5), "amazon": (0.6, 2.6), "wikipedia": (0.5, 0.4)}


# ---------------------------------------------------------------------------- propensities

def propensities(label_counts_or_csr, a: float = 0.55, b: float = 1.5, *,
                 num_points: Optional[int] = None) -> np.ndarray:
    """Label propensities ``p_l`` of the model of Jain, Prabhu, Varma (KDD 2016).

    ``p_l = 1 / (1 + C (N_l + B)^(-A))`` with ``C = (ln N - 1) (B + 1)^A``, where ``N_l`` is the
    number of training points carrying label ``l`` and ``N`` the number of training points.
    ``A = 0.55, B = 1.5`` is the paper's general setting; use ``A = 0.6, B = 2.6`` for Amazon data
    sets (``0.5, 0.4`` for Wikipedia), see :data:`PROPENSITY_DEFAULTS`.

    ``label_counts_or_csr`` is the training label matrix (scipy sparse ``[N, L]``), a
    :class:`slide.Dataset` (its ``.labels``), or a 1-D array of per-label counts ``N_l``, in which
    case ``num_points`` (``N``) must be given. Returns a float64 array of length ``L`` with values
    in ``(0, 1]``; frequent labels get propensities near 1. For ``N < e`` the model is undefined
    (``C`` would be negative) and all propensities are 1.
    """
    obj = getattr(label_counts_or_csr, "labels", label_counts_or_csr)
    if sp.issparse(obj):
        m = sp.csr_matrix(obj)
        m.eliminate_zeros()
        counts = np.diff(m.tocsc().indptr).astype(np.float64)
        n = m.shape[0] if num_points is None else int(num_points)
    else:
        counts = np.asarray(obj)
        if counts.ndim != 1:
            raise ValueError(f"label counts must be a 1-D array, got shape {counts.shape}")
        if not (np.issubdtype(counts.dtype, np.integer) or np.issubdtype(counts.dtype, np.floating)):
            raise TypeError(f"label counts must be numbers, got dtype {counts.dtype}")
        counts = counts.astype(np.float64)
        if counts.size and (not np.all(np.isfinite(counts)) or counts.min() < 0):
            raise ValueError("label counts must be finite and non-negative")
        if num_points is None:
            raise ValueError("propensities() from label counts needs num_points= (the number of "
                             "training points N); or pass the training label matrix instead")
        n = int(num_points)
    if n < 0:
        raise ValueError(f"num_points must be non-negative, got {n}")
    if not (a > 0 and b >= 0):
        raise ValueError(f"propensity model needs A > 0 and B >= 0, got A={a}, B={b}")
    c = (np.log(n) - 1.0) * (b + 1.0) ** a if n > 0 else 0.0
    c = max(c, 0.0)
    return 1.0 / (1.0 + c * (counts + b) ** (-a))


# ---------------------------------------------------------------------------- input checks

def _as_label_matrix(labels) -> sp.csr_matrix:
    obj = getattr(labels, "labels", labels)
    if not sp.issparse(obj):
        arr = np.asarray(obj)
        if arr.ndim != 2:
            raise TypeError("labels must be a scipy sparse matrix [n, L] (or a slide.Dataset), "
                            f"got {type(labels).__name__}")
        obj = sp.csr_matrix(arr)
    m = sp.csr_matrix(obj, copy=True)
    m.eliminate_zeros()
    m.sum_duplicates()  # also sorts the indices of each row
    return m


def _as_top(top_labels, n: int, num_labels: int, kmax: int) -> np.ndarray:
    top = np.asarray(top_labels)
    if top.ndim == 1 and n == top.shape[0]:
        top = top[:, None]
    if top.ndim != 2:
        raise ValueError(f"top_labels must be a 2-D array [n, k], got shape {top.shape}")
    if top.size and not np.issubdtype(top.dtype, np.integer):
        raise TypeError(f"top_labels must hold integer label ids, got dtype {top.dtype}")
    if top.shape[0] != n:
        raise ValueError(f"top_labels has {top.shape[0]} rows but labels has {n}")
    if top.shape[1] < kmax and top.shape[1] >= num_labels:
        # a ranking of every label is complete: positions beyond it are misses
        top = np.concatenate([top, np.full((n, kmax - top.shape[1]), -1, dtype=top.dtype)], axis=1)
    if top.shape[1] < kmax:
        raise ValueError(f"top_labels has {top.shape[1]} columns, cannot compute metrics at k={kmax}")
    top = top[:, :kmax].astype(np.int64, copy=False)
    if top.size:
        bad = (top < -1) | (top >= num_labels)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise ValueError(f"top_labels[{i}, {j}] = {top[i, j]} is not a label id in [0, {num_labels}) "
                             "nor -1 padding")
        if kmax > 1:
            s = np.sort(top, axis=1)
            dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
            if dup.any():
                i, j = np.argwhere(dup)[0]
                raise ValueError(f"top_labels row {i} predicts label {s[i, j + 1]} more than once "
                                 "in its first k entries; each label may be ranked once")
    return top


def _as_ks(k) -> Tuple[int, ...]:
    ks = (k,) if np.isscalar(k) else tuple(k)
    if not ks:
        raise ValueError("k must be a positive integer or a non-empty list of them")
    out = []
    for v in ks:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"k must be positive integers, got {v!r}")
        out.append(int(v))
    return tuple(out)


def _hits(top: np.ndarray, y: sp.csr_matrix) -> np.ndarray:
    """``r[i, j] = 1.0`` where ``top[i, j]`` is a true label of point ``i``.

    Each (point, label) pair is encoded as one int64 key ``i * L + l``; the keys of the true
    labels are sorted (rows in order, sorted indices), so one ``searchsorted`` answers all
    membership questions at once.
    """
    n, kmax = top.shape
    L = np.int64(y.shape[1])
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(y.indptr))
    true_keys = rows * L + y.indices.astype(np.int64)
    if true_keys.size == 0 or top.size == 0:
        return np.zeros((n, kmax), dtype=np.float64)
    q = np.arange(n, dtype=np.int64)[:, None] * L + top
    pos = np.searchsorted(true_keys, q.ravel())
    pos = np.minimum(pos, true_keys.size - 1)
    hit = (true_keys[pos] == q.ravel()).reshape(n, kmax) & (top >= 0)
    return hit.astype(np.float64)


def _ideal_weights(y: sp.csr_matrix, inv_p: np.ndarray, kmax: int) -> np.ndarray:
    """``[n, kmax]``: each row's true-label inverse propensities, largest first, zero-padded."""
    n = y.shape[0]
    out = np.zeros((n, kmax), dtype=np.float64)
    if y.nnz == 0:
        return out
    counts = np.diff(y.indptr)
    rows = np.repeat(np.arange(n), counts)
    w = inv_p[y.indices]
    order = np.lexsort((-w, rows))  # by row, then by weight descending
    rank = np.arange(y.nnz) - np.repeat(y.indptr[:-1], counts)
    keep = rank < kmax
    out[rows[keep], rank[keep]] = w[order][keep]
    return out


def _discounts(kmax: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, kmax + 2, dtype=np.float64))


class _Prepared:
    """Inputs checked once; the per-position hit matrix shared by all metrics."""

    def __init__(self, top_labels, labels, ks):
        self.ks = _as_ks(ks)
        self.kmax = max(self.ks)
        self.y = _as_label_matrix(labels)
        n, L = self.y.shape
        self.top = _as_top(top_labels, n, L, self.kmax)
        self.n = n
        self.hits = _hits(self.top, self.y)
        self.num_true = np.diff(self.y.indptr).astype(np.float64)

    def inv_propensities(self, propensities_):
        if propensities_ is None:
            # Without training-set statistics the evaluated set is the only count available.
            p = propensities(self.y)
        else:
            p = np.asarray(propensities_, dtype=np.float64)
            if p.shape != (self.y.shape[1],):
                raise ValueError(f"propensities must have one value per label ({self.y.shape[1]}), "
                                 f"got shape {p.shape}")
            if not np.all((p > 0) & np.isfinite(p)):
                raise ValueError("propensities must be positive and finite")
        return 1.0 / p

    # each metric returns {k: value}
    def precision(self):
        cum = np.cumsum(self.hits, axis=1)
        return {k: float(cum[:, k - 1].sum() / (k * self.n)) if self.n else 0.0 for k in self.ks}

    def _idcg(self, k):
        """Per point: the DCG@k of a perfect ranking, 0 for points without labels."""
        table = np.concatenate([[0.0], np.cumsum(_discounts(k))])
        return table[np.minimum(self.num_true, k).astype(np.int64)]

    def ndcg(self):
        disc = _discounts(self.kmax)
        dcg = np.cumsum(self.hits * disc, axis=1)
        out = {}
        for k in self.ks:
            ideal = self._idcg(k)
            with np.errstate(invalid="ignore", divide="ignore"):
                per_point = np.where(ideal > 0, dcg[:, k - 1] / ideal, 0.0)
            out[k] = float(per_point.mean()) if self.n else 0.0
        return out

    def recall(self):
        cum = np.cumsum(self.hits, axis=1)
        out = {}
        for k in self.ks:
            with np.errstate(invalid="ignore", divide="ignore"):
                per_point = np.where(self.num_true > 0, cum[:, k - 1] / self.num_true, 0.0)
            out[k] = float(per_point.mean()) if self.n else 0.0
        return out

    def ps(self, propensities_):
        """(PSP@k, PSnDCG@k) as two ``{k: value}`` dicts, sharing the sort for the best values."""
        inv_p = self.inv_propensities(propensities_)
        top = np.where(self.top >= 0, self.top, 0)
        gain = self.hits * inv_p[top]
        ideal = _ideal_weights(self.y, inv_p, self.kmax)
        disc = _discounts(self.kmax)
        # The 1/k of PSP@k and the mean over points cancel in the ratio.
        num = np.cumsum(gain, axis=1).sum(axis=0)
        den = np.cumsum(ideal, axis=1).sum(axis=0)
        psp = {k: float(num[k - 1] / den[k - 1]) if den[k - 1] > 0 else 0.0 for k in self.ks}
        dcg = np.cumsum(gain * disc, axis=1)
        best = np.cumsum(ideal * disc, axis=1)
        psndcg = {}
        for k in self.ks:
            idcg = self._idcg(k)
            with np.errstate(invalid="ignore", divide="ignore"):
                n_k = np.where(idcg > 0, dcg[:, k - 1] / idcg, 0.0).sum()
                d_k = np.where(idcg > 0, best[:, k - 1] / idcg, 0.0).sum()
            psndcg[k] = float(n_k / d_k) if d_k > 0 else 0.0
        return psp, psndcg


def precision_at_k(top_labels, labels, k=5):
    """P@k (a float for an integer ``k``, a dict ``{k: value}`` for a list of ks)."""
    return _unwrap(k, _Prepared(top_labels, labels, k).precision())


def ndcg_at_k(top_labels, labels, k=5):
    """nDCG@k; a point's DCG is divided by the best DCG achievable with its ``min(k, |y|)`` labels."""
    return _unwrap(k, _Prepared(top_labels, labels, k).ndcg())


def recall_at_k(top_labels, labels, k=5):
    """R@k: the fraction of each point's true labels found in its top k, averaged over points."""
    return _unwrap(k, _Prepared(top_labels, labels, k).recall())


def psp_at_k(top_labels, labels, k=5, propensities=None):
    """Propensity-scored P@k, normalised by its best achievable value on ``labels`` (1.0 = best).

    ``propensities``: one value per label from :func:`propensities` on the *training* labels;
    when omitted they are estimated from ``labels`` itself with the default A, B.
    """
    return _unwrap(k, _Prepared(top_labels, labels, k).ps(propensities)[0])


def psndcg_at_k(top_labels, labels, k=5, propensities=None):
    """Propensity-scored nDCG@k, normalised by its best achievable value on ``labels`` (1.0 = best)."""
    return _unwrap(k, _Prepared(top_labels, labels, k).ps(propensities)[1])


def _unwrap(k, d):
    return d[int(k)] if np.isscalar(k) else d


def evaluate(top_labels, labels, k: Union[int, Sequence[int]] = (1, 3, 5),
             propensities: Optional[np.ndarray] = None) -> Dict[str, float]:
    """All metrics at once: ``{"P@1": .., "nDCG@1": .., "PSP@1": .., "PSnDCG@1": .., "R@1": .., ...}``.

    Keys are ordered metric by metric (P, nDCG, PSP, PSnDCG, R), each for every ``k``.
    ``propensities`` as in :func:`psp_at_k`: pass ``slide.metrics.propensities(train.labels, A, B)``
    to get numbers comparable with published tables. The inputs are checked and the hit matrix
    is computed once for all metrics.
    """
    prep = _Prepared(top_labels, labels, k)
    psp, psndcg = prep.ps(propensities)
    parts = [("P", prep.precision()), ("nDCG", prep.ndcg()), ("PSP", psp), ("PSnDCG", psndcg),
             ("R", prep.recall())]
    return {f"{name}@{kk}": vals[kk] for name, vals in parts for kk in prep.ks}
