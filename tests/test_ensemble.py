"""training.ensemble (slide.ensemble): networks of epochs=auto merged into one network that ranks
labels by the mean of their scores; the auto rule, the network file, errors and Ctrl-C."""
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide import centroids, ensemble
from slide.config import ConfigError

from conftest import load_split
from test_centroids import _problem as _prototype_problem


def _problem(n=400, d=120, L=12, seed=0):
    """Rows near one of L prototypes, labelled with it (tests/test_centroids.py)."""
    return _prototype_problem(n=n, d=d, L=L, seed=seed)


def _scores(net, X):
    """Every label's score as the network ranks by (``z + w * cos``), float64, rows x labels."""
    L = int(net.num_labels)
    arrays = net._convert(sp.csr_matrix(X), None)
    out = np.zeros((X.shape[0], L))
    if net.centroid_weight:
        for s, e, _, _, z, sv in centroids.pools(net, arrays, net._centroids, "exact", 1):
            out[s:e] = (z.astype(np.float64) + net.centroid_weight * sv).reshape(e - s, L)
    else:
        for s, e, ip, ix, xv in centroids._chunks(arrays, 512):
            out[s:e] = centroids._all_logits(net._core, ip, ix, xv, e - s, L).reshape(e - s, L)
    return out


def test_medical_default_merges_three_networks_that_rank_by_their_mean(tmp_path):
    """medical (333 training points) is cheap: ensemble auto trains three networks (seeds 0,
    1000, 2000), each with its own search, rate and label term, and the merged network scores
    every label as the mean of the three networks trained alone. Measured (1 thread): test P@1
    0.8496, 0.8465 and 0.8341 alone, 0.8481 merged (2 threads over seeds 0-4: see
    benchmarks/README.md)."""
    train, test = load_split("medical")
    net = slide.Network(threads=1)
    h = net.fit(train)
    assert [m["seed"] for m in h.ensemble] == [0, 1000, 2000]
    assert all(m["best_epoch"] and m["refit_epochs"] for m in h.ensemble)
    assert net.config.layers[0].size == 3 * 1024 and net.config.training.ensemble == 1
    assert h.centroid_weight == pytest.approx(np.mean([m["centroid_weight"] for m in h.ensemble]))
    assert h.centroid_kind == net.centroid_kind
    alone, steps = [], 0
    for seed in (0, 1000, 2000):
        m = slide.Network(threads=1, seed=seed, ensemble=1)
        m.fit(train)
        alone.append(_scores(m, test.features))
        steps += m.total_steps
    assert net.total_steps == steps   # every network's batches count in the run
    mean = sum(alone) / 3
    merged = _scores(net, test.features)
    np.testing.assert_allclose(merged, mean, atol=1e-3 * np.abs(mean).max())
    top, _ = net.predict(test, k=5)
    assert (top[:, 0] == np.argmax(mean, axis=1)).mean() > 0.99
    p1 = net.evaluate(test)["P@1"]
    assert 0.835 <= p1 <= 0.875
    net.save(tmp_path / "m.npz")
    loaded = slide.Network.load(tmp_path / "m.npz")
    assert loaded.config.layers[0].size == 3072 and loaded.history.ensemble == h.ensemble
    assert loaded.evaluate(test)["P@1"] == p1
    assert (loaded.predict(test, k=5)[0] == top).all()


@pytest.mark.parametrize("layers", [
    [{"size": 16}, {"size": 8}, {"size": None}],
    [{"size": None}],
], ids=["two-hidden", "no-hidden"])
def test_merged_scores_are_the_mean_for_any_depth(layers):
    """Block-diagonal hidden layers, or the mean of linear output layers: the merged network's
    scores are the mean of the networks trained alone (label term off to check the layers)."""
    X, Y = _problem()
    cfg = {"layers": layers, "training": {"max_epochs": 6, "ensemble": 2}}
    cfg["layers"][-1]["centroid_weight"] = 0
    net = slide.Network(cfg, threads=1)
    net.fit((X, Y))
    assert [m["seed"] for m in net.history.ensemble] == [0, 1000]
    alone = []
    for seed in (0, 1000):
        m = slide.Network(cfg, threads=1, seed=seed, ensemble=1)
        m.fit((X, Y))
        alone.append(_scores(m, X))
    np.testing.assert_allclose(_scores(net, X), (alone[0] + alone[1]) / 2, atol=1e-4)
    sizes = [layer["size"] for layer in layers[:-1]]
    assert [int(layer.size) for layer in net.config.layers[:-1]] == [2 * s for s in sizes]


