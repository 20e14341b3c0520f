"""VectorEpisodes: a gymnasium vector env's steps into one episode per sub-env.

The reference is the same env run as separate single envs (sub-env k seeded
with seed + k, as SyncVectorEnv seeds them), reset by hand where the vector
env autoresets: every episode must come out with exactly the observations,
actions, rewards and done flags the single env produced, in both autoreset
modes, with and without cut() chunks in between.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from episode import SingleAgentEpisode
from episode._vector import PendingRows
from episode.sampling import VectorEpisodes, sub_env_infos

MODES = {"NextStep": gym.vector.AutoresetMode.NEXT_STEP,
         "SameStep": gym.vector.AutoresetMode.SAME_STEP}


def _reference(env_id, n, seed, actions, mode):
    """Each sub-env's episodes as (observations, actions, rewards, terminated,
    truncated) lists, stepping single envs with the vector env's actions."""
    envs = [gym.make(env_id) for _ in range(n)]
    episodes = [[] for _ in range(n)]
    resetting = [False] * n
    for k, env in enumerate(envs):
        obs, _ = env.reset(seed=seed + k)
        episodes[k].append([[obs], [], [], False, False])
    for batch in actions:
        for k, env in enumerate(envs):
            if resetting[k]:
                obs, _ = env.reset()
                episodes[k].append([[obs], [], [], False, False])
                resetting[k] = False
                continue
            obs, reward, terminated, truncated, _ = env.step(batch[k])
            current = episodes[k][-1]
            current[0].append(obs)
            current[1].append(batch[k])
            current[2].append(reward)
            current[3], current[4] = terminated, truncated
            if terminated or truncated:
                if mode == "SameStep":
                    obs, _ = env.reset()
                    episodes[k].append([[obs], [], [], False, False])
                else:
                    resetting[k] = True
    return episodes


def _run(env_id, n, seed, steps, mode, cut_every=0):
    env = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    vec = VectorEpisodes.for_env(env)
    obs, infos = env.reset(seed=seed)
    vec.add_reset(obs, infos)
    env.action_space.seed(seed)
    chunks = {}          # episode id -> its chunks, in order
    order = [[] for _ in range(n)]

    def keep(k, episode):
        if episode.id_ not in chunks:
            chunks[episode.id_] = []
            order[k].append(episode.id_)
        chunks[episode.id_].append(episode)

    actions = []
    for t in range(steps):
        batch = env.action_space.sample()
        actions.append(batch)
        before = list(vec.episodes)
        obs, rewards, terminateds, truncateds, infos = env.step(batch)
        done = vec.add_step(obs, batch, rewards, terminateds, truncateds, infos)
        for k, episode in enumerate(before):
            if vec.episodes[k] is not episode:
                keep(k, episode)
        assert all(d in before for d in done)
        if cut_every and (t + 1) % cut_every == 0:
            running = list(vec.episodes)
            for chunk in vec.cut():
                keep(running.index(chunk), chunk)
    for k, episode in enumerate(vec.episodes):
        keep(k, episode)
    env.close()
    # Each episode: its chunks concatenated.
    result = []
    for k in range(n):
        episodes = []
        for id_ in order[k]:
            first, *rest = chunks[id_]
            whole = SingleAgentEpisode.from_state(first.get_state())
            for successor in rest:
                whole.concat_episode(successor)
            episodes.append(whole)
        result.append(episodes)
    return result, actions


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("cut_every", [0, 5])
@pytest.mark.parametrize("env_id, n", [("CartPole-v1", 4), ("Pendulum-v1", 3)])
def test_every_step_lands_once_in_its_episode(env_id, n, mode, cut_every):
    steps = 150 if env_id == "CartPole-v1" else 420      # Pendulum truncates at 200
    ours, actions = _run(env_id, n, 7, steps, mode, cut_every)
    reference = _reference(env_id, n, 7, actions, mode)
    for k in range(n):
        # (A NextStep sub-env waiting for its reset has no next episode yet.)
        want = [e for e in reference[k] if e[1] or e is reference[k][-1]]
        got = ours[k]
        assert len(got) == len(want)
        for episode, (obs, acts, rewards, terminated, truncated) in zip(got, want):
            assert len(episode) == len(acts)
            assert all(np.array_equal(a, b) for a, b in zip(episode.get_observations(), obs))
            assert all(np.array_equal(a, b) for a, b in zip(episode.get_actions(), acts))
            assert np.allclose(episode.get_rewards(), rewards)
            assert (bool(episode.is_terminated), bool(episode.is_truncated)) == \
                (bool(terminated), bool(truncated))
    assert sum(e.is_done for episodes in ours for e in episodes) >= n


