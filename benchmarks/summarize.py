"""Ours against RLlib's, one row per workload, from pytest-benchmark's JSON.

    pytest benchmarks/test_lookback_buffer.py --benchmark-json=bench.json
    python benchmarks/summarize.py bench.json [more.json ...] [--markdown]

Columns: workload (the benchmark group), ours median, RLlib median, speed-up
(RLlib median / ours median), and the per-item median of each side where a
round handles more than one item (extra_info["items"]). Given several JSON
files (repeated runs), each time is the median of the runs' medians.
Benchmarks that recorded extra_info["memory"] (test_memory_100k) add a
second table: bytes held by the episode, per implementation and mode.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict

from episode.cli.common import format_table, format_time


def _impl(bench: dict) -> str:
    params = bench.get("params") or {}
    if "impl" in params:
        return params["impl"]
    for name, value in params.items():  # e.g. sae_impl
        if name.endswith("impl") and value in ("ours", "rllib"):
            return value
    match = re.search(r"\[(ours|rllib)\b", bench["name"])
    return match.group(1) if match else "?"


def summarize(runs: list[dict]) -> list[dict]:
    rows: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    order: list[str] = []
    for data in runs:
        for bench in data["benchmarks"]:
            group = bench.get("group") or bench["name"]
            if group not in rows:
                order.append(group)
            rows[group][_impl(bench)].append(bench["stats"]["median"])
            rows[group]["items"] = (bench.get("extra_info") or {}).get("items", 1)
    out = []
    for group in order:
        r = rows[group]
        ours = statistics.median(r["ours"]) if r["ours"] else None
        rllib = statistics.median(r["rllib"]) if r["rllib"] else None
        items = r["items"]
        out.append({
            "workload": group,
            "ours": ours,
            "rllib": rllib,
            "speedup": (rllib / ours) if ours and rllib else None,
            "items": items,
        })
    return out


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if not markdown:
        return format_table(header, rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def render(rows: list[dict], markdown: bool) -> str:
    header = ["workload", "ours median", "RLlib median", "speed-up (RLlib/ours)",
              "ours / item", "RLlib / item"]
    table = []
    for r in rows:
        per_item = r["items"] > 1
        table.append([
            r["workload"],
            format_time(r["ours"]),
            format_time(r["rllib"]),
            f"{r['speedup']:.1f}x" if r["speedup"] else "-",
            format_time(r["ours"] / r["items"]) if per_item and r["ours"] else "",
            format_time(r["rllib"] / r["items"]) if per_item and r["rllib"] else "",
        ])
    return _table(header, table, markdown)


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def memory_rows(runs: list[dict]) -> list[list[str]]:
    """Rows of the memory table, from benchmarks with extra_info["memory"]
    (test_memory_100k): impl, mode, traced, held inputs, total, total/raw, peak.
    Memory does not vary between runs: the last run's numbers are shown."""
    found: dict[tuple, dict] = {}
    for data in runs:
        for bench in data["benchmarks"]:
            memory = (bench.get("extra_info") or {}).get("memory")
            if memory:
                for mode in ("list", "numpy"):
                    found[(bench.get("group") or bench["name"], _impl(bench), mode)] = memory[mode]
    rows = []
    for (group, impl, mode), m in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        rows.append([impl, mode, _fmt_bytes(m["traced"]), _fmt_bytes(m["held_inputs"]),
                     _fmt_bytes(m["total"]), f"{m['ratio_to_raw']:.2f}x", _fmt_bytes(m["peak"])])
    return rows


def render_memory(rows: list[list[str]], markdown: bool) -> str:
    header = ["impl", "mode", "traced (current)", "held inputs", "total",
              "total / raw data", "traced peak"]
    return _table(header, rows, markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="file(s) written by pytest --benchmark-json")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args()
    runs = []
    for path in args.json:
        with open(path) as f:
            runs.append(json.load(f))
    print(render(summarize(runs), args.markdown))
    mem = memory_rows(runs)
    if mem:
        print()
        print(render_memory(mem, args.markdown))


if __name__ == "__main__":
    main()
