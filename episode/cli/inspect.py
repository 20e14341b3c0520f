"""`episode inspect`: what a dataset read_episodes opens holds (files,
schema, counts, episode-length and return statistics), every file checked
first."""
from __future__ import annotations

import json
import os

from episode.cli.common import (UsageError, check_dataset, format_bytes, format_table,
                                one_line, open_dataset)


def _arrow_type(t) -> str:
    """An Arrow type, the fixed-shape tensors shortened."""
    import pyarrow as pa

    if isinstance(t, pa.FixedShapeTensorType):
        return f"fixed_shape_tensor[{t.value_type}, {list(t.shape)}]"
    if isinstance(t, pa.StructType):
        return "struct"
    return str(t)


_STORED_AS = {"arrow": "numbers", "bytes": "fixed-size bytes", "value": "msgpack values",
              "none": "nothing", "zero": "nothing (zero-size rows)"}


def _track_leaves(name: str, tree, arrow_type, where: str, out: list) -> None:
    """The rows describing a track's leaves (Dict/Tuple nested: name.key...),
    each checked against the step file's Arrow type."""
    import pyarrow as pa

    from episode._column import KINDS
    from episode.offline import DatasetError
    from episode.offline import format as fmt

    if isinstance(tree, dict):
        dtype = fmt.leaf_dtype(tree)
        kinds = {v: k for k, v in KINDS.items()}
        out.append({
            "column": name, "arrow_type": _arrow_type(arrow_type),
            "dtype": None if dtype is None else str(dtype),
            "shape": list(tree["shape"]) if tree["codec"] in fmt.STORED else None,
            "stored_as": _STORED_AS[tree["codec"]],
            "items": kinds.get(tree["kind"], str(tree["kind"])),
            "mode": "numpy" if tree["finalized"] else "list",
        })
        return
    kind, subs = tree
    if not subs:
        out.append({"column": name, "arrow_type": _arrow_type(arrow_type), "dtype": None,
                    "shape": None, "stored_as": "nothing", "items": f"empty {kind}",
                    "mode": None})
        return
    if not isinstance(arrow_type, pa.StructType) or arrow_type.num_fields != len(subs):
        raise DatasetError(f"{where}: column {name!r} is {arrow_type}, not a struct of "
                           f"{len(subs)} fields")
    for i, sub in enumerate(subs):
        key, sub = sub if kind == "dict" else (i, sub)
        _track_leaves(f"{name}.{key}", sub, arrow_type.field(i).type, where, out)


def _infos_rows(path: str, pa) -> tuple:
    """(rows with an info, rows) of a step file: from the Parquet footer's
    statistics where it has them, else from the (mapped) column."""
    if path.endswith(".arrow"):
        reader = pa.ipc.open_file(pa.memory_map(path))
        index = reader.schema.get_field_index("infos")
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        rows = sum(b.num_rows for b in batches)
        return rows - sum(b.column(index).null_count for b in batches), rows
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    # (Parquet's leaf columns: a struct or tensor column has several.)
    index = [meta.schema.column(i).path for i in range(meta.num_columns)].index("infos")
    nulls = 0
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_null_count:
            column = pq.read_table(path, columns=["infos"]).column(0)
            return len(column) - column.null_count, meta.num_rows
        nulls += stats.null_count
    return meta.num_rows - nulls, meta.num_rows


def _step_files(paths: list) -> tuple:
    """(the schemas of the step files: each distinct one once, with its
    columns and how many files have it; the extra output keys; (rows with
    an info, rows); the format versions)."""
    import pyarrow as pa

    from episode.offline import DatasetError
    from episode.offline import format as fmt
    from episode.offline.dataset import read_schema

    schemas: dict = {}
    extras: list = []
    infos = [0, 0]
    versions = set()
    for path in paths:
        schema = read_schema(path)
        meta = fmt.read_metadata(schema, path, "steps")
        versions.add(meta["version"])
        key = (str(schema.remove_metadata()), json.dumps(meta, sort_keys=True))
        if key in schemas:
            schemas[key]["step_files"] += 1
        else:
            tracks, extra_specs = meta.get("tracks"), meta.get("extras")
            if not (isinstance(tracks, list) and isinstance(extra_specs, list)):
                raise DatasetError(f"{path}: malformed track metadata")
            columns: list = []
            for i, spec in enumerate(tracks + extra_specs):
                if not (isinstance(spec, dict) and isinstance(spec.get("column"), str)):
                    raise DatasetError(f"{path}: malformed track metadata")
                name = spec["column"]
                if name not in schema.names:
                    raise DatasetError(f"{path}: no column {name!r}")
                tree = fmt.tree_from_json(spec.get("tree"), f"{path}: column {name!r}")
                _track_leaves(name, tree, schema.field(name).type, path, columns)
                if i >= len(tracks):
                    extra = fmt.key_from_json(spec.get("key"), path)
                    if extra not in extras:
                        extras.append(extra)
            for name in (fmt.INFOS, fmt.TERMINATEDS, fmt.TRUNCATEDS):
                if name not in schema.names:
                    raise DatasetError(f"{path}: no column {name!r}")
                columns.append({"column": name, "arrow_type": _arrow_type(schema.field(name).type),
                                "dtype": None, "shape": None,
                                "stored_as": "msgpack values" if name == fmt.INFOS else "flags",
                                "items": None, "mode": None})
            schemas[key] = {"step_files": 1, "columns": columns}
        try:
            with_info, rows = _infos_rows(path, pa)
        except (OSError, pa.ArrowException) as e:
            raise DatasetError(f"{path}: not a readable file ({e})") from None
        infos[0] += with_info
        infos[1] += rows
    return list(schemas.values()), extras, tuple(infos), versions