def test_sub_env_infos_reads_the_vector_info_dict():
    infos = {"a": np.array([1, 2, 3]), "_a": np.array([True, False, True]),
             "final_info": {"x": np.array([0, 5, 0]), "_x": np.array([False, True, False])}}
    assert sub_env_infos(infos, 0) == {"a": 1, "final_info": {}}
    assert sub_env_infos(infos, 1) == {"final_info": {"x": 5}}
    assert sub_env_infos({}, 2) == {} and sub_env_infos(None, 0) == {}


def test_infos_as_a_list_of_dicts_per_sub_env():
    """RLlib's runner hands the infos out as one dict per sub-env (its
    DictInfoToList wrapper): each goes to its sub-env's episode, through
    resets, ends and the block pass alike."""
    vec = VectorEpisodes(2)
    vec.add_reset(np.zeros((2, 1)), [{"r": 0}, {"r": 1}])
    vec.add_step(np.ones((2, 1)), np.array([0, 1]), np.array([1.0, 2.0]),
                 np.array([False, True]), np.array([False, False]), [{"s": 0}, {}])
    assert [ep.get_infos() for ep in vec.episodes] == [[{"r": 0}, {"s": 0}], [{"r": 1}, {}]]
    assert sub_env_infos([{"a": 1}, {"b": 2}], 1) == {"b": 2}
    # Sub-env 1's reset, with its infos.
    vec.add_step(np.full((2, 1), 2.0), np.array([1, 0]), np.array([1.0, 0.0]),
                 np.array([False, False]), np.array([False, False]), [{}, {"new": True}])
    assert vec.episodes[1].get_infos() == [{"new": True}] and len(vec.episodes[0]) == 2


@pytest.mark.parametrize("infos", [[{}], [{}, {}, {}], [{}, "x"]])
def test_bad_infos_lists_raise_before_anything_is_added(infos):
    vec = VectorEpisodes(2)
    with pytest.raises(ValueError, match="one dict per sub-env"):
        vec.add_reset(np.zeros((2, 1)), infos)
    vec.add_reset(np.zeros((2, 1)), [{"a": 0}, {"a": 1}])
    with pytest.raises(ValueError, match="one dict per sub-env"):
        vec.add_step(np.ones((2, 1)), np.array([0, 1]), np.array([1.0, 2.0]),
                     np.array([False, True]), np.array([False, False]), infos)
    assert [len(ep) for ep in vec.episodes] == [0, 0]
    assert [ep.get_infos() for ep in vec.episodes] == [[{"a": 0}], [{"a": 1}]]
    same_step = VectorEpisodes(2, autoreset_mode="SameStep")
    with pytest.raises(ValueError, match="SameStep"):
        same_step.add_reset(np.zeros((2, 1)), [{}, {}])


def test_extra_model_outputs_go_with_each_step():
    vec = VectorEpisodes(2)
    vec.add_reset(np.zeros((2, 3)))
    vec.add_step(np.ones((2, 3)), np.array([0, 1]), np.array([1.0, 2.0]),
                 np.array([False, False]), np.array([False, False]),
                 extra_model_outputs={"vf": np.array([0.5, 0.25])})
    assert [ep.get_extra_model_outputs("vf", -1) for ep in vec.episodes] == [0.5, 0.25]


@pytest.mark.parametrize("kwargs, error", [
    ({"num_envs": 0}, ValueError), ({"num_envs": 2.5}, ValueError),
    ({"num_envs": 2, "autoreset_mode": "Disabled"}, ValueError),
])
def test_bad_construction(kwargs, error):
    with pytest.raises(error):
        VectorEpisodes(**kwargs)


def test_bad_batches_raise_before_anything_is_added():
    vec = VectorEpisodes(2)
    with pytest.raises(RuntimeError):
        vec.add_step(np.zeros((2, 1)), [0, 0], [0.0, 0.0], [False] * 2, [False] * 2)
    vec.add_reset(np.zeros((2, 1)))
    with pytest.raises(ValueError, match="rewards"):
        vec.add_step(np.zeros((2, 1)), [0, 0], [0.0], [False] * 2, [False] * 2)
    with pytest.raises(ValueError, match="observations"):
        vec.add_step(np.zeros((3, 1)), [0, 0], [0.0, 0.0], [False] * 2, [False] * 2)
    assert all(len(ep) == 0 for ep in vec.episodes)
    with pytest.raises(ValueError):
        vec.add_reset(np.zeros((1, 1)))
    assert all(ep.is_reset for ep in vec.episodes)


