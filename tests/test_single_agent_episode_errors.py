"""Bad input: our episode raises the exception class RLlib raises and keeps its data.

Covered, each with a non-numpy'ized and a numpy'ized episode: add_env_step
after the episode is done, add_env_reset twice, concat_episode of a chunk
that does not fit (id, t, the boundary observation), from_state with
inconsistent lengths, len() and slice() of a state with t before t_started,
and calls on an episode whose constructor never ran; and a set of bad inputs
under python -O (no check may be a bare assert).
The `rllib` tests run both implementations side by side (difftools.EpTwin
checks the class and that our episode equals its own state before the call);
the others check ours alone against the class RLlib raises (AssertionError
for all of these: RLlib's plain `assert`s and `validate()`).
"""
from __future__ import annotations

import copy
import os
import signal

import gymnasium as gym
import numpy as np
import pytest

from difftools import KINDS, EpTwin, Other, compare, episode_state
from episode import SingleAgentEpisode

REWARD = KINDS["reward"].item
KIND_NAMES = ["box4", "discrete_np", "dict", "nested", "string"]
MODES = ["list", "numpy"]


def build(cls, kind, steps=3, numpy=False, **kwargs):
    ep = cls(id_="ep", observation_space=kind.space,
             action_space=gym.spaces.Discrete(3), **kwargs)
    ep.add_env_reset(kind.item(0), infos={"r": 0})
    for i in range(1, steps + 1):
        ep.add_env_step(kind.item(i), i % 3, REWARD(i), infos={"i": i} if i % 2 else None,
                        extra_model_outputs={"logp": np.float32(-i)})
    if numpy:
        ep.to_numpy()
    return ep


def step_kwargs(kind, i):
    return dict(observation=kind.item(i), action=i % 3, reward=REWARD(i),
                extra_model_outputs={"logp": np.float32(-i)})


def assert_raises_and_keeps(ep, exc_class, fn):
    before = episode_state(ep)
    with pytest.raises(exc_class):
        fn()
    compare(episode_state(ep), before, "episode after the failed call")


def twin_of(kind, steps=3, numpy=False, **kwargs):
    twin = EpTwin.new(id_="ep", observation_space=kind.space,
                      action_space=gym.spaces.Discrete(3), **kwargs)
    twin.call("add_env_reset", kind.item(0), infos={"r": 0})
    for i in range(1, steps + 1):
        twin.call("add_env_step", **step_kwargs(kind, i), infos={"i": i} if i % 2 else None)
    if numpy:
        twin.call("to_numpy")
    return twin


# -- add_env_step after done ---------------------------------------------------------


@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_step_after_done(kind, mode, flag):
    kind = KINDS[kind]
    ep = build(SingleAgentEpisode, kind, numpy=mode == "numpy")
    ep.add_env_step(**step_kwargs(kind, 4), **{flag: True})
    assert ep.is_done
    assert_raises_and_keeps(ep, AssertionError, lambda: ep.add_env_step(**step_kwargs(kind, 5)))
    assert_raises_and_keeps(ep, AssertionError, lambda: ep.add_env_step(
        **step_kwargs(kind, 5), terminated=False, truncated=False))
    assert_raises_and_keeps(ep, AssertionError, lambda: ep.cut())


@pytest.mark.parametrize("mode", MODES)
def test_step_after_done_from_the_constructor(mode):
    ep = SingleAgentEpisode(id_="d", observations=[0.0, 1.0], actions=[0], rewards=[1.0],
                            terminated=True, len_lookback_buffer=0)
    if mode == "numpy":
        ep.to_numpy()
    assert_raises_and_keeps(ep, AssertionError, lambda: ep.add_env_step(2.0, 1, 1.0))


@pytest.mark.rllib
@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_step_after_done_like_rllib(kind, mode, flag):
    kind = KINDS[kind]
    twin = twin_of(kind, numpy=mode == "numpy")
    twin.call("add_env_step", **step_kwargs(kind, 4), **{flag: True})
    twin.call("add_env_step", **step_kwargs(kind, 5))
    twin.call("add_env_step", **step_kwargs(kind, 5), **{flag: False})
    twin.call("add_env_reset", kind.item(0))


# -- add_env_reset twice ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("steps", [0, 2])
def test_reset_twice(kind, mode, steps):
    kind = KINDS[kind]
    ep = build(SingleAgentEpisode, kind, steps=steps, numpy=mode == "numpy")
    assert_raises_and_keeps(ep, AssertionError, lambda: ep.add_env_reset(kind.item(9)))
    assert_raises_and_keeps(ep, AssertionError,
                            lambda: ep.add_env_reset(kind.item(0), infos={"x": 1}))


