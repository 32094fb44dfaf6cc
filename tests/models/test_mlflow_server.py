"""MLflow the way teams run it: a tracking server over HTTP with a PostgreSQL backend store and
artifacts it serves itself. `sentinel train`'s workflow registers there, and the job's champion
cache loads by alias from it.

PostgreSQL is Debian's (installed by the test when missing), a cluster of its own in a temporary
folder on a free port; the tracking server is MLflow's own, started as `mlflow server` is in
production.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from infra.embedded_stack import free_port, mlflow_healthy, stop_process_group
from models.detectors import FAMILY_LEVEL, rows_for
from models.training import run_training
from pipelines.detection.champions import ChampionCache
from pipelines.families import STATE_LEAK
from tests.conftest import LAB_CORPUS, TRAINING_GRID, config_for, debian_binary

pytestmark = pytest.mark.slow


def _wait_until(ready, what: str, process: subprocess.Popen, log: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{what} exited with {process.returncode}: {log.read_text()[-2000:]}")
        if ready():
            return
        time.sleep(0.5)
    pytest.fail(f"{what} not ready after {timeout_s:.0f} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of the test's own: ``postgresql://postgres@127.0.0.1:PORT/mlflow``."""
    debian_binary("pg_ctlcluster", "postgresql")
    bin_dir = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1]).parent
    # The server refuses to run as root: its files and process belong to Debian's postgres user.
    data = Path(tempfile.mkdtemp(prefix="sentinel-postgres-"))
    shutil.chown(data, "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_postgres, str(bin_dir / "initdb"), "-D", str(data / "db"), "--auth=trust", "-U", "postgres"],
                   check=True, capture_output=True, timeout=120)
    port, log = free_port(), data / "postgres.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([*as_postgres, str(bin_dir / "postgres"), "-D", str(data / "db"), "-p", str(port),
                                   "-k", str(data), "-c", "listen_addresses=127.0.0.1"],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def ready() -> bool:
        return subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                              capture_output=True).returncode == 0

    _wait_until(ready, "PostgreSQL", server, log)
    subprocess.run([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "mlflow"],
                   check=True, capture_output=True, timeout=60)
    yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    stop_process_group(server.pid)
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def tracking_server(postgres, tmp_path_factory):
    """``mlflow server`` on the PostgreSQL store, serving artifacts from a folder of its own:
    ``(url, that folder)``."""
    root = tmp_path_factory.mktemp("mlflow-server")
    served, log, port = root / "served-artifacts", root / "server.log", free_port()
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", postgres,
             "--artifacts-destination", served.as_uri(), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=root,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    url = f"http://127.0.0.1:{port}"
    _wait_until(lambda: mlflow_healthy(url), "mlflow server", server, log, timeout_s=180)
    yield url, served
    stop_process_group(server.pid)


def test_train_registers_on_a_tracking_server_and_the_job_loads_champions_from_it(
        tracking_server, postgres, trained_store, spark, tmp_path, monkeypatch):
    import psycopg

    url, served = tracking_server
    monkeypatch.chdir(tmp_path)  # where a misplaced ./mlruns would appear
    # The session's offline store: the real-Flink corpus's features are computed there already
    # (what is trained on does not matter here, where it is registered and loaded from does).
    config = config_for(tmp_path / "state", mlflow__tracking_uri=url,
                        mlflow__artifact_root="mlflow-artifacts:/checkpoint-sentinel",
                        features__offline_path=str(trained_store.features.offline_path))
    lines: list[str] = []
    (outcome,) = run_training(spark, config, [LAB_CORPUS], families=[STATE_LEAK], grid=TRAINING_GRID,
                              progress=lines.append)
    assert outcome.promoted and outcome.version == "1"  # the store's first, no champion to beat
    assert (f"MLflow experiment 'checkpoint-sentinel' at {url}, artifacts in "
            "mlflow-artifacts:/checkpoint-sentinel/checkpoint-sentinel") in lines

    # The registry lives in PostgreSQL ...
    with psycopg.connect(postgres) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT name, alias, version FROM registered_model_aliases ORDER BY alias")
        assert cursor.fetchall() == [("sentinel-state-leak", "challenger", 1), ("sentinel-state-leak", "champion", 1)]
        cursor.execute("SELECT artifact_location FROM experiments WHERE name = 'checkpoint-sentinel'")
        assert cursor.fetchone() == ("mlflow-artifacts:/checkpoint-sentinel/checkpoint-sentinel",)
    # ... the model in the server's artifact store, none of it in the client's folders.
    requirements = list(served.rglob("requirements.txt"))
    assert len(requirements) == 1 and not (tmp_path / "mlruns").exists()
    assert "checkpoint-sentinel==0.*" in requirements[0].read_text().split()

    # The job's champion cache loads by alias over HTTP and scores as the trained model does.
    models = ChampionCache(config).require()
    assert set(models) == {STATE_LEAK}
    leak = models[STATE_LEAK]
    assert (leak.name, leak.version, leak.alias) == ("sentinel-state-leak", "1", "champion")
    # The generic pyfunc path, from the server too, scores as the loaded detector does.
    rows = _feature_rows(trained_store, leak)
    assert len(rows) == 200
    pyfunc = mlflow.pyfunc.load_model("models:/sentinel-state-leak@champion")
    assert np.allclose(pyfunc.predict(rows).to_numpy(), leak.detector.score(rows))


def _feature_rows(trained_store, model) -> pd.DataFrame:
    """Real feature rows of the model's level, from the session's offline store."""
    parts = sorted(Path(trained_store.features.offline_path).rglob("*.parquet"))
    frame = pd.concat([pd.read_parquet(p) for p in parts[:4]], ignore_index=True)
    rows = rows_for(frame, FAMILY_LEVEL[model.config.family]).loc[:, list(model.config.features)]
    return rows.head(200).astype("float64")
