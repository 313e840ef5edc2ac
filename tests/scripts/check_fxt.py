#!/usr/bin/env python3
"""Reads an FXT trace (optionally gzipped) with the independent PyPI `fxt` parser and prints
JSON: per thread its name and the slices (name, start, duration, depth, parent, args), the
instant events, and the process names. Used by tests/tests/trace.rs; knows nothing of the
Rust writer.

    python3 tests/scripts/check_fxt.py TRACE.fxt[.gz]

The `fxt` package is looked up on sys.path, then in .tools/python (where `cargo xtask setup`
installs it)."""
import gzip
import io
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "..", ".tools", "python"))

try:
    from fxt import models
    from fxt.reader import parse_records
    from fxt.transform import transform_records_to_spans
except ImportError as exc:  # pragma: no cover
    print(f"the fxt package is missing ({exc}); run `cargo xtask setup`", file=sys.stderr)
    sys.exit(3)


def plain(value):
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


def walk(span, depth, parent, out):
    out.append(
        {
            "name": span.name,
            "start_ns": span.timestamp_ns,
            "duration_ns": span.duration_ns,
            "depth": depth,
            "parent": parent,
            "args": {k: plain(v) for k, v in span.args.items()},
        }
    )
    for child in span.children:
        walk(child, depth + 1, span.name, out)


def main(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    result = parse_records(io.BytesIO(data))
    if result.had_unexpected_eof:
        print("unexpected end of file", file=sys.stderr)
        return 1
    records = []
    providers = []
    for provider in result.records_by_provider.values():
        providers.append(provider.name)
        records.extend(provider.records)
    instants = [
        {
            "name": r.name,
            "ts_ns": r.timestamp_ns,
            "pid": r.thread.process_id,
            "tid": r.thread.thread_id,
            "args": {k: plain(v) for k, v in r.args.items()},
        }
        for r in records
        if isinstance(r, models.InstantEventRecord)
    ]
    threads = []
    processes = {}
    for pid, process in transform_records_to_spans(records).items():
        processes[str(pid)] = process.name
        for tid, thread in process.threads.items():
            slices = []
            for span in thread.spans:
                walk(span, 0, None, slices)
            threads.append({"pid": pid, "tid": tid, "name": thread.name, "slices": slices})
    print(
        json.dumps(
            {"providers": providers, "processes": processes, "threads": threads, "instants": instants},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
