"""SingleAgentEpisode: ours (episode) against RLlib 2.60's, workload by workload.

    pytest benchmarks/test_single_agent_episode.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds --benchmark-json=sae.json
    python benchmarks/summarize.py sae.json --markdown

Every workload is parametrized over ``sae_impl`` (ours, rllib; rllib is
skipped without ray). Inputs are made once, outside the timed code, and are
the same for both. Before timing, each workload is run once on both
implementations and the results compared (the episodes' ``get_state()``, or
the returned arrays), so the two sides do the same work.

Episodes are CartPole-sized unless said otherwise: float32 (4,) observations
in [-1, 1], Python int actions in {0, 1}, Python float rewards, one extra
model output ``vf`` (0.5) and no infos (each step stores an empty dict).

``extra_info["items"]`` is the number of steps (calls) one round handles; the
summary divides by it for a per-item time. ``test_memory_100k`` records the
memory an episode holds in ``extra_info["memory"]`` (summarize.py prints it).
"""
import gc
import pickle
import sys
import tracemalloc
import types

import numpy as np
import pytest

N_STEPS = 10_000       # steps of the "10k" episodes
N_COLLECT = 1_000      # steps per collect/append round
ROUNDS = 20            # rounds of the pedantic workloads with a costly setup
ROUNDS_CHEAP = 100     # rounds of the pedantic workloads with a cheap setup
VF = 0.5


# -- helpers ------------------------------------------------------------------

def _both(classes, make):
    """make(cls) for ours and RLlib (classes: the sae_classes fixture); asserts
    both results are equal (RLlib skipped when not installed). Returns ours."""
    ours = make(classes["ours"])
    if classes["rllib"] is not None:
        _assert_same(ours, make(classes["rllib"]))
    return ours


def _state(x):
    """An episode (or buffer) as plain data: get_state() without id and times."""
    if hasattr(x, "get_state") and hasattr(x, "t_started"):
        state = x.get_state()
        for key in ("id_", "_start_time", "_last_step_time"):
            state.pop(key)
        state["len"] = len(x)
        state["is_numpy"] = x.is_numpy
        return state
    if hasattr(x, "get_state") and hasattr(x, "lookback"):
        # A buffer (RLlib's get_state() keeps empty extra-output buffers as is).
        return x.get_state()
    return x


