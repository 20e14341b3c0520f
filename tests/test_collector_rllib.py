"""Differential tests: episode.AgentCollector against RLlib 2.60's old-stack
AgentCollector (ray.rllib.evaluation.collectors.agent_collector).

Random scenarios (tests/collector_strategies.py: view requirements with every
shift form and data_col remap, spaces of every kind, recurrent state columns,
training and inference modes, episodes that end or go on) drive one collector
of each implementation through the same calls. Every built batch must be equal:
same class, keys in the same order, per key the same type, dtype, shape and
values (Dict/Tuple columns leaf by leaf, infos by equality), the same
"seq_lens", count, max_seq_len and is_training. Where RLlib raises one of its
deliberate errors, ours raises the same class and the example ends there.

The plain tests at the end pin RLlib's padding rules with explicit values, on
RLlib and on ours.

With EPISODE_COLLECTOR_SELFTEST=1 the differential test runs RLlib against
itself instead: a check of the harness and of the scenarios alone (that they
are inputs RLlib handles without crashing internally).
"""
from __future__ import annotations

import copy
import os
import traceback

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings

pytestmark = pytest.mark.rllib
pytest.importorskip("ray.rllib")

from ray.rllib.evaluation.collectors import agent_collector as rllib_module  # noqa: E402
from ray.rllib.policy.sample_batch import SampleBatch  # noqa: E402
from ray.rllib.policy.view_requirement import ViewRequirement as RllibVR  # noqa: E402

import collector_strategies as cs  # noqa: E402
from difftools import compare  # noqa: E402

RllibAC = rllib_module.AgentCollector
SELFTEST_VAR = "EPISODE_COLLECTOR_SELFTEST"

# COLLECTOR_MAX_EXAMPLES=5000 for a longer hunt (about a minute). A failing
# example prints its seed: run_scenario(cs.build_scenario(seed), ours_classes())
# replays it. (Shrinking a seed only finds another scenario, so it is off.)
MAX = int(os.environ.get("COLLECTOR_MAX_EXAMPLES", 100))
SETTINGS = settings(max_examples=MAX, deadline=None, database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow])


def ours_classes():
    """(AgentCollector, ViewRequirement) of ours, or RLlib's own under
    EPISODE_COLLECTOR_SELFTEST=1 (skips while ours is missing otherwise)."""
    if os.environ.get(SELFTEST_VAR) == "1":
        return RllibAC, RllibVR
    try:
        from episode import AgentCollector, ViewRequirement
    except ImportError:
        pytest.skip("episode.AgentCollector not written yet")
    return AgentCollector, ViewRequirement


# -- driving both ------------------------------------------------------------------

class Side:
    """One implementation: its classes, its collector, and its unroll-id
    counter (kept apart so that RLlib run against itself counts twice)."""

    def __init__(self, name, collector_class, vr_class, counter):
        self.name, self.cls, self.vr = name, collector_class, vr_class
        self.counter = counter
        self.collector = None

    def call(self, fn, *args, **kwargs):
        """(result, None) or (None, exception), with this side's counter."""
        self.cls._next_unroll_id = self.counter
        try:
            return fn(*args, **kwargs), None
        except Exception as exc:  # noqa: BLE001 - compared by class below
            return None, exc
        finally:
            self.counter = self.cls._next_unroll_id