def test_reset_after_constructor_data():
    for lookback in ("auto", 0):
        ep = SingleAgentEpisode(id_="c", observations=[0.0, 1.0], actions=[0], rewards=[1.0],
                                len_lookback_buffer=lookback)
        assert_raises_and_keeps(ep, AssertionError, lambda: ep.add_env_reset(5.0))


@pytest.mark.rllib
@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_reset_twice_like_rllib(kind, mode):
    kind = KINDS[kind]
    for steps in (0, 2):
        twin = twin_of(kind, steps=steps, numpy=mode == "numpy")
        twin.call("add_env_reset", kind.item(9))
        twin.call("add_env_reset", observation=kind.item(0), infos={"x": 1})
    for lookback in ("auto", 0):
        twin = EpTwin.new(id_="c", observations=kind.items(2), actions=[0], rewards=[1.0],
                          len_lookback_buffer=lookback)
        twin.call("add_env_reset", kind.item(5))


# -- concat_episode of a chunk that does not fit ------------------------------------------


def misfit_chunks(cls, kind, self_numpy, other_numpy):
    """(label, self, other) for chunks that do not fit onto `self`."""
    def fresh():
        ep = build(cls, kind)
        chunk = ep.cut()
        for i in (4, 5):
            chunk.add_env_step(**step_kwargs(kind, i))
        return ep, chunk

    def finish(ep, chunk):
        if self_numpy:
            ep.to_numpy()
        if other_numpy:
            chunk.to_numpy()
        return ep, chunk

    ep, chunk = fresh()
    chunk.id_ = "other"
    yield ("id", *finish(ep, chunk))
    ep, chunk = fresh()
    chunk.t_started += 1
    yield ("t", *finish(ep, chunk))
    ep, chunk = fresh()
    chunk.set_observations(new_data=kind.item(7), at_indices=0)
    yield ("boundary observation", *finish(ep, chunk))
    ep, chunk = fresh()
    ep.is_truncated = True
    yield ("self done", *finish(ep, chunk))
    ep, chunk = fresh()
    chunk.extra_model_outputs["new"] = type(chunk.extra_model_outputs["logp"])(
        [np.float32(0), np.float32(1)])
    yield ("unknown extra key", *finish(ep, chunk))


CONCAT_MODES = [(False, False), (False, True), (True, False), (True, True)]


@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("self_numpy, other_numpy", CONCAT_MODES)
def test_concat_misfits(kind, self_numpy, other_numpy):
    kind = KINDS[kind]
    for label, ep, chunk in misfit_chunks(SingleAgentEpisode, kind, self_numpy, other_numpy):
        other_before = episode_state(chunk)
        assert_raises_and_keeps(ep, AssertionError, lambda: ep.concat_episode(chunk))
        compare(episode_state(chunk), other_before, f"the chunk after a failed concat ({label})")


@pytest.mark.parametrize("mode", MODES)
def test_concat_boundary_observation_of_another_structure(mode):
    """A Dict observation with other keys: RLlib's tree.assert_same_structure
    raises ValueError."""
    kind = KINDS["dict"]
    ep = build(SingleAgentEpisode, kind, numpy=mode == "numpy")
    other = SingleAgentEpisode(id_="ep", observations=[{"a": np.zeros(2, np.float32)}],
                               t_started=ep.t)
    assert_raises_and_keeps(ep, ValueError, lambda: ep.concat_episode(other))


@pytest.mark.rllib
@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("self_numpy, other_numpy", CONCAT_MODES)
def test_concat_misfits_like_rllib(kind, self_numpy, other_numpy):
    from difftools import rllib_episode_class

    kind = KINDS[kind]
    pairs = zip(misfit_chunks(SingleAgentEpisode, kind, self_numpy, other_numpy),
                misfit_chunks(rllib_episode_class(), kind, self_numpy, other_numpy))
    for (label, ours, ours_other), (_, theirs, theirs_other) in pairs:
        if label == "unknown extra key" and kind.struct and self_numpy and not other_numpy:
            continue  # RLlib crashes extending numpy'ized Dict/Tuple data before it checks
        twin, other = EpTwin(ours, theirs), EpTwin(ours_other, theirs_other)
        twin.check_state(f"building the {label} case")
        other.check_state(f"building the {label} case")
        twin.call("concat_episode", Other(other))
        other.check_state(f"a failed concat ({label})")


