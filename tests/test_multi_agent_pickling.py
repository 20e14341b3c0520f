"""Pickling a MultiAgentEpisode: one state, one restore call, every Column's
rows out of band, and a restore that refuses a corrupted state with
ValueError/TypeError before it builds anything from it. (No ray: these run
in the sanitizer build too.)"""

import copy
import pickle
import pickletools
from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest

from episode import InfiniteLookbackBuffer, MultiAgentEpisode, SingleAgentEpisode
from episode._multi import MA_FORMAT, _restore_multi_agent
from episode.multi_agent_episode import AgentSteps


def obs(t):
    return np.array([t, -t], np.float32)


def simultaneous(steps=6, numpy=True):
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a0": obs(0), "a1": obs(1)},
                     infos={"a0": {"i": 0}, "a1": {}})
    for t in range(1, steps + 1):
        ep.add_env_step({"a0": obs(t), "a1": obs(t + 1)}, {"a0": t % 2, "a1": 1 - t % 2},
                        {"a0": t * 0.5, "a1": -t * 0.5},
                        extra_model_outputs={"a0": {"vf": np.float32(t)},
                                             "a1": {"vf": np.float32(-t)}})
    return ep.to_numpy() if numpy else ep


def turns():
    """Agents taking turns: each skips every other env step, a1's last
    action and reward hang, a0 is done before the end."""
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a0": obs(0)})
    for t in range(1, 6):
        actor, other = ("a0", "a1") if t % 2 else ("a1", "a0")
        ep.add_env_step({other: obs(t)}, {actor: t}, {"a0": 0.25 * t, "a1": -0.25 * t})
    ep.add_env_step({"a0": obs(9)}, {"a1": 7}, {"a0": 1.0}, terminateds={"a0": True})
    ep.add_env_step({}, {}, {"a1": 2.0})
    return ep


def with_spaces():
    spaces = {"a0": gym.spaces.Box(-10, 10, (2,), np.float32),
              "a1": gym.spaces.Box(-10, 10, (2,), np.float32)}
    actions = {"a0": gym.spaces.Discrete(2), "a1": gym.spaces.Discrete(2)}
    ep = MultiAgentEpisode(observation_space=spaces, action_space=actions,
                           agent_to_module_mapping_fn=_module_of)
    ep.add_env_reset(observations={"a0": obs(0), "a1": obs(1)})
    for t in range(1, 4):
        ep.add_env_step({"a0": obs(t), "a1": obs(t)}, {"a0": 1, "a1": 0}, {"a0": 1.0, "a1": 2.0})
    ep.custom_data["note"] = [1, 2]
    return ep


def _module_of(agent_id, episode):
    return f"module_{agent_id}"


def with_lookback():
    observations = [{"a0": obs(t), "a1": obs(t)} for t in range(6)]
    actions = [{"a0": t % 2, "a1": 1} for t in range(5)]
    rewards = [{"a0": 1.0 * t, "a1": 2.0} for t in range(5)]
    return MultiAgentEpisode(observations=observations, actions=actions, rewards=rewards,
                             len_lookback_buffer=2, env_t_started=7)


def cut_chunks():
    """An episode of 4 steps and its successor (cut with lookback 1) of 3."""
    ep = simultaneous(4, numpy=False)
    successor = ep.cut(len_lookback_buffer=1)
    for t in range(5, 8):
        successor.add_env_step({"a0": obs(t), "a1": obs(t)}, {"a0": 0, "a1": 1},
                               {"a0": 1.0, "a1": 1.0},
                               extra_model_outputs={"a0": {"vf": np.float32(t)},
                                                    "a1": {"vf": np.float32(t)}})
    return ep, successor


def cut_and_concat():
    ep, successor = cut_chunks()
    ep.concat_episode(successor)
    return ep


def from_state():
    return MultiAgentEpisode.from_state(simultaneous(3).get_state())


EPISODES = {
    "numpy": simultaneous,
    "list": lambda: simultaneous(numpy=False),
    "turns": turns,
    "turns_numpy": lambda: _numpy_turns(),
    "spaces": with_spaces,
    "lookback": with_lookback,
    "cut": lambda: simultaneous(4).cut(len_lookback_buffer=2),
    "concat": cut_and_concat,
    "from_state": from_state,
    "empty": MultiAgentEpisode,
}