def deliberate(exc: Exception) -> bool:
    """RLlib's own checks: an assert in agent_collector.py (eps_id/unroll_id of
    a step, an "obs" key in a step), the ValueError for a future shift used for
    compute actions, the ValueError for state columns of a non-recurrent policy."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = frames[-1] if frames else None
    in_collector = where is not None and where.filename == rllib_module.__file__
    if isinstance(exc, AssertionError):
        return in_collector
    if type(exc) is ValueError:
        text = str(exc)
        return in_collector and (text.startswith("During inference the agent can only use")
                                 or "is not available, because the given policy" in text)
    return False


def batch_columns(batch):
    return {k: dict.__getitem__(batch, k) for k in dict.keys(batch)}


def compare_batches(ours, theirs, label):
    assert type(ours) is type(theirs), (
        f"{label}: {type(ours).__name__} (ours) != {type(theirs).__name__} (RLlib)")
    compare(batch_columns(ours), batch_columns(theirs), label)
    if isinstance(theirs, SampleBatch):
        for attr in ("count", "max_seq_len", "is_training", "time_major", "zero_padded"):
            a, b = getattr(ours, attr), getattr(theirs, attr)
            assert type(a) is type(b) and a == b, (
                f"{label}.{attr}: {a!r} (ours) != {b!r} (RLlib)")
        # Every attribute the constructor sets (ours may make batches without it).
        assert vars(ours).keys() == vars(theirs).keys(), f"{label}: attributes differ"
        for attr, b in vars(theirs).items():
            a = vars(ours)[attr]
            if not isinstance(b, np.ndarray):
                assert type(a) is type(b) and a == b, (
                    f"{label}.{attr}: {a!r} (ours) != {b!r} (RLlib)")


def compare_outcomes(label, ours, theirs) -> bool:
    """Checks one call's outcome on both sides; False once RLlib raised
    (the example ends there: RLlib may have changed its collector part-way)."""
    (o_res, o_exc), (t_res, t_exc) = ours, theirs
    if t_exc is not None:
        assert deliberate(t_exc), (
            f"{label}: RLlib crashed internally; the scenario generator must keep "
            f"this input out:\n{''.join(traceback.format_exception(t_exc)[-4:])}")
        assert o_exc is not None, (
            f"{label}: RLlib raised {type(t_exc).__name__}({t_exc}), ours returned {o_res!r}")
        assert isinstance(o_exc, type(t_exc)), (
            f"{label}: ours raised {type(o_exc).__name__}({o_exc}), "
            f"RLlib {type(t_exc).__name__}({t_exc})")
        event(f"ended by RLlib's {type(t_exc).__name__}: {str(t_exc)[:40]}")
        return False
    if o_exc is not None:
        raise AssertionError(f"{label}: ours raised {type(o_exc).__name__}: {o_exc} "
                             f"where RLlib returned") from o_exc
    if t_res is not None or o_res is not None:
        compare_batches(o_res, t_res, label)
    return True


def compare_collectors(ours, theirs, label):
    """is_empty(), training, and the attributes RLlib's samplers read
    (episode_v2 skips a collector whose agent_steps is 0)."""
    for name in ("is_empty", "training", "agent_steps", "episode_id", "unroll_id"):
        a, b = getattr(ours, name), getattr(theirs, name)
        if name == "is_empty":
            a, b = a(), b()
        compare(a, b, f"{label}: {name}")


def plain(args):
    """Call arguments with each ViewRequirement as a dict of its fields (to
    check that a call left its arguments as they were)."""
    if isinstance(args, (list, tuple)):
        return type(args)(plain(a) for a in args)
    if isinstance(args, dict):
        return {k: plain(v) for k, v in args.items()}
    if hasattr(args, "shift_arr"):  # a ViewRequirement of either
        fields = dict(vars(args))
        fields["space"] = repr(fields["space"])
        return plain(fields)
    return args


def run_scenario(sc: cs.Scenario, ours_classes_) -> int:
    """Drives both collectors through `sc`; returns how many steps compared."""
    theirs = Side("RLlib", RllibAC, RllibVR, sc.unroll_start)
    ours = Side("ours", *ours_classes_, sc.unroll_start)
    sides = (ours, theirs)
    views = {side: sc.make_views(side.vr) for side in sides}
    for side in sides:
        side.collector, exc = side.call(side.cls, views[side], **copy.deepcopy(sc.ctor))
        assert exc is None, f"{side.name} constructor raised {exc!r}"
    compare_collectors(ours.collector, theirs.collector, "constructed")

    built = []  # (label, ours' batch, RLlib's batch): compared again at the end

    def do(label, method, args=(), kwargs=None):
        """One call on both sides (arguments copied per side; ours must leave
        its copy as it was). False once RLlib raised."""
        outcomes = []
        for side in sides:
            # (View dicts are made per side and hold the constructor's objects.)
            call_args = args(side) if callable(args) else copy.deepcopy(args)
            call_kwargs = copy.deepcopy(kwargs or {})
            pristine = copy.deepcopy(plain((call_args, call_kwargs)))
            outcomes.append(side.call(getattr(side.collector, method), *call_args,
                                      **call_kwargs))
            if side is ours:
                compare(plain((call_args, call_kwargs)), pristine,
                        f"{label}: ours' arguments after the call")
        going_on = compare_outcomes(label, *outcomes)
        if going_on:
            compare_collectors(ours.collector, theirs.collector, label)
            if outcomes[1][0] is not None:
                built.append((label, outcomes[0][0], outcomes[1][0]))
        return going_on

    def train_args(names, extra):
        return lambda side: (cs.training_views(views[side], names, extra, side.vr),)

    for i, op in enumerate(sc.before_init):
        if not do(f"call {i + 1} (train before init)", "build_for_training",
                  train_args(*op[1:])):
            return 0
    if not do("add_init_obs", "add_init_obs", kwargs=sc.init):
        return 0
    steps = 0
    for i, op in enumerate(sc.ops):
        label = f"call {i + 1} ({op[0]})"
        kind = op[0]
        if kind == "step":
            values = cs.step_values(op[1], theirs.collector, theirs.counter)
            ok = do(label, "add_action_reward_next_obs", (values,))
            steps += ok
        elif kind == "infer":
            ok = do(label, "build_for_inference")
        elif kind == "train":
            ok = do(label, "build_for_training", train_args(*op[1:]))
        elif kind == "is_training":
            ok = do(label, "is_training", (op[1],))
        else:
            raise AssertionError(f"unknown op {op!r}")
        if not ok:
            break
    # Earlier batches must not have changed since (ours may hand out views).
    for label, o, t in built:
        compare_batches(o, t, f"{label}, compared again after all calls")
    return steps


@SETTINGS
@given(sc=cs.scenarios())
def test_collector_matches_rllib(sc):
    steps = run_scenario(sc, ours_classes())
    # pytest --hypothesis-show-statistics shows how the examples went.
    event(f"steps compared: {min(steps, 6)}")
    event(f"recurrent: {sc.ctor.get('is_policy_recurrent', False)}")


# -- without RLlib loaded: plain dicts of the same columns -------------------------

_DICT_MODE = r"""
import pickle, sys
sys.path.insert(0, sys.argv[1])
import collector_strategies as cs
from episode import AgentCollector, ViewRequirement
assert "ray.rllib.policy.sample_batch" not in sys.modules, "RLlib got imported"
runs = {seed: cs.replay(cs.build_scenario(seed), AgentCollector, ViewRequirement)
        for seed in map(int, sys.argv[2:])}
