"""Scenarios for the AgentCollector differential test (and a hypothesis
strategy of them).

A `Scenario` is everything one example feeds to a collector: the view
requirements (as keyword dicts, so that each implementation builds its own
ViewRequirement objects), the constructor arguments, the `add_init_obs` call
and the calls that follow it. Everything in a scenario, values
included, comes from one seed (`build_scenario(seed)` rebuilds it), so one
scenario drives both implementations with equal inputs.

The scenarios stay inside what RLlib 2.60's collector handles without crashing
internally; the inputs it crashes on are listed in INTERNAL_CRASHES and kept out.
"""
from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any, Dict, List, Tuple

import gymnasium as gym
import numpy as np
from hypothesis import strategies as st

# Inputs on which RLlib's collector (or its ViewRequirement) crashes internally,
# each kept out of the scenarios below (input: RLlib's exception).
INTERNAL_CRASHES = {
    'a range shift starting at 0 ("0:2"); a tuple or numpy-int shift':
        "AttributeError: 'ViewRequirement' object has no attribute 'shift_arr' "
        "(a falsy range start, and other shift types, set no shift_arr)",
    'an empty shift ([] or "-1:-3")':
        "ValueError: min() arg is an empty sequence (constructor)",
    '"prev_actions" / "prev_rewards" views without an "actions" / "rewards" view':
        "KeyError: 'actions' / 'rewards' (add_init_obs)",
    "a state_out_<i> step value without a state_out_<i> view (training)":
        "KeyError: 'state_out_0' (add_action_reward_next_obs)",
    "fewer intial_states than state_out_<i> columns":
        "IndexError: list index out of range (_fill_buffer_with_initial_values)",
    "_enable_new_api_stack=True with old-style state_out_<i> columns":
        "ValueError: inhomogeneous shape (SampleBatch of the whole initial-state list)",
    "build_for_inference() before add_init_obs()":
        "IndexError: list index out of range (_prepare_for_data_cols_with_dummy_values)",
    "add_action_reward_next_obs() before add_init_obs()": "KeyError: 't'",
    "not training, and a buffered column some step leaves out (agent_index / "
    "env_id missing from the values, a compute-actions view on a column no "
    "step adds)":
        "IndexError: list index out of range (_to_float_np_array; with torch "
        "missing: index -1 is out of bounds) in build_for_inference, as every "
        "step pops each column's oldest row",
    "an observation (or action) whose dm-tree structure differs from the first "
    "one's (a list inside a Dict after an array, a Python list action)":
        "leaves silently dropped or misplaced, then ValueError: inhomogeneous "
        "shape in build_for_training",
}

# -- spaces ----------------------------------------------------------------------

SHAPES = [(), (3,), (2, 2)]
DICT_KEYS = ["pos", "a", "vel", "b", "img"]


def leaf_space(r: random.Random):
    kind = r.randrange(5)
    if kind == 0:
        return gym.spaces.Box(-2.0, 2.0, r.choice(SHAPES), r.choice([np.float32, np.float64]))
    if kind == 1:
        return gym.spaces.Box(-5, 5, r.choice(SHAPES), r.choice([np.int64, np.int32]))
    if kind == 2:
        return gym.spaces.Discrete(r.randint(2, 5))
    if kind == 3:
        return gym.spaces.MultiDiscrete(np.array(r.choice([(2, 3), (4,), ((2, 2), (3, 3))])))
    return gym.spaces.MultiBinary(r.choice([3, (2, 2)]))


def random_space(r: random.Random, depth: int = 0):
    """Every space kind: Box (float32/float64/int, shapes () (3,) (2,2)),
    Discrete, MultiDiscrete, MultiBinary, and Dict/Tuple of those, nested."""
    if depth >= 2 or r.random() < 0.55:
        return leaf_space(r)
    n = r.randint(1, 3)
    if r.random() < 0.5:
        return gym.spaces.Tuple([random_space(r, depth + 1) for _ in range(n)])
    keys = r.sample(DICT_KEYS, n)
    return gym.spaces.Dict({k: random_space(r, depth + 1) for k in keys})


