"""The multi-agent buffers and the frame-stacked buffers kept in a folder
(`save()`) and opened again (`open()`): every store of a buffer (the env
steps', each module's) and every chunk of frames is a file, mapped at open;
the opened buffer answers as the saved one and as a pickled copy, and goes
on alike; a frame number outside the saved frames, like any damaged or
foreign file, is refused with an error naming it."""
import ast
import copy
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from difftools import compare
from test_replay_kept import _resign
from replay_tools import (chunk_episode, chunked_stream, episode_view, multi_agent_stream,
                         module_of, plain_state, unmapped)
from test_replay_frames import LAYOUTS, stacked_stream

from episode import MultiAgentEpisode, SingleAgentEpisode
from episode._keep import frame_pools
from episode.replay import (EpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer,
                            MultiAgentPrioritizedEpisodeReplayBuffer,
                            PrioritizedEpisodeReplayBuffer)
from episode.replay import kept

MA_KINDS = [MultiAgentEpisodeReplayBuffer, MultiAgentPrioritizedEpisodeReplayBuffer]
SA_KINDS = [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer]
TESTS = os.path.dirname(os.path.abspath(__file__))
# Small frames in the two layouts: RLlib's Atari FrameStack (84x84x4-like,
# the last axis) and gymnasium's FrameStackObservation (the first axis).
FRAME_LAYOUTS = {"last_axis": ((12, 10, 1), np.uint8, 4, -1),
                 "first_axis": ((12, 10), np.uint8, 4, 0)}


def _same(a, b, where="state"):
    compare(unmapped(plain_state(b)), unmapped(plain_state(a)), where)


def _prioritized(buffer) -> bool:
    return isinstance(buffer, PrioritizedEpisodeReplayBuffer)


# -- multi-agent episodes ---------------------------------------------------------------


def _stack(frames, axis):
    return np.stack(frames, axis=0) if axis == 0 else np.concatenate(frames, axis=axis)


def _ma_frames_stream(seed, layout, calls=12, n_envs=2):
    """Per add() call, multi-agent chunks whose agents observe frame stacks
    (agents a0, a1 on module m0, a2 on m1; one or two agents act a step)."""
    shape, dtype, k, axis = FRAME_LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    agents = ("a0", "a1", "a2")

    def observe(stacks, who):
        obs = {}
        for a in who:
            frame = rng.integers(0, 256, shape, dtype=dtype)
            stacks[a] = (stacks.get(a) or [frame] * (k - 1) + [frame])[1:] + [frame]
            obs[a] = _stack(stacks[a], axis)
        return obs

    def start(made):
        episode = MultiAgentEpisode(id_=f"f{seed}_{made}", agent_to_module_mapping_fn=module_of)
        stacks = {}
        obs = observe(stacks, agents)
        episode.add_env_reset(observations=obs)
        for a, agent_episode in episode.agent_episodes.items():
            agent_episode.id_ = f"{episode.id_}_{a}"     # (the same in each stream)
        return dict(episode=episode, stacks=stacks, left=int(rng.integers(3, 14)),
                    acting=set(obs))

    def advance(s):
        for _ in range(int(min(rng.integers(1, 6), s["left"]))):
            s["left"] -= 1
            who = sorted({agents[int(rng.integers(3))], agents[int(rng.integers(3))]})
            obs = observe(s["stacks"], who)
            acting = sorted(s["acting"])
            s["episode"].add_env_step(
                observations=obs, actions={a: int(rng.integers(3)) for a in acting},
                rewards={a: float(np.round(rng.normal(), 2)) for a in acting},
                terminateds={"__all__": s["left"] == 0})
            s["acting"] = set(obs)

    return chunked_stream(calls, n_envs, start, advance)


def _ma_calls(seed, frames=None, calls=12):
    # (The first calls of a seed are the same whatever the number of calls:
    # the later ones go on with the chunks of the episodes it cut.)
    if frames is not None:
        return _ma_frames_stream(seed, frames, calls=calls + 8)
    return [[c[0] for c in call] for call in multi_agent_stream(
        seed, (MultiAgentEpisode,), calls=calls, n_envs=3, turn_based=seed % 2 == 1)]


def _ma_buffer(cls, frames=None, storage=None, capacity=70):
    kwargs = {}
    if frames is not None:
        kwargs = dict(frame_stack=FRAME_LAYOUTS[frames][2],
                      frame_stack_axis=FRAME_LAYOUTS[frames][3])
    return cls(capacity=capacity, seed=3, storage=storage, **kwargs)


def _ma_filled(cls, frames=None, storage=None, seed=2):
    """A multi-agent buffer that has added, evicted, sampled (both ways) and
    (prioritized) updated priorities."""
    buffer = _ma_buffer(cls, frames, storage)
    updates = np.random.default_rng(seed)
    for i, call in enumerate(_ma_calls(seed, frames)):
        buffer.add(call)
        buffer.sample(4, n_step=1 + i % 2)
        if i % 3 == 2:
            buffer.sample_batch(6, n_step=2)
        if _prioritized(buffer):
            for module_id in buffer.get_module_ids():
                drawn = len(buffer._module_to_last_sampled_keys[module_id])
                buffer.update_priorities(updates.random(drawn), module_id)
    assert buffer.get_num_episodes_evicted() > 0
    if _prioritized(buffer):
        buffer.sample(5, n_step=2)              # (a draw left for update_priorities())
    return buffer


