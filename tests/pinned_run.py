"""Trains the pinned engine configurations and prints their fingerprints as JSON.

Run by tests/test_pinned.py in a subprocess per kernel set (SLIDE_ISA is read once per
process), and by hand to regenerate tests/data/pinned.json after an intended change of
results:  python tests/pinned_run.py --write

Every spec key is given explicitly, so changes of defaults elsewhere cannot move the pins;
the engine is driven through slide._core directly (no Python training loop), on the first
rows of the bundled bibtex set, one thread, fixed seed, fixed batch order.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(ROOT, "datasets", "bibtex", "train.txt")
FIXTURE = os.path.join(HERE, "data", "pinned.json")
N_TRAIN, N_TEST = 480, 24
EPOCHS, BATCH, LR = 3, 32, 5e-3


def read_xc(path, n):
    """The first n rows of an XC text file as CSR arrays (features, labels), unnormalised."""
    with open(path) as f:
        _, D, C = (int(v) for v in f.readline().split())
        xp, xi, xv, yp, yi = [0], [], [], [0], []
        for _ in range(n):
            line = f.readline().rstrip("\n")
            head, _, rest = line.partition(" ")
            yi.extend(int(v) for v in head.split(",") if v)
            for tok in rest.split():
                k, v = tok.split(":")
                xi.append(int(k))
                xv.append(float(v))
            xp.append(len(xi))
            yp.append(len(yi))
    x = (np.array(xp, np.int64), np.array(xi, np.int32), np.array(xv, np.float32))
    y = (np.array(yp, np.int64), np.array(yi, np.int32))
    return x, y, D, C


def lsh_keys(**over):
    d = dict(family="dwta", K=3, L=8, range_pow=0, bucket_capacity=32, bucket_policy="fifo", bin_size=8,
             selection="vanilla", threshold=2, min_active=0, max_active=0)
    d.update(over)
    return d


def configs(D, C):
    common = dict(input_dim=D, beta1=0.9, beta2=0.999, eps=1e-8, threads=1, seed=11,
                  rebuild_first=3, rebuild_decay=0.3, hugepages=False, recompute=False)
    hidden = dict(size=32, activation="relu", sampling="dense", **lsh_keys())
    return {
        # Dense softmax output: the layer-by-layer batched path; dropout and decay on.
        "dense": dict(common, lr=5e-3, dropout=0.2, weight_decay=1e-4,
                      layers=[hidden, dict(size=C, activation="softmax", sampling="dense", **lsh_keys())]),
        # Hash-sampled output: the per-sample path with in-batch negatives (C > 2 x 40),
        # logQ weights (label frequencies set), random fill and table rebuilds.
        "lsh": dict(common, lr=5e-3, dropout=0.0, weight_decay=0.0,
                    layers=[hidden, dict(size=C, activation="softmax", sampling="lsh",
                                         **lsh_keys(min_active=16, max_active=40))]),
        # SimHash tables with top-k selection and reservoir buckets, a second hidden layer.
        "lsh_simhash": dict(common, lr=5e-3, dropout=0.1, weight_decay=1e-4,
                            layers=[hidden, dict(size=24, activation="relu", sampling="dense", **lsh_keys()),
                                    dict(size=C, activation="softmax", sampling="lsh",
                                         **lsh_keys(family="simhash", K=5, L=6, bucket_policy="reservoir",
                                                    selection="topk", min_active=12, max_active=30))]),
        # A hash-sampled hidden layer (WTA, threshold selection) before a dense output layer:
        # the per-sample path with a dense output layer.
        "lsh_hidden": dict(common, lr=5e-3, dropout=0.1, weight_decay=0.0,
                           layers=[hidden, dict(size=48, activation="relu", sampling="lsh",
                                                **lsh_keys(family="wta", K=2, L=6, selection="threshold",
                                                           min_active=8, max_active=24)),
                                   dict(size=C, activation="softmax", sampling="dense", **lsh_keys())]),
        # A first layer wider than the recorded-gradient limit: lock-free (HOGWILD) gradient
        # buffers with row markers, then the per-sample path.
        "wide_hidden": dict(common, lr=5e-3, dropout=0.0, weight_decay=1e-4,
                            layers=[dict(hidden, size=4100),
                                    dict(size=C, activation="softmax", sampling="dense", **lsh_keys())]),
    }


def run_one(name, spec, x, y, C):
    from slide._core import Network

    net = Network(spec)
    if name == "lsh":
        counts = np.bincount(y[1], minlength=C).astype(np.float64)
        net.set_label_frequencies((counts / (len(x[0]) - 1)).astype(np.float32))
    train_rows = N_TRAIN
    rng = np.random.default_rng(5)
    losses = []
    for _ in range(EPOCHS):
        perm = rng.permutation(train_rows).astype(np.int64)
        for s in range(0, train_rows, BATCH):
            losses.append(float(net.train_batch(*x, *y, perm[s:s + BATCH], LR)))
    h = hashlib.sha256()
    params = net.parameters()
    for k in sorted(params):
        h.update(k.encode())
        h.update(np.ascontiguousarray(params[k]).tobytes())
    tx = (x[0][train_rows:] - x[0][train_rows], x[1][x[0][train_rows]:], x[2][x[0][train_rows]:])
    out = {"params_sha256": h.hexdigest(), "step": int(net.step),
           "loss_sha256": hashlib.sha256(np.array(losses, np.float32).tobytes()).hexdigest()}
    for mode in (("exact", "lsh") if name in ("lsh", "lsh_simhash") else ("exact",)):
        labels, scores = net.predict_topk(*tx, 5, mode)
        out[f"top5_{mode}"] = labels.tolist()
        out[f"scores_{mode}_sha256"] = hashlib.sha256(scores.tobytes()).hexdigest()
    return out


def fingerprints():
    from slide._core import cpu_features

    x, y, D, C = read_xc(TRAIN, N_TRAIN + N_TEST)
    res = {"isa": cpu_features()["kernels"]}
    for name, spec in configs(D, C).items():
        res[name] = run_one(name, spec, x, y, C)
    return res


def available_isas():
    from slide._core import cpu_features

    f = cpu_features()
    isas = ["generic"]
    if f["avx2"] and f["fma"]:
        isas.append("avx2")
    if f["avx512f"]:
        isas.append("avx512")
    return isas


def run_isa(isa):
    env = dict(os.environ, SLIDE_ISA=isa)
    out = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="regenerate tests/data/pinned.json for every ISA here")
    a = ap.parse_args()
    if not a.write:
        print(json.dumps(fingerprints()))
        return
    data = {}
    if os.path.exists(FIXTURE):
        with open(FIXTURE) as f:
            data = json.load(f)
    for isa in available_isas():
        r = run_isa(isa)
        assert r["isa"] == isa, (isa, r["isa"])
        data[isa] = r
    with open(FIXTURE, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
