"""Dataset container, XC/libsvm readers, writer and the parse cache."""
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide import DataError, Dataset, load_dataset
from slide import data as data_module

from conftest import BIBTEX, DELICIOUS


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIDE_CACHE_DIR", str(tmp_path / "cache"))


def write(tmp_path, text, name="d.txt"):
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def load(p, **kw):
    return load_dataset(p, cache=False, **kw)


def dense(ds):
    return ds.features.toarray(), ds.labels.toarray()


# ---------------------------------------------------------------- reading


def test_xc_file_with_unlabelled_point_crlf_and_trailing_blank(tmp_path):
    p = write(tmp_path, "3 5 4\r\n0,2 1:0.5 4:2  \r\n 0:1\r\n3 2:-1.25e-3\r\n\r\n")
    ds = load(p)
    assert len(ds) == 3 and ds.num_features == 5 and ds.num_labels == 4
    x, y = dense(ds)
    np.testing.assert_array_equal(x, [[0, 0.5, 0, 0, 2], [1, 0, 0, 0, 0], [0, 0, np.float32(-1.25e-3), 0, 0]])
    np.testing.assert_array_equal(y, [[1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]])
    assert ds.features.dtype == np.float32 and ds.labels.dtype == np.float32
    assert ds.features.indices.dtype == np.int32


def test_libsvm_is_detected_and_ids_shift_and_widths_are_inferred(tmp_path):
    p = write(tmp_path, "1,3 1:1 7:0.25\n 2:3\n0 4:1\n")
    ds = load(p)
    assert (len(ds), ds.num_features, ds.num_labels) == (3, 7, 4)
    x, y = dense(ds)
    assert x[0, 0] == 1 and x[0, 6] == 0.25 and x[1, 1] == 3 and x[2, 3] == 1
    np.testing.assert_array_equal(y.sum(axis=0), [1, 1, 0, 1])
    wide = load(p, num_features=10, num_labels=6)
    assert (wide.num_features, wide.num_labels) == (10, 6)


def test_format_can_be_forced(tmp_path):
    p = write(tmp_path, "0 3 4\n")  # a header, or a libsvm line with bad tokens
    assert len(load(p)) == 0 and load(p).num_features == 3
    with pytest.raises(DataError, match=r"d\.txt:1: feature '3' is not of the form id:value"):
        load(p, format="libsvm")
    q = write(tmp_path, "1 1:1\n0 2:1\n", "l.txt")
    with pytest.raises(DataError, match=r"l\.txt:1: header"):
        load(q, format="xc")
    with pytest.raises(ValueError, match="format must be"):
        load(q, format="csv")


def test_unsorted_row_is_sorted(tmp_path):
    p = write(tmp_path, "1 6 3\n2,0 5:5 1:1 3:3\n")
    ds = load(p)
    np.testing.assert_array_equal(ds.features.indices, [1, 3, 5])
    np.testing.assert_array_equal(ds.features.data, [1, 3, 5])
    np.testing.assert_array_equal(ds.labels.indices, [0, 2])


def test_point_with_neither_labels_nor_features(tmp_path):
    p = write(tmp_path, "3 4 2\n1 0:1\n \n0 3:1\n")
    ds = load(p)
    assert len(ds) == 3 and ds.features[1].nnz == 0 and ds.labels[1].nnz == 0