def _numpy_turns():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a0": obs(0)})
    for t in range(1, 6):
        actor, other = ("a0", "a1") if t % 2 else ("a1", "a0")
        ep.add_env_step({other: obs(t)}, {actor: t}, {"a0": 0.25 * t, "a1": -0.25 * t})
    return ep.to_numpy()


# -- the same episode back -------------------------------------------------------------------


def same(a, b, path="episode"):
    """Raises AssertionError where `a` and `b` differ (types, values, dtypes)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a!r} != {b!r}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        if isinstance(a, defaultdict):
            assert a.default_factory == b.default_factory or (
                type(a.default_factory).__name__ == type(b.default_factory).__name__), path
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, InfiniteLookbackBuffer):
        same(a.get_state(), b.get_state(), f"{path}.state")
        assert a.finalized == b.finalized, path
    elif isinstance(a, SingleAgentEpisode):
        same(a.get_state(), b.get_state(), f"{path}.state")
        for name in ("_last_added_observation", "_last_added_infos", "t", "t_started",
                     "is_terminated", "is_truncated", "_start_time", "_last_step_time"):
            same(getattr(a, name), getattr(b, name), f"{path}.{name}")
        assert type(a.extra_model_outputs) is type(b.extra_model_outputs), path
    elif isinstance(a, gym.Space):
        assert a == b, f"{path}: {a} != {b}"
    elif callable(a):
        assert a is b, path
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def same_times(a, b):
    """Gives `b` the step times of `a` (each step reads the clock)."""
    b._start_time, b._last_step_time = a._start_time, a._last_step_time
    for aid, agent in a.agent_episodes.items():
        b.agent_episodes[aid]._start_time = agent._start_time
        b.agent_episodes[aid]._last_step_time = agent._last_step_time


def same_episode(a, b):
    same(a.get_state(), b.get_state())
    for name in ("agent_episodes", "env_t_to_agent_t", "agent_t_started",
                 "_hanging_actions_end", "_hanging_extra_model_outputs_end",
                 "_hanging_rewards_end", "_hanging_rewards_begin", "_len_lookback_buffers",
                 "_agent_to_module_mapping", "observation_space", "action_space"):
        same(getattr(a, name), getattr(b, name), name)
    assert len(a) == len(b) and a.env_t == b.env_t and a.is_done == b.is_done
    if not a.agent_episodes:
        return
    for env_steps in (True, False):
        for getter in ("get_observations", "get_actions", "get_rewards", "get_infos"):
            same(getattr(a, getter)(env_steps=env_steps), getattr(b, getter)(env_steps=env_steps),
                 f"{getter}(env_steps={env_steps})")
            same(getattr(a, getter)(-1, env_steps=env_steps),
                 getattr(b, getter)(-1, env_steps=env_steps), f"{getter}(-1)")
            same(getattr(a, getter)(slice(-4, 2), env_steps=env_steps, fill=0),
                 getattr(b, getter)(slice(-4, 2), env_steps=env_steps, fill=0),
                 f"{getter}(fill)")
    same(a.get_return(), b.get_return(), "return")


def round_trips(ep):
    yield "p5", pickle.loads(pickle.dumps(ep, protocol=5))
    buffers = []
    data = pickle.dumps(ep, protocol=5, buffer_callback=buffers.append)
    yield "p5 out of band", pickle.loads(data, buffers=buffers)
    yield "p5 out of band, read-only", pickle.loads(
        data, buffers=[bytes(b.raw()) for b in buffers])
    yield "p2", pickle.loads(pickle.dumps(ep, protocol=2))
    yield "deepcopy", copy.deepcopy(ep)


@pytest.mark.parametrize("name", list(EPISODES))
def test_round_trip_gives_the_same_episode(name):
    ep = EPISODES[name]()
    for how, back in round_trips(ep):
        try:
            same_episode(ep, back)
        except AssertionError as error:
            raise AssertionError(f"{how}: {error}") from None


VF = {"a0": {"vf": np.float32(9)}, "a1": {"vf": np.float32(9)}}


@pytest.mark.parametrize("name,outputs", [("numpy", VF), ("list", VF), ("lookback", None)])
def test_restored_episode_steps_on_as_the_original(name, outputs):
    ep = EPISODES[name]()
    back = pickle.loads(pickle.dumps(ep, protocol=5))
    for e in (ep, back):
        e.add_env_step({"a0": obs(20), "a1": obs(21)}, {"a0": 1, "a1": 0},
                       {"a0": 5.0, "a1": 6.0}, extra_model_outputs=outputs)
    same_times(ep, back)
    same_episode(ep, back)


def test_one_restore_call_and_no_other_global():
    # The old format named a restore function per agent episode, buffer and
    # Column, and the classes and factories of every container.
    data = pickle.dumps(simultaneous(), protocol=5)
    ops = [op.name for op, _, _ in pickletools.genops(data)]
    assert ops.count("STACK_GLOBAL") + ops.count("GLOBAL") == 1
    assert ops.count("REDUCE") == 1


def test_every_numeric_column_goes_out_of_band():
    ep = simultaneous(1000)
    buffers = []
    data = pickle.dumps(ep, protocol=5, buffer_callback=buffers.append)
    # Per agent: observations, actions, rewards, the vf output and its mapping.
    assert len(buffers) == 10
    assert sum(b.raw().nbytes for b in buffers) > 50_000
    assert len(data) < 4_000        # ids, flags, a0's infos (a list of 1,001 dicts)


def test_restored_rows_are_read_in_place_until_written():
    ep = simultaneous()
    buffers = []
    data = pickle.dumps(ep, protocol=5, buffer_callback=buffers.append)
    shared = [bytes(b.raw()) for b in buffers]          # read-only, as Ray's object store
    back = pickle.loads(data, buffers=shared)
    rows = back.agent_episodes["a0"].observations.data
    assert not rows.flags.writeable
    back.agent_episodes["a0"].set_observations(new_data=obs(99), at_indices=0)
    assert np.array_equal(back.agent_episodes["a0"].get_observations(0), obs(99))
    assert np.array_equal(ep.agent_episodes["a0"].get_observations(0), obs(0))


def test_misaligned_out_of_band_rows_are_copied_to_aligned_storage():
    ep = simultaneous()
    buffers = []
    data = pickle.dumps(ep, protocol=5, buffer_callback=buffers.append)
    shifted = []
    for b in buffers:
        raw = bytes(b.raw())
        block = bytearray(len(raw) + 1)
        block[1:] = raw
        shifted.append(memoryview(block)[1:])            # one byte off: misaligned
    back = pickle.loads(data, buffers=shifted)
    same_episode(ep, back)
    for agent in back.agent_episodes.values():
        for track in (agent.observations, agent.actions, agent.rewards,
                      *agent.extra_model_outputs.values()):
            assert track.data.flags.aligned


def test_the_facade_classes_and_defaults_are_restored():
    back = pickle.loads(pickle.dumps(simultaneous(), protocol=5))
    assert type(back) is MultiAgentEpisode
    assert all(type(e) is SingleAgentEpisode for e in back.agent_episodes.values())
    assert type(back.env_t_to_agent_t) is defaultdict
    assert back.env_t_to_agent_t.default_factory is AgentSteps
    assert all(type(m) is AgentSteps for m in back.env_t_to_agent_t.values())
    assert back.agent_t_started.default_factory is int
    assert back._hanging_rewards_end.default_factory is float
    assert back._hanging_extra_model_outputs_end.default_factory is dict
    spaced = pickle.loads(pickle.dumps(with_spaces(), protocol=5))
    assert spaced.agent_to_module_mapping_fn is _module_of
    assert spaced.module_for("a0") == "module_a0"


class MyEpisode(MultiAgentEpisode):
    __slots__ = ()


def test_a_subclass_pickles_as_itself():
    ep = MyEpisode()
    ep.add_env_reset(observations={"a0": obs(0)})
    ep.add_env_step({"a0": obs(1)}, {"a0": 1}, {"a0": 1.0})
    back = pickle.loads(pickle.dumps(ep, protocol=5))
    assert type(back) is MyEpisode
    same_episode(ep, back)


# -- corrupted states -------------------------------------------------------------------------

def _state(ep=None):
    fn, (version, cls, state) = (ep or simultaneous()).__reduce_ex__(5)
    assert fn is _restore_multi_agent and version == MA_FORMAT
    return cls, state


def _edit(x, path, value):
    if not path:
        return value
    items = list(x)
    items[path[0]] = _edit(items[path[0]], path[1:], value)
    return tuple(items)


# Positions in the state (see _multi.pyx and _episode.pyx).
AGENTS, MAPPINGS = 18, 19                       # the state's agent episodes and mappings
A0 = (AGENTS, 2, 0)                             # agent a0's episode state
OBS, ACTIONS, REWARDS, EXTRAS = 17, 19, 20, 21  # its tracks
PAYLOAD = 5                                     # a buffer state's payload


def _payload(path):
    return path + (PAYLOAD,)


CORRUPT = {
    "state not a tuple": ((), [1, 2]),
    "state short": ((), (1, 2, 3)),
    "agent ids and states mismatched": ((AGENTS, 1), ("a0",)),
    "mapping ids and states mismatched": ((MAPPINGS, 1), ("a0", "a1", "a2")),
    "an agent id twice": ((AGENTS, 1), ("a0", "a0")),
    "agent list not a tuple": ((AGENTS, 1), ["a0", "a1"]),
    "unknown container": ((AGENTS, 0), 17),
    "factory not callable": ((MAPPINGS, 0), ("x",)),
    "episode state short": (A0, (None, "id")),
    "episode class not an episode": (A0 + (0,), dict),
    "t not an int": (A0 + (7,), 1.5),
    "t beyond an index": (A0 + (7,), 2**63),
    "last-row flag not a bool": (A0 + (13,), 1),
    "start time not a float": (A0 + (10,), "x"),
    "negative lookback": (A0 + (OBS, 0), -1),
    "huge lookback": (A0 + (ACTIONS, 0), 2**61),
    "buffer state short": (A0 + (REWARDS,), (0, None, 1)),
    "unknown Column kind": (A0 + (ACTIONS, 2), 99),
    "Column kind not an int": (A0 + (ACTIONS, 2), 5.0),
    "flag not a bool": (A0 + (OBS, 3), 1),
    "wrong dtype for the rows": (_payload(A0 + (OBS,)) + (1,), "<f8"),
    "object dtype": (_payload(A0 + (OBS,)) + (1,), "|O"),
    "not a dtype": (_payload(A0 + (OBS,)) + (1,), "nonsense"),
    "truncated rows": (_payload(A0 + (OBS,)) + (0,), b"\0" * 12),
    "no rows at all": (_payload(A0 + (OBS,)) + (0,), b""),
    "rows not a buffer": (_payload(A0 + (OBS,)) + (0,), 12345),
    "shape too long for the bytes": (_payload(A0 + (OBS,)) + (2,), (100, 2)),
    "negative dimension": (_payload(A0 + (OBS,)) + (2,), (-7, 2)),
    "dimension overflowing": (_payload(A0 + (OBS,)) + (2,), (2**62, 2**62)),
    "shape not a tuple": (_payload(A0 + (OBS,)) + (2,), [7, 2]),
    "no shape": (_payload(A0 + (OBS,)) + (2,), ()),
    "payload short": (_payload(A0 + (OBS,)), (b"", "<f4")),
    "fewer actions than observations": (_payload(A0 + (ACTIONS,)) + (2,), (3,)),
    "extra outputs short": (A0 + (EXTRAS,), (-1, ("vf",), ())),
    "space description garbage": (A0 + (REWARDS, 1), ("box", 1, 2)),
    "space state not a tuple": (A0 + (REWARDS, 1), 3),
    "mapping steps as floats": (_payload((MAPPINGS, 2, 0)) + (1,), "<f8"),
    "mapping fn not wrapped": ((1,), len),
    "times not floats": ((16,), 3),
    "container field garbage": ((7,), (1, 2, 3)),
    "factory code out of range": ((7,), (9, {})),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupted_state_is_refused(name):
    cls, state = _state()
    path, value = CORRUPT[name]
    if name == "fewer actions than observations":
        # An actions Column whose raw bytes are shortened to match: a
        # consistent Column, an inconsistent episode.
        state = _edit(state, _payload(A0 + (ACTIONS,)) + (0,), b"\0" * 24)
    bad = _edit(state, path, value)
    with pytest.raises((ValueError, TypeError)):
        _restore_multi_agent(MA_FORMAT, cls, bad)


@pytest.mark.parametrize("version", [0, 2, "1", None, 1.0])
def test_other_formats_are_refused(version):
    cls, state = _state()
    with pytest.raises(ValueError, match="format"):
        _restore_multi_agent(version, cls, state)


@pytest.mark.parametrize("cls", [dict, SingleAgentEpisode, 5, "MultiAgentEpisode"])
def test_restoring_as_another_class_is_refused(cls):
    _, state = _state()
    with pytest.raises(TypeError):
        _restore_multi_agent(MA_FORMAT, cls, state)

