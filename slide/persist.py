"""What a network file holds, and how it is written and read back.

:meth:`slide.Network.save` and :meth:`slide.Network.load` call these. A network file is one
``.npz`` archive written atomically: ``meta`` (JSON: format version, configuration, position in
the run, best-validation bookkeeping, the ``epochs: auto`` schedule, history), ``param/<name>``
(weights and Adam moments), ``best/<name>`` (the best-validation snapshot), ``idf``,
``label_counts``, ``best_hits`` (during an ``epochs: auto`` search: the validation rows its best
evaluation ranked right at P@1), ``tables/<layer>/<name>`` (LSH tables as built at the last rebuild) and, when
the label-centroid term is on (``meta["centroid_weight"]`` above 0), ``centroids/data``,
``centroids/indices`` and ``centroids/indptr`` (its feature-by-label CSR matrix, slide.centroids).
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import Any, Dict, Optional, Union

import numpy as np
import scipy.sparse as sp

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
        "lr_search_samples": net._lr_search_samples,
        "num_train_points": net._num_train_points,
        "best_score": net._best_score,
        "best_step": net._best_step,
        "best_epoch": net._best_epoch,
        "evals_since_best": net._evals_since_best,
        "weights_are_best": net._weights_are_best,
        "schedule": {"phase": net._phase, "lr_scale": net._lr_scale, "lr_trace": net._lr_trace,
                     "refit_epochs": net._refit_epochs, "step_offset": net._step_offset,
                     "evals_since_lr_change": net._evals_since_lr_change},
        "history": net.history.to_dict(),
        "next_rebuild": int(net._core.next_rebuild),
        "centroid_weight": net._centroid_weight,
        "centroid_kind": net._centroid_kind,
        "ridge_lambda": net._ridge_lambda,
        "configured_lr": net._configured_lr,
        # centroid_weight auto during a search: the choice of its best epoch so far
        "centroid_choice": (None if net._best_choice is None else
                            [net._best_choice.weight, [[w, p] for w, p in net._best_choice.p1.items()],
                             net._best_choice.kind, net._best_choice.lam]),
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


def restore_centroids(net, meta: Dict[str, Any], data: Dict[str, np.ndarray]) -> None:
    """The label-centroid term (slide.centroids): its weight and, when above 0, its matrix."""
    weight = meta.get("centroid_weight")
    if weight is not None and (not isinstance(weight, (int, float)) or isinstance(weight, bool)
                               or not 0 <= weight < float("inf")):
        raise ValueError(f"centroid_weight must be a number >= 0 or null, got {weight!r}")
    net._centroid_weight = None if weight is None else float(weight)
    # files from before centroid_kind existed hold label centroids
    kind, lam = meta.get("centroid_kind", "mean" if weight is not None else None), meta.get("ridge_lambda")
    if kind not in (None, "mean", "ridge", "mixed") or (kind == "ridge") != (lam is not None) or (
            lam is not None and (not isinstance(lam, (int, float)) or isinstance(lam, bool) or not lam > 0)):
        raise ValueError(f"centroid_kind must be mean, mixed, or ridge with a ridge_lambda > 0; got {kind!r} "
                         f"with ridge_lambda {lam!r}")
    net._centroid_kind, net._ridge_lambda = kind, None if lam is None else float(lam)
    choice = meta.get("centroid_choice")
    if choice is not None:
        from .centroids import Choice

        try:
            w, table, ckind, clam = choice if len(choice) == 4 else (*choice, "mean", None)
            if ckind not in ("mean", "ridge") or (ckind == "ridge") != (clam is not None):
                raise ValueError
            net._best_choice = Choice(float(w), {float(k): float(p) for k, p in table}, ckind,
                                      None if clam is None else float(clam))
        except (TypeError, ValueError):
            raise ValueError(f"centroid_choice must be [weight, [[weight, P@1], ...], kind, ridge_lambda], "
                             f"got {choice!r}") from None
    if not weight:
        return
    try:
        values, indices, indptr = (data[f"centroids/{k}"] for k in ("data", "indices", "indptr"))
    except KeyError:
        raise ValueError(f"centroid_weight is {weight} but the centroids are missing") from None
    from .data import _check_structure

    nf, nl = int(net.num_features), int(net.num_labels)
    try:
        centroids = sp.csr_matrix((values.astype(np.float32), indices, indptr), shape=(nf, nl))
    except (ValueError, TypeError) as e:
        raise ValueError(f"centroids: not a {nf} x {nl} sparse matrix ({e})") from None
    _check_structure(centroids, "centroids", check_values=True)
    # ridge label vectors (and an ensemble's mixed ones) are dense in memory (stored sparse, like the centroids)
    net._centroids = centroids.toarray() if kind in ("ridge", "mixed") else centroids


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


def _network_arrays(net, extra_meta: Optional[Dict[str, Any]] = None) -> Dict[str, np.ndarray]:
    meta = state_meta(net)
    if extra_meta:
        meta.update(extra_meta)
    arrays: Dict[str, np.ndarray] = {
        "meta": np.frombuffer(json.dumps(jsonable(meta, nonfinite_as_none=False)).encode("utf-8"), dtype=np.uint8),
    }
    for name, v in net._core.parameters().items():
        arrays[f"param/{name}"] = np.asarray(v)
    if net._best_params is not None:
        for name, v in net._best_params.items():
            arrays[f"best/{name}"] = v
    if net._idf is not None:
        arrays["idf"] = net._idf
    if net._standard is not None:
        arrays["feature_mean"], arrays["feature_scale"] = net._standard
    if net._label_counts is not None:
        arrays["label_counts"] = net._label_counts
    if net._best_hits is not None and net._phase == "search":
        # rows right at P@1 (0/1), or at training.monitor P@k each row's true labels in its top k
        arrays["best_hits"] = np.asarray(net._best_hits, dtype=np.uint8 if net._best_hits.dtype == bool
                                         else np.uint32)
    if net._centroids is not None and net._centroid_weight:
        C = net._centroids if sp.issparse(net._centroids) else sp.csr_matrix(net._centroids)
        for name in ("data", "indices", "indptr"):
            arrays[f"centroids/{name}"] = getattr(C, name)
    arrays.update(table_arrays(net))
    return arrays


def save(net, path: Union[str, os.PathLike]) -> None:
    """Write the network to one ``.npz`` file, atomically.

    The file holds the configuration (YAML), the weights and Adam moments, the step, epoch
    and position inside the epoch, the normalisation statistics, the training label counts
    and the best-validation snapshot, so that :meth:`load` followed by :meth:`fit` continues
    the run exactly: bit-identical with ``threads=1``. LSH layers' hash tables are stored as
    built at the last scheduled rebuild, with the step of the next one. The data is written
    to a temporary file in the same folder, flushed to disk and renamed over ``path``: a
    crash leaves either the old file or the new one, never a partial one.

    A network sharded over R ranks (collective: every rank calls it with the same ``path``):
    each rank writes its shard, ``<path>.shard<r>of<R>-<token>`` (a network file of its own:
    the replicated layers and its rows of the output layer), atomically; once every shard is on
    disk, rank 0 writes ``path`` itself, a manifest naming the shards, atomically, and then
    removes shards of earlier saves to ``path``. A crash at any moment leaves ``path`` naming a
    complete set of shards of one save (the previous one until the new manifest is in place).
    """
    net._require_built("save")
    path = os.fspath(path)
    if net._comm is None:
        arrays = _network_arrays(net)
        atomic_write(path, lambda fh: np.savez(fh, **arrays))
        return
    _save_sharded(net, path)


def _shard_name(path: str, rank: int, ranks: int, token: str) -> str:
    return f"{path}.shard{rank}of{ranks}-{token}"


def _collective_ok(comm, error: Optional[BaseException], what: str) -> None:
    """Raises on every rank when any rank failed (so none waits on a peer that gave up)."""
    errors = comm.allgather(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    bad = [(r, e) for r, e in enumerate(errors) if e is not None]
    if bad:
        r, e = bad[0]
        raise OSError(f"{what}: rank {r} failed: {e}")


def _save_sharded(net, path: str) -> None:
    import secrets

    comm = net._comm
    rank, ranks = comm.Get_rank(), comm.Get_size()
    token = comm.bcast(f"{net.step:010d}{secrets.token_hex(4)}" if rank == 0 else None, root=0)
    core = net._core
    shard_path = _shard_name(path, rank, ranks, token)
    error: Optional[BaseException] = None
    try:
        arrays = _network_arrays(net, {"shard": {"rank": rank, "ranks": ranks, "begin": int(core.begin),
                                                 "end": int(core.end), "token": token}})
        atomic_write(shard_path, lambda fh: np.savez(fh, **arrays))
        size = os.path.getsize(shard_path)
    except OSError as e:
        error, size = e, -1
    _collective_ok(comm, error, f"saving {path}")
    sizes = comm.gather(size, root=0)
    error = None
    if rank == 0:
        try:
            meta = {"magic": _MAGIC, "format_version": FORMAT_VERSION, "num_features": net.num_features,
                    "num_labels": net.num_labels, "step": net.step, "epoch": net.epoch,
                    "sharded": {"ranks": ranks, "token": token, "shards": [
                        {"file": os.path.basename(_shard_name(path, r, ranks, token)),
                         "begin": b, "end": e, "bytes": sizes[r]}
                        for r, (b, e) in enumerate(comm_ranges(net.num_labels, ranks))]}}
            data = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
            atomic_write(path, lambda fh: np.savez(fh, meta=data))
            remove_stale_shards(path, keep_token=token)
        except OSError as e:
            error = e
    failed = comm.bcast(None if error is None else str(error), root=0)
    if error is not None:
        raise error
    if failed is not None:
        raise OSError(f"saving {path}: rank 0 could not write the manifest: {failed}")


def comm_ranges(num_labels: int, ranks: int):
    from .distributed import shard_range

    return [shard_range(num_labels, ranks, r) for r in range(ranks)]


def shard_files(path: str):
    """Shard files written for ``path`` (any save): ``(file, token)`` pairs."""
    import re

    folder, base = os.path.split(os.fspath(path))
    pat = re.compile(re.escape(base) + r"\.shard\d+of\d+-([0-9a-f]+)$")
    out = []
    for name in os.listdir(folder or "."):
        m = pat.match(name)
        if m:
            out.append((os.path.join(folder, name), m.group(1)))
    return out


def remove_stale_shards(path: str, keep_token: Optional[str] = None) -> None:
    """Deletes shard files of ``path`` from saves other than ``keep_token`` (None: all)."""
    for f, token in shard_files(path):
        if token != keep_token:
            try:
                os.unlink(f)
            except OSError:
                pass


def manifest_token(path: str) -> Optional[str]:
    """The token of the shards a sharded network file names (None for a one-process file)."""
    try:
        meta, _ = _read(path)
    except (ValueError, FileNotFoundError):
        return None
    return (meta.get("sharded") or {}).get("token")


def _read(path: str):
    """(meta, arrays) of a network file, with errors that name the file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"network file not found: {path}")
    try:
        # Every member read to its end first: the zip format checks a member's CRC-32 only there,
        # and np.load reads just the bytes an array's header asks for, so a member whose size
        # field and data were both damaged would otherwise load unchecked.
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
        if bad is not None:
            raise ValueError(f"entry {bad!r} fails its CRC-32 check")
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, zipfile.LargeZipFile,
            NotImplementedError, RuntimeError) as e:
        # damaged zip headers surface as any of these (e.g. an unknown compression method)
        raise ValueError(f"{path}: not a readable slide network file (truncated or corrupt): "
                         f"{e or type(e).__name__}") from None
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
    return meta, data


