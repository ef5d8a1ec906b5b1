"""Shared driver for the atheris fuzz targets in this folder.

A target defines ``one_input(data: bytes)`` that feeds the bytes to a public entry
point and re-raises nothing it was promised to raise. :func:`main` wraps it so that:

* an exception whose type is in ``allowed`` (the documented errors of that entry
  point) counts as a correct rejection, provided its message passes ``check_message``
  (e.g. it names the file);
* any other exception, a failed invariant (``AssertionError``), a hang past
  ``-timeout`` or a process crash (segfault, abort, sanitizer report) is a finding:
  libFuzzer writes the input to ``<artifact_prefix>crash-<sha1>`` and exits non-zero.

Run a target by hand::

    python tests/fuzz/fuzz_config.py -atheris_runs=20000 /tmp/new tests/fuzz/corpus/config
    python tests/fuzz/fuzz_config.py /path/to/crash-file      # replay one input

The first corpus folder receives new inputs, so give a scratch folder first and the
checked-in seeds second.
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Callable, Iterable, Optional, Sequence, Tuple, Type

HERE = os.path.dirname(os.path.abspath(__file__))


class Finding(AssertionError):
    """An input made a public entry point break its promise."""


def scratch_dir() -> str:
    """A per-process folder for files the targets write: under ``$SLIDE_FUZZ_SCRATCH`` when set
    (run.py sets it inside its output folder: libFuzzer ends a target with C's ``exit``, which
    skips Python's clean-up), else a temporary folder removed at a normal interpreter exit."""
    global _SCRATCH
    root = os.environ.get("SLIDE_FUZZ_SCRATCH")
    if root:
        path = os.path.join(root, str(os.getpid()))
        os.makedirs(path, exist_ok=True)
        return path
    try:
        return _SCRATCH.name
    except NameError:
        _SCRATCH = tempfile.TemporaryDirectory(prefix="slide-fuzz-")
        return _SCRATCH.name


def strict() -> bool:
    """True when known, already reported issues must fail too (SLIDE_FUZZ_STRICT=1)."""
    return os.environ.get("SLIDE_FUZZ_STRICT", "") not in ("", "0")


def guard(fn: Callable[[bytes], None], allowed: Tuple[Type[BaseException], ...],
          check_message: Optional[Callable[[BaseException], Optional[str]]] = None,
          known: Sequence[Callable[[BaseException], bool]] = ()) -> Callable[[bytes], None]:
    """Wrap ``fn`` so documented exceptions pass and anything else escapes to libFuzzer.

    ``known`` lists predicates matching issues that are already reported (see
    README.md, "Findings"): they are tolerated so the fuzzer keeps searching for new
    ones, unless SLIDE_FUZZ_STRICT=1. Each predicate should match one bug narrowly.
    """
    def wrapped(data: bytes) -> None:
        try:
            fn(data)
        except allowed as e:
            feedback(outcome_of(e))
            if check_message is not None:
                problem = check_message(e)
                if problem:
                    if not strict() and any(k(e) for k in known):
                        return
                    raise Finding(f"{type(e).__name__} with an unhelpful message ({problem}): {e}") from e
        except Exception as e:
            if not strict() and any(k(e) for k in known):
                return
            raise
    return wrapped


def innermost_file(e: BaseException) -> str:
    """File name of the frame that raised ``e``."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename if tb is not None else ""


def passed_through(e: BaseException, filename_suffix: str, functions) -> bool:
    """True when ``e`` passed through one of ``functions`` of a file ending with ``filename_suffix``."""
    import traceback

    return any(f.filename.endswith(filename_suffix) and f.name in functions
               for f in traceback.extract_tb(e.__traceback__))


def raised_in(e: BaseException, filename_suffix: str, function: str) -> bool:
    """True when the innermost frame of ``e`` in a file ending with ``filename_suffix``
    belongs to ``function`` (used to pin a known issue to its place)."""
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.endswith(filename_suffix)]
    return bool(frames) and frames[-1].name == function


_FEEDBACK = []


def _feedback_functions(n: int = 512):
    """``n`` distinct instrumented functions: calling one adds a coverage edge of its own."""
    if not _FEEDBACK:
        import atheris

        for i in range(n):
            ns: dict = {}
            exec(f"def _outcome_{i}():\n    return {i}\n", ns)
            _FEEDBACK.append(atheris.instrument_func(ns[f"_outcome_{i}"]))
    return _FEEDBACK


def feedback(outcome: str) -> None:
    """Report what an input did (an error kind, a shape class) as coverage.

    The C++ readers cannot be compiled with libFuzzer's coverage here (gcc has no
    -fsanitize=fuzzer), so without this the fuzzer would see every input as
    equivalent and keep none. Mapping each distinct outcome to its own
    instrumented function makes inputs that reach a new outcome worth keeping.
    """
    import zlib

    funcs = _feedback_functions()
    funcs[zlib.crc32(outcome.encode("utf-8", "replace")) % len(funcs)]()


def outcome_of(e: BaseException) -> str:
    """An exception's kind with numbers and quoted values removed ("line 3: id 7" -> "line #: id #")."""
    import re

    text = re.sub(r"'[^']*'|\"[^\"]*\"", "Q", str(e))
    text = re.sub(r"[^\s:]*[/\\][^\s:]*", "P", text)  # paths
    return type(e).__name__ + ":" + re.sub(r"\d+", "#", text)[:200]


def main(one_input: Callable[[bytes], None], argv: Optional[Iterable[str]] = None) -> None:
    import atheris

    args = list(sys.argv if argv is None else argv)
    atheris.Setup(args, one_input)
    atheris.Fuzz()
