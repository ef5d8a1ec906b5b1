"""Failure modes of files and folders under concurrent or hostile conditions.

Each test provokes one situation with real processes and real files: a data file
truncated while it is read, two processes filling the parse cache at once, a file
size limit hit while a checkpoint is written, two trainings on one run folder, a run
folder of another layout version, a model asked to predict on data of another shape.
What must hold: no signal kills the process, the message names the file and the
cause, and nothing that was complete before is lost or misread.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import slide

ROOT = Path(__file__).resolve().parent.parent
BIBTEX = ROOT / "datasets" / "bibtex"
DELICIOUS = ROOT / "datasets" / "delicious"


def _env(tmp_path, **extra):
    env = dict(os.environ, SLIDE_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _slide(args, tmp_path, *, cwd=None, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "slide", *map(str, args)], cwd=cwd or tmp_path,
                          env=env or _env(tmp_path), capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------- truncated while read

def _write_big_xc(path: Path, points: int = 200_000) -> int:
    """An XC file of ~40 MB (1,000 distinct lines repeated); returns its size."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(1000):
        feats = np.unique(rng.integers(0, 5000, 24))
        labels = np.unique(rng.integers(0, 300, 3))
        lines.append(",".join(map(str, labels)) + " " + " ".join(f"{f}:0.{(f * 37) % 9973:04d}" for f in feats))
    body = "\n".join(lines) + "\n"
    with open(path, "w") as fh:
        fh.write(f"{points} 5000 300\n")
        for _ in range(points // 1000):
            fh.write(body)
    return path.stat().st_size


_LOADER = r"""
import sys
import slide
path = sys.argv[1]
print("ready", flush=True)
try:
    ds = slide.load_dataset(path, cache=False, num_threads=int(sys.argv[2]))
except slide.DataError as e:
    print("DataError:", e, flush=True)
    sys.exit(3)
print("loaded", len(ds), flush=True)
"""


def test_data_file_truncated_while_read_is_a_data_error_never_a_signal(tmp_path):
    """Truncating the file at various moments of a load: the reader either finishes (the
    truncation came after it) or raises DataError naming the file; the old memory-mapped
    reader died of SIGBUS here."""
    master = tmp_path / "master.txt"
    size = _write_big_xc(master)
    assert size > 30_000_000
    path = tmp_path / "data.txt"
    outcomes = []
    # (delay after the child is ready, new size, reader threads)
    tries = [(0.0, size // 2, 1), (0.05, size // 3, 1), (0.1, 4096, 1), (0.2, size // 2 + 7, 1),
             (0.3, 0, 1), (0.05, size // 2, 2), (0.15, size - 1000, 2), (0.4, 100, 2), (1.0, size // 4, 1)]
    for delay, new_size, threads in tries:
        data = master.read_bytes()
        path.write_bytes(data)
        del data
        proc = subprocess.Popen([sys.executable, "-c", _LOADER, str(path), str(threads)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.truncate(path, new_size)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode >= 0, (f"reader killed by signal {signal.Signals(-proc.returncode).name} "
                                      f"(delay {delay}, size {new_size}): {err[-2000:]}")
        assert proc.returncode in (0, 3), (proc.returncode, out, err[-2000:])
        if proc.returncode == 3:
            assert str(path) in out, out
        else:
            assert out.startswith("loaded 200000"), out
        outcomes.append("error" if proc.returncode == 3 else "loaded")
    # every truncation here lands before the reader is done or leaves a file it must refuse
    assert "error" in outcomes, outcomes


# ---------------------------------------------------------------------- parse cache

def _load_in_child(path, cache_dir, extra_env=None):
    env = dict(os.environ, SLIDE_CACHE_DIR=str(cache_dir), **(extra_env or {}))
    code = ("import sys, slide; ds = slide.load_dataset(sys.argv[1]); "
            "print(len(ds), ds.num_features, ds.num_labels, ds.nnz)")
    return subprocess.Popen([sys.executable, "-c", code, str(path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_processes_filling_the_cache_at_once_both_succeed_and_leave_one_entry(tmp_path):
    from slide.data import cache_entries, load_dataset

    path = tmp_path / "big.txt"
    _write_big_xc(path, points=60_000)
    cache = tmp_path / "cache"
    expected = load_dataset(path, cache=False)
    for _ in range(3):  # three rounds: the race lands differently each time
        from slide.data import clear_cache

        clear_cache(cache)
        procs = [_load_in_child(path, cache) for _ in range(2)]
        outs = [p.communicate(timeout=180) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-2000:]
            assert out.split() == ["60000", "5000", "300", str(expected.nnz)]
        entries = cache_entries(cache)
        assert len(entries) == 1 and entries[0]["complete"] and entries[0]["source"] == str(path), entries
        assert not [f for f in Path(entries[0]["path"]).iterdir() if ".tmp" in f.name]
        # the entry is valid: a cached read equals the parse, and it is a hit (the entry is used)
        before = Path(entries[0]["path"], "meta.json").stat().st_mtime_ns
        time.sleep(0.01)
        assert load_dataset(path, cache_dir=cache) == expected
        assert Path(entries[0]["path"], "meta.json").stat().st_mtime_ns > before


def test_cache_is_capped_and_evicts_least_recently_used(tmp_path, monkeypatch):
    from slide.data import cache_entries, load_dataset

    cache = tmp_path / "cache"
    monkeypatch.setenv("SLIDE_CACHE_DIR", str(cache))
    files = []
    for i in range(3):
        p = tmp_path / f"d{i}.txt"
        _write_big_xc(p, points=4000 + 1000 * i)
        files.append(p)
    load_dataset(files[0])
    one = cache_entries()[0]["bytes"]
    # room for two entries, not three
    monkeypatch.setenv("SLIDE_CACHE_MAX_BYTES", str(int(one * 2.9)))
    load_dataset(files[1])
    time.sleep(0.02)
    load_dataset(files[0])  # a hit: files[0] is now the most recently used
    time.sleep(0.02)
    load_dataset(files[2])
    sources = [e["source"] for e in cache_entries()]
    assert sources == [str(files[0]), str(files[2])], sources  # files[1] (least recent) went
    assert sum(e["bytes"] for e in cache_entries()) <= one * 2.9
    # an entry larger than the cap is not stored at all, and the cap is enforced
    monkeypatch.setenv("SLIDE_CACHE_MAX_BYTES", "1K")
    assert load_dataset(files[1]) == load_dataset(files[1], cache=False)
    assert cache_entries() == []
    monkeypatch.setenv("SLIDE_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="SLIDE_CACHE_MAX_BYTES.*'lots'"):
        load_dataset(files[1])


def test_cache_list_and_clear_commands(tmp_path):
    env = _env(tmp_path)
    r = _slide(["datasets", "stats", BIBTEX / "test.txt"], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    r = _slide(["cache", "list"], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "1 entry" in r.stdout and str(BIBTEX / "test.txt") in r.stdout and "2515 points" in r.stdout
    r = _slide(["cache", "clear"], tmp_path, env=env)
    assert r.returncode == 0 and "removed 1 cache entry" in r.stdout, r.stdout + r.stderr
    r = _slide(["cache", "list"], tmp_path, env=env)
    assert "0 entries" in r.stdout and str(BIBTEX) not in r.stdout
    assert not any((tmp_path / "cache" / "datasets").iterdir())


# ---------------------------------------------------------------------- runs: shared helpers

SMALL = ["--set", "layers.0.size=32", "--set", "training.threads=1", "--quiet"]


def _one_error_line(r, command="train"):
    assert "Traceback" not in r.stderr, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"slide {command}: error:"), r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def bibtex_run(tmp_path_factory):
    """A finished one-epoch Bibtex run folder (1,836 features, 159 labels)."""
    tmp = tmp_path_factory.mktemp("bibtex_run")
    out = tmp / "run"
    r = _slide(["train", *SMALL, "--set", "training.epochs=1", "--out", out], tmp)
    assert r.returncode == 0, r.stderr
    return out


def _start_long_run(tmp_path, out, *args):
    """`slide train` of 60 short epochs (a checkpoint each), running in the background."""
    return subprocess.Popen([sys.executable, "-m", "slide", "train", *SMALL, "--set", "training.epochs=60",
                             *map(str, args)], cwd=tmp_path, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(out, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list((out / "checkpoints").glob("step-*.json")):
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


def _stop(proc):
    proc.send_signal(signal.SIGINT)  # writes a checkpoint and exits 130
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), err[-2000:]


def _file_digests(folder):
    import hashlib

    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


# ---------------------------------------------------------------------- data of another shape

def test_predict_and_evaluate_refuse_a_file_of_another_shape_naming_both(bibtex_run, tmp_path):
    for command in ("predict", "evaluate"):
        r = _slide([command, bibtex_run, DELICIOUS / "test.txt"], tmp_path)
        assert r.returncode == 2, (command, r.stdout[-500:], r.stderr)
        line = _one_error_line(r, command)
        assert "500 features and 983 labels" in line and "1836 features and 159 labels" in line, line
        assert str(DELICIOUS / "test.txt") in line and r.stdout == ""
    # a header that differs in the labels only
    lines = (BIBTEX / "test.txt").read_text().splitlines()
    n, d, _ = lines[0].split()
    other = tmp_path / "labels200.txt"
    other.write_text("\n".join([f"{n} {d} 200", *lines[1:]]) + "\n")
    for command in ("predict", "evaluate"):
        r = _slide([command, bibtex_run, other], tmp_path)
        assert r.returncode == 2 and "1836 features and 200 labels" in _one_error_line(r, command)


def _libsvm(lines):
    """XC data lines as libsvm (1-based features), no header."""
    out = []
    for line in lines:
        labels, _, feats = line.partition(" ") if not line.startswith(" ") else ("", "", line.strip())
        out.append(labels + " " + " ".join(f"{int(f.split(':')[0]) + 1}:{f.split(':')[1]}" for f in feats.split()))
    return "\n".join(out) + "\n"


def test_headerless_libsvm_files_are_checked_against_the_ids_they_contain(bibtex_run, tmp_path):
    body = (BIBTEX / "test.txt").read_text().splitlines()[1:201]
    fits = tmp_path / "fits.svm"
    fits.write_text(_libsvm(body))
    for command in ("predict", "evaluate"):
        r = _slide([command, bibtex_run, fits], tmp_path)
        assert r.returncode == 0, r.stderr
    r = _slide(["predict", bibtex_run, fits], tmp_path)
    assert len(r.stdout.splitlines()) == 200
    wide = tmp_path / "wide.svm"
    wide.write_text(_libsvm(body) + "3 1837:1.0\n")  # feature id 1837 (1-based) = 1836: one too many
    for command in ("predict", "evaluate"):
        r = _slide([command, bibtex_run, wide], tmp_path)
        assert r.returncode == 2, r.stderr
        line = _one_error_line(r, command)
        assert "largest feature id, 1837, needs 1837 features" in line, line
        assert "1836 features and 159 labels" in line and str(wide) in line, line
    labels = tmp_path / "labels.svm"
    labels.write_text(_libsvm(body) + "159 5:1.0\n")
    r = _slide(["evaluate", bibtex_run, labels], tmp_path)
    assert r.returncode == 2 and "largest label id, 159, needs 160 labels" in _one_error_line(r, "evaluate")


# ---------------------------------------------------------------------- write failures

def test_file_size_limit_during_a_checkpoint_keeps_the_previous_one_and_resume_works(tmp_path):
    from slide import Network

    out = tmp_path / "run"
    proc = _start_long_run(tmp_path, out, "--out", out)
    _wait_for_checkpoint(out, proc)
    _stop(proc)
    before = _file_digests(out / "checkpoints")
    assert before
    ckpt_bytes = max((out / "checkpoints").glob("*.ckpt")).stat().st_size
    # a limit (1 KiB blocks) below one checkpoint: the next checkpoint write fails with EFBIG
    limit = ckpt_bytes // 1024 // 2
    cmd = f"ulimit -f {limit}; exec {sys.executable} -m slide train --resume {out} --quiet"
    r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 74, (r.returncode, r.stderr)  # not a signal: a clear exit status
    line = _one_error_line(r)
    assert "cannot write" in line and str(out / "checkpoints") in line and "File too large" in line, line
    assert f"slide train --resume {out}" in line
    # the checkpoints are exactly what they were: nothing partial, nothing removed
    assert _file_digests(out / "checkpoints") == before
    latest = max((out / "checkpoints").glob("*.ckpt"))
    Network.load(latest)
    # room again: the run resumes from the intact checkpoint and finishes
    r = _slide(["train", "--resume", out, "--quiet"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["epochs"] == 60
    assert Network.load(out / "model.slide").epoch == 60


def test_checkpoint_write_failure_leaves_no_partial_checkpoint(tmp_path):
    """The same promise through the API, for each stage of a checkpoint write."""
    from slide.data import load_dataset
    from slide.runs import CheckpointStore, RunWriteError
    import slide._io as io

    train = load_dataset(BIBTEX / "train.txt")[:500]
    net = slide.Network(hidden=16, epochs=1, threads=1)
    net.fit(train)
    store = CheckpointStore(tmp_path / "ck")
    first = store.save(net, {"wall_seconds": 1.0})
    before = _file_digests(tmp_path / "ck")
    net._core.step = net.step + 5  # a later step, as after more training
    real = io.atomic_path
    for failing in ("ckpt", "json"):
        def flaky(path, **kw):
            if str(path).endswith(failing):
                raise OSError(28, "No space left on device")
            return real(path, **kw)
        import slide.runs as runs_mod
        orig = runs_mod.atomic_path, io.atomic_path
        runs_mod.atomic_path = io.atomic_path = flaky
        try:
            with pytest.raises(RunWriteError, match=rf"cannot write .*\.{failing}: No space left on device; "
                                                    rf"the previous checkpoint .*{first.path[-20:]} is intact"):
                store.save(net, {"wall_seconds": 2.0})
        finally:
            runs_mod.atomic_path, io.atomic_path = orig
        assert _file_digests(tmp_path / "ck") == before, failing
        assert [c.step for c in store.list()] == [first.step]


# ---------------------------------------------------------------------- one process per run folder

def test_second_training_on_a_busy_run_folder_exits_at_once_naming_the_pid(tmp_path):
    out = tmp_path / "run"
    proc = _start_long_run(tmp_path, out, "--out", out)
    try:
        _wait_for_checkpoint(out, proc)
        for args in (["--resume", out], [*SMALL, "--out", out]):
            t0 = time.time()
            r = _slide(["train", *args], tmp_path)
            assert r.returncode == 2, r.stderr
            line = _one_error_line(r)
            assert f"in use by process {proc.pid}" in line and str(out) in line, line
            assert time.time() - t0 < 60  # it did not train first
            assert proc.poll() is None
    finally:
        _stop(proc)
    # nothing was damaged: every checkpoint loads and the run resumes to its end
    for ck in (out / "checkpoints").glob("*.ckpt"):
        slide.Network.load(ck)
    r = _slide(["train", "--resume", out, "--quiet"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["epochs"] == 60


def test_a_lock_left_by_a_dead_process_is_taken_over(bibtex_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(bibtex_run, run)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / ".lock").write_text(f"{dead.pid}\n")
    r = _slide(["train", "--resume", run, "--quiet"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (run / ".lock").read_text().strip() != str(dead.pid)


# ---------------------------------------------------------------------- run folders of other versions

def test_run_folder_of_a_newer_layout_is_refused_and_left_alone(bibtex_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(bibtex_run, run)
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["version"] == 1
    (run / "run.json").write_text(json.dumps(dict(manifest, version=2, slide_version="9.0")))
    (run / ".lock").unlink()
    before = _file_digests(run)
    for args in (["train", "--resume", run], ["predict", run, BIBTEX / "test.txt"],
                 ["evaluate", run, BIBTEX / "test.txt"]):
        r = _slide(args, tmp_path)
        assert r.returncode == 2, r.stderr
        line = _one_error_line(r, args[0])
        assert "run folder format 2" in line and "slide 9.0" in line and str(run) in line, line
    (run / "run.json").write_text('{"version": 1}')
    r = _slide(["train", "--resume", run], tmp_path)
    assert r.returncode == 2 and "run.json: not a slide run manifest" in _one_error_line(r)
    (run / "run.json").write_text(json.dumps(dict(manifest, version="1")))
    r = _slide(["train", "--resume", run], tmp_path)
    assert r.returncode == 2 and 'field "version" must be an integer' in _one_error_line(r)
    assert _file_digests(run) == {**before, "run.json": _file_digests(run)["run.json"]}
    assert not (run / ".lock").exists()  # not even locked


def test_run_folder_of_the_first_layout_is_migrated_and_resumes(tmp_path):
    """Folders of slide 0.1.0 have no run.json and checkpoint manifests without sizes:
    --resume records the layout and continues; a checkpoint of an older model format
    is refused by name instead of being misread."""
    out = tmp_path / "run"
    proc = _start_long_run(tmp_path, out, "--out", out)
    _wait_for_checkpoint(out, proc)
    _stop(proc)
    (out / "run.json").unlink()
    for manifest in (out / "checkpoints").glob("*.json"):
        state = json.loads(manifest.read_text())
        del state["model_bytes"]
        manifest.write_text(json.dumps(state))
    r = _slide(["predict", out, BIBTEX / "test.txt", "-k", "1"], tmp_path)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2515, r.stderr
    assert not (out / "run.json").exists()  # reading does not change the folder
    r = _slide(["train", "--resume", out, "--quiet"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "run.json").read_text())["migrated_from"] == 0
    assert json.loads((out / "summary.json").read_text())["epochs"] == 60
    # an unknown file where format 0 had only checkpoints: not guessed at
    (out / "run.json").unlink()
    (out / "checkpoints" / "model-final.bin").write_bytes(b"x")
    r = _slide(["train", "--resume", out], tmp_path)
    assert r.returncode == 2 and "unknown file checkpoints/model-final.bin" in _one_error_line(r)


def test_checkpoint_of_another_model_format_is_refused_by_name(bibtex_run, tmp_path):
    import shutil
    import zipfile

    run = tmp_path / "run"
    shutil.copytree(bibtex_run, run)
    (run / "model.slide").unlink()
    ck = max((run / "checkpoints").glob("*.ckpt"))
    with np.load(ck) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta"]).decode())
    meta["format_version"] = 0
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(ck, "wb") as fh:
        np.savez(fh, **arrays)
    manifest = ck.with_suffix(".json")
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), model_bytes=ck.stat().st_size)))
    assert zipfile.is_zipfile(ck)
    r = _slide(["train", "--resume", run, "--quiet"], tmp_path)
    assert r.returncode == 2, r.stderr
    line = _one_error_line(r)
    assert str(ck) in line and "format version 0 is not supported" in line, line
