"""benchmarks/draws.py: changes to the defaults measured on rows held out of a training file."""
import json

import pytest

import slide

from conftest import benchmark_module, dataset_dir


def test_a_variant_and_a_seed_ensemble_are_scored_on_the_same_held_out_rows(tmp_path, capsys):
    dataset_dir("medical")   # skips where the shared sets are missing
    draws = benchmark_module("draws")
    out = tmp_path / "draws.json"
    assert draws.main(["--sets", "medical", "--points", "150", "--held", "150", "--draws", "0",
                       "--variant", 'short={"training": {"epochs": 3}}', "--ensemble", "2", "--single",
                       "--out", str(out), "--threads", "1"]) == 0
    saved = json.loads(out.read_text())
    rows = {r["variant"]: r for r in saved["rows"]}
    assert list(rows) == ["default", "short", "ensemble_2"]
    assert all(r["set"] == "medical" and r["draw"] == 0 and r["held"] == 150 for r in rows.values())
    assert saved["variants"] == {"default": {}, "short": {"training": {"epochs": 3}}} and saved["single"]
    # 150 medical points learn: one thread, 0.8133 for the default of one network and 0.7867 for
    # the ensemble of two on these 150 held-out rows; three epochs without the search reached 0.2933
    assert 0.7 <= rows["default"]["P@1"] <= 0.9
    assert rows["short"]["P@1"] < rows["default"]["P@1"] - 0.2
    assert rows["short"]["refit_epochs"] is None and rows["default"]["best_epoch"] >= 1
    assert 0.7 <= rows["ensemble_2"]["P@1"] <= 0.9
    # the ensemble's cost is its members' training: the default's and one more network's
    assert rows["ensemble_2"]["train_seconds"] > rows["default"]["train_seconds"] > 0
    printed = capsys.readouterr().out
    line = next(s for s in printed.splitlines() if s.startswith("| medical | 1 |"))
    assert f"{rows['short']['P@1']:.4f} ({rows['short']['P@1'] - rows['default']['P@1']:+.4f})" in line
    assert "short: mean change" in printed and "over 1 set, up on 0, down on 1" in printed


def test_ensemble_probabilities_rank_labels_as_predict_does():
    """The seed ensemble averages the scores each network ranks by (its label term included)."""
    draws = benchmark_module("draws")
    Xtr, Ytr, held, _ = slide.datasets.make_synthetic_arrays("tiny", seed=3)
    net = slide.Network({"layers": [{"size": 64}, {"centroid_weight": 4}], "training": {"epochs": 3, "threads": 1}})
    net.fit((Xtr, Ytr))
    assert net.centroid_weight == 4
    P = draws.probabilities(net, held)
    assert P.shape == (100, 20) and ((P >= 0) & (P <= 1)).all()
    top, _ = net.predict(held, k=1)
    assert (P.argmax(axis=1) == top[:, 0]).all()


def test_bad_arguments_say_what_is_wrong(capsys):
    draws = benchmark_module("draws")
    with pytest.raises(Exception, match="expected NAME="):
        draws.parse_variant('{"training": {}}')
    with pytest.raises(Exception, match="not JSON"):
        draws.parse_variant("x={training: 1}")
    with pytest.raises(SystemExit, match="only 300 rows"):
        draws.draw_rows(300, 300, 100, 0)
    with pytest.raises(SystemExit):
        draws.main(["--sets", "medical"])
    assert "nothing to compare" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        draws.main(["--sets", "medical", "--variant", 'typo={"optimizer": {"lr_decay_min_step": 25}}'])
    err = capsys.readouterr().err
    assert "--variant typo" in err and "lr_decay_min_step" in err and "did you mean 'lr_decay_min_steps'" in err
    with pytest.raises(SystemExit, match="--sets no-such-set: no training file at"):
        draws.main(["--sets", "no-such-set", "--ensemble", "2"])
    a, b = draws.draw_rows(1000, 400, 4000, 1)
    assert len(a) == 400 and len(b) == 600 and not set(a) & set(b)


