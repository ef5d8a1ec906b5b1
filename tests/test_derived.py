"""The derived benchmark sets (benchmarks/derived.py, ``suite.py --sets derived``): built from
the shared sets' files as documented, deterministically, test rows kept apart."""
import numpy as np
import scipy.sparse as sp

import slide

from conftest import benchmark_module, dataset_dir


def _source(name):
    d = dataset_dir(name)
    return str(d / "train.txt"), str(d / "test.txt")


def _rows(ds):
    X, Y = ds.features.tocsr(), ds.labels.tocsr()
    return {(tuple(X[i].indices), tuple(np.round(X[i].data, 5)), tuple(Y[i].indices)) for i in range(X.shape[0])}


def test_a_subsample_is_n_training_rows_of_the_set_and_its_whole_test_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIDE_CACHE_DIR", str(tmp_path))
    derived = benchmark_module("derived")
    train, test = derived.paths("bibtex-s400", _source)
    assert train.startswith(str(tmp_path / "derived" / "bibtex-s400"))
    tr, te = slide.load_dataset(train, cache=False), slide.load_dataset(test, cache=False)
    src_tr, src_te = (slide.load_dataset(p, cache=False) for p in _source("bibtex"))
    assert tr.features.shape == (400, src_tr.num_features) and tr.num_labels == src_tr.num_labels
    assert _rows(tr) <= _rows(src_tr)
    assert te.features.shape == src_te.features.shape and _rows(te) == _rows(src_te)
    # the same rows on a second build
    again = tmp_path / "again"
    monkeypatch.setenv("SLIDE_CACHE_DIR", str(again))
    tr2 = slide.load_dataset(derived.paths("bibtex-s400", _source)[0], cache=False)
    assert (tr2.features != tr.features).nnz == 0 and (tr2.labels != tr.labels).nnz == 0


def test_words4k_has_the_documented_shape_and_labels_disjoint_from_features(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIDE_CACHE_DIR", str(tmp_path))
    derived = benchmark_module("derived")
    tr, te = (slide.load_dataset(p, cache=False) for p in derived.paths("words4k", _source))
    assert tr.features.shape == (1053, 5000) and te.features.shape == (3000, 5000)
    assert tr.num_labels == te.num_labels == 4000
    assert np.diff(tr.labels.tocsr().indptr).min() >= 1 and np.diff(tr.features.tocsr().indptr).min() >= 1
    # about 13 labels a point, few positives a label
    assert 10 < tr.labels.nnz / 1053 < 17 and tr.labels.nnz / 4000 < 5
    # no label is a copy of a feature: words that always occur together (as "hong" and "kong")
    # put a feature on exactly a label's points now and then (14 of 4,000 labels); features
    # that held the label words themselves would do so for thousands
    F = (sp.vstack([tr.features, te.features]) > 0).astype(np.float32).tocsr()
    Y = sp.vstack([tr.labels, te.labels]).tocsr()
    C = (Y.T @ F).tocoo()
    ly, fx = np.asarray(Y.sum(axis=0)).ravel(), np.asarray(F.sum(axis=0)).ravel()
    copies = (C.data == ly[C.row]) & (C.data == fx[C.col]) & (ly[C.row] >= 3)
    assert copies.sum() <= 40


def test_generated_sets_have_the_shapes_of_eurlex4k_and_mediamill(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIDE_CACHE_DIR", str(tmp_path))
    suite = benchmark_module("suite")
    assert suite._set_names("generated") == ["gen-eurlex4k", "gen-mediamill"]
    tr, te = (slide.load_dataset(p, cache=False) for p in suite.data_paths("gen-eurlex4k"))
    assert tr.features.shape == (15539, 5000) and te.features.shape == (3809, 5000) and tr.num_labels == 3993
    assert 5.0 < tr.labels.nnz / 15539 < 5.6 and 200 < tr.features.nnz / 15539 < 250
    tr, te = (slide.load_dataset(p, cache=False) for p in suite.data_paths("gen-mediamill"))
    assert tr.features.shape == (30993, 120) and te.features.shape == (12914, 120) and tr.num_labels == 101
    assert tr.features.nnz == 30993 * 120    # dense real-valued: the default standardizes it
    assert slide.scaling.wants_standardize("auto", tr.features)
    # the same rows on a second build
    monkeypatch.setenv("SLIDE_CACHE_DIR", str(tmp_path / "again"))
    again = slide.load_dataset(suite.data_paths("gen-mediamill")[0], cache=False)
    assert abs(again.features - tr.features).max() == 0 and (again.labels != tr.labels).nnz == 0


def test_suite_merge_replaces_the_rows_of_the_sets_and_systems_run_again():
    suite = benchmark_module("suite")
    old = [{"set": "scene", "system": "slide", "P@1": 0.1, "seed": 0}, {"set": "yeast", "system": "slide", "P@1": 0.2},
           {"set": "scene", "system": "torch", "P@1": 0.3}, {"set": "scene", "system": "slide", "P@1": 0.5, "seed": 1}]
    new = [{"set": "scene", "system": "slide", "P@1": 0.4, "seed": 0}]
    # every old seed of (scene, slide) gives way; the peer's row on scene and yeast's row stay
    assert suite.merge_rows(old, new) == [{"set": "yeast", "system": "slide", "P@1": 0.2},
                                          {"set": "scene", "system": "torch", "P@1": 0.3},
                                          {"set": "scene", "system": "slide", "P@1": 0.4, "seed": 0}]


def test_suite_names_the_results_file_of_derived_sets_run_by_name(tmp_path, monkeypatch):
    """--sets densercv (a derived set by name) writes suite_derived*.json, not the 12 sets' file."""
    suite = benchmark_module("suite")
    assert suite._set_names("derived,scene")[-1] == "scene" and "densercv" in suite._set_names("derived")
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(suite, "RESULTS", results / "suite.json")
    for sets, seeds, name in (("densercv", None, "suite_derived.json"), ("densercv,words4k", "0", "suite_derived_seeds.json"),
                              ("scene", "0", "suite_seeds.json"), ("scene,densercv", None, "suite.json")):
        (results / name).write_text('{"rows": [{"set": "x", "system": "slide", "P@1": 0.5, "train_seconds": 1,'
                                    ' "peak_rss_bytes": 1048576, "seed": 0}]}')
        argv = ["--sets", sets, "--table-only"] + (["--seeds", seeds] if seeds else [])
        assert suite.main(argv) == 0
        (results / name).unlink()   # read back from the file of that name (a missing one would raise)
