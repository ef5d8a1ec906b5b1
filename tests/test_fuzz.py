"""Short fuzzing runs of the input-facing entry points (about a minute in all).

Each target of tests/fuzz runs in its own process under libFuzzer (atheris), so a
crash of the process fails the test and the crashing input is kept in a temporary
folder named in the failure message. ``python tests/fuzz/run.py --minutes 10`` is
the long form; tests/fuzz/README.md lists what each target checks.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("atheris")

FUZZ = Path(__file__).resolve().parent / "fuzz"
sys.path.insert(0, str(FUZZ))
import run as fuzz_run  # noqa: E402

# Seconds per target; together with start-up this is the suite's minute of fuzzing.
BUDGET = {"config": 12, "dataset": 18, "checkpoint": 12}


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(BUDGET))
def test_fuzz_target_finds_nothing(target, tmp_path):
    rc, n, crashes, output = fuzz_run.run_target(target, str(tmp_path), seconds=BUDGET[target], timeout=240)
    assert rc == 0 and not crashes, (
        f"fuzz target {target} found a problem; inputs kept: {crashes}\n"
        f"replay: python {FUZZ / f'fuzz_{target}.py'} <input>\n{output[-6000:]}")
    # the run really executed inputs (a target that fails to start would also exit 0);
    # a sanitized build runs only a few dozen in the budget
    assert n >= 10, f"only {n} inputs executed:\n{output[-3000:]}"


@pytest.mark.parametrize("failure", ["exception", "segfault"])
def test_harness_reports_a_finding_with_its_input(tmp_path, failure):
    """The machinery itself: an undocumented error or a crash of the process is a
    finding, and the input that caused it is kept."""
    target = tmp_path / "fuzz_selftest.py"
    target.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(FUZZ)!r})
        import _harness

        def one(data):
            if data[:3] == b"bad":
                if {failure!r} == "segfault":
                    import ctypes
                    ctypes.string_at(0)
                raise TypeError("not a documented error")
            if data[:3] == b"err":
                raise ValueError("documented")

        _harness.main(_harness.guard(one, (ValueError,)))
    """))
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "a").write_bytes(b"err")
    (seeds / "b").write_bytes(b"bad input")
    out = tmp_path / "out"
    out.mkdir()
    # Under .ci/sanitize this crash is intended: keep its report out of the sanitizer logs.
    env = dict(os.environ)
    for key in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
        if key in env:
            env[key] = ":".join(o for o in env[key].split(":") if not o.startswith("log_path="))
    r = subprocess.run([sys.executable, str(target), f"-artifact_prefix={out}/", "-atheris_runs=200",
                        str(seeds)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
    if failure == "exception":
        assert "TypeError: not a documented error" in r.stdout + r.stderr
    else:  # libFuzzer's signal handler, or AddressSanitizer's when it is loaded
        assert "deadly signal" in r.stderr or "AddressSanitizer: SEGV" in r.stderr
    kept = [p.read_bytes() for p in out.iterdir() if p.name.startswith("crash-")]
    assert kept == [b"bad input"]


def test_checkpoint_seeds_cover_the_damage_kinds(tmp_path):
    """The checkpoint target starts from a real saved model and its damaged variants."""
    sys.path.insert(0, str(FUZZ))
    import fuzz_checkpoint

    path, net, probe, pred = fuzz_checkpoint.make_reference(str(tmp_path))
    seed_dir = tmp_path / "seeds"
    fuzz_checkpoint.write_seeds(path, str(seed_dir))
    names = {p.name for p in seed_dir.iterdir()}
    assert {"full", "empty", "other_version"} <= names
    assert any(n.startswith("trunc_") for n in names) and any(n.startswith("flip_") for n in names)
    assert (seed_dir / "full").read_bytes() == Path(path).read_bytes()
