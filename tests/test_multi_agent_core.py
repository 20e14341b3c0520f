"""MultiAgentEpisode's compiled paths against its general (Python) paths.

The compiled core (episode/_multi.pyx) takes the usual add_env_step, the
env-step reads of list-mode data, the latest-observation read, filled action
slices and cut() at a chunk boundary, and declines everything else to the
facade's general code. Here one episode
uses both and a twin only the general code, on the same random sequences
(tests/ma_strategies.py): after every call their states, results and
exception classes must agree. No ray needed, so the sanitizer build runs these.
"""
from __future__ import annotations

import pickle
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ma_strategies as mas
from ma_difftools import compare_joined_with_whole
from episode import InfiniteLookbackBuffer, MultiAgentEpisode
from episode.multi_agent_episode import AgentSteps
from episode.cli.workloads import _state, assert_same

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


class GeneralOnly(MultiAgentEpisode):
    """The same episode with every compiled path declined."""

    __slots__ = ()

    def add_env_step(self, *args, **kwargs):
        return self._add_env_step_general(*args, **kwargs)

    def get_observations(self, indices=None, agent_ids=None, *, env_steps=True,
                         neg_index_as_lookback=False, fill=None, one_hot_discrete=False,
                         return_list=False):
        return self._get("observations", indices, agent_ids, env_steps,
                         neg_index_as_lookback, fill, one_hot_discrete, return_list)

    def get_infos(self, indices=None, agent_ids=None, *, env_steps=True,
                  neg_index_as_lookback=False, fill=None, return_list=False):
        return self._get("infos", indices, agent_ids, env_steps, neg_index_as_lookback,
                         fill, False, return_list)

    def get_actions(self, indices=None, agent_ids=None, *, env_steps=True,
                    neg_index_as_lookback=False, fill=None, one_hot_discrete=False,
                    return_list=False):
        return self._get("actions", indices, agent_ids, env_steps, neg_index_as_lookback,
                         fill, one_hot_discrete, return_list)

    def get_rewards(self, indices=None, agent_ids=None, *, env_steps=True,
                    neg_index_as_lookback=False, fill=None, return_list=False):
        return self._get("rewards", indices, agent_ids, env_steps, neg_index_as_lookback,
                         fill, False, return_list)

    def get_extra_model_outputs(self, key=None, indices=None, agent_ids=None, *,
                                env_steps=True, neg_index_as_lookback=False, fill=None,
                                return_list=False):
        return self._get("extra_model_outputs", indices, agent_ids, env_steps,
                         neg_index_as_lookback, fill, False, return_list, key)

    def _cut_at_last_observations(self):
        return None


