"""Data as the engine takes it, and the parts of one :meth:`slide.Network.fit`."""
from __future__ import annotations

from typing import Optional

import numpy as np
import scipy.sparse as sp


class _Arrays:
    """A data set converted once to the engine's dtypes (CSR with int64 indptr)."""

    __slots__ = ("X", "x_indptr", "x_indices", "x_values", "y_indptr", "y_indices", "labels", "n")

    def __init__(self, X: sp.csr_matrix, Y: Optional[sp.csr_matrix]):
        self.X = X
        self.n = X.shape[0]
        self.x_indptr = np.ascontiguousarray(X.indptr, dtype=np.int64)
        self.x_indices = np.ascontiguousarray(X.indices, dtype=np.int32)
        self.x_values = np.ascontiguousarray(X.data, dtype=np.float32)
        self.labels = Y
        if Y is not None:
            self.y_indptr = np.ascontiguousarray(Y.indptr, dtype=np.int64)
            self.y_indices = np.ascontiguousarray(Y.indices, dtype=np.int32)
        else:
            self.y_indptr = self.y_indices = None

    def subset(self, rows: np.ndarray) -> "_Arrays":
        return _Arrays(self.X[rows], None if self.labels is None else self.labels[rows])


class _Split:
    """Training rows (``X``, ``Y``), all of train (``X_all``, ``Y_all``) and validation rows."""

    def __init__(self, X, Y, X_all, Y_all, Xv, Yv, num_features, num_labels, held_out_of_train):
        self.X, self.Y, self.X_all, self.Y_all, self.Xv, self.Yv = X, Y, X_all, Y_all, Xv, Yv
        self.num_features, self.num_labels = num_features, num_labels
        self.held_out_of_train = held_out_of_train


class _FitData:
    """Engine-ready arrays of one fit: ``fit`` (trained on), ``full`` (all of train, for the
    refit), ``valid`` and ``test`` (None when absent)."""

    def __init__(self, fit: _Arrays, full: _Arrays, valid: Optional[_Arrays], test: Optional[_Arrays]):
        self.fit, self.full, self.valid, self.test = fit, full, valid, test


class _Meter:
    """Samples, seconds and losses since the last record."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.samples, self.seconds, self.loss_sum, self.batches = 0, 0.0, 0.0, 0

    def add(self, samples: int, seconds: float, loss: float) -> None:
        self.samples += samples
        self.seconds += seconds
        self.loss_sum += loss
        self.batches += 1


def _as_csr(X, what: str, dtype=np.float32) -> sp.csr_matrix:
    """A canonical CSR matrix (sorted indices, no duplicates) of ``dtype`` from sparse or dense input."""
    if type(X) is sp.csr_matrix and X.dtype == dtype and X.has_canonical_format:
        return X    # already what the engine reads: no conversion (a single query pays for each)
    if sp.issparse(X):
        if X.ndim != 2:
            raise ValueError(f"{what}: expected a 2-D matrix, got shape {X.shape}")
        if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool) \
                or np.issubdtype(X.dtype, np.complexfloating):
            raise ValueError(f"{what}: expected real numbers, got dtype {X.dtype}")
        X = sp.csr_matrix(X, dtype=dtype)
    else:
        try:
            arr = np.asarray(X)
        except Exception as e:   # ragged lists and the like
            raise ValueError(f"{what}: cannot be read as a matrix: {e}") from None
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool) \
                or np.issubdtype(arr.dtype, np.complexfloating):
            raise ValueError(f"{what}: expected a scipy sparse matrix or a numeric 2-D array, got "
                             f"{type(X).__name__} of dtype {arr.dtype}")
        if arr.ndim != 2:
            raise ValueError(f"{what}: expected a 2-D matrix, got shape {arr.shape}")
        if arr.dtype != bool and arr.size and not np.all(np.isfinite(arr)):
            raise ValueError(f"{what}: contains NaN or infinite values")
        X = sp.csr_matrix(arr.astype(dtype, copy=False))
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    X.sort_indices()
    return X