@pytest.mark.rllib
@pytest.mark.parametrize("mode", MODES)
def test_concat_boundary_observation_of_another_structure_like_rllib(mode):
    kind = KINDS["dict"]
    twin = twin_of(kind, numpy=mode == "numpy")
    other = EpTwin.new(id_="ep", observations=[{"a": np.zeros(2, np.float32)}], t_started=3)
    twin.call("concat_episode", Other(other))


# -- from_state with inconsistent lengths --------------------------------------------------


def shorten(buffer_state, by=1):
    """A copy of a buffer's state with `by` items fewer (the data itself is not
    copied beyond what slicing does: lists copy, arrays view)."""
    def cut(data):
        if isinstance(data, dict):
            return {k: cut(v) for k, v in data.items()}
        if isinstance(data, tuple):
            return tuple(cut(v) for v in data)
        return data[:-by]

    return dict(buffer_state, data=cut(buffer_state["data"]))


def lengthen(buffer_state):
    data = buffer_state["data"]
    if isinstance(data, list):
        return dict(buffer_state, data=data + [copy.deepcopy(data[-1])])
    if isinstance(data, np.ndarray):
        return dict(buffer_state, data=np.concatenate([data, data[-1:]]))
    return None


BAD_STATES = {
    "actions short": lambda s: dict(s, actions=shorten(s["actions"])),
    "rewards short": lambda s: dict(s, rewards=shorten(s["rewards"])),
    "observations short": lambda s: dict(s, observations=shorten(s["observations"])),
    "infos short": lambda s: dict(s, infos=shorten(s["infos"])),
    "observations long": lambda s: lengthen(s["observations"]) and dict(
        s, observations=lengthen(s["observations"])),
    "extra short": lambda s: dict(s, extra_model_outputs={
        k: shorten(v) for k, v in s["extra_model_outputs"].items()}),
    "lookback of infos": lambda s: dict(s, infos=dict(s["infos"],
                                                      lookback=s["infos"]["lookback"] + 1)),
}


def bad_states(state):
    for label, make in BAD_STATES.items():
        bad = make(state)
        if bad is not None:
            yield label, bad


@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_from_state_inconsistent_lengths(kind, mode):
    kind = KINDS[kind]
    ep = build(SingleAgentEpisode, kind, steps=4, numpy=mode == "numpy")
    before = episode_state(ep)
    for label, bad in bad_states(ep.get_state()):  # shares data with `ep`
        with pytest.raises(AssertionError):
            SingleAgentEpisode.from_state(bad)
        compare(episode_state(ep), before, f"the episode whose state it was ({label})")
    # A good state still works.
    restored = SingleAgentEpisode.from_state(ep.get_state())
    compare(episode_state(restored), before, "from_state of the good state")


@pytest.mark.rllib
@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_from_state_inconsistent_lengths_like_rllib(kind, mode):
    from difftools import Mismatch, rllib_episode_class

    kind = KINDS[kind]
    twin = twin_of(kind, steps=4, numpy=mode == "numpy")
    before = episode_state(twin.ours)
    for source in ("RLlib's state", "our state"):
        state = (twin.theirs if source == "RLlib's state" else twin.ours).get_state()
        for label, bad in bad_states(state):
            try:
                rllib_episode_class().from_state(copy.deepcopy(bad))
                exc_theirs = None
            except Exception as e:  # noqa: BLE001
                exc_theirs = e
            try:
                SingleAgentEpisode.from_state(bad)
                exc_ours = None
            except Exception as e:  # noqa: BLE001
                exc_ours = e
            if exc_theirs is None:
                assert exc_ours is None, f"{source}, {label}: RLlib accepts it, ours raised " \
                    f"{exc_ours!r}"
                continue
            if not isinstance(exc_ours, type(exc_theirs)):
                raise Mismatch(f"{source}, {label}: RLlib raised {exc_theirs!r}, ours "
                               f"{exc_ours!r}")
            compare(episode_state(twin.ours), before, f"our episode ({source}, {label})")


# -- t before t_started (or t - t_started beyond an index) --------------------------------


BAD_COUNTERS = [(0, 5, ValueError), (3, 4, ValueError), (-2 ** 63, 0, ValueError),
                (2 ** 63 - 1, -1, OverflowError), (2 ** 62, -2 ** 62, OverflowError),
                (2 ** 63 - 1, -2 ** 63, OverflowError)]
LEN_CALLS = {
    "len": len,
    "slice": lambda ep: ep.slice(slice(0, 1)),
    "[a:b]": lambda ep: ep[:],
    "repr": repr,
    "env_steps": lambda ep: ep.env_steps(),
    "agent_steps": lambda ep: ep.agent_steps(),
    "to_numpy": lambda ep: ep.to_numpy(),
    "get_data_dict": lambda ep: ep.get_data_dict(),
}