def _run(episode, name, args, kwargs):
    try:
        return getattr(episode, name)(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 -- the class is what is compared
        return None, type(e)


def _same(a, b, what):
    (ra, ea), (rb, eb) = a, b
    assert ea is eb, f"{what}: {ea} vs {eb}"
    if ea is None:
        assert_same(ra, rb, what)


def _twins(sequence):
    """The sequence's episode built by both, compared after every call."""
    fast = MultiAgentEpisode(**sequence.constructor)
    general = GeneralOnly(**sequence.constructor)
    for name, args, kwargs in sequence.calls:
        _same(_run(fast, name, args, kwargs), _run(general, name, args, kwargs), name)
        assert_same(_state(fast), _state(general), f"state after {name}")
    return fast, general


FAST_READS = st.one_of(
    st.tuples(st.just("get_observations"), st.integers(-12, 12).map(lambda i: (i,)),
              st.just({})),
    st.tuples(st.just("get_actions"),
              st.tuples(st.integers(-12, 4), st.one_of(st.none(), st.integers(-6, 12)))
              .map(lambda t: (slice(*t),)),
              st.sampled_from([{"fill": 0}, {"fill": 0.5}, {"fill": -1}])),
)


@SETTINGS
@given(sequence=mas.episodes(max_steps=10),
       reads=st.lists(st.one_of(FAST_READS, mas.getter_call()), max_size=8))
def test_compiled_paths_agree_with_the_general_ones(sequence, reads):
    fast, general = _twins(sequence)
    for name, args, kwargs in reads:
        _same(_run(fast, name, args, kwargs), _run(general, name, args, kwargs),
              f"{name}{args}{kwargs}")
    for lookback in (0, 1):
        cut = (_run(fast, "cut", (lookback,), {}), _run(general, "cut", (lookback,), {}))
        _same(*cut, f"cut({lookback})")
        if cut[0][1] is None:
            for name, args, kwargs in reads:
                _same(_run(cut[0][0], name, args, kwargs),
                      _run(cut[1][0], name, args, kwargs), f"after cut: {name}")
    copy = pickle.loads(pickle.dumps(fast, protocol=5))
    assert type(copy) is MultiAgentEpisode
    assert_same(_state(copy), _state(fast), "pickled")
    assert copy.id_ == fast.id_


@SETTINGS
@given(sequence=mas.episodes(modes=("simultaneous",), max_steps=10, invalid=False))
def test_cut_at_a_chunk_boundary_is_the_general_cut(sequence):
    fast, general = _twins(sequence)
    if fast.is_done:
        return
    successor = fast._cut_at_last_observations()
    expected = general._cut_general(0)
    if successor is None:
        assert fast._hanging_actions_end or any(
            steps.get(-1) == "S" for steps in fast.env_t_to_agent_t.values()) or any(
            ep.is_done or ep.is_numpy for ep in fast.agent_episodes.values())
        return
    assert_same(_state(successor), _state(expected), "cut")
    assert list(successor.agent_t_started) == list(expected.agent_t_started)
    assert list(successor.agent_episodes) == list(expected.agent_episodes)
    # The successor steps on (through the compiled step) as the general one does.
    steps = {aid: 0 for aid in successor.agent_episodes}
    obs = {aid: ep.get_observations(-1) for aid, ep in successor.agent_episodes.items()}
    for e in (successor, expected):
        e.add_env_step(obs, steps, {aid: 1.0 for aid in steps})
    assert_same(_state(successor), _state(expected), "step after cut")


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(sequence=mas.episodes(max_steps=10, invalid=False), data=st.data())
def test_cut_then_concat_gives_back_the_uncut_episode(sequence, data):
    """Cut at random steps (random lookbacks), each chunk stepped on, the
    chunks concatenated: the uncut episode (up to what
    compare_joined_with_whole lists), its return with hanging rewards too."""
    whole, joined = mas.play_in_chunks(MultiAgentEpisode, sequence,
                                       data.draw(mas.cut_points(sequence)))
    compare_joined_with_whole(joined, whole)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(sequence=mas.episodes(max_steps=10, invalid=False), data=st.data())
def test_any_successor_concatenated_gives_back_the_uncut_episode(sequence, data):
    """As above, each successor made another way (mas.SUCCESSORS): cut(),
    empty slices of it (ep[0:0], slice() with a lookback), slice() of the
    last steps then cut(), pickled, or copied through get_state()."""
    whole, joined = mas.play_in_chunks(MultiAgentEpisode, sequence,
                                       data.draw(mas.cut_points(sequence, mas.SUCCESSORS)))
    compare_joined_with_whole(joined, whole)


# -- the mapping ------------------------------------------------------------------

STEP_LISTS = st.lists(st.one_of(st.integers(-3, 40), st.just("S")), max_size=12)
INDEX = st.one_of(
    st.none(), st.integers(-15, 15),
    st.lists(st.integers(-15, 15), max_size=4),
    st.tuples(st.one_of(st.none(), st.integers(-15, 15)),
              st.one_of(st.none(), st.integers(-15, 15)),
              st.sampled_from([None, 1, 2, -1])).map(lambda t: slice(*t)),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(items=STEP_LISTS, lookback=st.integers(0, 5), index=INDEX,
       neg=st.booleans(), fill=st.sampled_from([None, "S"]), ignore_last=st.booleans())
def test_agent_steps_read_as_a_lookback_buffer_of_steps_and_tags(items, lookback, index, neg,
                                                                 fill, ignore_last):
    steps = AgentSteps(data=items, lookback=lookback)
    plain = InfiniteLookbackBuffer(data=list(items), lookback=lookback)
    assert steps.data == plain.data and len(steps) == len(plain)
    assert steps.lookback == plain.lookback
    assert steps.get_state() == plain.get_state()
    kwargs = dict(neg_index_as_lookback=neg, fill=fill, _ignore_last_ts=ignore_last)
    _same(_run(steps, "get", (index,), kwargs), _run(plain, "get", (index,), kwargs), "get")
    if index is not None and not isinstance(index, list):
        _same(_run(steps, "__getitem__", (index,), {}), _run(plain, "__getitem__", (index,), {}),
              "[]")
    copy = pickle.loads(pickle.dumps(steps, protocol=5))
    assert type(copy) is AgentSteps and copy.data == steps.data
    steps.append("S")
    steps.extend([7, "S"])
    assert steps.data == [*items, "S", 7, "S"]


def test_agent_steps_store_the_tag_as_an_int64_sentinel():
    steps = AgentSteps(data=[0, "S", 1])
    assert steps._col.kind == 2      # KIND_INT: one int64 per env step
    assert steps.data == [0, "S", 1] and steps.get(-2) == "S"
    assert AgentSteps.of(InfiniteLookbackBuffer([0, "S"], lookback=1)).data == [0, "S"]


# -- garbage ------------------------------------------------------------------------

def _stepped():
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations={"a0": np.zeros(2), "a1": np.ones(2)})
    episode.add_env_step({"a0": np.ones(2)}, {"a0": 0, "a1": 1}, {"a0": 1.0, "a1": 2.0})
    return episode


GARBAGE_FIELDS = [
    ("agent_episodes", None), ("agent_episodes", [1, 2]), ("agent_episodes", {"a0": 3}),
    ("env_t_to_agent_t", None), ("env_t_to_agent_t", {"a0": [0, 1]}),
    ("env_t_to_agent_t", defaultdict(AgentSteps)),
    ("agent_t_started", None), ("agent_t_started", {"a0": "x", "a1": 2.5}),
    ("agent_t_started", {"a0": 2 ** 80, "a1": -2 ** 80}),
    ("_hanging_actions_end", None), ("_hanging_rewards_end", []),
    ("_hanging_extra_model_outputs_end", 5),
]


@pytest.mark.parametrize("name,value", GARBAGE_FIELDS)
def test_garbage_fields_never_reach_the_c_paths(name, value):
    """A field a C path reads that is not what it expects sends the call to
    the general code: a Python error or an answer, never a crash."""
    calls = [
        ("add_env_step", ({"a0": np.ones(2), "a1": np.ones(2)}, {"a0": 1},
                          {"a0": 1.0, "a1": 0.5}), {}),
        ("get_observations", (-1,), {}),
        ("get_actions", (slice(-2, None),), {"fill": 0}),
        ("cut", (), {}),
        ("__reduce__", (), {}),
    ]
    for call in calls:
        episode = _stepped()
        setattr(episode, name, value)
        _run(episode, *call)


def test_mapping_steps_with_garbage_mapping_entries():
    episode = _stepped()
    episode.env_t_to_agent_t["a1"] = AgentSteps(data=[0, 1.5, "S"])   # a float: not typed
    episode.add_env_step({"a1": np.ones(2)}, {"a0": 1}, {"a0": 1.0, "a1": 0.0})
    assert episode.env_t_to_agent_t["a1"].data == [0, 1.5, "S", 1]
    finalized = AgentSteps(data=[0, "S"])
    finalized._push_step(1)
    assert finalized.data == [0, "S", 1]


@pytest.mark.parametrize("state", [None, (), (1, 2), ("x",) * 3, ("x",) * 20])
def test_unpickling_garbage_raises(state):
    from episode._multi import MA_FORMAT, _restore_multi_agent
    with pytest.raises((TypeError, ValueError)):
        _restore_multi_agent(MA_FORMAT, MultiAgentEpisode, state)
    with pytest.raises(TypeError):
        _restore_multi_agent(MA_FORMAT, dict, ())


class _KeyMeddler(str):
    """An extra-output key whose hash and == empty every dict of the episode
    the step reads while it runs."""

    episode = None

    def __hash__(self):
        episode = type(self).episode
        if episode is not None:
            for d in (episode.agent_episodes, episode.env_t_to_agent_t,
                      episode._hanging_extra_model_outputs_end,
                      *(e.extra_model_outputs for e in list(episode.agent_episodes.values()))):
                d.clear()
        return str.__hash__(self)

    def __eq__(self, other):
        return str.__eq__(self, other)


GARBAGE_OUTPUTS = [
    5, "xy", [("a0", {"k": 1})], {"a0": 5}, {"a0": [1, 2]}, {"a0": None, "a1": {"k": 1}},
    {"a0": {"k": 1}, "a1": {"k": 2}}, {"a0": {object(): 1}}, {"a0": {"k": object()}},
]
GARBAGE_STORED = [None, {"k": 3}, {"k": [1.0]}, {"k": None}]


def _with_outputs():
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations={"a0": np.zeros(2), "a1": np.ones(2)})
    episode.add_env_step({"a0": np.ones(2)}, {"a0": 0, "a1": 1}, {"a0": 1.0, "a1": 2.0},
                         extra_model_outputs={"a0": {"k": 0.5}, "a1": {"k": 0.25}})
    return episode


