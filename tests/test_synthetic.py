"""slide.datasets: synthetic generator, bundled data, cards and shipped configs."""
import json
import os

import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide import datasets, metrics
from slide.datasets import make_synthetic, make_synthetic_arrays

from conftest import DATASETS


@pytest.fixture(scope="module")
def small():
    return make_synthetic("small", seed=1)


def test_presets_have_the_published_shapes():
    a = datasets.PRESETS["amazon-670k"]
    assert (a.num_features, a.num_labels, a.num_train, a.num_test) == (135_909, 670_091, 490_449, 153_025)
    d = datasets.PRESETS["delicious-200k"]
    assert (d.num_features, d.num_labels, d.num_train, d.num_test) == (782_585, 205_443, 196_606, 100_095)
    assert datasets.PRESETS["synth-20k"].num_labels == 20_000
    assert {"tiny", "small"} <= set(datasets.PRESETS)


def test_small_matches_its_spec(small):
    train, test = small
    spec = datasets.PRESETS["small"]
    assert isinstance(train, slide.Dataset) and isinstance(test, slide.Dataset)
    assert (len(train), len(test)) == (spec.num_train, spec.num_test)
    for ds in (train, test):
        assert (ds.num_features, ds.num_labels) == (spec.num_features, spec.num_labels)
        x, y = ds.features, ds.labels
        assert x.dtype == np.float32 and x.has_sorted_indices
        assert y.nnz / len(ds) == pytest.approx(spec.avg_labels, rel=0.1)
        assert x.nnz / len(ds) == pytest.approx(spec.avg_nnz, rel=0.1)
        assert np.all(np.diff(y.indptr) >= 1) and np.all(np.diff(x.indptr) >= 1)
        assert np.all(x.data > 0)
        norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
        # tf-idf-like: values vary within a row, not all equal
        assert np.unique(np.round(x.data, 5)).size > 100


def test_seeded_and_reproducible():
    a = make_synthetic_arrays("tiny", seed=5)
    b = make_synthetic_arrays("tiny", seed=5)
    c = make_synthetic_arrays("tiny", seed=6)
    for m, n in zip(a, b):
        assert (m != n).nnz == 0
    assert (a[1] != c[1]).nnz > 0


def test_label_frequencies_follow_the_power_law():
    for exponent in (0.6, 1.0):
        _, y, _, _ = make_synthetic_arrays(num_features=5000, num_labels=2000, num_train=20_000,
                                           num_test=0, avg_labels=3, avg_nnz=30,
                                           power_law_exponent=exponent)
        counts = np.sort(np.bincount(y.indices, minlength=2000))[::-1]
        ranks = np.arange(1, 2001)
        sel = slice(9, 1000)
        slope = np.polyfit(np.log(ranks[sel]), np.log(np.maximum(counts[sel], 1)), 1)[0]
        assert -slope == pytest.approx(exponent, abs=0.15)


def test_labels_are_learnable_from_features(small):
    # a label-centroid classifier fitted on train beats the most-frequent-label answer by far
    train, test = small
    w = (train.labels.T @ train.features).tocsr()
    norms = np.sqrt(np.asarray(w.multiply(w).sum(axis=1)).ravel())
    w = sp.diags(1.0 / np.maximum(norms, 1e-12)) @ w
    scores = (test.features @ w.T).toarray()
    top = np.argsort(-scores, axis=1)[:, :5]
    r = metrics.evaluate(top, test.labels, k=(1, 5))
    most_frequent = np.argsort(-train.label_counts())[:5]
    base = metrics.evaluate(np.tile(most_frequent, (len(test), 1)), test.labels, k=(1, 5))
    assert r["P@1"] > 0.55 and r["P@1"] > 2 * base["P@1"], (r, base)
    assert r["P@5"] > 2 * base["P@5"]
    # but not trivially: distractor evidence keeps a simple model well below perfect
    assert r["P@1"] < 0.9


def test_overrides_and_shape_without_preset():
    train, test = make_synthetic("tiny", num_train=50, num_test=7)
    assert (len(train), len(test)) == (50, 7)
    train, test = make_synthetic(num_features=300, num_labels=40, num_train=100, num_test=10,
                                 avg_labels=2.5, avg_nnz=20)
    assert train.num_labels == 40 and train.num_features == 300


