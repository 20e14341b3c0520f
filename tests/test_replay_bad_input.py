"""Wrong arguments, episodes and checkpoints for episode.replay's buffers.

Each is refused with RLlib's exception class where RLlib raises one, with
a clear ValueError/TypeError where RLlib crashes later or takes the
garbage, and leaves the buffer as it was: the same get_state() and the
same random generator state. (RLlib often raises after it changed its
buffer; ours checks first: a pinned difference.) The tests marked rllib
check the classes RLlib itself raises.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from difftools import compare
from replay_tools import multi_agent_stream, numbered_episode, plain_state

from episode import MultiAgentEpisode, SingleAgentEpisode
from episode.replay import (EpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer,
                            MultiAgentPrioritizedEpisodeReplayBuffer,
                            PrioritizedEpisodeReplayBuffer)

SINGLE = [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer]
MULTI = [MultiAgentEpisodeReplayBuffer, MultiAgentPrioritizedEpisodeReplayBuffer]
PRIORITIZED = [PrioritizedEpisodeReplayBuffer, MultiAgentPrioritizedEpisodeReplayBuffer]


def filled(cls, seed: int = 0):
    """A buffer of `cls` with a few episodes in it (the first not done, with
    extra model outputs), a seeded rng and, prioritized, a draw to update."""
    buffer = cls(capacity=100)
    if cls in MULTI:
        for call in multi_agent_stream(seed, (MultiAgentEpisode,), calls=3):
            buffer.add([c[0] for c in call])
    else:
        buffer.add([numbered_episode(0, 3, extras=True),
                    numbered_episode(1, 4, extras=True, terminated=True)])
    buffer.rng = np.random.default_rng(seed)
    if cls is PrioritizedEpisodeReplayBuffer:
        buffer.sample(4)
    elif cls is MultiAgentPrioritizedEpisodeReplayBuffer:
        buffer.sample(4, n_step=1)
    return buffer


def _rng_state(buffer):
    rng = buffer.rng
    return rng.bit_generator.state if isinstance(rng, np.random.Generator) else rng


def refused(buffer, error, call) -> None:
    """call() raises `error` and leaves `buffer` as it was."""
    state, rng = plain_state(buffer.get_state()), _rng_state(buffer)
    with pytest.raises(error):
        call()
    try:
        compare(plain_state(buffer.get_state()), state, "state")
    except AssertionError as mismatch:   # ("ours" is the state after, "RLlib" before)
        raise AssertionError(f"the refused call changed the buffer: {mismatch}") from None
    assert _rng_state(buffer) == rng, "a refused call drew random numbers"


def sample_kwargs(cls) -> dict:
    return dict(sample_episodes=True, n_step=1) if cls is EpisodeReplayBuffer else {}


# -- constructor arguments -------------------------------------------------------------------

# (class, capacity, what RLlib raises; for the plain buffers, which take
# any capacity, ValueError)
CAPACITIES = [
    (EpisodeReplayBuffer, 0, ValueError),
    (EpisodeReplayBuffer, -3, ValueError),
    (MultiAgentEpisodeReplayBuffer, 0, ValueError),
    (PrioritizedEpisodeReplayBuffer, 0, AssertionError),
    (PrioritizedEpisodeReplayBuffer, -3, ValueError),
    (MultiAgentPrioritizedEpisodeReplayBuffer, 0, AssertionError),
    (MultiAgentPrioritizedEpisodeReplayBuffer, -3, ValueError),
]


@pytest.mark.parametrize("cls, capacity, error", CAPACITIES)
def test_a_capacity_that_holds_nothing(cls, capacity, error):
    with pytest.raises(error):
        cls(capacity=capacity)


@pytest.mark.rllib
@pytest.mark.parametrize("name, capacity, error", [
    (cls.__name__, capacity, error) for cls, capacity, error in CAPACITIES
    if cls in PRIORITIZED])
def test_rllib_refuses_those_capacities_with_the_same_class(name, capacity, error):
    replay_buffers = pytest.importorskip("ray.rllib.utils.replay_buffers")
    with pytest.raises(error):
        getattr(replay_buffers, name)(capacity=capacity)


@pytest.mark.parametrize("cls", SINGLE + MULTI)
@pytest.mark.parametrize("capacity", [2.5, "100", None, True])
def test_a_capacity_that_is_not_an_int(cls, capacity):
    # RLlib takes 2.5 (and the plain buffers anything): a pinned difference.
    with pytest.raises(TypeError):
        cls(capacity=capacity)


@pytest.mark.parametrize("cls", PRIORITIZED)
@pytest.mark.parametrize("alpha", [-0.5, float("nan")])
def test_a_negative_alpha(cls, alpha):
    with pytest.raises(AssertionError):
        cls(capacity=10, alpha=alpha)


# -- sample() arguments ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", PRIORITIZED)
@pytest.mark.parametrize("beta", [-0.1, float("nan")])
def test_a_negative_beta(cls, beta):
    buffer = filled(cls)
    refused(buffer, AssertionError, lambda: buffer.sample(4, beta=beta))


N_STEP_ERRORS = [(0, ValueError), (-1, ValueError), ((3, 1), ValueError), ((0, 2), ValueError),
                 ((2, 2), ValueError), ((1, 2, 3), ValueError), (2.0, TypeError),
                 ("2", TypeError), ((1.0, 3), TypeError)]


@pytest.mark.parametrize("n_step, error", N_STEP_ERRORS + [(None, AssertionError)])
def test_a_bad_n_step_of_the_plain_buffer(n_step, error):
    # RLlib: IndexError from an empty n-step slice (0, -1), ValueError from
    # rng.integers for a reversed range, AssertionError for None.
    buffer = filled(EpisodeReplayBuffer)
    refused(buffer, error, lambda: buffer.sample(4, sample_episodes=True, n_step=n_step))


def test_sequences_need_n_step_1():
    buffer = filled(EpisodeReplayBuffer)
    for n_step in (2, (1, 2)):
        refused(buffer, AssertionError, lambda: buffer.sample(
            4, sample_episodes=True, n_step=n_step, batch_length_T=3))


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer] + MULTI)
@pytest.mark.parametrize("n_step, error", N_STEP_ERRORS[1:])
def test_a_bad_n_step_of_the_other_buffers(cls, n_step, error):
    buffer = filled(cls)
    refused(buffer, error, lambda: buffer.sample(4, n_step=n_step))


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer] + MULTI)
@pytest.mark.parametrize("n_step", [0, None])
def test_n_step_0_or_none_is_1(cls, n_step):
    """RLlib's `n_step or 1`: the same draws as n_step=1."""
    views = []
    for n in (n_step, 1):
        buffer = filled(cls)
        buffer.rng = np.random.default_rng(3)
        views.append([(e.get_observations(), e.get_rewards(), values_of(e, "n_step"))
                      for e in buffer.sample(6, n_step=n)])
    compare(views[0], views[1], f"n_step={n_step}")