@pytest.mark.parametrize("stored", range(len(GARBAGE_STORED) + 1))
@pytest.mark.parametrize("outputs", range(len(GARBAGE_OUTPUTS)))
@pytest.mark.parametrize("step", ["fast", "join", "general"])
def test_garbage_extra_outputs_in_a_step(step, outputs, stored):
    """The extra-output checks of a step (each key as many rows as actions)
    on garbage outputs and garbage stored outputs: a Python error before
    anything changes, or the step, never a crash or a SystemError."""
    episode = _with_outputs()
    if stored < len(GARBAGE_STORED):
        if GARBAGE_STORED[stored] is None:
            episode.agent_episodes["a0"].extra_model_outputs = defaultdict(list)
        else:
            episode.agent_episodes["a0"].extra_model_outputs = dict(GARBAGE_STORED[stored])
    obs = {"a0": np.ones(2), "a1": np.ones(2)}
    actions = {"a0": 1} if step != "general" else {"a0": 1, "a2": 0}
    rewards = {"a0": 1.0, "a1": 0.5}
    before = _snapshot(episode)
    result, error = _run(episode, "add_env_step", (obs, actions, rewards),
                         {"extra_model_outputs": GARBAGE_OUTPUTS[outputs]})
    assert error is not SystemError
    if error is not None:
        assert _snapshot(episode) == before, error


