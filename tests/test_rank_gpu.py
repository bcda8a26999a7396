"""The selector's ranking on the GPU (tuner.select.rank_gpu) against KernelSelector.rank, its NumPy definition,
on every shipped selector; and plan()'s use of it."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from kernels import config_key
from tuner.execute.choice import queue_ranking, selector_for
from tuner.execute.race import CHEAP_SPMVS
from tuner.matrix.features import FEATURE_NAMES, QueuedFeatures, extract_features, queue_features
from tuner.matrix.generate import KINDS, generate
from tuner.select import rank_gpu
from tuner.select.model import DeviceSpec, KernelSelector, compulsory_bytes, load_shipped, predicted
from tuner.select.shipped import DATA_DIR, read_header

FILES = {(h["device"], h["dtype"]): path for path in sorted(DATA_DIR.glob("spmv-selector_*.pkl.gz"))
         if (h := read_header(path))}
SHIPPED = sorted(FILES)
"""The selectors shipped in the package (the tests' own environment ships none: conftest.py)."""


def _selector(device: str, dtype: str):
    selector = load_shipped(device, dtype, path=FILES[device, dtype])
    assert selector is not None and rank_gpu.takes(selector)
    return selector


def _matrices() -> list:
    """Every generator's kind, small, with two seeds; and the degenerate shapes of one row and one column."""
    out = []
    for kind, g in KINDS.items():
        for seed in (1, 2):
            out.append(generate(kind, **{g.size_arg: 30 if g.size_arg == "n" else 3000}, seed=seed))
    import scipy.sparse as sp

    out += [sp.csr_matrix(np.ones((1, 500))), sp.csr_matrix(np.ones((700, 1)))]
    return out


def _numpy_parts(selector, features, device=None):
    """rank()'s parts in NumPy: the order, expected seconds, votes and draws."""
    _, expected, votes, weights = selector._expected(features, device)
    return selector._order(expected, weights)[0][0], expected[0], votes[0], selector._draws(weights)[0]


def test_the_ranking_kernel_takes_only_selectors_of_the_features_it_computes() -> None:
    selector = _selector(*SHIPPED[0])
    assert rank_gpu.takes(selector)
    renamed = pickle.loads(pickle.dumps(selector))  # a selector of other features: one name differs
    renamed.feature_names_in_ = np.asarray([*FEATURE_NAMES[:-1], "cf_other"], dtype=object)
    assert not rank_gpu.takes(renamed)


def test_a_ranking_is_queued_only_behind_features_on_the_gpu() -> None:
    """Features computed on the CPU leave nothing on the GPU to rank behind: rank_configs ranks."""
    selector = (_selector(*SHIPPED[0]), None, "shipped")
    A = generate("banded", rows=200, seed=0)
    assert queue_ranking(selector, queue_features(A)) is None
    assert queue_ranking((None, None, "none"), QueuedFeatures(lambda: {})) is None


@pytest.mark.gpu
@pytest.mark.parametrize("device, dtype", SHIPPED)
def test_the_gpu_ranks_each_matrix_as_numpy(device: str, dtype: str) -> None:
    """Behind each matrix's feature kernels: the features NumPy's way to the bit, the order, the votes, the draws
    equal, the expected seconds to 1e-12; as shipped (the quantiles of two draws blended, ``near_share``) and with
    the first draw's alone (a selector pickled before stop 61)."""
    import cupyx.scipy.sparse as cusp

    shipped = _selector(device, dtype)
    assert shipped.near_share
    one_draw = pickle.loads(pickle.dumps(shipped)).set_params(near_share=None)
    for A in _matrices():
        for selector in (shipped, one_draw):
            queued = queue_features(cusp.csr_matrix(A.astype(dtype)))
            parts = rank_gpu.queue_rank(selector, queued.on_device)()
            features = queued()
            assert parts.features.tolist() == [features[n] for n in FEATURE_NAMES]
            order, expected, votes, drawn = _numpy_parts(selector, features)
            np.testing.assert_array_equal(parts.order, order)
            np.testing.assert_array_equal(parts.drawn, drawn)
            np.testing.assert_array_equal(parts.votes, votes)
            np.testing.assert_allclose(parts.expected, expected, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("device, dtype", SHIPPED)
def test_the_gpu_ranks_feature_vectors_as_numpy(device: str, dtype: str) -> None:
    """Hundreds of feature vectors (the matrices' scaled at random, so that values fall near the trees'
    thresholds), on the training device and on one of unknown L2 (every x_l2 NaN: the walk's missing values),
    rank alike on the GPU and in NumPy."""
    selector = _selector(device, dtype)
    rng = np.random.default_rng(0)
    base = np.array([[extract_features(A)[n] for n in FEATURE_NAMES] for A in _matrices()])
    vectors = np.vstack([base, *(base * np.exp(rng.normal(0, s, base.shape)) for s in (0.05, 0.3, 1.0))])
    unknown_l2 = dataclasses.replace(selector.device_, l2_bytes=0)
    for spec in (None, unknown_l2):
        pending = [rank_gpu.queue_rank_of_features(selector, dict(zip(FEATURE_NAMES, v, strict=True)), device=spec,
                                                   prepare_budget=CHEAP_SPMVS)
                   for v in vectors]
        for v, read in zip(vectors, pending, strict=True):
            parts = read()
            order, expected, votes, drawn = _numpy_parts(selector, dict(zip(FEATURE_NAMES, v, strict=True)), spec)
            np.testing.assert_array_equal(parts.order, order)
            np.testing.assert_array_equal(parts.drawn, drawn)
            np.testing.assert_allclose(parts.expected, expected, rtol=1e-12)
            assert _picked(selector, parts) == _predicted(selector, order, expected, votes, drawn)


@pytest.mark.gpu
def test_a_block_of_one_warp_ranks_as_a_whole_block(monkeypatch) -> None:
    """The kernel run with one warp (a GPU whose registers allowed no more) ranks, draws both draws and picks as
    with its whole block: the second draw's running sum is taken by the first thread after the first's, not
    skipped."""
    selector = _selector(*SHIPPED[0])
    assert selector.near_share
    vectors = [extract_features(A) for A in _matrices()[::3]]
    whole = [rank_gpu.queue_rank_of_features(selector, f, prepare_budget=CHEAP_SPMVS)() for f in vectors]
    real = rank_gpu._kernels
    monkeypatch.setattr(rank_gpu, "_kernels", lambda cupy, device: {
        name: (f, 32) for name, (f, _) in real(cupy, device).items()})
    for f, want in zip(vectors, whole, strict=True):
        got = rank_gpu.queue_rank_of_features(selector, f, prepare_budget=CHEAP_SPMVS)()
        np.testing.assert_array_equal(got.order, want.order)
        np.testing.assert_array_equal(got.drawn, want.drawn)
        np.testing.assert_array_equal(got.expected, want.expected)
        assert got.pick == want.pick


def _predicted(selector, order, expected, votes, drawn, budget=CHEAP_SPMVS):
    """What :func:`predicted` picks of the whole ranking NumPy's parts give, with its outcomes: (kernel, params)."""
    want = predicted(selector.ranked(order, expected, votes, selector.outcomes_of(drawn, order)), budget)
    return None if want is None else (want.kernel, want.params)


def _picked(selector, parts):
    """The config the kernel picked (RankParts.pick) as (kernel, params)."""
    return None if parts.pick is None else (selector.configs_[parts.pick][0], dict(selector.configs_[parts.pick][1]))


@pytest.mark.gpu
def test_the_gpu_picks_what_predict_picks_cheap_cusparse_or_held_back() -> None:
    """A selector of two configs and cuSPARSE (csr_scalar fast where rows vary, cheap to prepare; csr_vector fast
    elsewhere, costly to prepare): the kernel's pick for predict's budget is :func:`predicted`'s of the whole
    ranking, every branch of it taken: the cheap config, cuSPARSE ranked first or held to where the cheap one
    lost to it on most of the drawn matrices, the costly one never."""
    rng = np.random.default_rng(21)
    cheap, costly = ("csr_scalar", {"block_size": 128}), ("csr_vector", {"block_size": 256, "threads_per_row": 8})
    alg1, alg2 = (("cusparse", {"algorithm": a}) for a in ("csr_alg1", "csr_alg2"))
    keys = {name: config_key(*config) for name, config in
            {"cheap": cheap, "costly": costly, "alg1": alg1, "alg2": alg2}.items()}
    device = DeviceSpec("gpu-A", bandwidth_gbs=4000.0, l2_bytes=60 * 2**20, sms=132)

    def features() -> dict[str, float]:
        f = {name: float(rng.random()) for name in FEATURE_NAMES}
        rows, mean = float(rng.integers(10**3, 10**6)), float(rng.uniform(2, 64))
        f.update(rows=rows, cols=rows, nnz=rows * mean, npr_mean=mean, npr_max=mean * rng.uniform(1, 10),
                 npr_cv=float(rng.uniform(0, 2)), bandwidth=rows * rng.random(), cf_1024=rng.uniform(1, mean),
                 cf_65536=mean)
        return f

    train = [features() for _ in range(80)]
    times, prepare = [], []
    for f in train:
        t = compulsory_bytes(f["rows"], f["cols"], f["nnz"], "float64") / (device.bandwidth_gbs * 1e9)
        row = {keys["cheap"]: t * rng.uniform(0.8, 2.4), keys["costly"]: t * rng.uniform(0.7, 2.0),
               keys["alg1"]: t * 1.5, keys["alg2"]: t * 1.7}
        times.append(row)
        prepare.append({keys["cheap"]: row[keys["cheap"]], keys["costly"]: 100 * row[keys["costly"]],
                        keys["alg1"]: 6 * row[keys["alg1"]], keys["alg2"]: 3 * row[keys["alg2"]]})
    X = np.array([[f[n] for n in FEATURE_NAMES] for f in train])
    selector = KernelSelector(n_estimators=20).fit(X, times, dtype="float64", device=device, prepare_times=prepare)
    assert rank_gpu.takes(selector)
    picks = []
    for f in (features() for _ in range(60)):
        parts = rank_gpu.queue_rank_of_features(selector, f, prepare_budget=CHEAP_SPMVS)()
        want = _predicted(selector, *_numpy_parts(selector, f))
        assert _picked(selector, parts) == want
        picks.append(want)
    assert costly not in picks and cheap in picks and alg1 in picks


@pytest.mark.gpu
def test_plan_ranks_a_new_matrix_on_the_gpu(monkeypatch, tmp_path) -> None:
    """plan() of a matrix new to the store takes the GPU's ranking (rank_configs is not asked) and predicts what
    NumPy's whole ranking predicts (plan builds only what ranked_choice reads of it)."""
    import cupyx.scipy.sparse as cusp

    from db.store import Store
    from tuner.execute import plan as plan_module
    from tuner.execute.choice import ranked_choice
    from tuner.measure.backend import GpuBackend

    monkeypatch.setenv("SPMV_TUNER_MODELS", str(DATA_DIR))
    calls = []
    real = plan_module.rank_configs
    monkeypatch.setattr(plan_module, "rank_configs", lambda *a, **k: calls.append(1) or real(*a, **k))
    backend = GpuBackend()
    model, spec, basis = selector_for(None, device=backend.info.id, dtype="float64", backend=backend)
    for kind, rows in [("powerlaw", 20_000), ("banded", 20_000), ("emptyrows", 40_000), ("lp", 4_000)]:
        A = generate(kind, rows=rows, seed=3)
        ex = plan_module.plan(cusp.csr_matrix(A), effort="predict", db=Store(tmp_path / f"{kind}.db"))
        assert calls == [] and ex.source in ("predicted", "default")
        features = extract_features(cusp.csr_matrix(A))
        want = ranked_choice(model.rank(features, device=spec, outcomes=True), basis, nnz=A.nnz,
                             prepare_budget=CHEAP_SPMVS)
        assert (ex.kernel, ex.params) == (want.kernel, want.params), kind