@pytest.mark.parametrize("text, line, what", [
    ("", 1, "empty file"),
    ("0,1 1:1\n", 1, "header"),                                   # header missing (forced xc)
    ("3 4\n0 1:1\n", 1, "header"),                                 # not three integers
    ("2 4 x\n0 1:1\n", 1, "header"),
    ("3 4 2\n0 1:1\n1 2:1\n", 3, "ends after 2 data lines but the header declares 3"),
    ("1 4 2\n0 1:1\n1 2:1\n", 3, "more data lines than the header declares"),
    ("2 4 2\n0 1:1\n1 4:1\n", 3, "feature id 4 >= num_features 4"),
    ("2 4 2\n0 1:1\n1 -1:1\n", 3, "negative feature id -1"),
    ("2 4 2\n0 1:1\n2 1:1\n", 3, "label id 2 >= num_labels 2"),
    ("2 4 2\n0 1:1\n-1 1:1\n", 3, "negative label id -1"),
    ("2 4 2\n0 1:1\n1 a:1\n", 3, "feature id 'a' is not a number"),
    ("2 4 2\n0 1:1\n1 1:x\n", 3, "value 'x' is not a number"),
    ("2 4 2\n0 1:1\n1,b 1:1\n", 3, "label id 'b' is not a number"),
    ("2 4 2\n0 1:1\n1 1:nan\n", 3, "NaN or infinite"),
    ("2 4 2\n0 1:1\n1 1:-inf\n", 3, "NaN or infinite"),
    ("2 4 2\n0 1:1\n1 1:1e39\n", 3, "outside the float32 range"),
    ("2 4 2\n0 1:1\n1 2:\n", 3, "has no value"),
    ("2 4 2\n0 1:1\n1 2\n", 3, "is not of the form id:value"),
    ("2 4 2\n0 1:1\n1 2:1 0:1 2:3\n", 3, "duplicate feature id 2"),
    ("2 4 2\n0 1:1\n1 2:1 2:3\n", 3, "duplicate feature id 2"),
    ("2 4 2\n0 1:1\n1,0,1 2:1\n", 3, "duplicate label id 1"),
    ("2 4 2\n0 1:1\n1,,0 2:1\n", 3, "empty label id"),
    ("2 4 2\n0 1:1\n1 99999999999999999999999999:1\n", 3, "feature id 99999999999999999999999999 >= num_features"),
    ("99999999999999999999999 4 2\n", 1, "num_points"),
    ("1 99999999999 2\n0 1:1\n", 1, "num_features"),
])
def test_malformed_xc_reports_path_and_line(tmp_path, text, line, what):
    p = write(tmp_path, text)
    with pytest.raises(DataError) as e:
        load(p, format="xc")
    msg = str(e.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    assert what in msg
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("text, line, what", [
    ("0 1:1\n1 0:1\n", 2, "feature id 0 in libsvm format"),
    ("0 1:1\n1 2:1\n", 2, "feature id 2 >= num_features 1"),  # with num_features=1
    ("0 1:1\n1 3000000000:1\n", 2, "too large"),
    ("\n\n", 1, "no data lines"),
])
def test_malformed_libsvm_reports_path_and_line(tmp_path, text, line, what):
    p = write(tmp_path, text)
    kw = {"num_features": 1} if "num_features 1" in what else {}
    with pytest.raises(DataError) as e:
        load(p, format="libsvm", **kw)
    assert str(e.value).startswith(f"{p}:{line}: ") and what in str(e.value), str(e.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_dataset(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="directory"):
        load_dataset(tmp_path)


def test_error_line_is_exact_in_a_large_multithreaded_file(tmp_path):
    # Many 4 MiB chunks, the bad line deep inside a later one.
    n, bad = 200_000, 187_654
    lines = [f"{i % 7} " + " ".join(f"{i % 50 + 60 * k}:1" for k in range(8)) for i in range(n)]
    lines[bad] = "1 3:1 7:oops"
    p = write(tmp_path, f"{n} 500 7\n" + "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf":{bad + 2}: value 'oops' is not a number"):
        load(p, num_threads=4)
    lines[bad] = "1 3:1 7:1"
    p = write(tmp_path, f"{n} 500 7\n" + "\n".join(lines) + "\n")
    one = load(p, num_threads=1)
    four = load(p, num_threads=4)
    assert one == four and len(one) == n and one.features.nnz == 8 * n - 6


@pytest.mark.parametrize("blob", [
    bytes(range(256)) * 64,
    b"\x00" * 10000,
    b"7 7 7\n" + bytes(np.random.default_rng(1).integers(0, 256, 50_000, dtype=np.uint8)),
    b"1 1 1\n0 " + b"9" * 5_000_000 + b":1\n",
    b"1 1 1\n0" + b",0" * 1_000_000 + b" 0:1\n",
    b"2 3 1\n0 1:1\n\xff\xfe 2:1\n",
], ids=["all-bytes", "zeros", "random-bytes", "5MB-id", "million-labels", "invalid-utf8"])
def test_garbage_raises_dataerror_not_a_crash(tmp_path, blob):
    p = write(tmp_path, blob)
    with pytest.raises(DataError) as e:
        load(p)
    assert str(e.value).startswith(f"{p}:")


def test_mutated_files_load_or_raise_dataerror(tmp_path):
    base = b"4 6 3\n0,2 1:0.5 5:2\n 0:1 3:-1e-3\n1 2:1\n2,1 4:3.25 0:1\n"
    alphabet = b"0123456789:, \n\r\t.-+eEx\x00\xff"
    rng = np.random.default_rng(11)
    p = tmp_path / "m.txt"
    loaded = 0
    for _ in range(300):
        b = bytearray(base)
        for _ in range(rng.integers(1, 4)):
            i = int(rng.integers(len(b)))
            op = rng.integers(3)
            if op == 0:
                b[i] = alphabet[rng.integers(len(alphabet))]
            elif op == 1:
                b.insert(i, alphabet[rng.integers(len(alphabet))])
            else:
                del b[i]
        p.write_bytes(bytes(b))
        for fmt in ("auto", "libsvm"):
            try:
                ds = load(p, format=fmt)
            except DataError as e:
                assert str(e).startswith(f"{p}:"), str(e)
                continue
            loaded += 1
            for m, width in ((ds.features, ds.num_features), (ds.labels, ds.num_labels)):
                assert m.shape == (len(ds), width)
                problem, sorted_unique = slide._core.check_csr(m.indptr.astype(np.int64), m.indices, width)
                assert problem == "" and sorted_unique
    assert loaded > 20  # the mutations are not all fatal: both outcomes are exercised


def test_very_long_valid_line(tmp_path):
    feats = " ".join(f"{j}:{j % 5 + 1}" for j in range(200_000))
    p = write(tmp_path, f"1 200000 1\n0 {feats}\n")
    ds = load(p)
    assert ds.features.nnz == 200_000 and ds.features.data[-1] == 199_999 % 5 + 1


# ---------------------------------------------------------------- real data


def test_real_datasets_match_their_cards():
    bib = load_dataset(BIBTEX / "train.txt")
    s = bib.stats()
    assert (s["points"], s["features"], s["labels"]) == (4880, 1836, 159)
    assert 2.3 < s["avg_labels_per_point"] < 2.5 and 68 < s["avg_nnz_per_point"] < 69.5
    deli = load_dataset(DELICIOUS / "train.txt")
    s = deli.stats()
    assert (s["points"], s["features"], s["labels"]) == (12920, 500, 983)
    assert s["points_without_labels"] > 0  # lines that start with a space are kept
    assert 18.9 < s["avg_labels_per_point"] < 19.1
    assert deli.label_counts().sum() == deli.labels.nnz
    # the shipped test files: the point counts of the cards, ids inside the training ranges
    for folder, points, train in ((BIBTEX, 2515, bib), (DELICIOUS, 3185, deli)):
        test = load_dataset(folder / "test.txt")
        assert len(test) == points
        assert test.num_features <= train.num_features and test.num_labels <= train.num_labels


# ---------------------------------------------------------------- Dataset


def small():
    x = sp.csr_matrix(np.array([[0, 1.5, 0, 2], [3, 0, 0, 0], [0, 0, 0, 0]], dtype=np.float64))
    y = sp.csr_matrix(np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0]]))
    return Dataset(x, y)