def test_the_dense_net_is_trained_and_scored_on_the_same_rows(tmp_path, capsys):
    """--dense-net: the suite's dense PyTorch network on each draw's rows; on a set the default
    standardizes (yeast) also on the L2-normalised rows alone, on a sparse one (medical) not."""
    pytest.importorskip("torch")
    dataset_dir("yeast")
    draws = benchmark_module("draws")
    out = tmp_path / "draws.json"
    assert draws.main(["--sets", "yeast,medical", "--points", "300", "--held", "300", "--draws", "0",
                       "--dense-net", "--single", "--out", str(out), "--threads", "1"]) == 0
    saved = json.loads(out.read_text())
    assert saved["dense_net"]
    rows = {(r["set"], r["variant"]): r for r in saved["rows"]}
    assert list(rows) == [("yeast", "default"), ("yeast", "dense-net"), ("yeast", "dense-net-l2"),
                          ("medical", "default"), ("medical", "dense-net")]
    assert all(r["points"] == 300 for r in rows.values())
    # the same held-out rows for every system of a set (medical has 333 training rows: 33 left)
    assert {r["held"] for (s, _), r in rows.items() if s == "yeast"} == {300}
    assert {r["held"] for (s, _), r in rows.items() if s == "medical"} == {33}
    # 300 yeast rows learn for both systems (about 0.75 P@1 on the other rows)
    for variant in ("default", "dense-net", "dense-net-l2"):
        assert 0.65 <= rows["yeast", variant]["P@1"] <= 0.85, (variant, rows["yeast", variant]["P@1"])
    printed = capsys.readouterr().out
    # medical has no dense-net-l2 row: "-" in its cell, and the change is over yeast alone
    assert next(line for line in printed.splitlines() if line.startswith("| medical | 1 |")).endswith("| - |")
    assert "over 1 set, " in next(line for line in printed.splitlines() if line.startswith("dense-net-l2: mean change"))
    assert "over 2 sets, " in next(line for line in printed.splitlines() if line.startswith("dense-net: mean change"))


def test_the_xmc_libraries_are_trained_and_scored_on_the_same_rows(tmp_path, capsys):
    """--peers: napkinXC as benchmarks/suite.py runs it, in its own process, on each draw's rows;
    on a set the default standardizes (yeast) also on the L2-normalised rows alone."""
    pytest.importorskip("napkinxc")
    dataset_dir("yeast")
    draws = benchmark_module("draws")
    out = tmp_path / "draws.json"
    assert draws.main(["--sets", "yeast", "--points", "300", "--held", "300", "--draws", "0",
                       "--peers", "napkinxc", "--single", "--out", str(out), "--threads", "1"]) == 0
    saved = json.loads(out.read_text())
    assert saved["peers"] == ["napkinxc"]
    rows = {r["variant"]: r for r in saved["rows"]}
    assert list(rows) == ["default", "napkinxc", "napkinxc-l2"]
    assert {(r["points"], r["held"]) for r in rows.values()} == {(300, 300)}
    # 300 yeast rows learn for both (one thread: slide 0.7333, the tree 0.7133 and 0.7100 on L2 rows)
    for variant, r in rows.items():
        assert 0.65 <= r["P@1"] <= 0.85, (variant, r["P@1"])
        assert r["train_seconds"] > 0
    # napkinXC's tree differs from slide's network on these rows: not a copy of the default's row
    assert rows["napkinxc"]["P@1"] != rows["default"]["P@1"]
    printed = capsys.readouterr().out
    assert "napkinxc: mean change" in printed and "napkinxc-l2: mean change" in printed


def test_peer_arguments_say_what_is_wrong(capsys, monkeypatch):
    draws = benchmark_module("draws")
    monkeypatch.delenv("SLIDE_PECOS_PYTHON", raising=False)
    with pytest.raises(SystemExit):
        draws.main(["--sets", "medical", "--peers", "napkinxc,liblinear"])
    assert "--peers liblinear: expected some of napkinxc, pecos" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        draws.main(["--sets", "medical", "--peers", "pecos"])
    assert "--peers pecos needs --pecos-python" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown peer 'torch'"):
        draws.peer_worker("torch", "/nonexistent", 1, 0)