def test_same_step_without_final_obs_raises_before_anything_is_added():
    vec = VectorEpisodes(2, autoreset_mode="SameStep")
    vec.add_reset(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="final_obs"):
        vec.add_step(np.zeros((2, 2)), [0, 1], [0.0, 1.0], [False, True], [False, False], {})
    assert [len(ep) for ep in vec.episodes] == [0, 0]


class _Counted(VectorEpisodes):
    """VectorEpisodes counting the steps its block pass took."""

    passes = 0

    def _add_rows(self, *args):
        found = super()._add_rows(*args)
        _Counted.passes += found is not None
        return found


class _OneByOne(VectorEpisodes):
    """VectorEpisodes without the block pass: add_env_step per sub-env."""

    def _add_rows(self, *args):
        return None


def _reset_side_by_side(env_id, n, mode, *classes, seed=3):
    """A vector env and one VectorEpisodes of each class, all reset with
    its first observations (the env and its action space seeded)."""
    env = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    vecs = [cls.for_env(env) for cls in classes]
    _Counted.passes = 0
    obs, infos = env.reset(seed=seed)
    env.action_space.seed(seed)
    for vec in vecs:
        vec.add_reset(obs, infos)
    return env, vecs


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("env_id, n", [("CartPole-v1", 5), ("Pendulum-v1", 3),
                                       ("MountainCarContinuous-v0", 2)])
def test_the_compiled_batch_pass_stores_what_add_env_step_stores(env_id, n, mode):
    """The same steps through the compiled pass and through add_env_step per
    sub-env: the same episodes, state for state (types included)."""
    env, (fast, slow) = _reset_side_by_side(env_id, n, mode, _Counted, _OneByOne)
    ended = [[], []]
    for t in range(260):
        actions = env.action_space.sample()
        step = env.step(actions)
        for i, vec in enumerate((fast, slow)):
            ended[i] += vec.add_step(step[0], actions, *step[1:])
        assert _Counted.passes == t + 1  # every step took the compiled pass
        if t % 50 == 49:
            ended[0] += fast.cut()
            ended[1] += slow.cut()
    env.close()
    for a, b in zip(ended[0] + fast.episodes, ended[1] + slow.episodes):
        state_a, state_b = a.get_state(), b.get_state()
        for key in ("id_", "_start_time", "_last_step_time"):
            state_a.pop(key), state_b.pop(key)
        assert repr(state_a) == repr(state_b)
        assert type(a.is_terminated) is type(b.is_terminated)
        assert type(a.get_actions(-1) if len(a) else None) is \
            type(b.get_actions(-1) if len(b) else None)
        assert np.array_equal(a._last_added_observation, b._last_added_observation)


def test_pending_rows_check_their_batches():
    episodes = [SingleAgentEpisode(), SingleAgentEpisode()]
    for e in episodes:
        e.add_env_reset(np.zeros(2))
    ok = dict(observations=np.ones((2, 2)), actions=np.zeros(2, np.int64),
              rewards=np.zeros(2), terminateds=np.zeros(2, bool),
              truncateds=np.zeros(2, bool), resetting=np.zeros(2, bool))
    block = PendingRows(4)
    # Batches the block cannot take: declined, nothing added.
    for name, bad in [("observations", np.ones((3, 2))), ("actions", [0, 1]),
                      ("rewards", np.zeros((4, 2))[:, 0]), ("terminateds", np.zeros(2)),
                      ("truncateds", np.zeros((2, 1), bool)), ("resetting", np.ones(3, bool)),
                      ("observations", np.array([[1, None], [2, 3]], dtype=object))]:
        assert block.add(episodes, **{**ok, name: bad}) is None
    # A SameStep end without its final observation: declined.
    assert block.add(episodes, **{**ok, "terminateds": np.array([False, True])},
                     same_step=True) is None
    block.add([episodes[0], "x"], **ok)
    with pytest.raises(TypeError):
        block.flush_all([episodes[0], "x"])     # raised where the rows are written
    block = PendingRows(4)
    episodes[0] = SingleAgentEpisode()
    episodes[0].add_env_reset(np.zeros(2))
    assert [len(e) for e in episodes] == [0, 0]
    assert block.add(episodes, **ok) == ([], [])
    # Kept in the block until written.
    assert [len(e) for e in episodes] == [0, 0] and block.filled == 1
    block.flush_all(episodes)
    assert [len(e) for e in episodes] == [1, 1] and block.filled == 0
    # Rows of another layout start a new block (the old one written first).
    block.add(episodes, **{**ok, "observations": np.ones((2, 2), np.float32)})
    block.flush_all(episodes)
    assert episodes[0].get_observations(-1).dtype == np.float32
    # Resetting sub-envs get nothing; ends are written before the call returns.
    assert block.add(episodes, **{**ok, "resetting": np.array([True, False]),
                                  "truncateds": np.ones(2, bool)}) == ([0], [1])
    assert [len(e) for e in episodes] == [2, 3] and episodes[1].is_truncated
    # A done episode's rows raise add_env_step's error when written.
    block.add([episodes[1], episodes[1]], **ok)
    with pytest.raises(AssertionError):
        block.flush_all([episodes[1], episodes[1]])
    block = PendingRows(4)
    # Pending rows of two sub-envs cannot go into one episode.
    fresh = [SingleAgentEpisode(), SingleAgentEpisode()]
    for e in fresh:
        e.add_env_reset(np.zeros(2))
    block.add(fresh, **ok)
    with pytest.raises(ValueError, match="pending"):
        block.add(fresh[:1], **{k: v[:1] for k, v in ok.items()})
    block.flush_all(fresh)
    assert [len(e) for e in fresh] == [1, 1]


