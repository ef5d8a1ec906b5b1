"""slide._util: the one JSON conversion, peak-memory reader and byte formatter of the package."""
import json
import math
import subprocess
import sys

import numpy as np

from slide._util import format_bytes, jsonable, peak_rss_bytes


def test_jsonable_turns_numpy_into_json():
    obj = {1: np.int64(3), "x": (np.float32(0.5), np.bool_(True)), "a": np.arange(3, dtype=np.int32),
           "nested": [{"m": np.array([[1.5, np.nan]])}]}
    out = jsonable(obj)
    assert json.loads(json.dumps(out, allow_nan=False)) == {
        "1": 3, "x": [0.5, True], "a": [0, 1, 2], "nested": [{"m": [[1.5, None]]}]}
    assert type(out["1"]) is int and type(out["x"][1]) is bool


def test_jsonable_keeps_nonfinite_floats_when_asked():
    values = [float("nan"), np.float64("inf"), -math.inf, 1.0]
    assert jsonable(values) == [None, None, None, 1.0]
    kept = jsonable(values, nonfinite_as_none=False)
    assert math.isnan(kept[0]) and kept[1:] == [math.inf, -math.inf, 1.0]


def test_format_bytes():
    assert format_bytes(0) == "0 B" and format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(3 * 2**30) == "3.0 GiB"
    assert format_bytes(5 * 2**40) == "5.0 TiB" and format_bytes(2**50) == "1024.0 TiB"
    assert format_bytes(None) == "-"


def test_peak_rss_grows_with_touched_memory():
    # A fresh interpreter (this one's peak may already be above anything allocated here),
    # started while this process holds 256 MiB more: a worker's peak is its own memory.
    ballast = np.ones(2**25)
    code = ("import numpy as np; from slide._util import peak_rss_bytes; before = peak_rss_bytes(); "
            "block = np.ones(2**24); print(before, peak_rss_bytes())")   # 128 MiB, written
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before, after = map(int, r.stdout.split())
    assert 10 * 2**20 < before < ballast.nbytes and after - before >= 96 * 2**20, (before, after)
