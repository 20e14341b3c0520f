"""Episodes built without the public constructor's argument handling, their
ids, and the parts of get_state()/from_state() that make them cheap.

Each shortcut must give what the long way gives (the constructor's general
path, the uncached space conversions) and what RLlib gives (tests marked
`rllib`). Timings are benchmarks' business, not these tests'.
"""
from __future__ import annotations

import copy
import os
import pickle
import re
import threading
import uuid

import gymnasium as gym
import numpy as np
import pytest

import episode.single_agent_episode as sae_module
from difftools import EpTwin, compare, episode_state
from episode import InfiniteLookbackBuffer, SingleAgentEpisode, spaces
from episode._episode import episode_id

BOX = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(3)
DICT = gym.spaces.Dict({"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                        "b": gym.spaces.Discrete(3)})
TUPLE = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.MultiDiscrete([2, 3])))

# Constructor arguments without data (the cases built in C), and a few with
# data or odd values that must take the general path.
NO_DATA = {
    "nothing": {},
    "spaces": dict(observation_space=BOX, action_space=DISCRETE),
    "struct-spaces": dict(observation_space=DICT, action_space=TUPLE),
    "not-a-space": dict(observation_space="not a space"),
    "ids": dict(agent_id="a", module_id=("m", 1), multi_agent_episode_id=17),
    "terminated": dict(terminated=True),
    "truncated-int": dict(truncated=1),
    "t_started": dict(t_started=5),
    "t_started-0": dict(t_started=0),
    "t_started-negative": dict(t_started=-3),
    "lookback-0": dict(len_lookback_buffer=0),
    "lookback-3": dict(len_lookback_buffer=3),
    "lookback-float": dict(len_lookback_buffer=1.5),
    "lookback-bool": dict(len_lookback_buffer=True),
    "lookback-str": dict(len_lookback_buffer="x"),
    "lookback-none": dict(len_lookback_buffer=None),
    "t_started-str": dict(t_started="5"),
    "empty-extras": dict(extra_model_outputs={}),
    "empty-infos": dict(infos=[]),
    "empty-lists": dict(observations=[], actions=[], rewards=[]),
    "everything": dict(observation_space=BOX, action_space=DISCRETE, terminated=False,
                       truncated=False, t_started=2, len_lookback_buffer="auto",
                       agent_id="a", module_id="m", multi_agent_episode_id="ma"),
}
# Deliberate differences (see the differences files): a negative lookback
# raises ValueError here; t_started is a 64-bit int (OverflowError beyond,
# TypeError for a float, which RLlib keeps).
OURS_ONLY = {
    "lookback-negative": dict(len_lookback_buffer=-1),
    "t_started-huge": dict(t_started=2**63),
    "t_started-float": dict(t_started=2.0),
}


def outcome(make):
    """(episode, None) or (None, the exception's class and message)."""
    try:
        return make(), None
    except Exception as e:  # noqa: BLE001 - compared by class and message
        return None, (type(e), str(e))


def full_state(ep):
    """Everything an episode holds, as comparable plain data."""
    state = episode_state(ep)
    for name in ("observations", "actions", "rewards", "infos"):
        buf = getattr(ep, name)
        state[name]["class"] = type(buf)
        state[name]["space"] = buf.space
        state[name]["space_struct"] = buf.space_struct
    state["extra_model_outputs"] = (type(ep.extra_model_outputs), state["extra_model_outputs"])
    for name in ("_observation_space", "_action_space", "_last_added_observation",
                 "_last_added_infos"):
        state[name] = getattr(ep, name)
    for name in ("_start_time", "_last_step_time"):   # (wall-clock: only whether set)
        state[name] = getattr(ep, name) is None
    return state


def general_path(monkeypatch):
    """Makes the constructor take its general (Python) path for every call."""
    monkeypatch.setattr(sae_module, "init_without_data", lambda *args: False)


@pytest.mark.parametrize("kwargs", list({**NO_DATA, **OURS_ONLY}.values()),
                         ids=list({**NO_DATA, **OURS_ONLY}))
