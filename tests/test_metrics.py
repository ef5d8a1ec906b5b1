"""slide.metrics against hand-computed values and a plain per-point reference."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from slide import metrics


def _csr(rows, num_labels):
    indptr = np.cumsum([0] + [len(r) for r in rows])
    indices = np.array([l for r in rows for l in r], dtype=np.int32)
    return sp.csr_matrix((np.ones(len(indices), np.float32), indices, indptr),
                         shape=(len(rows), num_labels))


# point 0: labels {0, 2}; point 1: {1}; point 2: no label at all
Y = _csr([[0, 2], [1], []], 5)
TOP = np.array([[2, 1, 0], [1, 3, -1], [4, 0, 1]], dtype=np.int32)
P = np.array([0.5, 0.25, 1.0, 0.5, 0.5])  # inverse propensities 2, 4, 1, 2, 2


def test_hand_computed_values():
    r = metrics.evaluate(TOP, Y, k=(1, 3), propensities=P)
    # hits: [1,0,1], [1,0,0], [0,0,0]; the empty point counts in n
    assert r["P@1"] == pytest.approx(2 / 3)
    assert r["P@3"] == pytest.approx((2 / 3 + 1 / 3 + 0) / 3)
    assert r["nDCG@1"] == pytest.approx(2 / 3)
    ndcg0 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert r["nDCG@3"] == pytest.approx((ndcg0 + 1 + 0) / 3)
    assert r["R@1"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert r["R@3"] == pytest.approx(2 / 3)
    # PSP@1: gains 1 (label 2) + 4 (label 1); best: 2 (label 0) + 4
    assert r["PSP@1"] == pytest.approx(5 / 6)
    # PSP@3: gains 1 + 2 + 4 = best 2 + 1 + 4
    assert r["PSP@3"] == pytest.approx(1.0)
    assert r["PSnDCG@1"] == pytest.approx(5 / 6)
    # PSnDCG@3: each point's DCG is first divided by its IDCG@3 (1 + 1/log2(3) and 1)
    idcg0 = 1 + 1 / math.log2(3)
    assert r["PSnDCG@3"] == pytest.approx(((1 + 2 / 2) / idcg0 + 4) / ((2 + 1 / math.log2(3)) / idcg0 + 4))
    assert r["PSnDCG@3"] == pytest.approx(0.931081, abs=1e-6)
    assert list(r) == ["P@1", "P@3", "nDCG@1", "nDCG@3", "PSP@1", "PSP@3",
                       "PSnDCG@1", "PSnDCG@3", "R@1", "R@3"]


def test_individual_functions_match_evaluate():
    r = metrics.evaluate(TOP, Y, k=(1, 2, 3), propensities=P)
    for k in (1, 2, 3):
        assert metrics.precision_at_k(TOP, Y, k) == pytest.approx(r[f"P@{k}"])
        assert metrics.ndcg_at_k(TOP, Y, k) == pytest.approx(r[f"nDCG@{k}"])
        assert metrics.recall_at_k(TOP, Y, k) == pytest.approx(r[f"R@{k}"])
        assert metrics.psp_at_k(TOP, Y, k, propensities=P) == pytest.approx(r[f"PSP@{k}"])
        assert metrics.psndcg_at_k(TOP, Y, k, propensities=P) == pytest.approx(r[f"PSnDCG@{k}"])
    assert metrics.precision_at_k(TOP, Y, [1, 3]) == {1: pytest.approx(2 / 3), 3: pytest.approx(1 / 3)}


def test_k_larger_than_true_labels_perfect_ranking():
    # a perfect ranking followed by wrong guesses: P@k is capped by |y|/k, nDCG and PS* reach 1
    y = _csr([[3], [0, 4]], 6)
    top = np.array([[3, 0, 1, 2, 5], [4, 0, 1, 2, 3]])
    r = metrics.evaluate(top, y, k=(1, 5))
    assert r["P@1"] == 1.0
    assert r["P@5"] == pytest.approx((1 / 5 + 2 / 5) / 2)
    for key in ("nDCG@5", "PSP@5", "PSnDCG@5", "R@5", "nDCG@1", "PSP@1"):
        assert r[key] == pytest.approx(1.0), key


def test_padding_is_never_a_hit_and_may_repeat():
    y = _csr([[0], [1]], 3)
    top = np.array([[0, -1, -1], [-1, -1, -1]])
    r = metrics.evaluate(top, y, k=(1, 3))
    assert r["P@1"] == 0.5 and r["P@3"] == pytest.approx(1 / 6)


def test_a_ranking_of_every_label_is_complete():
    # with 3 labels a model can rank at most 3; P@5 counts the missing positions as misses
    y = _csr([[0], [1, 2]], 3)
    top = np.array([[0, 1, 2], [2, 0, 1]])
    r = metrics.evaluate(top, y, k=(1, 5))
    assert r["P@1"] == 1.0 and r["P@5"] == pytest.approx((1 / 5 + 2 / 5) / 2)
    assert r["R@5"] == 1.0 and r["nDCG@5"] == pytest.approx((1 + (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))) / 2)


def test_duplicate_predictions_are_rejected():
    with pytest.raises(ValueError, match="row 1 predicts label 2 more than once"):
        metrics.evaluate(np.array([[0, 1, 2], [2, 0, 2]]), _csr([[0], [2]], 3), k=3)
    # a duplicate beyond the largest k is outside the evaluated prefix and allowed
    assert metrics.precision_at_k(np.array([[0, 1, 1], [2, 0, 0]]), _csr([[0], [2]], 3), 2) == 0.5


@pytest.mark.parametrize("top,msg,exc", [
    (np.array([[0, 7], [1, 0]]), r"top_labels\[0, 1\] = 7 is not a label id in \[0, 3\)", ValueError),
    (np.array([[0, -2], [1, 0]]), r"top_labels\[0, 1\] = -2", ValueError),
    (np.array([[0.0, 1.0], [1.0, 0.0]]), "integer label ids", TypeError),
    (np.array([[0, 1]]), "1 rows but labels has 2", ValueError),
    (np.array([[0], [1]]), "1 columns, cannot compute metrics at k=2", ValueError),
])
def test_bad_predictions_raise(top, msg, exc):
    with pytest.raises(exc, match=msg):
        metrics.evaluate(top, _csr([[0], [1]], 3), k=(1, 2))


def test_bad_k_and_propensities_raise():
    with pytest.raises(ValueError, match="positive integers"):
        metrics.evaluate(TOP, Y, k=(0, 1))
    with pytest.raises(ValueError, match="one value per label"):
        metrics.evaluate(TOP, Y, k=1, propensities=np.ones(4))
    with pytest.raises(ValueError, match="positive"):
        metrics.evaluate(TOP, Y, k=1, propensities=np.zeros(5))


def test_propensity_model_values():
    # N = 100 training points; label 0 never seen, label 1 seen 10 times (hand-computed)
    p = metrics.propensities(np.array([0, 10]), num_points=100)
    assert p == pytest.approx([0.17317, 0.39102], abs=1e-4)
    # from the label matrix N and N_l are read off; Amazon parameters give a different curve
    y = sp.csr_matrix(np.ones((100, 1)))
    assert metrics.propensities(y)[0] == pytest.approx(1 / (1 + (math.log(100) - 1) * 2.5 ** 0.55 * 101.5 ** -0.55))
    pa = metrics.propensities(np.array([0, 10, 1000]), 0.6, 2.6, num_points=100)
    assert np.all(np.diff(pa) > 0) and pa[-1] < 1
    with pytest.raises(ValueError, match="num_points"):
        metrics.propensities(np.array([1, 2]))
    assert np.all(metrics.propensities(np.array([0, 5]), num_points=2) == 1.0)


def _reference(top, y, k, inv_p):
    """Per-point loops, written straight from the definitions."""
    y = y.tocsr()
    n = y.shape[0]
    p = nd = r = 0.0
    ps_num = ps_den = psn_num = psn_den = 0.0
    for i in range(n):
        truth = set(y.indices[y.indptr[i]:y.indptr[i + 1]].tolist())
        pred = [int(t) for t in top[i, :k]]
        h = [1.0 if t in truth else 0.0 for t in pred]
        p += sum(h) / k
        if truth:
            dcg = sum(h[j] / math.log2(j + 2) for j in range(k))
            idcg = sum(1 / math.log2(j + 2) for j in range(min(k, len(truth))))
            nd += dcg / idcg
            r += sum(h) / len(truth)
        best = sorted((inv_p[t] for t in truth), reverse=True)[:k]
        ps_num += sum(h[j] * inv_p[pred[j]] for j in range(k))
        ps_den += sum(best)
        if truth:
            idcg = sum(1 / math.log2(j + 2) for j in range(min(k, len(truth))))
            psn_num += sum(h[j] * inv_p[pred[j]] / math.log2(j + 2) for j in range(k)) / idcg
            psn_den += sum(b / math.log2(j + 2) for j, b in enumerate(best)) / idcg
    return {f"P@{k}": p / n, f"nDCG@{k}": nd / n, f"R@{k}": r / n,
            f"PSP@{k}": ps_num / ps_den, f"PSnDCG@{k}": psn_num / psn_den}


def test_matches_reference_on_random_data():
    rng = np.random.default_rng(3)
    n, L = 60, 40
    y = sp.random(n, L, density=0.08, format="csr", random_state=4)
    y.data[:] = 1
    # rankings that favour true labels, so hits are frequent
    scores = rng.random((n, L)) + y.toarray() * rng.random((n, L))
    top = np.argsort(-scores, axis=1)[:, :7]
    train = sp.random(500, L, density=0.05, format="csr", random_state=5)
    prop = metrics.propensities(train, 0.6, 2.6)
    r = metrics.evaluate(top, y, k=(1, 3, 5, 7), propensities=prop)
    for k in (1, 3, 5, 7):
        ref = _reference(top, y, k, 1 / prop)
        for key, v in ref.items():
            assert r[key] == pytest.approx(v, rel=1e-12), key


def test_accepts_dataset_like_objects_and_default_propensities():
    class Holder:
        labels = Y
    r1 = metrics.evaluate(TOP, Holder(), k=1)
    r2 = metrics.evaluate(TOP, Y, k=1, propensities=metrics.propensities(Y))
    assert r1 == r2
