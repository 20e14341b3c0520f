"""Garbage in, a Python exception out: never a crash, never memory nobody wrote.

Every public entry of InfiniteLookbackBuffer and SingleAgentEpisode, and the
private Column that pickles reach, gets inputs of the wrong type, size and
shape (see tests/garbage.py for the cases). The cases run in child
processes, with Python's debug allocator so that heap overflows abort
instead of passing unseen. A test here fails when its case

* crashed the child (a signal, an abort, a hang: a case that runs over
  garbage.CASE_SECONDS among others runs again alone, and hangs only if it
  runs over garbage.ALONE_SECONDS there too), or
* raised SystemError or a non-Exception, or an exception other than the
  one expected, or
* returned data holding values that were never written (heap bytes), or
  other than the expected value (numpy's, where the case names one), or
* was rejected but changed the stored data anyway.

A child process imports everything once and runs the cases of its batch in
forks of itself; a case that fails or crashes runs again in a fork of its
own, so that a crash is pinned on the case that caused it at the cost of a
fork, not of a new interpreter.

The tests marked `rllib` run the same cases on RLlib's classes in this
process and compare each step: the same exception class, or the same value.
"""

from __future__ import annotations

import base64
import os
import pickle
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import garbage
from children import child_env, limit_child
from difftools import compare

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "garbage.py")
BATCH = 400  # cases per child
WORKERS = 2
CHILD_SECONDS = 900  # a whole batch; a single case gets garbage.CASE_SECONDS


