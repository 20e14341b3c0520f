"""What the Minari tests share: datasets written through Minari's own API
(imported only when one is written, so that the tests of our readers alone
need no minari)."""
import json
import os
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np

from children import child_env, limit_child

F32 = np.float32
HERE = os.path.dirname(os.path.abspath(__file__))


def _strings(r, n):
    """n + 1 strings of 1 to 6 letters of "abcdef", and n actions of Discrete(2)."""
    return (["".join(r.choice(list("abcdef"), r.integers(1, 7))) for _ in range(n + 1)],
            r.integers(0, 2, n))


# Minari datasets of the tests (each test names the ones it writes).
CASES = {
    # name: (observation space, action space, make(rng, n) -> (obs, actions, infos)).
    "cartpole": (
        gym.spaces.Box(-np.inf, np.inf, (4,), F32), gym.spaces.Discrete(2),
        lambda r, n: (r.standard_normal((n + 1, 4)).astype(F32), r.integers(0, 2, n), None)),
    "box_actions_infos": (
        gym.spaces.Box(-1, 1, (3,), np.float64), gym.spaces.Box(-2, 2, (2,), F32),
        lambda r, n: (r.uniform(-1, 1, (n + 1, 3)), r.uniform(-2, 2, (n, 2)).astype(F32),
                      {"x": list(r.standard_normal(n + 1)), "arr": r.standard_normal((n + 1, 2, 2)),
                       "flag": [bool(b) for b in r.integers(0, 2, n + 1)]})),
    "box_2d_infos": (
        gym.spaces.Box(-1, 1, (2, 3), np.float64), gym.spaces.Box(-2, 2, (), F32),
        lambda r, n: (r.uniform(-1, 1, (n + 1, 2, 3)), r.uniform(-2, 2, n).astype(F32),
                      {"x": list(r.standard_normal(n + 1)), "arr": r.standard_normal((n + 1, 2, 2)),
                       "flag": [bool(b) for b in r.integers(0, 2, n + 1)],
                       "nested": {"i": list(r.integers(0, 9, n + 1))}})),
    "dict_tuple": (
        gym.spaces.Dict({"pos": gym.spaces.Box(-5, 5, (2,), F32),
                         "pair": gym.spaces.Tuple([gym.spaces.Discrete(3),
                                                   gym.spaces.MultiBinary(2)])}),
        gym.spaces.Tuple([gym.spaces.Discrete(4), gym.spaces.MultiDiscrete([2, 5])]),
        lambda r, n: ({"pos": r.uniform(-5, 5, (n + 1, 2)).astype(F32),
                       "pair": (r.integers(0, 3, n + 1),
                                r.integers(0, 2, (n + 1, 2)).astype(np.int8))},
                      (r.integers(0, 4, n), r.integers(0, [2, 5], (n, 2))),
                      {"lives": list(r.integers(0, 3, n + 1))})),
    "small_ints": (
        gym.spaces.Box(0, 200, (3,), np.uint8), gym.spaces.Discrete(3, start=-1, dtype=np.int32),
        lambda r, n: (r.integers(0, 201, (n + 1, 3)).astype(np.uint8),
                      r.integers(-1, 2, n).astype(np.int32), None)),
    "image": (
        gym.spaces.Box(0, 255, (40, 32, 3), np.uint8), gym.spaces.Discrete(6),
        lambda r, n: (r.integers(0, 256, (n + 1, 40, 32, 3), dtype=np.uint8),
                      r.integers(0, 6, n), None)),
    "text": (
        gym.spaces.Text(6, charset="abcdef"), gym.spaces.Discrete(2),
        lambda r, n: (*_strings(r, n), None)),
    "text_infos": (
        gym.spaces.Text(6, charset="abcdef"), gym.spaces.Discrete(2),
        lambda r, n: (*_strings(r, n), {"s": ["ab"] * (n + 1)})),
}


def quiet_create(*args, **kwargs):
    """minari.create_dataset_from_buffers(), without its warning for every
    metadata field left out."""
    import minari

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return minari.create_dataset_from_buffers(*args, **kwargs)


def done_flags(n: int, end: bool) -> np.ndarray:
    """An episode's n terminations (or truncations): the last one `end`."""
    out = np.zeros(n, bool)
    if n and end:
        out[-1] = True
    return out


def episode_buffers(case: str, lengths, seed: int = 0):
    """(observation space, action space, Minari EpisodeBuffers) of CASES[case]:
    one episode of each length, drawn from `seed`, ending terminated and
    truncated in turn."""
    from minari.data_collector import EpisodeBuffer

    obs_space, act_space, make = CASES[case]
    r = np.random.default_rng(seed)
    buffers = []
    for k, n in enumerate(lengths):
        obs, actions, infos = make(r, n)
        buffers.append(EpisodeBuffer(observations=obs, actions=actions,
                                     rewards=list(r.standard_normal(n)),
                                     terminations=done_flags(n, k % 2 == 0),
                                     truncations=done_flags(n, k % 2 == 1), infos=infos))
    return obs_space, act_space, buffers


# What every child does after its script: frees the script's objects (ours
# among them) while pyarrow and h5py are whole, says DONE, and leaves without
# the interpreter's teardown. Past that point only pyarrow's own teardown
# would run, and after a damaged file its thread pool can abort at exit now
# and then (std::terminate on a joinable thread, apache/arrow#34314): not
# what these children test.
_CHILD_END = """
import gc as _gc, os as _os
for _name in [n for n in globals() if not n.startswith("_")]:
    del globals()[_name]
_gc.collect()
print("DONE", flush=True)
_os._exit(0)
"""


def run_child(script: str, arg, timeout: float) -> str:
    """The output of `script` run in a crash-test child (``python -c script
    json(arg)``), which must run to its end (then it prints "DONE" and
    exits 0): else the test fails with the end of its output. The child
    runs in tests/ (from the checkout's root the source folder would shadow
    the installed package)."""
    proc = subprocess.run([sys.executable, "-c", script + _CHILD_END, json.dumps(arg)],
                          env=child_env(),
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit_child, cwd=HERE)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("DONE"), (
        f"the child crashed (exit {proc.returncode}) after:\n{proc.stdout[-2000:]}\n"
        f"{proc.stderr[-3000:]}")
    return proc.stdout


def case_results(script: str, cases, timeout: float) -> dict:
    """{case name: result} from a child `script` (run_child) given `cases`,
    that prints "CASE name" and then "RESULT result" for each case."""
    results, name = {}, None
    for line in run_child(script, cases, timeout).splitlines():
        if line.startswith("CASE "):
            name = line[5:]
        elif line.startswith("RESULT "):
            results[name] = line[7:]
    return results
