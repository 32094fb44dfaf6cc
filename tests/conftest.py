"""Shared fixtures: one real broker and one real local Spark session per test process (pytest-xdist
runs two), and the run's trained champions (tests/champions.py).

The broker is the project's own embedded-stack launcher on a free port with a temporary state
folder; every test gets topics of its own, so tests never see each other's records.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["GX_ANALYTICS_ENABLED"] = "false"
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# The tests' JVMs (Spark drivers, `sentinel run` subprocesses, Flink, the champions' training) live
# for seconds to minutes on little data: C2's optimising compiles cost more CPU than they win back.
# C1 only, on the tests' JVMs: less CPU on a small machine. Production JVMs keep the JDK's default.
if "-XX:TieredStopAtLevel" not in os.environ.get("JAVA_TOOL_OPTIONS", ""):
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(filter(None, [os.environ.get("JAVA_TOOL_OPTIONS"),
                                                             "-XX:TieredStopAtLevel=1"]))
# pytest-xdist's workers run as `python -c`, so their __main__ has no __file__. PySpark's Connect
# package takes that for its own doctest run and calls sys.exit(0) when grpc is missing; Great
# Expectations imports it (expecting an ImportError it handles), so a worker would exit mid-collection.
if os.environ.get("PYTEST_XDIST_WORKER") and not hasattr(sys.modules["__main__"], "__file__"):
    sys.modules["__main__"].__file__ = "<pytest-xdist worker>"

# Client threads (kafka-python's) can outlive the test whose captured stream they log to; a
# logging error there is noise, and its traceback, formatted while other tests run, is what made
# CPython 3.11 fail a concurrent ast.parse (tests/helpers/modules.py, ``parse``).
logging.raiseExceptions = False

from infra.embedded_stack import EmbeddedStack, free_port  # noqa: E402
from pipelines.config import SentinelConfig, TopicsConfig, load_config  # noqa: E402
from pipelines.io import kafka_clients  # noqa: E402

from tests import champions, debian  # noqa: E402
from tests.champions import LAB_CORPUS, PROJECT_ROOT, TRAINING_GRID  # noqa: E402,F401  (tests import them from here)


def debian_binary(name: str, package: str) -> str:
    """The path of ``name``, which Debian's ``package`` ships (installed once per run, see tests/debian.py)."""
    assert debian.TEST_BINARIES.get(name) == package, f"add {name}: {package} to tests.debian.TEST_BINARIES"
    return debian.binary(name)


def pytest_configure(config):
    # The controller runs this before pytest-xdist starts its workers: one apt-get, no race for dpkg's lock.
    if not hasattr(config, "workerinput"):
        try:
            installed = debian.install()
        except debian.DebianPackagesMissing as exc:
            raise pytest.UsageError(str(exc)) from None
        if installed:
            print(f"installed Debian packages for the tests: {', '.join(installed)}", flush=True)


def config_for(state_dir: Path, **env: str) -> SentinelConfig:
    """A config with only the given overrides (the developer's own environment is ignored)."""
    # Metrics endpoints on any free port: tests run side by side with a developer's own sentinel.
    environ = {"SENTINEL_STATE_DIR": str(state_dir), "SENTINEL_DETECTION__METRICS_PORT": "0",
               "SENTINEL_COLLECTOR__METRICS_PORT": "0",
               "SENTINEL_ALERT__METRICS_PORT": "0", **{f"SENTINEL_{k.upper()}": v for k, v in env.items()}}
    return load_config(environ=environ, base_dir=state_dir)


@pytest.fixture(scope="session")
def broker_config(tmp_path_factory) -> SentinelConfig:
    """The config of the session's broker (started by the project's launcher on a free port)."""
    state_dir = tmp_path_factory.mktemp("sentinel-state")
    config = config_for(
        state_dir,
        kafka__bootstrap_servers=f"127.0.0.1:{free_port()}",
        stack__start_mlflow_server="false",
        kafka__connect_timeout_s="10",
    )
    stack = EmbeddedStack(config)
    stack.up(mlflow=False)
    yield config
    stack.down()


