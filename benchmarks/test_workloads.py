"""SingleAgentEpisode: ours against RLlib 2.60's, on episode.cli.workloads.

    pytest benchmarks/ --benchmark-group-by=param:workload \
        --benchmark-columns=median,iqr,rounds --benchmark-json=run.json
    python benchmarks/summarize.py run.json --markdown

The workloads are the ones `episode bench` times (episode/cli/workloads.py says
what each does). Each is parametrized over ``impl`` (ours, rllib; rllib is
skipped without ray), so grouping by ``param:workload`` puts the two side by
side. Before timing, a workload runs once on both implementations and the
results are compared, so both sides do the same work.
``extra_info["items"]`` is the number of calls one round makes; summarize.py
divides by it for a per-item time.
"""
import functools

import pytest

from episode import SingleAgentEpisode
from episode.cli.workloads import WORKLOADS, check, rllib_class

ROUNDS = 50   # rounds of the workloads with a per-round setup (pedantic)


@functools.cache
def _checked(name: str) -> None:
    check(WORKLOADS[name])


@pytest.mark.parametrize("impl", ["ours", "rllib"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_workload(benchmark, workload, impl):
    rllib = rllib_class()
    if rllib is None:
        if impl == "rllib":
            pytest.skip("ray[rllib] is not installed")
    else:
        _checked(workload)
    spec = WORKLOADS[workload]
    benchmark.group = workload
    benchmark.extra_info["items"] = spec.items
    rnd = spec.prepare(SingleAgentEpisode if impl == "ours" else rllib)
    if rnd.setup is None:
        benchmark(rnd.run)
    else:
        benchmark.pedantic(rnd.run, setup=lambda: (rnd.setup(), {}), rounds=ROUNDS,
                           warmup_rounds=2, iterations=1)
