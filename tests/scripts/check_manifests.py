#!/usr/bin/env python3
"""Checks the Kubernetes manifests in a directory (deploy/kubernetes) offline:

1. every core resource against the Kubernetes JSON schemas bundled in the PyPI package
   `kubernetes-validate` (strict: unknown fields are errors), for the oldest and newest
   Kubernetes versions we claim;
2. the ServiceMonitor (a Prometheus Operator CRD, not in the core schemas) against the
   subset of its CRD schema embedded below (the fields we use, unknown ones rejected);
3. kustomization.yaml: lists exactly the other resource files, and its image name is the
   DaemonSet's; an overlay (a directory among its resources, such as deploy/kubernetes/tls)
   is built from its base with its JSON 6902 patches (the only kind of patch checked here:
   a patch of another kind is an error) and checked whole;
4. the references between them: service account, role binding, config map key and path,
   metrics port, probes, Service and ServiceMonitor selectors, NODE_NAME; with
   `--web-config`: the file in a mounted Secret, probes over HTTPS, the ServiceMonitor
   scraping https with basic auth and a server name of the Service.

    python3 tests/scripts/check_manifests.py DIR [--extract-rules OUT]

Prints a JSON summary on success (exit 0); each problem on stderr as `FILE: kind/name:
message` (exit 1); exit 3 when the packages are missing. `--extract-rules OUT` also writes
the rules file embedded in the lookback-rules ConfigMap to OUT (for `lookback rules
validate`). Used by tests/tests/deploy.rs. Packages are looked up on sys.path, then in
.tools/python (where `cargo xtask setup` installs them)."""
import argparse
import json
import os
import sys

from kube_schemas import jsonschema, kubernetes_validate, require, VERSIONS

(yaml,) = require("yaml")

NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# Prometheus durations, as the CRD's pattern has them.
DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
}
LABEL_NAME = {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}
RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": LABEL_NAME},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer", "minimum": 0},
        "replacement": {"type": "string"},
        "action": {
            "enum": [
                "replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                "dropequal", "DropEqual",
            ]
        },
    },
}
LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
# A key of a Secret or ConfigMap (the CRD's SecretKeySelector / ConfigMapKeySelector).
SECRET_KEY = {
    "type": "object",
    "required": ["key"],
    "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                   "optional": {"type": "boolean"}},
}
# The CRD's SafeTLSConfig plus its file fields.
TLS_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "ca": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"secret": SECRET_KEY, "configMap": SECRET_KEY},
        },
        "cert": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"secret": SECRET_KEY, "configMap": SECRET_KEY},
        },
        "keySecret": SECRET_KEY,
        "serverName": {"type": "string"},
        "insecureSkipVerify": {"type": "boolean"},
        "caFile": {"type": "string"},
        "certFile": {"type": "string"},
        "keyFile": {"type": "string"},
    },
}
# monitoring.coreos.com/v1 ServiceMonitor: the fields of the CRD this project may use.
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": NAME,
                "namespace": NAME,
                "labels": STRING_MAP,
                "annotations": STRING_MAP,
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 0},
                "selector": LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["integer", "string"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": DURATION,
                            "scrapeTimeout": DURATION,
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "params": {
                                "type": "object",
                                "additionalProperties": {
                                    "type": "array",
                                    "items": {"type": "string"},
                                },
                            },
                            "relabelings": {"type": "array", "items": RELABEL},
                            "metricRelabelings": {"type": "array", "items": RELABEL},
                            "tlsConfig": TLS_CONFIG,
                            "basicAuth": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "username": SECRET_KEY,
                                    "password": SECRET_KEY,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

RULES_CONFIGMAP = "lookback-rules"
RULES_KEY = "rules.yaml"


class Checker:
    def __init__(self):
        self.errors = []

    def error(self, where, message):
        self.errors.append(f"{where}: {message}")

    def check(self, condition, where, message):
        if not condition:
            self.error(where, message)
        return condition


def read_yaml(path, label, checker):
    """The documents of one YAML file, or [] (and an error) when it does not parse."""
    try:
        with open(path, encoding="utf-8") as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        checker.error(label, f"invalid YAML: {exc}")
        return []


def load(directory, checker, prefix=""):
    """(file, document) for every Kubernetes document of the directory, its bases (directories
    among the kustomization's resources) built first and patched; and the kustomization.
    Files are named relative to the directory checked (`../daemonset.yaml`). YAML files
    without a `kind` (an example web config) are not resources."""
    path_k = os.path.join(directory, "kustomization.yaml")
    kustomization = None
    if os.path.isfile(path_k):
        parsed = read_yaml(path_k, prefix + "kustomization.yaml", checker)
        kustomization = parsed[0] if parsed and isinstance(parsed[0], dict) else {}
    patches = {p.get("path") for p in (kustomization or {}).get("patches") or []
               if isinstance(p, dict)}
    docs = []
    for entry in (kustomization or {}).get("resources") or []:
        base = os.path.join(directory, entry)
        if os.path.isdir(base):
            docs.extend(load(base, checker, prefix + entry.rstrip("/") + "/")[0])
    for name in sorted(os.listdir(directory)):
        if not name.endswith((".yaml", ".yml")) or name == "kustomization.yaml":
            continue
        if name in patches:
            continue
        for doc in read_yaml(os.path.join(directory, name), prefix + name, checker):
            if isinstance(doc, dict) and "kind" not in doc and "apiVersion" not in doc:
                continue
            docs.append((prefix + name, doc))
    for patch in (kustomization or {}).get("patches") or []:
        apply_patch(directory, prefix, patch, docs, checker)
    return docs, kustomization


def apply_patch(directory, prefix, patch, docs, checker):
    """Applies one `patches:` entry (a JSON 6902 patch file and its target) to `docs`."""
    label = prefix + "kustomization.yaml"
    if not isinstance(patch, dict) or "path" not in patch or "target" not in patch:
        checker.error(label, f"patch {patch!r}: only `path` + `target` patches are checked")
        return
    ops = read_yaml(os.path.join(directory, patch["path"]), prefix + patch["path"], checker)
    ops = ops[0] if len(ops) == 1 else None
    if not isinstance(ops, list):
        checker.error(prefix + patch["path"], "not a JSON 6902 patch (a list of operations)")
        return
    target = patch["target"] or {}
    matched = [i for i, (_, d) in enumerate(docs)
               if d.get("kind") == target.get("kind")
               and (d.get("metadata") or {}).get("name") == target.get("name")]
    if not checker.check(len(matched) == 1, label,
                         f"patch {patch['path']}: target {target} matches {len(matched)} "
                         "resources, not one"):
        return
    name, doc = docs[matched[0]]
    for op in ops:
        try:
            doc = json_patch(doc, op)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            checker.error(prefix + patch["path"], f"{op!r} does not apply: {exc!r}")
            return
    docs[matched[0]] = (name, doc)


def json_patch(doc, op):
    """`doc` with one RFC 6902 operation (add, replace, remove) applied; raises where the
    path does not exist as the RFC says it must."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
    if not tokens:
        raise ValueError("the root cannot be patched")
    parent = doc
    for token in tokens[:-1]:
        parent = parent[int(token)] if isinstance(parent, list) else parent[token]
    last = tokens[-1]
    kind = op["op"]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            if index > len(parent):
                raise IndexError(index)
            parent.insert(index, op["value"])
        elif kind == "replace":
            parent[index] = op["value"]
        elif kind == "remove":
            del parent[index]
        else:
            raise ValueError(f"operation {kind} is not checked here")
    elif isinstance(parent, dict):
        if kind == "add":
            parent[last] = op["value"]
        elif kind == "replace":
            if last not in parent:
                raise KeyError(last)
            parent[last] = op["value"]
        elif kind == "remove":
            del parent[last]
        else:
            raise ValueError(f"operation {kind} is not checked here")
    else:
        raise TypeError(f"{op['path']}: parent is neither an object nor a list")
    return doc


def where(name, doc):
    meta = doc.get("metadata") or {}
    return f"{name}: {doc.get('kind', '?')}/{meta.get('name', '?')}"


def check_schemas(docs, checker):
    for name, doc in docs:
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            checker.error(name, "a document without apiVersion and kind")
            continue
        if doc["kind"] == "ServiceMonitor":
            validator = jsonschema.Draft7Validator(SERVICE_MONITOR)
            for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.path)):
                path = ".".join(str(p) for p in err.path) or "(root)"
                checker.error(where(name, doc), f"{path}: {err.message}")
            continue
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                path = ".".join(str(p) for p in err.path) or "(root)"
                checker.error(where(name, doc), f"Kubernetes {version}: {path}: {err.message}")
            except kubernetes_validate.SchemaNotFoundError:
                checker.error(where(name, doc), f"no schema in Kubernetes {version}")


def check_kustomization(directory, docs, kustomization, checker):
    if kustomization is None:
        return
    where_k = "kustomization.yaml"
    checker.check(
        kustomization.get("apiVersion") == "kustomize.config.k8s.io/v1beta1"
        and kustomization.get("kind") == "Kustomization",
        where_k,
        "apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization",
    )
    listed = kustomization.get("resources") or []
    files = sorted({name for name, _ in docs if "/" not in name})
    for entry in listed:
        checker.check(
            os.path.exists(os.path.join(directory, entry)), where_k, f"{entry} does not exist"
        )
    for patch in kustomization.get("patches") or []:
        path = (patch or {}).get("path", "") if isinstance(patch, dict) else ""
        checker.check(os.path.isfile(os.path.join(directory, path)), where_k,
                      f"patch {path} does not exist")
    for name in files:
        checker.check(name in listed, where_k, f"{name} is not in resources")
    images = {image.get("name") for image in kustomization.get("images") or []}
    for name, doc in docs:
        if "/" in name:
            continue  # a base's images are its own kustomization's
        if doc.get("kind") != "DaemonSet":
            continue
        for container in doc["spec"]["template"]["spec"].get("containers", []):
            image = container.get("image", "").rsplit(":", 1)[0]
            checker.check(
                not images or image in images,
                where_k,
                f"images names {sorted(images)}, the DaemonSet uses {image}",
            )


def find(docs, kind, name=None, namespace=None):
    for _, doc in docs:
        meta = doc.get("metadata") or {}
        if doc.get("kind") != kind:
            continue
        if name is not None and meta.get("name") != name:
            continue
        if namespace is not None and meta.get("namespace") != namespace:
            continue
        return doc
    return None


def subset(small, big):
    return all((big or {}).get(k) == v for k, v in (small or {}).items())


def check_daemonset(name, ds, docs, checker):
    w = where(name, ds)
    ns = ds["metadata"].get("namespace")
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    checker.check(subset(spec["selector"].get("matchLabels"), labels), w,
                  "selector.matchLabels do not match the pod template's labels")
    checker.check(pod.get("hostPID") is True, w, "hostPID must be true (host PIDs for BPF)")
    sa = pod.get("serviceAccountName")
    checker.check(find(docs, "ServiceAccount", sa, ns) is not None, w,
                  f"service account {sa} is not defined in namespace {ns}")
    checker.check(any(t.get("operator") == "Exists" and "key" not in t
                      for t in pod.get("tolerations", [])), w,
                  "must tolerate every taint (operator: Exists) to run on all nodes")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for volume in volumes.values():
        if "configMap" in volume:
            cm = volume["configMap"]["name"]
            checker.check(find(docs, "ConfigMap", cm, ns) is not None, w,
                          f"config map {cm} is not defined in namespace {ns}")
    containers = pod.get("containers", [])
    checker.check(len(containers) == 1, w, "one container expected")
    for c in containers:
        check_container(w, c, volumes, docs, ns, checker)


def check_container(w, c, volumes, docs, ns, checker):
    args = c.get("args", [])
    checker.check(args[:1] == ["agent"], w, "args must start with the `agent` command")
    flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    metrics = ports.get("metrics")
    checker.check(metrics is not None, w, "no container port named `metrics`")
    addr = flags.get("metrics-addr", "")
    checker.check(addr.startswith("0.0.0.0:") and addr.rsplit(":", 1)[-1] == str(metrics), w,
                  f"--metrics-addr {addr!r} must listen on 0.0.0.0 at the metrics port")
    web = flags.get("web-config")
    scheme = "HTTPS" if web else "HTTP"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        checker.check(get.get("path") == path and get.get("port") in ("metrics", metrics), w,
                      f"{probe} must GET {path} on the metrics port")
        checker.check(get.get("scheme", "HTTP") == scheme, w,
                      f"{probe} must say scheme: {scheme} "
                      f"({'with' if web else 'without'} --web-config)")
    env = {e["name"]: e for e in c.get("env", [])}
    node = ((env.get("NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef") or {}
    checker.check(node.get("fieldPath") == "spec.nodeName", w,
                  "NODE_NAME must come from the downward API (fieldRef spec.nodeName)")
    sc = c.get("securityContext") or {}
    checker.check(sc.get("privileged") is not True, w, "must not be privileged")
    caps = sc.get("capabilities") or {}
    checker.check(caps.get("drop") == ["ALL"], w, "capabilities must drop ALL")
    checker.check({"BPF", "PERFMON"} <= set(caps.get("add", [])), w,
                  "capabilities must add BPF and PERFMON")
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    config = flags.get("config", "")
    directory, key = os.path.split(config)
    mount = mounts.get(directory)
    source = volumes.get(mount["name"]) if mount else None
    if checker.check(source is not None and "configMap" in source, w,
                     f"--config {config} is not in a mounted ConfigMap"):
        cm = find(docs, "ConfigMap", source["configMap"]["name"], ns)
        checker.check(cm is not None and key in (cm.get("data") or {}), w,
                      f"the ConfigMap mounted at {directory} has no key {key}")
    if web:
        mount = mounts.get(os.path.dirname(web))
        source = volumes.get(mount["name"]) if mount else None
        checker.check(source is not None and "secret" in source, w,
                      f"--web-config {web} is not in a mounted Secret (it holds the TLS key)")
    for path in ("/sys/kernel/tracing", "/sys/fs/bpf", "/sys/kernel/btf", "/var/lib/lookback"):
        checker.check(path in mounts, w, f"{path} is not mounted")
    checker.check((mounts.get("/sys/kernel/btf") or {}).get("readOnly") is True, w,
                  "/sys/kernel/btf must be mounted read-only")


def check_rbac(docs, checker):
    for name, binding in [(n, d) for n, d in docs if d.get("kind") == "ClusterRoleBinding"]:
        w = where(name, binding)
        role = find(docs, "ClusterRole", binding["roleRef"]["name"])
        if checker.check(role is not None, w, "its ClusterRole is not defined"):
            verbs = set()
            for rule in role.get("rules", []):
                if "" in rule.get("apiGroups", []) and "pods" in rule.get("resources", []):
                    verbs |= set(rule.get("verbs", []))
            checker.check({"get", "list", "watch"} <= verbs, w,
                          "its ClusterRole must allow get, list and watch on pods")
        for subject in binding.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                checker.check(
                    find(docs, "ServiceAccount", subject["name"], subject.get("namespace"))
                    is not None, w, f"service account {subject['name']} is not defined")


def check_service(name, svc, docs, checker):
    w = where(name, svc)
    ds = find(docs, "DaemonSet", namespace=svc["metadata"].get("namespace"))
    if not checker.check(ds is not None, w, "no DaemonSet in its namespace"):
        return
    template = ds["spec"]["template"]
    checker.check(subset(svc["spec"].get("selector"), template["metadata"].get("labels")), w,
                  "selector does not match the DaemonSet's pods")
    names = {p.get("name") for c in template["spec"]["containers"] for p in c.get("ports", [])}
    for port in svc["spec"].get("ports", []):
        target = port.get("targetPort")
        checker.check(not isinstance(target, str) or target in names, w,
                      f"targetPort {target} is not a container port name")


def check_service_monitor(name, sm, docs, checker):
    w = where(name, sm)
    spec = sm.get("spec") or {}
    services = [d for _, d in docs if d.get("kind") == "Service"
                and subset((spec.get("selector") or {}).get("matchLabels"),
                           d["metadata"].get("labels"))]
    if not checker.check(services, w, "its selector matches no Service"):
        return
    names = (spec.get("namespaceSelector") or {}).get("matchNames")
    for svc in services:
        ns = svc["metadata"].get("namespace")
        checker.check(names is None or ns in names, w, f"namespaceSelector leaves out {ns}")
        ports = {p.get("name") for p in svc["spec"].get("ports", [])}
        for endpoint in spec.get("endpoints", []):
            checker.check(endpoint.get("port") in ports, w,
                          f"endpoint port {endpoint.get('port')} is not a port of the Service")
            check_endpoint_tls(w, endpoint, svc, docs, checker)


def check_endpoint_tls(w, endpoint, svc, docs, checker):
    """The scrape matches the agent's --web-config: https with basic auth and a server name
    of the Service when the agent has one, plain http otherwise."""
    ns = svc["metadata"].get("namespace")
    ds = find(docs, "DaemonSet", namespace=ns)
    args = [a for c in ((ds or {}).get("spec", {}).get("template", {}).get("spec", {})
                        .get("containers", [])) for a in c.get("args", [])]
    web = any(a.startswith("--web-config") for a in args)
    scheme = endpoint.get("scheme", "http")
    checker.check(scheme == ("https" if web else "http"), w,
                  f"endpoint scheme {scheme}, but the agent serves "
                  f"{'https (--web-config)' if web else 'http (no --web-config)'}")
    if not web:
        return
    checker.check("basicAuth" in endpoint, w, "no basicAuth: /metrics asks for credentials")
    tls = endpoint.get("tlsConfig") or {}
    names = {f"{svc['metadata']['name']}.{ns}.svc",
             f"{svc['metadata']['name']}.{ns}.svc.cluster.local"}
    checker.check(tls.get("insecureSkipVerify") is True or tls.get("serverName") in names, w,
                  f"tlsConfig.serverName must be one of {sorted(names)} (pods are scraped by "
                  "IP; the certificate is checked for that name)")


def check_references(docs, checker):
    for name, doc in docs:
        kind = doc.get("kind")
        try:
            if kind == "DaemonSet":
                check_daemonset(name, doc, docs, checker)
            elif kind == "Service":
                check_service(name, doc, docs, checker)
            elif kind == "ServiceMonitor":
                check_service_monitor(name, doc, docs, checker)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            checker.error(where(name, doc), f"malformed ({exc!r})")
    check_rbac(docs, checker)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--extract-rules", metavar="OUT")
    args = parser.parse_args()
    checker = Checker()
    docs, kustomization = load(args.directory, checker)
    check_schemas(docs, checker)
    check_kustomization(args.directory, docs, kustomization, checker)
    if not checker.errors:
        check_references(docs, checker)
    if args.extract_rules:
        cm = find(docs, "ConfigMap", RULES_CONFIGMAP)
        rules = ((cm or {}).get("data") or {}).get(RULES_KEY)
        if checker.check(rules is not None, "ConfigMap", f"{RULES_CONFIGMAP} has no {RULES_KEY}"):
            with open(args.extract_rules, "w", encoding="utf-8") as f:
                f.write(rules)
    for error in checker.errors:
        print(error, file=sys.stderr)
    if checker.errors:
        sys.exit(1)
    json.dump(
        {
            "versions": VERSIONS,
            "resources": [f"{d['kind']}/{d['metadata']['name']}" for _, d in docs],
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