sys.stdout.buffer.write(pickle.dumps(runs))
"""


def test_without_rllib_batches_are_dicts_of_the_same_columns():
    """Scenarios replayed by ours in a process without RLlib give plain dicts
    whose columns ("seq_lens" included) equal RLlib's SampleBatch columns."""
    import pickle
    import subprocess
    import sys

    AC, VR = ours_classes()
    if AC is RllibAC:
        pytest.skip("self-test: no collector of ours to run without RLlib")
    seeds = [str(s) for s in range(60)]
    # Run from the tests folder: from the source tree, `import episode` would
    # find the uncompiled sources instead of the installed package.
    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", _DICT_MODE, tests, *seeds],
                          capture_output=True, timeout=300, cwd=tests)
    assert proc.returncode == 0, proc.stderr.decode()
    ours_runs = pickle.loads(proc.stdout)
    batches = 0
    for seed in map(int, seeds):
        theirs = cs.replay(cs.build_scenario(seed), RllibAC, RllibVR)
        ours = ours_runs[seed]
        assert [label for label, _ in ours] == [label for label, _ in theirs], seed
        for (label, o), (_, t) in zip(ours, theirs):
            where = f"seed {seed}, {label}"
            assert o[0] == t[0], f"{where}: ours {o}, RLlib {t}"
            if t[0] == "raised":
                assert o[1] == t[1], f"{where}: ours raised {o[1]}, RLlib {t[1]}"
                continue
            assert (o[1], t[1]) == ("dict", "SampleBatch"), where
            compare(o[2], t[2], where)
            batches += 1
    assert batches > 100


