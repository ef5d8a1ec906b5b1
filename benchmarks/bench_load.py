"""Loading speed and memory: slide.load_dataset vs sklearn's load_svmlight_file.

    python benchmarks/bench_load.py [--mb 100] [--threads 0]

Writes a synthetic libsvm multilabel file of about --mb megabytes to a
temporary folder, then loads it in fresh subprocesses (one per measurement, so
each peak RSS is clean):

* slide cold:  slide.load_dataset(path, cache=False)
* slide warm:  slide.load_dataset(path) with the parse cache already filled
* sklearn:     sklearn.datasets.load_svmlight_file(path, multilabel=True)

Peak memory is the growth of the process's peak RSS during the call over its
RSS after imports (the kernel's high-water mark, the counter getrusage
reports, restarted just before the call), compared with the bytes of the
arrays the call returns. Prints a table and writes benchmarks/results/load.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "load.json"


# ----------------------------------------------------------------------------- data


def write_libsvm(path: Path, target_bytes: int, seed: int = 0, num_features: int = 100_000,
                 num_labels: int = 10_000) -> dict:
    """A random libsvm multilabel file: 1-based sorted feature ids, tf-idf-like values."""
    rng = np.random.default_rng(seed)
    written = points = nnz = 0
    with open(path, "w") as f:
        while written < target_bytes:
            rows = 4_000
            k = rng.integers(20, 120, rows)  # features per point
            m = rng.integers(0, 6, rows)  # labels per point (some have none)
            gaps = rng.integers(1, 2 * num_features // 120, int(k.sum()))
            # Per-row running sums of positive gaps: sorted, distinct, 1-based ids.
            ids = np.cumsum(gaps)
            ids = ids - np.repeat(np.concatenate([[0], ids[np.cumsum(k)[:-1] - 1]]), k)
            values = np.round(rng.random(int(k.sum())) * 0.3 + 1e-4, 6)
            labels = rng.integers(0, num_labels, int(m.sum()))
            lines = []
            fo = lo = 0
            for r in range(rows):
                lab = ",".join(map(str, sorted(set(labels[lo:lo + m[r]].tolist()))))
                feats = " ".join(f"{i}:{v:g}" for i, v in zip(ids[fo:fo + k[r]].tolist(), values[fo:fo + k[r]].tolist()))
                lines.append(f"{lab} {feats}\n")
                fo += k[r]
                lo += m[r]
            text = "".join(lines)
            f.write(text)
            written += len(text)
            points += rows
            nnz += int(k.sum())
    return {"bytes": path.stat().st_size, "points": points, "nnz": nnz}


# ----------------------------------------------------------------------------- worker


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    """Restarts this process's peak-RSS counter (Linux clear_refs), so the peak covers only what follows.

    Needed because getrusage's ru_maxrss also keeps the peak of the parent
    process image this one was forked from (it survives exec).
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_bytes(reset: bool) -> int:
    if reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(method: str, path: str, threads: int) -> dict:
    if method == "sklearn":
        from sklearn.datasets import load_svmlight_file
    else:
        import slide  # noqa: F401
    import scipy.sparse  # noqa: F401

    reset = _reset_peak()
    before = _rss_bytes()
    t0 = time.perf_counter()
    if method == "sklearn":
        X, y = load_svmlight_file(path, multilabel=True)
        seconds = time.perf_counter() - t0
        arrays = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
        arrays_note = "X arrays only (y is a list of tuples of Python floats)"
        points, nnz = X.shape[0], X.nnz
    else:
        ds = slide.load_dataset(path, cache=(method == "slide_warm"), num_threads=threads)
        seconds = time.perf_counter() - t0
        x, yl = ds.features, ds.labels
        arrays = sum(a.nbytes for a in (x.data, x.indices, x.indptr, yl.data, yl.indices, yl.indptr))
        arrays_note = "features + labels CSR"
        points, nnz = len(ds), x.nnz
    peak = _peak_bytes(reset)
    return {"seconds": seconds, "peak_rss_growth": max(0, peak - before), "array_bytes": int(arrays),
            "arrays": arrays_note, "points": int(points), "nnz": int(nnz)}


