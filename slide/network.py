"""The user-facing network: configure, fit, evaluate, predict, save and resume.

:class:`Network` drives the C++ engine (``slide._core.Network``) from Python: it converts the
data once, shuffles, schedules the learning rate, evaluates, stops early, calls callbacks and
writes atomic checkpoints that continue a run exactly. The engine does the arithmetic (sparse
forward/backward, LSH active sets, fused Adam) with the GIL released. The epoch loop, the
label-centroid term and inference are mixins of their own (``_epochs``, ``_label_term``,
``_inference``).

Metric keys in :class:`History` records
---------------------------------------
Every record has ``step`` (batches done), ``epoch`` (epochs done, fractional between epoch
ends), ``seconds`` (training wall time so far, evaluation excluded), ``samples_per_second``
(since the previous record), ``loss`` (mean batch loss since the previous record) and ``lr``.
Metrics are prefixed by the data set they were measured on: ``"valid/P@1"``, ``"test/nDCG@3"``,
``"valid/PSP@5"``, ... The unprefixed keys (``"P@1"``) repeat the test set's values when a test
set was given, else the validation set's.
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import scipy.sparse as sp

from . import callbacks as _callbacks
from . import centroids as _centroids
from ._epochs import _EpochLoop, _call
from ._inference import PREDICT_MODES, _Inference
from ._label_term import _LabelTerm
from . import ensemble as _ensemble
from . import lr_search as _lr_search
from . import memory as _memory
from . import persist as _persist
from ._util import positive_int as _positive_int
from .history import History
from .persist import FORMAT_VERSION
from .config import Config, ConfigError
from ._arrays import _Arrays, _FitData, _Split, _as_csr
from ._spec import _apply_overrides, _engine_spec
from .sampling import choose_sampling, resolve_output_activation
from . import _bf16
from .scaling import feature_standardization, idf_weights, normalize_rows, scale_values, standardize, wants_standardize

__all__ = ["Network", "History", "FORMAT_VERSION", "PREDICT_MODES", "choose_sampling"]

log = logging.getLogger("slide")


# epochs: auto holds this fraction of train out for validation, at most AUTO_VALID_MAX points
# (validation is scored exactly after every epoch: more points cost time, not accuracy of choice).
AUTO_VALID_FRACTION = 0.2
AUTO_VALID_MAX = 5_000


def _core_module():
    from . import _core

    if not hasattr(_core, "Network"):
        raise RuntimeError("this build of slide._core has no Network engine; rebuild the "
                           "extension (pip install -e . or .ci/dev-build)")
    return _core


class Network(_EpochLoop, _LabelTerm, _Inference):
    """A sparse network for extreme multi-label classification.

    ``Network(config=None, *, num_features=None, num_labels=None, **overrides)``

    ``config`` is a dict, a YAML path or a :class:`slide.Config` (None = defaults). Keyword
    shortcuts override single settings without writing the nested form:

    ======================  =========================================
    ``epochs``              ``training.epochs``
    ``batch_size``          ``training.batch_size``
    ``threads``             ``training.threads`` (0 = all cores)
    ``seed``                ``training.seed``
    ``dropout``             ``training.dropout``
    ``patience``            ``training.patience`` (early stopping)
    ``restore_best``        ``training.restore_best``
    ``eval_every``          ``training.eval_every``
    ``eval_samples``        ``training.eval_samples``
    ``test_every``          ``training.test_every``
    ``lr``                  ``optimizer.lr``
    ``weight_decay``        ``optimizer.weight_decay``
    ``warmup_steps``        ``optimizer.warmup_steps``
    ``lr_decay``            ``optimizer.lr_decay``
    ``lr_plateau``          ``optimizer.lr_plateau``
    ``lr_decay_min_steps``  ``optimizer.lr_decay_min_steps``
    ``max_epochs``          ``training.max_epochs`` (cap of ``epochs="auto"``)
    ``time_budget``         ``training.time_budget`` (seconds of training)
    ``refit``               ``training.refit``
    ``ensemble``            ``training.ensemble`` (networks merged into one)
    ``normalize``           ``data.normalize`` (none | l2 | tfidf_l2)
    ``standardize``         ``data.standardize`` (auto | true | false)
    ``valid_fraction``      ``data.valid_fraction``
    ``k``                   ``eval.k``
    ``hidden``              hidden layer sizes: an int or a list of ints (ReLU, dense); the
                            output layer keeps its settings
    ``sampling``            the output layer's ``sampling`` (auto | dense | lsh)
    ``precision``           ``precision`` of the first and the output layer (fp32 | bf16:
                            weights and Adam moments in bfloat16, half the bytes)
    ======================  =========================================

    The engine is created at the first :meth:`fit` (the data gives the number of features and
    labels), or at once when both ``num_features`` and ``num_labels`` are given. The output
    layer has one neuron per label.

    Thread safety: one call at a time per network (fit, predict, evaluate and save share the
    weights); different networks may be used from different threads.

    Several processes (``comm``: an mpi4py communicator of R > 1 ranks, e.g.
    ``MPI.COMM_WORLD``): the output layer's labels are split into R contiguous ranges, one per
    rank, and every rank must make the same calls with the same data (:mod:`slide.distributed`).
    ``fit``, ``predict``, ``evaluate`` and ``save`` are collective and give the same results
    on every rank; :meth:`parameters` and :meth:`memory_report` are this rank's (the output
    layer's rows of its labels). ``comm`` of one rank, or None, is the single-process network.
    """

    def __init__(self, config: Union[None, str, os.PathLike, Dict[str, Any], Config] = None, *,
                 num_features: Optional[int] = None, num_labels: Optional[int] = None,
                 comm: Any = None, **overrides: Any):
        self._comm = comm if comm is not None and comm.Get_size() > 1 else None
        cfg = Config.load(config)
        if overrides:
            cfg = _apply_overrides(cfg, overrides)
        self.config: Config = cfg
        self._core = None
        self.num_features: Optional[int] = None
        self.num_labels: Optional[int] = None
        self.resolved_sampling: Optional[List[str]] = None
        # what the config asked for before ``auto`` was resolved (None for a loaded network)
        self.requested_sampling: Optional[List[str]] = None
        self.epoch = 0                # completed epochs
        self._batch_in_epoch = 0      # batches of the current epoch already trained
        self._idf: Optional[np.ndarray] = None
        # data.standardize: (mean, scale) per feature of all the rows the first fit was given, None when off
        self._standard: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self._standard_fixed = False   # decided (on or off) by the first training data or given
        # The label-centroid term (slide.centroids): its weight once fixed (None: not chosen yet,
        # 0: off) and the feature-by-label centroid matrix while the weight is above 0.
        self._centroid_weight: Optional[float] = None
        self._centroids = None   # sparse feature-by-label centroids, or dense ridge label vectors
        # the label vectors' kind once fixed (mean | ridge; None: not chosen yet) and ridge penalty
        self._centroid_kind: Optional[str] = None
        self._ridge_lambda: Optional[float] = None
        # centroid_kind auto while choosing: the ridge label vectors by penalty (points trained on)
        self._ridge: Optional[Dict[float, np.ndarray]] = None
        self._score_cache = None   # slide.centroids.choose: validation scores of the label vectors
        self._dense_vectors = None  # slide.centroids: (sparse centroids, their dense copy for scoring)
        self._choose_at_best = False   # fit decides: choose the centroid weight at each new best
        # centroid_weight auto: the choice (slide.centroids.Choice) at the search's best epoch
        self._best_choice: Optional[_centroids.Choice] = None
        self._keep_choice = False     # an lr_search child: leaves its choice to the parent
        # an ensemble's network (slide.ensemble): fit returns when the refit is ready to start
        self._pause_before_refit = False
        self._label_counts: Optional[np.ndarray] = None
        self._num_train_points = 0
        self._train_seconds = 0.0
        self._best_score: Optional[float] = None
        # the search's best evaluation: which validation rows it ranked right at P@1 (lr_search)
        self._best_hits: Optional[np.ndarray] = None
        self._best_step: Optional[int] = None
        self._best_epoch: Optional[float] = None
        self._best_params: Optional[Dict[str, np.ndarray]] = None
        self._evals_since_best = 0
        self._evals_since_lr_change = 0
        self._snapshot_best = True    # fit decides: whether the best weights will be needed
        self._weights_are_best = False   # restore_best put them back, and nothing trained since
        self._lr_scale = 1.0          # plateau schedule: product of the reductions so far
        self._lr_trace: List[float] = []  # epochs=auto: the search's learning rate per epoch
        self._phase = "train"         # train (fixed epochs) | search | refit | done (epochs=auto)
        self._refit_epochs: Optional[int] = None
        self._step_offset = 0         # batches of the search, once the refit has started
        self._samples_trained = 0     # samples of all batches of the run (search and refit)
        self._fit_train_seconds = self._test_seconds = 0.0   # set by fit (training.test_every auto)
        self._lr_search_samples = 0   # samples of the searches of slide.lr_search (their networks')
        # the configured learning rate (slide.lr_search may adopt another): an ensemble's networks
        # each search from it (slide.ensemble)
        self._configured_lr = float(cfg.optimizer.lr)
        self.history = History()
        self.stop_training = False
        self._last_batch_size = 0
        self._progress_total_samples = 0
        if num_features is not None or num_labels is not None:
            if num_features is None or num_labels is None:
                raise ValueError("give both num_features and num_labels to create the engine "
                                 "now, or neither to create it at the first fit")
            self._build(_positive_int(num_features, "num_features"),
                        _positive_int(num_labels, "num_labels"))

    # ------------------------------------------------------------------ properties
    @property
    def built(self) -> bool:
        """True once the engine exists (after the first fit, or eagerly with the shape)."""
        return self._core is not None

    @property
    def step(self) -> int:
        """Batches trained so far (the Adam step count)."""
        return int(self._core.step) if self._core is not None else 0

    @property
    def total_steps(self) -> int:
        """Batches trained in the whole run: with ``epochs="auto"`` the search's and the refit's."""
        return self._step_offset + self.step

    @property
    def samples_trained(self) -> int:
        """Samples of all batches trained in the run (the search's and the refit's)."""
        return self._samples_trained

    @property
    def rank(self) -> int:
        """This process's rank in ``comm`` (0 without one)."""
        return self._comm.Get_rank() if self._comm is not None else 0

    @property
    def ranks(self) -> int:
        """Processes the network is sharded over (1 without ``comm``)."""
        return self._comm.Get_size() if self._comm is not None else 1

    def _agreed(self, flag: bool) -> bool:
        """Rank 0's ``flag`` on every rank (decisions from wall time must be the same everywhere)."""
        return bool(self._comm.bcast(bool(flag), root=0)) if self._comm is not None else bool(flag)

    @property
    def standardized(self) -> bool:
        """Whether this network standardizes its input features (``data.standardize``): fixed by
        the first training data, and kept by the model file."""
        return self._standard is not None

    @property
    def label_counts(self) -> Optional[np.ndarray]:
        """Positive examples per label in the training data (for propensity-scored metrics)."""
        return self._label_counts

    def __repr__(self) -> str:
        shape = (f"{self.num_features} features -> "
                 + " -> ".join(str(s) for s in _memory.layer_sizes(self.config, self.num_labels))
                 if self.built else "not built")
        return f"slide.Network({shape}, epoch={self.epoch}, step={self.step})"

    # ------------------------------------------------------------------ engine
    def _build(self, num_features: int, num_labels: int, num_points: Optional[int] = None,
               best_copy: Optional[bool] = None) -> None:
        """Creates the engine after checking that it fits in memory (with the ridge label vectors
        that training may build from ``num_points`` points, and the copy of the best weights when
        ``best_copy``, None: as the configuration implies; see slide.memory.estimate)."""
        core = _core_module()
        cfg = self.config.copy()
        requested = [layer.sampling for layer in cfg.layers]
        sampling = choose_sampling(cfg, num_labels)
        sizes = _memory.layer_sizes(cfg, num_labels)
        if self._comm is None:
            _memory.check_fits(cfg, num_features, num_labels, sampling=sampling, num_points=num_points,
                               best_copy=best_copy)
        else:   # this rank holds the hidden layers and its share of the labels
            from .distributed import shard_range

            begin, end = shard_range(num_labels, self.ranks, self.rank)
            _memory.check_fits(cfg, num_features, end - begin, sampling=sampling, num_points=num_points,
                               best_copy=best_copy)
        for layer, size, s in zip(cfg.layers, sizes, sampling):
            layer.size = size
            layer.sampling = s
        cfg.layers[-1].activation = resolve_output_activation(
            cfg.layers[-1].activation, sampling[-1], f"layers.{len(cfg.layers) - 1}.activation")
        cfg.validate(source="resolved config")
        if cfg.training.recompute and "lsh" in sampling:
            i = sampling.index("lsh")
            how = " (chosen by sampling: auto)" if requested[i] == "auto" else ""
            raise ConfigError(f"training.recompute: applies to networks without hash-sampled layers, but "
                              f"layers.{i}.sampling is lsh{how} for {num_labels} labels; such networks train "
                              f"sample by sample with O(active) state per sample, so there is nothing to "
                              f"recompute: set training.recompute: false or layers.{i}.sampling: dense")
        if self._comm is not None and cfg.layers[-1].centroid_weight not in ("auto", 0.0):
            warnings.warn(f"layers.{len(cfg.layers) - 1}.centroid_weight: the label-centroid term runs in one "
                          f"process only; it is off in this network sharded over {self.ranks} ranks",
                          UserWarning, stacklevel=3)
            self._centroid_weight = 0.0
        spec = _engine_spec(cfg, num_features)
        if self._comm is None:
            self._core = core.Network(spec)
        else:
            from .distributed import ShardedCore

            self._core = ShardedCore(core, spec, num_labels, self._comm)
        for key in ("shared_negatives", "rebuild_spread"):
            try:
                setattr(self._core, key, getattr(cfg.training, key))
            except ValueError as e:
                raise ConfigError(f"training.{key}: {e}") from None
        self.config = cfg
        self.num_features = num_features
        self.num_labels = num_labels
        self.resolved_sampling = sampling
        self.requested_sampling = requested
        log.debug("network built: %d features, layers %s, sampling %s", num_features, sizes, sampling)

    def _require_built(self, what: str) -> None:
        if self._core is None:
            raise RuntimeError(f"{what}: the network has not been trained or built yet; call fit() "
                               f"first or pass num_features and num_labels to the constructor")

    def memory_report(self) -> Dict[str, Any]:
        """The engine's allocation report once built, else the estimate from :mod:`slide.memory`."""
        if self._core is not None:
            return dict(self._core.memory_report())
        raise RuntimeError("memory_report: the network is not built yet; use "
                           "slide.memory.estimate(config, num_features, num_labels) for an estimate")

    def parameters(self) -> Dict[str, np.ndarray]:
        """Writable numpy views of the engine's weights, biases and optimizer state, by name."""
        self._require_built("parameters")
        return dict(self._core.parameters())

    # ------------------------------------------------------------------ data
    def _split_xy(self, data, need_labels: bool, what: str):
        """(X, Y or None, num_features, num_labels or None) from a Dataset, a tuple or a matrix."""
        if hasattr(data, "features") and hasattr(data, "labels"):
            X, Y = data.features, data.labels
            nf = getattr(data, "num_features", None)
            nl = getattr(data, "num_labels", None)
        elif isinstance(data, tuple) and len(data) == 2:
            X, Y = data
            nf = nl = None
        else:
            if need_labels:
                raise TypeError(f"{what}: expected a slide.Dataset or a tuple (features, labels) of "
                                f"scipy sparse matrices, got {type(data).__name__}")
            X, Y, nf, nl = data, None, None, None
        X = _as_csr(X, what=f"{what} features", dtype=np.float32)
        if nf is None:
            nf = X.shape[1]
        if Y is not None:
            Y = _as_csr(Y, what=f"{what} labels", dtype=np.float32)
            if Y.shape[0] != X.shape[0]:
                raise ValueError(f"{what}: {X.shape[0]} feature rows but {Y.shape[0]} label rows")
            if nl is None:
                nl = Y.shape[1]
        elif need_labels:
            raise ValueError(f"{what}: labels are needed")
        return X, Y, int(nf), (int(nl) if nl is not None else None)

    def _check_features(self, X: sp.csr_matrix, what: str) -> None:
        if X.indices.size and int(X.indices.max()) >= self.num_features:
            first = int(np.argmax(X.indices >= self.num_features))
            row = int(np.searchsorted(X.indptr, first, side="right")) - 1
            bad = int(X.indices[first])
            raise ValueError(f"{what}: feature id {bad} (row {row}) is out of range: the network "
                             f"has {self.num_features} features")
        if X.data.size and not np.all(np.isfinite(X.data)):
            row = int(np.searchsorted(X.indptr, int(np.argmin(np.isfinite(X.data))), side="right")) - 1
            raise ValueError(f"{what}: row {row} has a NaN or infinite feature value")

    def _check_labels(self, Y: sp.csr_matrix, what: str) -> None:
        if Y.indices.size and int(Y.indices.max()) >= self.num_labels:
            raise ValueError(f"{what}: label id {int(Y.indices.max())} is out of range: the network "
                             f"has {self.num_labels} labels")

    def _normalize(self, X: sp.csr_matrix, in_place: bool = False) -> sp.csr_matrix:
        """Apply ``data.standardize`` (the network's feature statistics, when it has them) and
        ``data.normalize`` (with the idf learnt from the training data); ``in_place`` scales X's
        own float32 values instead of a copy (standardizing always makes a new matrix)."""
        mode = self.config.data.normalize
        if self._standard is not None:
            X = standardize(X, *self._standard)    # a new matrix: scaled in place below
            in_place = True
        if mode == "none":
            return X    # no copy of data that is used as it is
        if mode == "tfidf_l2" and self._idf is None:
            raise RuntimeError("tfidf_l2: idf statistics are missing (fit has not run)")
        if in_place:
            scale_values(X.data, X.indices, X.indptr, X.shape[1], mode, self._idf)
            return X
        return normalize_rows(X, mode, self._idf)

    def _convert(self, X: sp.csr_matrix, Y: Optional[sp.csr_matrix], in_place: bool = False) -> _Arrays:
        return _Arrays(self._normalize(X, in_place), Y)

    # ------------------------------------------------------------------ training
    def fit(self, train, epochs: Union[None, int, str] = None, valid=None, test=None,
            callbacks: Iterable[Any] = (), progress: bool = False, copy: bool = True) -> History:
        """Train for ``epochs`` (default ``training.epochs``): a count, or ``"auto"``.

        A count trains until that many epochs are complete, counted from the start of the run,
        so a network loaded from a checkpoint continues where it stopped (mid-epoch included)
        and ``fit(train, epochs=2)`` after one epoch trains one more. ``train``, ``valid`` and
        ``test`` are :class:`slide.Dataset` objects or ``(features, labels)`` tuples of scipy
        sparse matrices.

        ``copy=False`` lets fit scale ``train``'s feature values in place (``data.normalize``)
        when ``train`` is already a float32 CSR matrix (as :func:`slide.load_dataset` gives) and
        no validation split is taken out of it, instead of training on a scaled copy: the values
        are then held once, not twice (148 MB on the amazon-670k preset). ``train`` must not be
        used again afterwards; the result is the same bits either way. The CLI passes it.

        ``"auto"`` (the default) lets the data choose the length and the learning-rate
        schedule. A *search* trains on train less a held-out validation split (``valid``, else
        ``data.valid_fraction`` of train, else 20% of train up to 5,000 points), evaluating it
        after every epoch; the learning rate is multiplied by ``optimizer.lr_plateau`` whenever
        validation P@1 (``training.monitor``: P@k) has not improved for ``lr_plateau_patience``
        evaluations, and the search stops after ``training.patience`` evaluations without
        improvement (or at
        ``max_epochs`` / half of ``time_budget``); a best measured before
        ``optimizer.lr_decay_min_steps`` steps gives way to the first evaluation after them (an
        early peak of a network that ranks frequent labels first). Then, when the split came out of train and
        ``training.refit`` is on, a *refit* trains a fresh network on all of train for the best
        number of epochs, replaying the search's learning rates (records carry ``"phase"``).
        Otherwise the best weights of the search are kept. Before the refit, a cheap search is
        repeated at ``optimizer.lr_search`` times the rate and the best rate kept
        (:mod:`slide.lr_search`; ``history.lr_search``).

        With a count, validation data (``valid`` or ``data.valid_fraction``) drives early
        stopping, the plateau schedule and ``training.restore_best`` (the weights of the best
        evaluation are put back at the end; ``history.best_epoch`` says which). ``test`` is
        only reported, never used to choose anything: at the end of every ``training.test_every``-th
        epoch and of a phase's last (auto: about 20 times a phase of more than 20 epochs, fewer
        where the test evaluations would take over a tenth of the training time).

        ``training.ensemble`` (:mod:`slide.ensemble`): once the ``"auto"`` run is done, N - 1
        more networks train the same way with seeds ``training.seed + 1000 * i`` (their own
        validation splits, searches, rates and label terms) and all N are merged into this
        network, which then ranks labels by the mean of their scores (hidden layers N times as
        wide; ``history.ensemble`` describes each). ``auto`` (the default) merges 3 when the first
        run was cheap by a machine-free count of its work, else keeps one.

        The label-centroid term (``layers[-1].centroid_weight``, :mod:`slide.centroids`):
        ``auto`` chooses its weight on the validation data, at the search's best epoch with
        ``"auto"`` and at the end of training with a count (``history.centroid_weight``,
        ``history.centroid_search``); off without validation data. A number is used as it is.

        Ctrl-C (KeyboardInterrupt) stops training within a batch: the network stays usable and
        resumable (the interrupted batch, possibly partly applied, counts as not done; the best
        weights are not restored, so that :meth:`save` continues the interrupted run), callbacks
        get ``on_train_end``, then the KeyboardInterrupt is re-raised; the partial history is in
        ``net.history``.
        """
        tr = self.config.training
        epochs = tr.epochs if epochs is None else epochs
        auto = epochs == "auto"
        if not auto:
            epochs = _positive_int(epochs, "epochs")
        if auto and self._phase == "train" and self.step > 0:
            raise ValueError("fit(epochs='auto') continues only a run that started with "
                             "epochs='auto'; give a number of epochs to train this network further")
        # a finished epochs=auto run trains nothing more (unless the merge of its ensemble is pending)
        finished_at = self.step if auto and self._phase == "done" else None
        ensemble = _ensemble.requested(self, auto)
        split = self._split_train_valid(train, valid, auto and self._phase != "refit")
        if split.Y_all.nnz == 0:
            raise ValueError(f"train: none of its {split.X_all.shape[0]} points has a label; there is nothing "
                             f"to learn")
        refit = auto and tr.refit and split.held_out_of_train
        # a copy of the best weights (and Adam state) is kept only when it will be put back
        self._snapshot_best = tr.restore_best and not refit
        self._ensure_built(split.num_features, split.num_labels, int(split.X_all.shape[0]),
                           best_copy=self._snapshot_best and split.Xv is not None)
        if auto and ensemble != 1 and (ensemble is not None or _ensemble.may_merge(self, split.X)):
            copy = True   # the other networks of the ensemble read train as it was given
        data = self._prepare_arrays(split, test, copy)
        if data.valid is None:
            # no validation data in this call: a copy of the best weights that an earlier call kept
            # is not this training's best, and restore_best would put back those older weights
            self._best_params = None
        elif self._weights_are_best and self._snapshot_best:
            # an earlier call put its best weights back and freed their copy: the copy again, so
            # that this call puts them back too unless it trains better ones
            self._copy_best_weights()
        self._weights_are_best = False
        if self._comm is not None:
            from .distributed import check_agreement, data_digest

            check_agreement(self._comm, "the training call (epochs, data)", {
                "epochs": epochs, "phase": self._phase, "step": self.step,
                "train": [data_digest(a.x_indptr, a.x_indices) for a in (data.fit, data.full)],
                "labels": data_digest(data.fit.y_indptr, data.fit.y_indices),
                "valid": data_digest(data.valid.x_indptr, data.valid.x_indices) if data.valid else None})

        if self.step == 0 and self._phase in ("train", "search"):
            self._init_output_centroids(data.fit)
        cbs = list(callbacks)
        if progress:
            cbs.insert(0, _callbacks.ProgressBar())
        self.stop_training = False
        # training.test_every auto: the test evaluations' seconds against this fit's training seconds
        self._fit_train_seconds, self._test_seconds = self._train_seconds, 0.0
        history = History()
        self.history = history
        if auto and self._phase == "train":
            self._phase = "search"
        # centroid_weight auto: chosen on the validation logits of the search's best epoch, at
        # each new best (the centroids of the points searched on, built now), as the refit or
        # restore_best will have that network
        self._choose_at_best = bool(self._phase == "search" and (refit or tr.restore_best or self._keep_choice)
                                    and self._centroid_pending(data))
        self._fix_set_weight()
        # the centroids of the points this phase trains on (all of train in a refit)
        if (self._centroid_weight or self._choose_at_best) and self._centroids is None and self._ridge is None:
            self._build_centroids(data.full if self._phase == "refit" else data.fit)
        # epochs=auto: how long the search runs is not known in advance (no total on the bar);
        # the refit's length is (_start_refit sets it when the search ends)
        self._progress_total_samples = (self._remaining_samples(data.fit, epochs) if not auto else
                                        self._remaining_samples(data.full, self._refit_epochs)
                                        if self._phase == "refit" else None)
        interrupted = False
        _call(cbs, "on_train_begin", self)
        try:
            if not auto:
                self._train_epochs(data.fit, epochs, data.valid, data.test, history, cbs, tr.time_budget)
            else:
                if self._phase == "search":
                    self._train_epochs(data.fit, tr.max_epochs, data.valid, data.test, history, cbs,
                                       tr.time_budget * (0.5 if refit else 1.0))
                    if refit and not history.interrupted and (not self.stop_training
                                                              or history.stopped_early):
                        history.lr_search = _lr_search.maybe_search(self, split, data)
                        self._choose_centroid_weight(data, history)
                        self._start_refit(data)
                    elif not self.stop_training or history.stopped_early:
                        self._phase = "done"
                if self._phase == "refit" and not self._pause_before_refit:
                    self._train_epochs(data.full, self._refit_epochs, None, data.test, history, cbs,
                                       tr.time_budget, replay=True)
                    if self.epoch >= self._refit_epochs or history.stopped_by_budget:
                        self._phase = "done"
        except KeyboardInterrupt:
            interrupted = True
            history.interrupted = True
        history.best_epoch, history.best_step, history.best_score = (
            self._best_epoch, self._best_step, self._best_score)
        history.refit_epochs = self._refit_epochs
        if not interrupted and (not auto or not refit):
            self._restore_best(history)
            if (not auto or self._phase == "done") and not self._keep_choice:
                self._choose_centroid_weight(data, history)
        if not interrupted and auto and self._phase == "done" and ensemble != 1:
            # ensemble auto: this run's work sets the count and bounds a vote on standardization
            work = _ensemble.run_work(self, data) if ensemble is None else None
            count = ensemble if ensemble is not None else _ensemble.auto_networks(self, work)
            if count > 1:
                try:
                    _ensemble.train_and_merge(self, count, train, valid, history, progress, work=work)
                except KeyboardInterrupt:
                    interrupted = True
                    history.interrupted = True
        history.centroid_weight = self._centroid_weight or 0.0
        _call(cbs, "on_train_end", self, history)
        if interrupted:
            raise KeyboardInterrupt
        if finished_at == self.step and not history.ensemble:
            warnings.warn("fit(epochs='auto'): this network has finished its epochs='auto' training, so "
                          "nothing more was trained; fit(train, epochs=net.epoch + N) trains it N more "
                          "epochs, and a new slide.Network trains from scratch", stacklevel=2)
        return history

    # The steps of fit, in order.
    def _split_train_valid(self, train, valid, auto: bool) -> "_Split":
        """Train and validation matrices; a split held out of train is chosen by seed, so that
        a resumed run holds out the same rows."""
        cfg = self.config
        X, Y, nf, nl = self._split_xy(train, need_labels=True, what="train")
        if valid is not None:
            Xv, Yv, _, _ = self._split_xy(valid, need_labels=True, what="valid")
            return _Split(X, Y, X, Y, Xv, Yv, nf, nl, held_out_of_train=False)
        n = X.shape[0]
        if cfg.data.valid_fraction > 0:
            n_valid = int(round(cfg.data.valid_fraction * n))
            if n_valid < 1 or n_valid >= n:
                raise ValueError(f"data.valid_fraction={cfg.data.valid_fraction} leaves no "
                                 f"validation or no training rows out of {n}")
        elif auto:
            n_valid = min(int(round(AUTO_VALID_FRACTION * n)), AUTO_VALID_MAX)
            if n_valid < 1 or n_valid >= n:
                raise ValueError(f"train: {n} points are too few to hold out a validation split "
                                 f"for epochs=auto; give a number of epochs")
        else:
            return _Split(X, Y, X, Y, None, None, nf, nl, held_out_of_train=False)
        perm = np.random.default_rng([cfg.training.seed, 0x7A11D]).permutation(n)
        vrows, trows = np.sort(perm[:n_valid]), np.sort(perm[n_valid:])
        return _Split(X[trows], Y[trows], X, Y, X[vrows], Y[vrows], nf, nl, held_out_of_train=True)

    def _ensure_built(self, nf: int, nl: int, n: Optional[int] = None, best_copy: Optional[bool] = None) -> None:
        if self._core is None:
            self._build(nf, nl, n, best_copy)
            return
        if nf > self.num_features:
            raise ValueError(f"train: {nf} features, but the network was built for {self.num_features}")
        if nl > self.num_labels:
            raise ValueError(f"train: {nl} labels, but the network was built for {self.num_labels}")

    def _prepare_arrays(self, split: "_Split", test, copy: bool = True) -> "_FitData":
        """Checks every matrix against the network, fixes the statistics of the first training
        data (label counts, idf) and converts the matrices for the engine (with ``copy=False``,
        the training values in place when nothing else reads them: see :meth:`fit`)."""
        cfg = self.config
        self._check_features(split.X, "train")
        self._check_labels(split.Y, "train")
        if self._label_counts is None:   # the first training data: its statistics stay with the network
            self._label_counts = np.bincount(split.Y.indices, minlength=self.num_labels).astype(np.int64)
            self._num_train_points = int(split.X.shape[0])
        if not self._standard_fixed:
            try:   # all of train: feature statistics use no labels, and the refit trains on it all
                if wants_standardize(cfg.data.standardize, split.X_all):
                    self._standard = feature_standardization(split.X_all, self.num_features)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            self._standard_fixed = True
        if self._idf is None and cfg.data.normalize == "tfidf_l2":
            # as wide as the network (the training matrix may be narrower than an eager build)
            X = split.X if split.X.shape[1] == self.num_features else sp.csr_matrix(
                (split.X.data, split.X.indices, split.X.indptr), shape=(split.X.shape[0], self.num_features))
            self._idf = idf_weights(X)
        valid_arrays = test_arrays = Xt = None
        if split.Xv is not None:
            self._check_features(split.Xv, "valid")
            self._check_labels(split.Yv, "valid")
            valid_arrays = self._eval_subset(self._convert(split.Xv, split.Yv))
        if test is not None:
            Xt, Yt, _, _ = self._split_xy(test, need_labels=True, what="test")
            self._check_features(Xt, "test")
            self._check_labels(Yt, "test")
            test_arrays = self._eval_subset(self._convert(Xt, Yt))
        # Scaling in place (copy=False) only once every check has passed, and only values nothing
        # else reads: a split held out of train is read again (lr search, refit), and validation
        # or test rows may be views of the same values.
        in_place = (not copy and not split.held_out_of_train and split.X.data.flags.writeable
                    and not any(m is not None and np.may_share_memory(m.data, split.X.data) for m in (split.Xv, Xt)))
        fit_arrays = self._convert(split.X, split.Y, in_place)
        full_arrays = (self._convert(split.X_all, split.Y_all) if split.held_out_of_train
                       else fit_arrays)
        return _FitData(fit_arrays, full_arrays, valid_arrays, test_arrays)

    def _set_parameters(self, params: Dict[str, np.ndarray], rebuild_tables: bool = True) -> None:
        views = self._core.parameters()
        for k, v in params.items():
            if k not in views:
                raise ValueError(f"parameter {k!r} is not part of this network")
            if views[k].shape != v.shape:
                raise ValueError(f"parameter {k!r}: shape {v.shape} does not match the network's "
                                 f"{views[k].shape}")
            v = np.asarray(v)
            if views[k].dtype == np.uint16 and v.dtype != np.uint16:
                v = _bf16.from_float32(v)  # float values into a bf16 layer: rounded as the engine rounds
            elif views[k].dtype != np.uint16 and v.dtype == np.uint16:
                raise ValueError(f"parameter {k!r}: the values are bfloat16 (uint16 bits) but this network "
                                 f"stores the layer in float32; build it with precision: bf16 on that layer, "
                                 f"or pass float values")
            views[k][...] = v
        if rebuild_tables and self.resolved_sampling and "lsh" in self.resolved_sampling:
            self._core.rebuild_tables()

    # ------------------------------------------------------------------ persistence
    def _lsh_layers(self) -> List[int]:
        return [i for i, s in enumerate(self.resolved_sampling or ()) if s == "lsh"]

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write the network to one ``.npz`` file, atomically (see :func:`slide.persist.save`)."""
        _persist.save(self, path)

    @classmethod
    def load(cls, path: Union[str, os.PathLike], threads: Optional[int] = None,
             comm: Any = None) -> "Network":
        """Read a file written by :meth:`save` (see :func:`slide.persist.load`); ``threads``
        overrides ``training.threads``. A model saved by R ranks loads on R ranks (``comm``),
        or merged into one process without ``comm``."""
        return _persist.load(cls, path, threads, comm=comm)