def test_pending_rows_start_episodes_only_as_asked():
    """add(start=...) starts the NextStep resets' episodes and marks the ends
    as resetting; a malformed `start` raises before anything changes."""
    episodes = [SingleAgentEpisode(), SingleAgentEpisode()]
    for e in episodes:
        e.add_env_reset(np.zeros(2))
    ok = dict(observations=np.ones((2, 2)), actions=np.zeros(2, np.int64),
              rewards=np.zeros(2), terminateds=np.array([False, True]),
              truncateds=np.zeros(2, bool), resetting=np.array([True, False]))
    block = PendingRows(4)
    frozen = np.array([True, False])
    frozen.flags.writeable = False
    before = list(episodes)
    for bad in [dict(start=(SingleAgentEpisode, None)), dict(start=(int, None, None)),
                dict(start=("SingleAgentEpisode", None, None)),
                dict(start=(SingleAgentEpisode, None, None), same_step=True,
                     final_obs_given=True),
                dict(start=(SingleAgentEpisode, None, None), resetting=frozen)]:
        with pytest.raises(ValueError, match="start="):
            block.add(episodes, **{**ok, **bad})
        assert episodes == before and block.filled == 0 and [len(e) for e in episodes] == [0, 0]
    resetting = ok["resetting"].copy()
    assert block.add(episodes, **{**ok, "resetting": resetting},
                     start=(SingleAgentEpisode, None, None)) == ([0], [1])
    assert episodes[0] is not before[0] and episodes[1] is before[1]
    assert list(resetting) == [False, True]
    np.testing.assert_array_equal(episodes[0].get_observations(0), np.ones(2))
    assert len(episodes[0]) == 0 and len(episodes[1]) == 1 and episodes[1].is_terminated


@pytest.mark.parametrize("row, n, capacity", [((4,), 64, 120), ((84, 84, 4), 8, 1),
                                              ((), 2, 128)])
def test_pending_rows_size_their_block_by_its_bytes(row, n, capacity):
    """By default a block holds about 256 KiB of steps (at most 128 steps,
    at least one): Atari frames do not take a block of many megabytes."""
    episodes = [SingleAgentEpisode() for _ in range(n)]
    obs = np.zeros((n,) + row, np.uint8 if len(row) == 3 else np.float32)
    for k, e in enumerate(episodes):
        e.add_env_reset(obs[k])
    block = PendingRows()
    flags = np.zeros(n, bool)
    for _ in range(3):
        block.add(episodes, obs, np.zeros(n, np.int64), np.zeros(n), flags, flags, flags)
    assert block.capacity == capacity
    block.flush_all(episodes)
    assert [len(e) for e in episodes] == [3] * n


