"""What a network file holds, and how it is written and read back.

:meth:`slide.Network.save` and :meth:`slide.Network.load` call these. A network file is one
``.npz`` archive written atomically: ``meta`` (JSON: format version, configuration, position in
the run, best-validation bookkeeping, the ``epochs: auto`` schedule, history), ``param/<name>``
(weights and Adam moments), ``best/<name>`` (the best-validation snapshot), ``idf``,
``label_counts`` and ``tables/<layer>/<name>`` (LSH tables as built at the last rebuild).
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import Any, Dict, Optional, Union

import numpy as np

from ._io import atomic_write
from ._util import jsonable, positive_int as _positive_int
from .config import Config
from .history import History

FORMAT_VERSION = 1
_MAGIC = "slide-network"


def state_meta(net) -> Dict[str, Any]:
    return {
        "magic": _MAGIC,
        "format_version": FORMAT_VERSION,
        "config_yaml": net.config.to_yaml(),
        "num_features": net.num_features,
        "num_labels": net.num_labels,
        "resolved_sampling": net.resolved_sampling,
        "epoch": net.epoch,
        "batch_in_epoch": net._batch_in_epoch,
        "step": net.step,
        "train_seconds": net._train_seconds,
        "samples_trained": net._samples_trained,
        "num_train_points": net._num_train_points,
        "best_score": net._best_score,
        "best_step": net._best_step,
        "best_epoch": net._best_epoch,
        "evals_since_best": net._evals_since_best,
        "schedule": {"phase": net._phase, "lr_scale": net._lr_scale, "lr_trace": net._lr_trace,
                     "refit_epochs": net._refit_epochs, "step_offset": net._step_offset,
                     "evals_since_lr_change": net._evals_since_lr_change},
        "history": net.history.to_dict(),
        "next_rebuild": int(net._core.next_rebuild),
    }

def restore_schedule(net, sched: Optional[Dict[str, Any]]) -> None:
    """Puts back where an ``epochs="auto"`` run stood (files without it trained fixed epochs)."""
    if sched is None:
        return
    phase = sched["phase"]
    if phase not in ("train", "search", "refit", "done"):
        raise ValueError(f"schedule.phase must be train, search, refit or done, got {phase!r}")
    trace = sched["lr_trace"]
    if not isinstance(trace, list) or not all(isinstance(v, (int, float)) and v >= 0 for v in trace):
        raise ValueError("schedule.lr_trace must be a list of learning rates")
    refit_epochs = sched["refit_epochs"]
    if phase == "refit" and (not isinstance(refit_epochs, int) or refit_epochs < 1 or not trace):
        raise ValueError("schedule: a refit needs refit_epochs >= 1 and the search's learning rates")
    net._phase = phase
    net._lr_scale = float(sched["lr_scale"])
    net._lr_trace = [float(v) for v in trace]
    net._refit_epochs = refit_epochs
    net._step_offset = int(sched["step_offset"])
    net._evals_since_lr_change = int(sched["evals_since_lr_change"])


def table_arrays(net) -> Dict[str, np.ndarray]:
    """The LSH layers' hash tables as ``tables/<layer>/<name>`` arrays."""
    out: Dict[str, np.ndarray] = {}
    for i in net._lsh_layers():
        for name, v in net._core.table_state(i).items():
            out[f"tables/{i}/{name}"] = np.asarray(v, dtype=np.int64) if name == "num_rows" else v
    return out

def restore_tables(net, data: Dict[str, np.ndarray], meta: Dict[str, Any]) -> None:
    """Puts back the hash tables and rebuild schedule saved by :meth:`save`.

    Files written before tables were stored have none: the tables rebuilt from the loaded
    weights stay, and the schedule follows from the step.
    """
    stored: Dict[int, Dict[str, Any]] = {}
    for key, v in data.items():
        if not key.startswith("tables/"):
            continue
        parts = key.split("/")
        if len(parts) != 3 or not parts[1].isdigit():
            raise ValueError(f"unexpected entry {key!r}")
        stored.setdefault(int(parts[1]), {})[parts[2]] = v
    lsh = net._lsh_layers()
    for i in sorted(stored):
        if i not in lsh:
            raise ValueError(f"hash tables stored for layer {i}, which does not sample by LSH")
    if stored:
        for i in lsh:
            if i not in stored:
                raise ValueError(f"hash tables of layer {i} are missing")
            state = dict(stored[i])
            rows = state.get("num_rows")
            if rows is None:
                raise ValueError(f"hash tables of layer {i}: num_rows is missing")
            if rows.shape != () or rows.dtype.kind not in "iu" or not -1 <= int(rows) < 2**31:
                raise ValueError(f"hash tables of layer {i}: num_rows must be one integer in "
                                 f"-1..2^31-1, got {rows!r}")
            state["num_rows"] = int(rows)
            try:
                net._core.set_table_state(i, state)
            except ValueError as e:
                raise ValueError(f"layer {i}: {e}") from None
    if meta.get("next_rebuild") is not None:
        nxt = meta["next_rebuild"]
        if isinstance(nxt, bool) or not isinstance(nxt, int) or not -1 <= nxt < 2**63:
            raise ValueError(f"next_rebuild must be an integer in -1..2^63-1, got {nxt!r}")
        net._core.next_rebuild = nxt