def _ma_draws(buffer, seed):
    """Every kind of draw of a multi-agent buffer, in one sequence (with
    the prioritized one's priorities updated between). (Env steps,
    "synchronized", where every agent acts at every step: elsewhere RLlib's
    getters, and ours, fail on an agent without a reward in the window.)"""
    out = []
    updates = np.random.default_rng(seed)
    modules = buffer.get_module_ids()

    def update(n=None):
        # Each module's steps drawn since its last update.
        if _prioritized(buffer):
            for module_id in modules:
                drawn = len(buffer._module_to_last_sampled_keys[module_id])
                buffer.update_priorities(updates.random(drawn), module_id)

    for n_step in (1, 3, (1, 3)):
        out.append([episode_view(e) for e in buffer.sample(
            6, n_step=n_step, include_infos=True, include_extra_model_outputs=True)])
        update(6)
    if not buffer._stacked():
        out.append(buffer.sample(5, n_step=2, replay_mode="synchronized"))
    for kwargs in (dict(n_step=1), dict(n_step=3, gamma=0.9), dict(n_step=(1, 3)),
                   dict(batch_length_T=3, lookback=1)):
        batches = buffer.sample_batch(8, **kwargs)
        for batch in batches.values():
            batch.pop("indices")                # (tagged by their store)
        out.append(batches)
        update(8)
    out.append(buffer.sample_batch(4, modules_to_sample=modules[-1:]))
    out[-1][modules[-1]].pop("indices")
    update()
    return out


def _go_on_alike(buffer, opened, pickled, calls, seed):
    """Each add() of calls into all three, then the same draws from each."""
    for i, call in enumerate(calls):
        for b in (buffer, opened, pickled):
            b.add(call)
        draws = _ma_draws(buffer, seed + i)
        _same(_ma_draws(opened, seed + i), draws, f"draws {i}")
        _same(_ma_draws(pickled, seed + i), draws, f"pickled draws {i}")


def _counters(buffer):
    out = {}
    for module_id in (None,) + tuple(buffer.get_module_ids()):
        for name in ("get_num_episodes", "get_num_episodes_evicted", "get_num_timesteps",
                     "get_sampled_timesteps", "get_added_timesteps"):
            out[(name, module_id)] = getattr(buffer, name)(module_id)
    out["agents"] = (buffer.get_num_agent_timesteps(), buffer.get_added_agent_timesteps(),
                     buffer.get_module_ids())
    return out


def _answers(buffer, metrics=True):
    # (A pickle keeps no metrics: RLlib's checkpoint has none.)
    out = {"state": buffer.get_state(), "counters": _counters(buffer)}
    if metrics:
        out["metrics"] = buffer.get_metrics()
    return out


@pytest.fixture(params=["in the metadata", "apart"])
def objects(request, monkeypatch):
    """Where save() puts the buffer's own state (a multi-agent buffer's
    episodes): in the metadata, or (its arrays over OBJECTS_APART bytes, as
    a buffer of any size has them) in a file of its own."""
    if request.param == "apart":
        monkeypatch.setattr(kept, "OBJECTS_APART", 0)
    return request.param


@pytest.mark.parametrize("cls", MA_KINDS)
@pytest.mark.parametrize("storage", [False, True])
def test_an_opened_multi_agent_buffer_answers_as_the_saved_one(cls, storage, objects,
                                                               tmp_path):
    buffer = _ma_filled(cls, storage=tmp_path / "scratch" if storage else None)
    buffer.save(tmp_path / "kept")
    assert (objects == "apart") == any(n.startswith("objects-")
                                       for n in os.listdir(tmp_path / "kept"))
    pickled = pickle.loads(pickle.dumps(buffer, protocol=5))
    opened = cls.open(tmp_path / "kept")
    assert type(opened) is cls
    # (The modules in their order: the prioritized buffer's is its agents' set's.)
    assert list(opened._modules) == list(buffer._modules)
    assert set(buffer._modules) == {"m0", "m1"}
    _same(_answers(opened), _answers(buffer))
    _same(_answers(pickled, False), _answers(buffer, False))
    # The same rng state: the same draws of every kind.
    draws = _ma_draws(buffer, 1)
    _same(_ma_draws(opened, 1), draws, "draws")
    _same(_ma_draws(pickled, 1), draws, "pickled draws")
    # All three go on alike: adding (evicting), drawing.
    # (First the chunks that go on with episodes it stores: joined to them.)
    _go_on_alike(buffer, opened, pickled, _ma_calls(2, calls=16)[12:] + _ma_calls(8, calls=4),
                 seed=10)
    _same(_answers(opened), _answers(buffer))
    _same(_answers(pickled, False), _answers(buffer, False))


def test_an_opened_buffers_episode_arrays_are_its_own(tmp_path, monkeypatch):
    """A multi-agent buffer opened from a folder holds its stored episodes'
    arrays in memory of its own (decoded from the folder's data, not mapped
    from a pickle's buffers): a write into one taken from `buffer.episodes`
    stays in that buffer, as a write into the saved buffer's stays in it."""
    monkeypatch.setattr(kept, "OBJECTS_APART", 0)       # (as a large buffer has them)
    buffer = _ma_filled(MultiAgentEpisodeReplayBuffer)
    buffer.save(tmp_path / "kept")
    opened = MultiAgentEpisodeReplayBuffer.open(tmp_path / "kept")
    again = MultiAgentEpisodeReplayBuffer.open(tmp_path / "kept")
    agent = next(iter(buffer.episodes[-1].agent_episodes))
    mine = buffer.episodes[-1].agent_episodes[agent].get_rewards()
    theirs = opened.episodes[-1].agent_episodes[agent].get_rewards()
    assert np.array_equal(mine, theirs) and len(theirs)
    before = theirs.copy()
    theirs[0] = 1e9
    assert opened.episodes[-1].agent_episodes[agent].get_rewards()[0] == 1e9
    assert np.array_equal(again.episodes[-1].agent_episodes[agent].get_rewards(), before)
    assert np.array_equal(buffer.episodes[-1].agent_episodes[agent].get_rewards(), before)


