"""The Kubernetes manifests (infra/kubernetes/), checked offline: no cluster runs here.

What is validated: every core resource (ConfigMap, Secret, StatefulSet, Deployment, Service)
against Kubernetes' own OpenAPI schemas in strict mode (kubernetes-validate: unknown fields are
errors); the PrometheusRule is the shipped rules file's rendering and passes `promtool check
rules`; the ConfigMap's sentinel.yaml is a valid config; ports, shards and names agree across the
files and with the config. What is not: the PodMonitor and the SparkApplication against their
operators' CRD schemas (no copy of those CRDs could be taken from a package registry here), and
nothing is applied to a cluster.
"""

from __future__ import annotations

import subprocess

import kubernetes_validate
import pytest
import yaml

from infra import alert_rules
from pipelines.config import SentinelConfig
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