def save(net, path: Union[str, os.PathLike]) -> None:
    """Write the network to one ``.npz`` file, atomically.

    The file holds the configuration (YAML), the weights and Adam moments, the step, epoch
    and position inside the epoch, the normalisation statistics, the training label counts
    and the best-validation snapshot, so that :meth:`load` followed by :meth:`fit` continues
    the run exactly: bit-identical with ``threads=1``. LSH layers' hash tables are stored as
    built at the last scheduled rebuild, with the step of the next one. The data is written
    to a temporary file in the same folder, flushed to disk and renamed over ``path``: a
    crash leaves either the old file or the new one, never a partial one.
    """
    net._require_built("save")
    path = os.fspath(path)
    arrays: Dict[str, np.ndarray] = {
        "meta": np.frombuffer(json.dumps(jsonable(state_meta(net), nonfinite_as_none=False)).encode("utf-8"), dtype=np.uint8),
    }
    for name, v in net._core.parameters().items():
        arrays[f"param/{name}"] = np.asarray(v)
    if net._best_params is not None:
        for name, v in net._best_params.items():
            arrays[f"best/{name}"] = v
    if net._idf is not None:
        arrays["idf"] = net._idf
    if net._label_counts is not None:
        arrays["label_counts"] = net._label_counts
    arrays.update(table_arrays(net))
    atomic_write(path, lambda fh: np.savez(fh, **arrays))


def load(cls, path: Union[str, os.PathLike], threads: Optional[int] = None) -> Any:
    """Read a file written by :meth:`save`; ``threads`` overrides ``training.threads``.

    Raises FileNotFoundError when ``path`` does not exist and ValueError naming the file
    when it is truncated, corrupt, not a slide network or of another format version.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"network file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, zipfile.LargeZipFile,
            NotImplementedError, RuntimeError) as e:
        # damaged zip headers surface as any of these (e.g. an unknown compression method)
        raise ValueError(f"{path}: not a readable slide network file (truncated or corrupt): "
                         f"{e}") from None
    if "meta" not in data:
        raise ValueError(f"{path}: not a slide network file (no 'meta' entry)")
    try:
        meta = json.loads(bytes(data["meta"]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: corrupt metadata: {e}") from None
    if not isinstance(meta, dict) or meta.get("magic") != _MAGIC:
        raise ValueError(f"{path}: not a slide network file")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format version {meta.get('format_version')} is not supported "
                         f"by this slide (reads version {FORMAT_VERSION})")
    try:
        import yaml

        cfg = Config.from_dict(yaml.safe_load(meta["config_yaml"]), source=path)
        if threads is not None:
            cfg.training.threads = _positive_int(threads, "threads", allow_zero=True)
        net = cls(cfg)
        net._build(int(meta["num_features"]), int(meta["num_labels"]))
        params = {k[len("param/"):]: v for k, v in data.items() if k.startswith("param/")}
        missing = set(net._core.parameters()) - set(params)
        if missing:
            raise ValueError(f"missing parameters {sorted(missing)}")
        # stored tables replace rebuilt ones below: rebuild only for files without them
        net._set_parameters(params, rebuild_tables=not any(k.startswith("tables/") for k in data))
        net._core.step = int(meta["step"])
        restore_tables(net, data, meta)
        net.epoch = int(meta["epoch"])
        net._batch_in_epoch = int(meta["batch_in_epoch"])
        net._train_seconds = float(meta["train_seconds"])
        net._samples_trained = int(meta.get("samples_trained", 0))
        net._num_train_points = int(meta["num_train_points"])
        net._best_score = meta["best_score"]
        net._best_step = meta["best_step"]
        net._best_epoch = meta["best_epoch"]
        net._evals_since_best = int(meta["evals_since_best"])
        restore_schedule(net, meta.get("schedule"))
        best = {k[len("best/"):]: v for k, v in data.items() if k.startswith("best/")}
        net._best_params = best or None
        net._idf = data.get("idf")
        net._label_counts = data.get("label_counts")
        h = meta.get("history") or {}
        net.history = History(h.get("records"))
        for key in ("best_epoch", "best_step", "best_score", "restored_best", "stopped_early",
                    "stopped_by_budget", "interrupted", "refit_epochs"):
            if key in h:
                setattr(net.history, key, h[key])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: incomplete slide network file: missing {e}") from None
    except ValueError as e:
        if str(e).startswith(path):
            raise
        raise ValueError(f"{path}: {e}") from None
    if net._idf is None and net.config.data.normalize == "tfidf_l2":
        raise ValueError(f"{path}: normalize is tfidf_l2 but the idf statistics are missing")
    return net
