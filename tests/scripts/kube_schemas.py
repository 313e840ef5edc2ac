"""What the Kubernetes schema checks share (check_manifests.py, check_api_fixtures.py): the
PyPI packages, looked up on sys.path and then in .tools/python (where `cargo xtask setup`
installs them), exit 3 when they are missing, and the Kubernetes versions we claim."""
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "..", ".tools", "python"))


def require(*names):
    """The modules `names`, or exit 3 with what to run."""
    try:
        return [importlib.import_module(name) for name in names]
    except ImportError as exc:  # pragma: no cover
        print(f"a package is missing ({exc}); run `cargo xtask setup`", file=sys.stderr)
        sys.exit(3)


jsonschema, kubernetes_validate = require("jsonschema", "kubernetes_validate")

# Oldest Kubernetes release we support, and the newest the pinned package knows.
VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]