def pythonize(value, lists=True, list_leaves=False, top=True):
    """`value` as an env written in plain Python might hand it out: numpy
    scalars as Python numbers, arrays as (nested) lists at the top (`lists`)
    and, with `list_leaves`, inside Dicts/Tuples too."""
    if isinstance(value, dict):
        return {k: pythonize(v, lists, list_leaves, False) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(pythonize(v, lists, list_leaves, False) for v in value)
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return value.item()
        return value.tolist() if (lists and (top or list_leaves)) else value
    if isinstance(value, np.generic):
        return value.item()
    return value


def shuffle_keys(value, rng: random.Random):
    """`value` with the keys of each of its dicts in a random order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffle_keys(value[k], rng) for k in keys}
    if isinstance(value, tuple):
        return tuple(shuffle_keys(v, rng) for v in value)
    return value


# -- shifts ----------------------------------------------------------------------

def random_shift(r: random.Random, lo: int = -4, hi: int = 3):
    """One of every shift form within [lo, hi]: an int, a list of ints, "a:b"
    and "a:b:step" range strings, up or down (never starting at 0, never
    empty: RLlib crashes on both)."""
    kind = r.randrange(5)
    if kind == 0:
        return r.randint(lo, hi)
    if kind == 1:
        return [r.randint(lo, hi) for _ in range(r.randint(1, 4))]
    a = r.choice([x for x in range(lo, hi + 1) if x])
    if kind == 2:
        return f"{a}:{min(a + r.randint(0, 4), hi)}"
    if kind == 3:
        return f"{a}:{min(a + r.randint(0, 4), hi)}:{r.randint(1, 3)}"
    # Counting down: "a:b:-s" is arange(a, b + 1, -s).
    a = r.choice([x for x in range(lo + 2, hi + 1) if x])
    b = a - 1 - r.randint(1, 2)
    return f"{a}:{b}:{-r.randint(1, 2)}"


def shift_values(shift) -> np.ndarray:
    """The offsets a shift stands for (RLlib's rule)."""
    if isinstance(shift, str):
        parts = [int(p) for p in shift.split(":")]
        step = parts[2] if len(parts) == 3 else 1
        return np.arange(parts[0], parts[1] + 1, step)
    return np.array([shift] if isinstance(shift, int) else shift)


# -- scenarios --------------------------------------------------------------------

# Extra model outputs a policy hands back with each action: name -> space.
EXTRAS = {
    "action_logp": gym.spaces.Box(-np.inf, np.inf, (), np.float32),
    "vf_preds": gym.spaces.Box(-np.inf, np.inf, (), np.float32),
    "action_prob": gym.spaces.Box(0.0, 1.0, (), np.float32),
    "action_dist_inputs": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
}
# Columns only postprocessing writes: no step ever adds them.
POSTPROCESSED = ["advantages", "value_targets"]
# Columns add_init_obs starts (next to obs and infos).
META = ["t", "eps_id", "env_id", "agent_index", "unroll_id"]


@dataclasses.dataclass
class Scenario:
    """One example. `views` maps view names to ViewRequirement keyword dicts.
    `ops` are the calls after add_init_obs(**init): ("step", values),
    ("infer",), ("train", view names or None for all of the constructor's,
    keyword dicts of views of its own) and ("is_training", flag);
    `before_init` are build_for_training calls before it."""

    obs_space: Any
    act_space: Any
    views: Dict[str, Dict[str, Any]]
    ctor: Dict[str, Any]
    init: Dict[str, Any]
    ops: List[Tuple]
    before_init: List[Tuple]
    unroll_start: int
    seed: int

    def make_views(self, vr_class) -> Dict[str, Any]:
        return {name: vr_class(**copy.deepcopy(kw)) for name, kw in self.views.items()}

    def __repr__(self) -> str:
        lines = [f"Scenario(seed={self.seed},", f"  obs_space={self.obs_space!r},",
                 f"  act_space={self.act_space!r},", "  views={"]
        for name, kw in self.views.items():
            args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
            lines.append(f"    {name!r}: ViewRequirement({args}),")
        lines += ["  },", f"  AgentCollector(views, **{self.ctor!r}),",
                  f"  _next_unroll_id={self.unroll_start},"]
        for op in self.before_init:
            lines.append(f"  before init: {op!r},")
        lines.append(f"  add_init_obs(**{self.init!r}),")
        for op in self.ops:
            lines.append(f"  {op!r},")
        lines.append(")")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle):
        # Hypothesis prints a failing example with this.
        printer.text(repr(self))


def _sampler(space, seed):
    space = copy.deepcopy(space)
    space.seed(seed)
    return space


def _space_for(col, obs_space, act_space, state_spaces):
    if col == "obs":
        return obs_space
    if col == "actions":
        return act_space
    if col in EXTRAS:
        return EXTRAS[col]
    if col in state_spaces:
        return state_spaces[col]
    return None


def build_scenario(seed: int) -> Scenario:
    """The scenario of `seed` (all its choices and values come from it)."""
    r = random.Random(seed)
    rng = np.random.default_rng(seed)

    def chance(p):
        return r.random() < p

    obs_space = random_space(r)
    act_space = random_space(r)

    # Whether the collector ever runs not training (then each step must refill
    # every buffered column: RLlib pops the oldest row of each after a step).
    mode = r.choice(["train", "train", "infer", "toggle"])
    always_training = mode == "train"
    max_seq_len = r.randint(1, 4)

    # Recurrent state columns, as Policy's model view requirements make them.
    recurrent = chance(0.35)
    n_states = r.choice([0, 1, 1, 2]) if recurrent else 0
    # Rarely: state columns without a recurrent policy (RLlib's ValueError).
    if not recurrent and chance(0.03):
        n_states = 1
    # The old collector under the new API stack keeps an RLModule's state as
    # one column "state_out" of dicts (flattened like other columns), starting
    # from the initial state dict.
    new_api_stack = chance(0.1)

    def initial_state():
        shape = r.choice([(2,), (3,), (2, 2)])
        dtype = r.choice([np.float32, np.float32, np.float64])
        state = (np.zeros(shape, dtype) if chance(0.5)
                 else rng.uniform(-1, 1, shape).astype(dtype))
        return state, gym.spaces.Box(-1.0, 1.0, shape, dtype)

    initial_states, state_spaces = [], {}
    if new_api_stack and n_states:
        h, c = initial_state(), initial_state()
        initial_states = {"h": h[0], "c": c[0]}
        state_spaces["state_out"] = gym.spaces.Dict({"h": h[1], "c": c[1]})
    else:
        for i in range(n_states):
            state, space = initial_state()
            initial_states.append(state)
            state_spaces[f"state_out_{i}"] = space

    # The values each step adds (one key set for the whole episode).
    extras = r.sample(sorted(EXTRAS), r.randint(0, 3))
    with_t = chance(0.75)
    with_ids = (not always_training) or chance(0.8)
    with_agent_id = chance(0.2)
    with_eps_id = chance(0.15)
    with_unroll_id = chance(0.1)

    data_cols = (["obs", "actions", "rewards", "terminateds", "truncateds", "infos"]
                 + META + extras + list(state_spaces))
    if always_training:
        data_cols += POSTPROCESSED

    def flags(shift):
        positive = bool(np.any(shift_values(shift) > 0))
        # Rarely a future shift used for compute actions (RLlib's ValueError).
        ufca = chance(0.03) if positive else chance(0.7)
        kw = {}
        if not ufca:
            kw["used_for_compute_actions"] = False
        if chance(0.2):
            kw["used_for_training"] = False
        return kw

    views: Dict[str, Dict[str, Any]] = {}
    # "obs": a plain view or a frame stack.
    obs_shift = r.choice([0, 0, 0, "-3:0", [-1, 0], "-2:0", -1, [-3, -2, -1, 0], "-4:0:2"])
    views["obs"] = dict(space=obs_space, shift=obs_shift, **flags(obs_shift))

    def maybe(name, p=0.6, **kw):
        if chance(p):
            if chance(0.5) and "data_col" not in kw:
                kw["data_col"] = name
            views[name] = kw

    maybe("new_obs", data_col="obs", shift=1, space=obs_space, **flags(1))
    maybe("actions", space=act_space, used_for_compute_actions=False)
    if "actions" in views:
        maybe("prev_actions", data_col="actions", shift=-1, space=act_space)
    maybe("rewards")
    if "rewards" in views:
        maybe("prev_rewards", data_col="rewards", shift=-1)
    for name in ["terminateds", "truncateds", "eps_id", "unroll_id", "agent_index", "t",
                 "env_id"]:
        maybe(name, p=0.4)
    maybe("infos", p=0.4, used_for_compute_actions=False)
    for name in extras:
        maybe(name, space=EXTRAS[name], used_for_compute_actions=False)
    if always_training:
        for name in POSTPROCESSED:
            if chance(0.3):
                # A space that is a value, not a Space: RLlib pads with it.
                space = np.float32(0.5) if chance(0.25) else None
                views[name] = dict(space=space, **flags(0))
    for col in state_spaces:
        views[col.replace("out", "in")] = dict(data_col=col, shift=-1,
                                               batch_repeat_value=max_seq_len,
                                               space=state_spaces[col])
        views[col] = dict(space=state_spaces[col], used_for_training=True)

    # Custom views: any data column, any shift form.
    for i in range(r.choice([0, 1, 1, 2, 2, 3])):
        col = r.choice(data_cols)
        shift = random_shift(r, -4 if col in ("obs", "infos") else -3, 3)
        kw = dict(data_col=col, shift=shift, **flags(shift))
        space = _space_for(col, obs_space, act_space, state_spaces)
        if space is not None:
            kw["space"] = space
        if chance(0.12):
            kw["batch_repeat_value"] = r.randint(2, 3)
        if chance(0.1):
            kw["index"] = r.randint(-2, 2)
        views[f"v{i}_{col}"] = kw

    # A random view order (it is the order of the built batch's columns).
    order = list(views)
    if chance(0.7):
        r.shuffle(order)
    views = {name: views[name] for name in order}

    ctor = {}
    if max_seq_len != 1 or chance(0.5):
        ctor["max_seq_len"] = max_seq_len
    flatten_off = chance(0.5)
    if not flatten_off or chance(0.5):
        ctor["disable_action_flattening"] = flatten_off
    if initial_states or chance(0.25):
        ctor["intial_states"] = initial_states
    if recurrent or chance(0.5):
        ctor["is_policy_recurrent"] = recurrent
    training = mode != "infer"
    if not training or chance(0.5):
        ctor["is_training"] = training
    if new_api_stack:
        ctor["_enable_new_api_stack"] = True

    # Values: how an env and a policy hand them out.
    obs_sampler = _sampler(obs_space, seed)
    act_sampler = _sampler(act_space, seed + 1)
    python_obs = r.choice([0.0, 0.0, 0.5, 1.0])
    # Lists inside a Dict/Tuple are dm-tree nodes, not leaves: such an
    # observation has other leaves than the space's, so every one must be
    # written that way (RLlib keeps the first one's structure).
    list_leaves = chance(0.08)
    if list_leaves:
        python_obs = 1.0
    shuffled = chance(0.2)
    python_actions = r.choice([0.0, 0.0, 0.5])
    reward_forms = r.sample(["float", "f32", "f64", "int"], r.randint(1, 2))

    def observation():
        value = obs_sampler.sample()
        if chance(python_obs):
            value = pythonize(value, lists=True, list_leaves=list_leaves)
        if shuffled:
            value = shuffle_keys(value, r)
        return value

    def action():
        value = act_sampler.sample()
        if chance(python_actions):
            value = pythonize(value, lists=False)
        return value

    def reward():
        x = round(float(rng.normal()), 3)
        return {"float": x, "f32": np.float32(x), "f64": np.float64(x),
                "int": int(x * 10)}[r.choice(reward_forms)]

    def infos(i):
        return r.choice([{}, {"step": i}, {"x": np.float32(i / 2), "ok": bool(i % 2)}])

    def extra(name):
        if name == "action_dist_inputs":
            return rng.uniform(-1, 1, 2).astype(np.float32)
        x = round(float(rng.uniform(0, 1)), 3)
        return x if name == "action_prob" and chance(0.5) else np.float32(x)

    episode_id = r.choice([r.randint(0, 5), r.getrandbits(62)])
    env_id = r.randint(0, 3)
    if chance(0.2):
        env_id = np.int64(env_id)
    agent_index = r.choice([0, 0, 1, 3, 0.0])
    init = dict(episode_id=episode_id, agent_index=agent_index, env_id=env_id,
                init_obs=observation())
    info_form = r.randrange(4)
    if info_form:
        init["init_infos"] = [None, {}, {"start": True}][info_form - 1]
    t0 = r.choice([None, None, -1, 0])
    if t0 is not None:
        init["t"] = t0
    t = -1 if t0 is None else t0

    n_steps = r.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15])
    ends = n_steps > 0 and chance(0.5)
    p_infer = r.choice([0.0, 0.5, 1.0])
    p_train = r.choice([0.0, 0.2, 0.4])
    # Rarely a deliberate error in a step: a wrong eps_id / unroll_id, an "obs" key.
    wrong_eps_at = r.randrange(40) if with_eps_id else None
    wrong_unroll_at = r.randrange(40) if with_unroll_id else None
    obs_key_at = r.randrange(300)
    shuffle_values = chance(0.25)

    view_names = list(views)

    def between():
        ops = []
        if mode == "toggle" and chance(0.25):
            ops.append(("is_training", chance(0.5)))
        if chance(p_infer):
            ops.append(("infer",))
        if chance(p_train):
            ops.append(("train", *train_views()))
        return ops

    # The rows kept in front of the trajectory (RLlib's shift_before): a view
    # given only to build_for_training must not reach further back.
    shift_before = -min(
        min(shift_values(kw.get("shift", 0))) - int((kw.get("data_col") or name) in ("obs", "infos"))
        for name, kw in views.items())

    def train_views():
        """build_for_training's views: None (the constructor's dict itself),
        else the names of some of them, plus views of its own (a column only
        postprocessing adds, or any column within the rows kept in front)."""
        if chance(0.7):
            return (None, {})
        names = r.sample(view_names, r.randint(0, len(view_names))) if chance(0.7) else None
        extra = {}
        for i in range(r.randint(0, 2)):
            col = r.choice(data_cols + POSTPROCESSED)
            lo = -shift_before + (1 if col in ("obs", "infos") else 0)
            shift = random_shift(r, lo, 3) if lo < 0 else r.randint(max(lo, 0), 3)
            kw = dict(data_col=col, shift=shift)
            space = _space_for(col, obs_space, act_space, state_spaces)
            if space is not None:
                kw["space"] = space
            if chance(0.15):
                kw["batch_repeat_value"] = r.randint(2, 3)
            extra[f"x{i}_{col}"] = kw
        return (names, extra)

    before_init = [("train", None, {})] if chance(0.04) else []
    ops: List[Tuple] = between()
    for i in range(n_steps):
        t += 1
        last = ends and i == n_steps - 1
        terminated = last and chance(0.6)
        truncated = last and (not terminated or chance(0.2))
        bool_form = np.bool_ if chance(0.3) else bool
        values = {}
        if with_t:
            values["t"] = t
        if with_ids:
            values["env_id"] = env_id
            values["agent_index"] = agent_index
        values["rewards"] = reward()
        values["terminateds"] = bool_form(terminated)
        values["truncateds"] = bool_form(truncated)
        values["infos"] = infos(i)
        values["new_obs"] = observation()
        values["actions"] = action()
        for j, col in enumerate(state_spaces):
            if isinstance(initial_states, dict):
                values[col] = {k: rng.uniform(-1, 1, v.shape).astype(v.dtype)
                               for k, v in initial_states.items()}
            else:
                state = initial_states[j]
                values[col] = rng.uniform(-1, 1, state.shape).astype(state.dtype)
        for name in extras:
            values[name] = extra(name)
        if with_agent_id:
            values["agent_id"] = "agent0"
        if with_eps_id:
            values["eps_id"] = episode_id + (1 if wrong_eps_at == i else 0)
        if with_unroll_id:
            # Resolved by the driver to the collector's current unroll id (+1: wrong).
            values["unroll_id"] = ("current", 1 if wrong_unroll_at == i else 0)
        if obs_key_at == i:
            values["obs"] = values["new_obs"]
        if shuffle_values:
            keys = list(values)
            r.shuffle(keys)
            values = {k: values[k] for k in keys}
        ops.append(("step", values))
        ops += between()
    # The rollout's end: one more build (several when the episode goes on).
    if chance(0.9):
        ops.append(("train", None, {}))
    if chance(0.2):
        ops += [("infer",), ("train", *train_views())]
    return Scenario(obs_space=obs_space, act_space=act_space, views=views, ctor=ctor,
                    init=init, ops=ops, before_init=before_init,
                    unroll_start=r.randint(0, 1000), seed=seed)


