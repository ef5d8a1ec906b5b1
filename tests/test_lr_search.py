"""epochs=auto on a small problem also chooses the learning rate on the validation split
(slide.lr_search): the rates tried, the one kept, the refit it drives, and when it is skipped."""
import numpy as np
import pytest

import slide
from slide import lr_search
from slide.config import ConfigError
from slide.network import Network

from test_network import make_problem


@pytest.fixture(scope="module")
def data():
    X, Y = make_problem(n=700, seed=4)
    return (X[:500], Y[:500]), (X[500:], Y[500:])


def auto(lr, factors, **training):
    # centroid_weight 0: the network alone (the centroid term would rescue a rate that barely learns)
    return Network({"layers": [{"size": 32}, {"size": None, "activation": "auto", "sampling": "auto",
                                                "centroid_weight": 0}],
                    "optimizer": {"lr": lr, "lr_search": factors},
                    "training": dict({"threads": 1, "seed": 3, "batch_size": 32, "dropout": 0.0}, **training)})


def p1(net, test):
    top, _ = net.predict(test[0], k=1)
    return slide.metrics.evaluate(top, test[1], k=(1,))["P@1"]


def test_a_much_better_rate_is_found_and_refit_with(data):
    train, test = data
    net = auto(2e-5, [200.0])                       # 2e-5 barely moves in the search; 4e-3 learns
    history = net.fit(train)
    tried = history.lr_search
    assert [t["lr"] for t in tried] == pytest.approx([2e-5, 4e-3])
    assert tried[1]["best_valid_P@1"] > tried[0]["best_valid_P@1"] + 0.1
    assert net.config.optimizer.lr == pytest.approx(4e-3)
    # the refit trains for the chosen search's best epoch count, at its learning rates
    assert history.best_epoch == tried[1]["best_epoch"]
    assert history.refit_epochs == int(np.ceil(tried[1]["best_epoch"]))
    refit_lrs = [r["lr"] for r in history.records if r.get("phase") == "refit"]
    assert refit_lrs and refit_lrs[0] == pytest.approx(4e-3)
    alone = auto(2e-5, [])
    alone.fit(train)
    assert alone.history.lr_search == [] and alone.config.optimizer.lr == pytest.approx(2e-5)
    assert p1(net, test) > p1(alone, test) + 0.1


def test_the_configured_rate_stays_without_a_clear_lead(data):
    train, _ = data
    net = auto(4e-3, [1.0])                          # the same rate again: the same search, a tie
    history = net.fit(train)
    a, b = history.lr_search
    assert a["best_valid_P@1"] == b["best_valid_P@1"] and a["best_epoch"] == b["best_epoch"]
    assert net.config.optimizer.lr == pytest.approx(4e-3)


def test_skipped_for_a_costly_search_a_time_budget_or_fixed_epochs(data, monkeypatch):
    train, _ = data
    monkeypatch.setattr(lr_search, "LR_SEARCH_MAX_WORK", 0.0)
    net = auto(2e-5, [200.0])
    assert net.fit(train).lr_search == [] and net.config.optimizer.lr == pytest.approx(2e-5)
    monkeypatch.undo()
    budgeted = auto(2e-5, [200.0], time_budget=30.0)
    assert budgeted.fit(train).lr_search == []
    fixed = auto(2e-5, [200.0], epochs=2)
    assert fixed.fit(train).lr_search == [] and fixed.config.optimizer.lr == pytest.approx(2e-5)


@pytest.mark.parametrize("bad", [[0.0], [-1.0], [True], [float("inf")]])
def test_bad_factors_name_the_key(bad):
    with pytest.raises(ConfigError, match="optimizer.lr_search"):
        slide.Config.from_dict({"optimizer": {"lr_search": bad}})


def test_ctrl_c_during_the_extra_searches_leaves_a_resumable_refit(data, monkeypatch):
    train, test = data
    real_fit = Network.fit

    def fit(self, *a, **kw):   # the extra searches' networks (lr_search off, validation given) stop
        if self.config.optimizer.lr_search == [] and kw.get("valid") is not None:
            raise KeyboardInterrupt
        return real_fit(self, *a, **kw)

    monkeypatch.setattr(Network, "fit", fit)
    net = auto(4e-3, [0.5, 2.0])
    with pytest.raises(KeyboardInterrupt):
        net.fit(train)
    monkeypatch.undo()
    assert net._phase == "refit" and net.built and net.step == 0
    assert net.config.optimizer.lr == pytest.approx(4e-3)
    searched = net.total_steps
    assert searched > 0
    net.fit(train)                                    # continues with the refit at the configured rate
    assert net._phase == "done" and net.epoch == net.history.refit_epochs >= 1
    assert net.total_steps > searched and p1(net, test) > 0.5


@pytest.mark.parametrize("gained, lost, switches", [(6, 0, True), (3, 2, False), (7, 3, True), (5, 4, False)])
def test_another_rate_is_kept_only_by_one_standard_error_of_the_paired_difference(data, monkeypatch, gained, lost,
                                                                                   switches):
    """The rate searched at twice the configured one (a repeat of the same search, bit for bit at
    one thread) is made right on `gained` validation rows where the configured rate's best epoch
    is wrong and wrong on `lost` where it is right: it leads by gained - lost points, and is kept
    only when gained - lost >= sqrt(gained + lost)."""
    train, _ = data
    real_fit = Network.fit

    def fit(self, *a, **kw):
        out = real_fit(self, *a, **kw)
        if self.config.optimizer.lr_search == [] and kw.get("valid") is not None:
            hits = self._best_hits.copy()
            wrong, right = np.flatnonzero(~hits), np.flatnonzero(hits)
            hits[wrong[:gained]], hits[right[:lost]] = True, False
            self._best_hits, self._best_score = hits, float(hits.mean())
        return out

    monkeypatch.setattr(Network, "fit", fit)
    net = auto(2e-3, [1.0])     # validation P@1 0.92; factor 1: the same search again, moved as above
    tried = net.fit(train).lr_search
    assert tried[1]["best_valid_P@1"] == pytest.approx(tried[0]["best_valid_P@1"] + (gained - lost) / 100)
    assert (tried[1]["right_where_configured_wrong"], tried[1]["wrong_where_configured_right"]) == (gained, lost)
    # a switch adopts the other search's trace; factor 1 keeps the rate's value either way
    assert net._best_score == pytest.approx(tried[1 if switches else 0]["best_valid_P@1"])