def run_worker(method: str, path: Path, threads: int, env: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", method, str(path), "--threads", str(threads)],
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="size of the generated file")
    ap.add_argument("--threads", type=int, default=0, help="slide parser threads (0: all cores)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each slide measurement (best kept)")
    ap.add_argument("--skip-sklearn", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("METHOD", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.threads)))
        return

    import slide

    with tempfile.TemporaryDirectory(prefix="slide-bench-load-") as tmp:
        tmp = Path(tmp)
        path = tmp / "data.libsvm"
        t0 = time.perf_counter()
        info = write_libsvm(path, int(args.mb * 1e6))
        print(f"generated {info['bytes'] / 1e6:.1f} MB, {info['points']:,} points, {info['nnz']:,} nnz "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
        env = dict(os.environ, SLIDE_CACHE_DIR=str(tmp / "cache"))

        # Same content as sklearn on a slice of the file.
        small = tmp / "small.libsvm"
        with open(path) as src, open(small, "w") as dst:
            for _, line in zip(range(2000), src):
                dst.write(line)
        ds = slide.load_dataset(small, cache=False)
        try:
            from sklearn.datasets import load_svmlight_file
            X, y = load_svmlight_file(str(small), multilabel=True, n_features=ds.num_features)
            assert X.shape == ds.features.shape and X.nnz == ds.features.nnz
            np.testing.assert_array_equal(X.indices, ds.features.indices)
            np.testing.assert_allclose(X.data, ds.features.data, rtol=1e-7)
            assert [tuple(map(int, t)) for t in y] == [tuple(r.indices) for r in ds.labels]
            have_sklearn = True
        except ImportError:
            have_sklearn = False

        results = {}
        for method in ("slide_cold", "slide_warm"):
            if method == "slide_warm":
                run_worker("slide_warm", path, args.threads, env)  # fills the cache
            runs = [run_worker(method, path, args.threads, env) for _ in range(args.repeats)]
            results[method] = min(runs, key=lambda r: r["seconds"])
            print(f"{method}: {results[method]['seconds']:.3f} s", flush=True)
        if have_sklearn and not args.skip_sklearn:
            results["sklearn"] = run_worker("sklearn", path, args.threads, env)
            print(f"sklearn: {results['sklearn']['seconds']:.3f} s", flush=True)

    base = results.get("sklearn", {}).get("seconds")
    rows = []
    for name, r in results.items():
        r["mb_per_second"] = info["bytes"] / 1e6 / r["seconds"]
        r["peak_over_arrays"] = r["peak_rss_growth"] / r["array_bytes"]
        r["speedup_vs_sklearn"] = base / r["seconds"] if base else None
        rows.append((name, r))
    print()
    print(f"{'loader':<12} {'seconds':>9} {'MB/s':>8} {'speedup':>8} {'peak RSS':>10} {'arrays':>10} {'ratio':>6}")
    for name, r in rows:
        sp = f"{r['speedup_vs_sklearn']:.1f}x" if r["speedup_vs_sklearn"] else "-"
        print(f"{name:<12} {r['seconds']:>9.3f} {r['mb_per_second']:>8.1f} {sp:>8} "
              f"{r['peak_rss_growth'] / 2**20:>8.1f}MB {r['array_bytes'] / 2**20:>8.1f}MB {r['peak_over_arrays']:>6.2f}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "file": info,
        "threads": args.threads or os.cpu_count(),
        "machine": {"cpus": os.cpu_count(), "processor": _cpu_name(), "python": platform.python_version(),
                    "load_average_1min": os.getloadavg()[0]},
        "results": results,
        "notes": "peak_rss_growth = peak RSS (VmHWM, reset before the call) minus RSS after imports; "
                 "sklearn array_bytes counts X only (y is a list of tuples)",
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