def test_an_opened_buffers_episodes_map_new_agents_as_their_chunks_did(tmp_path):
    """The mapping function is not kept (it is code): an opened buffer's
    episodes have the default one and their resolved mapping; an agent that
    first appears in a later chunk of a stored episode goes to the module
    the chunk's own function maps it to, in the opened buffer as in the
    saved one."""
    def chunk(agent_ids, id_=None, first=0.0):
        episode = MultiAgentEpisode(id_=id_, agent_to_module_mapping_fn=module_of)
        episode.add_env_reset(observations={a: first for a in agent_ids})
        for t in range(3):
            episode.add_env_step({a: first + t + 1 for a in agent_ids},
                                 {a: 0 for a in agent_ids}, {a: 1.0 for a in agent_ids})
        return episode

    buffer = MultiAgentEpisodeReplayBuffer(capacity=100)
    first = chunk(["a0"])
    buffer.add([first])
    buffer.save(tmp_path)
    opened = MultiAgentEpisodeReplayBuffer.open(tmp_path)
    assert opened.episodes[0]._agent_to_module_mapping == {"a0": "m0"}
    successor = first.cut()
    successor.add_env_step({"a0": 9.0, "a2": 0.0}, {"a0": 0}, {"a0": 1.0})
    successor.add_env_step({"a0": 10.0, "a2": 1.0}, {"a0": 0, "a2": 1}, {"a0": 1.0, "a2": 2.0})
    for kept_buffer in (buffer, opened):
        kept_buffer.add([copy.deepcopy(successor)])
        assert kept_buffer.episodes[0]._agent_to_module_mapping == {"a0": "m0", "a2": "m1"}
        assert sorted(kept_buffer.get_module_ids()) == ["m0", "m1"]
    _same(opened.get_state(), buffer.get_state())


def test_update_priorities_after_open_uses_the_saved_draws(tmp_path):
    """Each module's last draw (sample()'s, sample_batch()'s) is kept:
    update_priorities(priorities, module_id) lands where it would have."""
    cls = MultiAgentPrioritizedEpisodeReplayBuffer
    buffer = _ma_filled(cls)
    batches = buffer.sample_batch(10, n_step=2, modules_to_sample=["m1"])
    buffer.sample(7, n_step=1, modules_to_sample=["m0"])
    assert len(batches["m1"]["obs"]) == 10
    buffer.save(tmp_path)
    opened = cls.open(tmp_path)
    rng = np.random.default_rng(0)
    for module_id in ("m0", "m1"):
        n = len(buffer._module_to_last_sampled_keys[module_id])
        assert n >= {"m0": 7, "m1": 10}[module_id]
        priorities = rng.random(n) * 5
        buffer.update_priorities(priorities, module_id)
        opened.update_priorities(priorities, module_id)
    _same(opened.get_state(), buffer.get_state())
    assert opened._module_to_max_priority == buffer._module_to_max_priority
    _same(_ma_draws(opened, 3), _ma_draws(buffer, 3))


def test_an_empty_multi_agent_buffer_round_trips(tmp_path):
    for cls in MA_KINDS:
        cls(capacity=50).save(tmp_path / cls.__name__)
        opened = cls.open(tmp_path / cls.__name__)
        _same(opened.get_state(), cls(capacity=50).get_state())
        opened.add(_ma_calls(4, calls=2)[0])
        assert sorted(opened.get_module_ids()) == ["m0", "m1"]


def test_open_gives_the_saved_kind_or_refuses_another(tmp_path):
    _ma_filled(MultiAgentPrioritizedEpisodeReplayBuffer).save(tmp_path / "mp")
    _ma_filled(MultiAgentEpisodeReplayBuffer).save(tmp_path / "m")
    single = PrioritizedEpisodeReplayBuffer(capacity=50)
    single.add(SingleAgentEpisode(observations=[0.0, 1.0], actions=[0], rewards=[1.0]))
    single.save(tmp_path / "p")
    # (A base class opens the kind that was saved.)
    assert type(EpisodeReplayBuffer.open(tmp_path / "mp")) is \
        MultiAgentPrioritizedEpisodeReplayBuffer
    for cls in (MultiAgentEpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer):
        assert type(cls.open(tmp_path / "mp")) is MultiAgentPrioritizedEpisodeReplayBuffer
    for cls, name in ((MultiAgentPrioritizedEpisodeReplayBuffer, "m"),
                      (PrioritizedEpisodeReplayBuffer, "m"),
                      (MultiAgentEpisodeReplayBuffer, "p")):
        with pytest.raises(TypeError, match="holds a"):
            cls.open(tmp_path / name)


def test_a_single_agent_buffer_keeps_the_first_versions_keys(tmp_path):
    """A buffer of one store and whole rows writes the metadata keys of the
    first version of the format (and no file but its rows)."""
    buffer = PrioritizedEpisodeReplayBuffer(capacity=50, seed=0)
    buffer.add(SingleAgentEpisode(observations=[0.0, 1.0, 2.0], actions=[0, 1],
                                  rewards=[1.0, 2.0]))
    buffer.save(tmp_path)
    meta = kept._read_meta(str(tmp_path))
    assert set(meta) == {"kind", "settings", "buffer", "store", "blocks"}
    assert all(name.startswith("rows-") for name in kept._file_names(meta))


# -- frame-stacked buffers ------------------------------------------------------------


