"""Views, slices and pieces made in C give back every reference they take."""
import gc
import tracemalloc

import numpy as np

from episode import InfiniteLookbackBuffer, SingleAgentEpisode


def _growth(fn, rounds=3000):
    fn()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(rounds):
        fn()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before


def test_buffer_views_do_not_leak():
    buf = InfiniteLookbackBuffer([np.zeros(4, np.float32)] * 100, lookback=2)
    buf.finalize()

    def use():
        buf[0:5]
        buf.get(-1)
        buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)
        buf.sub_buffer(slice(0, 10), False, 1, None).get(0)

    assert _growth(use) < 20_000


def test_episode_pieces_do_not_leak():
    ep = SingleAgentEpisode()
    ep.add_env_reset(np.zeros(4, np.float32))
    for i in range(100):
        ep.add_env_step(np.full(4, i, np.float32), 1, 1.0, extra_model_outputs={"vf": 0.5})
    ep.to_numpy()

    def use():
        ep[10:20].get_observations(-1)
        ep.cut(len_lookback_buffer=2)

    assert _growth(use, rounds=1000) < 20_000


def test_fill_path_keeps_dtype_references_balanced():
    import sys

    buf = InfiniteLookbackBuffer([np.zeros(4, np.float32)] * 10)
    buf.finalize()
    dtype = np.dtype(np.float64)
    buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)
    before = sys.getrefcount(dtype)
    for _ in range(1000):
        buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)
    assert sys.getrefcount(dtype) - before < 10
