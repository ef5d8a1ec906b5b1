"""The command line, run as users run it (``python -m slide ...`` in a subprocess).

Real Bibtex data, small networks, one thread and fixed seeds, so each command is
quick and runs are reproducible bit for bit.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import slide
from slide.config import Config
from slide.data import load_dataset

from conftest import BIBTEX, run_cli


def write_config(path, epochs=2, valid_fraction=0.0, **training):
    # everything the assertions depend on is pinned (39 batches per epoch, no early stop)
    cfg = {
        "data": {"train": str(BIBTEX / "train.txt"), "test": str(BIBTEX / "test.txt"),
                 "valid_fraction": valid_fraction},
        "layers": [{"size": 64, "activation": "relu", "sampling": "dense"},
                   {"activation": "softmax", "sampling": "dense"}],
        "optimizer": {"lr": 0.01},
        "training": {"epochs": epochs, "batch_size": 128, "threads": 1, "seed": 3, "dropout": 0.0,
                     "patience": 0, "checkpoint_every": 1, "checkpoint_minutes": 0, **training},
    }
    Path(path).write_text(yaml.safe_dump(cfg))
    return Path(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short CLI training run shared by the tests that only read its outputs."""
    tmp = tmp_path_factory.mktemp("trained")
    cfg = write_config(tmp / "small.yaml")
    out = tmp / "run"
    r = run_cli("train", cfg, "--out", out, cwd=tmp)
    assert r.returncode == 0, r.stderr
    return cfg, out, r


# ---------------------------------------------------------------------- train: files and keys

def test_train_writes_the_documented_run_folder(trained):
    cfg, out, r = trained
    assert "P@1" in r.stdout and "P@3" in r.stdout and "P@5" in r.stdout
    # the resolved config reloads to the config that was trained
    assert Config.from_yaml(out / "config.yaml").to_dict() == Config.from_yaml(cfg).to_dict()

    lines = (out / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(l) for l in lines]
    assert len(records) == 2  # one evaluation per epoch
    for i, rec in enumerate(records):
        for key in ("step", "epoch", "seconds", "samples_per_second", "loss",
                    "P@1", "P@3", "P@5", "nDCG@1", "nDCG@5", "PSP@1", "PSP@5"):
            assert key in rec, key
        assert rec["epoch"] == i + 1
    assert records[0]["seconds"] < records[1]["seconds"]
    assert records[0]["step"] < records[1]["step"]

    summary = json.loads((out / "summary.json").read_text())
    for key in ("P@1", "P@3", "P@5", "train_seconds", "samples_per_second", "peak_rss_bytes", "best_epoch",
                "kept_epoch"):
        assert key in summary, key
    assert 0.3 < summary["P@1"] <= 1.0  # it learned something on real data
    assert summary["P@1"] >= summary["P@3"] >= summary["P@5"]
    assert summary["peak_rss_bytes"] > 10 * 2**20
    assert summary["samples_per_second"] > 0 and summary["train_seconds"] > 0
    # the seconds with evaluations and checkpoints hold the training seconds (fit's preparation
    # included), and the last line gives both
    assert summary["wall_seconds"] >= summary["train_seconds"]
    assert re.search(r"^train \d+\.\ds \(\d+\.\ds with evaluations and checkpoints\)", r.stdout, re.M)
    # no validation data: nothing is restored, the model holds the last epoch
    assert summary["best_epoch"] is None and summary["kept_epoch"] == 2

    ckpts = sorted(os.listdir(out / "checkpoints"))
    models = [c for c in ckpts if c.endswith(".ckpt")]
    assert 1 <= len(models) <= 2 and not any(".tmp" in c for c in ckpts)
    net = slide.Network.load(out / "checkpoints" / models[-1])
    assert net.epoch == 2
    assert (out / "model.slide").exists()


