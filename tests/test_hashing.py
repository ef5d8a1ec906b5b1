"""LSH hash families, tables and active-set selection (slide._core.LshIndex)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from slide import _core

FAMILIES = ("simhash", "wta", "dwta")


def unit(v):
    return v / np.linalg.norm(v)


def pair_at_angle(rng, dim, theta):
    """Two unit vectors at exactly `theta` radians."""
    x = unit(rng.standard_normal(dim))
    z = rng.standard_normal(dim)
    z = unit(z - z.dot(x) * x)
    return x, np.cos(theta) * x + np.sin(theta) * z


def bit_matrix(ids, bits):
    """uint32 ids [..., L] -> 0/1 array [..., L * bits] of their low `bits` bits."""
    shifts = np.arange(bits, dtype=np.uint32)
    return ((ids[..., None] >> shifts) & 1).reshape(*ids.shape[:-1], -1)


# ---------------------------------------------------------------------------------------------
# Hash families


def test_simhash_bit_collision_rate_is_one_minus_angle_over_pi():
    rng = np.random.default_rng(1)
    dim, K, L = 128, 8, 64
    index = _core.LshIndex("simhash", dim, K, L, seed=3)
    assert index.range_pow == K
    for theta in (0.2, 0.8, 1.5, 2.5):
        agree = []
        for _ in range(40):
            x, y = pair_at_angle(rng, dim, theta)
            bx, by = bit_matrix(index.hash(x), K), bit_matrix(index.hash(y), K)
            agree.append(np.mean(bx == by))
        rate = float(np.mean(agree))
        assert abs(rate - (1 - theta / np.pi)) < 0.03, (theta, rate)


@pytest.mark.parametrize("family", ["wta", "dwta"])
def test_wta_identical_and_rank_equivalent_inputs_always_collide(family):
    rng = np.random.default_rng(2)
    index = _core.LshIndex(family, 64, 4, 32, seed=5)
    for _ in range(20):
        x = rng.random(64).astype(np.float32) + 0.1
        h = index.hash(x)
        assert np.array_equal(h, index.hash(x.copy()))
        # WTA codes depend only on the order of the coordinates: a monotone map keeps every bucket.
        assert np.array_equal(h, index.hash(3.0 * x + 1.0))
        assert np.array_equal(h, index.hash(np.sqrt(x)))


@pytest.mark.parametrize("family", FAMILIES)
def test_closer_inputs_collide_more_often(family):
    rng = np.random.default_rng(3)
    dim = 128
    index = _core.LshIndex(family, dim, 3 if family != "simhash" else 8, 64, seed=7)
    rates = []
    for noise in (0.1, 0.5, 2.0):
        hits = []
        for _ in range(30):
            x = rng.standard_normal(dim).astype(np.float32)
            y = x + noise * rng.standard_normal(dim).astype(np.float32)
            if family == "dwta":  # ReLU-like inputs: DWTA looks at non-zero entries only
                x, y = np.maximum(x, 0), np.maximum(y, 0)
            hits.append(np.mean(index.hash(x) == index.hash(y)))
        rates.append(float(np.mean(hits)))
    assert rates[0] > rates[1] > rates[2], rates
    assert rates[0] > 0.3 and rates[2] < 0.2, rates


def test_dwta_gives_varied_codes_for_inputs_with_two_or_three_nonzeros():
    rng = np.random.default_rng(4)
    dim, K, L = 128, 4, 32
    index = _core.LshIndex("dwta", dim, K, L, seed=11)
    all_ids = []
    for nnz in (2, 3) * 50:
        x = np.zeros(dim, np.float32)
        x[rng.choice(dim, nnz, replace=False)] = rng.random(nnz) + 0.5
        ids = index.hash(x)
        # Densification fills the empty bins: the L tables do not all fall back to one bucket.
        assert len(np.unique(ids)) > L // 4
        all_ids.append(ids)
    all_ids = np.array(all_ids)
    # Different sparse inputs land in different buckets, and the bits are all exercised.
    assert len(np.unique(all_ids[:, 0])) > 30
    bits = bit_matrix(all_ids, index.range_pow)
    assert np.all(bits.mean(axis=(0, 1)).reshape(-1) > 0.1)


def test_dwta_all_zero_input_has_fixed_documented_bucket():
    index = _core.LshIndex("dwta", 32, 4, 8, seed=1)
    assert np.array_equal(index.hash(np.zeros(32, np.float32)), np.zeros(8, np.uint32))


def test_dwta_agrees_with_wta_on_inputs_without_zeros():
    rng = np.random.default_rng(5)
    wta = _core.LshIndex("wta", 64, 4, 16, seed=9)
    dwta = _core.LshIndex("dwta", 64, 4, 16, seed=9)
    X = rng.random((50, 64)).astype(np.float32) + 0.01
    assert np.array_equal(wta.hash_batch(X), dwta.hash_batch(X))


@pytest.mark.parametrize(
    "family,K,range_pow,bin_size,n",
    [
        ("simhash", 10, 10, 8, 1024),   # sign bits used directly
        ("simhash", 14, 10, 8, 1024),   # 14 bits folded to 10
        ("wta", 3, 0, 8, 512),          # 3 codes x 3 bits concatenated: 9 bits
        ("wta", 6, 10, 8, 1024),        # 18 code bits folded to 10
        ("dwta", 3, 0, 8, 512),
        ("dwta", 8, 10, 8, 1024),
        ("dwta", 24, 10, 16, 1024),     # 96 code bits (more than a word) folded to 10
    ],
)
def test_bucket_occupancy_matches_uniform_hashing_and_every_bit_is_used(family, K, range_pow, bin_size, n):
    rng = np.random.default_rng(6)
    dim, L = 128, 8
    index = _core.LshIndex(family, dim, K, L, range_pow=range_pow, bucket_capacity=1000, seed=13,
                           bin_size=bin_size)
    r = index.range_pow
    W = rng.standard_normal((n, dim)).astype(np.float32)
    if family == "dwta":
        W = np.maximum(W, 0)  # ReLU-like: about half the entries are zero
    index.build(W, threads=2)
    expected = 1 - (1 - 2.0 ** -r) ** n
    # A bug such as overlapping code shifts leaves most ids unreachable and fails this by far.
    assert abs(index.occupancy() - expected) < 0.02, (index.occupancy(), expected)
    bits = bit_matrix(index.hash_batch(W), r).reshape(n, L, r)
    frac = bits.mean(axis=0)
    assert np.all((frac > 0.4) & (frac < 0.6)), frac


@pytest.mark.parametrize("family,K", [("simhash", 9), ("wta", 3), ("dwta", 3)])
def test_every_table_spreads_random_inputs_uniformly_over_its_buckets(family, K):
    # Chi-square per table: codes of one table that share input coordinates are correlated and
    # skew the bucket sizes far beyond the ~1 +- 0.06 that uniform hashing gives here.
    rng = np.random.default_rng(14)
    X = rng.standard_normal((20000, 128)).astype(np.float32)
    if family == "dwta":
        X = np.maximum(X, 0)
    index = _core.LshIndex(family, 128, K, 12, seed=21)
    ids = index.hash_batch(X, threads=2)
    buckets = 2 ** index.range_pow
    expected = len(X) / buckets
    for t in range(index.L):
        counts = np.bincount(ids[:, t], minlength=buckets)
        chi2_per_dof = ((counts - expected) ** 2 / expected).sum() / (buckets - 1)
        assert chi2_per_dof < 1.35, (t, chi2_per_dof)


def test_hash_batch_matches_hash_and_threads_do_not_matter():
    rng = np.random.default_rng(7)
    for family in FAMILIES:
        index = _core.LshIndex(family, 48, 4, 10, seed=2)
        X = rng.standard_normal((40, 48)).astype(np.float32)
        batch = index.hash_batch(X, threads=2)
        assert batch.shape == (40, 10) and batch.dtype == np.uint32
        assert np.array_equal(batch, np.array([index.hash(x) for x in X]))
        assert np.array_equal(batch, index.hash_batch(X, threads=1))
        assert np.all(batch < 2 ** index.range_pow)


def test_default_range_pow_per_family():
    assert _core.LshIndex("simhash", 128, 9, 4).range_pow == 9
    assert _core.LshIndex("wta", 128, 4, 4).range_pow == 12
    assert _core.LshIndex("dwta", 128, 8, 4).range_pow == 18  # 24 code bits capped at 18
    assert _core.LshIndex("dwta", 128, 4, 4, bin_size=4).range_pow == 8


def test_same_seed_same_hashes_other_seed_differs():
    rng = np.random.default_rng(8)
    X = rng.standard_normal((20, 64)).astype(np.float32)
    for family in FAMILIES:
        a = _core.LshIndex(family, 64, 6, 8, seed=1).hash_batch(X)
        b = _core.LshIndex(family, 64, 6, 8, seed=1).hash_batch(X)
        c = _core.LshIndex(family, 64, 6, 8, seed=2).hash_batch(X)
        assert np.array_equal(a, b)
        assert not np.array_equal(a, c)


def test_generic_kernels_give_the_same_buckets_as_vector_kernels():
    code = (
        "import numpy as np\n"
        "from slide import _core\n"
        "X = np.random.default_rng(0).standard_normal((30, 128)).astype(np.float32)\n"
        "X[:, ::3] = 0\n"
        "out = [_core.LshIndex(f, 128, 6, 20, seed=4, bin_size=b).hash_batch(X)\n"
        "       for f in ('simhash', 'wta', 'dwta') for b in (4, 8, 16)]\n"
        "np.save(__import__('sys').argv[1], np.stack(out))\n"
    )
    results = []
    for isa in ("generic", ""):
        env = dict(os.environ)
        env.pop("SLIDE_ISA", None)
        if isa:
            env["SLIDE_ISA"] = isa
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"slide_hash_{os.getpid()}_{isa or 'native'}.npy")
        subprocess.run([sys.executable, "-c", code, path], check=True, env=env)
        results.append(np.load(path))
        os.remove(path)
    assert np.array_equal(results[0], results[1])


# ---------------------------------------------------------------------------------------------
# Tables


def bucket_contents(index, ids):
    """{(table, bucket id): sorted items} for every bucket that the rows' ids name."""
    out = {}
    for t in range(index.L):
        for b in np.unique(ids[:, t]):
            out[(t, int(b))] = np.sort(index.bucket(t, int(b)))
    return out


