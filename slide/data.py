"""Multi-label sparse datasets: the `Dataset` container and `load_dataset`.

Files are read by the C++ core in parallel (Extreme Classification Repository
"XC" text format, or libsvm multilabel) and the parsed arrays are cached as
uncompressed ``.npy`` files, so the second load of a file is a memory copy.

XC format::

    <num_points> <num_features> <num_labels>
    l1,l2,... f1:v1 f2:v2 ...

0-based ids; a point without labels starts with a space. libsvm multilabel is
the same without the header line and with 1-based feature ids.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Optional, Union

import numpy as np
import scipy.sparse as sp

from . import _core
from ._io import atomic_path, atomic_write

DataError = _core.DataError

__all__ = ["Dataset", "DataError", "load_dataset", "default_cache_dir", "cache_max_bytes", "cache_entries",
           "clear_cache"]

log = logging.getLogger("slide.data")

# Bump when the cache layout or the parser's output changes meaning.
_CACHE_VERSION = 1
_ARRAYS = ("feature_indptr", "feature_indices", "feature_values", "label_indptr", "label_indices")
_DTYPES = {
    "feature_indptr": np.int64,
    "feature_indices": np.int32,
    "feature_values": np.float32,
    "label_indptr": np.int64,
    "label_indices": np.int32,
}

PathLike = Union[str, os.PathLike]


def _csr(data, indices, indptr, shape) -> sp.csr_matrix:
    m = sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)
    m.has_sorted_indices = True
    return m


def _to_csr(x, name: str) -> sp.csr_matrix:
    if sp.issparse(x):
        m = x.tocsr()
    else:
        try:
            arr = np.asarray(x)
        except Exception as e:  # ragged lists and the like
            raise ValueError(f"{name}: cannot convert to a matrix ({e})") from None
        if arr.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D matrix, got an array of shape {arr.shape}")
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{name}: values must be real numbers, got dtype {arr.dtype}")
        m = sp.csr_matrix(arr)
    if m.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix")
    if m.dtype.kind not in "biuf":
        raise ValueError(f"{name}: values must be real numbers, got dtype {m.dtype}")
    return m


def _check_structure(m: sp.csr_matrix, name: str, check_values: bool) -> bool:
    """Validates CSR arrays in C++; returns True when every row is strictly sorted."""
    indptr = np.asarray(m.indptr, dtype=np.int64)
    if m.shape[1] > np.iinfo(np.int32).max:
        raise ValueError(f"{name}: {m.shape[1]} columns exceed the supported maximum 2147483647")
    indices = m.indices
    if indices.dtype != np.int32:
        if indices.size and (indices.min() < 0 or indices.max() >= m.shape[1]):
            bad = indices[(indices < 0) | (indices >= m.shape[1])][0]
            raise ValueError(f"{name}: column index {bad} is outside [0, {m.shape[1]})")
        indices = indices.astype(np.int32)
    values = m.data if check_values else None
    problem, sorted_unique = _core.check_csr(indptr, np.ascontiguousarray(indices), m.shape[1], values)
    if problem:
        raise ValueError(f"{name}: {problem}")
    return sorted_unique


class Dataset:
    """A multi-label dataset: sparse features and sparse binary labels, one row per point.

    Parameters
    ----------
    features : scipy sparse matrix or 2-D array, shape (n, num_features)
        Converted to CSR float32 with sorted column indices. Duplicate entries
        in a row of an in-memory matrix are summed (scipy's convention); text
        files with a duplicate feature id on a line are rejected instead.
    labels : scipy sparse matrix or 2-D array, shape (n, num_labels)
        Every stored non-zero is a positive label; stored as CSR float32 ones.
    num_features, num_labels : int, optional
        Width of the feature / label space when wider than the matrices
        (ids must be below it). Default: the matrices' widths.

    Raises ``ValueError`` naming the problem: row counts differ, an id is out
    of range, a value is NaN or infinite, a matrix is malformed.

    Attributes: ``features`` (csr float32, shape (n, num_features)),
    ``labels`` (csr float32 of ones, shape (n, num_labels)), ``num_features``,
    ``num_labels``. ``len(ds)`` is the number of points.
    """

    __slots__ = ("features", "labels", "num_features", "num_labels")

    def __init__(self, features, labels, num_features: Optional[int] = None, num_labels: Optional[int] = None):
        x = _to_csr(features, "features")
        y = _to_csr(labels, "labels")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"features has {x.shape[0]} rows but labels has {y.shape[0]}")
        nf = self._width(x, num_features, "num_features", "features")
        nl = self._width(y, num_labels, "num_labels", "labels")
        if x.dtype != np.float32:
            with np.errstate(over="ignore", invalid="ignore"):
                x = x.astype(np.float32)
        if x.shape[1] != nf:
            x = sp.csr_matrix((x.data, x.indices, x.indptr), shape=(x.shape[0], nf))
        if y.shape[1] != nl:
            y = sp.csr_matrix((y.data, y.indices, y.indptr), shape=(y.shape[0], nl))
        if not _check_structure(x, "features", check_values=True):
            x = x.copy()
            x.sum_duplicates()
        if not _check_structure(y, "labels", check_values=False):
            y = y.copy()
            y.sum_duplicates()
        # A stored zero is not a label.
        if y.nnz and not np.all(y.data != 0):
            y = y.copy()
            y.eliminate_zeros()
        y = _csr(np.ones(y.nnz, dtype=np.float32), y.indices.astype(np.int32, copy=False), y.indptr, y.shape)
        x = _csr(x.data, x.indices.astype(np.int32, copy=False), x.indptr, x.shape)
        self.features = x
        self.labels = y
        self.num_features = nf
        self.num_labels = nl

    @staticmethod
    def _width(m, given, arg, name) -> int:
        if given is None:
            return int(m.shape[1])
        given = int(given)
        if given < 0:
            raise ValueError(f"{arg} must be >= 0, got {given}")
        if given < m.shape[1]:
            used = m.indices.max() + 1 if m.nnz else 0
            if used > given:
                raise ValueError(f"{name}: id {used - 1} >= {arg} {given}")
        return given

    @classmethod
    def _trusted(cls, features: sp.csr_matrix, labels: sp.csr_matrix) -> "Dataset":
        """Wraps matrices already known to be valid (parsed, sliced or cache-checked)."""
        ds = cls.__new__(cls)
        ds.features = features
        ds.labels = labels
        ds.num_features = int(features.shape[1])
        ds.num_labels = int(labels.shape[1])
        return ds

    # -- container protocol -------------------------------------------------
    def __len__(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_points(self) -> int:
        return len(self)

    @property
    def nnz(self) -> int:
        """Stored feature values."""
        return int(self.features.nnz)

    def __getitem__(self, key) -> "Dataset":
        """Rows as a new Dataset: ``ds[a:b]``, ``ds[index_array]``, ``ds[bool_mask]`` or ``ds[i]`` (one row)."""
        if isinstance(key, (int, np.integer)):
            n = len(self)
            i = int(key)
            if not -n <= i < n:
                raise IndexError(f"index {i} out of range for a dataset of {n} points")
            key = slice(i % n, i % n + 1)
        elif not isinstance(key, slice):
            key = np.asarray(key)
            if key.size == 0:
                key = key.astype(np.intp).reshape(0)
            if key.dtype == np.bool_:
                if key.shape != (len(self),):
                    raise IndexError(f"boolean mask of shape {key.shape} for a dataset of {len(self)} points")
                key = np.flatnonzero(key)
            elif not np.issubdtype(key.dtype, np.integer) or key.ndim != 1:
                raise IndexError("a dataset is indexed by an int, a slice, a 1-D integer array or a boolean mask")
        x = self.features[key]
        y = self.labels[key]
        x.has_sorted_indices = True
        y.has_sorted_indices = True
        return Dataset._trusted(x, y)

    def shuffle(self, seed: int = 0) -> "Dataset":
        """The points in a random order drawn from ``seed`` (a new Dataset; self is unchanged)."""
        order = np.random.default_rng(seed).permutation(len(self))
        return self[order]

    # -- summaries ------------------------------------------------------------
    def label_counts(self) -> np.ndarray:
        """Number of points carrying each label (int64, length num_labels)."""
        return np.bincount(self.labels.indices, minlength=self.num_labels).astype(np.int64)

    def stats(self) -> dict:
        """Summary numbers: points, features, labels, averages per point, points without labels."""
        n = len(self)
        per_point = np.diff(self.labels.indptr)
        return {
            "points": n,
            "features": self.num_features,
            "labels": self.num_labels,
            "avg_labels_per_point": float(self.labels.nnz / n) if n else 0.0,
            "avg_nnz_per_point": float(self.features.nnz / n) if n else 0.0,
            "points_without_labels": int(np.count_nonzero(per_point == 0)),
        }

    def __repr__(self) -> str:
        return (f"Dataset(n={len(self)}, features={self.num_features}, labels={self.num_labels}, "
                f"nnz={self.features.nnz})")

    def __eq__(self, other) -> bool:
        if not isinstance(other, Dataset):
            return NotImplemented
        return (self.features.shape == other.features.shape and self.labels.shape == other.labels.shape
                and np.array_equal(self.features.indptr, other.features.indptr)
                and np.array_equal(self.features.indices, other.features.indices)
                and np.array_equal(self.features.data, other.features.data)
                and np.array_equal(self.labels.indptr, other.labels.indptr)
                and np.array_equal(self.labels.indices, other.labels.indices))

    __hash__ = None

    # -- output -----------------------------------------------------------------
    def save(self, path: PathLike) -> None:
        """Writes the XC text format atomically (temporary file, then rename).

        Values are written in their shortest form that reads back to the same
        float32, so ``load_dataset(path, cache=False)`` returns an equal Dataset.
        """
        path = Path(path)
        x, y = self.features, self.labels
        with atomic_path(path, durable=False) as tmp:
            _core.write_xc(tmp, self.num_features, self.num_labels,
                           np.asarray(x.indptr, dtype=np.int64), np.ascontiguousarray(x.indices, dtype=np.int32),
                           np.ascontiguousarray(x.data, dtype=np.float32), np.asarray(y.indptr, dtype=np.int64),
                           np.ascontiguousarray(y.indices, dtype=np.int32))


def default_cache_dir() -> Path:
    """``$SLIDE_CACHE_DIR`` if set, else ``~/.cache/slide``."""
    env = os.environ.get("SLIDE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "slide"


DEFAULT_CACHE_MAX_BYTES = 2 << 30
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def cache_max_bytes() -> int:
    """The parse cache's size cap: ``$SLIDE_CACHE_MAX_BYTES`` (bytes, or with a K/M/G/T
    suffix: ``500M``, ``4G``), default 2 GiB. 0 turns storing off.

    Raises ValueError naming the variable when it is not a size.
    """
    text = os.environ.get("SLIDE_CACHE_MAX_BYTES")
    if text is None or not text.strip():
        return DEFAULT_CACHE_MAX_BYTES
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"SLIDE_CACHE_MAX_BYTES must be a size in bytes such as 2147483648, 500M or 4G, "
                         f"got {text!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


def _entries_root(cache_dir: Optional[PathLike]) -> Path:
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "datasets"


def _entry_info(d: Path) -> dict:
    size = 0
    newest = 0.0
    try:
        for f in d.iterdir():
            try:
                st = f.stat()
            except OSError:
                continue
            size += st.st_size
            newest = max(newest, st.st_mtime)
    except OSError:
        pass
    info = {"path": str(d), "bytes": size, "last_used": newest, "source": None, "complete": False,
            "points": None}
    try:
        meta = json.loads((d / "meta.json").read_text())
        info["last_used"] = (d / "meta.json").stat().st_mtime  # touched on every hit
        info["source"] = meta["source"]["path"]
        info["points"] = int(meta["num_points"])
        info["complete"] = True
        st = os.stat(info["source"])
        info["source_changed"] = (st.st_size, st.st_mtime_ns) != (meta["source"]["size"], meta["source"]["mtime_ns"])
    except FileNotFoundError:
        info["source_changed"] = True
    except (OSError, ValueError, KeyError, TypeError):
        info["source_changed"] = None
    return info


def cache_entries(cache_dir: Optional[PathLike] = None) -> list:
    """Entries of the parse cache, least recently used first.

    Each is a dict: ``path`` (entry folder), ``bytes``, ``last_used`` (epoch seconds),
    ``source`` (the parsed file, None for an incomplete entry), ``points``,
    ``complete`` and ``source_changed`` (the file changed or is gone: the entry will
    not be used again).
    """
    root = _entries_root(cache_dir)
    try:
        dirs = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    except OSError:
        return []
    return sorted((_entry_info(d) for d in dirs), key=lambda e: e["last_used"])


def _remove_entry(path: Path) -> bool:
    # Renamed away first, so a reader sees the whole entry or none of it; a second
    # process removing the same entry loses the rename and leaves it alone.
    grave = path.parent / f".removed-{path.name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(path, grave)
    except OSError:
        return False
    shutil.rmtree(grave, ignore_errors=True)
    return True


def clear_cache(cache_dir: Optional[PathLike] = None) -> tuple:
    """Remove every entry of the parse cache; returns ``(entries, bytes)`` removed."""
    n = size = 0
    for e in cache_entries(cache_dir):
        if _remove_entry(Path(e["path"])):
            n += 1
            size += e["bytes"]
    root = _entries_root(cache_dir)
    if root.is_dir():  # leftovers of removals that a crash interrupted
        for d in root.iterdir():
            if d.name.startswith(".removed-"):
                shutil.rmtree(d, ignore_errors=True)
    return n, size


def _evict(root: Path, limit: int, keep: Path) -> None:
    """Remove least recently used entries until the cache holds at most ``limit`` bytes."""
    entries = cache_entries(root.parent)
    total = sum(e["bytes"] for e in entries)
    for e in entries:
        if total <= limit:
            break
        if Path(e["path"]) == keep:
            continue
        if _remove_entry(Path(e["path"])):
            log.debug("cache: evicted %s (%d bytes, source %s)", e["path"], e["bytes"], e["source"])
            total -= e["bytes"]


def _dataset_from_arrays(a: dict, num_points: int, num_features: int, num_labels: int) -> Dataset:
    x = _csr(a["feature_values"], a["feature_indices"], a["feature_indptr"], (num_points, num_features))
    y = _csr(np.ones(a["label_indices"].size, dtype=np.float32), a["label_indices"], a["label_indptr"],
             (num_points, num_labels))
    return Dataset._trusted(x, y)


class _Cache:
    """One cache entry: a directory of .npy arrays and a meta.json written last.

    The entry's directory is named by the source's absolute path and the parse
    options, so a file that changes replaces its entry instead of adding one;
    meta.json records the source's size and mtime_ns (an entry is used only
    while they match) and each array's length and fingerprint, so a stale,
    truncated, half-replaced or altered entry is detected and rebuilt rather
    than trusted.
    """

    def __init__(self, root: Path, source: Path, st: os.stat_result, options: dict):
        ident = {"path": str(source), "version": _CACHE_VERSION, **options}
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:40]
        self.source = {**ident, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        self.root = root / "datasets"
        self.dir = self.root / key

    def load(self) -> Optional[Dataset]:
        meta_path = self.dir / "meta.json"
        if not meta_path.is_file():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("source") != self.source:
                return None
            arrays = {}
            for name in _ARRAYS:
                info = meta["arrays"][name]
                arr = np.load(self.dir / f"{name}.npy", allow_pickle=False)
                if arr.dtype != _DTYPES[name] or arr.shape != (int(info["length"]),) or not arr.flags.c_contiguous:
                    raise ValueError(f"{name}: unexpected dtype or shape")
                if _core.fingerprint(arr) != int(info["fingerprint"]):
                    raise ValueError(f"{name}: fingerprint mismatch")
                arrays[name] = arr
            n, nf, nl = int(meta["num_points"]), int(meta["num_features"]), int(meta["num_labels"])
            try:
                os.utime(meta_path)  # the entry's last use, for least-recently-used eviction
            except OSError:
                pass
            if arrays["feature_indptr"].size != n + 1 or arrays["label_indptr"].size != n + 1:
                raise ValueError("indptr length does not match num_points")
            for prefix, width, values in (("feature", nf, arrays["feature_values"]), ("label", nl, None)):
                problem, sorted_unique = _core.check_csr(arrays[f"{prefix}_indptr"], arrays[f"{prefix}_indices"],
                                                         width, values)
                if problem or not sorted_unique:
                    raise ValueError(f"{prefix}s: {problem or 'unsorted indices'}")
            return _dataset_from_arrays(arrays, n, nf, nl)
        except Exception as e:  # any damage means: parse the source again
            log.debug("ignoring damaged cache entry %s: %s", self.dir, e)
            return None

    def store(self, arrays: dict, num_points: int, num_features: int, num_labels: int, fmt: str,
              limit: int) -> None:
        need = sum(np.asarray(arrays[name]).nbytes for name in _ARRAYS)
        if need > limit:
            log.debug("cache: %s not stored: %d bytes exceed SLIDE_CACHE_MAX_BYTES %d", self.source["path"], need, limit)
            self._evict(limit)
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            info = {}
            for name in _ARRAYS:
                arr = np.ascontiguousarray(arrays[name])
                self._atomic_write(f"{name}.npy", lambda f, a=arr: np.save(f, a, allow_pickle=False))
                info[name] = {"length": int(arr.size), "fingerprint": int(_core.fingerprint(arr))}
            meta = {"source": self.source, "format": fmt, "num_points": num_points,
                    "num_features": num_features, "num_labels": num_labels, "arrays": info}
            text = json.dumps(meta, indent=1).encode()
            self._atomic_write("meta.json", lambda f: f.write(text))
        except OSError as e:  # a read-only or full cache directory only costs speed
            log.debug("cannot write cache entry %s: %s", self.dir, e)
            return
        self._evict(limit)

    def _evict(self, limit: int) -> None:
        try:
            _evict(self.root, limit, keep=self.dir)
        except OSError as e:
            log.debug("cache: eviction in %s failed: %s", self.root, e)

    def _atomic_write(self, name: str, write) -> None:
        # a cache entry is rebuilt when lost, so it needs no fsync
        atomic_write(self.dir / name, write, durable=False)


def load_dataset(path: PathLike, format: str = "auto", cache: bool = True, num_features: Optional[int] = None,
                 num_labels: Optional[int] = None, *, cache_dir: Optional[PathLike] = None,
                 num_threads: int = 0) -> Dataset:
    """Reads an XC or libsvm multilabel text file into a :class:`Dataset`.

    Parameters
    ----------
    path : file to read.
    format : ``"auto"`` (XC when line 1 is exactly three integers without ':',
        otherwise libsvm), ``"xc"`` or ``"libsvm"``.
    cache : reuse / store the parsed arrays in the cache directory
        (``cache_dir``, else ``$SLIDE_CACHE_DIR``, else ``~/.cache/slide``).
        Never written beside the source; an entry is used only while the
        source's path, size and mtime are unchanged and its contents verify.
        The cache holds at most ``$SLIDE_CACHE_MAX_BYTES`` (default 2 GiB):
        storing an entry evicts the least recently used ones beyond that.
        Processes may load the same file at once (entries are written file
        by file atomically, the manifest last).
    num_features, num_labels : width of the feature / label space. Default:
        the XC header, or for libsvm the largest id + 1. When given, every id
        must be below it.
    num_threads : parser threads (0: all cores).

    Raises
    ------
    FileNotFoundError : the file does not exist or cannot be opened.
    slide.DataError (a ValueError) : malformed input, with message
        ``"<path>:<line>: <problem>"`` (1-based line). This includes a line
        that repeats a feature or label id: such a line is rejected rather
        than summed or deduplicated, since either would silently alter data.
    """
    if format not in ("auto", "xc", "libsvm"):
        raise ValueError(f"format must be 'auto', 'xc' or 'libsvm', got {format!r}")
    for arg, v in (("num_features", num_features), ("num_labels", num_labels)):
        if v is not None and not 0 <= int(v) <= np.iinfo(np.int32).max:
            raise ValueError(f"{arg} must be in [0, 2147483647], got {v}")
    source = Path(os.path.abspath(os.fspath(path)))
    entry = None
    limit = cache_max_bytes() if cache else 0
    if cache:
        try:
            st = source.stat()
        except OSError:
            st = None  # the reader raises the proper error below
        if st is not None and source.is_file():
            options = {"format": format, "num_features": num_features, "num_labels": num_labels}
            entry = _Cache(Path(cache_dir) if cache_dir is not None else default_cache_dir(), source, st, options)
            ds = entry.load()
            if ds is not None:
                return ds
    r = _core.read_dataset(os.fspath(path), format, -1 if num_features is None else int(num_features),
                           -1 if num_labels is None else int(num_labels), num_threads)
    n, nf, nl = int(r["num_points"]), int(r["num_features"]), int(r["num_labels"])
    if entry is not None:
        st2 = source.stat()
        # Only an unchanged source may be cached under its (size, mtime) key.
        if (st2.st_size, st2.st_mtime_ns) == (entry.source["size"], entry.source["mtime_ns"]):
            entry.store(r, n, nf, nl, r["format"], limit)
    return _dataset_from_arrays(r, n, nf, nl)
