#!/usr/bin/env python3
"""Checks that the stages of agent/src import only downward (docs/architecture.md).

Reads every `crate::STAGE` path of every .rs file under agent/src (tests included): plain
paths, and the names inside `use crate::{...}` groups at any depth of braces. A file of
folder A that names stage B is an edge A -> B. Each edge must go from a higher layer to a
lower one in LAYERS; an edge that goes up (and so any circle) is an error.

    python3 tests/scripts/stage_imports.py [--graph]

Exit 0 and a one-line summary (with --graph: every edge and the files behind it); exit 1
with each upward edge and its files. Run by `cargo xtask lint`."""
import os
import re
import sys

# Bottom first. Libraries at the bottom import no stage; each stage may import any layer
# below it.
LAYERS = [
    "sys", "elf", "check", "rules", "triggers", "capture", "snapshot", "decode", "stacks",
    "symbols", "unwind", "inflight", "report", "writer", "upload", "daemon", "cli",
]
# Test helpers any stage's tests may use, and the crate roots.
EXEMPT = {"test_support", "lib", "main", "bin"}

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "agent", "src")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] if "//" in line and '"' not in line.split("//")[0]
                     else line for line in text.split("\n"))


def group_heads(body):
    """The first path segment of each item of a `{...}` use group (top level only)."""
    heads, depth, item = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if depth == 0 and ch == ",":
            heads.append(item)
            item = ""
        else:
            item += ch
    heads.append(item)
    out = []
    for h in heads:
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", h)
        if m:
            out.append(m.group(1))
    return out


def crate_names(text):
    names = set(re.findall(r"crate::([A-Za-z_][A-Za-z0-9_]*)", text))
    for m in re.finditer(r"crate::\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        names.update(group_heads(text[m.end():i - 1]))
    return names


def edges():
    found = {}
    for root, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, ROOT)
            stage = rel.split(os.sep)[0].removesuffix(".rs")
            if stage in EXEMPT:
                continue
            with open(path, encoding="utf-8") as fh:
                text = strip_comments(fh.read())
            for name in crate_names(text):
                if name != stage and name in LAYERS:
                    found.setdefault((stage, name), set()).add(rel)
    return found


def main():
    found = edges()
    rank = {s: i for i, s in enumerate(LAYERS)}
    unknown = sorted({a for a, _ in found if a not in rank})
    up = sorted((a, b) for a, b in found if a in rank and rank[b] >= rank[a])
    if "--graph" in sys.argv:
        for (a, b), files in sorted(found.items()):
            print(f"{a} -> {b}: {', '.join(sorted(files))}")
    for stage in unknown:
        print(f"agent/src/{stage}: a folder not in LAYERS of {__file__}", file=sys.stderr)
    for a, b in up:
        print(f"{a} -> {b} goes up (or across): {', '.join(sorted(found[(a, b)]))}",
              file=sys.stderr)
    if up or unknown:
        sys.exit(1)
    print(f"stage imports: {len(found)} edges, all downward over {len(LAYERS)} layers")


if __name__ == "__main__":
    main()