def test_cli_and_api_train_the_same_model(trained):
    cfg, out, _ = trained
    summary = json.loads((out / "summary.json").read_text())
    config = Config.from_yaml(cfg)
    train = load_dataset(config.data.train)
    test = load_dataset(config.data.test)
    net = slide.Network(config)
    net.fit(train, test=test)
    api = net.evaluate(test)
    for k in ("P@1", "P@3", "P@5"):
        assert summary[k] == pytest.approx(api[k], abs=1e-9), k
    # the saved model predicts what the API's model predicts
    saved = slide.Network.load(out / "model.slide")
    a, _ = saved.predict(test.features[:50], k=5)
    b, _ = net.predict(test.features[:50], k=5)
    np.testing.assert_array_equal(a, b)


def test_progress_bar_and_metric_lines(trained):
    _, _, r = trained
    assert "samples/s" in r.stderr  # tqdm bar on stderr
    metric_lines = [l for l in r.stdout.splitlines() if l.startswith("epoch ")]
    assert len(metric_lines) == 2 and all("P@1" in l and "loss" in l for l in metric_lines)
    # the network it trains, before the metric lines
    assert r.stdout.splitlines()[0] == "network: 1836 features -> 64 relu (dense) -> 159 softmax (dense)"


def test_train_narrates_epochs_auto_and_writes_progress_lines_to_a_log(tmp_path):
    """stderr is a pipe here, as in a batch job's log: progress comes as whole lines (no carriage
    returns); the phases that print no metric line (each rate searched, the refit, each network
    of an ensemble, the merge) are said on stdout."""
    cfg = write_config(tmp_path / "auto.yaml", epochs="auto", max_epochs=3, patience=2, ensemble=2)
    raw = yaml.safe_load(cfg.read_text())
    raw["optimizer"]["lr_search"] = [2.0]
    cfg.write_text(yaml.safe_dump(raw))
    r = run_cli("train", cfg, "--out", tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr
    progress = [l for l in r.stderr.splitlines() if l.startswith(("search: ", "refit: "))]
    assert progress[0].startswith("search: ") and "samples/s" in progress[0]
    assert any(l.startswith("refit: 100% ") for l in progress)   # the refit's length is known
    out = r.stdout.splitlines()
    said = [l for l in out if l.startswith(("epochs=auto: ", "ensemble: ", "label-centroid weight "))]
    assert re.fullmatch(r"epochs=auto: lr 0\.02: best validation P@1 0\.\d{4} after \d+ epochs", said[0])
    assert any(re.fullmatch(r"epochs=auto: best validation P@1 0\.\d{4} after \d+ epochs; refitting on all "
                            r"4880 training points", l) for l in said)
    assert "ensemble: network 1 of 2 done (seed 3); training 1 more" in said
    assert any(l.startswith("ensemble: network 2 of 2 (seed 1003): best validation P@1 ") for l in said)
    assert said[-1] == "ensemble: 2 networks merged into one of hidden sizes [128]"
    assert out.index(said[-1]) < next(i for i, l in enumerate(out) if l.startswith("final (test): "))
    assert not any("checkpoint written" in l for l in out)


def test_train_without_config_uses_the_bundled_bibtex_config(tmp_path):
    r = run_cli("train", "--set", "training.epochs=1", "--set", "training.threads=1", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (run,) = os.listdir(tmp_path / "runs")
    assert run.startswith("bibtex-")  # runs/<config-name>-<timestamp>
    cfg = Config.from_yaml(tmp_path / "runs" / run / "config.yaml")
    assert Path(cfg.data.train).resolve() == (BIBTEX / "train.txt").resolve()
    assert cfg.training.epochs == 1
    assert re.search(r"P@1 0\.\d{4}  P@3 0\.\d{4}  P@5 0\.\d{4}", r.stdout)


def test_train_says_what_sampling_auto_chose(tmp_path):
    # the bundled Bibtex config leaves the output layer's sampling to `auto`
    r = run_cli("train", "--set", "training.epochs=1", "--set", "training.threads=1", "--set", "layers.0.size=64",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # ... and its activation to `auto`: sigmoid (per-label binary loss) on a dense output layer
    assert "network: 1836 features -> 64 relu (dense) -> 159 sigmoid (dense, chosen by sampling: auto)" in r.stdout


def test_quiet_prints_only_the_result(tmp_path):
    cfg = write_config(tmp_path / "q.yaml", epochs=1)
    r = run_cli("train", cfg, "--out", tmp_path / "run", "--quiet", "--set", "training.eval_samples=300")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == ""
    assert not any(l.startswith("epoch ") for l in r.stdout.splitlines())
    assert "P@1" in r.stdout


# ---------------------------------------------------------------------- resume after kill -9

def _load_all(ckpt_dir):
    """Load every complete checkpoint on disk; one may be rotated away while we look."""
    loaded = 0
    if not ckpt_dir.exists():
        return 0
    for name in sorted(os.listdir(ckpt_dir)):
        if not name.endswith(".ckpt"):
            continue
        try:
            slide.Network.load(ckpt_dir / name)
        except FileNotFoundError:
            continue
        loaded += 1
    return loaded


def test_resuming_a_finished_run_says_so_and_evaluates_it_again(tmp_path):
    cfg = write_config(tmp_path / "auto.yaml", epochs="auto", max_epochs=2, ensemble=1, checkpoint_every="auto")
    out = tmp_path / "run"
    assert run_cli("train", cfg, "--out", out, "--quiet").returncode == 0
    before = json.loads((out / "summary.json").read_text())
    r = run_cli("train", "--resume", out)
    assert r.returncode == 0, r.stderr
    assert f"{out}: the run had finished; nothing more to train (evaluated and saved again)" in r.stderr
    assert "Warning" not in r.stderr     # fit's warning to notebook users is not the CLI's message
    after = json.loads((out / "summary.json").read_text())
    assert after["steps"] == after["resumed_from_step"] == before["steps"]
    assert after["P@1"] == before["P@1"]


@pytest.mark.slow
def test_kill_then_resume_equals_an_uninterrupted_run(tmp_path):
    # checkpoints at epoch ends and every ~0.1 s (mid-epoch), each resumable exactly
    # with dropout and a held-out validation split (restore_best), whose state must survive too
    cfg = write_config(tmp_path / "long.yaml", epochs=10, checkpoint_minutes=0.002, dropout=0.3,
                       valid_fraction=0.1)
    ref = run_cli("train", cfg, "--out", tmp_path / "ref", "--quiet")
    assert ref.returncode == 0, ref.stderr

    out = tmp_path / "killed"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "slide", "train", str(cfg), "--out", str(out), "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt_dir = out / "checkpoints"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if _load_all(ckpt_dir) >= 1:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "training finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    assert _load_all(ckpt_dir) >= 1

    r = run_cli("train", "--resume", out)
    assert r.returncode == 0, r.stderr
    a = json.loads((tmp_path / "ref" / "summary.json").read_text())
    b = json.loads((out / "summary.json").read_text())
    for k in ("P@1", "P@3", "P@5"):
        assert a[k] == pytest.approx(b[k], abs=1e-9), k
    recs_a = [json.loads(l) for l in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()]
    recs_b = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in recs_b] == [r["epoch"] for r in recs_a] == list(range(1, 11))
    assert [r["P@1"] for r in recs_b] == pytest.approx([r["P@1"] for r in recs_a], abs=1e-9)
    assert len([c for c in os.listdir(ckpt_dir) if c.endswith(".ckpt")]) == 2


def test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", epochs=200, checkpoint_every=0)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "slide", "train", str(cfg), "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (out / "metrics.jsonl").exists():
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert f"slide train --resume {out}" in err and "Traceback" not in err
    ck = [c for c in os.listdir(out / "checkpoints") if c.endswith(".ckpt")]
    assert len(ck) == 1  # checkpoint_every=0: only the one written on the interruption
    net = slide.Network.load(out / "checkpoints" / ck[0])
    assert 39 <= net.step < 200 * 39


def test_interrupted_checkpoint_write_leaves_the_previous_one_loadable(tmp_path):
    from slide.runs import CheckpointStore

    config = Config.from_yaml(write_config(tmp_path / "c.yaml", epochs=1))
    train = load_dataset(config.data.train)[:512]
    net = slide.Network(config)
    net.fit(train)
    store = CheckpointStore(tmp_path / "ck")
    first = store.save(net)

    class Crashing:
        step, epoch = net.step + 1, net.epoch

        def save(self, path):
            with open(path, "wb") as fh:
                fh.write(b"partial")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store.save(Crashing())
    assert store.latest().path == first.path
    slide.Network.load(store.latest().path)
    assert not any(".tmp" in n for n in os.listdir(tmp_path / "ck"))
    # a leftover from a hard kill (no chance to clean up) is ignored, then removed on resume
    (tmp_path / "ck" / "step-0000009999.ckpt.123.tmp").write_bytes(b"xx")
    assert store.latest().path == first.path
    store.remove_partial()
    assert sorted(os.listdir(tmp_path / "ck")) == sorted(
        [os.path.basename(first.path), os.path.basename(first.path)[:-5] + ".json"])


LSH_OUTPUT = {"activation": "softmax", "sampling": "lsh",
              "lsh": {"K": 3, "L": 8, "min_active": 20, "max_active": 60}}


@pytest.mark.parametrize("output_layer", ["dense", "lsh"])
def test_resume_from_a_mid_epoch_checkpoint_is_exact(tmp_path, output_layer):
    """A run stopped inside an epoch (as a time-based checkpoint does) continues exactly."""
    from slide.callbacks import StopAfter
    from slide.runs import RunDir, load_run_data, train_run

    path = write_config(tmp_path / "c.yaml", epochs=3)
    if output_layer == "lsh":
        d = yaml.safe_load(path.read_text())
        d["layers"][1] = LSH_OUTPUT
        d["training"]["rebuild_first"] = 10
        path.write_text(yaml.safe_dump(d))
    config = Config.from_yaml(path)
    data = load_run_data(config)
    ref = train_run(config, RunDir.create(tmp_path / "ref", config), data=data)

    run = RunDir.create(tmp_path / "cut", config)
    train_run(config, run, callbacks=[StopAfter(50)], data=data)  # 39 batches per epoch
    ck = run.checkpoints.latest()
    assert ck.step == 50 and ck.state["epoch"] == 1
    assert [r["epoch"] for r in run.read_metrics()] == [1]
    resumed = train_run(config, run, resume=True, data=data)
    assert resumed["resumed_from_step"] == 50 and resumed["steps"] == ref["steps"] == 117
    for k in ("P@1", "P@3", "P@5", "nDCG@5", "PSP@5"):
        assert resumed[k] == ref[k], k
    assert [r["step"] for r in run.read_metrics()] == [39, 78, 117]


def test_checkpoint_every_auto_bounds_the_time_spent_writing(tmp_path):
    """The default checkpoint_every=auto writes at the end of the first epoch, then only once 20
    times the last write's duration has passed: a write that costs as much as many epochs (a
    47K-feature input layer and its optimizer moments) is not repeated at every epoch end."""
    from slide.runs import RunRecorder

    assert Config().training.checkpoint_every == "auto"

    class Net:
        step = 0

        def _agreed(self, flag):
            return bool(flag)

    class Store:
        def __init__(self):
            self.steps = []

        def save(self, net, state):
            time.sleep(0.02)   # a write of at least 0.02 s: the next one waits at least 0.4 s
            self.steps.append(net.step)

    class Run:
        checkpoints = Store()

    rec = RunRecorder(Run(), Config.from_dict({"training": {"checkpoint_minutes": 0}}))
    net = Net()
    for epoch, pause in [(1, 0.0), (2, 0.0), (3, 0.0), (4, 1.0), (5, 0.0)]:
        time.sleep(pause)
        net.step = 10 * epoch
        rec.on_epoch_end(net, epoch)
    assert Run.checkpoints.steps == [10, 40]   # the first epoch, then after the pause
    rec.on_train_end(net, None)                # the end always writes (the last epoch's state)
    assert Run.checkpoints.steps == [10, 40, 50]


def test_checkpoint_every_auto_run_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """A real run under checkpoint_every=auto whose writes are slow (0.2 s each: at least 4 s
    between epoch-end checkpoints) keeps the first epoch's and the final checkpoint only, and
    a run stopped after its first checkpoint resumes to the uninterrupted run's result."""
    from slide.callbacks import StopAfter
    from slide.runs import CheckpointStore, RunDir, load_run_data, train_run

    config = Config.from_yaml(write_config(tmp_path / "c.yaml", epochs=3, checkpoint_every="auto"))
    data = load_run_data(config)
    ref = train_run(config, RunDir.create(tmp_path / "ref", config), data=data)

    written = []
    save = CheckpointStore.save

    def slow_save(self, net, state=None):
        time.sleep(0.2)
        written.append(int(net.step))
        return save(self, net, state)

    monkeypatch.setattr(CheckpointStore, "save", slow_save)
    run = RunDir.create(tmp_path / "slow", config)
    slow = train_run(config, run, data=data)
    assert written == [39, 117]            # 39 batches an epoch: epoch 1, then the end
    assert slow["P@1"] == ref["P@1"]       # checkpoints never change what is trained

    written.clear()
    cut = RunDir.create(tmp_path / "cut", config)
    train_run(config, cut, callbacks=[StopAfter(60)], data=data)
    assert written == [39, 60]             # epoch 1, then the interruption
    resumed = train_run(config, cut, resume=True, data=data)
    assert resumed["resumed_from_step"] == 60
    for k in ("P@1", "P@3", "P@5"):
        assert resumed[k] == ref[k], k


# ---------------------------------------------------------------------- user errors

def _bad_data(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("3 10 4\n0,1 1:1 2:1\n2 3:x\n1 4:1\n")
    return p


@pytest.mark.parametrize("case, message", [
    ("unknown_key", r"unknown key 'training.epoch'.*did you mean 'epochs'"),
    ("bad_set", r"training\.batch_size: must be >= 1"),
    ("missing_config", r"config file not found: .*nope\.yaml"),
    ("missing_data", r"data\.test: file not found: .*missing\.txt"),
    ("bad_data", r"bad\.txt.*(line )?3"),
    ("too_big", r"memory"),
    ("resume_nothing", r"not a run folder|no checkpoint"),
    ("empty_test", r"data\.test: .*empty\.txt holds no data points"),
    ("empty_train", r"data\.train: .*empty\.txt holds no data points"),
    ("unlabelled_train", r"data\.train: none of the 3 points of .*unlabelled\.txt has a label"),
])
def test_user_errors_exit_2_with_one_message_and_write_nothing(tmp_path, case, message):
    work = tmp_path / "work"
    work.mkdir()
    cfg = write_config(tmp_path / "ok.yaml")
    args = ["train", cfg]
    if case == "unknown_key":
        d = yaml.safe_load(cfg.read_text())
        d["training"]["epoch"] = 3
        cfg.write_text(yaml.safe_dump(d))
    elif case == "bad_set":
        args += ["--set", "training.batch_size=0"]
    elif case == "missing_config":
        args = ["train", tmp_path / "nope.yaml"]
    elif case == "missing_data":
        args += ["--set", f"data.test={tmp_path / 'missing.txt'}"]
    elif case == "bad_data":
        args += ["--set", f"data.train={_bad_data(tmp_path)}"]
    elif case == "too_big":
        args += ["--set", "layers.0.size=200000000"]
    elif case == "resume_nothing":
        (tmp_path / "empty").mkdir()
        args = ["train", "--resume", tmp_path / "empty"]
    elif case == "unlabelled_train":
        (tmp_path / "unlabelled.txt").write_text("3 1836 159\n 1:1\n 2:1\n 7:0.5\n")
        args += ["--set", f"data.train={tmp_path / 'unlabelled.txt'}"]
    elif case.startswith("empty_"):
        (tmp_path / "empty.txt").write_text("0 1836 159\n")
        args += ["--set", f"data.{case[6:]}={tmp_path / 'empty.txt'}"]
    r = run_cli(*args, cwd=work)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    err_lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(err_lines) == 1 and err_lines[0].startswith("slide train: error:"), r.stderr
    assert re.search(message, err_lines[0]), err_lines[0]
    assert os.listdir(work) == []  # no run folder, no runs/
    if case == "resume_nothing":
        assert os.listdir(tmp_path / "empty") == []


def test_debug_shows_the_traceback(tmp_path):
    r = run_cli("train", tmp_path / "nope.yaml", "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and "FileNotFoundError" in r.stderr


def test_existing_run_folder_is_not_overwritten(trained, tmp_path):
    cfg, out, _ = trained
    before = (out / "summary.json").read_text()
    r = run_cli("train", cfg, "--out", out)
    assert r.returncode == 2 and "already holds a run" in r.stderr
    assert (out / "summary.json").read_text() == before


# ---------------------------------------------------------------------- evaluate / predict

def test_evaluate_refuses_a_file_without_points(trained, tmp_path):
    _, out, _ = trained
    (tmp_path / "empty.txt").write_text("0 1836 159\n")
    r = run_cli("evaluate", out / "model.slide", tmp_path / "empty.txt")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"slide evaluate: error: {tmp_path / 'empty.txt'} holds no data points", r.stderr


def test_evaluate_matches_the_run_summary(trained, tmp_path):
    _, out, _ = trained
    r = run_cli("evaluate", out / "model.slide", BIBTEX / "test.txt", "-k", "1,3,5", "-o", tmp_path / "m.json")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "m.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    for k in ("P@1", "P@3", "P@5"):
        assert m[k] == pytest.approx(summary[k], abs=1e-9)
    assert "P" in r.stdout and "@1" in r.stdout
    # a run folder works as MODEL too
    r2 = run_cli("evaluate", out, BIBTEX / "test.txt", "-k", "1")
    assert r2.returncode == 0 and f"{summary['P@1']:.4f}" in r2.stdout


def test_predict_writes_one_line_of_label_score_pairs_per_point(trained, tmp_path):
    _, out, _ = trained
    pred = tmp_path / "pred.txt"
    r = run_cli("predict", out / "model.slide", BIBTEX / "test.txt", "-k", "3", "-o", pred, "--batch", "1000")
    assert r.returncode == 0, r.stderr
    lines = pred.read_text().splitlines()
    test = load_dataset(BIBTEX / "test.txt")
    assert len(lines) == len(test) == 2515
    net = slide.Network.load(out / "model.slide")
    labels, scores = net.predict(test.features[:5], k=3)
    for i, line in enumerate(lines):
        pairs = [p.split(":") for p in line.split(" ")]
        assert len(pairs) == 3
        labs = [int(a) for a, _ in pairs]
        scs = [float(b) for _, b in pairs]
        assert all(0 <= l < 159 for l in labs) and len(set(labs)) == 3
        assert scs == sorted(scs, reverse=True)
        if i < 5:
            assert labs == labels[i].tolist()
            np.testing.assert_allclose(scs, scores[i], rtol=1e-5)


def test_model_errors_exit_2(tmp_path):
    r = run_cli("evaluate", tmp_path / "none.slide", BIBTEX / "test.txt")
    assert r.returncode == 2 and "model file not found" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("evaluate", tmp_path, BIBTEX / "test.txt", "-k", "0")
    assert r.returncode == 2 and "-k" in r.stderr


# ---------------------------------------------------------------------- config / datasets

def test_config_defaults_parse_as_the_defaults():
    r = run_cli("config", "--defaults")
    assert r.returncode == 0
    assert Config.from_dict(yaml.safe_load(r.stdout)).to_dict() == Config().to_dict()


def test_config_check(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    r = run_cli("config", "--check", cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"OK {cfg}") and "memory estimate" in r.stdout
    d = yaml.safe_load(cfg.read_text())
    d["data"]["train"] = str(tmp_path / "gone.txt")
    cfg.write_text(yaml.safe_dump(d))
    r = run_cli("config", "--check", cfg)
    assert r.returncode == 2 and "data.train: file not found" in r.stderr


@pytest.mark.slow
def test_datasets_commands(tmp_path):
    r = run_cli("datasets", "list")
    assert r.returncode == 0 and "bibtex" in r.stdout
    r = run_cli("datasets", "stats", BIBTEX / "train.txt")
    assert r.returncode == 0, r.stderr
    assert "points 4880  features 1836  labels 159" in r.stdout
    from slide.datasets import PRESETS

    assert "tiny" in PRESETS
    r = run_cli("datasets", "synth", "tiny", "--out", tmp_path / "syn", "--seed", "4")
    assert r.returncode == 0, r.stderr
    syn = load_dataset(tmp_path / "syn" / "train.txt")
    assert len(syn) > 0 and load_dataset(tmp_path / "syn" / "test.txt").num_labels == syn.num_labels
    r = run_cli("datasets", "synth", "no-such-preset", "--out", tmp_path / "x")
    assert r.returncode == 2 and "no-such-preset" in r.stderr


# ---------------------------------------------------------------------- plot / compare

@pytest.mark.slow
def test_plot_draws_several_runs(trained, tmp_path):
    _, out, _ = trained
    other = tmp_path / "other"
    other.mkdir()
    recs = [{"step": 10 * i, "epoch": i, "seconds": 0.5 * i, "loss": 3.0 / i, "P@1": 0.1 * i} for i in (1, 2, 3)]
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    png = tmp_path / "curves.png"
    r = run_cli("plot", out, other, "-o", png)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # a comparison folder: one curve per system
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    (cmp / "compare.json").write_text(json.dumps({"systems": {
        "slide": {"name": "slide", "records": recs},
        "torch": {"name": "torch", "records": [dict(r, **{"P@1": r["P@1"] / 2}) for r in recs]}}}))
    from slide.plot import load_curves, plot_runs

    assert [name for name, _ in load_curves(cmp)] == ["cmp:slide", "cmp:torch"]
    plot_runs([other, cmp], tmp_path / "c2.png")
    assert (tmp_path / "c2.png").stat().st_size > 10_000
    r = run_cli("plot", tmp_path / "nothing", "-o", png)
    assert r.returncode == 2 and "not found" in r.stderr


def test_durations():
    from slide.runs import parse_duration

    assert parse_duration("90s") == 90
    assert parse_duration("10m") == 600
    assert parse_duration("1h") == 3600
    assert parse_duration("1h30m") == 5400
    assert parse_duration("45") == 45
    for bad in ("", "ten minutes", "5x", "0s", "-3m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_compare_rejects_a_bad_budget(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    r = run_cli("compare", cfg, "--budget", "soon", "--out", tmp_path / "cmp")
    assert r.returncode == 2 and "soon" in r.stderr
    assert not (tmp_path / "cmp").exists()


def test_compare_without_the_baseline_package_says_what_to_install(tmp_path):
    import importlib.util

    if importlib.util.find_spec("pecos") is not None:
        pytest.skip("libpecos is installed here; this checks the message when it is not")
    cfg = write_config(tmp_path / "c.yaml")
    r = run_cli("compare", cfg, "--baseline", "pecos", "--budget", "5s", "--out", tmp_path / "cmp")
    assert r.returncode == 2 and "pip install" in r.stderr and "pecos" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "cmp").exists()


@pytest.mark.slow
def test_compare_against_napkinxc(tmp_path):
    pytest.importorskip("napkinxc", reason="napkinxc is not installed (pip install slide[napkinxc])")
    cfg = write_config(tmp_path / "c.yaml")
    out = tmp_path / "cmp"
    r = run_cli("compare", cfg, "--baseline", "napkinxc", "--budget", "2s", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "slide vs napkinxc on bibtex" in r.stdout and "napkinxc trains in one call" in r.stdout
    result = json.loads((out / "compare.json").read_text())
    [rec] = result["systems"]["napkinxc"]["records"]
    assert 0.55 < rec["P@1"] < 0.7 and "error" not in result["systems"]["slide"]


def test_console_script_is_installed():
    script = Path(sys.executable).parent / ("slide.exe" if os.name == "nt" else "slide")
    assert script.exists(), "pip install should put the `slide` command beside the interpreter"
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"slide {slide.__version__}"


def test_predict_and_evaluate_in_lsh_mode(tmp_path):
    """`--mode lsh` scores only the hash candidates of a hash-sampled output layer: the same
    line format, answers that mostly agree with exact scoring, and metrics close to exact."""
    from slide.datasets import make_synthetic

    train, test = make_synthetic("small", seed=1, num_labels=5000, num_features=10_000, num_train=8_000,
                                 num_test=500)
    cfg = Config()
    cfg.layers[0].size = 128
    cfg.layers[-1].sampling = "lsh"
    cfg.layers[-1].activation = "softmax"
    net = slide.Network(cfg, epochs=2, lr=1e-2, dropout=0.0, threads=1)
    net.fit(train)
    model, data = tmp_path / "m.slide", tmp_path / "test.txt"
    net.save(model)
    test.save(data)
    outs = {}
    for mode in ("exact", "lsh"):
        pred = tmp_path / f"{mode}.txt"
        r = run_cli("predict", model, data, "-k", "3", "-o", pred, "--mode", mode)
        assert r.returncode == 0, r.stderr
        outs[mode] = [[int(p.split(":")[0]) for p in line.split(" ") if p] for line in pred.read_text().splitlines()]
        assert len(outs[mode]) == 500
    top_agree = np.mean([e[:1] == l[:1] for e, l in zip(outs["exact"], outs["lsh"]) if l])
    assert top_agree > 0.8, top_agree
    m = {}
    for mode in ("exact", "lsh"):
        r = run_cli("evaluate", model, data, "--mode", mode, "-o", tmp_path / f"{mode}.json")
        assert r.returncode == 0, r.stderr
        m[mode] = json.loads((tmp_path / f"{mode}.json").read_text())
    assert m["exact"]["P@1"] > 0.5 and abs(m["lsh"]["P@1"] - m["exact"]["P@1"]) < 0.05, m
    r = run_cli("predict", model, data, "--mode", "fast")
    assert r.returncode == 2 and "invalid choice: 'fast'" in r.stderr


def test_epoch_lines_without_the_test_split_name_the_validation_metrics(tmp_path):
    cfg = write_config(tmp_path / "small.yaml", epochs=3, valid_fraction=0.2, test_every=2)
    r = run_cli("train", cfg, "--out", tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("epoch ")]
    assert len(lines) == 3
    # epochs 2 and 3 (the last) score the test split: its metrics unprefixed, valid/P@1 beside them
    for line in lines[1:]:
        assert re.search(r"  P@1 0\.\d{4}  ", line) and re.search(r"valid/P@1 0\.\d{4}$", line)
    # epoch 1 scores the validation split alone, and says so
    assert "  P@1 " not in lines[0] and re.search(r"  valid/P@1 0\.\d{4}  valid/P@3 0\.\d{4}", lines[0])
