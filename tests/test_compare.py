"""``slide compare``: slide and a baseline trained on the same data, measured the same way."""
import importlib.util
import json
import os
import sys

import pytest

from slide.config import ConfigError

from conftest import BIBTEX, benchmark_module

SYSTEM_KEYS = {"train_seconds", "samples", "samples_per_second", "best_P@1", "best_P@1_seconds",
               "final", "peak_rss_bytes", "rss_growth_bytes", "threads"}
COMPARISON_KEYS = {"target_P@1", "slide_seconds_to_target", "baseline_seconds_to_target",
                   "time_to_target_speedup", "samples_per_second_ratio", "peak_rss_ratio",
                   "p_at_1_at_marks"}


def _config(**training):
    return {"data": {"train": os.path.join(BIBTEX, "train.txt"), "test": os.path.join(BIBTEX, "test.txt")},
            "layers": [{"size": 128, "activation": "relu", "sampling": "dense"}, {"activation": "softmax"}],
            "training": {"threads": 1, "dropout": 0.0, **training}, "optimizer": {"lr": 3e-3}}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="compare --baseline torch needs torch: pip install -e '.[test,torch]'")
def test_compare_writes_json_table_and_plot(tmp_path):
    from slide.baselines.compare import run_compare

    marks = [0.4, 0.8, 1.5]
    out = tmp_path / "cmp"
    r = run_compare(_config(), baseline="torch", budget_seconds=1.5, device="cpu", out_dir=out,
                    marks=marks, progress=False, eval_samples=600)
    on_disk = json.loads((out / "compare.json").read_text())
    assert on_disk == json.loads(json.dumps(r))  # the return value is what was written
    assert {"version", "baseline", "budget_seconds", "marks", "device", "dataset", "config",
            "systems", "comparison", "table", "plot"} <= set(r)
    assert r["marks"] == marks and r["device"] == "cpu" and r["baseline"] == "torch"
    assert r["dataset"]["name"] == "bibtex" and r["dataset"]["eval_points"] == 600
    assert r["dataset"]["num_labels"] == 159 and r["dataset"]["train_points"] == 4880
    for name in ("slide", "torch"):
        s = r["systems"][name]
        assert "error" not in s, s.get("error")
        assert s["name"] == name and SYSTEM_KEYS <= set(s["summary"])
        # one evaluation per mark, each at or just past its mark, with the shared metric keys
        assert [rec["mark"] for rec in s["records"]] == marks
        for rec in s["records"]:
            assert rec["seconds"] >= rec["mark"] - 1e-6
            assert {"P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "samples_per_second", "loss"} <= set(rec)
            assert 0.0 <= rec["P@5"] <= rec["P@1"] <= 1.0
        summary = s["summary"]
        assert summary["samples"] > 0 and summary["samples_per_second"] > 0
        assert summary["peak_rss_bytes"] > summary["rss_growth_bytes"] >= 0
        assert 1.5 <= summary["train_seconds"] < 5.0
        # slide and the dense network both beat the most-frequent-label P@1 (0.136) quickly
        assert summary["best_P@1"] > 0.15
    c = r["comparison"]
    assert COMPARISON_KEYS <= set(c)
    assert c["target_P@1"] == r["systems"]["torch"]["summary"]["best_P@1"]
    assert [row["mark"] for row in c["p_at_1_at_marks"]] == marks
    t = c["slide_seconds_to_target"]
    slide_p1 = [rec["P@1"] for rec in r["systems"]["slide"]["records"]]
    assert (t is None) == (max(slide_p1) < c["target_P@1"])
    assert "samples/s" in r["table"] and "peak RSS" in r["table"] and "P@1" in r["table"]
    png = out / "compare.png"
    assert r["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_needs_a_test_set_and_existing_files(tmp_path):
    from slide.baselines.compare import run_compare

    cfg = _config()
    cfg["data"]["test"] = None
    with pytest.raises(ConfigError, match="data.test"):
        run_compare(cfg, budget_seconds=1, out_dir=tmp_path, progress=False)
    cfg = _config()
    cfg["data"]["train"] = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match=r"data\.train.*missing\.txt"):
        run_compare(cfg, budget_seconds=1, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="baseline must be one of torch, pecos, napkinxc"):
        run_compare(_config(), baseline="tensorflow", out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="budget_seconds"):
        run_compare(_config(), budget_seconds=0, out_dir=tmp_path, progress=False)
    assert not (tmp_path / "compare.json").exists()


def test_compare_without_torch_fails_before_training(tmp_path, monkeypatch):
    from slide.baselines.compare import run_compare

    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees when it is missing
    with pytest.raises(ImportError, match=r"pip install slide\[torch\]"):
        run_compare(_config(), baseline="torch", budget_seconds=1, out_dir=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_compare_without_pecos_fails_before_training(tmp_path, monkeypatch):
    from slide.baselines.compare import run_compare

    monkeypatch.setitem(sys.modules, "pecos", None)
    with pytest.raises(ImportError, match=r"pip install slide\[pecos\]"):
        run_compare(_config(), baseline="pecos", budget_seconds=1, out_dir=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_compare_without_napkinxc_fails_before_training(tmp_path, monkeypatch):
    from slide.baselines.compare import run_compare

    for name in ("napkinxc", "napkinxc.models"):   # also when an earlier test imported it
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install slide\[napkinxc\]"):
        run_compare(_config(), baseline="napkinxc", budget_seconds=1, out_dir=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_compare_against_napkinxc_in_process(tmp_path):
    pytest.importorskip("napkinxc", reason="napkinxc is not installed (pip install slide[napkinxc])")
    from slide.baselines.compare import run_compare
    from slide.data import load_dataset

    train = load_dataset(os.path.join(BIBTEX, "train.txt"))[:2000]
    test = load_dataset(os.path.join(BIBTEX, "test.txt"))[:300]
    cfg = _config()
    cfg["data"]["train"] = cfg["data"]["test"] = None
    r = run_compare(cfg, baseline="napkinxc", budget_seconds=0.5, out_dir=tmp_path, marks=[0.5],
                    progress=False, train=train, test=test, isolate=False)
    assert r["baseline"] == "napkinxc" and r["device"] == "cpu"
    s = r["systems"]["napkinxc"]
    assert "error" not in s, s.get("error")
    [rec] = s["records"]                  # trained in one call: one record, at the end
    assert rec["mark"] is None and rec["samples"] == 2000 and rec["loss"] is None
    assert 0.3 < rec["P@1"] <= 1.0 and s["summary"]["best_P@1"] == rec["P@1"]
    assert s["summary"]["params"]["model"] == "napkinxc.PLT"
    c = r["comparison"]
    assert c["target_P@1"] == rec["P@1"] and c["samples_per_second_ratio"] is None
    assert "napkinxc trains in one call" in r["table"]


def test_the_harness_is_outside_the_core_import_path():
    import subprocess

    code = "import slide, sys; print(sorted(m for m in sys.modules if 'compare' in m))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    sys.modules.pop("slide.compare", None)
    with pytest.warns(DeprecationWarning, match="slide.baselines.compare"):
        import slide.compare as old
    from slide.baselines import compare
    assert old.run_compare is compare.run_compare and old.BASELINES == compare.BASELINES


def test_default_marks_cover_the_budget_densely_early():
    from slide.baselines.compare import default_marks

    m = default_marks(600)
    assert m[0] < 30 and m[-1] == 600 and m == sorted(set(m))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="compare --baseline torch needs torch: pip install -e '.[test,torch]'")
def test_compare_in_process_on_in_memory_datasets(tmp_path):
    from slide.baselines.compare import run_compare
    from slide.data import load_dataset

    train = load_dataset(os.path.join(BIBTEX, "train.txt"))[:2000]
    test = load_dataset(os.path.join(BIBTEX, "test.txt"))[:300]
    cfg = _config()
    cfg["data"]["train"] = cfg["data"]["test"] = None
    r = run_compare(cfg, budget_seconds=0.8, device="cpu", out_dir=tmp_path, marks=[0.4, 0.8],
                    progress=False, train=train, test=test, isolate=False, dataset_name="bibtex-2000")
    assert r["dataset"]["name"] == "bibtex-2000" and r["dataset"]["train_points"] == 2000
    assert r["dataset"]["eval_points"] == 300 and r["dataset"]["train"] is None
    for name in ("slide", "torch"):
        s = r["systems"][name]
        assert "error" not in s, s.get("error")
        assert [rec["mark"] for rec in s["records"]] == [0.4, 0.8]
        assert s["summary"]["samples"] > 0
    assert (tmp_path / "compare.json").exists() and (tmp_path / "compare.png").exists()


def test_seed_table_gives_mean_and_range_over_seeds_and_counts_wins():
    run_all = benchmark_module("run_all")

    def result(seed, slide_p1, torch_p1, ratio):
        system = lambda p1: {"summary": {"final": {"P@1": p1}, "best_P@1": p1 + 0.01}}
        return {"dataset": {"name": "bibtex"}, "baseline": "torch", "budget_seconds": 30.0,
                "benchmark": {"seed": seed}, "comparison": {"samples_per_second_ratio": ratio},
                "systems": {"slide": system(slide_p1), "torch": system(torch_p1)}}

    table = run_all.seed_rows([result(2, 0.64, 0.65, 1.5), result(0, 0.66, 0.65, 1.7), result(1, 0.65, 0.62, 1.6)])
    row = table.splitlines()[2].split(" | ")
    assert row[0] == "| bibtex" and row[1] == "torch" and row[2] == "0,1,2"
    assert row[4] == "0.650 (0.640-0.660)"         # slide's final P@1 over the seeds
    assert row[5] == "0.640 (0.620-0.650)"         # the baseline's
    assert row[6] == "0.660 (0.650-0.670)"         # best P@1
    assert row[8] == "1.60 (1.50-1.70)"
    assert row[9].startswith("2 of 3")             # seeds 0 and 1; seed 2 ends below
