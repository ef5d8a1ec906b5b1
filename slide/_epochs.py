"""The epoch loop of :meth:`slide.Network.fit`: batches, the per-epoch learning rate, evaluations
and the validation-driven decisions (best weights, plateau schedule, early stopping) and the
switch from the ``epochs: auto`` search to the refit. A mixin of :class:`slide.Network`, which
owns the state it reads and writes."""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Dict, List, Optional

import numpy as np

from . import centroids as _centroids
from ._arrays import _Arrays, _FitData, _Meter
from .config import monitor_k
from .history import History
from .output_init import init_output_centroids

log = logging.getLogger("slide")

# training.test_every: auto evaluates the test split about this many times a phase: on a set of
# 4,000 labels and 3,000 test points, scoring every test row (with the label term) after each of
# 149 epochs took 2.6 times the training time (89 s against 34 s).
TEST_EVALS = 20
# ... and skips one of them while the test evaluations of the fit have taken more than
# TEST_SHARE of its training seconds (beyond TEST_FREE_SECONDS): they are shown, never used, and
# on a wide layer one costs as much as an epoch (synth-20k shape, 20,000 training and 10,000
# test points, 20,000 labels: 2-4 s against 4-8 s; benchmarks/README.md, "Evaluations").
TEST_SHARE = 0.1
TEST_FREE_SECONDS = 10.0
# training.patience_samples stops a search no sooner than this many evaluations after its best.
PATIENCE_MIN_EVALS = 3


