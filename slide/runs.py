"""Run folders, crash-safe checkpoints and resumable training for ``slide train``.

A run folder holds everything one training run produces::

    runs/<config-name>-<timestamp>/
        run.json         the folder's layout version (RUN_FORMAT_VERSION) and the slide that made it
        .lock            pid of the process training in it (held with flock while it trains)
        config.yaml      the resolved configuration (absolute data paths)
        metrics.jsonl    one JSON object per evaluation
        summary.json     final metrics, timing and memory, written at the end
        model.slide      the final model (after restore_best), written at the end
        checkpoints/     the last ``keep`` checkpoints, each written atomically

Checkpoints are written to a temporary name, flushed to disk and renamed, so a
process killed at any instant leaves every complete checkpoint loadable; partial
files keep a ``.tmp`` suffix and are never mistaken for a checkpoint. A write that
fails (disk full, file size limit) removes what it wrote and raises
:class:`RunWriteError` naming the path and the cause; earlier checkpoints stay.
:func:`train_run` is what the CLI calls; a notebook gets the same model from
``Network(config).fit(...)`` because both run the same code with the same seed.
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from .callbacks import Callback, epoch_checkpoint_due
from .config import Config
from ._util import jsonable as _jsonable, peak_rss_bytes
from ._io import atomic_path, atomic_write_text

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "RUN_FORMAT_VERSION",
    "RunFolderBusy",
    "RunFormatError",
    "RunWriteError",
    "absolute_data_paths",
    "RunDir",
    "RunRecorder",
    "atomic_write_text",
    "default_run_dir",
    "load_run_data",
    "parse_duration",
    "peak_rss_bytes",
    "read_data_header",
    "resolve_model",
    "train_run",
    "validate_config",
]

PathLike = Union[str, os.PathLike]

log = logging.getLogger("slide.runs")

# Layout of a run folder. 0: folders of slide <= 0.1.0 without run.json (checkpoint
# manifest written before the model); 1: run.json, manifest written after the model.
RUN_FORMAT_VERSION = 1
_RUN_MAGIC = "slide-run"


class RunFolderBusy(Exception):
    """Another live process is training in this run folder."""


class RunFormatError(ValueError):
    """The run folder was written in a layout this slide does not read."""


class RunWriteError(OSError):
    """A file of the run could not be written (disk full, file size limit, permissions).

    The message names the file and the cause; what was written before is intact.
    """

    def __init__(self, path: str, cause: OSError, note: str = ""):
        reason = cause.strerror or str(cause)
        super().__init__(cause.errno, f"cannot write {path}: {reason}{note}")
        self.path = path
        self.cause = cause

    def __str__(self) -> str:
        return self.strerror


# ---------------------------------------------------------------------- small helpers

def parse_duration(text: Union[str, int, float]) -> float:
    """Seconds from ``"90s"``, ``"10m"``, ``"1.5h"``, ``"1h30m"`` or a plain number of seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip().lower()
        if re.fullmatch(r"\d+(\.\d+)?", s):
            value = float(s)
        else:
            parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smh])", s)
            if not parts or re.sub(r"\s", "", "".join(n + u for n, u in parts)) != re.sub(r"\s", "", s):
                raise ValueError(f"cannot read duration {text!r}: use e.g. 90s, 10m, 1h or 1h30m")
            scale = {"s": 1.0, "m": 60.0, "h": 3600.0}
            value = sum(float(n) * scale[u] for n, u in parts)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return value