def values_of(episode, key):
    return np.asarray(episode.get_extra_model_outputs(key)).tolist()


def _discounted(rewards, gamma):
    total = rewards[-1]
    for r in reversed(rewards[:-1]):
        total = r + gamma * total
    return total


@pytest.mark.parametrize("cls", SINGLE)
@pytest.mark.parametrize("gamma", [1.5, -0.5])
def test_a_gamma_outside_0_1_is_used_as_given(cls, gamma):
    """Ours (like RLlib) does not check gamma: the n-step sums use it as it is."""
    buffer = filled(cls)
    for e in buffer.sample(8, gamma=gamma, **(sample_kwargs(cls) | {"n_step": 2})):
        num, t = (int(x) for x in e.get_observations(0))
        end = min(t + 2, 3 if num == 0 else 4)
        assert e.get_rewards() == [_discounted([float(num + s) for s in range(t, end)], gamma)]


@pytest.mark.parametrize("cls", SINGLE + MULTI)
@pytest.mark.parametrize("gamma", ["0.9", None])
def test_a_gamma_that_is_not_a_number(cls, gamma):
    buffer = filled(cls)
    kwargs = sample_kwargs(cls) | {"n_step": 2}
    refused(buffer, (TypeError, ValueError), lambda: buffer.sample(4, gamma=gamma, **kwargs))


@pytest.mark.parametrize("cls", SINGLE + MULTI)
def test_num_items_and_batch_size_b_together(cls):
    buffer = filled(cls)
    refused(buffer, AssertionError,
            lambda: buffer.sample(4, batch_size_B=4, **sample_kwargs(cls)))


@pytest.mark.parametrize("cls, kwargs, error", [
    (EpisodeReplayBuffer, {}, ValueError),
    (EpisodeReplayBuffer, dict(sample_episodes=True, n_step=1), ValueError),
    (EpisodeReplayBuffer, dict(sample_episodes=True, n_step=1, batch_length_T=2), ValueError),
    (PrioritizedEpisodeReplayBuffer, {}, ZeroDivisionError),
    (MultiAgentEpisodeReplayBuffer, {}, ZeroDivisionError),
    (MultiAgentPrioritizedEpisodeReplayBuffer, {}, ZeroDivisionError),
    (MultiAgentEpisodeReplayBuffer, dict(replay_mode="synchronized"), ValueError),
])
def test_sampling_an_empty_buffer(cls, kwargs, error):
    # RLlib's classes: rng.integers(0) or a division by the zero total, with
    # numpy's or Python's words ("high <= 0", "division by zero"); ours say
    # what is wrong in the caller's terms.
    buffer = cls(capacity=10)
    buffer.rng = np.random.default_rng(0)
    refused(buffer, error, lambda: buffer.sample(4, **kwargs))
    with pytest.raises(error, match=r"holds no timesteps yet; add\(\) episodes before"):
        buffer.sample(4, **kwargs)


