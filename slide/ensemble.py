"""``training.ensemble``: several networks of ``epochs: auto`` merged into one.

With ``epochs: auto`` every choice of a run is taken on one validation split of train: the epoch
the search stops at, the learning rate (:mod:`slide.lr_search`) and the label-centroid term
(:mod:`slide.centroids`). On a few hundred validation rows these choices follow the split as much
as the data. ``training.ensemble: N`` trains N networks of the same configuration, network i with
``training.seed + 1000 * i`` (its own validation split, initialisation, search, rate, label term
and refit on all of train), and merges them into one network whose score of each label is the
mean of theirs:

- the hidden layers side by side: layer 0's columns (and biases) one network's after another's,
  each later hidden layer block-diagonal, so that every network's hidden units see only its own;
- the output layer's weights over those hidden units divided by N, its bias the mean of theirs
  (with no hidden layer, the output layer is the mean of theirs);
- the label-centroid term ``z + w * cos(x, c)`` of each network (``w`` = 0 where validation
  turned it off) as one term: the mean weight on the weighted mean of their label vectors (the
  same vectors when the networks chose the same kind, else kind ``mixed``).

So the merged network ranks labels by ``mean_i (z_i + w_i * cos(x, c_i))``: for a sigmoid output
layer each label's log-odds averaged, for softmax the log of the geometric mean of the networks'
probabilities up to a constant per row. It is an ordinary network (N times as wide, N times the
prediction cost): it saves, loads, predicts in every mode and trains further like any other. Its
Adam moments start at zero and its config names the merged layer sizes with ``ensemble: 1``.

``auto`` (the default) trains 3 networks when the first network's whole run (search, rate
searches and refit) was cheap by a count that does not depend on the machine: its samples trained
times the estimated multiply-adds per sample (:func:`slide.lr_search.work_per_sample`) at most
``AUTO_MAX_WORK``; in one process, with ``epochs: auto`` and no ``training.time_budget``. Else 1.
``history.ensemble`` records each network's seed, best epoch, validation P@1, label term and
training seconds.

Chosen on rows held out of the training files (``benchmarks/draws.py``, no test file read;
benchmarks/README.md): three networks with their own searches gained 0.0067 P@1 over the mean of
their members at 400 training points (10 of 11 sets up) and 0.0068 at 1,000 (6 of 6), where
three refits of one search gained 0.0017 and 0.0003: the variance removed is that of the
search's choices. The merged network against one network, 400 points of 6 sets, 3 draws each:
+0.0089 (6 of 6 sets up); against averaging the same networks' probabilities: +0.0014 (3 up, 3
down). On the 12 shared sets' test files
over seeds 0-4 (2 threads) ``auto`` changed slide's mean P@1 by +0.0155 (medical), +0.0051
(corel16k001), +0.0040 (stackex-chemistry), +0.0014 (enron), +0.0008 (tmc2007-500), -0.0002
(scene), -0.0022 (yeast) and -0.0048 (corel5k), at about 3-4 times the training time, and left
Bibtex, Delicious, rcv1subset2 and yahoo-arts (past AUTO_MAX_WORK) as they were.

On dense input that ``data.standardize: auto`` standardized, validation also chooses whether to
standardize: as many networks again train on the rows without it (the same seeds, so the same
splits), and the side with the higher summed best validation P@1 is merged
(``history.standardize_choice``). On rows held out of the training files (3 draws of 1,000
points) this gained 0.0120 P@1 on densercv (SVD components; standardization dropped), 0.0013 on
yeast and nothing on scene (kept on every draw). The vote is taken on the searches: the networks
pause when their refit is ready to start, and only the chosen side's refits run (the same choice
and P@1 as with every refit trained, in 8-21% fewer seconds on scene and densercv, 2-5% on yeast,
side by side). With ``ensemble: auto`` it runs only
where the first run's work is at most VOTE_MAX_WORK, so that the vote cannot take a run far past
the minute the three networks were sized for; past that the networks keep standardization, as
without the vote.

A KeyboardInterrupt while the extra networks train keeps the first network as it was (trained,
usable and saved as such by ``slide train``) and is re-raised; ``fit(epochs="auto")`` on that
network later trains the others and merges them.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional

import numpy as np
import scipy.sparse as sp

from .config import ConfigError

log = logging.getLogger("slide")

# network i of an ensemble trains with training.seed + SEED_STEP * i
SEED_STEP = 1000
# networks of ``ensemble: auto`` on a cheap problem
AUTO_NETWORKS = 3
# ``ensemble: auto``: the largest first run (samples trained x estimated multiply-adds per
# sample, slide.lr_search, plus the first layer's Adam update) that gets AUTO_NETWORKS networks:
# about 7-20 s of training for the first network on 2 cores here (see ADAM_ROW_COST), so that the
# three stay within a minute
AUTO_MAX_WORK = 7e11
# run_work: multiply-add equivalents per first-layer weight a batch updates (Adam reads and
# writes the weight and its two moments: memory-bound). Fitted to the default runs' seconds on
# the 12 shared sets (2 threads): with it the estimate is 10-29 s per 10^12 on all of them (without
# it 14-60 s: yahoo-arts' and rcv1subset2's 23,146 and 47,236 tf-idf features touch most rows of
# the first layer every batch).
ADAM_ROW_COST = 50
# ``ensemble: auto`` votes on standardization (train_and_merge) only when the first run's work is
# at most this. A vote costs about 5.6 first runs (both sides' searches, one side's refits), so at
# the slowest rate measured for run_work (29 s per 10^12) a run that votes stays near a minute
# (65 s); the dense sets measured here (yeast, scene, densercv and their subsamples: 0.9-3.6e11,
# 13-24 s per 10^12) all vote.
VOTE_MAX_WORK = 4e11


def requested(net, auto_epochs: bool) -> Optional[int]:
    """The networks an explicit ``training.ensemble`` asks for (None for auto), checked against
    the run: more than one needs ``epochs: auto`` and one process."""
    setting = net.config.training.ensemble
    if setting == "auto":
        return None
    count = int(setting)
    if count > 1 and not auto_epochs:
        raise ConfigError(f"training.ensemble: {count} networks are trained with epochs: auto (each chooses "
                          f"its length on its own validation split); set training.epochs: auto or "
                          f"training.ensemble: 1")
    if count > 1 and net._comm is not None:
        raise ConfigError(f"training.ensemble: {count} networks run in one process; a network sharded over "
                          f"{net.ranks} ranks trains alone: set training.ensemble: 1")
    return count


def run_work(net, data) -> float:
    """The first network's whole run in multiply-add equivalents: the samples trained in its
    search, its refit and the rate searches of slide.lr_search, times the estimated work per
    sample (slide.lr_search's, plus the first layer's Adam update: ADAM_ROW_COST per weight of the
    rows a batch touches, at most all of them, shared by the batch's samples)."""
    from .lr_search import SAMPLE_OVERHEAD, mean_nnz, work_per_sample

    samples = net._samples_trained + net._lr_search_samples
    nnz = mean_nnz(data.fit)
    first = net.config.layers[0]
    width = int(first.size) if len(net.config.layers) > 1 else int(net.num_labels)
    rows = min(nnz, net.num_features / max(1, net.config.training.batch_size))
    return float(samples) * (work_per_sample(net, nnz) + SAMPLE_OVERHEAD + ADAM_ROW_COST * rows * width)


def may_merge(net, X) -> bool:
    """Whether ``ensemble: auto`` can merge networks on training matrix ``X`` at all: one pass
    over its rows must stay within AUTO_MAX_WORK (else fit may scale the values in place)."""
    from .lr_search import SAMPLE_OVERHEAD, work_per_sample

    n = max(1, int(X.shape[0]))
    return n * (work_per_sample(net, X.nnz / n) + SAMPLE_OVERHEAD) <= AUTO_MAX_WORK


def auto_networks(net, work: float) -> int:
    """How many networks ``ensemble: auto`` trains, once the first one is done (its run took
    ``work``, :func:`run_work`)."""
    tr = net.config.training
    if net._comm is not None or tr.time_budget:
        return 1
    if work > AUTO_MAX_WORK:
        log.info("ensemble: one network (its run took %.1e multiply-adds; ensemble: auto merges %d up to %.1e)",
                 work, AUTO_NETWORKS, AUTO_MAX_WORK)
        return 1
    return AUTO_NETWORKS


def _summary(net) -> Dict[str, Any]:
    w = float(net._centroid_weight or 0.0)
    return {"seed": int(net.config.training.seed), "best_epoch": net._best_epoch, "refit_epochs": net._refit_epochs,
            f"best_valid_{net.config.training.monitor}": net._best_score, "lr": float(net.config.optimizer.lr),
            "centroid_weight": w, "centroid_kind": net._centroid_kind if w else None,
            "ridge_lambda": net._ridge_lambda if w and net._centroid_kind == "ridge" else None,
            "standardized": net._standard is not None, "train_seconds": float(net._train_seconds)}


def votes_on_standardization(net) -> bool:
    """Whether an ensemble of ``net`` chooses ``data.standardize`` on validation: ``auto`` turned it
    on for this network's dense input (see :func:`train_and_merge`)."""
    return net.config.data.standardize == "auto" and net._standard is not None


def _train_network(net, seed: int, train, valid, progress: bool, label: str, standardize=None,
                   pause: bool = False):
    """One more network of ``net``'s configuration, trained with ``epochs: auto`` from seed ``seed``
    (its own split, search and label term; its rate searched from the configured one). ``pause``:
    it stops when its refit is ready to start (:func:`_finish` trains the refit)."""
    from .network import Network

    cfg = net.config.copy()
    cfg.training.seed = seed
    cfg.training.ensemble = 1
    cfg.optimizer.lr = net._configured_lr
    if standardize is not None:
        cfg.data.standardize = standardize
    member = Network(cfg)
    member._pause_before_refit = pause
    t = time.perf_counter()
    member.fit(train, epochs="auto", valid=valid, progress=progress)
    log.info("ensemble: %s (seed %d): best validation %s %.4f after %s epochs, %.1f s%s", label, seed,
             cfg.training.monitor, member._best_score or float("nan"), member._best_epoch, time.perf_counter() - t,
             " (search; refit when chosen)" if pause and member._phase == "refit" else "")
    return member


def _finish(member, train, valid, progress: bool) -> None:
    """Trains the refit of a network paused by :func:`_train_network`; its history then holds the
    search's records and choices followed by the refit's, as one uninterrupted run's would."""
    member._pause_before_refit = False
    if member._phase != "refit":   # no refit (a validation set given): nothing paused
        return
    searched = member.history
    member.fit(train, epochs="auto", valid=valid, progress=progress)
    refit = member.history
    for key, value in searched.__dict__.items():
        if key == "records":
            refit.records = value + refit.records
        elif not getattr(refit, key):   # lr_search, centroid_search, stopped_early: the search's
            setattr(refit, key, value)


def _adopt(net, other, history) -> None:
    """Makes ``net`` the network ``other`` (its weights, statistics, choices and run), and
    ``history`` (what fit returns) the record of ``other``'s run."""
    state = dict(other.__dict__)
    state.pop("history", None)
    net.__dict__.update(state)
    kept = {k: v for k, v in other.history.__dict__.items() if k != "ensemble"}
    history.__dict__.update(kept)
    net.history = history


def train_and_merge(net, count: int, train, valid, history, progress: bool = False,
                    work: Optional[float] = None) -> None:
    """Trains networks 2..count like ``net`` (which has finished its run) and merges them into
    ``net``; ``history.ensemble`` describes them.

    When ``data.standardize: auto`` standardized ``net``'s dense input
    (:func:`votes_on_standardization`), ``count`` networks more train on the rows without
    standardization (the same seeds, so the same validation splits) and the ``count`` networks of
    the side whose summed best validation P@1 is higher are merged (standardized on a tie);
    ``history.standardize_choice`` keeps both sides' scores. Every network but ``net`` pauses
    when its refit is ready to start, and only the chosen side's refits are trained. The other
    side's networks are dropped, their training counted in the run's steps, samples and seconds.
    ``work`` (``ensemble: auto``: :func:`run_work` of ``net``'s run) above VOTE_MAX_WORK skips
    the vote: standardization is kept."""
    base = net.config
    seed = int(base.training.seed)
    vote = votes_on_standardization(net)
    if vote and work is not None and work > VOTE_MAX_WORK:
        log.info("ensemble: data.standardize auto: kept without a vote (the first run took %.1e "
                 "multiply-adds; ensemble: auto votes up to %.1e)", work, VOTE_MAX_WORK)
        vote = False
    log.info("ensemble: network 1 of %d done (seed %d); training %d more", count, seed, count - 1)
    members = [_train_network(net, seed + SEED_STEP * i, train, valid, progress, f"network {i + 1} of {count}",
                              pause=vote)
               for i in range(1, count)]
    spent = None
    if vote:
        raw = [_train_network(net, seed + SEED_STEP * i, train, valid, progress,
                              f"network {i + 1} of {count} without standardization", standardize=False,
                              pause=True)
               for i in range(count)]
        scores = {"standardized": [float(m._best_score or 0.0) for m in [net] + members],
                  "raw": [float(m._best_score or 0.0) for m in raw]}
        chosen = "raw" if sum(scores["raw"]) > sum(scores["standardized"]) else "standardized"
        log.info("ensemble: data.standardize auto: summed best validation %s %.4f standardized, %.4f "
                 "without: %s", net.config.training.monitor, sum(scores["standardized"]), sum(scores["raw"]),
                 "merging the networks without standardization" if chosen == "raw" else "keeping it")
        # the other side's networks are freed before the merge (their refits never trained); what
        # their training cost stays
        if chosen == "raw":
            spent = _training([net] + members)   # net's before it becomes raw[0]
            members, raw = raw, None   # the standardized members are freed before the refits train
        else:
            spent = _training(raw)
            raw = None
        for m in members:
            _finish(m, train, valid, progress)
        if chosen == "raw":
            _adopt(net, members[0], history)
            members = members[1:]
        history.standardize_choice = dict(scores, chosen=chosen)
    info = [_summary(m) for m in [net] + members]
    merge(net, members)
    if spent is not None:
        _count_training(net, spent)
    history.ensemble = info
    history.centroid_kind = net._centroid_kind if net._centroid_weight else None
    log.info("ensemble: %d networks merged into one of hidden sizes %s", count,
             [int(layer.size) for layer in net.config.layers[:-1]])


def _training(nets) -> Dict[str, float]:
    """What networks' runs cost, summed: batches, samples (and those of rate searches), seconds."""
    return {"steps": sum(m.total_steps for m in nets), "samples": sum(m._samples_trained for m in nets),
            "lr_search_samples": sum(m._lr_search_samples for m in nets),
            "seconds": sum(m._train_seconds for m in nets)}


def _count_training(net, spent: Dict[str, float]) -> None:
    """Adds ``spent`` (:func:`_training`) to ``net``'s run: every network's batches count in it (a
    step past the first network's also tells slide train's checkpoints that this is a new state)."""
    net._core.step = net.step + int(spent["steps"])
    net._samples_trained += int(spent["samples"])
    net._lr_search_samples += int(spent["lr_search_samples"])
    net._train_seconds += float(spent["seconds"])


def _float_parameters(net) -> Dict[str, np.ndarray]:
    from . import _bf16

    out = {}
    for name, v in net._core.parameters().items():
        if ".adam_" in name:
            continue
        v = np.asarray(v)
        out[name] = _bf16.to_float32(v) if v.dtype == np.uint16 else np.array(v, dtype=np.float32)
    return out


def merged_parameters(params: List[Dict[str, np.ndarray]], num_layers: int) -> Dict[str, np.ndarray]:
    """The weights of the merged network from the networks' (float32, by engine name)."""
    from scipy.linalg import block_diag

    n = len(params)
    out: Dict[str, np.ndarray] = {}
    last = num_layers - 1
    for i in range(num_layers):
        W = [p[f"layers.{i}.weight"] for p in params]
        b = [p[f"layers.{i}.bias"] for p in params]
        if i == last:
            # layer 0 is stored inputs x outputs, later layers outputs x inputs
            out[f"layers.{i}.weight"] = (sum(W) / n if i == 0 else np.concatenate(W, axis=1) / n)
            out[f"layers.{i}.bias"] = sum(b) / n
        else:
            out[f"layers.{i}.weight"] = (np.concatenate(W, axis=1) if i == 0 else block_diag(*W))
            out[f"layers.{i}.bias"] = np.concatenate(b)
        out[f"layers.{i}.weight"] = np.ascontiguousarray(out[f"layers.{i}.weight"], dtype=np.float32)
        out[f"layers.{i}.bias"] = np.ascontiguousarray(out[f"layers.{i}.bias"], dtype=np.float32)
    return out


def merged_label_term(nets) -> tuple:
    """(weight, kind, ridge_lambda, label vectors) of the merged network's label-centroid term:
    ``weight * cos(x, C)`` = the mean over the networks of ``w_i * cos(x, C_i)``."""
    n = len(nets)
    terms = [(float(m._centroid_weight or 0.0), m._centroid_kind, m._ridge_lambda, m._centroids) for m in nets]
    used = [t for t in terms if t[0] > 0 and t[3] is not None]
    if not used:
        return 0.0, None, None, None
    total = sum(t[0] for t in used)
    if len({(t[1], t[2]) for t in used}) == 1:   # the same vectors (of the same rows and penalty)
        _, kind, lam, C = used[0]
        return total / n, kind, lam, C
    mixed = sum(t[0] * (t[3].toarray() if sp.issparse(t[3]) else np.asarray(t[3], dtype=np.float64))
                for t in used) / total
    return total / n, "mixed", None, np.ascontiguousarray(mixed, dtype=np.float32)


def merge(net, members) -> None:
    """Makes ``net`` the merged network of itself and ``members`` (see the module doc)."""
    nets = [net] + list(members)
    n = len(nets)
    params = [_float_parameters(m) for m in nets]
    cfg = net.config.copy()
    for layer in cfg.layers[:-1]:
        layer.size = int(layer.size) * n
    cfg.training.ensemble = 1
    weight, kind, lam, C = merged_label_term(nets)
    step, requested_sampling = net.step, net.requested_sampling
    net._core = net._best_params = None   # the first network's engine is freed before the merged one
    net.config = cfg
    net._build(net.num_features, net.num_labels)
    net.requested_sampling = requested_sampling
    net._set_parameters(merged_parameters(params, len(cfg.layers)))
    net._core.step = step
    _count_training(net, _training(members))
    net._centroid_weight, net._centroid_kind, net._ridge_lambda = weight, kind, lam
    net._centroids = C if weight else None
    net._dense_vectors = net._score_cache = None