def test_pending_rows_are_written_when_the_block_is_full_or_read():
    episodes = [SingleAgentEpisode()]
    episodes[0].add_env_reset(np.zeros(2, np.float32))
    block = PendingRows(3)
    flags = np.zeros(1, bool)
    for i in range(7):
        block.add(episodes, np.full((1, 2), i + 1, np.float32), np.array([i]),
                  np.array([0.5]), flags, flags, flags)
    assert len(episodes[0]) == 6 and block.filled == 1
    block.flush_all(episodes)
    np.testing.assert_array_equal(np.array(episodes[0].get_observations())[:, 0], np.arange(8))
    assert episodes[0].get_actions() == list(range(7))
    vec = VectorEpisodes(1)
    vec.add_reset(np.zeros((1, 2), np.float32))
    vec.add_step(np.ones((1, 2), np.float32), np.array([1]), np.array([1.0]), flags, flags)
    assert len(vec.episodes[0]) == 1         # reading `episodes` writes the block


@pytest.mark.parametrize("obs_dtype", [">f4", "<f8", "O", "U3", "f2"])
@pytest.mark.parametrize("act", [np.array([0, 1], ">i8"), np.array([0.5, 1.5]),
                                 np.array([[0, 1], [1, 0]], np.int8), np.array([True, False])])
def test_block_with_odd_dtypes_stores_what_add_env_step_stores(obs_dtype, act):
    """Garbage and unusual batches (byte-swapped, object, string, half
    floats, row actions, bools): rows the storage cannot take as bytes go
    add_env_step's way; the episodes equal ones stepped by add_env_step."""
    obs = np.array([[1, 2, 3], [4, 5, 6]]).astype(obs_dtype)
    vec = VectorEpisodes(2)
    vec.add_reset(obs)
    slow = [SingleAgentEpisode() for _ in range(2)]
    for k in range(2):
        slow[k].add_env_reset(obs[k])
    for _ in range(3):
        vec.add_step(obs, act, np.array([1.0, 2.0]), np.zeros(2, bool), np.zeros(2, bool))
        for k in range(2):
            slow[k].add_env_step(obs[k], act[k], np.array([1.0, 2.0])[k],
                                 terminated=np.False_, truncated=np.False_)
    for a, b in zip(vec.episodes, slow):
        sa, sb = a.get_state(), b.get_state()
        for key in ("id_", "_start_time", "_last_step_time"):
            sa.pop(key), sb.pop(key)
        assert repr(sa) == repr(sb)


def test_vector_episodes_pickle_with_their_pending_steps():
    import pickle

    vec = VectorEpisodes(2)
    vec.add_reset(np.zeros((2, 3), np.float32))
    flags = np.zeros(2, bool)
    for i in range(5):
        vec.add_step(np.full((2, 3), i + 1, np.float32), np.array([0, 1]), np.ones(2), flags,
                     flags)
    copy = pickle.loads(pickle.dumps(vec))
    assert [len(e) for e in copy.episodes] == [5, 5]
    np.testing.assert_array_equal(copy.episodes[1].get_observations(-1), [5, 5, 5])
    block = PendingRows(4)
    block.add(vec.episodes, np.ones((2, 3), np.float32), np.array([0, 1]), np.ones(2), flags,
              flags, flags)
    with pytest.raises(TypeError, match="flush_all"):
        pickle.dumps(block)
    block.flush_all(vec.episodes)
    assert pickle.loads(pickle.dumps(block)).capacity == 4


def _outputs(rng, n, t):
    """Extra outputs as RLlib's runner hands them over: float32 batches of
    the module (rows and scalars) and weights_seq_no as a list of Python
    ints; and a list of Python floats and bools."""
    return {"action_dist_inputs": rng.standard_normal((n, 2)).astype(np.float32),
            "action_logp": rng.standard_normal(n).astype(np.float32),
            "vf_preds": rng.standard_normal(n).astype(np.float32),
            "weights_seq_no": [t // 7] * n,
            "scale": [float(k) / 3 for k in range(n)],
            "flag": [bool((t + k) % 2) for k in range(n)]}


def _same_episode(a, b):
    """Equal states (ids and times aside), the same Python types of every
    extra output in list mode, and the same arrays after to_numpy()."""
    state_a, state_b = a.get_state(), b.get_state()
    for key in ("id_", "_start_time", "_last_step_time"):
        state_a.pop(key), state_b.pop(key)
    assert repr(state_a) == repr(state_b)
    assert list(a.extra_model_outputs) == list(b.extra_model_outputs)
    for key in b.extra_model_outputs:
        got, want = a.get_extra_model_outputs(key), b.get_extra_model_outputs(key)
        assert type(got) is type(want)
        assert [type(x) for x in got] == [type(x) for x in want]
    a, b = a.to_numpy(), b.to_numpy()
    for key in b.extra_model_outputs:
        got, want = a.get_extra_model_outputs(key), b.get_extra_model_outputs(key)
        assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes())


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("env_id, n", [("CartPole-v1", 5), ("Pendulum-v1", 3)])
def test_the_compiled_batch_pass_takes_extra_outputs(env_id, n, mode):
    """Steps with the module's extra outputs take the compiled pass and
    store what add_env_step per sub-env stores: dtypes, shapes, the Python
    ints of weights_seq_no, dict order, through ends, resets and cuts."""
    env, (fast, slow) = _reset_side_by_side(env_id, n, mode, _Counted, _OneByOne)
    rng = np.random.default_rng(5)
    ended = [[], []]
    for t in range(260):
        actions = env.action_space.sample()
        step = env.step(actions)
        outputs = _outputs(rng, n, t)
        for i, vec in enumerate((fast, slow)):
            ended[i] += vec.add_step(step[0], actions, *step[1:],
                                     extra_model_outputs=dict(outputs))
        assert _Counted.passes == t + 1  # every step took the compiled pass
        if t % 50 == 49:
            ended[0] += fast.cut()
            ended[1] += slow.cut()
    env.close()
    assert len(ended[0]) == len(ended[1]) > n
    for a, b in zip(ended[0] + fast.episodes, ended[1] + slow.episodes):
        _same_episode(a, b)