@pytest.mark.parametrize("cls", SINGLE + MULTI)
@pytest.mark.parametrize("rng", [np.random.RandomState(0), None, 42, np.random.PCG64(0)])
def test_an_rng_that_is_not_a_generator(cls, rng):
    # RLlib: AttributeError (no .integers / .random) on the first draw.
    buffer = filled(cls)
    buffer.rng = rng
    refused(buffer, TypeError, lambda: buffer.sample(4, **sample_kwargs(cls)))


def test_a_min_batch_length_no_episode_reaches():
    # RLlib's loop would never end; ours gives up after a million draws.
    buffer = filled(EpisodeReplayBuffer)
    with pytest.raises(ValueError):
        buffer.sample(2, sample_episodes=True, n_step=1, batch_length_T=3,
                      min_batch_length_T=10)


# Draws that can never succeed: every stored episode is shorter than the
# n-step. RLlib's loops never end (the plain buffer's count even falls, and
# its list grows until memory runs out). Run in a child process with a
# time and a memory limit: ours must raise ValueError.
NEVER_ENDING = {
    "plain": "b = EpisodeReplayBuffer(capacity=50); b.add(numbered_episode(0, 2))\n"
             "b.sample(4, sample_episodes=True, n_step=6)",
    "prioritized": "b = PrioritizedEpisodeReplayBuffer(capacity=50); "
                   "b.add(numbered_episode(0, 2))\nb.sample(4, n_step=5)",
    "multi_agent": "b = MultiAgentEpisodeReplayBuffer(capacity=50)\n"
                   "b.add([c[0] for c in\n"
                   "       multi_agent_stream(0, (MultiAgentEpisode,), calls=1)[0]])\n"
                   "b.sample(4, n_step=20)",
}
CHILD = """
import os, resource, sys
# (No address-space limit under AddressSanitizer: it reserves terabytes of
# shadow memory up front.)
if "libasan" not in os.environ.get("LD_PRELOAD", ""):
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
sys.path.insert(0, {tests!r})
from replay_tools import multi_agent_stream, numbered_episode, plain_state
from episode import MultiAgentEpisode
from episode.replay import *
{code}
"""


def test_draws_that_can_never_succeed_raise():
    children = {}
    for name, code in NEVER_ENDING.items():
        source = CHILD.format(tests=os.path.dirname(os.path.abspath(__file__)),
                              code=textwrap.dedent(code))
        # (From the tests' folder: the checkout's episode/ has no compiled core.)
        children[name] = subprocess.Popen([sys.executable, "-c", source],
                                          cwd=os.path.dirname(os.path.abspath(__file__)),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    problems = []
    for name, child in children.items():
        try:
            _, err = child.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            problems.append(f"{name}: still drawing after 10 s")
            continue
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no error)"]
        if not last[0].startswith("ValueError"):
            problems.append(f"{name}: {last[0]}")
    assert not problems, "\n".join(problems)


# -- episodes that do not fit ------------------------------------------------------------------


def _with(episode, **changes):
    """A copy of the numbered episode `episode` with some of its data replaced."""
    kwargs = dict(id_=episode.id_, observations=episode.get_observations(),
                  actions=episode.get_actions(), rewards=episode.get_rewards(),
                  infos=episode.get_infos(), t_started=episode.t_started,
                  terminated=episode.is_terminated,
                  extra_model_outputs={k: episode.get_extra_model_outputs(k)
                                       for k in episode.extra_model_outputs})
    kwargs.update(changes)
    return SingleAgentEpisode(len_lookback_buffer=0, **kwargs)


NEW = numbered_episode(5, 3, extras=True)   # the stored episodes' layout
UNLIKE = {
    "float64_obs": dict(observations=[np.array([5, t], np.float64) for t in range(4)]),
    "wider_obs": dict(observations=[np.array([5, t, 0], np.float32) for t in range(4)]),
    "dict_obs": dict(observations=[{"a": np.array([5, t], np.float32)} for t in range(4)]),
    "string_obs": dict(observations=[f"s{t}" for t in range(4)]),
    "float_actions": dict(actions=[0.5, 1.5, 2.5]),
    "row_actions": dict(actions=[np.array([1, 2])] * 3),
    "int_rewards": dict(rewards=[1, 2, 3]),
    "row_logp": dict(extra_model_outputs={"logp": [np.zeros(2)] * 3}),
}


@pytest.mark.parametrize("cls", SINGLE)
@pytest.mark.parametrize("unlike", list(UNLIKE))
def test_an_episode_unlike_the_stored_ones(cls, unlike):
    """Data of another dtype, shape or structure than the stored episodes'
    (RLlib stores anything: a pinned difference): nothing of the call is
    stored, the good episodes around it neither."""
    buffer = filled(cls)
    bad = _with(NEW, **UNLIKE[unlike])
    refused(buffer, ValueError, lambda: buffer.add(
        [numbered_episode(6, 2, extras=True), bad, numbered_episode(7, 2, extras=True)]))