@pytest.mark.parametrize("policy", ["fifo", "reservoir"])
def test_full_buckets_keep_exactly_capacity_items_that_hash_there(policy):
    rng = np.random.default_rng(9)
    n, dim, cap = 3000, 32, 5
    index = _core.LshIndex("simhash", dim, 6, 4, bucket_capacity=cap, policy=policy, seed=3)
    W = rng.standard_normal((n, dim)).astype(np.float32)
    index.build(W, threads=2)
    ids = index.hash_batch(W)
    for (t, b), items in bucket_contents(index, ids).items():
        in_bucket = np.flatnonzero(ids[:, t] == b)
        assert len(items) == min(cap, len(in_bucket))
        assert len(np.unique(items)) == len(items)
        assert np.all(np.isin(items, in_bucket))


def test_policies_differ_and_kept_items_spread_over_ids():
    rng = np.random.default_rng(10)
    W = rng.standard_normal((4000, 16)).astype(np.float32)
    kept = {}
    for policy in ("fifo", "reservoir"):
        index = _core.LshIndex("simhash", 16, 4, 2, bucket_capacity=20, policy=policy, seed=3)
        index.build(W)
        kept[policy] = np.concatenate([index.bucket(0, b) for b in range(16)])
        # Kept items are not biased towards low or high ids.
        assert 1500 < kept[policy].mean() < 2500
    assert not np.array_equal(np.sort(kept["fifo"]), np.sort(kept["reservoir"]))