def test_constructor_without_data_is_the_general_path(kwargs, monkeypatch):
    """The C path builds the very episode the Python path builds (or raises
    the same error), and both go on alike."""
    fast, fast_error = outcome(lambda: SingleAgentEpisode(id_="e", **kwargs))
    with monkeypatch.context() as m:
        general_path(m)
        slow, slow_error = outcome(lambda: SingleAgentEpisode(id_="e", **kwargs))
    assert fast_error == slow_error
    if fast is None:
        return
    compare(full_state(fast), full_state(slow), "constructed")
    obs = np.full(4, 0.5, np.float32)
    for label, call in [
        ("add_env_reset", lambda ep: ep.add_env_reset(obs)),
        ("add_env_step", lambda ep: ep.add_env_step(obs, 1, 1.0,
                                                    extra_model_outputs={"vf": 0.5})),
        ("to_numpy", lambda ep: ep.to_numpy()),
        ("cut", lambda ep: full_state(ep.cut())),
    ]:
        assert outcome(lambda: call(fast))[1] == outcome(lambda: call(slow))[1], label
        compare(full_state(fast), full_state(slow), f"after {label}")


@pytest.mark.rllib
@pytest.mark.parametrize("kwargs", list(NO_DATA.values()), ids=list(NO_DATA))
def test_constructor_without_data_matches_rllib(kwargs):
    twin = EpTwin.new(id_="e", **kwargs)  # same state, or the same exception class
    if twin is None:
        return
    obs = np.full(4, 0.5, np.float32)
    twin.call("add_env_reset", obs)
    twin.call("add_env_step", obs, 1, 1.0, extra_model_outputs={"vf": 0.5})
    if twin.ours.is_reset:  # (to_numpy without observations: a deliberate difference)
        twin.call("to_numpy")
    twin.call("get_observations", -1)
    twin.call("cut")