def _chunk_of(num: int, t0: int, **changes):
    """The next chunk (2 steps from t0) of stored episode `num`."""
    return _with(numbered_episode(num, 2, t0=t0, extras=True), **changes)


NOT_CONTINUING = {
    "gap": lambda: _chunk_of(0, 4, observations=[np.array([0, t], np.float32)
                                                 for t in (3, 4, 5)]),
    "first_obs_differs": lambda: _chunk_of(
        0, 3, observations=[np.array([9, 9], np.float32)] + [np.array([0, t], np.float32)
                                                             for t in (4, 5)]),
    "no_logp": lambda: _chunk_of(0, 3, extra_model_outputs={}),
    "another_output": lambda: _chunk_of(0, 3, extra_model_outputs={"logp": [0.0, 0.0],
                                                                   "vf": [1.0, 1.0]}),
    "after_its_end": lambda: _chunk_of(1, 4),
}


@pytest.mark.parametrize("cls", SINGLE)
@pytest.mark.parametrize("case", list(NOT_CONTINUING))
def test_a_chunk_that_does_not_continue_its_episode(cls, case):
    """What RLlib's concat_episode asserts (AssertionError, after RLlib
    changed its counters and indices; ours before anything changes)."""
    buffer = filled(cls)
    refused(buffer, AssertionError, lambda: buffer.add(
        [numbered_episode(6, 2, extras=True), NOT_CONTINUING[case](),
         numbered_episode(7, 2, extras=True)]))


@pytest.mark.parametrize("cls", SINGLE)
def test_a_chunk_that_does_not_continue_one_of_the_same_call(cls):
    buffer = filled(cls)
    refused(buffer, AssertionError, lambda: buffer.add(
        [numbered_episode(6, 2, extras=True), numbered_episode(6, 2, t0=3, extras=True)]))


@pytest.mark.rllib
@pytest.mark.parametrize("case", list(NOT_CONTINUING))
def test_rllib_asserts_on_those_chunks(case):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as TheirEpisode
    from ray.rllib.utils.replay_buffers import EpisodeReplayBuffer as Theirs

    theirs = Theirs(capacity=100)
    theirs.add([TheirEpisode.from_state(e.get_state()) for e in
                (numbered_episode(0, 3, extras=True),
                 numbered_episode(1, 4, extras=True, terminated=True))])
    with pytest.raises(AssertionError):
        theirs.add(TheirEpisode.from_state(NOT_CONTINUING[case]().get_state()))


@pytest.mark.parametrize("cls", SINGLE + MULTI)
@pytest.mark.parametrize("junk", ["episode", None, {"id_": "x"}, [numbered_episode(6, 2), 3]])
def test_adding_what_is_not_an_episode(cls, junk):
    buffer = filled(cls)
    refused(buffer, TypeError, lambda: buffer.add(junk))


@pytest.mark.parametrize("cls", SINGLE)
@pytest.mark.parametrize("rewards", [["x", "y", "z"], [None] * 3, [1j, 2j, 3j]])
def test_rewards_that_are_not_real_numbers(cls, rewards):
    """Refused (when added, or when n-step sums need them) with TypeError or
    ValueError: never an interpreter-level SystemError."""
    buffer = cls(capacity=20)
    episode = _with(numbered_episode(0, 3), rewards=rewards)
    try:
        buffer.add(episode)
        buffer.rng = np.random.default_rng(0)
        buffer.sample(4, **(sample_kwargs(cls) | {"n_step": 2}))
    except (TypeError, ValueError):
        pass


def test_a_storage_folder_that_does_not_exist(tmp_path):
    """Made (with its parents) when the buffer is made; a path that is a
    file is refused then."""
    folder = tmp_path / "missing" / "blocks"
    buffer = EpisodeReplayBuffer(capacity=20, storage=folder)
    assert folder.is_dir()
    buffer.add(numbered_episode(0, 3))
    assert buffer.get_num_timesteps() == 3
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(OSError):
        EpisodeReplayBuffer(capacity=20, storage=tmp_path / "file")


# -- update_priorities ---------------------------------------------------------------------


def _update(buffer, priorities):
    if isinstance(buffer, MultiAgentPrioritizedEpisodeReplayBuffer):
        return buffer.update_priorities(priorities, "m0")
    return buffer.update_priorities(priorities)


def _drawn(buffer) -> int:
    if isinstance(buffer, MultiAgentPrioritizedEpisodeReplayBuffer):
        return len(buffer._module_to_last_sampled_indices["m0"])
    return len(buffer._last_sampled_indices)


@pytest.mark.parametrize("cls", PRIORITIZED)
@pytest.mark.parametrize("delta", [-1, 1, "all"])
def test_priorities_of_the_wrong_number(cls, delta):
    buffer = filled(cls)
    k = 0 if delta == "all" else _drawn(buffer) + delta
    refused(buffer, AssertionError, lambda: _update(buffer, np.ones(k)))