def load(cls, path: Union[str, os.PathLike], threads: Optional[int] = None, comm: Any = None) -> Any:
    """Read a file written by :meth:`save`; ``threads`` overrides ``training.threads``.

    Raises FileNotFoundError when ``path`` does not exist and ValueError naming the file
    when it is truncated, corrupt, not a slide network or of another format version.

    A network saved by R ranks: with ``comm`` of R ranks (collective), each rank reads its
    shard; without ``comm`` (or with one rank) the shards are merged into one network in this
    process (hash tables rebuilt from the merged weights). Another number of ranks is refused.
    """
    path = os.fspath(path)
    meta, data = _read(path)
    sharded = meta.get("sharded")
    ranks = comm.Get_size() if comm is not None else 1
    if sharded is None:
        if ranks > 1:
            raise ValueError(f"{path}: a one-process network; load it without comm (or train a new "
                             f"network on {ranks} ranks)")
        return _restore(cls, path, meta, data, threads, None)
    try:
        saved_ranks = int(sharded["ranks"])
        shards = sharded["shards"]
        token = sharded["token"]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: incomplete sharded network manifest: {e}") from None
    folder = os.path.dirname(path)
    files = [os.path.join(folder, s["file"]) for s in shards]
    if ranks > 1:
        if ranks != saved_ranks:
            raise ValueError(f"{path}: saved by {saved_ranks} MPI ranks, but this job has {ranks}; run it "
                             f"with mpiexec -n {saved_ranks}, or load it without MPI to merge the shards")
        rank = comm.Get_rank()
        error = None
        try:
            smeta, sdata = _read_shard(files[rank], token, rank)
        except (ValueError, FileNotFoundError) as e:
            error = e
        from .distributed import check_agreement

        errors = comm.allgather(None if error is None else str(error))
        if error is not None:
            raise error
        if any(errors):
            raise ValueError(next(e for e in errors if e))
        check_agreement(comm, f"the network file {path}", token)
        return _restore(cls, files[rank], smeta, sdata, threads, comm)
    # merge the shards into one network
    parts = [_read_shard(f, token, r) for r, f in enumerate(files)]
    smeta, first = parts[0]
    merged = {k: v for k, v in first.items() if not k.startswith("tables/")}
    out_layer = len(yaml_layers(smeta)) - 1
    for key in list(merged):
        kind, _, name = key.partition("/")
        if kind not in ("param", "best") or not name.startswith(f"layers.{out_layer}."):
            continue
        axis = 1 if out_layer == 0 and ".weight" in name else 0
        merged[key] = np.concatenate([p[1][key] for p in parts], axis=axis)
    smeta = dict(smeta)
    smeta.pop("shard", None)
    smeta["next_rebuild"] = None
    return _restore(cls, path, smeta, merged, threads, None)