@pytest.mark.parametrize("bad, error", [
    ({"vf": np.zeros(3, np.float32)}, ValueError),          # another leading length
    ({"vf": np.zeros((1, 2), np.float32)}, ValueError),
    ({"weights_seq_no": [1]}, ValueError),                  # a list of another length
    ({"vf": 0.5}, ValueError),                              # not a batch
    ({"vf": None}, ValueError),
    ({"vf": np.float32(0.5)}, ValueError),
    ({"vf": np.zeros(2, np.float32), "weights_seq_no": "ab"}, None),   # a str of 2 rows
    ({"vf": np.zeros(2, np.float32), "x": [[1, 2], [3]]}, None),      # ragged rows
    ({"vf": np.array([0.5, None], dtype=object)}, None),
    ({"vf": np.zeros((2, 3), np.float32)[:, 1]}, None),      # not contiguous
    ({"weights_seq_no": [np.int64(1), np.int64(2)]}, None),  # numpy scalars in a list
    ({"weights_seq_no": [1, 2**70]}, None),                  # a Python int past int64
    ("vf", AttributeError),                                 # not a dict
    ({"vf": np.zeros(2, np.float32), "weights_seq_no": (1, 2)}, ValueError),  # a tuple
])
def test_bad_extra_outputs_raise_as_add_env_step_does(bad, error):
    """Extra outputs the block cannot take: the same error as the path of
    add_env_step per sub-env, raised before anything is added and with the
    pending steps kept; or, where that path takes them, the same data."""
    fast, slow = _Counted(2), _OneByOne(2)
    flags = np.zeros(2, bool)
    rng = np.random.default_rng(0)
    for vec in (fast, slow):
        vec.add_reset(np.zeros((2, 3), np.float32))
    for t in range(3):
        outputs = _outputs(rng, 2, t)
        for vec in (fast, slow):
            vec.add_step(np.full((2, 3), t, np.float32), np.array([0, 1]), np.ones(2), flags,
                         flags, extra_model_outputs=dict(outputs))
    assert fast._pending.filled == 3
    for vec in (fast, slow):
        if error is None:
            vec.add_step(np.ones((2, 3), np.float32), np.array([1, 0]), np.ones(2), flags,
                         flags, extra_model_outputs=bad)
        else:
            with pytest.raises(error):
                vec.add_step(np.ones((2, 3), np.float32), np.array([1, 0]), np.ones(2),
                             flags, flags, extra_model_outputs=bad)
    for a, b in zip(fast.episodes, slow.episodes):
        assert len(a) == len(b) == (3 if error else 4)
        state_a, state_b = a.get_state(), b.get_state()
        for key in ("id_", "_start_time", "_last_step_time"):
            state_a.pop(key), state_b.pop(key)
        assert repr(state_a) == repr(state_b)