@pytest.mark.parametrize("t, t_started, exc", BAD_COUNTERS)
def test_len_of_a_state_with_t_before_t_started(t, t_started, exc):
    """RLlib's len is t - t_started, and len() refuses a negative one with
    ValueError, one beyond an index with OverflowError; every call that needs
    the length raises the same (never SystemError), and the episode stays as
    it was."""
    state = build(SingleAgentEpisode, KINDS["box4"], steps=2).get_state()
    ep = SingleAgentEpisode.from_state({**state, "t": t, "t_started": t_started})
    before = ep.get_state()
    for name, call in LEN_CALLS.items():
        with pytest.raises(exc, match="__len__|index-sized"):
            call(ep)
    assert ep.t == t and ep.t_started == t_started
    compare(ep.get_state(), before, "the episode after the failed calls")
    assert len(ep.cut()) == 0  # cut() does not need the length


@pytest.mark.rllib
@pytest.mark.parametrize("t, t_started, exc", BAD_COUNTERS)
def test_len_of_a_state_with_t_before_t_started_like_rllib(t, t_started, exc):
    from difftools import Mismatch, rllib_episode_class

    twin = twin_of(KINDS["box4"], steps=2)
    ours = SingleAgentEpisode.from_state({**twin.ours.get_state(), "t": t,
                                          "t_started": t_started})
    theirs = rllib_episode_class().from_state({**twin.theirs.get_state(), "t": t,
                                               "t_started": t_started})
    for name, call in LEN_CALLS.items():
        for side, ep in (("RLlib", theirs), ("ours", ours)):
            try:
                call(ep)
            except exc:
                continue
            except Exception as e:  # noqa: BLE001
                raise Mismatch(f"{name}: {side} raised {e!r}, expected {exc.__name__}")
            raise Mismatch(f"{name}: {side} returned, expected {exc.__name__}")


# -- an episode whose __init__ never ran --------------------------------------------------


UNINITIALIZED_CALLS = {
    "repr": repr,
    "len": len,
    "get_observations": lambda ep: ep.get_observations(),
    "get_actions": lambda ep: ep.get_actions(0),
    "get_rewards": lambda ep: ep.get_rewards(slice(0, 2)),
    "get_infos": lambda ep: ep.get_infos(),
    "get_return": lambda ep: ep.get_return(),
    "validate": lambda ep: ep.validate(),
    "to_numpy": lambda ep: ep.to_numpy(),
    "cut": lambda ep: ep.cut(),
    "get_state": lambda ep: ep.get_state(),
    "add_env_reset": lambda ep: ep.add_env_reset(0.0),
    "add_env_step": lambda ep: ep.add_env_step(0.0, 0, 0.0),
    "is_numpy": lambda ep: ep.is_numpy,
}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_uninitialized_episode_raises_instead_of_crashing():
    """`SingleAgentEpisode.__new__(cls)` without __init__ (also what a traceback
    printer sees of `self` when __init__ raised): every call must raise or
    return, never crash the interpreter (RLlib raises AttributeError)."""
    crashed = []
    for name, call in UNINITIALIZED_CALLS.items():
        pid = os.fork()
        if pid == 0:  # child
            try:
                call(SingleAgentEpisode.__new__(SingleAgentEpisode))
            except BaseException:  # noqa: BLE001 - any exception is fine
                pass
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            crashed.append(f"{name}: {signal.Signals(os.WTERMSIG(status)).name}")
    assert not crashed, f"calls on an uninitialized episode crash the interpreter: {crashed}"


# -- the same checks under python -O -------------------------------------------------------