def _assert_same(a, b, path="value"):
    a, b = _state(a), _state(b)
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys {a.keys()} != {b.keys()}"
        for k in a:
            _assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: len {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, \
            f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _steps(episode, obs, actions, rewards, start=0, n=N_COLLECT):
    """n add_env_step calls, step i with obs[i + 1], actions[i], rewards[i]."""
    step = episode.add_env_step
    for i in range(start, start + n):
        step(obs[i + 1], actions[i], rewards[i], None,
             terminated=False, truncated=False, extra_model_outputs={"vf": VF})
    return episode


def _episode(cls, n, obs, actions, rewards, numpy=False, **kwargs):
    """A reset episode with n steps (list mode, or to_numpy()'d)."""
    episode = cls(**kwargs)
    episode.add_env_reset(obs[0])
    _steps(episode, obs, actions, rewards, n=n)
    return episode.to_numpy() if numpy else episode


@pytest.fixture(scope="module")
def cartpole(obs_rows, int_actions, float_rewards, box4, discrete2):
    """CartPole-sized step inputs and spaces."""
    return dict(obs=obs_rows, actions=int_actions, rewards=float_rewards,
                spaces=dict(observation_space=box4, action_space=discrete2))


@pytest.fixture(scope="module")
def atari_obs():
    """N_COLLECT + 1 distinct uint8 (84, 84, 4) observations."""
    rng = np.random.default_rng(4)
    return [rng.integers(0, 256, size=(84, 84, 4), dtype=np.uint8)
            for _ in range(N_COLLECT + 1)]


def _cartpole_10k(cls, cp, numpy):
    return _episode(cls, N_STEPS, cp["obs"], cp["actions"], cp["rewards"], numpy=numpy,
                    **cp["spaces"])


# -- 1. add_env_step ----------------------------------------------------------

def test_add_env_step(benchmark, sae_impl, sae_classes, cartpole):
    """add_env_step on a reset list-mode episode: 1,000 calls per round on a
    fresh episode; per call = median / 1000."""
    benchmark.group = "add_env_step"
    benchmark.extra_info["items"] = N_COLLECT
    obs, actions, rewards = cartpole["obs"], cartpole["actions"], cartpole["rewards"]

    def reset(cls):
        episode = cls()
        episode.add_env_reset(obs[0])
        return episode

    _both(sae_classes, lambda cls: _steps(reset(cls), obs, actions, rewards))

    def setup():
        return (reset(sae_impl),), {}

    def run(episode):
        step = episode.add_env_step
        for i in range(N_COLLECT):
            step(obs[i + 1], actions[i], rewards[i], infos=None, terminated=False,
                 truncated=False, extra_model_outputs={"vf": 0.5})
        return episode

    episode = benchmark.pedantic(run, setup=setup, rounds=ROUNDS_CHEAP, warmup_rounds=2,
                                 iterations=1)
    assert len(episode) == N_COLLECT and not episode.is_numpy


# -- 2./3. collect_to_numpy ---------------------------------------------------

@pytest.mark.parametrize("env", ["cartpole", "atari"])
def test_collect_to_numpy(benchmark, sae_impl, sae_classes, cartpole, atari_obs, env):
    """A new episode, add_env_reset, 1,000 add_env_step, to_numpy()."""
    benchmark.group = f"collect_to_numpy_{env}"
    benchmark.extra_info["items"] = N_COLLECT
    obs = cartpole["obs"] if env == "cartpole" else atari_obs
    actions, rewards = cartpole["actions"], cartpole["rewards"]

    def collect(cls):
        return _episode(cls, N_COLLECT, obs, actions, rewards, numpy=True)

    _both(sae_classes, collect)
    episode = benchmark(collect, sae_impl)
    assert episode.is_numpy and len(episode) == N_COLLECT


# -- 4. get_observations_last -------------------------------------------------

def test_get_observations_last(benchmark, sae_impl, sae_classes, cartpole):
    """get_observations(-1) on a numpy'ized 10k-step episode."""
    benchmark.group = "get_observations_last"
    benchmark.extra_info["items"] = 1
    _both(sae_classes, lambda cls: _cartpole_10k(cls, cartpole, True).get_observations(-1))
    episode = _cartpole_10k(sae_impl, cartpole, True)
    got = benchmark(episode.get_observations, -1)
    np.testing.assert_array_equal(got, cartpole["obs"][N_STEPS])


# -- 5. frame_stack -----------------------------------------------------------

@pytest.mark.parametrize("i", [0, 5000])
def test_frame_stack(benchmark, sae_impl, sae_classes, cartpole, i):
    """get_observations(slice(i-3, i+1), neg_index_as_lookback=True, fill=0.0)
    on a numpy'ized 10k-step episode: 4 stacked frames; i=0 fills 3 of them."""
    benchmark.group = f"frame_stack[i={i}]"
    benchmark.extra_info["items"] = 1
    where = slice(i - 3, i + 1)

    def get(episode):
        return episode.get_observations(where, neg_index_as_lookback=True, fill=0.0)

    got = _both(sae_classes, lambda cls: get(_cartpole_10k(cls, cartpole, True)))
    expected = ([np.zeros(4, np.float32)] * 3 + cartpole["obs"][:1] if i == 0
                else cartpole["obs"][i - 3:i + 1])
    np.testing.assert_array_equal(got, np.stack(expected))
    episode = _cartpole_10k(sae_impl, cartpole, True)
    benchmark(get, episode)


# -- 6. slice_64 --------------------------------------------------------------

def test_slice_64(benchmark, sae_impl, sae_classes, cartpole):
    """episode[100:164] on a numpy'ized 10k-step episode."""
    benchmark.group = "slice_64"
    benchmark.extra_info["items"] = 1
    a = 100
    _both(sae_classes, lambda cls: _cartpole_10k(cls, cartpole, True)[a:a + 64])
    episode = _cartpole_10k(sae_impl, cartpole, True)
    piece = benchmark(episode.__getitem__, slice(a, a + 64))
    assert len(piece) == 64


# -- 7. cut -------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["list", "numpy"])
def test_cut(benchmark, sae_impl, sae_classes, cartpole, mode):
    """episode.cut(len_lookback_buffer=1) of a 10k-step episode."""
    benchmark.group = f"cut[{mode}]"
    benchmark.extra_info["items"] = 1
    numpy = mode == "numpy"
    _both(sae_classes,
          lambda cls: _cartpole_10k(cls, cartpole, numpy).cut(len_lookback_buffer=1))
    episode = _cartpole_10k(sae_impl, cartpole, numpy)
    successor = benchmark(episode.cut, len_lookback_buffer=1)
    assert len(successor) == 0 and successor.t_started == N_STEPS


# -- 8. append_after_to_numpy -------------------------------------------------

def test_append_after_to_numpy(benchmark, sae_impl, sae_classes, cartpole):
    """1,000 add_env_step calls on a numpy'ized 10k-step episode (fresh each
    round). The data is in the spaces: RLlib asserts it after to_numpy()."""
    benchmark.group = "append_after_to_numpy"
    benchmark.extra_info["items"] = N_COLLECT
    obs, actions, rewards = cartpole["obs"], cartpole["actions"], cartpole["rewards"]

    def append(episode):
        return _steps(episode, obs, actions, rewards, start=N_STEPS, n=N_COLLECT)

    _both(sae_classes, lambda cls: append(_cartpole_10k(cls, cartpole, True)))

    def setup():
        return (_cartpole_10k(sae_impl, cartpole, True),), {}

    episode = benchmark.pedantic(append, setup=setup, rounds=ROUNDS, warmup_rounds=1,
                                 iterations=1)
    assert len(episode) == N_STEPS + N_COLLECT


# -- 9. pickle_roundtrip ------------------------------------------------------

def test_pickle_roundtrip(benchmark, sae_impl, sae_classes, cartpole):
    """pickle.loads(pickle.dumps(episode, protocol=5)) of a numpy'ized 10k-step
    episode."""
    benchmark.group = "pickle_roundtrip"
    benchmark.extra_info["items"] = 1

    def roundtrip(episode):
        return pickle.loads(pickle.dumps(episode, protocol=5))

    _both(sae_classes, lambda cls: roundtrip(_cartpole_10k(cls, cartpole, True)))
    episode = _cartpole_10k(sae_impl, cartpole, True)
    copy = benchmark(roundtrip, episode)
    _assert_same(copy, episode)
    assert copy.id_ == episode.id_


# -- 10. concat ---------------------------------------------------------------

def test_concat(benchmark, sae_impl, sae_classes, cartpole):
    """a.concat_episode(b): a is a list-mode 1,000-step episode, b = a.cut()
    followed by 1,000 steps (fresh a, b each round)."""
    benchmark.group = "concat"
    benchmark.extra_info["items"] = 1
    obs, actions, rewards = cartpole["obs"], cartpole["actions"], cartpole["rewards"]

    def make(cls):
        a = _episode(cls, N_COLLECT, obs, actions, rewards)
        b = _steps(a.cut(), obs, actions, rewards, start=N_COLLECT, n=N_COLLECT)
        return a, b

    def concat(a, b):
        a.concat_episode(b)
        return a

    _both(sae_classes, lambda cls: concat(*make(cls)))

    def setup():
        return make(sae_impl), {}

    a = benchmark.pedantic(concat, setup=setup, rounds=ROUNDS_CHEAP, warmup_rounds=1,
                           iterations=1)
    assert len(a) == 2 * N_COLLECT


# -- 11. memory_100k ----------------------------------------------------------

N_MEM = 100_000
RAW_BYTES = (N_MEM + 1) * 16 + N_MEM * 8 * 3   # obs, actions, rewards, vf


@pytest.fixture(scope="module")
def inputs_100k():
    """100,001 distinct float32 (4,) obs arrays, int actions, distinct float
    rewards and vf values, and the per-step extra_model_outputs dicts."""
    rng = np.random.default_rng(5)
    obs = [row.copy() for row in rng.uniform(-1, 1, size=(N_MEM + 1, 4)).astype(np.float32)]
    actions = rng.integers(0, 2, size=N_MEM).tolist()
    rewards = rng.uniform(-1, 1, size=N_MEM).tolist()
    vf = rng.uniform(-1, 1, size=N_MEM).tolist()
    outs = [{"vf": v} for v in vf]
    return obs, actions, rewards, vf, outs


def _build_100k(cls, inputs):
    obs, actions, rewards, _, outs = inputs
    episode = cls()
    episode.add_env_reset(obs[0])
    step = episode.add_env_step
    for i in range(N_MEM):
        step(obs[i + 1], actions[i], rewards[i], extra_model_outputs=outs[i])
    return episode


_LEAVES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
           np.ndarray, str, bytes, int, float)


