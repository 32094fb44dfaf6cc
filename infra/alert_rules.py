"""The shipped alerting rules rendered for a deployment: its scrape job names, where its runbooks
are served, and as a Prometheus Operator ``PrometheusRule``.

``infra/prometheus/sentinel-alerts.yml`` is the one source (promtool checks and unit-tests it); it
names the default scrape jobs (:data:`DEFAULT_JOBS`) and links each alert to its section of
docs/OPERATIONS.md. A deployment whose jobs are named otherwise (the Prometheus Operator names a
PodMonitor's job ``<namespace>/<name>`` unless told) renders its own copy instead of editing it::

    python -m infra.alert_rules --job detection=sentinel/detection --runbook-base https://wiki.internal/sentinel \\
        > sentinel-alerts.yml
    python -m infra.alert_rules --prometheus-rule checkpoint-sentinel --namespace monitoring > prometheusrule.yaml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

RULES_FILE = Path(__file__).resolve().parent / "prometheus" / "sentinel-alerts.yml"
# part -> the scrape job the committed rules select
DEFAULT_JOBS = {"detection": "checkpoint-sentinel-detection", "collector": "checkpoint-sentinel-collector",
                "alert": "checkpoint-sentinel-alert"}
DEFAULT_RUNBOOK_BASE = "docs/OPERATIONS.md"
_JOB_MATCHER = re.compile(r'job="([^"]*)"')


def load(path: Path = RULES_FILE) -> dict:
    return yaml.safe_load(path.read_text())


def alerts(rules: dict) -> list[dict]:
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def render(rules: dict, jobs: dict[str, str] | None = None, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> dict:
    """``rules`` with each default job name replaced by ``jobs[part]`` and each runbook link moved
    to ``runbook_base``; a job matcher the defaults do not name is an error, not left behind.

    >>> rule = {"alert": "A", "expr": 'up{job="checkpoint-sentinel-alert"} == 0',
    ...         "annotations": {"runbook_url": "docs/OPERATIONS.md#a"}}
    >>> out = alerts(render({"groups": [{"name": "g", "rules": [rule]}]}, {"alert": "ns/relay"}, "https://x/ops"))[0]
    >>> out["expr"], out["annotations"]["runbook_url"]
    ('up{job="ns/relay"} == 0', 'https://x/ops#a')
    """
    names = {**DEFAULT_JOBS, **(jobs or {})}
    unknown = set(names) - set(DEFAULT_JOBS)
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(sorted(unknown))}: the parts are {', '.join(DEFAULT_JOBS)}")
    by_default = {DEFAULT_JOBS[part]: name for part, name in names.items()}

    def job(match: re.Match) -> str:
        if match.group(1) not in by_default:
            raise ValueError(f"a rule selects job {match.group(1)!r}, which is none of the parts' scrape jobs")
        return f'job="{by_default[match.group(1)]}"'

    rendered = {"groups": []}
    for group in rules["groups"]:
        out = []
        for rule in group["rules"]:
            rule = {**rule, "expr": _JOB_MATCHER.sub(job, rule["expr"])}
            annotations = dict(rule.get("annotations", {}))
            if "runbook_url" in annotations:
                anchor = annotations["runbook_url"].split("#", 1)[1]
                annotations["runbook_url"] = f"{runbook_base.rstrip('/')}#{anchor}"
                rule["annotations"] = annotations
            out.append(rule)
        rendered["groups"].append({**group, "rules": out})
    return rendered


def prometheus_rule(rules: dict, name: str, namespace: str, labels: dict[str, str] | None = None) -> dict:
    """The rules as a ``monitoring.coreos.com/v1`` PrometheusRule; ``labels`` are what the
    Prometheus resource's ``ruleSelector`` matches."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "checkpoint-sentinel", **(labels or {})}},
            "spec": {"groups": rules["groups"]}}


def runbooks_markdown(rules: dict) -> str:
    """The "Alert runbooks" section of docs/OPERATIONS.md: one heading per alert, where its
    ``runbook_url`` points, with what fires it and what to do."""
    lines = ["## Alert runbooks", "",
             "One section per rule of `infra/prometheus/sentinel-alerts.yml` (generated from it by `python -m",
             "infra.alert_rules --runbooks`; its `runbook_url` annotations point here).", ""]
    for rule in alerts(rules):
        expr = " ".join(rule["expr"].split())
        wait = f", for {rule['for']}" if rule.get("for") else ""
        lines += [f"### {rule['alert']}", "",
                  f"*{rule['labels']['severity']}*: `{expr}`{wait}.", "",
                  rule["annotations"]["description"], ""]
    return "\n".join(lines)


def _dump(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.alert_rules", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", action="append", default=[], metavar="PART=NAME",
                        help=f"the scrape job of a part ({', '.join(DEFAULT_JOBS)}); repeatable")
    parser.add_argument("--runbook-base", default=DEFAULT_RUNBOOK_BASE, help="where docs/OPERATIONS.md is served")
    parser.add_argument("--prometheus-rule", metavar="NAME", help="write a PrometheusRule of this name")
    parser.add_argument("--namespace", default="monitoring")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                        help="a label of the PrometheusRule (what the Prometheus's ruleSelector matches)")
    parser.add_argument("--runbooks", action="store_true", help="print the runbook section of docs/OPERATIONS.md")
    args = parser.parse_args(argv)
    try:
        jobs = dict(item.split("=", 1) for item in args.job)
        labels = dict(item.split("=", 1) for item in args.label)
        rules = render(load(), jobs, args.runbook_base)
    except ValueError as exc:
        parser.error(str(exc))
    if args.runbooks:
        sys.stdout.write(runbooks_markdown(rules))
    elif args.prometheus_rule:
        sys.stdout.write(_dump(prometheus_rule(rules, args.prometheus_rule, args.namespace, labels)))
    else:
        sys.stdout.write(_dump(rules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