def _sa_frames_filled(cls, layout, storage=None, capacity=150):
    shape, dtype, k, axis = LAYOUTS[layout]
    buffer = cls(capacity=capacity, seed=5, storage=storage, frame_stack=k,
                 frame_stack_axis=axis)
    for i, call in enumerate(stacked_stream(3, layout, calls=20)):
        buffer.add([chunk_episode(SingleAgentEpisode, c, numpy=i % 2 == 0, extras=True,
                                  lookback=True) for c in call])
        if _prioritized(buffer):
            buffer.sample(6, n_step=2)
            buffer.update_priorities(np.random.default_rng(i).random(6))
    assert buffer.get_num_episodes_evicted() > 0
    return buffer


def _sa_draws(buffer, seed):
    out = []
    updates = np.random.default_rng(seed)
    prioritized = _prioritized(buffer)
    for n_step in (1, 3, (1, 4)):
        batch = buffer.sample_batch(16, n_step=n_step, include_extra_model_outputs=True)
        batch.pop("indices")
        out.append(batch)
        if prioritized:
            buffer.update_priorities(updates.random(16))
    batch = buffer.sample_batch(8, batch_length_T=4, lookback=2)
    batch.pop("indices")
    out.append(batch)
    kwargs = {} if prioritized else {"sample_episodes": True}
    out.append([episode_view(e, with_id=not prioritized)
                for e in buffer.sample(6, n_step=2, **kwargs)])
    if prioritized:
        buffer.update_priorities(updates.random(6))
    else:
        out.append(buffer.sample(3, batch_length_T=3))
    return out


def _the_frames(buffer):
    # Per store and frame-stacked leaf: the pool's numbering and chunks.
    return [p for _, store in buffer._kept_stores() for p in frame_pools(store) if p]


@pytest.mark.parametrize("cls", SA_KINDS)
@pytest.mark.parametrize("layout", ["last_axis", "first_axis", "last_axis_channels",
                                    "middle_axis_float"])
def test_an_opened_frame_stacked_buffer_answers_as_the_saved_one(cls, layout, tmp_path):
    buffer = _sa_frames_filled(cls, layout)
    buffer.save(tmp_path)
    assert [n for n in os.listdir(tmp_path) if n.startswith("frames-")]
    opened = cls.open(tmp_path)
    assert opened._stacked() == buffer._stacked()
    _same(opened.get_state(), buffer.get_state())
    _same(opened.get_metrics(), buffer.get_metrics())
    assert opened._store.frame_stats() == buffer._store.frame_stats()
    # The full chunks are the folder's files, mapped read-only; the last
    # one, written on, is a copy in the buffer's memory (nothing is written
    # into the folder: it may be one the process cannot write).
    for numbering, chunks in _the_frames(opened):
        partial = numbering["tail"] % len(chunks[0]) != 0
        full = chunks[:-1] if partial else chunks
        assert full and all(isinstance(c, np.memmap) and c.mode == "r"
                            and os.path.dirname(c.filename) == str(tmp_path) for c in full)
        assert not partial or (type(chunks[-1]) is np.ndarray and chunks[-1].flags.writeable)
    _same(_sa_draws(opened, 1), _sa_draws(buffer, 1), "draws")
    for i, call in enumerate(stacked_stream(9, layout, calls=25)):
        for b in (buffer, opened):
            b.add([chunk_episode(SingleAgentEpisode, c, numpy=True, extras=True,
                                 lookback=True) for c in call])
        if i % 5 == 4:
            _same(_sa_draws(opened, i), _sa_draws(buffer, i), f"draws {i}")
    _same(opened.get_state(), buffer.get_state())
    assert opened._store.frame_stats() == buffer._store.frame_stats()
    # (Every chunk it opened with was freed with its episodes.)
    assert not [c for _, chunks in _the_frames(opened) for c in chunks
                if isinstance(c, np.memmap) and c.mode == "r"]


@pytest.mark.parametrize("cls", MA_KINDS)
@pytest.mark.parametrize("layout", list(FRAME_LAYOUTS))
def test_a_frame_stacked_multi_agent_buffer_round_trips(cls, layout, objects, tmp_path):
    buffer = _ma_filled(cls, frames=layout)
    assert all(store.frame_stats() for store in buffer._modules.values())
    buffer.save(tmp_path)
    pickled = pickle.loads(pickle.dumps(buffer, protocol=5))
    opened = cls.open(tmp_path)
    assert {m: s.frame_stats() for m, s in opened._modules.items()} == \
        {m: s.frame_stats() for m, s in buffer._modules.items()}
    _same(_answers(opened), _answers(buffer))
    draws = _ma_draws(buffer, 2)
    _same(_ma_draws(opened, 2), draws, "draws")
    _same(_ma_draws(pickled, 2), draws, "pickled draws")
    _go_on_alike(buffer, opened, pickled,
                 _ma_calls(2, layout, calls=16)[20:] + _ma_frames_stream(4, layout, calls=6),
                 seed=20)
    _same(_answers(opened), _answers(buffer))


def test_a_file_backed_frame_stacked_buffer_round_trips(tmp_path):
    buffer = _sa_frames_filled(PrioritizedEpisodeReplayBuffer, "last_axis",
                               storage=tmp_path / "scratch")
    buffer.save(tmp_path / "kept")
    opened = PrioritizedEpisodeReplayBuffer.open(tmp_path / "kept")
    _same(_sa_draws(opened, 4), _sa_draws(buffer, 4))
    opened._store.release_pages()               # (mapped chunks give their pages back)
    _same(opened.get_state(), buffer.get_state())


