"""Helpers and fixtures shared by the test files.

Data: Bibtex and Delicious ship in the repository's ``datasets/``; other real sets are looked
up in ``../shared/datasets`` next to the checkout (or ``$SLIDE_DATASETS``) and their tests skip,
saying so, when that folder does not hold them.

Layers: ``pytest -m "not slow"`` leaves out the tests marked ``slow`` (long training runs and
end-to-end subprocess checks); plain ``pytest`` runs everything.
"""
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import slide

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "datasets"
BIBTEX = DATASETS / "bibtex"
DELICIOUS = DATASETS / "delicious"
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"


def benchmark_module(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dataset_dir(name: str) -> Path:
    """The folder of a real data set: the shipped copy, else ``$SLIDE_DATASETS/name`` or
    ``../shared/datasets/name``; skips the test when none holds ``train.txt``."""
    roots = [DATASETS]
    if os.environ.get("SLIDE_DATASETS"):
        roots.append(Path(os.environ["SLIDE_DATASETS"]))
    roots.append(SHARED_DATASETS)
    for root in roots:
        if (root / name / "train.txt").is_file():
            return root / name
    pytest.skip(f"data set {name} is not shipped and not found under {', '.join(map(str, roots[1:]))}")


def load_split(name: str):
    """``(train, test)`` :class:`slide.Dataset` objects of a real data set."""
    d = dataset_dir(name)
    return slide.load_dataset(d / "train.txt"), slide.load_dataset(d / "test.txt")


@pytest.fixture(scope="session", autouse=True)
def _sigint_raises_keyboard_interrupt():
    """The Ctrl-C tests send SIGINT to this process and to ``slide train`` children. A shell that
    starts the suite as a background job without job control (``pytest ... &`` in a script)
    hands it SIGINT ignored; Python then keeps it ignored and so do its children, through exec,
    and those tests would fail for the launcher's sake. Python's own handler is put back for the
    session (children then start with the default)."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def bibtex():
    return load_split("bibtex")


@pytest.fixture(scope="session")
def delicious():
    return load_split("delicious")


def run_cli(*args, cwd=None, timeout=300):
    """``python -m slide ARGS`` in a fresh interpreter, output captured as text."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "slide", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def same_parameters(a, b) -> bool:
    """Whether two networks hold bit-identical parameters under the same names."""
    pa, pb = a.parameters(), b.parameters()
    return sorted(pa) == sorted(pb) and all(np.array_equal(pa[k], pb[k]) for k in pa)


def assert_same_parameters(a, b):
    """:func:`same_parameters`, failing with the name of the first array that differs."""
    pa, pb = a.parameters(), b.parameters()
    assert sorted(pa) == sorted(pb)
    for k in pa:
        np.testing.assert_array_equal(np.asarray(pa[k]), np.asarray(pb[k]), err_msg=k)
