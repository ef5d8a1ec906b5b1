"""Fuzz the dataset readers through ``slide.load_dataset`` (XC and libsvm, cache off and on).

Promise under test (slide/data.py, cpp/include/slide/data.hpp): malformed input raises
``slide.DataError`` whose message is ``"<path>:<line>: <problem>"``; no input crashes
the process. What is accepted must be a valid dataset: CSR with sorted unique indices
below the declared widths, finite float32 values, labels all ones; it must read back
equal after ``Dataset.save``; and a cached read must equal an uncached one.

The first input byte chooses the options: bits 0-1 the format (auto, xc, libsvm),
bit 2 the cache, bit 3 explicit ``num_features``/``num_labels`` (taken from the
next two bytes). The rest is the file.
"""
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

import atheris  # noqa: E402

with atheris.instrument_imports(include=["slide.data"]):
    import numpy as np
    import slide.data
    from slide.data import DataError, load_dataset

_FORMATS = ("auto", "xc", "libsvm", "auto")


def _check_valid(ds, path, fmt, nf, nl):
    x, y = ds.features, ds.labels
    n = len(ds)
    if x.shape != (n, ds.num_features) or y.shape != (n, ds.num_labels):
        raise _harness.Finding(f"shapes {x.shape} {y.shape} disagree with n={n}, widths {ds.num_features}, {ds.num_labels}")
    if nf is not None and ds.num_features != nf or nl is not None and ds.num_labels != nl:
        raise _harness.Finding(f"asked for widths {nf}, {nl}, got {ds.num_features}, {ds.num_labels}")
    for name, m in (("features", x), ("labels", y)):
        if m.dtype != np.float32:
            raise _harness.Finding(f"{name} dtype {m.dtype}")
        if m.indptr[0] != 0 or m.indptr[-1] != m.indices.size or np.any(np.diff(m.indptr) < 0):
            raise _harness.Finding(f"{name}: broken indptr")
        for r in range(n):
            row = m.indices[m.indptr[r]:m.indptr[r + 1]]
            if row.size and (row[0] < 0 or row[-1] >= m.shape[1] or np.any(np.diff(row) <= 0)):
                raise _harness.Finding(f"{name} row {r}: indices {row} not sorted/unique/in range")
    if not np.all(np.isfinite(x.data)):
        raise _harness.Finding("non-finite feature value accepted")
    if y.nnz and not np.all(y.data == 1.0):
        raise _harness.Finding("label values other than 1")


def _one(data: bytes) -> None:
    if not data:
        return
    opts, rest = data[0], data[1:]
    fmt = _FORMATS[opts & 3]
    cache = bool(opts & 4)
    nf = nl = None
    if opts & 8 and len(rest) >= 2:
        nf, nl, rest = rest[0], rest[1], rest[2:]
    scratch = _harness.scratch_dir()
    path = os.path.join(scratch, "data.txt")
    with open(path, "wb") as fh:
        fh.write(rest)
    ds = load_dataset(path, format=fmt, cache=False, num_features=nf, num_labels=nl, num_threads=2)
    _check_valid(ds, path, fmt, nf, nl)
    rows = np.diff(ds.features.indptr)
    _harness.feedback(f"ok:{fmt}:{cache}:{nf is not None}:{min(len(ds), 4)}:{int(rows.min(initial=0) == 0)}:"
                      f"{min(ds.labels.nnz, 3)}:{min(ds.features.nnz, 3)}")
    # what was read must be written and read back unchanged
    back_path = os.path.join(scratch, "back.txt")
    ds.save(back_path)
    back = load_dataset(back_path, format="xc", cache=False)
    if not (back == ds):
        raise _harness.Finding(f"save/load round trip changed the dataset: {ds!r} -> {back!r}")
    if cache:
        cache_dir = os.path.join(scratch, "cache")
        try:
            first = load_dataset(path, format=fmt, cache=True, num_features=nf, num_labels=nl, cache_dir=cache_dir)
            second = load_dataset(path, format=fmt, cache=True, num_features=nf, num_labels=nl, cache_dir=cache_dir)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        if not (first == ds and second == ds):
            raise _harness.Finding("a cached read differs from the uncached read")


def _message_names_line(e: BaseException):
    if isinstance(e, DataError) and not re.match(r"^.*data\.txt:\d+: \S", str(e)):
        return "DataError message is not '<path>:<line>: <problem>'"
    return None


one_input = _harness.guard(_one, (DataError, MemoryError), check_message=_message_names_line)

if __name__ == "__main__":
    _harness.main(one_input)