def test_pending_rows_keep_extra_outputs_by_their_keys():
    """A step whose extra outputs have other keys, another key order or
    another row layout starts a new block (the old one written first);
    rows go into episodes whose outputs are stored otherwise as
    add_env_step puts them, with its error where it has one."""
    def episodes():
        out = [SingleAgentEpisode(), SingleAgentEpisode()]
        for e in out:
            e.add_env_reset(np.zeros(2))
        return out

    ok = dict(observations=np.ones((2, 2)), actions=np.zeros(2, np.int64),
              rewards=np.zeros(2), terminateds=np.zeros(2, bool),
              truncateds=np.zeros(2, bool), resetting=np.zeros(2, bool))
    fast, slow = episodes(), episodes()
    block = PendingRows(8)
    steps = [{"a": np.array([1.0, 2.0], np.float32), "b": [1, 2]},
             {"a": np.array([3.0, 4.0], np.float32), "b": [3, 4]},
             {"b": [5, 6], "a": np.array([5.0, 6.0], np.float32)},      # another order
             {"b": [7, 8], "a": np.array([7.0, 8.0])},                  # float64 rows
             {"b": [9, 10]},                                            # a key less
             {"b": [1.5, True], "c": np.zeros((2, 2), np.int8)}]         # new kinds
    for i, outputs in enumerate(steps):
        assert block.add(fast, **ok, extra_model_outputs=outputs) == ([], [])
        assert block.filled == (2 if i == 1 else 1)
        for k in range(2):
            slow[k].add_env_step(ok["observations"][k], ok["actions"][k], ok["rewards"][k],
                                 terminated=np.False_, truncated=np.False_,
                                 extra_model_outputs={key: v[k] for key, v in outputs.items()})
    block.flush_all(fast)
    for a, b in zip(fast, slow):
        state_a, state_b = a.get_state(), b.get_state()
        for key in ("id_", "_start_time", "_last_step_time"):
            state_a.pop(key), state_b.pop(key)
        assert repr(state_a) == repr(state_b)
        types = [type(x) for x in a.get_extra_model_outputs("b")]
        assert types == [type(x) for x in b.get_extra_model_outputs("b")]
        assert types[:5] == [int] * 5
    # A numpy'ized episode takes its rows as add_env_step gives them.
    fast, slow = episodes(), episodes()
    for i in range(2):
        outputs = {"b": [i, 2], "c": np.full((2, 2), i, np.int8)}
        block.add(fast, **ok, extra_model_outputs=outputs)
        block.flush_all(fast)
        for k in range(2):
            slow[k].add_env_step(ok["observations"][k], ok["actions"][k], ok["rewards"][k],
                                 terminated=np.False_, truncated=np.False_,
                                 extra_model_outputs={key: v[k] for key, v in outputs.items()})
        if i == 0:
            fast = [e.to_numpy() for e in fast]
            slow = [e.to_numpy() for e in slow]
    for a, b in zip(fast, slow):
        for key in ("b", "c"):
            got, want = a.get_extra_model_outputs(key), b.get_extra_model_outputs(key)
            assert (got.dtype, got.shape, got.tobytes()) == \
                (want.dtype, want.shape, want.tobytes())
    # Something other than a buffer under a key: add_env_step's TypeError.
    fresh = episodes()
    fresh[1].extra_model_outputs["b"] = "not a buffer"
    block.add(fresh, **ok, extra_model_outputs={"b": [2, 3]})
    with pytest.raises(TypeError):
        block.flush_all(fresh)
    assert len(fresh[1]) == 0


def test_extra_outputs_with_an_eq_that_changes_them():
    """A key whose == empties the caller's dict and lists while the block
    compares it: the block keeps what it checked (no crash, no stray
    memory)."""
    class Key(str):
        def __eq__(self, other):
            outputs.clear()
            batch.clear()
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    episodes = [SingleAgentEpisode(), SingleAgentEpisode()]
    for e in episodes:
        e.add_env_reset(np.zeros(2))
    flags = np.zeros(2, bool)
    block = PendingRows(4)
    block.add(episodes, np.ones((2, 2)), np.zeros(2, np.int64), np.zeros(2), flags, flags,
              flags, extra_model_outputs={"w": [1, 2]})
    batch = [3, 4]
    outputs = {Key("w"): batch}
    block.add(episodes, np.ones((2, 2)), np.zeros(2, np.int64), np.zeros(2), flags, flags,
              flags, extra_model_outputs=outputs)
    block.flush_all(episodes)
    assert [e.get_extra_model_outputs("w") for e in episodes] == [[1, 3], [2, 4]]


