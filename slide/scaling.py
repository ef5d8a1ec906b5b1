"""Input row scaling (``data.normalize``), the one implementation that everything uses.

slide's :class:`~slide.Network`, the baselines in :mod:`slide.baselines` and the synthetic
generator all scale rows through :func:`normalize_rows`: a comparison between systems is fair
only when they see the same numbers, down to the last bit.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import scipy.sparse as sp

__all__ = ["NORMALIZE_MODES", "STANDARDIZE_DENSITY", "idf_weights", "normalize_rows", "scale_values",
           "wants_standardize", "feature_standardization", "standardize"]

#: The values of ``data.normalize``.
NORMALIZE_MODES = ("none", "l2", "tfidf_l2")

#: Stored values per block of :func:`scale_values` (8 MiB of float64 temporaries).
SCALE_BLOCK = 1 << 20

#: ``data.standardize: auto`` standardizes features when at least this share of the training
#: matrix's entries is stored: dense real-valued descriptors (image, audio, biological), not text.
STANDARDIZE_DENSITY = 0.5

#: Most entries (rows x features) that standardizing may store: centring stores every entry.
STANDARDIZE_MAX_ENTRIES = 1 << 28


def idf_weights(features: sp.spmatrix, dtype=np.float32) -> np.ndarray:
    """Smoothed inverse document frequency per feature, ``log((1 + n) / (1 + df)) + 1``,
    computed on the training rows only (so test data never leaks into the scaling).

    ``features`` is a CSR matrix; ``n`` is its number of rows and ``df`` the number of rows in
    which each feature is stored. The weights are computed in float64 and returned as ``dtype``.
    """
    features = sp.csr_matrix(features)
    n = features.shape[0]
    df = np.bincount(features.indices, minlength=features.shape[1]).astype(np.float64)
    return (np.log((1.0 + n) / (1.0 + df)) + 1.0).astype(dtype, copy=False)


def wants_standardize(setting, features: sp.spmatrix) -> bool:
    """Whether ``data.standardize`` (``"auto"``, True or False) standardizes these training
    features: auto does when at least :data:`STANDARDIZE_DENSITY` of the entries are stored.
    Raises ValueError when the centred matrix would hold more than
    :data:`STANDARDIZE_MAX_ENTRIES` entries (1 GiB of float32 values)."""
    n, d = features.shape
    if setting == "auto":
        on = n * d > 0 and features.nnz >= STANDARDIZE_DENSITY * n * d
    else:
        on = bool(setting)
    if on and n * d > STANDARDIZE_MAX_ENTRIES:
        raise ValueError(f"data.standardize: centring {n:,} rows x {d:,} features stores every entry "
                         f"({n * d:,}, above {STANDARDIZE_MAX_ENTRIES:,}); set data.standardize: false")
    return on


def feature_standardization(features: sp.spmatrix, num_features: Optional[int] = None):
    """``(mean, scale)`` per feature of the training rows (float32, computed in float64): the
    mean and the standard deviation of each column, zeros counted; 1 where a column is constant.
    ``num_features`` widens the statistics (columns past the matrix are all zero)."""
    x = sp.csr_matrix(features)
    d = max(x.shape[1], int(num_features or 0))
    n = max(1, x.shape[0])
    data = x.data.astype(np.float64)
    mean = np.bincount(x.indices, weights=data, minlength=d) / n
    sq = np.bincount(x.indices, weights=data * data, minlength=d) / n
    sd = np.sqrt(np.maximum(sq - mean * mean, 0.0))
    sd[sd <= 1e-12 * np.maximum(1.0, np.abs(mean))] = 1.0
    return mean.astype(np.float32), sd.astype(np.float32)


def standardize(features: sp.spmatrix, mean: np.ndarray, scale: np.ndarray) -> sp.csr_matrix:
    """``(x - mean) / scale`` per feature as a float32 CSR matrix that stores every entry (a
    zero of the input becomes ``-mean / scale``). Columns past ``features``' width count as
    zeros; the result is as wide as ``mean``."""
    x = sp.csr_matrix(features)
    d = len(mean)
    if x.shape[1] > d:
        raise ValueError(f"data has {x.shape[1]} features, the statistics have {d}")
    n = x.shape[0]
    if n * d > STANDARDIZE_MAX_ENTRIES:
        raise ValueError(f"data.standardize: {n:,} rows x {d:,} features are too many entries to centre; "
                         f"predict in smaller chunks")
    dense = np.zeros((n, d), dtype=np.float32)
    if x.nnz:
        rows = np.repeat(np.arange(n), np.diff(x.indptr))
        dense[rows, x.indices] = x.data
    dense -= mean
    dense /= scale
    indptr = np.arange(0, (n + 1) * d, d, dtype=np.int64)
    indices = np.tile(np.arange(d, dtype=np.int32), n)
    return sp.csr_matrix((dense.reshape(-1), indices, indptr), shape=(n, d))


def normalize_rows(features: sp.spmatrix, mode: str = "l2",
                   idf: Optional[np.ndarray] = None) -> sp.csr_matrix:
    """Scale rows as ``data.normalize`` says: ``none``, ``l2`` (unit Euclidean norm) or
    ``tfidf_l2`` (multiply by ``idf``, then unit norm). All-zero rows stay zero.

    Values are float32; each row's squared norm is summed in float64, in storage order.
    Returns a new float32 CSR matrix; the input is not modified. When the input is already a
    float32 CSR matrix, the result shares its index arrays (``indices``, ``indptr``: neither is
    written) and only the values are copied: a training set is held once more in values, not
    twice (amazon-670k preset: 148 MB of indices not copied).
    """
    if mode not in NORMALIZE_MODES:
        raise ValueError(f"data.normalize must be one of {', '.join(NORMALIZE_MODES)}; got {mode!r}")
    if sp.isspmatrix_csr(features) and features.dtype == np.float32:
        x = sp.csr_matrix((features.data.copy(), features.indices, features.indptr), shape=features.shape,
                          copy=False)
    else:
        x = sp.csr_matrix(features, dtype=np.float32, copy=True)
    if mode != "none":
        scale_values(x.data, x.indices, x.indptr, x.shape[1], mode, idf)
    return x


def scale_values(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, num_features: int, mode: str,
                 idf: Optional[np.ndarray] = None) -> None:
    """:func:`normalize_rows` on the arrays of a canonical CSR matrix: scales the float32
    ``data`` in place (the same arithmetic, so the same bits, without building a matrix:
    a one-row query then costs microseconds).

    Rows are taken in blocks of about ``SCALE_BLOCK`` stored values, so that the float64
    temporaries stay a few MiB whatever the size of the matrix (whole-matrix temporaries were
    five times the values: 0.55 GiB above the resident set on the amazon-670k preset, the peak
    of a training run). Each row lies in one block and is summed in the same order, so the
    result does not depend on the block size."""
    if mode == "none":
        return
    if mode == "tfidf_l2":
        if idf is None:
            raise ValueError("normalize_rows: mode 'tfidf_l2' needs the idf weights of the training rows")
        idf = np.asarray(idf, dtype=np.float32)
        if idf.shape[0] < num_features:
            raise ValueError(f"idf has {idf.shape[0]} weights for {num_features} features")
    indptr = np.asarray(indptr)
    n = len(indptr) - 1
    r0 = 0
    while r0 < n:
        # the rows whose values start within the next SCALE_BLOCK values (at least one row)
        target = min(int(indptr[r0]) + SCALE_BLOCK, int(indptr[-1]))
        r1 = max(r0 + 1, int(np.searchsorted(indptr, target, side="right")) - 1)   # <= n
        _scale_block(data, indices, indptr[r0:r1 + 1], mode, idf)
        r0 = r1


def _scale_block(data: np.ndarray, indices: np.ndarray, ptr: np.ndarray, mode: str,
                 idf: Optional[np.ndarray]) -> None:
    """Scales the rows whose offsets are ``ptr`` (a slice of indptr) in place."""
    a, b = int(ptr[0]), int(ptr[-1])
    block = data[a:b]              # a view: scaled in place
    if mode == "tfidf_l2":
        block *= idf[indices[a:b]]
    counts = np.diff(ptr)
    if block.size:
        # reduceat needs in-range start offsets: the appended 0 stands in for trailing empty rows,
        # and the value reduceat gives an empty row (the next element) is replaced by 0 below.
        sq = np.add.reduceat(np.concatenate([block.astype(np.float64) ** 2, [0.0]]),
                             np.minimum(ptr[:-1] - a, block.size))
        sq = np.where(counts > 0, sq, 0.0)
    else:
        sq = np.zeros(len(ptr) - 1)
    norms = np.sqrt(sq)
    norms[norms == 0] = 1.0
    block /= np.repeat(norms, counts).astype(np.float32)
