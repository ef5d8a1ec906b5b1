"""Fuzz ``slide.Network.load`` with damaged model files.

Promise under test (slide/network.py): a truncated, corrupt, foreign or other-version
file raises ``ValueError`` naming the file; nothing else escapes, nothing crashes. And
never a silently wrong model: when a damaged file does load, the network must be the
saved one (same parameters, same step, same predictions), because the zip container
checks a CRC-32 over every member.

At start-up the target trains a tiny network (30 features, 10 labels, one thread,
fixed seed), saves it and writes seeds next to it: the file itself, truncations at
several points, single bit flips, an empty file and a file whose metadata claims
another format version. The seed folder is added to libFuzzer's corpus folders.
"""
import json
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

import atheris  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import slide  # noqa: E402
import slide.network  # noqa: E402

# Python-side coverage of the loader (the editable install's import hook keeps
# instrument_imports from seeing slide's modules, so instrument the functions).
slide.Network.load = classmethod(atheris.instrument_func(slide.Network.load.__func__))


def small_dataset(n=64, num_features=30, num_labels=10, seed=0):
    rng = np.random.default_rng(seed)
    x = sp.random(n, num_features, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    x.data[:] = rng.random(x.data.size, dtype=np.float32) + 0.1
    y = sp.csr_matrix((np.ones(n, np.float32), rng.integers(0, num_labels, n), np.arange(n + 1)),
                      shape=(n, num_labels))
    y.sort_indices()
    return slide.Dataset(x, y, num_features=num_features, num_labels=num_labels)


def make_reference(folder):
    """Train, save and return (path, network, probe rows, probe predictions)."""
    data = small_dataset()
    net = slide.Network({"layers": [{"size": 8, "activation": "relu", "sampling": "dense"},
                                    {"activation": "softmax", "sampling": "dense"}],
                         "training": {"epochs": 1, "batch_size": 16, "threads": 1, "seed": 5}})
    net.fit(data)
    path = os.path.join(folder, "model.slide")
    net.save(path)
    return path, slide.Network.load(path), data.features, net.predict(data.features, k=3)


def write_seeds(model_path, seed_dir):
    blob = open(model_path, "rb").read()
    os.makedirs(seed_dir, exist_ok=True)
    seeds = {"full": blob, "empty": b"", "not_zip": b"slide model\n" * 8}
    for frac in (0.1, 0.5, 0.9, 0.99):
        seeds[f"trunc_{frac}"] = blob[: int(len(blob) * frac)]
    rng = np.random.default_rng(1)
    for i in range(6):
        b = bytearray(blob)
        pos = int(rng.integers(0, len(b)))
        b[pos] ^= 1 << int(rng.integers(0, 8))
        seeds[f"flip_{i}"] = bytes(b)
    # a well-formed file of another format version
    other = os.path.join(seed_dir, "..", "other.slide")
    with zipfile.ZipFile(model_path) as z, zipfile.ZipFile(other, "w") as out:
        for info in z.infolist():
            data = z.read(info.filename)
            if info.filename == "meta.npy":
                arr = np.load(z.open(info.filename))
                meta = json.loads(bytes(arr).decode())
                meta["format_version"] = 999
                import io

                buf = io.BytesIO()
                np.save(buf, np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
                data = buf.getvalue()
            out.writestr(info, data)
    seeds["other_version"] = open(other, "rb").read()
    for name, b in seeds.items():
        with open(os.path.join(seed_dir, name), "wb") as fh:
            fh.write(b)


_REF = {}


def _one(data: bytes) -> None:
    path = os.path.join(_harness.scratch_dir(), "input.slide")
    with open(path, "wb") as fh:
        fh.write(data)
    net = slide.Network.load(path)
    ref = _REF["net"]
    got, want = net.parameters(), ref.parameters()
    if sorted(got) != sorted(want) or any(not np.array_equal(got[k], want[k]) for k in want):
        raise _harness.Finding("a damaged file loaded as a network with different parameters")
    if (net.step, net.epoch, net.num_features, net.num_labels) != (ref.step, ref.epoch, ref.num_features,
                                                                   ref.num_labels):
        raise _harness.Finding("a damaged file loaded with a different step/epoch/shape")
    labels, scores = net.predict(_REF["probe"], k=3)
    if not (np.array_equal(labels, _REF["pred"][0]) and np.array_equal(scores, _REF["pred"][1])):
        raise _harness.Finding("a damaged file loaded as a network that predicts differently")
    _harness.feedback("loaded-identical")


def _names_file(e: BaseException):
    if isinstance(e, ValueError) and "input.slide" not in str(e):
        return "ValueError does not name the file"
    return None


one_input = _harness.guard(_one, (ValueError, MemoryError), check_message=_names_file)

if __name__ == "__main__":
    work = _harness.scratch_dir()
    ref_path, _REF["net"], _REF["probe"], _REF["pred"] = make_reference(work)
    argv = list(sys.argv)
    replay = any(os.path.isfile(a) for a in argv[1:] if not a.startswith("-"))
    if not replay:
        seed_dir = os.path.join(work, "seeds")
        write_seeds(ref_path, seed_dir)
        argv.append(seed_dir)
    _harness.main(one_input, argv)