# -- RLlib's padding rules, pinned with explicit values ------------------------------

@pytest.fixture(params=["rllib", "ours"])
def impl(request):
    """(AgentCollector, ViewRequirement) of RLlib, then of ours."""
    if request.param == "rllib":
        return RllibAC, RllibVR
    return ours_classes()


SCALAR = gym.spaces.Box(-100.0, 100.0, ())
ACTIONS4 = gym.spaces.Discrete(4)


def f32(x):
    return np.array(x, dtype=np.float32)


def i64(x):
    return np.array(x, dtype=np.int64)


def run_three_steps(impl, views, obs=(10.0, 11.0, 12.0, 13.0), infer_first=False, **ctor):
    """A collector through a reset and three steps (actions 1, 2, 3; rewards
    1.5, 2.5, 3.5; the third step ends the episode); its training batch, and
    its inference batch right after the reset when `infer_first`."""
    AC, VR = impl
    views = {name: VR(**kw) for name, kw in views.items()}
    collector = AC(views, **ctor)
    collector.add_init_obs(episode_id=5, agent_index=0, env_id=0, init_obs=obs[0])
    first = collector.build_for_inference() if infer_first else None
    for i in range(3):
        collector.add_action_reward_next_obs({
            "actions": i + 1, "rewards": i + 1.5, "terminateds": i == 2, "truncateds": False,
            "infos": {}, "new_obs": obs[i + 1]})
    return collector.build_for_training(views), first


def test_first_value_repeated_before_the_start(impl):
    batch, _ = run_three_steps(impl, {
        "obs": dict(space=SCALAR),
        "stack": dict(data_col="obs", shift="-2:0", space=SCALAR),
        "actions": dict(space=ACTIONS4, used_for_compute_actions=False),
        "action_before": dict(data_col="actions", shift=-1, space=ACTIONS4),
        "rewards": dict(),
        "reward_before": dict(data_col="rewards", shift=-1),
        "t_two_before": dict(data_col="t", shift=-2),
    })
    compare(batch["obs"], f32([10, 11, 12]))
    compare(batch["stack"], f32([[10, 10, 10], [10, 10, 11], [10, 11, 12]]))
    # Without the "prev_actions"/"prev_rewards" keys nothing is zero-padded:
    # the rows before the start repeat the first action and reward.
    compare(batch["action_before"], i64([1, 1, 2]))
    compare(batch["reward_before"], f32([1.5, 1.5, 2.5]))
    compare(batch["t_two_before"], i64([-1, -1, 0]))


