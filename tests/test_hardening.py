"""Failure modes users meet: damaged model files, killed runs, configurations that
cannot fit, data that does not match the model, Ctrl-C, and concurrent use.

Small real data (Bibtex) or tiny synthetic sets, one thread and fixed seeds, so each
case runs in seconds; the file stays under 90 s on two cores.
"""
import io
import json
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import yaml

import slide
from slide._util import peak_rss_bytes

from conftest import BIBTEX, run_cli, same_parameters


def bibtex_config(path, epochs=2, train=None, test=None, hidden=32, **training):
    cfg = {
        "data": {"train": str(train or BIBTEX / "train.txt"), "test": str(test or BIBTEX / "test.txt")},
        "layers": [{"size": hidden, "activation": "relu", "sampling": "dense"},
                   {"activation": "softmax", "sampling": "dense"}],
        "optimizer": {"lr": 0.002},
        "training": {"epochs": epochs, "batch_size": 128, "threads": 1, "seed": 3,
                     "checkpoint_every": 1, "checkpoint_minutes": 0, **training},
    }
    Path(path).write_text(yaml.safe_dump(cfg))
    return Path(path)


def tiny_dataset(n=200, num_features=40, num_labels=12, seed=0):
    """Learnable toy data: each label owns a few features."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_labels, n)
    rows, cols = [], []
    for i, l in enumerate(labels):
        feats = set(rng.choice(num_features, 3, replace=False).tolist()) | {int(l) * 3 % num_features}
        rows += [i] * len(feats)
        cols += sorted(feats)
    x = sp.csr_matrix((np.ones(len(cols), np.float32), (rows, cols)), shape=(n, num_features))
    y = sp.csr_matrix((np.ones(n, np.float32), labels, np.arange(n + 1)), shape=(n, num_labels))
    return slide.Dataset(x, y)


def tiny_network(seed=5, threads=1, epochs=2, sampling="dense"):
    return slide.Network({"layers": [{"size": 16, "activation": "relu", "sampling": "dense"},
                                     {"activation": "softmax", "sampling": sampling}],
                          "training": {"epochs": epochs, "batch_size": 16, "threads": threads, "seed": seed}})


# ---------------------------------------------------------------------- damaged model files

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("saved")
    data = tiny_dataset()
    net = tiny_network()
    net.fit(data)
    path = tmp / "model.slide"
    net.save(path)
    return path, net, data


def _expect_clear_error(path):
    with pytest.raises(ValueError) as e:
        slide.Network.load(path)
    assert str(path) in str(e.value), f"the message does not name the file: {e.value}"
    return str(e.value)


def test_empty_model_file_is_refused_by_name(saved, tmp_path):
    p = tmp_path / "empty.slide"
    p.write_bytes(b"")
    _expect_clear_error(p)


def test_missing_model_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here.slide"):
        slide.Network.load(tmp_path / "nothing-here.slide")


@pytest.mark.parametrize("keep", [0.02, 0.25, 0.5, 0.75, 0.98, -1])
def test_truncated_model_file_is_refused_by_name(saved, tmp_path, keep):
    path, _, _ = saved
    blob = path.read_bytes()
    n = len(blob) - 1 if keep == -1 else int(len(blob) * keep)
    p = tmp_path / "truncated.slide"
    p.write_bytes(blob[:n])
    _expect_clear_error(p)


def test_bit_flips_in_stored_arrays_are_detected(saved, tmp_path):
    """Every member's bytes are CRC-checked: a flipped bit never yields a different model."""
    path, net, data = saved
    blob = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
    checked = 0
    for info in infos:
        # member data starts after the 30-byte local header, the name and the extra field
        name_len = int.from_bytes(blob[info.header_offset + 26:info.header_offset + 28], "little")
        extra_len = int.from_bytes(blob[info.header_offset + 28:info.header_offset + 30], "little")
        start = info.header_offset + 30 + name_len + extra_len
        for pos in {start, start + info.compress_size // 2, start + info.compress_size - 1}:
            for bit in (0, 7):
                b = bytearray(blob)
                b[pos] ^= 1 << bit
                p = tmp_path / "flipped.slide"
                p.write_bytes(bytes(b))
                _expect_clear_error(p)
                checked += 1
    assert checked >= 3 * 2 * 3  # meta and at least two parameter arrays


def test_other_format_version_is_refused_with_both_versions(saved, tmp_path):
    path, _, _ = saved
    other = tmp_path / "future.slide"
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(other, "w") as out:
        for info in z.infolist():
            data = z.read(info.filename)
            if info.filename == "meta.npy":
                meta = json.loads(bytes(np.load(io.BytesIO(data))).decode())
                meta["format_version"] = 999
                buf = io.BytesIO()
                np.save(buf, np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
                data = buf.getvalue()
            out.writestr(info, data)
    msg = _expect_clear_error(other)
    assert "999" in msg and str(slide.network.FORMAT_VERSION) in msg


def test_foreign_npz_is_not_taken_for_a_model(tmp_path):
    p = tmp_path / "weights.npz"
    np.savez(p, w=np.zeros((3, 3), np.float32))
    _expect_clear_error(p)


def test_intact_file_round_trips_exactly(saved):
    path, net, data = saved
    back = slide.Network.load(path)
    assert same_parameters(back, net) and back.step == net.step
    a, b = net.predict(data.features, k=3), back.predict(data.features, k=3)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("kind", ["directory", "device"])
def test_paths_that_are_not_files_are_refused_by_name(tmp_path, kind):
    path = tmp_path if kind == "directory" else Path("/dev/null")
    with pytest.raises(ValueError, match=str(path)):
        slide.load_dataset(path, cache=False)
    with pytest.raises(ValueError, match=str(path)):
        slide.Network.load(path)


# ---------------------------------------------------------------------- SIGKILL and --resume

def _checkpoints(run):
    d = run / "checkpoints"
    return sorted(d.glob("step-*.ckpt")) if d.is_dir() else []


def _latest_step(run):
    cks = _checkpoints(run)
    return int(cks[-1].name[5:15]) if cks else -1


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_completes_identically(tmp_path):
    """Kill `slide train` with SIGKILL several times; every checkpoint on disk stays
    loadable and the resumed run ends with the same model as an uninterrupted one
    (one thread, dense layers: training is bit-reproducible across checkpoints)."""
    # Each attempt trains one epoch and up to 0.25 s more before its kill: enough epochs that
    # three attempts cannot finish the run even at 0.03 s per epoch (measured on 2 cores).
    epochs = 60
    cfg = bibtex_config(tmp_path / "small.yaml", epochs=epochs)
    rng = random.Random(7)
    run = tmp_path / "killed"
    kills = 0
    checked = 0
    for attempt in range(4):
        args = ["train", "--resume", run, "--quiet"] if _latest_step(run) >= 0 else \
            ["train", cfg, "--out", run, "--quiet"]
        before = _latest_step(run)
        proc = subprocess.Popen([sys.executable, "-m", "slide", *map(str, args)], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        # wait for a checkpoint newer than the last one, then kill a little later
        while _latest_step(run) <= before and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.25))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=30)
        for ck in _checkpoints(run):  # whatever was on disk at the kill must load
            slide.Network.load(ck)
            checked += 1
        if (run / "summary.json").exists():
            break
    assert kills >= 3, "the run finished before it could be killed three times"
    r = run_cli("train", "--resume", run, "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "reference"
    r = run_cli("train", cfg, "--out", ref, "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    a, b = slide.Network.load(run / "model.slide"), slide.Network.load(ref / "model.slide")
    assert a.epoch == b.epoch == epochs and a.step == b.step
    assert same_parameters(a, b)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and len(steps) == epochs, "metrics lost or repeated across resumes"
    assert not list((run / "checkpoints").glob("*.tmp")), "partial checkpoint files left behind"
    assert checked >= kills


# ---------------------------------------------------------------------- memory and shapes

def test_config_that_cannot_fit_is_refused_before_allocating(tmp_path):
    cfg = {"layers": [{"size": 10_000, "activation": "relu", "sampling": "dense"},
                      {"activation": "softmax", "sampling": "lsh"}]}
    est = slide.memory.estimate(slide.Config.from_dict(cfg), 100_000, 10_000_000)
    assert est["weights"] >= 10_000_000 * 10_000 * 4  # the output layer alone: 400 GB
    rss_before = peak_rss_bytes()
    with pytest.raises(MemoryError) as e:
        slide.Network(cfg, num_features=100_000, num_labels=10_000_000)
    rss_after = peak_rss_bytes()
    msg = str(e.value)
    assert "10000000 labels" in msg and ("TiB" in msg or "GiB" in msg), msg
    assert slide.memory.format_bytes(est["total"]) in msg
    assert rss_after - rss_before < 200 * 2**20, "memory was touched before the refusal"


def test_cli_refuses_a_config_that_cannot_fit_and_writes_nothing(tmp_path):
    data = tmp_path / "huge.txt"
    data.write_text("2 100000 10000000\n0 1:1\n9999999 5:1\n")
    cfg = bibtex_config(tmp_path / "huge.yaml", train=data, test=data, hidden=10_000)
    r = run_cli("train", cfg, "--out", tmp_path / "run", cwd=tmp_path)
    assert r.returncode != 0
    assert "needs about" in r.stderr and "10000000 labels" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def _bibtex_head(path, n, num_features=1836, num_labels=159, replace=None):
    lines = (BIBTEX / "test.txt").read_text().splitlines()[1:n + 1]
    if replace:
        for i, text in replace.items():
            lines[i] = text
    path.write_text(f"{n} {num_features} {num_labels}\n" + "\n".join(lines) + "\n")
    return path


def test_test_file_with_feature_beyond_train_is_refused_with_its_line(tmp_path):
    train = slide.load_dataset(BIBTEX / "train.txt", cache=False)
    # the header is wider than train; line 5 (4th point) uses feature 1900 >= 1836
    test = _bibtex_head(tmp_path / "test.txt", 20, num_features=2000, replace={3: "3 7:1 1900:1"})
    with pytest.raises(slide.DataError, match=rf"test\.txt:5: .*1900"):
        slide.load_dataset(test, num_features=train.num_features, num_labels=train.num_labels, cache=False)
    # a Network trained on train refuses it too, before predicting anything
    net = tiny_network(epochs=1)
    net.fit(train[:256])
    wide = slide.load_dataset(test, cache=False)
    with pytest.raises(ValueError, match="feature id 1900"):
        net.evaluate(wide)
    with pytest.raises(ValueError, match="feature id 1900"):
        net.predict(wide.features)


def test_cli_refuses_a_test_file_wider_than_train_before_training(tmp_path):
    test = _bibtex_head(tmp_path / "test.txt", 20, num_features=2000, replace={3: "3 7:1 1900:1"})
    cfg = bibtex_config(tmp_path / "c.yaml", epochs=1, test=test)
    r = run_cli("train", cfg, "--out", tmp_path / "run", "--quiet", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "test.txt:5:" in r.stderr and "1900" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def test_error_inside_the_parallel_reader_reaches_python_with_the_first_bad_line(tmp_path):
    """Lines are parsed by several threads; an error in any chunk surfaces as DataError
    naming the earliest bad line, whatever the number of threads."""
    n = 60_000
    rng = np.random.default_rng(0)
    feats = rng.choice(500, (n, 6))
    lines = [f"{n} 500 20"]
    for i in range(n):
        lines.append(f"{i % 20} " + " ".join(f"{j}:1" for j in sorted(set(feats[i].tolist()))))
    for bad in (52_000, 31_000, 45_000):  # the first one is in the last part of the file
        lines[bad] = f"{bad % 20} 3:1 oops:2"
    p = tmp_path / "bad.txt"
    p.write_text("\n".join(lines) + "\n")
    for threads in (1, 2, 4, 8):
        with pytest.raises(slide.DataError, match=rf"bad\.txt:{31_000 + 1}: "):
            slide.load_dataset(p, cache=False, num_threads=threads)
    # only one bad line, far into the last chunk
    lines[31_000] = lines[45_000] = "1 3:1"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(slide.DataError, match=rf"bad\.txt:{52_000 + 1}: "):
        slide.load_dataset(p, cache=False, num_threads=8)


# ---------------------------------------------------------------------- concurrency

def test_predict_and_evaluate_from_several_threads_equal_sequential():
    data = tiny_dataset(n=600)
    net = tiny_network(threads=2, sampling="lsh")
    net.fit(data)
    want_pred = net.predict(data.features, k=5)
    want_lsh = net.predict(data.features, k=5, mode="lsh")
    want_eval = net.evaluate(data)
    results, errors = [], []

    def work(i):
        try:
            for _ in range(5):
                if i % 3 == 0:
                    results.append(("exact", net.predict(data.features, k=5)))
                elif i % 3 == 1:
                    results.append(("lsh", net.predict(data.features, k=5, mode="lsh")))
                else:
                    results.append(("eval", net.evaluate(data)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(results) == 30
    for kind, got in results:
        if kind == "eval":
            assert got == want_eval
        else:
            want = want_pred if kind == "exact" else want_lsh
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_two_networks_train_at_once_without_interfering():
    data = tiny_dataset(n=800)
    alone = []
    for seed in (1, 2):
        net = tiny_network(seed=seed, epochs=3)
        net.fit(data)
        alone.append(net)
    together = [tiny_network(seed=1, epochs=3), tiny_network(seed=2, epochs=3)]
    errors = []

    def fit(net):
        try:
            net.fit(data)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=fit, args=(n,)) for n in together]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for a, b in zip(alone, together):
        assert same_parameters(a, b)
    assert not same_parameters(together[0], together[1])


# ---------------------------------------------------------------------- Ctrl-C

def test_sigint_during_fit_stops_within_a_second_and_the_network_saves(tmp_path):
    script = tmp_path / "train.py"
    model = tmp_path / "after-interrupt.slide"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        import slide
        train = slide.load_dataset({str(BIBTEX / 'train.txt')!r}, cache=False)
        net = slide.Network({{"layers": [{{"size": 256, "sampling": "dense"}},
                                        {{"activation": "softmax", "sampling": "dense"}}],
                             "training": {{"epochs": 1000, "threads": 1, "batch_size": 64}}}})

        class Started(slide.callbacks.Callback):
            def on_batch_end(self, net, step, loss):
                if step == 3:
                    print("started", flush=True)

        try:
            net.fit(train, callbacks=[Started()])
        except KeyboardInterrupt:
            print("stopped", time.time(), flush=True)
            net.save({str(model)!r})
            print("saved", net.step, flush=True)
            sys.exit(0)
        sys.exit(3)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "started", line + proc.stderr.read()
        time.sleep(0.3)
        sent = time.time()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    stopped = float(out.split("stopped", 1)[1].split()[0])
    assert stopped - sent < 1.0, f"took {stopped - sent:.2f} s to stop"
    step = int(out.split("saved", 1)[1].split()[0])
    back = slide.Network.load(model)
    assert back.step == step > 3


def test_out_of_range_feature_error_names_the_first_offender():
    net = slide.Network(num_features=40, num_labels=5, threads=1)
    X = sp.csr_matrix((np.ones(2, np.float32), (np.array([0, 1]), np.array([45, 90]))), shape=(2, 100))
    with pytest.raises(ValueError, match=r"feature id 45 \(row 0\)"):
        net.predict(X)
