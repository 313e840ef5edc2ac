#!/usr/bin/env python3
"""Checks the Kubernetes API responses the agent's tests replay (a directory such as
agent/src/daemon/kubernetes/testdata) against the Kubernetes JSON schemas of the PyPI
package `kubernetes-validate`, strict (unknown fields are errors), for the oldest and
newest Kubernetes versions we claim:

- `*.json`: a whole response (`PodList`, or a `Status` such as a 410);
- `*.jsonl`: a watch stream, one `WatchEvent` per line, its object a `Pod` (`ADDED`,
  `MODIFIED`, `DELETED`) or a `Status` (`ERROR`); a `BOOKMARK`'s object (the kind with
  only a resourceVersion and Go zero values, as API servers send it) must carry a
  resourceVersion.

The fixtures were written by hand in the shape an API server sends (no cluster here);
this keeps them honest about field names and types.

    python3 tests/scripts/check_api_fixtures.py DIR

Prints a JSON summary on success (exit 0); each problem on stderr as `FILE[:LINE]:
message` (exit 1); exit 3 when the packages are missing. Used by tests/tests/deploy.rs."""
import glob
import json
import os
import sys

from kube_schemas import jsonschema, kubernetes_validate, VERSIONS

SCHEMAS = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
WATCH_TYPES = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}


def meta_schema(name, version):
    """A validator for a meta/v1 type's strict schema (kubernetes-validate looks kinds up
    as KIND-APIVERSION.json; `Status` is `status-meta-v1.json`), with the same registry
    of definitions the package uses."""
    from referencing import Registry, Resource

    folder = os.path.join(SCHEMAS, f"v{version}-local-strict")
    with open(os.path.join(folder, f"{name}-meta-v1.json"), encoding="utf-8") as f:
        schema = json.load(f)
    with open(os.path.join(folder, "_definitions.json"), encoding="utf-8") as f:
        definitions = json.load(f)
    registry = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def check_object(obj, version):
    """Errors for one API object, as strings."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if kind == "Status":
        validator = meta_schema("status", version)
        return [f"Status: {e.message}" for e in validator.iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{kind}: {e.message} at {'/'.join(str(p) for p in e.path)}"]
    except Exception as e:  # noqa: BLE001 (unknown kind, bad version ...)
        return [f"{kind}: {type(e).__name__}: {e}"]
    return []


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    problems = []
    checked = {}
    for path in sorted(glob.glob(os.path.join(root, "*.json"))):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
        for version in VERSIONS:
            problems += [f"{name}: {version}: {p}" for p in check_object(obj, version)]
        checked[name] = obj.get("kind")
    for path in sorted(glob.glob(os.path.join(root, "*.jsonl"))):
        name = os.path.basename(path)
        kinds = []
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                event = json.loads(line)
                if set(event) != {"type", "object"} or event["type"] not in WATCH_TYPES:
                    problems.append(f"{name}:{number}: not a WatchEvent: {sorted(event)}")
                    continue
                obj = event["object"]
                want = "Status" if event["type"] == "ERROR" else "Pod"
                if obj.get("kind") != want:
                    problems.append(f"{name}:{number}: {event['type']} carries {obj.get('kind')}")
                if event["type"] == "BOOKMARK":
                    # A bookmark is the watched kind with only a resourceVersion, Go zero
                    # values left in (`"spec":{"containers":null}`), which no schema
                    # allows: check what the agent reads from it.
                    if not obj.get("metadata", {}).get("resourceVersion"):
                        problems.append(f"{name}:{number}: BOOKMARK without resourceVersion")
                else:
                    for version in VERSIONS:
                        problems += [
                            f"{name}:{number}: {version}: {p}" for p in check_object(obj, version)
                        ]
                kinds.append(f"{event['type']} {obj.get('kind')}")
        checked[name] = kinds
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(json.dumps({"versions": VERSIONS, "checked": checked}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