def _held_input_bytes(root, inputs_by_id):
    """Bytes of the (pre-made, so untraced) input objects `root` still refers
    to: the obs arrays, reward and vf floats that a list-mode buffer keeps."""
    seen, stack, total = set(), [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in inputs_by_id:
            total += sys.getsizeof(obj)
        elif not isinstance(obj, _LEAVES):
            stack.extend(gc.get_referents(obj))
    return total


def test_memory_100k(benchmark, sae_impl, inputs_100k):
    """Memory held by a 100k-step episode, list mode and after to_numpy().

    Inputs are made before tracemalloc starts, so the traced bytes are what
    the episode allocates itself (buffers, lists, per-step info dicts, ...).
    Objects of the inputs the episode keeps a reference to (RLlib's list mode
    keeps the obs arrays and the reward/vf floats) are held by it too: their
    sys.getsizeof() is added as "held inputs" (the int actions are cached
    small ints, counted as 0). The inputs' own list is not counted.
    Timed: building the 100k-step episode and to_numpy() (5 rounds).
    """
    benchmark.group = "build_to_numpy_100k"
    benchmark.extra_info["items"] = N_MEM
    obs, _, rewards, vf, _ = inputs_100k
    inputs_by_id = {id(x) for x in (*obs, *rewards, *vf)}

    gc.collect()
    tracemalloc.start()
    try:
        episode = _build_100k(sae_impl, inputs_100k)
        gc.collect()
        list_cur, list_peak = tracemalloc.get_traced_memory()
        list_held = _held_input_bytes(episode, inputs_by_id)
        tracemalloc.reset_peak()
        episode.to_numpy()
        gc.collect()
        np_cur, np_peak = tracemalloc.get_traced_memory()
        np_held = _held_input_bytes(episode, inputs_by_id)
    finally:
        tracemalloc.stop()
    assert len(episode) == N_MEM and episode.is_numpy
    del episode

    def row(cur, peak, held):
        return {"traced": cur, "held_inputs": held, "total": cur + held,
                "ratio_to_raw": (cur + held) / RAW_BYTES, "peak": peak}

    benchmark.extra_info["memory"] = {
        "raw_bytes": RAW_BYTES,
        "list": row(list_cur, list_peak, list_held),
        # peak: the most traced during to_numpy() (the list-mode data included).
        "numpy": row(np_cur, np_peak, np_held),
    }
    print(f"\n{sae_impl.__module__}: {benchmark.extra_info['memory']}")

    def build():
        return _build_100k(sae_impl, inputs_100k).to_numpy()

    benchmark.pedantic(build, rounds=5, warmup_rounds=0, iterations=1)