# Run with `python -O` (asserts stripped): every bad input must still raise
# AssertionError and leave the episode as it was. Prints one line per case.
OPTIMIZED_SCRIPT = r'''
import gymnasium as gym
import numpy as np

from difftools import Mismatch, compare, episode_state
from episode import InfiniteLookbackBuffer, SingleAgentEpisode

print("debug", __debug__)
SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def episode(id_="ep", steps=3, start=0, numpy=False, extras=True):
    ep = SingleAgentEpisode(id_=id_, observation_space=SPACE,
                            action_space=gym.spaces.Discrete(3))
    ep.add_env_reset(np.full(2, start * 0.1, np.float32))
    for i in range(start + 1, start + steps + 1):
        ep.add_env_step(np.full(2, i * 0.1, np.float32), i % 3, float(i),
                        extra_model_outputs={"logp": np.float32(-i)} if extras else None)
    return ep.to_numpy() if numpy else ep


def chunk_of(ep, steps=2):
    chunk = ep.cut()
    for i in range(steps):
        chunk.add_env_step(np.full(2, 0.5, np.float32), 1, 1.0,
                           extra_model_outputs={"logp": np.float32(0), "new": 1.0})
    return chunk


def done():
    ep = episode()
    ep.add_env_step(np.zeros(2, np.float32), 0, 0.0, terminated=True)
    return ep


CASES = {
    "concat_episode of an unrelated episode": (
        episode, lambda ep: ep.concat_episode(episode(id_="other", steps=5))),
    "concat_episode of a chunk of another id": (
        episode, lambda ep: ep.concat_episode(chunk_of(episode(id_="other")))),
    "concat_episode at another t": (
        episode, lambda ep: ep.concat_episode(episode(steps=2, start=3))),
    "concat_episode with another boundary observation": (
        lambda: episode(extras=False), lambda ep: ep.concat_episode(
            SingleAgentEpisode(id_="ep", observations=[np.ones(2, np.float32)] * 2,
                               actions=[0], rewards=[0.0], t_started=3,
                               len_lookback_buffer=0))),
    "concat_episode with new extra model outputs": (
        episode, lambda ep: ep.concat_episode(chunk_of(ep))),
    "concat_episode onto a done episode": (done, lambda ep: ep.concat_episode(episode())),
    "add_env_reset twice": (episode, lambda ep: ep.add_env_reset(np.zeros(2, np.float32))),
    "add_env_reset of a done episode": (
        lambda: SingleAgentEpisode(terminated=True),
        lambda ep: ep.add_env_reset(np.zeros(2, np.float32))),
    "add_env_step after done": (done, lambda ep: ep.add_env_step(np.zeros(2), 0, 0.0)),
    "cut of a done episode": (done, lambda ep: ep.cut()),
    "cut with a negative lookback": (episode, lambda ep: ep.cut(len_lookback_buffer=-1)),
    "set_extra_model_outputs of an unknown key": (
        episode, lambda ep: ep.set_extra_model_outputs(key="nope", new_data=1.0, at_indices=0)),
    "set_observations outside the space": (
        lambda: episode(numpy=True),
        lambda ep: ep.set_observations(new_data=np.full(2, 9.0, np.float32), at_indices=0)),
    "set_actions outside the space, list indices": (
        lambda: episode(numpy=True),
        lambda ep: ep.set_actions(new_data=[1, 7], at_indices=[0, 1])),
    "validate of inconsistent tracks": (
        episode, lambda ep: (ep.actions.append(1), ep.validate())),
    "one-hot of a value beyond the space": (
        lambda: InfiniteLookbackBuffer([5], space=gym.spaces.Discrete(3)),
        lambda buf: buf.get(0, one_hot_discrete=True)),
}

for name, (make, call) in CASES.items():
    target = make()
    state = lambda: episode_state(target) if isinstance(target, SingleAgentEpisode) \
        else target.get_state()
    before = state()
    try:
        call(target)
        outcome = "no exception"
    except AssertionError as e:
        outcome = "AssertionError" if str(e) else "AssertionError without a message"
    except Exception as e:  # noqa: BLE001 - reported to the test
        outcome = f"{type(e).__name__}: {e}"
    if outcome == "AssertionError" and name != "validate of inconsistent tracks":
        try:
            compare(state(), before, name)
        except Mismatch as e:
            outcome = f"changed: {e}"
    print(f"{name}: {outcome}".replace("\n", " "))

broken = SingleAgentEpisode.from_state({**episode().get_state()})
bad = broken.get_state()
bad["rewards"] = {**bad["rewards"], "data": bad["rewards"]["data"][:-1]}
try:
    SingleAgentEpisode.from_state(bad)
    print("from_state with inconsistent lengths: no exception")
except AssertionError:
    print("from_state with inconsistent lengths: AssertionError")
'''


def test_bad_input_raises_under_python_O(tmp_path):
    """Under `python -O` every `assert` disappears; our input checks are
    explicit, so each bad input still raises AssertionError (with a message)
    and leaves the episode unchanged."""
    import subprocess
    import sys

    script = tmp_path / "bad_inputs.py"
    script.write_text(OPTIMIZED_SCRIPT)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [tests_dir] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    out = subprocess.run([sys.executable, "-O", str(script)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "debug False", lines[0]
    results = dict(line.split(": ", 1) for line in lines[1:])
    wrong = {k: v for k, v in results.items() if v != "AssertionError"}
    assert not wrong, wrong
    assert len(results) == 17