def _statistics(values) -> dict | None:
    """min, mean, median, max (None: no values, or some not numbers)."""
    import numpy as np

    values = np.asarray(values, np.float64)
    if not len(values) or not np.isfinite(values).all():
        return None
    return {"min": _number(values.min()), "mean": float(values.mean()),
            "median": _number(np.median(values)), "max": _number(values.max())}


def _number(x) -> int | float:
    x = float(x)
    return int(x) if x.is_integer() else x


def _spaces(texts: list) -> list:
    """Spaces (as the JSON text of RLlib's dict, or None) as text and dict."""
    from episode.offline import format as fmt

    return [{"space": None, "description": None} if t is None else
            {"space": " ".join(str(fmt.space_of(t, "space")).split()),
             "description": json.loads(t)}
            for t in texts]


def _describe(ds) -> dict:
    """What `episode inspect` reports on an open dataset (see its help)."""
    from episode.offline import format as fmt
    from episode.offline.dataset import read_schema

    if ds.format != fmt.FORMAT:
        return _describe_foreign(ds)

    files = ds.files
    tables = [f for f in files if ".episodes." in os.path.basename(f)]
    step_paths = [f for f in files if f not in tables]
    versions = {fmt.read_metadata(read_schema(path), path, "episodes")["version"]
                for path in tables}
    schemas, extras, infos, step_versions = _step_files(step_paths)
    episodes = ds.episode_table()
    multi = None
    if episodes["multi_agent"].any():
        multi = {"episodes": int(episodes["multi_agent"].sum()), "agents": [
            a if isinstance(a, (str, int)) else repr(a) for a in ds.agent_ids()],
            "agent_steps": int(episodes["agent_steps"].sum())}
    return _report_of(
        ds, fmt.FORMAT, sorted(versions | step_versions), files,
        {"episode_tables": len(tables), "step_files": len(step_paths)}, episodes,
        {name: _spaces(texts) for name, texts in ds.spaces().items()},
        extras, {"rows_with_info": infos[0], "rows": infos[1]}, schemas,
        stored_chunks=ds.num_chunks, multi_agent=multi)


def _describe_foreign(ds) -> dict:
    """The report for RLlib's recordings (read whole by read_episodes: the
    statistics come from its episodes)."""
    from episode.offline import rllib_format
    from episode.offline.dataset import read_schema

    files = ds.files
    episodes = list(ds)
    kinds, schemas = [], {}
    for path in files:
        schema = read_schema(path)
        kind = rllib_format.detect_format(schema)
        if kind not in kinds:
            kinds.append(kind)
        key = str(schema.remove_metadata())
        if key in schemas:
            schemas[key]["files"] += 1
        else:
            schemas[key] = {"files": 1, "columns": [
                {"column": f.name, "arrow_type": _arrow_type(f.type), "dtype": None,
                 "shape": None, "stored_as": kind, "items": None, "mode": None}
                for f in schema]}
    extras = list(dict.fromkeys(k for e in episodes for k in e.extra_model_outputs))
    with_info = sum(1 for e in episodes for info in e.get_infos() if info)
    rows = sum(len(e.get_infos()) for e in episodes)
    return _report_of(ds, " / ".join(map(str, kinds)), [], files, {"data_files": len(files)},
                      ds.episode_table(),
                      {name: _spaces(texts) for name, texts in ds.spaces().items()},
                      extras, {"rows_with_info": with_info, "rows": rows},
                      list(schemas.values()), stored_chunks=ds.num_chunks)


