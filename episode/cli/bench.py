"""`episode bench`: the workloads of episode.cli.workloads timed for ours
and, when ray[rllib] is installed, for RLlib's SingleAgentEpisode, in
interleaved rounds of the same process."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from episode._extras import RLLIB_EXTRA
from episode.cli.common import Progress, UsageError, format_table, format_time


RLLIB_HINT = f"RLlib comparison off: {RLLIB_EXTRA}"

MIN_ROUND_S = 5e-3          # a timed round lasts at least this long
MIN_ROUND_S_QUICK = 1e-4


@dataclass
class BenchResult:
    workload: Any
    times: dict = field(default_factory=lambda: {"ours": [], "rllib": []})  # s per call
    mismatch: str | None = None
    missing: str | None = None     # why RLlib's side could not run, if it could not

    def median(self, impl: str) -> float | None:
        return statistics.median(self.times[impl]) if self.times[impl] else None

    def speedup(self) -> float | None:
        ours, rllib = self.median("ours"), self.median("rllib")
        return rllib / ours if ours and rllib else None


def _check_writable(path: str, option: str) -> None:
    """Raises UsageError now, rather than after the benchmark, if `path`
    cannot be written."""
    existed = os.path.exists(path)
    try:
        open(path, "a").close()
    except OSError as e:
        raise UsageError(f"cannot write {option} file {path!r}: {e.strerror}") from None
    if not existed:
        os.remove(path)


def _time_calls(rnd, number: int) -> float:
    """Seconds `number` rounds take, their setups not counted."""
    clock = time.perf_counter
    if rnd.setup is None:
        run = rnd.run
        t0 = clock()
        for _ in range(number):
            run()
        return clock() - t0
    total = 0.0
    for _ in range(number):
        args = rnd.setup()
        t0 = clock()
        rnd.run(*args)
        total += clock() - t0
    return total


def _calls_per_round(rnd, min_s: float) -> int:
    """How many calls make a timed round last min_s (as timeit's autorange)."""
    number = 1
    while _time_calls(rnd, number) < min_s:
        number *= 2
    return number


def _bench_workload(workload, classes: dict, rounds: int, min_s: float, result: BenchResult,
                    progress: Progress, done: int) -> None:
    from episode.cli.workloads import assert_same

    prepared = {}
    for impl, cls in classes.items():
        try:
            prepared[impl] = workload.prepare(cls)
        except ImportError as e:
            if impl == "ours":
                raise
            result.missing = f"RLlib's side needs {e.name or e}"
    outputs = {impl: rnd.once() for impl, rnd in prepared.items()}
    if len(outputs) == 2:
        try:
            assert_same(outputs["ours"], outputs["rllib"])
        except AssertionError as e:
            result.mismatch = str(e).splitlines()[0]
    del outputs
    number = {impl: _calls_per_round(rnd, min_s) for impl, rnd in prepared.items()}
    impls = list(prepared)
    for r in range(rounds):
        # Interleaved, in alternating order, so drift hits both sides alike.
        for impl in impls if r % 2 == 0 else impls[::-1]:
            seconds = _time_calls(prepared[impl], number[impl])
            result.times[impl].append(seconds / number[impl])
        progress.update(done + r + 1, workload.name)


def _machine() -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:   # Linux only
        cpu = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), cpu)
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count()}


def _report(results: list[BenchResult], with_rllib: bool, interrupted: bool) -> dict:
    import numpy as np

    from episode.cli.workloads import ray_version

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": _machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ray": ray_version() if with_rllib else None,
        "interrupted": interrupted,
        "results": [{
            "workload": r.workload.name,
            "description": r.workload.description,
            "items": r.workload.items,
            "ours_s": r.median("ours"),
            "rllib_s": r.median("rllib"),
            "speedup": r.speedup(),
            "rounds": len(r.times["ours"]),
        } for r in results if r.times["ours"]],
    }


def _bench_table(report: dict, with_rllib: bool) -> str:
    header = ["workload", "rounds", "items", "ours", "ours/item"]
    if with_rllib:
        header += ["RLlib", "RLlib/item", "speed-up"]
    rows = []
    for r in report["results"]:
        n = r["items"]
        row = [r["workload"], str(r["rounds"]), f"{n:,}", format_time(r["ours_s"]),
               format_time(r["ours_s"] / n) if n > 1 else ""]
        if with_rllib:
            row += [format_time(r["rllib_s"]),
                    format_time(r["rllib_s"] / n) if n > 1 and r["rllib_s"] else "",
                    f"{r['speedup']:.1f}x" if r["speedup"] else "-"]
        rows.append(row)
    return format_table(header, rows, right=set(range(1, len(header))))