def test_prev_actions_and_prev_rewards_start_with_zeros(impl):
    box2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)
    views = {
        "obs": dict(space=SCALAR),
        "actions": dict(space=ACTIONS4, used_for_compute_actions=False),
        "prev_actions": dict(data_col="actions", shift=-1, space=ACTIONS4),
        "rewards": dict(),
        "prev_rewards": dict(data_col="rewards", shift=-1),
        "two_rewards_back": dict(data_col="rewards", shift=[-2, -1]),
    }
    batch, first = run_three_steps(impl, views, infer_first=True)
    compare(first["prev_actions"], i64([0]))
    compare(first["prev_rewards"], f32([0.0]))
    compare(batch["prev_actions"], i64([0, 1, 2]))
    compare(batch["prev_rewards"], f32([0.0, 1.5, 2.5]))
    compare(batch["two_rewards_back"], f32([[0.0, 0.0], [0.0, 1.5], [1.5, 2.5]]))

    # The zeros take the action space's shape (and float64 comes out float32).
    AC, VR = impl
    views = {"obs": VR(space=SCALAR), "actions": VR(space=box2),
             "prev_actions": VR("actions", shift=-1, space=box2)}
    collector = AC(views)
    collector.add_init_obs(episode_id=5, agent_index=0, env_id=0, init_obs=1.0)
    collector.add_action_reward_next_obs({"actions": np.array([0.5, -0.5]), "rewards": 1.0,
                                          "terminateds": True, "truncateds": False,
                                          "new_obs": 2.0})
    batch = collector.build_for_training(views)
    compare(batch["prev_actions"], f32([[0.0, 0.0]]))
    compare(batch["actions"], f32([[0.5, -0.5]]))


def test_zeros_past_the_end(impl):
    obs = tuple(np.full(2, v, np.float32) for v in (10, 11, 12, 13))
    box2 = gym.spaces.Box(-100.0, 100.0, (2,))
    batch, _ = run_three_steps(impl, {
        "obs": dict(space=box2),
        "new_obs": dict(data_col="obs", shift=1, space=box2, used_for_compute_actions=False),
        "obs_in_two": dict(data_col="obs", shift=2, space=box2, used_for_compute_actions=False),
        "rewards": dict(),
        "rewards_ahead": dict(data_col="rewards", shift=[0, 1],
                              used_for_compute_actions=False),
    }, obs=obs)
    compare(batch["new_obs"], f32([[11, 11], [12, 12], [13, 13]]))
    compare(batch["obs_in_two"], f32([[12, 12], [13, 13], [0, 0]]))
    compare(batch["rewards_ahead"], f32([[1.5, 2.5], [2.5, 3.5], [3.5, 0.0]]))


def test_float64_comes_out_float32_other_dtypes_stay(impl):
    AC, VR = impl
    spaces = {"obs": gym.spaces.Box(-1.0, 1.0, (2,), np.float64)}
    views = {"obs": VR(space=spaces["obs"]), "rewards": VR(), "counts": VR(),
             "logits": VR(), "infos": VR(used_for_compute_actions=False)}
    collector = AC(views)
    collector.add_init_obs(episode_id=5, agent_index=0, env_id=0,
                           init_obs=np.array([0.25, 0.5]), init_infos={"a": 1})
    for i in range(2):
        collector.add_action_reward_next_obs({
            "rewards": float(i), "counts": np.int32(i), "logits": np.float32(i / 4),
            "terminateds": False, "truncateds": False, "infos": {"i": i},
            "new_obs": [0.5 * i, 1.0]})  # a Python list: float64 too
    batch = collector.build_for_training(views)
    compare(batch["obs"], f32([[0.25, 0.5], [0.0, 1.0]]))
    compare(batch["rewards"], f32([0.0, 1.0]))
    compare(batch["counts"], np.array([0, 1], np.int32))
    compare(batch["logits"], f32([0.0, 0.25]))
    expected_infos = np.empty(2, dtype=object)
    expected_infos[:] = [{"a": 1}, {"i": 0}]
    compare(batch["infos"], expected_infos)