def test_add_transition_goes_on_after_open_with_frames(tmp_path):
    """add_transition()'s steps of 3 envs, frame-stacked: its open episodes
    and their frames are kept, and the steps after open join them."""
    rng = np.random.default_rng(0)
    steps = []
    stacks = rng.integers(0, 255, (3, 6, 5, 4), dtype=np.uint8)
    for t in range(80):
        nxt = np.concatenate([stacks[..., 1:], rng.integers(0, 255, (3, 6, 5, 1), np.uint8)],
                             axis=-1)
        term = rng.random(3) < 0.1
        steps.append((stacks, nxt, rng.integers(0, 2, 3), rng.random(3), term,
                      np.zeros(3, bool)))
        stacks = np.where(term[:, None, None, None],
                          rng.integers(0, 255, (3, 6, 5, 4), dtype=np.uint8), nxt)
    for cls in SA_KINDS:
        buffer = cls(capacity=60, seed=0, frame_stack=4, frame_stack_axis=-1)
        for step in steps[:50]:
            buffer.add_transition(*step)
        assert buffer.get_num_episodes_evicted() > 0
        buffer.save(tmp_path / cls.__name__)
        opened = cls.open(tmp_path / cls.__name__)
        for step in steps[50:]:
            for b in (buffer, opened):
                b.add_transition(*step)
        # (The episodes begun after open have ids of their own: uuids.)
        _same(_without_ids(opened.get_state()), _without_ids(buffer.get_state()))
        draws = _sa_draws(buffer, 1)
        _same(_sa_draws(opened, 1)[:4], draws[:4])


def _without_ids(state):
    state = dict(state)
    state["episodes"] = [dict(e, id_=None) for e in state["episodes"]]
    state["episode_id_to_index"] = [i for _, i in state["episode_id_to_index"]]
    return state