@pytest.mark.parametrize("policy", ["fifo", "reservoir"])
def test_overfull_bucket_keeps_every_item_equally_often(policy):
    # 40 identical rows share one bucket in each of 200 tables of capacity 10: each table keeps
    # a different sample, and over the tables every item is kept about 200 * 10 / 40 = 50 times.
    index = _core.LshIndex("simhash", 8, 1, 200, bucket_capacity=10, policy=policy, seed=17)
    W = np.tile(np.arange(1, 9, dtype=np.float32), (40, 1))
    index.build(W)
    ids = index.hash(W[0])
    kept = np.concatenate([index.bucket(t, int(ids[t])) for t in range(200)])
    assert len(kept) == 2000
    freq = np.bincount(kept, minlength=40)
    assert freq.min() > 25 and freq.max() < 75, freq


def test_build_is_deterministic_for_a_seed_regardless_of_threads():
    rng = np.random.default_rng(11)
    W = rng.standard_normal((2000, 32)).astype(np.float32)
    contents = []
    for threads, seed in ((1, 5), (2, 5), (2, 6)):
        index = _core.LshIndex("dwta", 32, 2, 6, bucket_capacity=8, policy="reservoir", seed=seed)
        index.build(W, threads=threads)
        contents.append(bucket_contents(index, index.hash_batch(W)))
    same = contents[0].keys() == contents[1].keys() and all(
        np.array_equal(contents[0][k], contents[1][k]) for k in contents[0])
    assert same
    other = contents[0].keys() == contents[2].keys() and all(
        np.array_equal(contents[0][k], contents[2][k]) for k in contents[0])
    assert not other