def default_run_dir(config_path: Optional[PathLike], root: PathLike = "runs") -> str:
    """``runs/<config-name>-<YYYYmmdd-HHMMSS>``, with a numeric suffix if that exists already."""
    name = os.path.splitext(os.path.basename(os.fspath(config_path)))[0] if config_path else "default"
    base = os.path.join(os.fspath(root), f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    path, i = base, 1
    while os.path.exists(path):
        i += 1
        path = f"{base}-{i}"
    return path


# ---------------------------------------------------------------------- validation

def read_data_header(path: PathLike) -> Optional[Tuple[int, int, int]]:
    """``(points, features, labels)`` from an XC header line, or None for headerless (libsvm) files."""
    with open(os.fspath(path), "rb") as fh:
        first = fh.readline(4096).split()
    if len(first) == 3 and all(t.isdigit() for t in first):
        n, d, l = (int(t) for t in first)
        return n, d, l
    return None


def absolute_data_paths(config: Config) -> Config:
    """Make relative data paths (from ``--set``) absolute, so a run folder resumes from anywhere."""
    for key in ("train", "test", "valid"):
        p = getattr(config.data, key)
        if p:
            setattr(config.data, key, os.path.abspath(os.path.expanduser(p)))
    return config


def validate_config(config: Config, source: str = "config", *, need_train: bool = True,
                    check_memory: bool = True) -> Optional[Dict[str, int]]:
    """Check everything that can be checked without training.

    Raises :class:`ConfigError` (bad values), ``FileNotFoundError`` (missing data
    file, naming the key) or ``MemoryError`` (the model would not fit). Returns the
    memory estimate in bytes when the data shape can be read from the file header.
    """
    config.validate(source=source)
    config.check_files(source=source, need_train=need_train)
    if not check_memory or not config.data.train:
        return None
    header = read_data_header(config.data.train)
    if header is None:
        return None
    num_points, num_features, num_labels = header
    from . import memory

    memory.check_fits(config, num_features, num_labels, num_points=num_points)
    return memory.estimate(config, num_features, num_labels, num_points=num_points)


def load_run_data(config: Config):
    """Load the train / valid / test sets a configuration names (None where not given)."""
    from .data import load_dataset

    def load(key, like=None):
        path = getattr(config.data, key)
        if not path:
            return None
        # valid/test must fit the training set's dimensions: the reader then names the
        # first offending line of the file instead of a later shape error
        dims = {} if like is None else {"num_features": like.num_features, "num_labels": like.num_labels}
        ds = load_dataset(path, format=config.data.format, cache=config.data.cache, **dims)
        if len(ds) == 0:   # nothing to train on, and P@k of no points would print as 0
            raise ValueError(f"data.{key}: {path} holds no data points")
        if key == "train" and ds.labels.nnz == 0:
            raise ValueError(f"data.train: none of the {len(ds)} points of {path} has a label; there is "
                             f"nothing to learn")
        return ds

    train = load("train")
    return train, load("valid", train), load("test", train)


# ---------------------------------------------------------------------- checkpoints

_CKPT_RE = re.compile(r"^step-(\d{10})\.ckpt$")


@dataclass
class Checkpoint:
    step: int
    path: str
    state: Dict[str, Any]  # run bookkeeping kept beside the model (wall time so far)


class CheckpointStore:
    """The last ``keep`` checkpoints of a run, each complete on disk or absent.

    A checkpoint is ``step-<step>.ckpt`` (the model) plus ``step-<step>.json``, its
    manifest (the run's bookkeeping and the model file's size). The model is renamed
    into place first and the manifest last: a checkpoint counts only when both exist,
    so one whose manifest could not be written is never used. (Run folders of format
    0 wrote the manifest first; there, too, a complete checkpoint has both files.)
    """

    def __init__(self, directory: PathLike, keep: int = 2):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = os.fspath(directory)
        self.keep = keep

    def _model_path(self, step: int) -> str:
        return os.path.join(self.directory, f"step-{step:010d}.ckpt")

    def _manifest_path(self, step: int) -> str:
        return os.path.join(self.directory, f"step-{step:010d}.json")

    def list(self) -> List[Checkpoint]:
        """Complete checkpoints (model and manifest, sizes agreeing), oldest first."""
        if not os.path.isdir(self.directory):
            return []
        out = []
        for name in os.listdir(self.directory):
            m = _CKPT_RE.match(name)
            if not m:
                continue
            step = int(m.group(1))
            path = os.path.join(self.directory, name)
            try:
                with open(self._manifest_path(step), "r", encoding="utf-8") as fh:
                    state = json.load(fh)
                size = os.path.getsize(path)
            except (OSError, ValueError):
                continue
            if not isinstance(state, dict):
                continue
            if "model_bytes" in state and state["model_bytes"] != size:
                continue
            out.append(Checkpoint(step, path, state))
        out.sort(key=lambda c: c.step)
        return out

    def latest(self) -> Optional[Checkpoint]:
        items = self.list()
        return items[-1] if items else None

    def remove_partial(self) -> None:
        """Delete leftovers of writes that a crash interrupted (with a sharded network: shards
        that no complete checkpoint names)."""
        if not os.path.isdir(self.directory):
            return
        from .persist import manifest_token

        complete = {c.step: c for c in self.list()}
        tokens = {step: manifest_token(c.path) for step, c in complete.items()}
        for name in os.listdir(self.directory):
            p = os.path.join(self.directory, name)
            m = re.match(r"^step-(\d{10})\.(json|ckpt)$", name)
            shard = re.match(r"^step-(\d{10})\.ckpt\.shard\d+of\d+-([0-9a-f]+)$", name)
            if shard:
                if tokens.get(int(shard.group(1))) != shard.group(2):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
                continue
            if ".tmp" in name or (m and int(m.group(1)) not in complete):
                try:
                    os.unlink(p)
                except OSError:
                    pass

    def save(self, net, state: Optional[Dict[str, Any]] = None) -> Checkpoint:
        """Write ``net`` as the newest checkpoint, then drop all but the last ``keep``."""
        step = int(net.step)
        final = self._model_path(step)
        manifest = self._manifest_path(step)
        state = dict(state or {}, step=step, epoch=int(net.epoch))
        comm = getattr(net, "_comm", None)
        if comm is not None:
            return self._save_sharded(net, comm, final, manifest, state)
        previous = self.latest()
        target = final
        try:
            os.makedirs(self.directory, exist_ok=True)
            # the store does not rely on net.save being atomic itself: a failed write must
            # never leave a partial file under a checkpoint's name
            with atomic_path(final) as tmp:
                net.save(tmp)
            state["model_bytes"] = os.path.getsize(final)
            target = manifest
            atomic_write_text(manifest, json.dumps(state))
        except OSError as e:
            if target == manifest:  # the model is in place but without its manifest: remove it
                for p in (manifest, final):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
            kept = f"; the previous checkpoint {previous.path} is intact" if previous else ""
            raise RunWriteError(target, e, kept) from e
        self._drop_old()
        return Checkpoint(step, final, state)

    def _drop_old(self) -> None:
        from .persist import remove_stale_shards

        for old in self.list()[:-self.keep]:
            # manifest first: a model left behind by a crash here is swept as partial
            for p in (self._manifest_path(old.step), old.path):
                try:
                    os.unlink(p)
                except OSError:
                    pass
            remove_stale_shards(old.path)

    def _save_sharded(self, net, comm, final: str, manifest: str, state: Dict[str, Any]) -> Checkpoint:
        """A sharded network (collective): every rank writes its shard, then rank 0 the model
        manifest (slide.persist), then rank 0 the checkpoint manifest: a checkpoint counts only
        once all of them are on disk."""
        rank = comm.Get_rank()
        previous = self.latest() if rank == 0 else None
        if rank == 0:
            os.makedirs(self.directory, exist_ok=True)
        comm.Barrier()
        try:
            net.save(final)
        except OSError as e:
            kept = f"; the previous checkpoint {previous.path} is intact" if previous else ""
            raise RunWriteError(final, e, kept) from e
        if rank == 0:
            try:
                state["model_bytes"] = os.path.getsize(final)
                atomic_write_text(manifest, json.dumps(state))
            except OSError as e:
                kept = f"; the previous checkpoint {previous.path} is intact" if previous else ""
                raise RunWriteError(manifest, e, kept) from e
            self._drop_old()
        return Checkpoint(int(net.step), final, state)


# ---------------------------------------------------------------------- run folder

def _writing(path: str, write: Callable[[], Any]) -> Any:
    """Run ``write``; an OSError becomes a RunWriteError naming ``path``."""
    try:
        return write()
    except RunWriteError:
        raise
    except OSError as e:
        if isinstance(e, (FileNotFoundError, FileExistsError)) and e.errno not in (errno.ENOSPC, errno.EFBIG):
            raise
        raise RunWriteError(path, e) from e


class RunDir:
    """Files of one run folder (see the module docstring)."""

    def __init__(self, path: PathLike):
        self.path = os.fspath(path)
        self.manifest_path = os.path.join(self.path, "run.json")
        self.lock_path = os.path.join(self.path, ".lock")
        self._lock_fd: Optional[int] = None
        self.config_path = os.path.join(self.path, "config.yaml")
        self.metrics_path = os.path.join(self.path, "metrics.jsonl")
        self.summary_path = os.path.join(self.path, "summary.json")
        self.model_path = os.path.join(self.path, "model.slide")
        self.checkpoints = CheckpointStore(os.path.join(self.path, "checkpoints"))

    @classmethod
    def create(cls, path: PathLike, config: Config, *, lock: bool = True) -> "RunDir":
        """Make a new run folder holding the resolved configuration.

        With ``lock`` the folder is locked for this process first (see :meth:`lock`),
        so two processes told the same ``--out`` cannot both start a run in it.
        """
        run = cls(path)
        _writing(run.path, lambda: os.makedirs(run.path, exist_ok=True))
        if lock:
            run.lock()
        try:
            if os.path.exists(run.config_path):
                raise FileExistsError(f"{run.path} already holds a run; choose another --out or --resume it")
            _writing(run.checkpoints.directory, lambda: os.makedirs(run.checkpoints.directory, exist_ok=True))
            run._write_manifest()
            _writing(run.config_path, lambda: atomic_write_text(run.config_path, config.to_yaml()))
        except BaseException:
            run.unlock()
            raise
        return run

    @classmethod
    def open(cls, path: PathLike, *, for_writing: bool = False) -> "RunDir":
        """An existing run folder (for ``--resume``, ``slide plot``).

        Raises :class:`RunFormatError` for a folder of a layout this slide does not
        read. ``for_writing`` (``--resume``) locks the folder and records the current
        layout in a folder of format 0, whose files this version reads unchanged.
        """
        run = cls(path)
        if not os.path.isdir(run.path):
            raise FileNotFoundError(f"run folder not found: {run.path}")
        if not os.path.exists(run.config_path):
            raise FileNotFoundError(f"{run.path}: not a run folder (no config.yaml)")
        version = run.format_version()  # before anything is written: a refused folder stays as it is
        if for_writing:
            run.lock()
            try:
                if version == 0:
                    run._write_manifest(migrated_from=0)
            except BaseException:
                run.unlock()
                raise
        return run

    # -- layout version -------------------------------------------------------------
    def _write_manifest(self, **extra) -> None:
        from . import __version__

        doc = {"format": _RUN_MAGIC, "version": RUN_FORMAT_VERSION, "slide_version": __version__, **extra}
        _writing(self.manifest_path, lambda: atomic_write_text(self.manifest_path, json.dumps(doc, indent=1) + "\n"))

    def format_version(self) -> int:
        """The folder's layout version: 0 without run.json, else what run.json says.

        Raises RunFormatError naming run.json when it is damaged, foreign, or of a
        version this slide cannot read (written by a newer slide).
        """
        if not os.path.exists(self.manifest_path):
            self._check_legacy_layout()
            return 0
        try:
            with open(self.manifest_path, "r", encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as e:
            raise RunFormatError(f"{self.manifest_path}: unreadable run manifest ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != _RUN_MAGIC:
            raise RunFormatError(f"{self.manifest_path}: not a slide run manifest "
                                 f"(expected \"format\": \"{_RUN_MAGIC}\")")
        version = doc.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise RunFormatError(f"{self.manifest_path}: field \"version\" must be an integer, got {version!r}")
        if version != RUN_FORMAT_VERSION:
            made_by = doc.get("slide_version")
            by = f" by slide {made_by}" if made_by else ""
            raise RunFormatError(
                f"{self.path}: run folder format {version} (written{by}) is not readable by this slide "
                f"(reads formats 0-{RUN_FORMAT_VERSION}); use the slide version that wrote it")
        return version

    def _check_legacy_layout(self) -> None:
        # format 0 had checkpoints/step-<10 digits>.ckpt|.json and .tmp leftovers only
        d = self.checkpoints.directory
        if not os.path.isdir(d):
            return
        for name in os.listdir(d):
            if not (re.match(r"^step-\d{10}\.(ckpt|json)$", name) or ".tmp" in name):
                raise RunFormatError(f"{self.path}: no run.json and an unknown file checkpoints/{name}: "
                                     f"not a run folder layout this slide knows; it is left untouched")

    # -- lock -------------------------------------------------------------------------
    def lock(self) -> None:
        """Hold the folder for this process until :meth:`unlock` or exit.

        An advisory ``flock`` on ``.lock``, which also records the holder's pid. The
        kernel drops the lock when the holder dies, so a lock file left by a killed
        process is simply taken over. Raises :class:`RunFolderBusy` naming the pid.
        """
        if self._lock_fd is not None:
            return
        try:
            import fcntl
        except ImportError:  # no flock on this platform: no protection, as before
            return
        fd = _writing(self.lock_path, lambda: os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise RunWriteError(self.lock_path, e) from e
            holder = _read_pid(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another process"
            raise RunFolderBusy(f"{self.path} is in use by {who} (lock {self.lock_path}); "
                                f"wait for it to finish or stop it") from None
        stale = _read_pid(fd)
        if stale and stale != os.getpid():
            log.info("%s: taking over the lock of process %d, which no longer holds it", self.path, stale)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:
            os.close(fd)
            raise RunWriteError(self.lock_path, e) from e
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock; the file stays (removing it would race)
            self._lock_fd = None

    def config(self) -> Config:
        return Config.from_yaml(self.config_path)

    def append_metrics(self, record: Dict[str, Any]) -> None:
        def append():
            with open(self.metrics_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(_jsonable(record)) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

        _writing(self.metrics_path, append)

    def read_metrics(self) -> List[Dict[str, Any]]:
        """Records of metrics.jsonl; a line cut short by a crash is skipped."""
        if not os.path.exists(self.metrics_path):
            return []
        out = []
        with open(self.metrics_path, "r", encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def truncate_metrics(self, max_step: int) -> None:
        """Keep the records up to ``max_step``: what a resumed run will redo is dropped."""
        kept = [r for r in self.read_metrics() if int(r.get("step", 0)) <= max_step]
        _writing(self.metrics_path,
                 lambda: atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept)))

    def write_summary(self, summary: Dict[str, Any]) -> None:
        _writing(self.summary_path,
                 lambda: atomic_write_text(self.summary_path, json.dumps(_jsonable(summary), indent=2) + "\n"))

    def read_summary(self) -> Optional[Dict[str, Any]]:
        if not os.path.exists(self.summary_path):
            return None
        with open(self.summary_path, "r", encoding="utf-8") as fh:
            return json.load(fh)


def _read_pid(fd: int) -> Optional[int]:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def resolve_model(path: PathLike) -> str:
    """A model file from a path that may also be a run folder (final model, else latest checkpoint)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        run = RunDir(path)
        if os.path.exists(run.config_path):
            run.format_version()  # refuses a layout it would misread
        if os.path.exists(run.model_path):
            return run.model_path
        ck = run.checkpoints.latest()
        if ck is None:
            raise FileNotFoundError(f"{path}: no model.slide and no checkpoint in this folder")
        return ck.path
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    return path


# ---------------------------------------------------------------------- training

class RunRecorder(Callback):
    """Callback that writes metrics.jsonl and checkpoints while a network trains.

    Checkpoints are written every ``training.checkpoint_every`` epochs (``auto``: at the
    end of the first epoch, then at the end of an epoch once 20 times the last
    write's duration has passed since it: ``callbacks.epoch_checkpoint_due``), inside an epoch whenever
    ``training.checkpoint_minutes`` passed since the last one, and when training ends (also
    after Ctrl-C, so the run can be resumed). The network stores its step, epoch and
    position inside the epoch, so any checkpoint resumes exactly.
    """

    def __init__(self, run: RunDir, config: Config, *, seconds_offset: float = 0.0,
                 on_record: Optional[Callable[[Dict[str, Any]], None]] = None):
        self.run = run
        self.every_epochs = config.training.checkpoint_every
        self.every_seconds = config.training.checkpoint_minutes * 60.0
        self.seconds_offset = seconds_offset
        self.on_record = on_record
        self.t0 = time.perf_counter()
        self.last_checkpoint = self.t0
        self.last_checkpoint_step = -1
        self.last_write_seconds: Optional[float] = None   # the last checkpoint's write, this process

    def elapsed(self) -> float:
        return self.seconds_offset + (time.perf_counter() - self.t0)

    def checkpoint(self, net) -> None:
        # collective under MPI: every rank writes its shard (the decision to get here is shared)
        if int(net.step) == self.last_checkpoint_step:
            return
        started = time.perf_counter()
        self.run.checkpoints.save(net, {"wall_seconds": self.elapsed()})
        self.last_checkpoint = time.perf_counter()
        self.last_write_seconds = self.last_checkpoint - started
        self.last_checkpoint_step = int(net.step)

    def on_train_begin(self, net):
        # the clock (elapsed) keeps running from the recorder's creation, just before fit: fit's
        # preparation (feature statistics, label vectors) counts in the network's training
        # seconds, so it counts here too
        self.last_checkpoint = time.perf_counter()

    def on_batch_end(self, net, step, loss):
        if self.every_seconds > 0 and net._agreed(time.perf_counter() - self.last_checkpoint >= self.every_seconds):
            self.checkpoint(net)

    def on_evaluate(self, net, record):
        # ``seconds`` is the network's training time (evaluation excluded), carried
        # through checkpoints, so a resumed run continues the same clock.
        if net.rank != 0:   # the run folder's files are rank 0's
            return
        self.run.append_metrics(record)
        if self.on_record is not None:
            self.on_record(record)

    def on_epoch_end(self, net, epoch):
        # auto decides from wall time: rank 0's decision, for every rank
        if net._agreed(epoch_checkpoint_due(self.every_epochs, int(epoch), time.perf_counter() - self.last_checkpoint,
                                            self.last_write_seconds)):
            self.checkpoint(net)

    def on_train_end(self, net, history):
        self.checkpoint(net)


def train_run(config: Config, run: RunDir, *, resume: bool = False, callbacks: Iterable = (),
              on_record: Optional[Callable[[Dict[str, Any]], None]] = None,
              data: Optional[tuple] = None, comm: Any = None, data_owned: bool = False) -> Dict[str, Any]:
    """Train ``config`` in ``run`` (continuing its latest checkpoint when ``resume``).

    ``data`` is the ``(train, valid, test)`` triple when the caller loaded it
    already (the CLI does, to report data errors before creating the folder); ``data_owned``
    says that nothing else will read it, so that fit may scale the training values in place
    (``Network.fit(copy=False)``; data the run loads itself is its own).
    Writes metrics.jsonl, checkpoints, model.slide and summary.json; returns the summary.
    With ``comm`` (MPI ranks, collective) one network is trained over all ranks; rank 0 writes
    the run folder's files, each rank its shard of every checkpoint and of the model.
    """
    from . import Network

    owned = data is None or data_owned
    train, valid, test = data if data is not None else load_run_data(config)
    seconds_offset = 0.0
    rank = comm.Get_rank() if comm is not None else 0
    if resume:
        ck = None
        if rank == 0:
            run.checkpoints.remove_partial()
            ck = run.checkpoints.latest()
        if comm is not None:   # rank 0's choice, for every rank
            ck = comm.bcast(ck, root=0)
        if ck is None:
            raise FileNotFoundError(f"{run.path}: no checkpoint to resume from")
        net = Network.load(ck.path, comm=comm)
        seconds_offset = float(ck.state.get("wall_seconds", 0.0))
        if rank == 0:
            run.truncate_metrics(int(net.total_steps))
    else:
        net = Network(config, comm=comm)
    start_step = int(net.step)

    recorder = RunRecorder(run, config, seconds_offset=seconds_offset, on_record=on_record)
    if resume:
        recorder.last_checkpoint_step = start_step  # that state is on disk already
    eval_set, eval_name = (test, "test") if test is not None else \
        ((valid, "valid") if valid is not None else (train, "train"))
    # When the run owns its data, fit may scale the training values in place (one copy of them
    # less) unless the final evaluation reads them again.
    with warnings.catch_warnings():
        if resume:   # a finished run is evaluated and saved again (the CLI says so)
            warnings.filterwarnings("ignore", message=r"fit\(epochs='auto'\): this network has finished")
        history = net.fit(train, valid=valid, test=test, callbacks=[recorder, *callbacks],
                          copy=not owned or eval_set is train)
    wall_seconds = recorder.elapsed()
    final = net.evaluate(eval_set, k=tuple(config.eval.k))
    _writing(run.model_path, lambda: net.save(run.model_path))  # atomic: temporary file, fsync, rename
    rss = peak_rss_bytes()
    rss_per_rank = comm.gather(rss, root=0) if comm is not None else [rss]
    if rank != 0:
        return {"rank": rank, "peak_rss_bytes": rss}

    records = run.read_metrics()
    epochs_done = int(net.epoch)
    # The epoch whose weights the model holds: the best validation evaluation when
    # restore_best put it back, else the last one. Test scores never choose it.
    restored = bool(getattr(history, "restored_best", False))
    kept_epoch = history.best_epoch if (restored and history.best_epoch is not None) else epochs_done
    train_seconds = float(records[-1]["seconds"]) if records else wall_seconds
    ensemble = list(getattr(history, "ensemble", None) or [])
    if ensemble:   # the records are the first network's; the others trained after them
        train_seconds = float(net._train_seconds)
    summary: Dict[str, Any] = {k: float(v) for k, v in final.items()}
    summary.update({
        "evaluated_on": eval_name,
        "train_seconds": train_seconds,
        "wall_seconds": wall_seconds,
        "samples_per_second": (net.samples_trained / train_seconds) if train_seconds > 0 else None,
        "peak_rss_bytes": max(rss_per_rank),
        "ranks": len(rss_per_rank),
        "peak_rss_bytes_per_rank": rss_per_rank,
        "best_epoch": history.best_epoch,
        "refit_epochs": getattr(history, "refit_epochs", None),
        "lr": float(net.config.optimizer.lr),
        "lr_search": list(getattr(history, "lr_search", []) or []),
        "centroid_weight": net.centroid_weight,
        "centroid_kind": net.centroid_kind if net.centroid_weight else None,
        "ridge_lambda": net._ridge_lambda if net.centroid_weight and net.centroid_kind == "ridge" else None,
        "standardized": net.standardized,
        "standardize_choice": dict(getattr(history, "standardize_choice", None) or {}),
        "centroid_search": {str(w): p for w, p in (getattr(history, "centroid_search", None) or {}).items()},
        "kept_epoch": kept_epoch,
        "ensemble": ensemble,
        "epochs": epochs_done,
        "steps": int(net.step),
        "resumed_from_step": start_step if resume else None,
        "num_train": len(train),
        "num_features": int(train.num_features),
        "num_labels": int(train.num_labels),
    })
    run.write_summary(summary)
    return summary
