"""The label-centroid term's state on a network (``layers[-1].centroid_weight`` and
``centroid_kind``; the vectors and the choice themselves are :mod:`slide.centroids`): which label
vectors are built on which training rows, and how the choice on validation data is taken and
kept. A mixin of :class:`slide.Network`, which owns the attributes (see its ``__init__``)."""
from __future__ import annotations

import logging
import time
from typing import Optional

import numpy as np

from . import centroids as _centroids
from ._arrays import _Arrays, _FitData
from .config import ConfigError
from .history import History

log = logging.getLogger("slide")


class _LabelTerm:
    """The label-centroid term of the output layer (mixed into :class:`slide.Network`)."""

    @property
    def centroid_weight(self) -> float:
        """The weight of the label-centroid term in predictions (0 = off; slide.centroids).
        Settable: e.g. 0 to serve the network alone, or another weight for a network that has
        the centroids (trained with the term on); fit does not change a weight set here."""
        return float(self._centroid_weight or 0.0)

    @centroid_weight.setter
    def centroid_weight(self, weight: float) -> None:
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.floating, np.integer)) \
                or not 0 <= float(weight) < float("inf"):
            raise ValueError(f"centroid_weight: expected a number >= 0, got {weight!r}")
        if weight > 0 and self._centroids is None:
            raise ValueError("centroid_weight: this network has no label centroids (it was trained with the "
                             "term off); train it with layers[-1].centroid_weight set to a number or auto")
        self._centroid_weight = float(weight)

    @property
    def centroid_kind(self) -> Optional[str]:
        """The label vectors of the label-centroid term: ``mean`` (the label centroids) or
        ``ridge`` (per-label ridge regressions, :func:`slide.centroids.build_ridge`), ``mixed``
        (a merged ensemble's weighted mean of both kinds, :mod:`slide.ensemble`); None while not
        chosen."""
        return self._centroid_kind

    def _fix_set_weight(self) -> None:
        """A weight set in the config (not auto) is used as it is, with the kind asked for
        (``auto``: the centroids; ``ridge`` at its default penalty)."""
        out = self.config.layers[-1]
        if out.centroid_weight == "auto":
            return
        if self._centroid_weight is None:
            self._centroid_weight = float(out.centroid_weight)
        if self._centroid_kind is None:
            ridge = out.centroid_kind == "ridge"
            self._centroid_kind = "ridge" if ridge else "mean"
            self._ridge_lambda = _centroids.RIDGE_DEFAULT_LAMBDA if ridge else None

    def _build_centroids(self, arrays: _Arrays) -> None:
        """The label vectors of the training arrays the network trains on (counts as training
        time): those of the kind chosen, or while ``centroid_kind: auto`` chooses, the centroids
        and (on a problem small enough, ``slide.centroids.ridge_fits``) the ridge vectors of
        every penalty it tries."""
        t = time.perf_counter()
        nf, nl = self.num_features, self.num_labels
        asked, kind = self.config.layers[-1].centroid_kind, self._centroid_kind
        fits = _centroids.ridge_fits(arrays.n, nf, nl)
        if "ridge" in (kind, asked) and not fits:
            raise ConfigError(
                f"layers.{len(self.config.layers) - 1}.centroid_kind: ridge label vectors need at most "
                f"{_centroids.FULL_LABELS} labels, min(points, features) <= {_centroids.RIDGE_MAX_DIM} and "
                f"features x labels <= {_centroids.RIDGE_MAX_ENTRIES}; this problem has {arrays.n} points, "
                f"{nf} features and {nl} labels: use mean or auto")
        if kind == "ridge":        # chosen, or set with the weight: that penalty only
            self._centroids = _centroids.build_ridge(arrays.x_indptr, arrays.x_indices, arrays.x_values,
                                                     arrays.y_indptr, arrays.y_indices, nf, nl,
                                                     [self._ridge_lambda])[self._ridge_lambda]
            self._ridge = None
        else:
            candidates = kind is None and (asked == "ridge" or (asked == "auto" and fits))
            self._ridge = (_centroids.build_ridge(arrays.x_indptr, arrays.x_indices, arrays.x_values,
                                                  arrays.y_indptr, arrays.y_indices, nf, nl)
                           if candidates else None)
            if asked != "ridge":
                self._centroids = _centroids.build(
                    arrays.x_indptr, arrays.x_indices, arrays.x_values, arrays.y_indptr, arrays.y_indices, nf, nl,
                    max_features=_centroids.MAX_FEATURES if nl > _centroids.FULL_LABELS else None)
        self._train_seconds += time.perf_counter() - t
        log.debug("label vectors (%s) built in %.2f s", kind or asked, time.perf_counter() - t)

    def _choose_label_term(self, valid: _Arrays, top: Optional[np.ndarray] = None) -> _centroids.Choice:
        """slide.centroids.choose among the label vectors built: the centroids (unless
        ``centroid_kind: ridge``), then the ridge vectors by penalty (``top``: the validation
        rows' best labels by the network, when the caller scored them already)."""
        mean = [] if self._centroids is None or self.config.layers[-1].centroid_kind == "ridge" else [
            ("mean", None, self._centroids)]
        ridge = [("ridge", lam, W) for lam, W in sorted((self._ridge or {}).items())]
        return _centroids.choose(self, valid, mean + ridge, top=top)

    def _centroid_pending(self, data: _FitData) -> bool:
        """``centroid_weight: auto`` not yet chosen, and something to choose it on."""
        return (self._centroid_weight is None and self.config.layers[-1].centroid_weight == "auto"
                and data.valid is not None and self._comm is None)

    def _choose_centroid_weight(self, data: _FitData, history: History) -> None:
        """``centroid_weight: auto``: the weight of the best validation P@1 (slide.centroids), with
        the label vectors of the points trained on; once per run, off without validation data.
        After an ``epochs: auto`` search, on the validation logits of its best epoch (kept by
        _record; those of the learning rate lr_search adopted), else on the network as it is."""
        if self._centroid_weight is not None or self.config.layers[-1].centroid_weight != "auto":
            return
        if not self._centroid_pending(data):
            self._centroid_weight = 0.0
            return
        if self._centroids is None and self._ridge is None:
            self._build_centroids(data.fit)
        t = time.perf_counter()
        weight, p1, kind, lam = self._best_choice or self._choose_label_term(data.valid)
        self._train_seconds += time.perf_counter() - t
        self._centroid_weight = weight
        self._choose_at_best = False
        self._best_choice = None
        history.centroid_search = p1
        history.centroid_kind = kind if weight else None
        self._centroid_kind, self._ridge_lambda = kind, lam
        if kind == "ridge":
            self._centroids = self._ridge[lam]
        self._ridge = self._score_cache = self._dense_vectors = None
        if not weight:
            self._centroids = None
        log.info("label-centroid weight %g%s chosen on validation (P@1 %.4f against %.4f without)", weight,
                 f" (ridge, lambda {lam:g})" if kind == "ridge" else "", p1[weight], p1[0.0])