def test_one_shift_drops_the_shift_axis_several_keep_it(impl):
    AC, VR = impl
    box3 = gym.spaces.Box(-100.0, 100.0, (3,))
    views = {
        "obs": VR(space=box3),
        "int_shift": VR("obs", shift=-1, space=box3),
        "list_of_one": VR("obs", shift=[-1], space=box3),
        "range_of_one": VR("obs", shift="-1:-1", space=box3),
        "two": VR("obs", shift=[-1, 0], space=box3),
        "every_other": VR("obs", shift=-1, batch_repeat_value=2, space=box3),
    }
    collector = AC(views)
    collector.add_init_obs(episode_id=5, agent_index=0, env_id=0, init_obs=np.zeros(3))
    for i in range(3):
        collector.add_action_reward_next_obs({
            "rewards": 1.0, "terminateds": i == 2, "truncateds": False,
            "new_obs": np.full(3, i + 1.0)})
        inference = collector.build_for_inference()
    assert inference["obs"].shape == (1, 3)
    for name in ("int_shift", "list_of_one", "range_of_one"):
        assert inference[name].shape == (1, 3)
    compare(inference["two"], f32([[[2, 2, 2], [3, 3, 3]]]))
    batch = collector.build_for_training(views)
    for name in ("int_shift", "list_of_one", "range_of_one"):
        compare(batch[name], f32([[0, 0, 0], [0, 0, 0], [1, 1, 1]]))
    compare(batch["two"], f32([[[0] * 3, [0] * 3], [[0] * 3, [1] * 3], [[1] * 3, [2] * 3]]))
    # One row per batch_repeat_value timesteps: t = 0 and t = 2.
    compare(batch["every_other"], f32([[0, 0, 0], [1, 1, 1]]))
    assert batch.count == 3


def test_recurrent_state_rows_and_seq_lens(impl):
    AC, VR = impl
    state = gym.spaces.Box(-1.0, 1.0, (2,))
    views = {"obs": VR(space=SCALAR),
             "state_in_0": VR("state_out_0", shift=-1, batch_repeat_value=2, space=state),
             "state_out_0": VR(space=state)}
    collector = AC(views, max_seq_len=2, is_policy_recurrent=True,
                   intial_states=[np.full(2, 0.5, np.float32)])
    collector.add_init_obs(episode_id=5, agent_index=0, env_id=0, init_obs=0.0)
    compare(collector.build_for_inference()["state_in_0"], f32([[0.5, 0.5]]))
    for i in range(3):
        collector.add_action_reward_next_obs({
            "rewards": 1.0, "terminateds": i == 2, "truncateds": False, "new_obs": i + 1.0,
            "state_out_0": np.full(2, i + 1.0, np.float32)})
    batch = collector.build_for_training(views)
    # The state in at t = 0 (the initial state) and at t = 2 (t = 1's state out).
    compare(batch["state_in_0"], f32([[0.5, 0.5], [2.0, 2.0]]))
    compare(batch["state_out_0"], f32([[1, 1], [2, 2], [3, 3]]))
    compare(batch["seq_lens"], i64([2, 1]))
    assert batch.max_seq_len == 2


def test_continuing_trajectory_keeps_its_last_rows(impl):
    AC, VR = impl
    views = {"obs": VR(space=SCALAR), "stack": VR("obs", shift="-2:0", space=SCALAR),
             "rewards": VR(used_for_compute_actions=False),
             "prev_rewards": VR("rewards", shift=-1), "terminateds": VR(), "truncateds": VR()}
    collector = AC(views)
    collector.add_init_obs(episode_id=5, agent_index=0, env_id=0, init_obs=0.0)
    batches = []
    for i in range(4):
        collector.add_action_reward_next_obs({
            "rewards": i + 0.5, "terminateds": False, "truncateds": False,
            "new_obs": i + 1.0})
        if i % 2:
            batches.append(collector.build_for_training(views))
    first, second = batches
    compare(first["stack"], f32([[0, 0, 0], [0, 0, 1]]))
    compare(second["obs"], f32([2, 3]))
    compare(second["stack"], f32([[0, 1, 2], [1, 2, 3]]))
    compare(second["prev_rewards"], f32([1.5, 2.5]))
    assert collector.is_empty() is False


# -- the inference input, call after call -----------------------------------------------

