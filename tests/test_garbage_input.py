"""Garbage in, a Python exception out: never a crash, never memory nobody wrote.

Every public entry of InfiniteLookbackBuffer and SingleAgentEpisode, and the
private Column that pickles reach, gets inputs of the wrong type, size and
shape (see tests/garbage.py for the cases). The cases run in child
processes, with Python's debug allocator so that heap overflows abort
instead of passing unseen. A test here fails when its case

* crashed the child (a signal, an abort, a hang), or
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
import resource
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import garbage
from difftools import compare

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "garbage.py")
BATCH = 400  # cases per child
WORKERS = 2
CHILD_SECONDS = 900  # a whole batch; a single case gets garbage.CASE_SECONDS
CHILD_MEMORY = 3 << 30  # address space: runaway allocations fail fast


# Under AddressSanitizer (.ci/sanitize preloads its runtime) the children
# keep Python's allocations on malloc, where ASan watches them, and get no
# address-space limit: ASan reserves terabytes of shadow memory up front.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def _child_env():
    env = dict(os.environ)
    env.update(
        PYTHONFAULTHANDLER="1",
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        PYTHONHASHSEED="0",
    )
    if not UNDER_ASAN:
        env["PYTHONMALLOC"] = "debug"
    return env


def _limit_child():
    if not UNDER_ASAN:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_batch(names):
    """Reports of `names` from one child process."""
    proc = subprocess.Popen(
        [sys.executable, SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(),
        preexec_fn=_limit_child,
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
    return results


def describe_crash(crash):
    if crash["signal"] is not None:
        try:
            how = f"killed by {signal.Signals(crash['signal']).name}"
        except ValueError:
            how = f"killed by signal {crash['signal']}"
        if crash["signal"] == signal.SIGALRM:
            how += f" (it ran over {garbage.CASE_SECONDS} s)"
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
        pytest.fail(describe_crash(result["crash"]))
    if result.get("skipped"):
        pytest.skip(result["skipped"])
    problems = _problems(result)
    assert not problems, "\n".join(problems)


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