class _EpochLoop:
    """Training epochs and their bookkeeping (mixed into :class:`slide.Network`)."""

    def _remaining_samples(self, arrays: _Arrays, epochs: int) -> int:
        bs = self.config.training.batch_size
        batches = max(1, math.ceil(arrays.n / bs))
        epoch, done = (self.epoch, self._batch_in_epoch) if self._batch_in_epoch < batches else \
            (self.epoch + 1, 0)
        return max(0, (epochs - epoch) * arrays.n - done * bs)

    def _epoch_lr(self, replay: bool, batches_per_epoch: int) -> float:
        """The learning rate of the current epoch: the search's recorded rate when replaying,
        else the configured rate, decayed per epoch (or per ``lr_decay_min_steps`` batches when
        epochs are shorter) and scaled by the plateau schedule."""
        if replay:
            return self._lr_trace[min(self.epoch, len(self._lr_trace) - 1)]
        o = self.config.optimizer
        decays = self.epoch * min(1.0, batches_per_epoch / o.lr_decay_min_steps)
        return o.lr * o.lr_decay ** decays * self._lr_scale

    def _train_epochs(self, arrays: _Arrays, epochs: int, valid: Optional[_Arrays],
                      test: Optional[_Arrays], history: History, cbs, budget: float,
                      replay: bool = False) -> None:
        """Trains epoch after epoch until ``epochs`` are complete, a callback or early stopping
        sets ``stop_training``, or ``budget`` seconds of training (0 = none) have passed."""
        cfg = self.config
        tr = cfg.training
        core = self._core
        n, bs = arrays.n, tr.batch_size
        batches_per_epoch = max(1, math.ceil(n / bs))
        if self._batch_in_epoch >= batches_per_epoch:   # resumed with a different data size
            self.epoch += 1
            self._batch_in_epoch = 0
        # The training labels' frequencies, for the sampling correction of a hash-sampled
        # output layer (derived from the data, so a resumed run gets the same values).
        counts = np.bincount(arrays.y_indices, minlength=core.output_dim)
        core.set_label_frequencies(np.minimum(counts / max(1, n), 1.0).astype(np.float32))
        start_step = self.step
        start_position = self.epoch * batches_per_epoch + self._batch_in_epoch
        meter = _Meter()
        lr = self._epoch_lr(replay, batches_per_epoch)
        try:
            while self.epoch < epochs and not self.stop_training:
                if budget and self._agreed(self._train_seconds >= budget):
                    history.stopped_by_budget = True
                    break
                t_shuffle = time.perf_counter()
                perm = np.random.default_rng([tr.seed, self.epoch]).permutation(n).astype(np.int64)
                if getattr(core, "profiling", False):   # the engine's phase profiler is on
                    core.add_profile_time("shuffle", time.perf_counter() - t_shuffle, float(perm.nbytes))
                epoch_lr = self._epoch_lr(replay, batches_per_epoch)
                if not replay and self._phase == "search" and len(self._lr_trace) <= self.epoch:
                    self._lr_trace.append(epoch_lr)
                while self._batch_in_epoch < batches_per_epoch:
                    rows = perm[self._batch_in_epoch * bs:(self._batch_in_epoch + 1) * bs]
                    lr = epoch_lr
                    if cfg.optimizer.warmup_steps:
                        lr *= min(1.0, (self.step + 1) / cfg.optimizer.warmup_steps)
                    t0 = time.perf_counter()
                    loss = float(core.train_batch(arrays.x_indptr, arrays.x_indices, arrays.x_values,
                                                  arrays.y_indptr, arrays.y_indices, rows, lr))
                    dt = time.perf_counter() - t0
                    self._batch_in_epoch += 1
                    self._train_seconds += dt
                    self._samples_trained += int(rows.size)
                    meter.add(rows.size, dt, loss)
                    self._last_batch_size = int(rows.size)
                    _call(cbs, "on_batch_end", self, self.step, loss)
                    end_of_epoch = self._batch_in_epoch >= batches_per_epoch
                    if tr.eval_every and self.step % tr.eval_every == 0 and not end_of_epoch:
                        self._record(history, cbs, valid, test, lr, meter,
                                     self.epoch + self._batch_in_epoch / batches_per_epoch)
                    if self.stop_training:
                        break
                if self._batch_in_epoch >= batches_per_epoch:
                    self.epoch += 1
                    self._batch_in_epoch = 0
                    if meter.batches:
                        tested = test is not None and self._test_due(epochs)
                        self._record(history, cbs, valid, test if tested else None, lr, meter, self.epoch)
                    _call(cbs, "on_epoch_end", self, self.epoch)
        except KeyboardInterrupt:
            # Ctrl-C may land between the engine's step and the Python bookkeeping: the
            # engine's step count (a discarded batch does not count) decides the position.
            position = start_position + (self.step - start_step)
            self.epoch, self._batch_in_epoch = divmod(position, batches_per_epoch)
            raise

    def _test_due(self, epochs: int) -> bool:
        """Whether the end of the epoch just completed evaluates the test split
        (``training.test_every``): every N-th epoch of a phase of ``epochs``, and its last; with
        ``auto``, not while the fit's test evaluations are over their share of its training time."""
        every = self.config.training.test_every
        if self.epoch >= epochs:
            return True
        if every != "auto":
            return self.epoch % int(every) == 0
        if self.epoch % max(1, math.ceil(epochs / TEST_EVALS)):
            return False
        trained = self._train_seconds - self._fit_train_seconds
        return self._agreed(self._test_seconds <= max(TEST_FREE_SECONDS, TEST_SHARE * trained))

    def _start_refit(self, data: "_FitData") -> None:
        """Ends the search: a fresh network (same seed) will train on all of train for the best
        number of epochs, replaying the search's learning rates."""
        best = self._best_epoch if self._best_epoch is not None else self.epoch
        self._refit_epochs = max(1, int(math.ceil(best)))
        self._step_offset += self.step
        requested = self.requested_sampling
        self._core = self._best_params = None   # freed before the fresh network is allocated
        self._build(self.num_features, self.num_labels, data.full.n)
        self.requested_sampling = requested
        # the refit model is trained on all of train: its label statistics are all of train's
        self._label_counts = np.bincount(data.full.y_indices, minlength=self.num_labels).astype(np.int64)
        self._num_train_points = data.full.n
        self.epoch = 0
        self._batch_in_epoch = 0
        self._init_output_centroids(data.full)
        if self._centroid_weight:   # the refit's label centroids: all of train's
            self._build_centroids(data.full)
        self._phase = "refit"
        self._progress_total_samples = self._remaining_samples(data.full, self._refit_epochs)
        self.stop_training = False
        log.info("epochs=auto: best validation %s %.4f after %s epochs; refitting on all %d "
                 "training points", self.config.training.monitor, self._best_score or float("nan"), best,
                 data.full.n)

    def _init_output_centroids(self, arrays: _Arrays) -> None:
        """``init: centroid`` on the output layer (slide.output_init); counts as training time."""
        if self.config.layers[-1].init == "centroid":
            self._train_seconds += init_output_centroids(self, arrays)

    def _restore_best(self, history: History) -> None:
        """restore_best at the end of a fit: the best weights back, and their copy freed (the
        network holds them now; a later fit with validation data copies them again)."""
        tr = self.config.training
        if tr.restore_best and self._best_params is not None:
            if self._best_step != self.step:
                self._set_parameters(self._best_params)
            history.restored_best = True
            self._best_params = None
            self._weights_are_best = True

    def _copy_best_weights(self) -> None:
        """The copy of the weights and Adam moments that restore_best puts back, written over the
        previous copy: a new copy beside it would hold the model state three times at once
        (20,000 labels x 1,024 hidden units: 2.6 GB of peak RSS against 1.8 GB)."""
        views = self._core.parameters()
        if not _copy_into(self._best_params, views):
            self._best_params = None
            self._best_params = {k: np.array(v, copy=True) for k, v in views.items()}

    def _eval_subset(self, arrays: Optional[_Arrays]) -> Optional[_Arrays]:
        m = self.config.training.eval_samples
        if arrays is None or not m or arrays.n <= m:
            return arrays
        rows = np.sort(np.random.default_rng([self.config.training.seed, 0xE7A1]).permutation(arrays.n)[:m])
        return arrays.subset(rows)

    def _record(self, history: History, cbs, valid: Optional[_Arrays], test: Optional[_Arrays],
                lr: float, meter: "_Meter", epoch: float) -> None:
        """Evaluates, appends a History record, and runs the validation-driven decisions:
        best weights, the plateau schedule and early stopping."""
        rec: Dict[str, Any] = {
            "step": self.total_steps,
            "epoch": epoch,
            "seconds": self._train_seconds,
            "samples_per_second": meter.samples / meter.seconds if meter.seconds > 0 else float("nan"),
            "loss": meter.loss_sum / max(1, meter.batches),
            "lr": lr,
        }
        if self._phase in ("search", "refit"):
            rec["phase"] = self._phase
        meter.reset()
        main = None
        # a search books which validation rows its best evaluation ranks right (slide.lr_search)
        hits: Optional[List[np.ndarray]] = [] if self._phase == "search" else None
        monitor = self.config.training.monitor
        # on a wide layer the label term's choice at a new best starts from the validation rows'
        # best labels: the validation pass keeps them (slide.centroids.choose)
        wide = self.num_labels > _centroids.FULL_LABELS
        pool: Optional[List[np.ndarray]] = [] if self._choose_at_best and wide else None
        for name, arrays in (("valid", valid), ("test", test)):
            if arrays is None:
                continue
            t = time.perf_counter()
            m = self._evaluate_arrays(arrays, self.config.eval.k, hits=hits if name == "valid" else None,
                                      pool=pool if name == "valid" else None, hits_k=monitor_k(monitor))
            if name == "test":
                self._test_seconds += time.perf_counter() - t
            rec.update({f"{name}/{k}": v for k, v in m.items()})
            main = m if name == "test" or main is None else main
        if main is not None:
            rec.update(main)
        if valid is not None and self._track_best(rec[f"valid/{monitor}"], epoch, history):
            if hits:
                self._best_hits = hits[0]
            if self._choose_at_best:
                # centroid_weight auto: the weight the best network's validation logits choose, taken
                # when the search ends (before a refit that network's weights are not kept)
                self._best_choice = self._choose_label_term(valid, top=pool[0] if pool else None)
        history.records.append(rec)
        _call(cbs, "on_evaluate", self, rec)

    def _track_best(self, score: float, epoch: float, history: History) -> bool:
        """Books a validation score; True when it is a new best."""
        tr, o = self.config.training, self.config.optimizer
        if (self._phase == "search" and self._best_step is not None and self._best_step < o.lr_decay_min_steps
                <= self.step):
            # A search's best from before one decay period of steps gives way to the first later
            # evaluation: on a small validation split an early network that ranks the frequent
            # labels first can score a peak that training never passes again, and the refit would
            # stop there (draws of 400 training points: scene 0.647 after 2 epochs, corel5k 0.151
            # after 5). Measured on points held out of the training files (README, epochs: auto).
            self._best_score = None
        if self._best_score is None or score > self._best_score:
            self._best_score, self._best_step, self._best_epoch = score, self.step, epoch
            self._evals_since_best = 0
            self._evals_since_lr_change = 0
            if self._snapshot_best:
                self._copy_best_weights()
            return True
        self._evals_since_best += 1
        self._evals_since_lr_change += 1
        if o.lr_plateau < 1.0 and self._evals_since_lr_change >= o.lr_plateau_patience:
            self._lr_scale *= o.lr_plateau
            self._evals_since_lr_change = 0
        # Patience counts evaluations, and at least two learning-rate decay periods of batches:
        # a small data set (a few batches an epoch) is not stopped before it had the steps to learn.
        # On large data it also ends after patience_samples samples (and PATIENCE_MIN_EVALS
        # evaluations): ten epochs of 50,000 points would wait half a million samples. Below
        # 25,000 points an epoch, ten epochs come first (every shared set here).
        waited = self.step - self._best_step
        if (tr.patience and waited >= 2 * o.lr_decay_min_steps
                and (self._evals_since_best >= tr.patience
                     or (tr.patience_samples and self._evals_since_best >= min(tr.patience, PATIENCE_MIN_EVALS)
                         and waited * tr.batch_size >= tr.patience_samples))):
            history.stopped_early = True
            self.stop_training = True
        return False


def _copy_into(into: Optional[Dict[str, np.ndarray]], views: Dict[str, np.ndarray]) -> bool:
    """Writes the engine's arrays ``views`` over the previous copy ``into`` where every array
    matches (shape, dtype, writable); False when there is none to reuse."""
    if into is None or into.keys() != views.keys() or not all(
            into[k].shape == v.shape and into[k].dtype == v.dtype and into[k].flags.writeable
            for k, v in views.items()):
        return False
    for k, v in views.items():
        np.copyto(into[k], v)
    return True


def _call(cbs, method: str, *args) -> None:
    for cb in cbs:
        fn = getattr(cb, method, None)
        if fn is not None:
            fn(*args)
