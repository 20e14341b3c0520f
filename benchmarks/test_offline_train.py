"""BC's, MARWIL's and CQL's train() on RLlib's classes and on ours, part by
part, from the same recorded data.

    pytest benchmarks/test_offline_train.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

One group per case of benchmarks/offline_parts.py (``bc_cartpole``,
``marwil_cartpole``, ``cql_pendulum``, ``bc_images``, ``marwil_images``:
its docstring says what the datasets and configs are): a round is one
train() after a first one (timed apart). `extra_info`: the seconds of each
part of train() (the data path, the prelearner's calls wherever they ran,
the learner update and its torch update) for the first iteration and for
the rounds, the losses, and the layout of the batch the torch update got,
which both stacks share (asserted when both run).

Ray starts before either side, so RLlib's Ray Data workers run RLlib's
classes; ours runs inside `episode.rllib.installed()`. Torch runs one
thread in this process. `python benchmarks/offline_parts.py table` runs
the same cases, each stack in a process of its own.
"""
from __future__ import annotations

import logging

import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")
pytest.importorskip("pyarrow")
pytest.importorskip("msgpack_numpy")      # RLlib's reading of its episode format

import ray  # noqa: E402
import torch  # noqa: E402

import offline_parts  # noqa: E402

ROUNDS = {"cartpole": 20, "pendulum": 5, "images": 5}
LAYOUTS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def ray_started():
    logging.disable(logging.WARNING)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", offline_parts.CASES, ids="_".join)
@pytest.mark.parametrize("side", ["ours", "rllib"], indirect=True)
def test_offline_train(benchmark, side, case):
    algo_name, data = case
    benchmark.group = f"{algo_name}_{data}"
    training = offline_parts.Training(algo_name, data)
    try:
        training.train()
        benchmark.pedantic(training.train, rounds=ROUNDS[data])
        report = training.report()
    finally:
        training.close()
    benchmark.extra_info.update(report)
    LAYOUTS.setdefault(case, {})[side] = report["layout"]
    if len(LAYOUTS[case]) == 2:
        assert LAYOUTS[case]["ours"] == LAYOUTS[case]["rllib"]
