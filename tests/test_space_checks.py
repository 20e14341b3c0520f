"""add_env_step on a numpy'ized episode refuses items outside the spaces.

The per-step checks for a Box observation and a Discrete action are computed
in C; these tests hold them to gymnasium's own `space.contains` on the cases
where the two could part: bounds, NaN and inf, dtypes, shapes, layouts, ints.
"""
import gymnasium as gym
import numpy as np
import pytest

from episode import SingleAgentEpisode

BOX32 = gym.spaces.Box(np.array([-1.0, 0.0, -np.inf, 2.0], np.float32),
                       np.array([1.0, 0.5, 0.0, np.inf], np.float32), (4,), np.float32)
BOX64 = gym.spaces.Box(-2.0, 2.0, (2, 3), np.float64)


def numpy_episode(observation_space, action_space, obs, action, cls=SingleAgentEpisode):
    episode = cls(observation_space=observation_space, action_space=action_space)
    episode.add_env_reset(obs)
    episode.add_env_step(obs, action, 0.0)
    return episode.to_numpy()


def agrees_with_gymnasium(episode, space, obs=None, action=None):
    """add_env_step raises (nothing appended) exactly when gymnasium says the
    item is outside its space."""
    obs = episode.get_observations(-1) if obs is None else obs
    action = episode.get_actions(-1) if action is None else action
    x = obs if space is episode.observation_space else action
    before = len(episode)
    if space.contains(x):
        episode.add_env_step(obs, action, 0.0)
        assert len(episode) == before + 1
    else:
        # A row of the wrong shape is refused by the append's own check
        # (ValueError) before the space check (AssertionError), as in RLlib.
        with pytest.raises((AssertionError, ValueError)):
            episode.add_env_step(obs, action, 0.0)
        assert len(episode) == before


def f32(*values):
    return np.array(values, np.float32)


BOX32_CASES = [
    f32(0.0, 0.25, -5.0, 3.0),                 # inside
    f32(-1.0, 0.0, -np.inf, 2.0),              # on every lower bound
    f32(1.0, 0.5, 0.0, np.inf),                # on every upper bound
    f32(1.0001, 0.25, -5.0, 3.0),              # just above
    f32(0.0, -1e-7, -5.0, 3.0),                # just below
    f32(np.nan, 0.25, -5.0, 3.0),              # NaN
    f32(0.0, 0.25, np.nan, 3.0),               # NaN against an infinite bound
    f32(0.0, 0.25, -5.0, 1.0),                 # below a finite lower bound with inf above
    np.array([0.0, 0.25, -5.0, 3.0]),          # float64 for a float32 space
    np.array([0, 0, -5, 3], np.int32),         # ints
    f32(0.0, 0.25, -5.0, 3.0, 0.0)[:4],        # a view (still contiguous)
    f32(0.0, 0.0, 0.25, 0.0, -5.0, 0.0, 3.0, 0.0)[::2],   # not contiguous
    f32(0.0, 0.25, -5.0, 3.0).astype(">f4"),   # byte-swapped
]
BOX64_CASES = [
    np.zeros((2, 3)),
    np.full((2, 3), 2.0),
    np.full((2, 3), 2.0000001),
    np.full((3, 2), 0.0),
    np.zeros((2, 3)).T.copy().T,               # Fortran order
    np.zeros((2, 3), np.float32),
]
DISCRETE_CASES = [-3, -2, 0, 2, 3, 10, True, np.int64(1), np.int32(-2), 2**70, -(2**70), 1.0]
DISCRETE = gym.spaces.Discrete(5, start=-2)


@pytest.mark.parametrize("obs", BOX32_CASES, ids=repr)
def test_box_float32_observations(obs):
    episode = numpy_episode(BOX32, gym.spaces.Discrete(2), f32(0.0, 0.25, -5.0, 3.0), 1)
    agrees_with_gymnasium(episode, episode.observation_space, obs=obs)