def test_table_memory_grows_with_items_and_tables_not_with_range():
    rng = np.random.default_rng(12)
    W = rng.standard_normal((4000, 64)).astype(np.float32)

    def mem(n, L, range_pow):
        index = _core.LshIndex("dwta", 64, 8, L, range_pow=range_pow, bucket_capacity=128, seed=1)
        index.build(W[:n])
        return index.memory_bytes()

    base = mem(1000, 4, 24)
    assert 3.0 < mem(4000, 4, 24) / base < 5.0
    assert 3.0 < mem(1000, 16, 24) / base < 5.0
    # 2^24 buckets x 128 slots x 4 tables would be 8 GiB; we hold tens of bytes per (item, table).
    assert mem(4000, 4, 24) < 40 * 4000 * 4
    assert mem(4000, 4, 24) < 2 * mem(4000, 4, 12) + 64 * 4000 * 4


def test_bucket_lookup_of_absent_or_empty_bucket():
    index = _core.LshIndex("simhash", 16, 8, 2, seed=1)
    assert len(index.bucket(0, 3)) == 0  # before build
    index.build(np.ones((1, 16), np.float32))
    b = index.hash(np.ones(16, np.float32))
    assert list(index.bucket(1, int(b[1]))) == [0]
    assert len(index.bucket(1, int(b[1]) ^ 1)) == 0


@pytest.mark.parametrize("family,K,L", [("simhash", 9, 20), ("wta", 4, 20), ("dwta", 4, 20)])
def test_query_finds_near_neighbours_in_a_small_active_set(family, K, L):
    # What the engine relies on: neurons whose weights resemble the input are retrieved while
    # the active set stays a small fraction of the layer.
    rng = np.random.default_rng(15)
    n, dim = 5000, 128
    recall, frac = [], []
    for trial in range(5):
        x = np.maximum(rng.standard_normal(dim), 0).astype(np.float32)
        W = rng.standard_normal((n, dim)).astype(np.float32)
        W[:20] = x + 0.5 * rng.standard_normal((20, dim))
        index = _core.LshIndex(family, dim, K, L, seed=trial)
        index.build(W)
        active = index.query(x)
        recall.append(np.isin(np.arange(20), active).mean())
        frac.append(len(active) / n)
    assert np.mean(recall) > 0.75, recall
    assert np.mean(frac) < 0.08, frac


# ---------------------------------------------------------------------------------------------
# Active-set selection


@pytest.fixture(scope="module")
def planted():
    """Items 0..19 equal the query (found in every table); 20..1999 are random."""
    rng = np.random.default_rng(13)
    dim, L = 32, 10
    x = rng.standard_normal(dim).astype(np.float32)
    W = rng.standard_normal((2000, dim)).astype(np.float32)
    W[:20] = x
    index = _core.LshIndex("simhash", dim, 4, L, bucket_capacity=1000, seed=2)
    index.build(W)
    ids = index.hash(x)
    counts = np.zeros(2000, int)
    for t in range(L):
        counts[index.bucket(t, int(ids[t]))] += 1
    return index, x, counts


def test_vanilla_is_the_union_of_the_buckets(planted):
    index, x, counts = planted
    active = index.query(x)
    assert active.dtype == np.int32
    assert len(np.unique(active)) == len(active)
    assert set(active.tolist()) == set(np.flatnonzero(counts).tolist())


def test_threshold_keeps_neurons_found_in_enough_tables(planted):
    index, x, counts = planted
    for thr in (1, 3, 10):
        active = index.query(x, selection="threshold", threshold=thr)
        assert set(active.tolist()) == set(np.flatnonzero(counts >= thr).tolist())
    assert set(range(20)) <= set(index.query(x, selection="threshold", threshold=10).tolist())


def test_topk_keeps_the_most_frequent(planted):
    index, x, counts = planted
    for k in (10, 20, 150):
        active = index.query(x, selection="topk", max_active=k)
        assert len(active) == min(k, np.count_nonzero(counts))
        left_out = np.setdiff1d(np.flatnonzero(counts), active)
        if len(left_out):
            assert counts[active].min() >= counts[left_out].max()
        if k <= 20:
            assert set(active.tolist()) <= set(range(20))
    full = index.query(x, selection="topk")
    assert np.all(np.diff(counts[full]) <= 0)  # most frequent first