def _report_of(ds, format_name: str, versions: list, files: list, kinds: dict,
               episodes: dict, spaces: dict, extras: list, infos: dict, schemas: list,
               stored_chunks: int, multi_agent: dict | None = None) -> dict:
    terminated, truncated = episodes["terminated"], episodes["truncated"]
    sizes = [os.path.getsize(f) for f in files]
    return {
        "path": ds.path,
        "format": format_name,
        "versions": versions,
        "files": {"count": len(files), "bytes": int(sum(sizes)), **kinds,
                  "types": sorted({f.rpartition(".")[2] for f in files})},
        "episodes": len(ds),
        "stored_chunks": stored_chunks,
        "steps": int(ds.num_steps),
        "done": int((terminated | truncated).sum()),
        "terminated": int(terminated.sum()),
        "truncated": int(truncated.sum()),
        "multi_agent": multi_agent,
        "length": _statistics(episodes["length"]),
        "return": _statistics(episodes["return"]),
        **spaces,
        "extra_model_outputs": [k if isinstance(k, str) else repr(k) for k in extras],
        "infos": infos,
        "schemas": schemas,
    }


def _format_statistics(stats: dict | None, precision: str) -> str:
    if stats is None:
        return "-"
    return ", ".join(f"{k} {v:,{precision}}" if isinstance(v, float) else f"{k} {v:,}"
                     for k, v in stats.items())


def _inspect_text(report: dict) -> str:
    files = report["files"]
    versions = ", ".join(map(str, report["versions"]))
    head = f"{report['path']}: {report['format']} dataset" + (
        f", format version {versions}" if versions else "")
    if "step_files" in files:
        files_note = (f"{format_bytes(files['bytes'])} of {'/'.join(files['types'])}: "
                      f"{files['episode_tables']:,} episode table(s), "
                      f"{files['step_files']:,} step file(s)")
    else:
        files_note = f"{format_bytes(files['bytes'])} of {'/'.join(files['types'])}"
    done = report["done"]
    episodes_note = (f"{done:,} done ({report['terminated']:,} terminated, "
                     f"{report['truncated']:,} truncated), "
                     f"{report['episodes'] - done:,} not done")
    if report["stored_chunks"] != report["episodes"]:
        episodes_note += f"; stored as {report['stored_chunks']:,} chunks"
    infos = report["infos"]
    multi = report["multi_agent"]
    rows = [
        ("files", f"{files['count']:,}", files_note),
        ("episodes", f"{report['episodes']:,}", episodes_note),
        ("steps", f"{report['steps']:,}",
         f"env steps; {multi['agent_steps']:,} agent steps" if multi else ""),
    ]
    if multi:
        rows.append(("multi-agent", f"{multi['episodes']:,}",
                     f"episodes, agents {', '.join(map(str, multi['agents']))}"))
    rows += [
        ("length", "", _format_statistics(report["length"], ".1f")),
        ("return", "", _format_statistics(report["return"], ".3g")),
        ("observations", "", "; ".join(str(s["space"]) for s in report["observation_space"])
         or "-"),
        ("actions", "", "; ".join(str(s["space"]) for s in report["action_space"]) or "-"),
        ("extra outputs", "", ", ".join(report["extra_model_outputs"]) or "none"),
        ("infos", "", f"on {infos['rows_with_info']:,} of {infos['rows']:,} rows"
         if infos["rows_with_info"] else "none"),
    ]
    width = max(len(r[1]) for r in rows)
    lines = [head] + [f"  {a:<13} {b:>{width}}  {c}".rstrip() for a, b, c in rows]
    for schema in report["schemas"]:
        count = schema.get("step_files", schema.get("files"))
        lines.append(f"schema of {count:,} {'step ' if 'step_files' in schema else ''}file(s):")
        table = format_table(
            ["column", "Arrow type", "dtype", "row shape", "stored as", "items"],
            [[c["column"], c["arrow_type"], c["dtype"] or "",
              "" if c["shape"] is None else str(tuple(c["shape"])), c["stored_as"] or "",
              f"{c['items']} ({c['mode']} mode)" if c["mode"] else c["items"] or ""]
             for c in schema["columns"]])
        lines += ["  " + line for line in table.splitlines()]
    return "\n".join(lines)


def inspect(args) -> int:
    ds = open_dataset(args.path, verify=args.verify)
    check_dataset(ds)
    try:
        report = _describe(ds)
    except ValueError as e:        # DatasetError: a file the reader did not open yet
        raise UsageError(one_line(e)) from None
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_inspect_text(report))
    return 0