@pytest.fixture
def config(broker_config: SentinelConfig, tmp_path: Path) -> SentinelConfig:
    """The session broker with topics and checkpoint folders unique to this test."""
    suffix = uuid.uuid4().hex[:8]
    cfg = broker_config.model_copy(deep=True)
    cfg.topics = TopicsConfig(
        input=f"metrics-{suffix}", incidents=f"incidents-{suffix}", dead_letter=f"dlq-{suffix}"
    )
    cfg.spark.checkpoint_location = tmp_path / "checkpoints"
    kafka_clients.ensure_topics(
        cfg.kafka.bootstrap_servers, cfg.kafka.client_kwargs(),
        [cfg.topics.input, cfg.topics.incidents, cfg.topics.dead_letter], cfg.kafka.topic_partitions,
    )
    return cfg


@pytest.fixture
def new_topic(broker_config: SentinelConfig):
    """Create a fresh topic: ``new_topic(partitions=3) -> name``."""

    def create(partitions: int = 3) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        kafka_clients.ensure_topics(
            broker_config.kafka.bootstrap_servers, broker_config.kafka.client_kwargs(), [name], partitions
        )
        return name

    return create


@pytest.fixture(scope="session")
def spark(broker_config: SentinelConfig):
    from pipelines.spark_session import build_spark

    session = build_spark(broker_config, "tests")
    yield session
    session.stop()


# --- trained champions ----------------------------------------------------------------------------
# Trained once per test run by tests/champions.py in a process of its own, started by the first test
# of a process whose collected tests need them; those tests run last, so the training overlaps the
# others (and pytest-xdist's workers share it).
CHAMPION_FIXTURES = {"trained_store"}


def _needs_champions(item) -> bool:
    return not CHAMPION_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(session, config, items):
    """Files whose tests need the champions go last, each file kept whole and in its order (module
    fixtures are made once; pytest-xdist hands out whole files, ``--dist loadfile``)."""
    needing = {item.path for item in items if _needs_champions(item)}
    items.sort(key=lambda item: item.path in needing)


def _champions_root(tmp_path_factory) -> Path:
    # A developer running a few files again and again can train once: `python -m tests.champions DIR`,
    # then PYTEST_TRAINED_CHAMPIONS=DIR (a folder whose training is done; it is never changed; not SENTINEL_*,
    # which `sentinel` reads as its own settings).
    if os.environ.get("PYTEST_TRAINED_CHAMPIONS"):
        return Path(os.environ["PYTEST_TRAINED_CHAMPIONS"])
    base = tmp_path_factory.getbasetemp()
    # pytest-xdist gives each worker its own base folder inside the run's folder.
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "champions"


@pytest.fixture(scope="session", autouse=True)
def champions_in_background(request, tmp_path_factory):
    """Start the champions' training now if this process's tests need it and no other process has
    (never into a folder trained by hand: a training there would move its aliases mid-session)."""
    process = None
    trained_by_hand = bool(os.environ.get("PYTEST_TRAINED_CHAMPIONS"))
    if not trained_by_hand and any(_needs_champions(item) for item in request.session.items):
        process = champions.start(_champions_root(tmp_path_factory))
    yield
    if process is not None and process.poll() is None:
        if request.session.shouldfail or request.session.shouldstop:
            process.kill()
        process.wait()  # another worker may still be waiting for it


@pytest.fixture(scope="session")
def trained_store(tmp_path_factory) -> SentinelConfig:
    """The config of an MLflow store whose five detectors have ``champion`` aliases.

    Trained by the project's own workflow (simulated and real-Flink datasets, offline store, GX
    validation, MLflow registration, the gate); tests never move its aliases.
    """
    from models import registry

    root = _champions_root(tmp_path_factory)
    if os.environ.get("PYTEST_TRAINED_CHAMPIONS") and not (root / champions.DONE).exists():
        raise RuntimeError(f"PYTEST_TRAINED_CHAMPIONS={root} has no finished training: run "
                           f"`python -m tests.champions {root}` first, or unset it")
    champions.wait_for(root, champions.DONE)
    config = config_for(champions.store_state_dir(root))
    registry.use_config(config)
    return config


# Three committed lab runs every incident consumer's tests share: a leak on JobManager checkpoint
# storage (whose 5 MiB limit Flink itself imposes), a hot key, severe backpressure.
LAB_LEAK_RUN = "leak_start-hashmap-jobmanager-p2-r120-b100-i3000"  # validation split
LAB_SKEW_RUN = "skew-p4-s0.7-nobp-r200"  # test split
LAB_BACKPRESSURE_RUN = "backpressure-severe-aligned-p2-r120"  # test split