def _snapshot(episode):
    return (episode.env_t, {a: m.data for a, m in episode.env_t_to_agent_t.items()},
            {a: len(e) for a, e in episode.agent_episodes.items()},
            {a: sorted(map(str, e.extra_model_outputs)) for a, e in episode.agent_episodes.items()},
            dict(episode._hanging_actions_end), dict(episode._agent_to_module_mapping))


def test_a_key_whose_hash_empties_the_episode_mid_step():
    episode = _with_outputs()
    _KeyMeddler.episode = episode
    try:
        key = _KeyMeddler("k")
        for outputs in ({"a0": {key: 1.0}}, {"a0": {"k": 1.0, key: 2.0}}):
            result, error = _run(episode, "add_env_step",
                                 ({"a0": np.ones(2), "a1": np.ones(2)}, {"a0": 1},
                                  {"a0": 1.0, "a1": 0.5}), {"extra_model_outputs": outputs})
            assert error is not SystemError
    finally:
        _KeyMeddler.episode = None


class _Meddler:
    """A value whose truth empties every dict the step reads."""

    def __init__(self, episode, inputs):
        self.episode, self.inputs = episode, inputs

    def __bool__(self):
        for d in (*self.inputs, self.episode.env_t_to_agent_t, self.episode.agent_episodes,
                  self.episode._hanging_actions_end, self.episode.agent_t_started):
            d.clear()
        return True

    def __add__(self, other):
        return 1.0

    __radd__ = __add__


@pytest.mark.parametrize("where", ["reward", "terminated", "agent_flag"])
def test_user_code_inside_a_step_cannot_pull_data_from_under_it(where):
    """A reward or flag whose __bool__ empties the dicts the step reads while
    it runs: the step keeps its own references (no crash)."""
    episode = _stepped()
    obs = {"a0": np.ones(2), "a1": np.ones(2)}
    actions, rewards = {"a0": 1}, {"a0": 1.0, "a1": 0.5}
    kwargs = {}
    meddler = _Meddler(episode, (obs, actions, rewards))
    if where == "reward":
        rewards["a0"] = meddler
    elif where == "terminated":
        kwargs["terminateds"] = {"__all__": False, "a1": False}
        episode.agent_episodes["a0"].is_terminated = 0
        episode.agent_episodes["a0"].is_truncated = meddler
    else:
        kwargs["truncateds"] = {"a0": meddler}
    _run(episode, "add_env_step", (obs, actions, rewards), kwargs)
    _run(episode, "get_observations", (-1,), {})
    _run(episode, "get_actions", (slice(-2, None),), {"fill": 0})