@pytest.mark.parametrize("cls", PRIORITIZED)
@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_priorities_that_are_not_a_priority(cls, bad):
    # RLlib clamps a negative one to 1e-12 and stores NaN or inf, after which
    # its draws fail: pinned differences.
    buffer = filled(cls)
    priorities = np.ones(_drawn(buffer))
    priorities[-1] = bad
    refused(buffer, ValueError, lambda: _update(buffer, priorities))


@pytest.mark.parametrize("cls", PRIORITIZED)
@pytest.mark.parametrize("odd", [np.float16(2.0), np.longdouble(2.0), 2**2000, "2"],
                         ids=["float16", "longdouble", "2**2000", "str"])
def test_a_priority_of_another_type_last(cls, odd):
    """A list of priorities whose last one is of a type the trees do not
    take: all of them are set, or none (the buffer as it was)."""
    buffer = filled(cls)
    priorities = [0.5] * (_drawn(buffer) - 1) + [odd]
    try:
        refused(buffer, (TypeError, ValueError, OverflowError),
                lambda: _update(buffer, priorities))
    except pytest.fail.Exception:
        # Taken: every priority was set.
        assert _drawn(buffer) == 0


@pytest.mark.parametrize("cls", PRIORITIZED)
@pytest.mark.parametrize("shape", ["torch", "column", "list_of_rows", "int_array"])
def test_priorities_as_any_array_of_b_numbers(cls, shape):
    """update_priorities() takes B numbers in any array-like: the trees end
    as the (B,) float32 (float64 for ints) array of the same numbers leaves
    them."""
    values = np.array([3.0, 1.0, 2.0, 5.0, 4.0, 6.0, 7.0, 8.0][:_drawn(filled(cls))], np.float32)
    if shape == "torch":
        torch = pytest.importorskip("torch")
        given = torch.from_numpy(values.copy())
    elif shape == "column":
        given = values[:, None]
    elif shape == "list_of_rows":
        given = [[float(v)] for v in values]
    else:
        given = values.astype(np.int64)
    plain = values.astype(np.float64) if shape in ("list_of_rows", "int_array") else values
    expected, got = filled(cls), filled(cls)
    _update(expected, plain)
    _update(got, given)
    for key in ("_sum_segment", "_min_segment", "_max_priority", "_module_to_sum_segment",
                "_module_to_min_segment", "_module_to_max_priority"):
        if key in expected.get_state():
            compare(plain_state(got.get_state()[key]), plain_state(expected.get_state()[key]),
                    key)
    assert _drawn(got) == 0


@pytest.mark.parametrize("shape", [(2, 2), (4, 1, 1), ()])
def test_priorities_that_are_no_b_numbers(shape):
    buffer = filled(PrioritizedEpisodeReplayBuffer)
    refused(buffer, ValueError, lambda: _update(buffer, np.ones(shape)))


def _sampled_batch(seed=0):
    buffer = PrioritizedEpisodeReplayBuffer(capacity=100)
    buffer.add([numbered_episode(0, 5), numbered_episode(1, 6, terminated=True)])
    buffer.rng = np.random.default_rng(seed)
    return buffer, buffer.sample_batch(4)


def test_indices_the_buffer_never_handed_out():
    """update_priorities(indices=...) refuses (ValueError, nothing changed)
    indices that are not its own sample_batch()'s: another buffer's, a
    buffer's from before its set_state(), or numbers made up."""
    buffer, batch = _sampled_batch()
    other, other_batch = _sampled_batch()
    for indices in (other_batch["indices"], [10**15, -5, 0, 1], [-1] * 4,
                    batch["indices"] + (1 << 20) * 1000, batch["indices"] + 1000):
        refused(buffer, ValueError,
                lambda: buffer.update_priorities(np.ones(4), indices=indices))
    restored = PrioritizedEpisodeReplayBuffer(capacity=100)
    restored.set_state(buffer.get_state())
    refused(restored, ValueError,
            lambda: restored.update_priorities(np.ones(4), indices=batch["indices"]))
    # Its own, in any integer array-like, are taken.
    buffer.update_priorities(np.full(4, 5.0), indices=batch["indices"][:, None].tolist())
    assert buffer._max_priority == 5.0


@pytest.mark.parametrize("indices", [np.array([0.5, 1.0, 2.0, 3.0]), "abcd",
                                     np.zeros((2, 2), np.int64), [2**70] * 4],
                         ids=["floats", "str", "2-d", "huge"])
def test_indices_that_are_no_integers(indices):
    buffer, _ = _sampled_batch()
    refused(buffer, (TypeError, ValueError),
            lambda: buffer.update_priorities(np.ones(4), indices=indices))


def test_a_sample_batch_s_indices_kept_by_the_buffer_are_its_own_copy():
    """update_priorities() after sample_batch() updates the drawn steps even
    where the caller wrote into the batch's `indices`."""
    buffer, batch = _sampled_batch()
    expected, expected_batch = _sampled_batch()
    batch["indices"][:] = 0
    buffer.update_priorities(np.arange(1.0, 5.0))
    expected.update_priorities(np.arange(1.0, 5.0))
    compare(plain_state(buffer.get_state()), plain_state(expected.get_state()), "state")