def yaml_layers(meta: Dict[str, Any]):
    import yaml

    return (yaml.safe_load(meta["config_yaml"]) or {}).get("layers") or []


def _read_shard(path: str, token: str, rank: int):
    meta, data = _read(path)
    sh = meta.get("shard") or {}
    if sh.get("token") != token or sh.get("rank") != rank:
        raise ValueError(f"{path}: not shard {rank} of this save (token {sh.get('token')!r}, expected {token!r})")
    return meta, data


def _restore(cls, path: str, meta: Dict[str, Any], data: Dict[str, np.ndarray], threads: Optional[int],
             comm: Any) -> Any:
    try:
        import yaml

        cfg = Config.from_dict(yaml.safe_load(meta["config_yaml"]), source=path)
        if threads is not None:
            cfg.training.threads = _positive_int(threads, "threads", allow_zero=True)
        net = cls(cfg, comm=comm)
        net._build(int(meta["num_features"]), int(meta["num_labels"]), int(meta.get("num_train_points", 0)) or None)
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
        net._lr_search_samples = int(meta.get("lr_search_samples", 0))
        net._num_train_points = int(meta["num_train_points"])
        net._best_score = meta["best_score"]
        net._best_step = meta["best_step"]
        net._best_epoch = meta["best_epoch"]
        net._evals_since_best = int(meta["evals_since_best"])
        restore_schedule(net, meta.get("schedule"))
        best = {k[len("best/"):]: v for k, v in data.items() if k.startswith("best/")}
        net._best_params = best or None
        net._weights_are_best = bool(meta.get("weights_are_best", False))
        net._idf = data.get("idf")
        if ("feature_mean" in data) != ("feature_scale" in data):
            raise ValueError("feature standardization: one of feature_mean and feature_scale is missing")
        if "feature_mean" in data:
            mean, scale = (np.asarray(data[k], dtype=np.float32) for k in ("feature_mean", "feature_scale"))
            if mean.shape != (net.num_features,) or scale.shape != mean.shape or not (
                    np.isfinite(mean).all() and np.isfinite(scale).all() and (scale > 0).all()):
                raise ValueError(f"feature standardization: expected {net.num_features} finite means and "
                                 f"positive scales")
            net._standard = (mean, scale)
        net._label_counts = data.get("label_counts")
        if "best_hits" in data:
            hits = np.asarray(data["best_hits"])
            if hits.ndim != 1 or hits.dtype not in (np.uint8, np.uint32) or (hits.dtype == np.uint8
                                                                            and (hits > 1).any()):
                raise ValueError("best_hits must be a 1-D array of 0/1 (uint8) or of counts (uint32)")
            net._best_hits = hits.astype(bool) if hits.dtype == np.uint8 else hits.astype(np.int64)
        # a trained network keeps what its first training data decided (files from before
        # data.standardize existed were trained on unstandardized rows)
        net._standard_fixed = net._standard is not None or net._label_counts is not None
        restore_centroids(net, meta, data)
        net._configured_lr = float(meta.get("configured_lr", cfg.optimizer.lr))
        h = meta.get("history") or {}
        net.history = History(h.get("records"))
        for key in ("best_epoch", "best_step", "best_score", "restored_best", "stopped_early",
                    "stopped_by_budget", "interrupted", "refit_epochs", "ensemble", "standardize_choice"):
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