@pytest.mark.parametrize("capacity", [None, 3])
@pytest.mark.parametrize("env_id, n", [("CartPole-v1", 5), ("Pendulum-v1", 3)])
def test_record_step_hands_on_what_add_step_returns(env_id, n, capacity):
    """record_step() + take_ended(): the episodes add_step() returns, in its
    order and with their sub-envs, state for state (extra outputs too);
    also across full blocks, cuts, and steps the block cannot take (infos
    with content) in between."""
    env, (deferred, slow) = _reset_side_by_side(env_id, n, "NextStep", VectorEpisodes,
                                                _OneByOne, seed=4)
    if capacity:
        deferred._pending = PendingRows(capacity)
    rng = np.random.default_rng(1)
    got, want, got_envs, want_envs = [], [], [], []
    for t in range(300):
        actions = env.action_space.sample()
        obs, rewards, terminateds, truncateds, infos = env.step(actions)
        if t % 37 == 5:
            infos = [{"t": t}] + [{}] * (n - 1)        # the general path
        outputs = _outputs(rng, n, t)
        steps = deferred.record_step(obs, actions, rewards, terminateds, truncateds, infos,
                                     extra_model_outputs=dict(outputs))
        ended = slow.add_step(obs, actions, rewards, terminateds, truncateds, infos,
                              extra_model_outputs=dict(outputs))
        assert steps == slow.steps_added == deferred.steps_added
        want += ended
        want_envs += slow.ended_envs
        if t % 23 == 22:
            done, envs = deferred.take_ended()
            got += done
            got_envs += envs
        if t % 60 == 59:
            got += deferred.cut()
            want += slow.cut()
    done, envs = deferred.take_ended()
    got, got_envs = got + done, got_envs + envs
    env.close()
    assert deferred.take_ended() == ([], [])
    assert len(want) > 2 * n
    assert got_envs == want_envs
    # (In the same order: each pair is the same episode.)
    got_done = [e for e in got if e.is_done]
    want_done = [e for e in want if e.is_done]
    assert [len(e) for e in got_done] == [len(e) for e in want_done]
    for a, b in zip(got_done, want_done):
        _same_episode(a, b)
    for a, b in zip(deferred.episodes, slow.episodes):
        assert len(a) == len(b)
        if len(b):                          # (empty chunks' outputs stay lists)
            _same_episode(a, b)


def test_a_deferred_block_starts_and_ends_episodes_when_read():
    """After record_step(), an ended episode is still its sub-env's and the
    reset makes no episode until the rows are read; then they are written
    as add_step writes them."""
    vec = VectorEpisodes(2)
    vec.add_reset(np.zeros((2, 3), np.float32))
    first = list(vec._episodes)
    flags = np.zeros(2, bool)
    vec.record_step(np.ones((2, 3), np.float32), np.array([0, 1]), np.ones(2),
                    np.array([True, False]), flags)
    assert vec.steps_added == 2 and vec.ended_envs == [0] and list(vec._resetting) == [True,
                                                                                         False]
    assert vec._pending.filled == 1 and vec._episodes == first and len(first[0]) == 0
    vec.record_step(np.full((2, 3), 2, np.float32), np.array([0, 1]), np.ones(2), flags, flags)
    assert vec.steps_added == 1 and vec._episodes[0] is first[0]      # the reset: no step
    episodes = vec.episodes
    assert episodes[0] is not first[0] and episodes[1] is first[1]
    assert len(first[0]) == 1 and first[0].is_terminated and len(first[1]) == 2
    np.testing.assert_array_equal(episodes[0].get_observations(0), [2, 2, 2])
    assert len(episodes[0]) == 0
    done, envs = vec.take_ended()
    assert done == [first[0]] and envs == [0]


def test_ended_episodes_waiting_in_a_pickle():
    import pickle

    vec = VectorEpisodes(2)
    vec.add_reset(np.zeros((2, 3), np.float32))
    flags = np.zeros(2, bool)
    vec.record_step(np.ones((2, 3), np.float32), np.array([0, 1]), np.ones(2), flags,
                    np.array([False, True]))
    copy = pickle.loads(pickle.dumps(vec))
    done, envs = copy.take_ended()
    assert envs == [1] and len(done) == 1 and done[0].is_truncated and len(done[0]) == 1
    assert done[0].id_ == vec.take_ended()[0][0].id_
    block = PendingRows()
    for bad in [None, [(0,)], [("0", done[0])], [(-1, done[0])], [(0, "episode")], ((0, done[0]),)]:
        with pytest.raises(ValueError, match="PendingRows state"):
            block.__setstate__(bad)
    with pytest.raises(ValueError, match="defer=True"):
        block.add(done, np.ones((1, 3)), np.zeros(1), np.zeros(1), flags[:1], flags[:1],
                  flags[:1].copy(), defer=True)
    assert block.filled == 0