def test_constructor_without_data_skips_the_buffers_init(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("InfiniteLookbackBuffer.__init__ was called")

    monkeypatch.setattr(InfiniteLookbackBuffer, "__init__", refuse)
    ep = SingleAgentEpisode(observation_space=BOX, action_space=DISCRETE, t_started=3)
    assert type(ep.observations) is InfiniteLookbackBuffer and ep.observations.space is BOX
    assert ep.rewards.space is not None and ep.t == ep.t_started == 3
    ep.add_env_step(np.zeros(4, np.float32), 1, 1.0, extra_model_outputs={"vf": 0.5})
    assert type(ep.extra_model_outputs["vf"]) is InfiniteLookbackBuffer


# -- ids ------------------------------------------------------------------------------------


def check_id(value):
    assert type(value) is str and re.fullmatch(r"[0-9a-f]{32}", value), value
    parsed = uuid.UUID(hex=value)
    assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_ids_are_uuid4_hex_strings_and_unique():
    ids = [episode_id() for _ in range(1000)]   # several blocks of random bytes
    ids += [SingleAgentEpisode().id_ for _ in range(300)]
    ids.append(SingleAgentEpisode(id_="", observations=[0.0]).id_)   # the general path
    ids.append(SingleAgentEpisode.from_state({**SingleAgentEpisode().get_state(),
                                              "id_": None}).id_)
    for value in ids:
        check_id(value)
    assert len(set(ids)) == len(ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_ids_are_unique_across_fork():
    """A forked child must not hand out the ids left in its parent's block."""
    episode_id()   # the parent now holds unused random bytes
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.write(write_end, " ".join(episode_id() for _ in range(5)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [episode_id() for _ in range(5)]
    assert len(child) == 5
    for value in child:
        check_id(value)
    assert not set(child) & set(parent)


def test_ids_are_unique_across_threads():
    results = [[] for _ in range(8)]

    def make(out):
        out.extend(episode_id() for _ in range(2000))

    threads = [threading.Thread(target=make, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [value for out in results for value in out]
    assert len(set(ids)) == len(ids) == 16000


# -- cut(), slice() and from_state() without the constructor ------------------------------


def stepped(steps=3, numpy=False, reset=True):
    ep = SingleAgentEpisode(id_="ep", observation_space=BOX, action_space=DISCRETE)
    if reset:
        ep.add_env_reset(np.zeros(4, np.float32), infos={"reset": True})
    for i in range(steps):
        ep.add_env_step(np.full(4, 0.1 * i, np.float32), i % 3, float(i),
                        infos={"i": i} if i % 2 else None, extra_model_outputs={"vf": 0.5 * i})
    return ep.to_numpy() if numpy else ep


def refuse_constructor(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise RuntimeError("SingleAgentEpisode.__init__ was called")

    monkeypatch.setattr(SingleAgentEpisode, "__init__", refuse)


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
def test_pieces_and_states_do_not_call_the_constructor(numpy, monkeypatch):
    """Built directly, also where the constructor used to be the way (empty
    infos: an episode that is not reset, an empty or reversed slice)."""
    episodes = (stepped(3, numpy), stepped(0, numpy, reset=False))
    refuse_constructor(monkeypatch)
    for ep in episodes:
        chunk = ep.cut(len_lookback_buffer=1)
        assert type(chunk) is SingleAgentEpisode and chunk.id_ == "ep"
        for sl in (slice(None), slice(1, 2), slice(2, 1), slice(5, 5), slice(-1, -2)):
            ep.slice(sl)
            ep.slice(sl, len_lookback_buffer=2)
        restored = SingleAgentEpisode.from_state(ep.get_state())
        compare(restored.get_state(), ep.get_state(), "from_state")


def test_cut_of_an_episode_that_is_not_reset():
    ep = stepped(0, reset=False)
    chunk = ep.cut()
    assert len(chunk.infos) == len(chunk.observations) == 0 and chunk.infos.lookback == 0
    chunk.add_env_reset(np.ones(4, np.float32))
    assert chunk.get_infos() == [{}] and chunk.get_observations(0).tolist() == [1.0] * 4


@pytest.mark.rllib
def test_pieces_with_empty_infos_match_rllib():
    twin = EpTwin.new(id_="ep", observation_space=BOX, action_space=DISCRETE)
    for lookback in (0, 2):
        twin.call("cut", len_lookback_buffer=lookback)
    twin.call("slice", slice(0, 0))
    twin.call("slice", slice(0, 0), len_lookback_buffer=1)


@pytest.mark.parametrize("id_", ["", None, "kept"])
def test_from_state_id(id_):
    ep = SingleAgentEpisode.from_state({**stepped(2).get_state(), "id_": id_})
    if id_:
        assert ep.id_ == id_
    else:
        check_id(ep.id_)


def test_from_state_keeps_its_checks():
    state = stepped(3).get_state()
    state["t"] = 7
    restored = SingleAgentEpisode.from_state(copy.deepcopy(state))   # t is not checked
    assert restored.t == 7
    for name in ("actions", "infos"):
        bad = copy.deepcopy(state)
        bad[name]["data"] = bad[name]["data"][:-1]
        with pytest.raises(AssertionError):
            SingleAgentEpisode.from_state(bad)
    missing = copy.deepcopy(state)
    del missing["infos"]["lookback"]
    with pytest.raises(KeyError):
        SingleAgentEpisode.from_state(missing)


# -- get_state() of infos and arrays ---------------------------------------------------------


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
def test_state_infos_round_trip_to_distinct_dicts(numpy):
    ep = SingleAgentEpisode(id_="e")
    ep.add_env_reset(0.0)
    for i in range(5):
        ep.add_env_step(float(i), 0, 1.0)
    if numpy:
        ep.to_numpy()
    state = ep.get_state()
    assert state["infos"] == {"data": [{}] * 6, "lookback": 0, "finalized": False,
                              "space": None}
    for restored in (SingleAgentEpisode.from_state(state),
                     SingleAgentEpisode.from_state(pickle.loads(pickle.dumps(state, 5)))):
        infos = restored.get_infos()
        assert infos == [{}] * 6 and len({id(x) for x in infos}) == 6
        restored.get_infos(0)["written"] = True
        assert restored.get_infos() == [{}] * 6   # each read is a fresh dict
        restored.add_env_step(9.0, 0, 1.0, infos={"new": 1})
        assert restored.get_infos(-1) == {"new": 1} and restored.get_infos(0) == {}


def test_state_with_some_infos_keeps_them():
    ep = stepped(4)
    infos = ep.get_infos()
    state = ep.get_state()
    assert state["infos"]["data"] == [{"reset": True}, {}, {"i": 1}, {}, {"i": 3}] == infos
    restored = SingleAgentEpisode.from_state(pickle.loads(pickle.dumps(state, 5)))
    assert restored.get_infos() == infos


def test_numpy_state_pickles_arrays_out_of_band():
    """The numpy'ized tracks of a state pickle as whole buffers (protocol 5)."""
    ep = stepped(1000, numpy=True)
    state = ep.get_state()
    buffers = []
    data = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
    # observations, actions, rewards, vf: each one buffer outside the pickle
    assert len(buffers) == 4
    assert sum(memoryview(b).nbytes for b in buffers) == 1001 * 16 + 1000 * (8 + 8 + 8)
    assert len(data) < 20_000
    restored = SingleAgentEpisode.from_state(pickle.loads(data, buffers=buffers))
    compare(restored.get_state(), state, "restored")


# -- the cached space conversions ------------------------------------------------------------


CACHED_SPACES = [
    gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
    gym.spaces.Box(-0.0, 1.0, (4,), np.float32),           # equal to 0.0, other bytes
    gym.spaces.Box(0.0, 1.0, (4,), np.float32),
    gym.spaces.Box(0.0, 1.0, (4,), np.float64),
    gym.spaces.Box(0.0, 1.0, (2, 2), np.float32),
    gym.spaces.Box(np.zeros((2, 3), np.float32), np.asfortranarray(np.ones((2, 3), np.float32))),
    gym.spaces.Box(float("-inf"), float("inf"), (), np.float32),
    gym.spaces.Box(0, 255, (3,), np.uint8),
    gym.spaces.MultiDiscrete([2, 3]),
    gym.spaces.MultiDiscrete([2, 3], dtype=np.int32),
    gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
]
OTHER_SPACES = [gym.spaces.Discrete(3), gym.spaces.Discrete(3, start=-1),
                gym.spaces.MultiBinary(3), gym.spaces.MultiBinary([2, 2]), DICT, TUPLE]


def count_calls(monkeypatch, name):
    calls = []
    real = getattr(spaces, name)
    monkeypatch.setattr(spaces, name, lambda *args: calls.append(1) or real(*args))
    return calls


def test_space_to_dict_is_cached_per_description(monkeypatch):
    monkeypatch.setattr(spaces, "_TO_DICT", {})
    packs = count_calls(monkeypatch, "_pack_array")
    for space in CACHED_SPACES + OTHER_SPACES:
        expected = spaces._space_to_dict(space)
        for _ in range(3):
            d = spaces.space_to_dict(space)
            assert d == expected and type(d) is dict
            d["low"] = "changed"            # a copy: the cache keeps its own
        again = copy.deepcopy(space)        # an equal space, another object
        assert spaces.space_to_dict(again) == expected
    # Each cached space packed once for the cache and once for `expected` (Box:
    # low and high, MultiDiscrete: nvec); the Dict's Box once, through the
    # cache (the Tuple's MultiDiscrete is one of the cached ones).
    n_arrays = sum(2 if isinstance(s, gym.spaces.Box) else 1 for s in CACHED_SPACES)
    assert len(packs) == 2 * n_arrays + 2


def test_space_from_dict_is_cached_and_hands_out_copies(monkeypatch):
    monkeypatch.setattr(spaces, "_FROM_DICT", {})
    unpacks = count_calls(monkeypatch, "_unpack_array")
    for space in CACHED_SPACES + OTHER_SPACES:
        d = spaces.space_to_dict(space)
        first, second = spaces.space_from_dict(d), spaces.space_from_dict(dict(d))
        assert type(first) is type(second) is type(space)
        assert first == second == space and first is not second
        for name, value in vars(first).items():
            if isinstance(value, np.ndarray):
                assert not np.shares_memory(value, getattr(second, name)), name
        if isinstance(first, gym.spaces.Box):
            first.low[...] = first.high
            first.seed(0)
            third = spaces.space_from_dict(d)
            assert third == space and third.np_random is not first.np_random
            assert (third.low == space.low).all()
    # Once per description: the cached spaces, then the Dict's Box (the Tuple's
    # MultiDiscrete is one of the cached ones).
    n_arrays = sum(2 if isinstance(s, gym.spaces.Box) else 1 for s in CACHED_SPACES)
    assert len(unpacks) == n_arrays + 2


def test_space_from_dict_of_other_forms_is_not_cached():
    d = spaces.space_to_dict(BOX)
    as_json = {**d, "shape": list(d["shape"])}           # a state read back from JSON
    assert spaces.space_from_dict(as_json) == BOX
    with pytest.raises((TypeError, ValueError, AttributeError)):
        spaces.space_from_dict({**d, "dtype": 5})


@pytest.mark.rllib
def test_cached_space_conversions_match_rllib():
    from ray.rllib.utils.serialization import gym_space_from_dict, gym_space_to_dict

    for space in CACHED_SPACES + OTHER_SPACES:
        for _ in range(2):  # uncached, then cached
            ours, theirs = spaces.space_to_dict(space), gym_space_to_dict(space)
            compare(ours, theirs, f"space_to_dict({space})")
            back_ours, back_theirs = spaces.space_from_dict(theirs), gym_space_from_dict(theirs)
            assert type(back_ours) is type(back_theirs) and back_ours == back_theirs
            assert {k: type(v) for k, v in vars(back_ours).items()} == \
                {k: type(v) for k, v in vars(back_theirs).items()}


# -- started_episode and the compiled get_return ----------------------------------

def test_started_episode_is_the_constructor_and_add_env_reset():
    from episode._episode import started_episode

    box, discrete = gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(3)
    obs = np.array([0.5, -0.5], np.float32)
    fast = started_episode(SingleAgentEpisode, box, discrete, obs, {"a": 1})
    slow = SingleAgentEpisode(observation_space=box, action_space=discrete)
    slow.add_env_reset(obs, {"a": 1})
    assert type(fast) is SingleAgentEpisode and fast.id_ != slow.id_
    state_a, state_b = fast.get_state(), slow.get_state()
    for key in ("id_", "_start_time", "_last_step_time"):
        state_a.pop(key), state_b.pop(key)
    assert repr(state_a) == repr(state_b)
    with pytest.raises(AssertionError):
        fast.add_env_reset(obs)          # the usual checks still hold


@pytest.mark.parametrize("rewards", [
    [np.float64(0.1)] * 7, [np.float64(-0.0)], [np.float64(1e308), np.float64(1e308)],
    [0.1, 0.2, 0.3], [np.float32(0.1)] * 3, [1, 2], [np.float64(0.5), 1.0], [],
])
@pytest.mark.parametrize("numpy", [False, True])
@pytest.mark.parametrize("lookback", [0, 2])
def test_get_return_is_the_sum_of_get_rewards(rewards, numpy, lookback):
    n = len(rewards)
    e = SingleAgentEpisode(observations=[0.0] * (n + 1), actions=[0] * n,
                           rewards=list(rewards), len_lookback_buffer=min(lookback, n))
    if numpy:
        e.to_numpy()
    expected = sum(e.get_rewards())
    got = e.get_return()
    assert type(got) is type(expected)
    assert got == expected or (np.isnan(got) and np.isnan(expected))
    assert repr(got) == repr(expected)      # -0.0 and 0.0 apart


def test_space_from_dict_caches_a_box_whose_shape_came_back_as_a_list(monkeypatch):
    # msgpack (RLlib's recordings) turns the shape tuple into a list: the
    # description is the same one, unpacked once.
    monkeypatch.setattr(spaces, "_FROM_DICT", {})
    unpacks = count_calls(monkeypatch, "_unpack_array")
    space = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
    d = spaces.space_to_dict(space)
    d["shape"] = list(d["shape"])
    for _ in range(3):
        again = spaces.space_from_dict(dict(d))
        assert again == space and again.shape == (2, 3)
    assert len(unpacks) == 2