# -- set_state -------------------------------------------------------------------------------


def _source_state(cls):
    """Another buffer's checkpoint (other episodes), the base of the
    corrupted ones."""
    source = cls(capacity=100)
    source.add([numbered_episode(3, 2, extras=True), numbered_episode(4, 5, extras=True)])
    source.add(numbered_episode(3, 2, t0=2, extras=True))
    if cls is PrioritizedEpisodeReplayBuffer:
        source.rng = np.random.default_rng(1)
        drawn = source.sample(5)
        source.update_priorities(np.linspace(0.5, 2.0, len(drawn)).astype(np.float32))
        source.sample(3)
    return source.get_state()


def _swap_steps(indices):
    out = list(indices)
    out[0], out[1] = out[1], out[0]
    return out


def _free_taken(state):
    # The first free leaf replaced by a stored step's leaf.
    free = list(state["_free_nodes"])
    free[0] = state["_indices"][0][2]
    return free


def _leaf_set(state, key, value, which=0):
    # Leaf `which` of the stored steps (or a free one) set to `value` in one tree.
    values = list(state[key])
    size = len(values) // 2
    leaf = state["_indices"][which][2] if which is not None else state["_free_nodes"][0]
    values[size + leaf] = value
    return values


DELETE = object()   # a key to delete from the checkpoint

# name -> (classes, error, {key: value, fn(state) or DELETE})
CORRUPT = {
    "episodes_None": (SINGLE, TypeError, {"episodes": None}),
    "an_episode_missing": (SINGLE, ValueError, {"episodes": lambda s: s["episodes"][:-1]}),
    "index_shifted": (SINGLE, ValueError, {
        "episode_id_to_index": lambda s: [(k, v + 1) for k, v in s["episode_id_to_index"]]}),
    "ids_swapped": (SINGLE, ValueError, {
        "episode_id_to_index": lambda s: [(k, v) for (k, _), (_, v) in zip(
            s["episode_id_to_index"][::-1], s["episode_id_to_index"])]}),
    "evicted_negative": (SINGLE, ValueError, {"_num_episodes_evicted": -1}),
    "evicted_str": (SINGLE, TypeError, {"_num_episodes_evicted": "0"}),
    "evicted_float": (SINGLE, TypeError, {"_num_episodes_evicted": 0.0}),
    "timesteps_str": (SINGLE, TypeError, {"_num_timesteps": "7"}),
    "added_float": (SINGLE, TypeError, {"_num_timesteps_added": 7.0}),
    "sampled_None": (SINGLE, TypeError, {"sampled_timesteps": None}),
    "indices_None": (SINGLE, TypeError, {"_indices": None}),
    "a_step_missing": (SINGLE, ValueError, {"_indices": lambda s: s["_indices"][:-1]}),
    "a_step_twice": (SINGLE, ValueError, {
        "_indices": lambda s: s["_indices"] + s["_indices"][-1:]}),
    "steps_swapped": (SINGLE, ValueError, {"_indices": lambda s: _swap_steps(s["_indices"])}),
    "unknown_episode": (SINGLE, ValueError, {
        "_indices": lambda s: [(99,) + tuple(s["_indices"][0][1:])] + s["_indices"][1:]}),
    "short_entry": (SINGLE, ValueError, {
        "_indices": lambda s: [s["_indices"][0][:1]] + s["_indices"][1:]}),
    "sum_tree_short": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_sum_segment": lambda s: s["_sum_segment"][:-1]}),
    "min_tree_tuple": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_min_segment": lambda s: tuple(s["_min_segment"])}),
    "negative_priority": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_sum_segment": lambda s: _leaf_set(s, "_sum_segment", -1.0),
        "_min_segment": lambda s: _leaf_set(s, "_min_segment", -1.0)}),
    "nan_priority": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_sum_segment": lambda s: _leaf_set(s, "_sum_segment", float("nan")),
        "_min_segment": lambda s: _leaf_set(s, "_min_segment", float("nan"))}),
    "str_priority": ([PrioritizedEpisodeReplayBuffer], TypeError, {
        "_sum_segment": lambda s: _leaf_set(s, "_sum_segment", "1.0"),
        "_min_segment": lambda s: _leaf_set(s, "_min_segment", "1.0")}),
    "trees_disagree": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_sum_segment": lambda s: _leaf_set(s, "_sum_segment", 7.0)}),
    "free_leaf_with_priority": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_sum_segment": lambda s: _leaf_set(s, "_sum_segment", 1.0, None),
        "_min_segment": lambda s: _leaf_set(s, "_min_segment", 1.0, None)}),
    "free_leaf_taken": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_free_nodes": _free_taken}),
    "free_leaf_missing": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_free_nodes": lambda s: s["_free_nodes"][1:]}),
    "free_leaf_twice": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_free_nodes": lambda s: s["_free_nodes"][:1] + s["_free_nodes"][:-1]}),
    "free_leaf_str": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_free_nodes": lambda s: ["0"] + s["_free_nodes"][1:]}),
    "leaf_out_of_range": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_indices": lambda s: [s["_indices"][0][:2] + (len(s["_sum_segment"]),)]
        + s["_indices"][1:]}),
    "leaf_twice": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_indices": lambda s: [s["_indices"][0]]
        + [s["_indices"][1][:2] + s["_indices"][0][2:]] + s["_indices"][2:]}),
    "mapping_wrong": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_tree_idx_to_sample_idx": lambda s: [(k, v + 1) for k, v in
                                              s["_tree_idx_to_sample_idx"]]}),
    "last_sampled_outside": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_last_sampled_indices": lambda s: [len(s["_sum_segment"])]}),
    "last_sampled_str": ([PrioritizedEpisodeReplayBuffer], ValueError, {
        "_last_sampled_indices": lambda s: ["0"]}),
    "max_idx_str": ([PrioritizedEpisodeReplayBuffer], (TypeError, ValueError),
                    {"_max_idx": "3"}),
    "max_priority_str": ([PrioritizedEpisodeReplayBuffer], (TypeError, ValueError),
                         {"_max_priority": "2.0"}),
    "max_priority_nan": ([PrioritizedEpisodeReplayBuffer], ValueError,
                         {"_max_priority": float("nan")}),
}