def test_label_terms_of_different_kinds_merge_into_one_mixed_term(tmp_path):
    C_mean = sp.csr_matrix(np.array([[0.6, 0.0], [0.8, 1.0]], np.float32))
    C_ridge = np.array([[0.2, -0.1], [0.3, 0.5]], np.float32)
    nets = [SimpleNamespace(_centroid_weight=2.0, _centroid_kind="mean", _ridge_lambda=None, _centroids=C_mean),
            SimpleNamespace(_centroid_weight=4.0, _centroid_kind="ridge", _ridge_lambda=0.3, _centroids=C_ridge),
            SimpleNamespace(_centroid_weight=0.0, _centroid_kind=None, _ridge_lambda=None, _centroids=None)]
    weight, kind, lam, C = ensemble.merged_label_term(nets)
    assert (weight, kind, lam) == (2.0, "mixed", None)
    # weight * C is the mean over the three networks of w_i * C_i
    np.testing.assert_allclose(weight * C, (2 * C_mean.toarray() + 4 * C_ridge) / 3, rtol=1e-6)
    same = ensemble.merged_label_term([nets[1], nets[1], nets[2]])
    assert same[:3] == (8.0 / 3, "ridge", 0.3) and same[3] is C_ridge
    assert ensemble.merged_label_term([nets[2]]) == (0.0, None, None, None)

    # a mixed term is kept by the network file
    X, Y = _problem(d=2 * 60, L=2, seed=1)
    net = slide.Network({"layers": [{"size": 8}, {"size": None}]}, epochs=1, threads=1)
    net.fit((X, Y))
    rng = np.random.default_rng(0)
    net._centroids = rng.normal(size=(X.shape[1], 2)).astype(np.float32)
    net._centroid_kind, net._centroid_weight = "mixed", 1.5
    before = net.predict(X, k=2)
    net.save(tmp_path / "mixed.npz")
    loaded = slide.Network.load(tmp_path / "mixed.npz")
    assert loaded.centroid_kind == "mixed" and isinstance(loaded._centroids, np.ndarray)
    after = loaded.predict(X, k=2)
    assert (after[0] == before[0]).all()
    np.testing.assert_allclose(after[1], before[1], rtol=1e-5)


def test_auto_trains_one_network_past_the_work_limit_or_with_a_time_budget(monkeypatch, caplog):
    X, Y = _problem(seed=2)
    cfg = {"layers": [{"size": 16}, {"size": None}], "training": {"max_epochs": 4}}
    net = slide.Network(cfg, threads=1)
    net.fit((X, Y))
    assert len(net.history.ensemble) == ensemble.AUTO_NETWORKS and net.config.layers[0].size == 48
    monkeypatch.setattr(ensemble, "AUTO_MAX_WORK", 1.0)
    net = slide.Network(cfg, threads=1)
    with caplog.at_level(logging.INFO, logger="slide"):
        net.fit((X, Y))
    assert net.history.ensemble == [] and net.config.layers[0].size == 16
    assert "ensemble: one network" in caplog.text
    monkeypatch.undo()
    net = slide.Network(cfg, threads=1, time_budget=60)
    net.fit((X, Y))
    assert net.history.ensemble == [] and net.config.layers[0].size == 16
    # a count asked for is trained past the limit
    monkeypatch.setattr(ensemble, "AUTO_MAX_WORK", 1.0)
    net = slide.Network(cfg, threads=1, ensemble=2)
    net.fit((X, Y))
    assert len(net.history.ensemble) == 2 and net.config.layers[0].size == 32


def test_bad_settings_are_refused_with_the_key():
    X, Y = _problem(n=100)
    with pytest.raises(ConfigError, match="training.ensemble: 2 networks are trained with epochs: auto"):
        slide.Network(ensemble=2, epochs=3).fit((X, Y))
    for bad in (0, 17, "many", 1.5):
        with pytest.raises(ConfigError, match="training.ensemble"):
            slide.Network(ensemble=bad)
    # one network with a count of epochs is the plain network
    net = slide.Network({"layers": [{"size": 8}, {"size": None}]}, ensemble=1, epochs=1, threads=1)
    net.fit((X, Y))
    assert net.history.ensemble == []