def test_the_search_books_which_validation_rows_its_best_epoch_ranks_right(data, tmp_path):
    train, valid = data
    net = auto(4e-3, [])
    net.fit(train, valid=valid, epochs="auto")
    assert net._best_hits is not None and net._best_hits.dtype == bool and len(net._best_hits) == 200
    assert net._best_hits.mean() == pytest.approx(net._best_score)


def test_a_search_interrupted_and_resumed_compares_the_rates_as_an_uninterrupted_one(data, tmp_path):
    """Which validation rows the search's best epoch ranks right is part of a checkpoint: the
    rate searches after a resume compare against the same rows (b and c) as without the stop."""
    from slide import callbacks

    train, _ = data
    full = auto(2e-3, [2.0])
    h = full.fit(train)
    part = auto(2e-3, [2.0])
    part.fit(train, callbacks=[callbacks.StopAfter(h.lr_search[0]["best_epoch"] * 13 + 2)])
    assert part._phase == "search" and part._best_hits is not None
    part.save(tmp_path / "part.npz")
    resumed = Network.load(tmp_path / "part.npz")
    np.testing.assert_array_equal(resumed._best_hits, part._best_hits)
    assert resumed.fit(train).lr_search == h.lr_search
    assert resumed.config.optimizer.lr == full.config.optimizer.lr


# ---------------------------------------------------------------------- training.monitor

def test_monitor_p3_keeps_the_epoch_of_the_best_validation_p3(data):
    """training.monitor: P@3 — the search's best epoch, its score and the refit's length follow
    validation P@3, and the rate search compares per-row top-3 hits."""
    train, _ = data
    net = auto(4e-3, [], monitor="P@3")
    net.config.optimizer.lr_decay_min_steps = 1     # no early-best rule: every epoch can be the best
    history = net.fit(train)
    search = [r for r in history.records if r.get("phase") == "search"]
    scores = [r["valid/P@3"] for r in search]
    assert history.best_score == max(scores) != max(r["valid/P@1"] for r in search)
    assert history.best_epoch == search[scores.index(max(scores))]["epoch"]
    assert history.refit_epochs == int(np.ceil(history.best_epoch))
    # the rate search: its records name the monitor, b and c count true labels in the rows' top 3
    net = auto(4e-3, [2.0], monitor="P@3")
    history = net.fit(train)
    a, b = history.lr_search
    search = [r for r in history.records if r.get("phase") == "search"]
    assert "best_valid_P@1" not in a and a["best_valid_P@3"] == max(r["valid/P@3"] for r in search)
    assert isinstance(b["right_where_configured_wrong"], int) and isinstance(b["wrong_where_configured_right"], int)
    assert b["right_where_configured_wrong"] + b["wrong_where_configured_right"] > 0


def test_monitor_hits_are_the_true_labels_in_each_rows_top_k_and_survive_a_checkpoint(data, tmp_path):
    from slide import callbacks

    train, valid = data
    net = auto(4e-3, [], monitor="P@5")
    net.fit(train, valid=valid, epochs="auto", callbacks=[callbacks.StopAfter(40)])
    assert net._phase == "search" and net._best_hits.dtype == np.int64 and len(net._best_hits) == 200
    assert net._best_hits.max() > 1 and net._best_hits.max() <= 5
    assert net._best_hits.sum() / (5 * 200) == pytest.approx(net._best_score)
    net.save(tmp_path / "part.npz")
    back = Network.load(tmp_path / "part.npz")
    np.testing.assert_array_equal(back._best_hits, net._best_hits)
    assert back.config.training.monitor == "P@5"


@pytest.mark.parametrize("monitor", ["P@2", "nDCG@5", "p@1", "P@0", 1])
def test_a_monitor_outside_eval_k_is_refused_by_name(monitor):
    with pytest.raises(ConfigError, match=r"training\.monitor"):
        auto(4e-3, [], monitor=monitor)


def test_clear_gain_on_counts_is_the_paired_rule_on_rows():
    from slide._util import clear_gain

    base = np.array([1, 0, 1, 0, 1, 0], dtype=bool)
    other = np.array([1, 1, 1, 1, 0, 0], dtype=bool)
    assert clear_gain(other, base) == (False, 2, 1)          # 2 - 1 < sqrt(3)
    assert clear_gain(other.astype(np.int64), base.astype(np.int64)) == (False, 2, 1)
    # top-3 hits: +2, +2, +1 on three rows, -1 on one: 5 - 1 = 4 >= sqrt(4 + 4 + 1 + 1)
    assert clear_gain(np.array([3, 2, 1, 0]), np.array([1, 0, 0, 1])) == (True, 5, 1)
    assert clear_gain(np.array([3, 0, 0, 0]), np.array([0, 1, 0, 0])) == (False, 3, 1)  # 2 < sqrt(9 + 1)