@pytest.fixture(scope="session")
def lab_replay(trained_store, tmp_path_factory):
    """The three runs replayed with the session's champions: ``(event files, ReplayResult,
    {job_id: run_id})`` (the result's rows are the feature rows the live job would log)."""
    from pipelines.datasets import events_path, read_jsonl, subset
    from pipelines.detection.champions import ChampionCache
    from pipelines.detection.flink_job import replay

    dataset = subset(LAB_CORPUS, [LAB_LEAK_RUN, LAB_SKEW_RUN, LAB_BACKPRESSURE_RUN],
                     tmp_path_factory.mktemp("lab-runs") / "lab")
    events = [p for split in ("validation", "test") if (p := events_path(dataset, split)) is not None]
    result = replay(trained_store, events, ChampionCache(trained_store).require())
    runs = {t["job_id"]: t["run_id"] for split in ("validation", "test")
            for t in read_jsonl(dataset / split / "ground_truth.jsonl")}
    return events, result, runs


def first_opened(incidents, family: str, run: str, runs: dict) -> dict:
    """The first incident of ``family`` opened on lab run ``run``."""
    found = [i for i in incidents if i["event"] == "opened" and i["family"] == family and runs[i["job_id"]] == run]
    assert found, f"no {family} incident on {run}: {[(i['family'], runs[i['job_id']]) for i in incidents]}"
    return found[0]


# --- a real Alertmanager --------------------------------------------------------------------------
@pytest.fixture
def alertmanager(tmp_path):
    """Debian's Alertmanager with the shipped config, started, its receivers a webhook the test
    reads (``alertmanager.webhook``): what on-call would be paged with."""
    from tests.helpers.alertmanager import Alertmanager, Webhook

    webhook = Webhook()
    manager = Alertmanager(tmp_path, webhook)
    manager.start()
    yield manager
    if manager.process.poll() is None:
        manager.stop()
    webhook.server.shutdown()


# --- an S3 store -----------------------------------------------------------------------------------
# moto's server speaks the S3 REST API (buckets, objects, multipart uploads, listings by prefix) on
# loopback: what pyarrow and Hadoop's s3a client talk to in production, minus the cloud.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "sentinel-test", "AWS_SECRET_ACCESS_KEY": "sentinel-test-secret",
                  "AWS_DEFAULT_REGION": "us-east-1"}


class S3Store:
    def __init__(self, endpoint_url: str, bucket: str):
        self.endpoint_url, self.bucket = endpoint_url, bucket

    def environment(self) -> dict[str, str]:
        """What a `sentinel` process needs to reach the store: credentials the standard way, the endpoint."""
        return {**S3_CREDENTIALS, "SENTINEL_STORAGE__S3_ENDPOINT_URL": self.endpoint_url}

    def filesystem(self):
        from pyarrow import fs

        return fs.S3FileSystem(endpoint_override=self.endpoint_url.split("://", 1)[1], scheme="http",
                               access_key=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"], allow_bucket_creation=True,
                               secret_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region="us-east-1")

    def keys(self, prefix: str) -> list[str]:
        """Every object under ``s3://<bucket>/<prefix>/``, named relative to that prefix."""
        from pyarrow import fs

        root = f"{self.bucket}/{prefix}"
        selector = fs.FileSelector(root, recursive=True, allow_not_found=True)
        return sorted(i.path[len(root) + 1:] for i in self.filesystem().get_file_info(selector)
                      if i.type == fs.FileType.File)


@pytest.fixture(scope="session")
def s3_store(tmp_path_factory) -> S3Store:
    """A running S3-compatible server with one bucket (moto, installed with the test extra)."""
    import time

    from infra.embedded_stack import port_in_use, stop_process_group

    port = free_port()
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not port_in_use("127.0.0.1", port):
            assert server.poll() is None and time.monotonic() < deadline, f"moto did not start: {log.read_text()}"
            time.sleep(0.2)
        store = S3Store(f"http://127.0.0.1:{port}", "sentinel-shared")
        store.filesystem().create_dir(store.bucket)
        yield store
    finally:
        stop_process_group(server.pid)