@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(preset="nope"), ValueError, "unknown synthetic preset 'nope'; choose one of amazon-670k"),
    (dict(preset="tiny", num_lables=3), TypeError, r"unknown parameter\(s\) \['num_lables'\]"),
    (dict(num_labels=10), TypeError, "without a preset, give num_features"),
    (dict(preset="tiny", avg_labels=50.0), ValueError, r"avg_labels: must be in \[1, num_labels=20\]"),
    (dict(preset="tiny", signal=1.5), ValueError, r"signal: must be in \[0, 1\]"),
    (dict(preset="tiny", num_train=0), ValueError, "num_train: must be a positive integer"),
    (dict(preset="tiny", seed=-1), ValueError, "seed must be a non-negative integer"),
])
def test_bad_parameters_raise(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        make_synthetic_arrays(**kwargs)


def test_write_synthetic_round_trips(tmp_path):
    paths = datasets.write_synthetic("tiny", tmp_path / "out", seed=3)
    assert sorted(os.listdir(tmp_path / "out")) == ["stats.json", "test.txt", "train.txt"]
    train, test = make_synthetic("tiny", seed=3)
    assert slide.load_dataset(paths["train"], cache=False) == train
    assert slide.load_dataset(paths["test"], cache=False) == test
    with open(paths["stats"]) as fh:
        info = json.load(fh)
    assert info["preset"] == "tiny" and info["seed"] == 3
    assert info["train"]["points"] == 200 and info["spec"]["num_labels"] == 20
    assert info["train"]["avg_labels_per_point"] == pytest.approx(train.labels.nnz / 200)


# ---------------------------------------------------------------------- bundled data and configs

def test_bundled_folders():
    for name in ("bibtex", "delicious"):
        path = datasets.bundled(name)
        assert os.path.samefile(path, os.path.join(DATASETS, name))
        ds = slide.load_dataset(os.path.join(path, "train.txt"), cache=False)
        assert len(ds) == {"bibtex": 4880, "delicious": 12920}[name]
    with pytest.raises(FileNotFoundError, match="no bundled dataset 'amazon-670k'.*bundled: bibtex, delicious"):
        datasets.bundled("amazon-670k")
    with pytest.raises(ValueError, match="plain name"):
        datasets.bundled("../datasets/bibtex")


def test_bundled_prefers_the_copy_installed_in_the_wheel(tmp_path, monkeypatch):
    pkg = tmp_path / "site-packages" / "slide"
    (pkg / "_datasets" / "bibtex").mkdir(parents=True)
    (pkg / "_datasets" / "bibtex" / "train.txt").write_text("0 1 1\n")
    (pkg / "_datasets" / "bibtex.yaml").write_text("data: {train: bibtex/train.txt}\n")
    monkeypatch.setattr(datasets, "_PACKAGE_DIR", str(pkg))
    assert datasets.bundled("bibtex") == str(pkg / "_datasets" / "bibtex")
    assert datasets.config_path("bibtex") == str(pkg / "_datasets" / "bibtex.yaml")
    with pytest.raises(FileNotFoundError, match="bundled: bibtex$"):
        datasets.bundled("delicious")
    # neither the wheel copy nor a repository beside the package
    monkeypatch.setattr(datasets, "_PACKAGE_DIR", str(tmp_path / "elsewhere" / "slide"))
    with pytest.raises(FileNotFoundError, match="no bundled datasets folder"):
        datasets.bundled("bibtex")


def test_list_datasets_names_everything():
    rows = {r["name"]: r for r in datasets.list_datasets()}
    assert rows["bibtex"]["kind"] == "bundled" and rows["bibtex"]["config"].endswith("bibtex.yaml")
    assert rows["delicious"]["kind"] == "bundled" and rows["delicious"]["card"].endswith("delicious.md")
    for name in ("amazon-670k", "delicious-200k"):
        assert rows[name]["kind"] == "download" and rows[name]["config"] and rows[name]["card"]
        assert rows[name]["preset"]
    for name in ("tiny", "small", "synth-20k"):
        assert rows[name]["kind"] == "synthetic"
    assert rows["synthetic"]["card"] and rows["synth-amazon-670k"]["config"]
    assert all(r["description"] for r in rows.values() if r["card"] or r["kind"] == "synthetic")


SHIPPED_YAML = sorted(f for f in os.listdir(DATASETS) if f.endswith(".yaml"))


def test_every_expected_config_and_card_is_shipped():
    for name in ("bibtex", "delicious", "delicious-200k", "amazon-670k", "synth-amazon-670k",
                 "synth-delicious-200k", "synth-20k"):
        assert f"{name}.yaml" in SHIPPED_YAML
    for name in ("bibtex", "delicious", "delicious-200k", "amazon-670k", "synthetic"):
        assert os.path.isfile(datasets.card_path(name))


@pytest.mark.parametrize("name", SHIPPED_YAML)
def test_shipped_configs_load(name):
    path = os.path.join(DATASETS, name)
    cfg = slide.Config.from_yaml(path)
    assert cfg.data.train and os.path.isabs(cfg.data.train)
    # data paths are relative to the YAML file
    assert os.path.commonpath([cfg.data.train, DATASETS]) == str(DATASETS)
    stem = name[:-5]
    if stem in ("bibtex", "delicious"):
        cfg.check_files(source=path)
    if stem.startswith("synth-"):
        preset = stem if stem in datasets.PRESETS else stem[len("synth-"):]
        assert preset in datasets.PRESETS
        assert cfg.data.train == os.path.join(DATASETS, "synthetic", preset, "train.txt")


def test_paper_settings_in_configs():
    d = slide.Config.from_yaml(datasets.config_path("delicious-200k"))
    out = d.layers[-1]
    assert (out.sampling, out.lsh.family, out.lsh.K, out.lsh.L) == ("lsh", "simhash", 9, 50)
    assert (d.training.batch_size, d.layers[0].size, d.optimizer.lr) == (128, 128, 1e-4)
    a = slide.Config.from_yaml(datasets.config_path("amazon-670k"))
    out = a.layers[-1]
    assert (out.sampling, out.lsh.family, out.lsh.K, out.lsh.L) == ("lsh", "dwta", 8, 50)
    assert (a.training.batch_size, a.layers[0].size, a.optimizer.lr) == (256, 128, 1e-4)
    assert (a.eval.propensity_a, a.eval.propensity_b) == (0.6, 2.6)