def _inference_collector(impl, steps, **ctor):
    # A 4-frame stack, prev_actions and prev_rewards, as old-stack samplers
    # ask them (rewards Python floats, actions Python ints).
    AC, VR = impl
    box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    views = {"obs": VR(space=box), "frames": VR("obs", shift="-3:0", space=box),
             "prev_actions": VR("actions", shift=-1, space=gym.spaces.Discrete(2)),
             "prev_rewards": VR("rewards", shift=-1),
             "actions": VR(space=gym.spaces.Discrete(2), used_for_compute_actions=False),
             "rewards": VR(used_for_compute_actions=False)}
    collector = AC(views, **ctor)
    collector.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=np.zeros(4, np.float32))
    for i in range(steps):
        collector.add_action_reward_next_obs({
            "new_obs": np.full(4, i + 1, np.float32), "actions": i % 2, "rewards": i + 0.5,
            "terminateds": False, "truncateds": False})
    return collector


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4, 12])
def test_inference_batches_of_consecutive_calls_equal_rllibs(steps, training):
    """The same collector asked again and again, with steps in between (a
    sampler's rhythm): each batch equals RLlib's (columns and every
    SampleBatch attribute), and stays as it was after the later calls. The
    previous batch is touched (a key read and one added) before each call:
    the attribute comparison with RLlib's fresh batch shows that nothing is
    shared."""
    sides = [_inference_collector(impl, steps, is_training=training)
             for impl in ((RllibAC, RllibVR), ours_classes())]
    made = []
    for call in range(4):
        theirs, ours = (side.build_for_inference() for side in sides)
        compare_batches(ours, theirs, f"call {call}")
        made.append((ours, theirs, copy.deepcopy(batch_columns(ours))))
        ours.accessed_keys.add("touched")
        ours["added"] = np.zeros(1)
        for side in sides:
            side.add_action_reward_next_obs({
                "new_obs": np.full(4, -call, np.float32), "actions": 1, "rewards": 2.0,
                "terminateds": False, "truncateds": False})
    for call, (ours, theirs, columns) in enumerate(made):
        del ours["added"]
        compare(batch_columns(ours), columns, f"call {call}, after the later calls")


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("steps", [1, 2, 12])
def test_zero_rows_before_python_numbers_leave_the_tracks_typed(steps, training):
    """prev_rewards / prev_actions start from zeros of their spaces (numpy
    values) before the steps' Python numbers, a mix that would put the tracks
    on the object path, where every build converts the whole trajectory.
    Written as Python zeros (np.array of each track unchanged), they leave
    the tracks typed from the first step on, in both modes: the compiled
    gather reads them."""
    collector = _inference_collector(ours_classes(), steps, is_training=training)
    for key in ("rewards", "actions", "obs"):
        assert all(track.is_typed for track in collector.buffers[key]), key
    if training:  # (inference has dropped the zero rows by now)
        assert collector.buffers["rewards"][0].to_list()[:4] == [0.0] * 4


def _rewards_run(impl, rewards, actions, train_after=()):
    # A training-mode collector whose steps bring the given rewards and
    # actions, with a view reaching back into the zero rows (reward_stack):
    # the collector, its inference batch after each step, and its training
    # batches (of a trajectory that goes on: the last rows are kept) after
    # the steps in `train_after`.
    AC, VR = impl
    box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    views = {"obs": VR(space=box), "frames": VR("obs", shift="-3:0", space=box),
             "prev_actions": VR("actions", shift=-1, space=gym.spaces.Discrete(2)),
             "prev_rewards": VR("rewards", shift=-1),
             "reward_stack": VR("rewards", shift="-3:0"),
             "actions": VR(space=gym.spaces.Discrete(2), used_for_compute_actions=False),
             "rewards": VR(used_for_compute_actions=False)}
    collector = AC(views)
    collector.add_init_obs(episode_id=1, agent_index=0, env_id=0,
                           init_obs=np.zeros(4, np.float32))
    inference, training = [], []
    for i, (reward, action) in enumerate(zip(rewards, actions)):
        collector.add_action_reward_next_obs({
            "new_obs": np.full(4, i + 1, np.float32), "actions": action, "rewards": reward,
            "terminateds": False, "truncateds": False})
        inference.append(collector.build_for_inference())
        if i in train_after:
            training.append(collector.build_for_training(views))
    return collector, inference, training