def test_a_dataset_in_a_frame_stacked_buffer_round_trips(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("msgpack")
    from episode.offline import read_episodes, write_episodes

    rng = np.random.default_rng(1)
    episodes = []
    for i in range(6):
        frames = rng.integers(0, 255, (40 + 3, 8, 9, 1), dtype=np.uint8)
        obs = [np.concatenate(frames[t:t + 4], axis=-1) for t in range(40)]
        episodes.append(SingleAgentEpisode(id_=f"d{i}", observations=obs,
                                           actions=[int(a) for a in rng.integers(0, 3, 39)],
                                           rewards=[float(r) for r in rng.random(39)],
                                           terminated=True, len_lookback_buffer=0))
    write_episodes(episodes[:3], tmp_path / "a", format="arrow")
    write_episodes(episodes[3:], tmp_path / "b", format="arrow")
    buffer = PrioritizedEpisodeReplayBuffer(capacity=150, seed=2, frame_stack=4,
                                            frame_stack_axis=-1)
    buffer.add_dataset(read_episodes(tmp_path / "a"))
    buffer.add_dataset(read_episodes(tmp_path / "b"))
    assert buffer.get_num_episodes_evicted() > 0
    buffer.save(tmp_path / "kept")
    opened = PrioritizedEpisodeReplayBuffer.open(tmp_path / "kept")
    _same(opened.get_state(), buffer.get_state())
    _same(_sa_draws(opened, 2), _sa_draws(buffer, 2))


class _NoPickle:
    """An object a saved buffer does not keep (not data)."""


def test_a_save_that_fails_leaves_the_folder_as_it_was(tmp_path):
    """An object of the buffer's that is not data (here an episode's
    info): the save raises TypeError naming its type, and the folder holds
    the previous save, none of this one's files."""
    buffer = _ma_filled(MultiAgentEpisodeReplayBuffer)
    buffer.save(tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    episode = buffer.episodes[-1]
    agent = next(iter(episode.agent_episodes.values()))
    agent.infos[-1] = {"bad": _NoPickle()}
    for call in _ma_calls(9, calls=2):
        buffer.add(call)                        # (new blocks: new files to write)
    with pytest.raises(TypeError, match="cannot be saved.*_NoPickle"):
        buffer.save(tmp_path)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


def test_the_modules_rows_are_mapped(tmp_path):
    buffer = _ma_filled(MultiAgentPrioritizedEpisodeReplayBuffer, frames="first_axis")
    buffer.save(tmp_path)
    opened = MultiAgentPrioritizedEpisodeReplayBuffer.open(tmp_path)
    from episode._keep import store_state
    for name, store in opened._kept_stores():
        rows = [data for block in store_state(store)[1] for data in block["leaves"]
                if type(data) is tuple]
        assert rows, name
        for memory, mapped in rows:
            assert isinstance(mapped, np.memmap) and mapped.mode == "r", name
            assert os.path.dirname(mapped.filename) == str(tmp_path), name


def _files(folder, prefix):
    return {n: os.stat(os.path.join(folder, n)).st_ino for n in os.listdir(folder)
            if n.startswith(prefix)}


@pytest.mark.parametrize("frames", [None, "last_axis"])
def test_saving_into_the_opened_folder_reuses_its_files(frames, objects, tmp_path):
    buffer = _ma_filled(MultiAgentPrioritizedEpisodeReplayBuffer, frames=frames)
    buffer.save(tmp_path)
    before = {p: _files(tmp_path, p) for p in ("rows-", "frames-")}
    pools = len(_the_frames(buffer))
    opened = MultiAgentPrioritizedEpisodeReplayBuffer.open(tmp_path)
    opened.save(tmp_path)
    # Nothing new: every file referenced again, but for each pool's last
    # chunk where frames go on into it (the opened buffer's own copy).
    assert _files(tmp_path, "rows-") == before["rows-"]
    again = _files(tmp_path, "frames-")
    assert len(again) == len(before["frames-"])
    assert all(again[n] == ino for n, ino in before["frames-"].items() if n in again)
    assert 0 <= len(before["frames-"].keys() - again.keys()) <= pools
    for call in _ma_calls(6, frames, calls=4)[:2]:
        opened.add(call)                        # (new blocks and frames; old ones evicted)
    opened.save(tmp_path)
    for prefix in ("rows-",) + (("frames-",) if frames else ()):
        after = _files(tmp_path, prefix)
        kept_files = before[prefix].keys() & after.keys()
        assert kept_files and all(before[prefix][n] == after[n] for n in kept_files), prefix
        assert after.keys() - before[prefix].keys(), prefix
    meta = kept._read_meta(str(tmp_path))
    assert set(_files(tmp_path, "rows-")) | set(_files(tmp_path, "frames-")) | \
        set(_files(tmp_path, "objects-")) == kept._file_names(meta)
    assert len(_files(tmp_path, "objects-")) == (objects == "apart")
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    _same(MultiAgentPrioritizedEpisodeReplayBuffer.open(tmp_path).get_state(),
          opened.get_state())


CHILD = r"""
import sys
import numpy as np
from episode.replay import EpisodeReplayBuffer
buffer = EpisodeReplayBuffer.open(sys.argv[1])
buffer.rng = np.random.default_rng(11)
batches = buffer.sample_batch(32, n_step=2)
print(type(buffer).__name__, buffer.get_num_timesteps(), buffer.get_module_ids(),
      {m: float(b["obs"].astype(np.float64).sum()) for m, b in batches.items()})
"""


@pytest.mark.parametrize("frames", [None, "first_axis"])
def test_a_child_process_opens_the_folder(frames, tmp_path):
    buffer = _ma_filled(MultiAgentPrioritizedEpisodeReplayBuffer, frames=frames)
    buffer.save(tmp_path)
    # (Run in tests/: from the checkout's root the source folder would
    # shadow the installed package.)
    result = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                            text=True, timeout=300, cwd=TESTS)
    assert result.returncode == 0, result.stderr[-3000:]
    buffer.rng = np.random.default_rng(11)
    batches = buffer.sample_batch(32, n_step=2)
    expected = (f"MultiAgentPrioritizedEpisodeReplayBuffer {buffer.get_num_timesteps()} "
                f"{buffer.get_module_ids()} "
                f"{ {m: float(b['obs'].astype(np.float64).sum()) for m, b in batches.items()} }")
    assert result.stdout.strip() == expected


# -- damaged, foreign and missing files -----------------------------------------------


@pytest.fixture(scope="module")
def saved_ma(tmp_path_factory):
    # (The buffer's own state in a file of its own, as a large one's is.)
    folder = tmp_path_factory.mktemp("ma")
    apart, kept.OBJECTS_APART = kept.OBJECTS_APART, 0
    try:
        _ma_filled(MultiAgentPrioritizedEpisodeReplayBuffer, frames="last_axis").save(folder)
    finally:
        kept.OBJECTS_APART = apart
    return folder


@pytest.fixture
def saved(saved_ma, tmp_path):
    # A fresh copy of the saved folder per test (each test damages it).
    for name in os.listdir(saved_ma):
        (tmp_path / name).write_bytes((saved_ma / name).read_bytes())
    return tmp_path


def _a_file(folder, kind):
    """A file of each kind: a module store's block file, the env steps'
    store's, a chunk of frames, a block file of frame numbers."""
    meta = kept._read_meta(str(folder))
    stores = kept._entries(meta)
    if kind == "objects":
        return meta["objects"]["file"][1]
    if kind == "frames":
        return next(p for p in stores[1]["frames"] if p)["chunks"][0][1]
    if kind == "env rows":
        store = stores[0]
    else:
        store = stores[2]
    leaves = store["store"]["layout"]["obs"] if kind == "frame numbers" else \
        store["store"]["layout"]["rewards"]
    return next(b["leaves"][leaves] for b in store["blocks"]
                if type(b["leaves"][leaves]) is tuple)[1]


FILE_KINDS = ["module rows", "env rows", "frames", "frame numbers", "objects"]


@pytest.mark.parametrize("kind", FILE_KINDS)
@pytest.mark.parametrize("change", ["truncated", "overlong", "empty", "missing"])
def test_a_file_of_another_size_or_missing_is_refused_naming_it(saved, kind, change):
    path = saved / _a_file(saved, kind)
    data = path.read_bytes()
    if change == "missing":
        os.unlink(path)
        with pytest.raises(FileNotFoundError) as error:
            MultiAgentPrioritizedEpisodeReplayBuffer.open(saved)
        assert error.value.filename == str(path)
        return
    path.write_bytes({"truncated": data[:-1], "overlong": data + b"\0", "empty": b""}[change])
    with pytest.raises(ValueError, match="truncated|overlong") as error:
        MultiAgentPrioritizedEpisodeReplayBuffer.open(saved)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_a_flipped_byte_in_each_kind_of_file(saved, kind):
    """verify=True finds it; without, a changed number is read as it is, and
    a changed frame number is refused at open (never read)."""
    if kind == "frame numbers":
        path, row = _live_frame_numbers(saved)
        at = row * 8 * 4 + 7                    # (the top byte of the row's first number)
    else:
        path = saved / _a_file(saved, kind)
        at = path.stat().st_size // 2
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC-32") as error:
        MultiAgentPrioritizedEpisodeReplayBuffer.open(saved, verify=True)
    assert str(path) in str(error.value)
    if kind == "frame numbers":
        with pytest.raises(ValueError, match="refer to frame"):
            MultiAgentPrioritizedEpisodeReplayBuffer.open(saved)
        return
    opened = MultiAgentPrioritizedEpisodeReplayBuffer.open(saved)
    opened.get_state()
    opened.sample_batch(64, n_step=3)
    opened.sample(16, n_step=2)


def _live_frame_numbers(folder):
    """(The file, the row) of the frame numbers of module m1's oldest
    stored episode's first row."""
    state = kept._entries(kept._read_meta(str(folder)))[2]["store"]
    run = state["runs"][state["eps"]["first_run"][state["first_slot"]] - state["run_head"]]
    block = kept._entries(kept._read_meta(str(folder)))[2]["blocks"][
        run["block"] - state["first_block"]]
    return folder / block["leaves"][state["layout"]["obs"]][1], int(run["row"])


def _frame_numbers_file(folder, value):
    """Sets a frame number of a stored row (in the file, not the metadata)."""
    path, row = _live_frame_numbers(folder)
    numbers = np.fromfile(path, np.int64)
    numbers[row * 4 + 1] = value
    numbers.tofile(path)


@pytest.mark.parametrize("value", [-1, 10**12, -(2**63), 2**63 - 1])
def test_a_frame_number_outside_the_frames_is_refused_at_open(saved, value):
    _frame_numbers_file(saved, value)
    with pytest.raises(ValueError, match="refer to frame") as error:
        MultiAgentPrioritizedEpisodeReplayBuffer.open(saved)
    assert str(saved / kept.META_NAME) in str(error.value)


def _in_band(folder):
    """The folder's metadata with the buffer's own state in it (unpickled
    from its objects file: the form of a state with small arrays)."""
    meta = kept._read_meta(str(folder))
    meta["buffer"] = kept._objects_from_file(str(folder), "", meta, False)
    meta.pop("objects", None)
    return meta


def _pool(meta, store=1):
    return next(p for p in kept._entries(meta)[store]["frames"] if p)


def _mutations():
    """Changes to the metadata of a saved multi-agent, frame-stacked buffer
    that no buffer could have; each a function of the metadata."""
    def numbering(key, value):
        def change(meta):
            n = _pool(meta)["numbering"]
            n[key] = value(n[key]) if callable(value) else value
        return change

    def final_frame(value):
        def change(meta):
            state = kept._entries(meta)[1]["store"]
            leaf = state["layout"]["obs"]
            state["final"][leaf] = state["final"][leaf].copy()
            state["final"][leaf][state["first_slot"], 0] = value
        return change

    def module_state(key, value):
        def change(meta):
            state = kept._entries(meta)[2]["store"]
            state[key] = value(state[key]) if callable(value) else value
        return change

    def buffer(key, value):
        def change(meta):
            state = meta["buffer"]
            state[key] = value(state[key]) if callable(value) else value
        return change

    def stores(value):
        def change(meta):
            meta["stores"] = value(meta["stores"])
        return change

    def chunks(value):
        def change(meta):
            _pool(meta)["chunks"] = value(_pool(meta)["chunks"])
        return change

    def runs_row(delta):
        def change(meta):
            state = kept._entries(meta)[1]["store"]
            state["runs"] = state["runs"].copy()
            state["runs"]["row"][-1] += delta
        return change

    return {
        "frames: tail past the chunks": numbering("tail", lambda t: t + 10**6),
        "frames: tail before the rows' frames": numbering("tail", lambda t: t - 1),
        "frames: head after the rows' frames": numbering("head", lambda h: h + 10**4),
        "frames: first chunk": numbering("first_chunk", lambda c: c + 1),
        "frames: first chunk negative": numbering("first_chunk", -1),
        "frames: first chunk huge": numbering("first_chunk", 1 << 47),
        "frames: chunk shift": numbering("chunk_shift", lambda s: s + 1),
        "frames: chunk shift huge": numbering("chunk_shift", 63),
        "frames: frame bytes": numbering("frame_bytes", lambda b: b * 2),
        "frames: stack": numbering("stack", 3),
        "frames: stack huge": numbering("stack", 10**6),
        "frames: axis": numbering("axis", 1),
        "frames: axis bad": numbering("axis", 7),
        "frames: a number is a float": numbering("tail", 2.0),
        "frames: a chunk less": chunks(lambda c: c[:-1]),
        "frames: a chunk more": chunks(lambda c: c + c[-1:]),
        "frames: a chunk that is not a file": chunks(lambda c: [("file", "../x", 1, 0)] + c[1:]),
        "frames: final row's frame": final_frame(10**9),
        "frames: final row's frame negative": final_frame(-5),
        "frames: of a leaf that has none": lambda meta: kept._entries(meta)[1]["frames"].reverse()
        if len(kept._entries(meta)[1]["frames"]) > 1 else
        kept._entries(meta)[1]["frames"].append(None),
        "frames: pools not a list": lambda meta: kept._entries(meta)[1].update(frames=7),
        "frames: of a store without frames": lambda meta: meta.update(
            frames=kept._entries(meta)[1]["frames"]),
        "a run past its rows": runs_row(10**6),
        "module store: live steps": module_state("live_steps", lambda s: s + 1),
        "module store: ids": module_state("ids", []),
        "module store: first slot": module_state("first_slot", 10**6),
        "module stores: one missing": stores(lambda s: s[:1]),
        "module stores: a store's name": stores(lambda s: [dict(s[0], name="m0")] + s[1:]),
        "module stores: two of one name": stores(lambda s: [s[0], dict(s[1], name=s[0]["name"])]),
        "module stores: an unhashable name": stores(lambda s: [dict(s[0], name=("module", []))]
                                                    + s[1:]),
        "module stores: not dicts": stores(lambda s: [7]),
        "module stores: swapped": stores(lambda s: [dict(s[0], name=s[1]["name"]),
                                                    dict(s[1], name=s[0]["name"])]),
        "episodes: one missing": buffer("multi_episodes", lambda e: e[1:]),
        "episodes: reversed": buffer("multi_episodes", lambda e: e[::-1]),
        "episodes: not episodes": buffer("multi_episodes", lambda e: [None] * len(e)),
        "counters: a float": buffer("_num_agent_timesteps", 1.5),
        "counters: by module not pairs": buffer("_num_module_timesteps", [1, 2]),
        "counters: a module's not an int": buffer("_num_module_episodes",
                                                  lambda c: [(m, float(v)) for m, v in c]),
        "priorities: a module's max": buffer("_module_to_max_priority",
                                             lambda c: [(m, -1.0) for m, _ in c]),
        "priorities: a module's last leaves": buffer(
            "_module_to_last_sampled_indices", lambda c: [(m, [10**9]) for m, _ in c]),
        "priorities: last leaves of no module": buffer(
            "_module_to_last_sampled_indices", lambda c: [("nobody", [1])]),
        "priorities: a module's last keys": buffer(
            "_module_to_last_sampled_keys", lambda c: [(m, [1 << 60]) for m, _ in c]),
        "priorities: the env steps' max": buffer("_max_priority", float("nan")),
        "rng": buffer("rng", 3),
        "settings: a misspelt one": lambda meta: meta["settings"].update(
            alhpa=meta["settings"].pop("alpha")),
        "settings: one missing": lambda meta: meta["settings"].pop("capacity"),
        "settings: another frame stack": lambda meta: meta["settings"].update(frame_stack=3),
        "settings: a capacity past the trees' limit": lambda meta: meta["settings"].update(
            capacity=2**40),
        "settings: a capacity past a C size": lambda meta: meta["settings"].update(
            capacity=2**70),
    }


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_a_state_no_buffer_could_have_is_refused(saved, name):
    """A metadata file that is whole and ours (re-signed with a correct
    checksum) but describes no buffer: ValueError naming the file, before
    anything is built."""
    meta = _in_band(saved)
    _mutations()[name](meta)
    _resign(saved, meta)
    with pytest.raises(ValueError, match=str(saved / kept.META_NAME)):
        MultiAgentPrioritizedEpisodeReplayBuffer.open(saved)


FLIPS = r"""
import os, random, sys
from episode.replay import MultiAgentPrioritizedEpisodeReplayBuffer as Buffer
from episode.replay import kept
from test_replay_kept import _flipped, _signed
folder, cases, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(0)
outcomes = {}
meta_path = os.path.join(folder, kept.META_NAME)
good_meta = open(meta_path, "rb").read()
files = sorted(n for n in os.listdir(folder)
               if n.startswith(("rows-", "frames-", "objects-")))
for case in range(cases):
    if what == "meta":
        with open(meta_path, "wb") as f:
            f.write(_signed(_flipped(good_meta[kept.HEADER_BYTES:], rng, [1, 1, 2, 8])))
        restore = None
    else:
        name = rng.choice(files)
        path = os.path.join(folder, name)
        good = open(path, "rb").read()
        with open(path, "wb") as f:
            f.write(_flipped(good, rng, [1, 2, 8]) if good else good)
        restore = (path, good)
    try:
        buffer = Buffer.open(folder)
    except Exception as error:
        outcome = type(error).__name__
    else:
        # (A number changed in an episode's arrays may fail a later call of
        # the episode's own with a Python error: only the process must live.)
        try:
            buffer.get_state()
            buffer.sample_batch(16, n_step=2)
            buffer.sample(8, n_step=2)
            if not buffer._stacked():
                buffer.sample(4, replay_mode="synchronized")
            outcome = "opened"
        except Exception as error:
            outcome = "opened, then " + type(error).__name__
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
    if restore is not None:
        with open(restore[0], "wb") as f:
            f.write(restore[1])
print(sorted(outcomes.items()))
"""


@pytest.mark.parametrize("change", ["past the file", "negative", "one less"])
def test_lying_places_of_the_objects_are_refused(saved, change):
    meta = kept._read_meta(str(saved))
    places = meta["objects"]["buffers"]
    offset, nbytes = places[-1]
    meta["objects"]["buffers"] = {
        "past the file": places[:-1] + [(offset, nbytes + 64)],
        "negative": [(-8, 8)] + places[1:],
        "one less": places[:-1]}[change]
    _resign(saved, meta)
    with pytest.raises(ValueError, match=str(saved / kept.META_NAME)):
        MultiAgentPrioritizedEpisodeReplayBuffer.open(saved)


@pytest.mark.parametrize("what", ["meta", "files"])
def test_flipped_bits_never_crash(saved, what):
    """Bits flipped in the metadata's pickle (its checksum made to match, so
    the checks after it are what stands) or in the files of rows, frame
    numbers and frames: each open raises or gives a buffer that works; the
    process never dies."""
    # (Run in tests/: from the checkout's root the source folder would
    # shadow the installed package.)
    result = subprocess.run([sys.executable, "-c", FLIPS, str(saved), "150", what],
                            capture_output=True, text=True, timeout=900, cwd=TESTS)
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = dict(ast.literal_eval(result.stdout.strip()))
    # open() refuses with ValueError (FileNotFoundError for a flipped file name).
    assert set(outcomes) <= {"ValueError", "FileNotFoundError"} | {
        o for o in outcomes if o.startswith("opened")}, outcomes
    assert outcomes.get("ValueError" if what == "meta" else "opened"), outcomes
