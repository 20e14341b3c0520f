"""InfiniteLookbackBuffer: ours (episode) against RLlib 2.60's, workload by workload.

    pytest benchmarks/test_lookback_buffer.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds
    pytest benchmarks/ ... --benchmark-json=bench.json && python benchmarks/summarize.py bench.json

Every workload is parametrized over ``impl`` (ours, rllib; rllib is skipped
without ray). Inputs are made once, outside the timed code, and are the same
for both. Before timing, each read workload checks that both implementations
return the same value, so the two sides do the same work.

``extra_info["items"]`` is the number of items one round handles; the
summary divides by it for a per-item time.
"""
import numpy as np
import pytest

N_ROWS = 10_000  # rows of the 10k workloads (conftest makes 100k obs rows)

# Rounds for the pedantic (setup-per-round) workloads; medians are reported.
ROUNDS = 20


def _finalized(cls, rows, **kwargs):
    """A finalized buffer of `rows`, built as RLlib's episodes are: from a list
    (a copy: RLlib keeps and mutates the list it is given), then finalize()."""
    buf = cls(data=list(rows), **kwargs)
    buf.finalize()
    return buf


def _check_same(got, expected_rows):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected_rows))


# -- 1. append_10k ------------------------------------------------------------

def test_append_10k(benchmark, impl, obs_rows):
    """A new buffer, then 10,000 (4,) float32 rows, one append() each."""
    benchmark.group = "append_10k"
    benchmark.extra_info["items"] = N_ROWS
    rows = obs_rows[:N_ROWS]

    def run():
        buf = impl()
        append = buf.append
        for row in rows:
            append(row)
        return buf

    buf = benchmark(run)
    assert len(buf) == N_ROWS


def test_extend_10k(benchmark, impl, obs_rows):
    """A new buffer, then the same 10,000 rows in one extend() call (RLlib's
    extend appends item by item; ours loops in C)."""
    benchmark.group = "extend_10k"
    benchmark.extra_info["items"] = N_ROWS
    rows = obs_rows[:N_ROWS]

    def run():
        buf = impl()
        buf.extend(rows)
        return buf

    buf = benchmark(run)
    assert len(buf) == N_ROWS


# -- 2. append_after_finalize -------------------------------------------------

APPENDS = 1_000


@pytest.mark.parametrize("n", [1_000, 10_000, 100_000])
@pytest.mark.parametrize("build", ["list", "array"])
def test_append_after_finalize(benchmark, impl, obs_rows, n, build):
    """1,000 appends, one by one, to a finalized buffer of `n` rows (fresh each
    round). build=list: the buffer was built from a list and finalize()d;
    build=array: it was made from one (n, 4) array (finalized on construction)."""
    benchmark.group = f"append_after_finalize[N={n},{build}]"
    benchmark.extra_info["items"] = APPENDS
    base = obs_rows[:n]
    base_array = np.stack(base) if build == "array" else None
    extra = obs_rows[n:n + APPENDS] if n + APPENDS <= len(obs_rows) else obs_rows[:APPENDS]

    def setup():
        buf = impl(data=base_array.copy()) if build == "array" else _finalized(impl, base)
        assert buf.finalized and len(buf) == n
        return (buf,), {}

    def run(buf):
        append = buf.append
        for row in extra:
            append(row)
        return buf

    buf = benchmark.pedantic(run, setup=setup, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    assert len(buf) == n + APPENDS
    _check_same(buf.get(-1), extra[-1])


# -- 3. get_last --------------------------------------------------------------

def test_get_last(benchmark, impl, obs_rows):
    """get(-1) on a finalized buffer of 10k (4,) float32 rows."""
    benchmark.group = "get_last"
    benchmark.extra_info["items"] = 1
    buf = _finalized(impl, obs_rows[:N_ROWS])
    _check_same(buf.get(-1), obs_rows[N_ROWS - 1])
    benchmark(buf.get, -1)


# -- 4. get_slice_fill --------------------------------------------------------

@pytest.mark.parametrize(
    "where",
    [
        # Frame stacking at the start: crosses the start of a 1-item lookback.
        pytest.param((slice(-3, 2), True), id="start"),
        # At the end of the buffer: its last 2 items and 2 fill rows past it.
        # (slice(-2, 2) would be empty in both implementations: -2 counts from
        # the end, 2 from the start, so stop < start and nothing is filled.)
        pytest.param((slice(N_ROWS - 1 - 2, N_ROWS - 1 + 2), False), id="end"),
    ],
)
def test_get_slice_fill(benchmark, impl, obs_rows, box4, where):
    """get(slice, fill=0.0) on a finalized buffer of 10k (4,) float32 rows
    with lookback=1 (so len() == N_ROWS - 1) and a Box(-1, 1, (4,), float32)
    space, which RLlib needs to shape the fill rows of 2-D data."""
    slice_, neg = where
    label = "start" if neg else "end"
    benchmark.group = f"get_slice_fill[{label}]"
    benchmark.extra_info["items"] = 1
    buf = _finalized(impl, obs_rows[:N_ROWS], lookback=1, space=box4)

    def run():
        return buf.get(slice_, neg_index_as_lookback=neg, fill=0.0)

    got = run()
    # The same value from both implementations (RLlib's is the reference).
    if neg:
        expected = [np.zeros(4, np.float32)] * 2 + obs_rows[:3]
    else:
        expected = obs_rows[N_ROWS - 2:N_ROWS] + [np.zeros(4, np.float32)] * 2
    _check_same(got, expected)
    assert got.dtype == np.float32
    benchmark(run)


# -- 5. finalize --------------------------------------------------------------

@pytest.mark.parametrize("kind", ["obs", "float"])
def test_finalize_10k(benchmark, impl, obs_rows, float_rows, kind):
    """finalize() of a list-mode buffer of 10k rows (fresh each round):
    (4,) float32 arrays (finalize_10k) or Python float rewards (finalize_10k_float)."""
    benchmark.group = "finalize_10k" if kind == "obs" else "finalize_10k_float"
    rows = obs_rows[:N_ROWS] if kind == "obs" else float_rows

    def setup():
        buf = impl(data=list(rows))
        assert not buf.finalized
        return (buf,), {}

    def run(buf):
        buf.finalize()
        return buf

    buf = benchmark.pedantic(run, setup=setup, rounds=ROUNDS * 5, warmup_rounds=1,
                             iterations=1)
    assert buf.finalized
    _check_same(buf.get(slice(0, None)), rows)