def _both(*args):
    return [_rewards_run(impl, *args) for impl in ((RllibAC, RllibVR), ours_classes())]


@pytest.mark.parametrize("odd", [np.float32(2.5), None, "x"])
@pytest.mark.parametrize("train_after", [(), (0,), (1,)])
def test_a_row_of_another_kind_brings_back_the_zero_rows_as_they_were(odd, train_after):
    """A reward of another kind after Python floats (a numpy float32, None, a
    string) puts the rewards track on the object path again; np.array of it
    must see RLlib's rows there, numpy zeros included (an object array keeps
    them as they are: reward_stack reaches them), also after a training
    batch kept only the last rows."""
    (_, theirs, theirs_training), (collector, ours, ours_training) = _both(
        [0.5, 1.5, odd, 3.5, 4.5], [0, 1, 1, 0, 1], train_after)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        compare_batches(o, t, f"inference batch {i}")
    for i, (o, t) in enumerate(zip(ours_training, theirs_training)):
        compare_batches(o, t, f"training batch {i}")
    assert collector.buffers["actions"][0].is_typed
    assert not collector.buffers["rewards"][0].is_typed


def test_zero_rows_stay_where_the_steps_dtype_is_another():
    """np.int32 actions after Discrete's int64 zeros: np.array of the track
    is int64 where the actions alone are int32, so the zeros are not written
    over (the track stays on the object path) and the batches stay RLlib's."""
    actions = [np.int32(a) for a in (1, 0, 1, 1)]
    (theirs_c, theirs, _), (collector, ours, _) = _both([0.5, 1.5, 2.5, 3.5], actions)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        compare_batches(o, t, f"inference batch {i}")
    assert collector.buffers["rewards"][0].is_typed
    assert not collector.buffers["actions"][0].is_typed
    views = collector.view_requirements
    compare_batches(collector.build_for_training(views),
                    theirs_c.build_for_training(theirs_c.view_requirements), "training batch")


def test_inference_follows_replaced_tracks_and_views():
    """Tracks swapped in collector.buffers, a view added to the requirements
    or a switch to training mode: the next batch reads what is there now."""
    AC, VR = ours_classes()
    collector = _inference_collector((AC, VR), 5, is_training=False)
    first = collector.build_for_inference()
    replaced = copy.deepcopy(collector.buffers["obs"])
    replaced[0].append(np.full(4, 9, np.float32))
    replaced[0].pop(0)
    collector.buffers["obs"] = replaced
    compare(collector.build_for_inference()["obs"], f32([[9, 9, 9, 9]]))
    collector.view_requirements["prev_obs"] = VR("obs", shift=-1,
                                                 space=gym.spaces.Box(-1, 1, (4,)))
    batch = collector.build_for_inference()
    compare(batch["prev_obs"], first["obs"])
    collector.is_training(True)
    assert collector.build_for_inference().is_training is True


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_collectors_pickle_and_copy_after_inference(how):
    """As RLlib's: a collector that has built inference inputs pickles and
    copies, and the copy goes on giving RLlib's batches."""
    import pickle

    sides = [_inference_collector(impl, 6, is_training=False)
             for impl in ((RllibAC, RllibVR), ours_classes())]
    for side in sides:
        side.build_for_inference()
    copies = [pickle.loads(pickle.dumps(side)) if how == "pickle" else copy.deepcopy(side)
              for side in sides]
    for collector in copies:
        collector.add_action_reward_next_obs({
            "new_obs": np.full(4, 7, np.float32), "actions": 1, "rewards": 2.0,
            "terminateds": False, "truncateds": False})
    theirs, ours = (c.build_for_inference() for c in copies)
    compare_batches(ours, theirs, f"after {how}")