def test_mapping_data_is_a_new_list_each_read():
    """A difference (docs/differences.md): `env_t_to_agent_t[aid].data` is a list made on
    each read, since the steps are stored as int64; writing into it changes
    nothing. RLlib's is the buffer's own list."""
    episode = _stepped()
    data = episode.env_t_to_agent_t["a1"].data
    assert data == [0, "S"]
    data.append(5)
    assert episode.env_t_to_agent_t["a1"].data == [0, "S"]
    # What RLlib's own code reads from it still works: list methods and indexing.
    assert episode.env_t_to_agent_t["a0"].data.index(1) == 1
    assert episode.env_t_to_agent_t["a0"][-1] == 1


@pytest.mark.rllib
def test_rllib_mapping_data_is_its_live_list():
    module = pytest.importorskip("ray.rllib.env.multi_agent_episode")
    episode = module.MultiAgentEpisode()
    episode.add_env_reset(observations={"a0": np.zeros(2), "a1": np.ones(2)})
    episode.add_env_step({"a0": np.ones(2)}, {"a0": 0, "a1": 1}, {"a0": 1.0, "a1": 2.0})
    episode.env_t_to_agent_t["a1"].data.append(5)
    assert episode.env_t_to_agent_t["a1"].data == [0, "S", 5]


@pytest.mark.parametrize("finalized", [True, False])
@pytest.mark.parametrize("index", [-1, -2, slice(-3, None), slice(5, 8)])
def test_a_hanging_value_is_a_virtual_row_not_a_copy_of_the_column(finalized, index):
    """Reads with a hanging value (`_add_last_ts_value`, how the multi-agent
    episode reads hanging actions) touch only the rows they return."""
    import tracemalloc

    items = list(np.arange(200_000, dtype=np.float64))
    buffer = InfiniteLookbackBuffer(items)
    if finalized:
        buffer.finalize()
    if isinstance(index, int) and not finalized:
        expected = (items + [7.0])[index]       # list mode: the item, or the value itself
    else:
        expected = np.append(np.arange(200_000, dtype=np.float64), 7.0)[index]
    tracemalloc.start()
    try:
        got = buffer.get(index, _add_last_ts_value=7.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100_000       # the column is 1.6 MB
    assert type(got) is type(expected) and np.array_equal(got, expected)
    assert np.asarray(got).dtype == np.asarray(expected).dtype


@pytest.mark.parametrize("step, t_started", [
    (2 ** 62 + 5, 0), (-(2 ** 63) + 1, 0), (2 ** 63 - 1, 0), (1, 2 ** 62 + 1), (1, -(2 ** 62) - 1),
    (1, 2 ** 70),
])
def test_extreme_agent_steps_read_as_the_general_path_reads_them(step, t_started):
    """Mapping entries and agent_t_started values at the ends of int64 (only
    user code puts them there): the compiled reads give what the general
    path gives (no overflow in C)."""
    episodes = []
    for cls in (MultiAgentEpisode, GeneralOnly):
        episode = cls()
        episode.add_env_reset(observations={"a0": 0, "a1": 1})
        episode.add_env_step({"a0": 1}, {"a0": 0, "a1": 1}, {"a0": 1.0, "a1": 2.0})
        episode.env_t_to_agent_t["a0"].append(step)
        episode.env_t_to_agent_t["a1"].append(step)
        episode.agent_t_started["a0"] = t_started
        episodes.append(episode)
    for name, args, kwargs in [("get_observations", (-1,), {}), ("get_observations", (-2,), {}),
                               ("get_actions", (slice(-3, None),), {"fill": 0}),
                               ("get_actions", (slice(None),), {"fill": -1})]:
        _same(_run(episodes[0], name, args, kwargs), _run(episodes[1], name, args, kwargs),
              f"{name}{args}")