def _corrupted(state, changes):
    state = dict(state)
    for k, change in changes.items():
        if change is DELETE:
            del state[k]
        else:
            state[k] = change(state) if callable(change) else change
    return state


@pytest.mark.parametrize("cls", SINGLE)
@pytest.mark.parametrize("name", list(CORRUPT))
def test_a_corrupted_checkpoint(cls, name):
    classes, error, changes = CORRUPT[name]
    if cls not in classes:
        pytest.skip("a key of the prioritized buffer's checkpoint")
    buffer = filled(cls)
    bad = _corrupted(_source_state(cls), changes)
    refused(buffer, error, lambda: buffer.set_state(bad))


@pytest.mark.parametrize("cls", SINGLE + MULTI)
def test_a_checkpoint_missing_a_key(cls):
    buffer = filled(cls)
    source = filled(cls, seed=1)   # (other multi-agent episodes)
    if cls in SINGLE:
        source.add(numbered_episode(8, 2))
    state = source.get_state()
    for key in state:
        bad = _corrupted(state, {key: DELETE})
        refused(buffer, KeyError, lambda: buffer.set_state(bad))


@pytest.mark.parametrize("cls", SINGLE + MULTI)
def test_a_checkpoint_that_is_not_one(cls):
    """set_state() of what is no checkpoint: RLlib's classes (KeyError for
    a dict without its keys, TypeError for what is no dict), the message
    naming what is missing."""
    buffer = filled(cls)
    refused(buffer, KeyError, lambda: buffer.set_state({"foo": 1}))
    with pytest.raises(KeyError, match=rf"{cls.__name__}.set_state\(\) takes what get_state"
                       r".*lacks 'episodes', 'episode_id_to_index'"):
        buffer.set_state({"foo": 1})
    for junk in ([1, 2], "episodes", 3, None):
        refused(buffer, TypeError, lambda: buffer.set_state(junk))


@pytest.mark.parametrize("source, target", [
    (EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer),
    (MultiAgentEpisodeReplayBuffer, MultiAgentPrioritizedEpisodeReplayBuffer),
    (EpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer),
    (MultiAgentEpisodeReplayBuffer, EpisodeReplayBuffer)])
def test_another_kind_of_buffer_s_checkpoint(source, target):
    """A checkpoint of a uniform buffer into a prioritized one (or of a
    single-agent buffer into a multi-agent one): KeyError as RLlib's,
    saying whose checkpoint it is."""
    buffer = filled(target)
    state = filled(source, seed=1).get_state()
    with pytest.raises(KeyError, match=f"it is the checkpoint of a {source.__name__}"):
        buffer.set_state(state)
    refused(buffer, KeyError, lambda: buffer.set_state(state))


@pytest.mark.parametrize("source, target", [
    (PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer),
    (MultiAgentPrioritizedEpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer)])
def test_a_prioritized_checkpoint_into_a_uniform_buffer(source, target):
    """RLlib's uniform buffers load a prioritized buffer's checkpoint (they
    ignore its trees); ours too, after evictions as well: the same episodes
    and steps, drawn from uniformly."""
    filled_source = source(capacity=12)
    if source is PrioritizedEpisodeReplayBuffer:
        for i in range(6):
            filled_source.add(numbered_episode(i, 4))
    else:
        for call in multi_agent_stream(0, (MultiAgentEpisode,), calls=8):
            filled_source.add([c[0] for c in call])
    assert filled_source.get_num_episodes_evicted() > 0
    state = filled_source.get_state()
    buffer = target(capacity=12)
    buffer.set_state(state)
    expected = target(capacity=12)
    expected.set_state(dict(state, _indices=[tuple(i)[:2] for i in state["_indices"]],
                            **({"_module_to_indices": [
                                (m, [tuple(i)[:3] for i in v])
                                for m, v in state["_module_to_indices"]]}
                               if "_module_to_indices" in state else {})))
    compare(plain_state(buffer.get_state()), plain_state(expected.get_state()), "state")
    buffer.rng, expected.rng = np.random.default_rng(0), np.random.default_rng(0)
    kwargs = sample_kwargs(target) if target is EpisodeReplayBuffer else dict(n_step=1)
    assert _observations(buffer.sample(5, **kwargs)) == _observations(expected.sample(5, **kwargs))