def _plot(report: dict, path: str) -> None:
    """A horizontal bar per workload: RLlib's time / ours, from the 1x line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = [r for r in report["results"] if r["speedup"]][::-1]   # first on top
    names = [r["workload"] for r in rows]
    values = [r["speedup"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.42 * len(rows)))
    colors = ["tab:green" if v >= 1 else "tab:red" for v in values]
    bars = ax.barh(names, [v - 1 for v in values], left=1, color=colors, height=0.6)
    ax.bar_label(bars, labels=[f"{v:.1f}x" for v in values], padding=4, fontsize=9)
    ax.axvline(1, color="black", linewidth=1)
    lo, hi = min(values + [1.0]), max(values + [1.0])
    if hi / lo > 20:
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.5, hi * 1.8)
    else:
        ax.set_xlim(0, hi * 1.2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    scale = ", log scale" if ax.get_xscale() == "log" else ""
    ax.set_xlabel(f"speed-up: RLlib {report['ray']} time / episode time{scale}")
    machine = report["machine"]
    ax.set_title(f"episode vs RLlib SingleAgentEpisode, {report['date'][:10]}\n"
                 f"{machine['cpu']}, {machine['cores']} cores, Python {report['python']}",
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench(args) -> int:
    from episode.cli.workloads import WORKLOADS

    if args.workloads is not None:
        names = [n.strip() for n in args.workloads.split(",") if n.strip()]
        unknown = [n for n in names if n not in WORKLOADS]
        if unknown or not names:
            raise UsageError(f"unknown workload(s) {', '.join(unknown) or repr(args.workloads)}; "
                             f"known: {', '.join(WORKLOADS)}")
    else:
        names = list(WORKLOADS)
    if args.json:
        _check_writable(args.json, "--json")
    if args.plot:
        _check_writable(args.plot, "--plot")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError('--plot needs matplotlib: pip install "episode[plot]"') from None

    from episode import SingleAgentEpisode
    from episode.cli.workloads import rllib_class

    classes: dict[str, type] = {"ours": SingleAgentEpisode}
    rllib = rllib_class()
    if rllib is not None:
        classes["rllib"] = rllib
    elif args.plot:
        raise UsageError(f"--plot charts the speed-ups over RLlib, which is not installed: "
                         f"{RLLIB_EXTRA}")
    rounds = args.rounds or (3 if args.quick else 7)
    min_s = MIN_ROUND_S_QUICK if args.quick else MIN_ROUND_S

    results = []
    progress = Progress(len(names) * rounds, "rounds", args.progress)
    interrupted = False
    try:
        for k, name in enumerate(names):
            results.append(BenchResult(WORKLOADS[name]))
            _bench_workload(WORKLOADS[name], classes, rounds, min_s, results[-1], progress,
                            k * rounds)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()

    if interrupted:
        print("interrupted", file=sys.stderr)
    for r in results:
        if r.missing:
            print(f"episode: note: {r.workload.name}: {r.missing}; timed ours only",
                  file=sys.stderr)
        if r.mismatch:
            print(f"episode: warning: {r.workload.name}: ours and RLlib's results differ: "
                  f"{r.mismatch}", file=sys.stderr)
    report = _report(results, "rllib" in classes, interrupted)
    print("median time per call over interleaved rounds (items: the steps, or episodes, "
          "one call handles)")
    print(_bench_table(report, "rllib" in classes))
    if "rllib" not in classes:
        print(RLLIB_HINT)
    if args.json and report["results"]:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.plot and any(r["speedup"] for r in report["results"]):
        _plot(report, args.plot)
    return 130 if interrupted else 0


def workload_list() -> str:
    """The workloads, a line each, for the help of `episode bench`."""
    from episode.cli.workloads import WORKLOADS

    width = max(map(len, WORKLOADS))
    return "workloads:\n" + "\n".join(f"  {w.name:<{width}}  {w.description}"
                                      for w in WORKLOADS.values())
