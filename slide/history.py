"""What :meth:`slide.Network.fit` measured: :class:`History`."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

__all__ = ["History"]


class History:
    """What :meth:`Network.fit` measured.

    ``records``: one dict per evaluation (see the module doc for the keys). ``best_epoch`` /
    ``best_step``: where the best validation P@1 (``training.monitor``) was measured (the weights kept when
    ``training.restore_best`` is on), None without validation data. ``stopped_early``: the
    patience ran out. ``interrupted``: a KeyboardInterrupt ended the run.
    """

    def __init__(self, records: Optional[List[Dict[str, Any]]] = None):
        self.records: List[Dict[str, Any]] = list(records or [])
        self.best_epoch: Optional[float] = None
        self.best_step: Optional[int] = None
        self.best_score: Optional[float] = None
        self.restored_best = False
        self.stopped_early = False
        self.stopped_by_budget = False
        self.interrupted = False
        self.refit_epochs: Optional[int] = None
        # epochs=auto on a small problem (slide.lr_search): each rate searched, the configured one
        # first, with its best validation score ("best_valid_P@1", or the training.monitor's) and
        # epoch; empty when only the configured rate ran.
        self.lr_search: List[Dict[str, Any]] = []
        # layers[-1].centroid_weight: the weight in use (0 = off) and, when auto chose it in
        # this fit, the validation P@1 of each weight tried (slide.centroids).
        self.centroid_weight: float = 0.0
        self.centroid_search: Dict[float, float] = {}
        # the label vectors centroid_weight auto chose (mean | ridge; None: the term is off)
        self.centroid_kind: Optional[str] = None
        # training.ensemble (slide.ensemble): one dict per network merged into this one (seed,
        # best epoch, best validation P@1 (training.monitor), label term, training seconds); empty
        # for a single network
        self.ensemble: List[Dict[str, Any]] = []
        # an ensemble on dense input with data.standardize auto: the best validation P@1 of each
        # network standardized and not ("standardized", "raw") and the side merged ("chosen")
        self.standardize_choice: Dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __getitem__(self, key):
        """``history[i]`` is a record; ``history["valid/P@1"]`` the list of that key's values."""
        if isinstance(key, str):
            return [r.get(key) for r in self.records]
        return self.records[key]

    @property
    def last(self) -> Dict[str, Any]:
        return self.records[-1] if self.records else {}

    def to_dict(self) -> Dict[str, Any]:
        return {"records": self.records, "best_epoch": self.best_epoch, "best_step": self.best_step,
                "best_score": self.best_score, "restored_best": self.restored_best,
                "stopped_early": self.stopped_early, "interrupted": self.interrupted,
                "ensemble": self.ensemble, "standardize_choice": self.standardize_choice}

    def __repr__(self) -> str:
        return (f"History({len(self.records)} records, best_epoch={self.best_epoch}, "
                f"stopped_early={self.stopped_early})")