def _observations(episodes) -> list:
    return [np.asarray(e.get_observations()).tolist() for e in episodes]


@pytest.mark.parametrize("cls", SINGLE + MULTI)
def test_a_misspelt_constructor_argument_warns(cls):
    """Unknown keyword arguments are ignored, as RLlib's buffers do (RLlib
    passes a replay_buffer_config's other keys); one that is a close match
    of an argument is likely a typo and warned about."""
    import warnings

    with pytest.warns(UserWarning, match="ignores the unknown keyword argument 'capcity'; "
                                         "did you mean 'capacity'"):
        buffer = cls(capcity=10)
    assert buffer.capacity == 10000
    if cls in PRIORITIZED:
        with pytest.warns(UserWarning, match="'alhpa'; did you mean 'alpha'"):
            cls(capacity=10, alhpa=0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls(capacity=10, type="x", beta=0.4, storage_unit="timesteps", replay_sequence_length=1)


@pytest.mark.parametrize("cls", SINGLE + MULTI)
def test_seed_seeds_the_buffer_s_rng(cls):
    """`seed=` gives the buffer's rng that seed: two buffers of one seed
    draw alike (RLlib's buffers take and ignore it)."""
    a, b = cls(capacity=100, seed=7), cls(capacity=100, seed=7)
    assert a.rng.bit_generator.state == np.random.default_rng(7).bit_generator.state
    for buffer in (a, b):
        if cls in MULTI:
            for call in multi_agent_stream(0, (MultiAgentEpisode,), calls=3):
                buffer.add([c[0] for c in call])
        else:
            buffer.add([numbered_episode(0, 5), numbered_episode(1, 6)])
    kwargs = sample_kwargs(cls) if cls is EpisodeReplayBuffer else dict(n_step=1)
    assert _observations(a.sample(6, **kwargs)) == _observations(b.sample(6, **kwargs))
    if cls in SINGLE:
        np.testing.assert_array_equal(a.sample_batch(8)["obs"], b.sample_batch(8)["obs"])


def test_corrupted_checkpoints_cover_the_prioritized_keys():
    """Every key of the prioritized checkpoint is corrupted by some case."""
    keys = {k for _, _, changes in CORRUPT.values() for k in changes}
    assert set(_source_state(PrioritizedEpisodeReplayBuffer)) <= keys, \
        set(_source_state(PrioritizedEpisodeReplayBuffer)) - keys


def test_a_tree_of_the_wrong_size():
    """A checkpoint whose trees are smaller than the buffer's capacity asks
    for (another buffer's) is refused; larger ones (trees that doubled, or
    another capacity's) load, and priorities of free leaves stay skipped."""
    buffer = filled(PrioritizedEpisodeReplayBuffer)
    small = PrioritizedEpisodeReplayBuffer(capacity=2)
    small.add(numbered_episode(3, 2))
    state = small.get_state()
    assert len(state["_sum_segment"]) < len(buffer.get_state()["_sum_segment"])
    refused(buffer, ValueError, lambda: buffer.set_state(state))
    other = PrioritizedEpisodeReplayBuffer(capacity=1000)
    other.add(numbered_episode(3, 4))
    other.rng = np.random.default_rng(0)
    other.sample(3)
    state = other.get_state()
    buffer.set_state(state)
    compare(plain_state(buffer.get_state()), plain_state(state), "loaded")
    buffer.update_priorities(np.full(3, 2.0))
    assert buffer._sum_segment.sum() > 4.0


@pytest.mark.parametrize("track", ["infos", "vf"])
def test_an_episode_whose_track_lacks_steps_is_refused(track):
    # An unpickled episode is not validated: a lookback beyond a track's
    # rows leaves it no steps, and add() read them at lookback + step.
    episode = SingleAgentEpisode()
    episode.add_env_reset(np.zeros(2, np.float32))
    for t in range(3):
        episode.add_env_step(np.full(2, t, np.float32), 1, 1.0, infos={"t": t},
                             extra_model_outputs={"vf": 0.5})
    buffer = episode.infos if track == "infos" else episode.extra_model_outputs["vf"]
    buffer.lookback = 48
    replay = EpisodeReplayBuffer(capacity=100)
    with pytest.raises(ValueError, match="not consistent"):
        replay.add(episode)
    assert replay.get_num_episodes() == 0