def scenarios():
    """Scenarios from hypothesis-drawn seeds (feature odds come from the seed's
    own stream: hypothesis' draws lean hard towards 0 and repeat earlier
    choices, which made rare cases common and common ones rare)."""
    return st.integers(0, 2 ** 32 - 1).map(build_scenario)


# -- helpers for the drivers ------------------------------------------------------

def step_values(values: dict, collector, next_unroll_id: int) -> dict:
    """A step's values with the ("current", offset) unroll id marker replaced
    by the id `collector` holds (or draws next) plus the offset."""
    marker = values.get("unroll_id")
    if not isinstance(marker, tuple):
        return values
    current = collector.unroll_id
    return dict(values, unroll_id=(next_unroll_id if current is None else current) + marker[1])


def training_views(views: dict, names, extra: dict, vr_class) -> dict:
    """build_for_training's argument: `views` itself (the constructor's dict,
    as a Policy passes it) or some of its requirements, plus views of its own."""
    if names is None and not extra:
        return views
    chosen = views if names is None else {n: views[n] for n in names}
    return {**chosen, **{n: vr_class(**copy.deepcopy(kw)) for n, kw in extra.items()}}


def replay(sc: Scenario, collector_class, vr_class) -> list:
    """`sc` on one implementation alone: (call, outcome) pairs, the outcome
    being ("batch", type name, columns as a plain dict) or ("raised", the
    exception's class name); it stops at the first exception."""
    collector_class._next_unroll_id = sc.unroll_start
    views = sc.make_views(vr_class)
    collector = collector_class(views, **copy.deepcopy(sc.ctor))
    out = []

    def call(label, method, *args, **kwargs):
        try:
            result = getattr(collector, method)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except Exception as exc:  # noqa: BLE001 - recorded by class
            out.append((label, ("raised", type(exc).__name__)))
            return False
        if result is not None:
            out.append((label, ("batch", type(result).__name__,
                                {k: dict.__getitem__(result, k) for k in dict.keys(result)})))
        return True

    def train(label, names, extra):
        return call(label, "build_for_training", training_views(views, names, extra, vr_class))

    for i, op in enumerate(sc.before_init):
        if not train(f"call {i + 1} (train before init)", *op[1:]):
            return out
    if not call("add_init_obs", "add_init_obs", **sc.init):
        return out
    for i, op in enumerate(sc.ops):
        label = f"call {i + 1} ({op[0]})"
        if op[0] == "step":
            values = step_values(op[1], collector, collector_class._next_unroll_id)
            ok = call(label, "add_action_reward_next_obs", values)
        elif op[0] == "infer":
            ok = call(label, "build_for_inference")
        elif op[0] == "train":
            ok = train(label, *op[1:])
        else:
            ok = call(label, "is_training", op[1])
        if not ok:
            break
    return out