@pytest.mark.parametrize("obs", BOX64_CASES, ids=repr)
def test_box_float64_observations(obs):
    episode = numpy_episode(BOX64, gym.spaces.Discrete(2), np.zeros((2, 3)), 0)
    agrees_with_gymnasium(episode, episode.observation_space, obs=obs)


@pytest.mark.parametrize("action", DISCRETE_CASES, ids=repr)
def test_discrete_actions_with_a_start(action):
    space = DISCRETE
    episode = numpy_episode(BOX32, space, f32(0.0, 0.25, -5.0, 3.0), 0)
    try:
        space.contains(action)
    except OverflowError:
        # gymnasium cannot even convert it: RLlib's add_env_step raises the same.
        with pytest.raises(OverflowError):
            episode.add_env_step(f32(0.0, 0.25, -5.0, 3.0), action, 0.0)
        assert len(episode) == 1
        return
    agrees_with_gymnasium(episode, space, action=action)


# -- the same answers as RLlib 2.60 itself ----------------------------------------

def outcome(cls, observation_space, action_space, first_obs, first_action, obs, action):
    """The exception class (or None) of one add_env_step on a numpy'ized
    episode of `cls`. RLlib checks at t=2 (it skips t % 100 == 0)."""
    episode = numpy_episode(observation_space, action_space, first_obs, first_action, cls)
    try:
        episode.add_env_step(obs, action, 0.0)
    except Exception as e:                     # noqa: BLE001 - the class is the result
        return type(e)
    return None


CASES = ([(BOX32, gym.spaces.Discrete(2), f32(0.0, 0.25, -5.0, 3.0), 1, x, 1)
          for x in BOX32_CASES]
         + [(BOX64, gym.spaces.Discrete(2), np.zeros((2, 3)), 0, x, 0) for x in BOX64_CASES]
         + [(BOX32, DISCRETE, f32(0.0, 0.25, -5.0, 3.0), 0, f32(0.0, 0.25, -5.0, 3.0), a)
            for a in DISCRETE_CASES])


@pytest.mark.rllib
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[4]!r}-{c[5]!r}")
def test_same_exception_class_as_rllib(case):
    rllib = pytest.importorskip("ray.rllib.env.single_agent_episode").SingleAgentEpisode
    assert outcome(SingleAgentEpisode, *case) is outcome(rllib, *case)


@pytest.mark.parametrize("space, rows", [
    (gym.spaces.Box(-1, 1, (4,), np.float32), [np.zeros(4, np.float32), np.zeros(3, np.float32)]),
    (gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32)}),
     [{"a": np.zeros(2, np.float32)}, {"a": np.zeros(1, np.float32)}]),
    (gym.spaces.MultiDiscrete([2, 3]), [np.zeros(2, np.int64), np.zeros(3, np.int64)]),
])
def test_to_numpy_refuses_rows_that_cannot_take_the_spaces_shape(space, rows):
    """With a space of numbers, rows that stack only as objects raise
    ValueError (RLlib's class) and leave the episode as it was; without a
    space they stay objects (docs/differences.md)."""
    from episode import SingleAgentEpisode

    episode = SingleAgentEpisode(observation_space=space)
    episode.add_env_reset(rows[0])
    episode.add_env_step(rows[1], 0, 1.0)
    with pytest.raises(ValueError, match="do not stack into the space"):
        episode.to_numpy()
    assert not episode.is_numpy and len(episode.get_observations()) == 2
    plain = SingleAgentEpisode()
    plain.add_env_reset(rows[0])
    plain.add_env_step(rows[1], 0, 1.0)
    plain.to_numpy()
    assert plain.is_numpy


@pytest.mark.rllib
def test_rllib_refuses_them_with_the_same_class():
    pytest.importorskip("ray.rllib")
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as TheirEpisode

    episode = TheirEpisode(observation_space=gym.spaces.Box(-1, 1, (4,), np.float32))
    episode.add_env_reset(np.zeros(4, np.float32))
    episode.add_env_step(np.zeros(3, np.float32), 0, 1.0)
    with pytest.raises(ValueError):
        episode.to_numpy()