def run_batch(names):
    """Reports of `names` from one child process."""
    proc = subprocess.Popen(
        [sys.executable, SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        preexec_fn=limit_child,
        cwd=os.path.dirname(SCRIPT),
    )
    try:
        out, err = proc.communicate("\n".join(names).encode(), timeout=CHILD_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    reports = {}
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("RESULT "):
            _, name, data = line.split(" ", 2)
            reports[name] = pickle.loads(base64.b64decode(data))
    lost = {
        "steps": [],
        "problems": [
            f"the child running this batch stopped (status {proc.returncode}) before this case:\n"
            + err.decode(errors="replace")[-3000:]
        ],
    }
    return {name: reports.get(name, lost) for name in names}


@pytest.fixture(scope="session")
def reports(request):
    """Reports of the cases this session runs tests for, by name (all of them
    run at once, in WORKERS children)."""
    names = []
    for item in request.session.items:
        name = getattr(item, "callspec", None) and item.callspec.params.get("name")
        if item.module.__name__ == __name__ and name in garbage.CASES:
            names.append(name)
    names = list(dict.fromkeys(names))
    # Interleaved, so that slow neighbours (hangs cluster) spread over all batches.
    count = WORKERS * max(1, -(-len(names) // (BATCH * WORKERS)))
    batches = [names[i::count] for i in range(count) if names[i::count]]
    results = {}
    with ThreadPoolExecutor(WORKERS) as pool:
        for part in pool.map(run_batch, batches):
            results.update(part)
    failing = [name for name in names if "crash" in results[name] or _problems(results[name])]
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if failing and reporter is not None:
        # Named at once, ahead of the tracebacks and the children's output.
        reporter.write_line(f"garbage cases that failed ({len(failing)}): " + ", ".join(failing))
    return results


def describe_crash(crash):
    if crash["signal"] is not None:
        try:
            how = f"killed by {signal.Signals(crash['signal']).name}"
        except ValueError:
            how = f"killed by signal {crash['signal']}"
        if crash["signal"] == signal.SIGALRM:
            how += (f" (it ran over {garbage.CASE_SECONDS} s among other cases, then over "
                    f"{garbage.ALONE_SECONDS} s alone)")
    else:
        how = f"exited with status {crash['status']} without a report"
    tail = "\n".join(crash["output"].strip().splitlines()[-30:])
    return f"the process running this case was {how}\n--- its output (tail) ---\n{tail}"


def _problems(report):
    out = list(report["problems"])
    for step in report["steps"]:
        for problem in step["problems"]:
            out.append(f"step {step['label']!r}: {problem}")
    return out


@pytest.mark.parametrize("name", list(garbage.CASES))
def test_garbage_case(name, reports):
    result = reports[name]
    if "crash" in result:
        pytest.fail(f"{name}: {describe_crash(result['crash'])}")
    if result.get("skipped"):
        pytest.skip(result["skipped"])
    problems = _problems(result)
    assert not problems, f"{name}:\n" + "\n".join(problems)


# -- the same cases on RLlib ---------------------------------------------------------------

# RLlib failing on a size it cannot handle (a slice or fill of ~2**63 rows):
# ours may fail with any of these, or return the sensible answer (which
# test_garbage_case checks).
SIZE_CASES = re.compile(r"(buffer|episode)_index:\w+:slice\[")
SIZE_FAILURES = {"OverflowError", "MemoryError"}
TOO_BIG = {"MemoryError", "OverflowError", "ValueError", "IndexError"}

# Pinned differences (docs/differences.md): in the cases whose
# names match, where RLlib raises the given class, ours has one of the given
# outcomes ("value": it returns, and test_garbage_case checks what).
PINNED = [
    # An int index of 2**63 or more on numpy'ized data: RLlib overflows
    # converting it for numpy; ours is out of range (IndexError, or the fill).
    (
        re.compile(r"(buffer|episode)_index:(numpy|rows|dict):huge"),
        "OverflowError",
        {"IndexError", "value"},
    ),
    # one_hot of Python floats: RLlib fails on float.dtype; ours refuses values
    # that are not integers with RLlib's error for a float array.
    (re.compile(r"buffer_data:one_hot:discrete_float:list$"), "AttributeError", {"IndexError"}),
]


@pytest.fixture(scope="session")
def rllib_impl():
    pytest.importorskip("ray.rllib.env.single_agent_episode")
    return garbage.rllib()


def _agree(name, ours, theirs):
    """None if our step's outcome in case `name` matches RLlib's, else what differs."""
    if theirs["raised"]:
        outcome = ours["raised"] or "value"
        for pattern, raised, allowed in PINNED:
            if pattern.match(name) and theirs["raised"] == raised and outcome in allowed:
                return None
        if theirs["raised"] in SIZE_FAILURES and SIZE_CASES.match(name):
            if not ours["raised"] or ours["raised"] in TOO_BIG:
                return None
        elif ours["raised"] and theirs["raised"] in ours["mro"]:
            return None
        got = (
            f"raised {ours['raised']}: {ours['msg']}"
            if ours["raised"]
            else f"returned {garbage.short(ours['value'])}"
        )
        return f"RLlib raised {theirs['raised']} ({theirs['msg'][:120]}); ours {got}"
    if ours["raised"]:
        return (
            f"RLlib returned {garbage.short(theirs['value'])}; ours raised "
            f"{ours['raised']}: {ours['msg']}"
        )
    try:
        compare(ours["value"], theirs["value"])
    except AssertionError as e:
        return f"values differ: {str(e)[:600]}"
    return None


@pytest.mark.rllib
@pytest.mark.parametrize("name", [n for n, c in garbage.CASES.items() if c.rllib])
def test_same_as_rllib(name, reports, rllib_impl):
    result = reports[name]
    if "crash" in result:
        pytest.skip("the case crashes (see test_garbage_case)")
    theirs = garbage.Probe()
    garbage.CASES[name].fn(rllib_impl, theirs)
    by_label = {step["label"]: step for step in theirs.report()["steps"]}
    differences = []
    for step in result["steps"]:
        other = by_label.get(step["label"])
        if other is None or not (step["cmp"] and other["cmp"]):
            continue
        difference = _agree(name, step, other)
        if difference:
            differences.append(f"step {step['label']!r}: {difference}")
    assert not differences, "\n".join(differences)


# -- what the flipped-bytes cases leave alone ------------------------------------------------

_NUMPY_TRUSTS_DTYPE_STATES = r"""
import gc, pickle, pickletools, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import garbage

caught = []
sys.unraisablehook = lambda u: caught.append(f"{type(u.exc_value).__name__}: {u.exc_value}")
data = pickle.dumps(np.zeros(3, np.float32), protocol=2)
states = garbage.numpy_dtype_states(data)
# The dtype's flags: the last int of its state, (3, '<', None, None, None, -1, -1, 0).
flags_at = [pos + 1 for op, arg, pos in pickletools.genops(data)
            if pos in states and op.name == "BININT1"][-1]
bad = bytearray(data)
bad[flags_at] = 125
loaded = pickle.loads(bytes(bad))
print(flags_at in states, loaded.dtype == np.float32, loaded.dtype.flags,
      np.dtype(np.float32).flags)
del loaded
gc.collect()
print(caught)

# The cases whose flips once landed there: nothing of the kind now.
impl = garbage.ours()
for name in ("ma_pickle:flipped_bytes:numpy:p2", "ma_pickle:flipped_bytes:list:p2"):
    report = pickle.loads(pickle.dumps(garbage.run_case(name, impl)))
    del report
    gc.collect()
print(caught[1:])
"""


def test_flips_stay_out_of_numpys_dtype_states():
    """numpy takes a pickled dtype's state on trust: with its flags byte
    changed, pickle.loads gives a float32 array whose dtype claims other
    flags, and freeing it reports numpy's RuntimeError (get_clear_loop) at
    whatever GC comes next, in whichever process unpickled a case's report.
    That is numpy's behaviour, not ours, so the flipped-bytes cases leave
    those bytes alone (garbage.numpy_dtype_states); run in a child, so that
    this process never holds such an array."""
    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", _NUMPY_TRUSTS_DTYPE_STATES, tests],
                          capture_output=True, text=True, timeout=600, cwd=tests)
    assert proc.returncode == 0, proc.stderr
    pinned, numpy_error, after = proc.stdout.splitlines()
    assert pinned == "True True 125 0"
    assert "RuntimeError" in numpy_error and "get_clear_loop" in numpy_error, numpy_error
    assert after == "[]"


def test_numpy_dtype_states_are_each_dtypes_state_tuple():
    """numpy_dtype_states finds every dtype's state in pickles of each
    protocol (its BUILD included), and nothing in a pickle without dtypes."""
    import pickletools

    import numpy as np

    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        # (The second float32 array's dtype is the first one's, from the memo.)
        data = pickle.dumps([np.zeros(2, np.float32), np.ones(1, np.int16),
                             np.zeros(1, np.float32), np.zeros(1, np.bool_)], protocol=protocol)
        states = garbage.numpy_dtype_states(data)
        builds = [pos for op, _, pos in pickletools.genops(data)
                  if op.name == "BUILD" and pos in states]
        assert len(builds) == 3, protocol       # one per dtype (the arrays' own BUILDs are not)
        assert not garbage.numpy_dtype_states(pickle.dumps({"a": [1, 2.0, "x"]}, protocol))
        positions = garbage.flippable(data)
        assert len(positions) == len(data) - len(states)
        assert not states.intersection(positions.tolist())


# -- the harness: slow is not hung ------------------------------------------------------------

_SLOW_AND_HUNG = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import garbage
garbage.CASE_SECONDS, garbage.ALONE_SECONDS = 1, 3

def sleeper(seconds):
    def run(impl, p):
        p.run("sleep", lambda: time.sleep(seconds), data=False)
    return run

garbage.add("harness", "slow", sleeper(1.5))    # over CASE_SECONDS, within ALONE_SECONDS
garbage.add("harness", "hung", sleeper(60))
garbage.add("harness", "quick", sleeper(0))
garbage.main()
"""


def test_a_case_over_its_time_runs_again_alone_before_it_counts_as_hung():
    """A case that runs over CASE_SECONDS among others (a busy machine) runs
    again in a fork of its own with ALONE_SECONDS: it passes if it finishes
    there; only one that runs over that too is reported hung (SIGALRM). The
    cases after it in the shared fork still run."""
    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", _SLOW_AND_HUNG, tests],
                          input=b"harness:slow\nharness:hung\nharness:quick\n",
                          capture_output=True, timeout=120, cwd=tests)
    assert proc.returncode == 0, proc.stderr.decode()
    reports = {}
    for line in proc.stdout.decode().splitlines():
        if line.startswith("RESULT "):
            _, name, data = line.split(" ", 2)
            reports[name] = pickle.loads(base64.b64decode(data))
    assert set(reports) == {"harness:slow", "harness:hung", "harness:quick"}
    for name in ("harness:slow", "harness:quick"):
        assert "crash" not in reports[name] and not _problems(reports[name]), reports[name]
    assert reports["harness:hung"]["crash"]["signal"] == signal.SIGALRM
    assert "alone" in describe_crash(reports["harness:hung"]["crash"])