def test_forced_first_deduplicated_and_always_kept(planted):
    index, x, counts = planted
    forced = np.array([1999, 7, 1999, 500, 7], np.int64)
    for selection in ("vanilla", "topk", "threshold"):
        active = index.query(x, forced=forced, selection=selection, max_active=2)
        assert active.tolist() == [1999, 7, 500]
        active = index.query(x, forced=forced, selection=selection, max_active=50)
        assert active[:3].tolist() == [1999, 7, 500]
        assert len(active) == 50 or selection == "threshold"
        assert len(np.unique(active)) == len(active)


def test_random_fill_to_min_active_and_cap_at_max_active(planted):
    index, x, counts = planted
    n_cand = np.count_nonzero(counts)
    active = index.query(x, min_active=n_cand + 300, seed=1)
    assert len(active) == n_cand + 300
    assert len(np.unique(active)) == len(active)
    assert active.min() >= 0 and active.max() < 2000
    assert set(np.flatnonzero(counts).tolist()) <= set(active.tolist())
    # Filling almost the whole layer (dense path) and beyond it.
    assert len(np.unique(index.query(x, min_active=1990))) == 1990
    assert np.array_equal(np.sort(index.query(x, min_active=5000)), np.arange(2000))
    capped = index.query(x, min_active=100, max_active=60)
    assert len(capped) == 60
    # Same seed, same set; the sampler's reused scratch does not leak between calls.
    m = n_cand + 300
    assert np.array_equal(index.query(x, min_active=m, seed=4), index.query(x, min_active=m, seed=4))
    assert not np.array_equal(index.query(x, min_active=m, seed=4), index.query(x, min_active=m, seed=5))


def test_topk_cut_does_not_block_random_fill(planted):
    index, x, counts = planted
    active = index.query(x, selection="threshold", threshold=10, min_active=1000)
    assert len(active) == 1000 and len(np.unique(active)) == 1000
    assert set(range(20)) <= set(active.tolist())


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(family="md5"), "unknown hash family"),
        (dict(K=0), "lsh.K"),
        (dict(L=0), "lsh.L"),
        (dict(range_pow=31), "range_pow"),
        (dict(family="simhash", K=6, range_pow=8), "cannot exceed K"),
        (dict(family="wta", K=2, range_pow=7), "cannot exceed"),
        (dict(bucket_capacity=0), "bucket_capacity"),
        (dict(policy="lru"), "unknown bucket policy"),
        (dict(bin_size=6), "bin_size"),
        (dict(dim=4), "bin_size"),
        (dict(dim=0, family="simhash"), "dimension"),
    ],
)
def test_invalid_parameters_raise_value_error(kwargs, match):
    args = dict(family="dwta", dim=32, K=4, L=4, range_pow=0, bucket_capacity=16, policy="fifo", seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        _core.LshIndex(**args)


def test_invalid_inputs_raise_value_error():
    index = _core.LshIndex("simhash", 16, 4, 4)
    with pytest.raises(ValueError, match="build"):
        index.query(np.zeros(16, np.float32))
    with pytest.raises(ValueError, match="expected dim=16"):
        index.hash(np.zeros(15, np.float32))
    with pytest.raises(ValueError, match="dtype"):
        index.hash(np.array(["a"] * 16))
    with pytest.raises(ValueError, match="dimension"):
        index.hash(np.zeros((2, 16), np.float32))
    with pytest.raises(ValueError, match="columns"):
        index.build(np.zeros((5, 8), np.float32))
    with pytest.raises(ValueError, match="threads"):
        index.build(np.zeros((5, 16), np.float32), threads=-1)
    # Non-contiguous and float64 input are converted, not rejected.
    W = np.random.default_rng(0).standard_normal((10, 32))[:, ::2]
    index.build(W)
    assert np.array_equal(index.hash(W[3]), index.hash_batch(np.ascontiguousarray(W, np.float32))[3])
    with pytest.raises(ValueError, match="forced id 10 out of range"):
        index.query(W[0], forced=np.array([10]))
    with pytest.raises(ValueError, match="integer"):
        index.query(W[0], forced=np.array([1.5]))
    with pytest.raises(ValueError, match="unknown selection"):
        index.query(W[0], selection="best")
    with pytest.raises(ValueError, match="threshold"):
        index.query(W[0], selection="threshold", threshold=0)
    with pytest.raises(ValueError, match="out of range"):
        index.bucket(4, 0)
