"""Inference on a trained network: :meth:`slide.Network.predict`, ``evaluate`` and the inference
index. A mixin of :class:`slide.Network`, which owns the engine and the scaling statistics that
queries are normalised with (see its ``__init__``)."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import scipy.sparse as sp

from . import centroids as _centroids
from ._arrays import _Arrays, _as_csr
from .scaling import scale_values, standardize

# predict(mode="lsh") scores this many labels of largest bias besides the hash candidates
# (benchmarks/inference_latency.py: on an amazon-670k-shaped model it closes most of the P@1 gap
# to exact scoring at a small cost per query).
LSH_PRIOR = 1000

# What predict/evaluate accept as mode (see Network.predict).
PREDICT_MODES = ("exact", "index", "lsh")
SIGMOID_LSH_WARNING = (
    "mode='lsh' on a sigmoid output layer: its hash tables return almost no candidates for a row "
    "(the rows a per-label binary loss learns do not hash like the hidden vectors do), so the "
    "ranking is mostly the prior labels; measured on the amazon-670k config P@1 0.0003 against "
    "0.5247 exact. Use mode='index' (there 0.5217 at 36x the speed of exact).")


def _check_mode(mode, what: str) -> None:
    if not isinstance(mode, str) or mode not in PREDICT_MODES:
        raise ValueError(f"{what}: mode must be one of {', '.join(repr(m) for m in PREDICT_MODES)}, got {mode!r}")


class _Inference:
    """predict, evaluate and the inference index (mixed into :class:`slide.Network`)."""

    def predict(self, X, k: int = 5, mode: str = "exact", *, candidates: Optional[int] = None,
                prior: Optional[int] = None, probe: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Top-``k`` labels and scores per row: ``(labels int32 [n, k], scores float32 [n, k])``.

        ``X``: scipy sparse matrix, dense 2-D numpy array, or a :class:`slide.Dataset`. Rows
        are normalised like the training data. ``mode`` (one of :data:`PREDICT_MODES`):

        - ``"exact"`` scores every label.
        - ``"index"`` (sublinear, approximate; for serving a trained model) scores the labels
          of the ``probe`` clusters (default 24 on a wide layer, all of them on a small one) of
          an inference index over the output layer's weight rows and biases that score best
          against the row, each label exactly. The index (k-means over the rows, see
          ``cpp/include/slide/label_index.hpp``) is built at the first call after training,
          loading or :meth:`parameters` (tens of seconds for 10^6 labels; :meth:`build_index`
          builds it ahead of the first query) and reused until the weights change. A larger
          ``probe`` is closer to exact; probing every cluster is exact. Needs a hidden layer
          before the output layer.
        - ``"lsh"`` scores only candidates of a hash-sampled output layer (the same as exact
          on a dense output layer): the neurons its training hash tables return for the row,
          ranked by the number of tables that hold them, at most ``candidates`` of them
          (default: the layer's ``lsh.max_active``, or all when that is 0), plus the ``prior``
          labels with the largest bias (default 1000; the tables index weight vectors, not
          biases, and frequent labels that a large bias puts on top are often in no bucket).
          ``candidates=0`` selects as in training instead (random fill to ``lsh.min_active``).
          The tables serve training; after long training they find the top labels of far
          fewer rows than the index does (datasets/synthetic.md). On a sigmoid output layer
          they return almost no candidates and the ranking is mostly the prior: a
          ``UserWarning`` says so, and mode ``"index"`` is the one to use.

        Scores are the output layer's probabilities: softmax over the scored labels, or each
        label's sigmoid for a sigmoid output layer (``activation: auto`` on a dense output
        layer); labels never scored are -1. ``candidates`` and ``prior`` apply to mode lsh
        only, ``probe`` to mode index only.

        With the label-centroid term on (``layers[-1].centroid_weight``, see
        :mod:`slide.centroids`), labels are ranked by ``logit + weight * cos(x, centroid)``: every
        label on an output layer of up to 4,096 labels, else the union of the mode's top 100 and
        the centroid term's top 100 per row; the scores are the sigmoid or the softmax of that sum.
        With a large weight (validation picks up to 256 or 4,096 for ridge vectors) the sigmoid
        of the top labels rounds to 1.0 in float32 (medical, weight 256: the top label's score is
        1.0 on every test row, the fourth's on 46%): the order of the returned labels is the
        ranking, and such scores are not calibrated probabilities.
        """
        self._require_built("predict")
        _check_mode(mode, "predict")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.num_labels:
            raise ValueError(f"predict: k must be an integer in [1, {self.num_labels}], got {k!r}")
        for name, v in (("candidates", candidates), ("prior", prior)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
                raise ValueError(f"predict: {name} must be an integer >= 0 or None, got {v!r}")
            if v is not None and mode != "lsh":
                raise ValueError(f"predict: {name} applies to mode='lsh' only, got mode={mode!r}")
        if probe is not None:
            if isinstance(probe, bool) or not isinstance(probe, (int, np.integer)) or probe < 1:
                raise ValueError(f"predict: probe must be an integer >= 1 or None, got {probe!r}")
            if mode != "index":
                raise ValueError(f"predict: probe applies to mode='index' only, got mode={mode!r}")
        if hasattr(X, "features") and hasattr(X, "labels"):
            X = X.features
        X = _as_csr(X, what="predict features", dtype=np.float32)
        if not sp.issparse(X) or X.ndim != 2:
            raise ValueError("predict: X must be 2-D")
        self._check_features(X, "predict")
        return self._predict_arrays(self._query_arrays(X), int(k), mode, candidates, prior, probe)

    def build_index(self) -> Dict[str, Any]:
        """Builds the inference index of ``predict(mode="index")`` now, unless one for the
        current weights exists (e.g. before serving queries, so that the first query does not
        wait for it); returns :meth:`index_info`."""
        self._require_built("build_index")
        return dict(self._core.build_index())

    def index_info(self) -> Dict[str, Any]:
        """The inference index as it stands: ``{"built", "clusters", "largest_cluster", "rows",
        "bytes", "build_seconds"}`` (``built`` is False until a call builds it for the current
        weights; training, loading and :meth:`parameters` drop it)."""
        self._require_built("index_info")
        return dict(self._core.index_info())

    def _query_arrays(self, X: sp.csr_matrix) -> "_QueryArrays":
        """X (canonical CSR) normalised like the training data, as the engine reads it; the
        arithmetic of :meth:`_convert` without building matrices."""
        mode = self.config.data.normalize
        if mode == "tfidf_l2" and self._idf is None:
            raise RuntimeError("tfidf_l2: idf statistics are missing (fit has not run)")
        if self._standard is not None:
            X = standardize(X, *self._standard)
        values = np.array(X.data, dtype=np.float32)
        scale_values(values, X.indices, X.indptr, X.shape[1], mode, self._idf)
        return _QueryArrays(np.ascontiguousarray(X.indptr, dtype=np.int64),
                            np.ascontiguousarray(X.indices, dtype=np.int32), values)

    def _predict_arrays(self, arrays: _Arrays, k: int, mode: str = "exact", candidates: Optional[int] = None,
                        prior: Optional[int] = None, probe: Optional[int] = None):
        if mode == "lsh":
            if self.config.layers[-1].activation == "sigmoid" and self.resolved_sampling[-1] == "lsh":
                warnings.warn(SIGMOID_LSH_WARNING, UserWarning, stacklevel=3)
            out = self.config.layers[-1].lsh
            if candidates is None:
                candidates = out.max_active or self.num_labels
            if prior is None:
                prior = LSH_PRIOR
        extra = {"probe": int(probe)} if mode == "index" and probe is not None else {}
        if self._centroid_weight and self._centroids is not None:
            return _centroids.predict(self, arrays, int(k), mode, self._centroid_weight, self._centroids,
                                      candidates=int(candidates or 0), prior=int(prior or 0), **extra)
        labels, scores = self._core.predict_topk(arrays.x_indptr, arrays.x_indices, arrays.x_values,
                                                 int(k), mode, candidates=int(candidates or 0),
                                                 prior=int(prior or 0), **extra)
        return np.asarray(labels, dtype=np.int32), np.asarray(scores, dtype=np.float32)

    def _evaluate_arrays(self, arrays: _Arrays, k, mode: str = "exact",
                         hits: Optional[List[np.ndarray]] = None,
                         pool: Optional[List[np.ndarray]] = None, hits_k: int = 1) -> Dict[str, float]:
        """metrics.evaluate of the arrays; with ``hits`` (a list), appends to it whether each
        row's top label is one of its labels (a bool array), or with ``hits_k`` > 1 how many of
        its labels its top ``hits_k`` holds (the paired comparisons of slide.lr_search at
        ``training.monitor``). With ``pool`` (a list) and the network alone ranking, appends each
        row's best slide.centroids.POOL labels (the label term's choice on a wide layer starts
        from them) and takes the metrics' top k from them: one exact pass for both."""
        from . import metrics

        ks = [k] if isinstance(k, (int, np.integer)) else list(k)
        kmax = min(max(ks), self.num_labels)
        if pool is not None and not self._centroid_weight:
            best, _ = self._predict_arrays(arrays, min(self.num_labels, max(kmax, _centroids.POOL)), mode)
            pool.append(best)
            top = best[:, :kmax]
        else:
            top, _ = self._predict_arrays(arrays, kmax, mode)
        props = None
        if self._label_counts is not None:
            props = metrics.propensities(self._label_counts, self.config.eval.propensity_a,
                                         self.config.eval.propensity_b,
                                         num_points=self._num_train_points)
        Y = arrays.labels
        if Y.shape[1] != self.num_labels:   # ids were checked to be < num_labels
            Y = sp.csr_matrix((Y.data, Y.indices, Y.indptr), shape=(Y.shape[0], self.num_labels))
        if hits is not None:   # metrics' own membership test, on the rows' top label(s)
            h = metrics._hits(top[:, :hits_k], metrics._as_label_matrix(Y))
            hits.append(h[:, 0] > 0 if hits_k == 1 else h.sum(axis=1).astype(np.int64))
        return metrics.evaluate(top, Y, k=ks, propensities=props)

    def evaluate(self, data, k: Union[int, Sequence[int]] = (1, 3, 5), mode: str = "exact") -> Dict[str, float]:
        """Ranking metrics on labelled data: ``{"P@1", "P@3", "P@5", "nDCG@k", "PSP@k", ...}``.

        PSP uses propensities from the training label counts stored at fit
        (``eval.propensity_a``/``propensity_b``). ``mode`` is :meth:`predict`'s: ``"exact"``
        scores every label, ``"index"`` the labels of the inference index's best clusters,
        ``"lsh"`` only the hash-selected candidates.
        """
        self._require_built("evaluate")
        _check_mode(mode, "evaluate")
        X, Y, _, _ = self._split_xy(data, need_labels=True, what="evaluate")
        if X.shape[0] == 0:
            raise ValueError("evaluate: the data has no points; P@k and the other metrics need at least one")
        self._check_features(X, "evaluate")
        self._check_labels(Y, "evaluate")
        return self._evaluate_arrays(self._convert(X, Y), k, mode)


class _QueryArrays(NamedTuple):
    """Features of a predict call as the engine reads them."""
    x_indptr: np.ndarray
    x_indices: np.ndarray
    x_values: np.ndarray