def test_dataset_coerces_and_reports():
    ds = small()
    assert ds.features.dtype == np.float32 and ds.labels.dtype == np.float32
    assert set(ds.labels.data) == {1.0}
    assert repr(ds) == "Dataset(n=3, features=4, labels=3, nnz=3)"
    assert ds.stats() == {"points": 3, "features": 4, "labels": 3, "avg_labels_per_point": 1.0,
                          "avg_nnz_per_point": 1.0, "points_without_labels": 1}
    np.testing.assert_array_equal(ds.label_counts(), [1, 1, 1])
    assert ds.label_counts().dtype == np.int64


def test_dataset_sorts_indices_and_widens():
    x = sp.csr_matrix((np.array([2.0, 1.0]), np.array([3, 0]), np.array([0, 2])), shape=(1, 4))
    assert not x.has_sorted_indices
    ds = Dataset(x, sp.csr_matrix(np.ones((1, 1))), num_features=10, num_labels=5)
    np.testing.assert_array_equal(ds.features.indices, [0, 3])
    np.testing.assert_array_equal(ds.features.data, [1.0, 2.0])
    assert ds.features.shape == (1, 10) and ds.labels.shape == (1, 5)


@pytest.mark.parametrize("make, match", [
    (lambda: Dataset(np.ones((3, 2)), np.ones((2, 2))), "3 rows but labels has 2"),
    (lambda: Dataset(np.ones((2, 4)), np.ones((2, 2)), num_features=3), "features: id 3 >= num_features 3"),
    (lambda: Dataset(np.ones((2, 2)), np.ones((2, 4)), num_labels=2), "labels: id 3 >= num_labels 2"),
    (lambda: Dataset(np.array([[np.nan, 1]]), np.ones((1, 1))), "NaN or infinite"),
    (lambda: Dataset(np.array([[1e300, 1]]), np.ones((1, 1))), "NaN or infinite"),
    (lambda: Dataset(np.ones(3), np.ones((3, 1))), "2-D"),
    (lambda: Dataset(np.array([["a", "b"]]), np.ones((1, 1))), "real numbers"),
])
def test_dataset_validation_names_the_problem(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_slicing_and_shuffle():
    ds = small()
    assert ds[1:].features.shape == (2, 4) and len(ds[[2, 0]]) == 2
    np.testing.assert_array_equal(ds[[2, 0]].labels.toarray(), [[0, 1, 0], [1, 0, 1]])
    np.testing.assert_array_equal(ds[np.array([True, False, True])].features.toarray()[0], [0, 1.5, 0, 2])
    assert len(ds[-1]) == 1 and ds[-1].labels.toarray()[0, 1] == 1
    assert len(ds[[]]) == 0 and ds[[]].num_labels == 3
    with pytest.raises(IndexError):
        ds[3]
    a, b = ds.shuffle(7), ds.shuffle(7)
    assert a == b and len(a) == 3
    assert sorted(map(tuple, a.features.toarray())) == sorted(map(tuple, ds.features.toarray()))


def test_save_round_trips_exactly(tmp_path):
    rng = np.random.default_rng(3)
    x = sp.random(300, 50, density=0.1, format="csr", random_state=4, dtype=np.float64)
    x.data = (rng.standard_normal(x.nnz) * 10.0 ** rng.integers(-30, 30, x.nnz)).astype(np.float32)
    y = sp.random(300, 20, density=0.1, format="csr", random_state=5)
    y = sp.csr_matrix(y.multiply((np.arange(300) != 5)[:, None]))  # point 5 has no labels
    ds = Dataset(x, y, num_features=60, num_labels=25)
    p = tmp_path / "out.txt"
    ds.save(p)
    back = load(p)
    assert back == ds
    assert back.num_features == 60 and back.num_labels == 25
    assert not list(tmp_path.glob(".*tmp"))


def test_save_refuses_non_finite_and_leaves_no_file(tmp_path):
    ds = small()
    ds.features.data[0] = np.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        ds.save(tmp_path / "bad.txt")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- cache


def test_cache_is_reused_checked_and_refreshed(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    p = write(src, "2 3 2\n0 1:1\n1 2:0.5\n")
    cache = tmp_path / "cache"
    first = load_dataset(p)
    entries = list((cache / "datasets").iterdir())
    assert len(entries) == 1 and (entries[0] / "meta.json").is_file()
    assert sorted(os.listdir(src)) == ["d.txt"]  # nothing beside the source

    real = slide._core.read_dataset
    monkeypatch.setattr(data_module._core, "read_dataset", lambda *a, **k: pytest.fail("cache not used"))
    assert load_dataset(p) == first

    # A damaged entry is never trusted: it is parsed again and rewritten.
    monkeypatch.setattr(data_module._core, "read_dataset", real)
    vals = entries[0] / "feature_values.npy"
    raw = bytearray(vals.read_bytes())
    raw[-1] ^= 0x40
    vals.write_bytes(bytes(raw))
    assert load_dataset(p) == first
    (entries[0] / "feature_indices.npy").write_bytes(b"junk")
    assert load_dataset(p) == first

    # A changed source is parsed again.
    p.write_text("2 3 2\n0 1:1\n1 2:0.75\n")
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert load_dataset(p).features.data[-1] == 0.75
    assert list((cache / "datasets").iterdir()) == entries  # replaced, not added
    assert load_dataset(p).features.data[-1] == 0.75


def test_cache_false_writes_nothing_and_unwritable_cache_is_fine(tmp_path):
    p = write(tmp_path, "1 2 1\n0 1:1\n")
    load_dataset(p, cache=False)
    assert not (tmp_path / "cache").exists()
    # A cache directory that cannot be created (a file is in the way) only costs speed.
    assert len(load_dataset(p, cache_dir=p)) == 1