def test_ctrl_c_while_the_other_networks_train_keeps_the_first(monkeypatch, tmp_path):
    """The first network is trained and usable; fit(epochs='auto') again trains the others."""
    X, Y = _problem(seed=3)
    cfg = {"layers": [{"size": 16}, {"size": None}], "training": {"max_epochs": 4, "ensemble": 2}}
    real_merge = ensemble.merge

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(ensemble, "merge", interrupted)
    net = slide.Network(cfg, threads=1)
    with pytest.raises(KeyboardInterrupt):
        net.fit((X, Y))
    assert net.history.interrupted and net.config.layers[0].size == 16
    first = net.predict(X, k=3)[0]
    net.save(tmp_path / "first.npz")
    monkeypatch.setattr(ensemble, "merge", real_merge)
    loaded = slide.Network.load(tmp_path / "first.npz")
    assert (loaded.predict(X, k=3)[0] == first).all()
    h = loaded.fit((X, Y), epochs="auto")
    assert [m["seed"] for m in h.ensemble] == [0, 1000] and loaded.config.layers[0].size == 32
    whole = slide.Network(cfg, threads=1)
    whole.fit((X, Y))
    assert (whole.predict(X, k=3)[0] == loaded.predict(X, k=3)[0]).all()


def _dense_problem(signal_scale, noise_scale, n=500, signal=6, noise=150, L=5, seed=0):
    """Dense real-valued rows: ``signal`` features that place a row near its label's prototype
    (one label a row) and ``noise`` features of pure noise, at the given scales. Standardizing
    puts the two kinds on one scale: it helps when the signal is the small one and hurts when the
    noise is (then the network fits the noise of many more features)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(L, size=n)
    protos = rng.normal(size=(L, signal))
    Xs = (protos[labels] + 0.8 * rng.normal(size=(n, signal))) * signal_scale
    Xn = rng.normal(size=(n, noise)) * noise_scale
    X = sp.csr_matrix(np.hstack([Xs, Xn]).astype(np.float32))
    Y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), labels)), shape=(n, L))
    return X, Y


@pytest.mark.parametrize("signal_scale,noise_scale,chosen", [
    (1.0, 0.001, "raw"),
    (0.001, 1.0, "standardized"),
], ids=["small-noise", "small-signal"])
def test_dense_input_chooses_standardization_on_the_networks_validation(tmp_path, signal_scale,
                                                                         noise_scale, chosen):
    """data.standardize auto on dense input, in an ensemble: as many networks again train on the
    rows without standardization (same seeds, same validation splits); the side with the higher
    summed best validation P@1 is merged, its scores the mean of its networks trained alone. Only
    the chosen side's refits train (and the first network's, done before the vote): the run counts
    those and the other side's searches."""
    X, Y = _dense_problem(signal_scale, noise_scale)
    cfg = {"layers": [{"size": 32}, {"size": None}], "training": {"max_epochs": 12, "ensemble": 2}}
    net = slide.Network(cfg, threads=1)
    h = net.fit((X, Y))
    choice = h.standardize_choice
    assert len(choice["standardized"]) == len(choice["raw"]) == 2
    assert choice["chosen"] == chosen
    assert (sum(choice["raw"]) > sum(choice["standardized"])) == (chosen == "raw")
    assert net.standardized == (chosen == "standardized")
    assert [m["standardized"] for m in h.ensemble] == [chosen == "standardized"] * 2
    assert net.config.layers[0].size == 64
    alone, steps = {}, 0
    for std in (True, False):
        for seed in (0, 1000):
            m = slide.Network(cfg, threads=1, seed=seed, ensemble=1, standardize=std)
            m.fit((X, Y))
            refit_trained = std == (chosen == "standardized") or (std and seed == 0)
            steps += m.total_steps if refit_trained else m.total_steps - m.step   # the search's
            if std == (chosen == "standardized"):
                alone.setdefault("scores", []).append(_scores(m, X))
                assert m._best_score == pytest.approx(choice[chosen][seed // 1000])
    assert net.total_steps == steps
    mean = sum(alone["scores"]) / 2
    np.testing.assert_allclose(_scores(net, X), mean, atol=1e-3 * np.abs(mean).max())
    net.save(tmp_path / "m.npz")
    loaded = slide.Network.load(tmp_path / "m.npz")
    assert loaded.history.standardize_choice == choice and loaded.standardized == net.standardized
    assert (loaded.predict(X, k=3)[0] == net.predict(X, k=3)[0]).all()


def test_a_paused_network_finishes_as_one_trained_straight():
    """The vote's networks stop when their refit is ready to start; the refit trained later gives
    the same network (one thread: the same bits) and one run's history, search records first."""
    X, Y = _dense_problem(1.0, 0.001, n=300)
    cfg = slide.Config.from_dict({"layers": [{"size": 16}, {"size": None}],
                                  "training": {"max_epochs": 8, "ensemble": 1, "threads": 1}})
    base = slide.Network(cfg)
    straight = ensemble._train_network(base, 1000, (X, Y), None, False, "straight")
    paused = ensemble._train_network(base, 1000, (X, Y), None, False, "paused", pause=True)
    assert paused._phase == "refit" and paused.step == 0 and straight._phase == "done"
    assert paused.total_steps == straight.total_steps - straight.step   # the search's batches
    assert {r["phase"] for r in paused.history.records} == {"search"}
    ensemble._finish(paused, (X, Y), None, False)
    assert paused._phase == "done" and paused.total_steps == straight.total_steps
    a, b = straight._core.parameters(), paused._core.parameters()
    assert all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
    drop = ("seconds", "samples_per_second")
    assert ([{k: v for k, v in r.items() if k not in drop} for r in paused.history.records]
            == [{k: v for k, v in r.items() if k not in drop} for r in straight.history.records])
    for key in ("best_epoch", "best_score", "refit_epochs", "lr_search", "centroid_weight",
                "centroid_search", "centroid_kind", "stopped_early"):
        assert getattr(paused.history, key) == getattr(straight.history, key), key


def test_auto_votes_only_where_both_sides_fit_the_work_of_three_networks(monkeypatch, caplog):
    """ensemble auto: a first run above VOTE_MAX_WORK keeps standardization without a vote (three
    networks, as before the vote), so that the vote cannot take a run past a minute."""
    X, Y = _dense_problem(1.0, 0.001, n=300)
    cfg = {"layers": [{"size": 16}, {"size": None}], "training": {"max_epochs": 4, "threads": 1}}
    monkeypatch.setattr(ensemble, "VOTE_MAX_WORK", 1.0)
    with caplog.at_level(logging.INFO, logger="slide"):
        h = slide.Network(cfg).fit((X, Y))
    assert h.standardize_choice == {} and len(h.ensemble) == 3
    assert all(m["standardized"] for m in h.ensemble)
    assert "kept without a vote" in caplog.text and "votes up to 1.0e+00" in caplog.text
    monkeypatch.undo()
    h = slide.Network(cfg).fit((X, Y))   # the same run within the limit votes
    assert len(h.standardize_choice["raw"]) == 3


def test_standardization_set_by_hand_is_not_chosen_again():
    X, Y = _dense_problem(1.0, 0.001, n=300)
    cfg = {"layers": [{"size": 16}, {"size": None}], "training": {"max_epochs": 4, "ensemble": 2}}
    for std in (True, False):
        net = slide.Network(cfg, threads=1, standardize=std)
        h = net.fit((X, Y))
        assert h.standardize_choice == {} and len(h.ensemble) == 2 and net.standardized == std


def test_slide_train_names_the_standardization_it_chose(tmp_path):
    """The CLI line after training and summary.json say which side validation chose, with the
    summed scores of both."""
    import json

    from conftest import run_cli

    X, Y = _dense_problem(1.0, 0.001, n=300)
    slide.Dataset(X, Y).save(tmp_path / "train.txt")
    (tmp_path / "c.yaml").write_text("data: {train: train.txt}\nlayers: [{size: 16}, {size: null}]\n"
                                     "training: {max_epochs: 6, ensemble: 2, threads: 1}\n")
    r = run_cli("train", tmp_path / "c.yaml", "--quiet", "--out", tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    choice = summary["standardize_choice"]
    raw, std = sum(choice["raw"]), sum(choice["standardized"])
    assert summary["standardized"] is (choice["chosen"] == "standardized")
    said = "not standardized" if choice["chosen"] == "raw" else "standardized"
    assert (f"features {said} (by validation: P@1 summed over 2 networks {std:.4f} standardized, "
            f"{raw:.4f} without)") in r.stdout
