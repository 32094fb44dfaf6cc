"""The Spark session: Java check, Python workers, our data source.

Run by ``sentinel`` itself, the session is local (``spark.master`` of the config) and users never
set ``PYSPARK_PYTHON``: the driver and its workers run the interpreter that runs this code (the
project's ``.venv``), so the workers can import the project's packages. Run by ``spark-submit``
(``infra/spark_submit_main.py``), spark-submit owns the cluster: its ``--master``, driver memory,
``spark.pyspark.python`` and every ``--conf`` it was given are left as given; the sentinel's
settings fill in only what it left unset.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys

from pyspark.sql import SparkSession

from pipelines.config import SentinelConfig
from pipelines.errors import SetupError
from pipelines.io.kafka_source import KafkaDataSource

log = logging.getLogger(__name__)

REQUIRED_JAVA_MAJOR = 17


class JavaMissing(SetupError, RuntimeError):
    """No suitable Java runtime for Spark."""


def java_major_version(java: str) -> int:
    output = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if not match:
        raise JavaMissing(f"could not read the version of {java}: {output.strip()[:200]}")
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 else major  # "1.8.0" style


def ensure_java() -> str:
    """Return the java executable Spark will use, or raise with what to install."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissing(
            f"Spark needs Java {REQUIRED_JAVA_MAJOR}, and none was found"
            f"{' at $JAVA_HOME=' + java_home if java_home else ' on PATH'}. "
            "Install it (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    major = java_major_version(java)
    if major < REQUIRED_JAVA_MAJOR:
        raise JavaMissing(
            f"Spark 4 needs Java {REQUIRED_JAVA_MAJOR} or newer; {java} is Java {major}. "
            "Install openjdk-17 and point JAVA_HOME at it."
        )
    return java


def submitted() -> bool:
    """True when spark-submit started this driver (it hands the Python process its JVM's port)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def submitted_conf() -> dict[str, str]:
    """What the submitter gave this driver: spark-submit's ``--conf``, ``--name``, properties file
    and ``spark-defaults.conf``, as its JVM holds them (the JVM spark-submit started is running)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM; starts nothing
    return dict(SparkConf().getAll())


def unset_by_submitter(settings: dict[str, str], given: dict[str, str]) -> dict[str, str]:
    """The ``settings`` the submitter's ``given`` ones leave to the sentinel: a builder option
    would override spark-submit's ``--conf`` (PySpark applies them over SparkConf), so a key it set
    is left as set. spark-submit names every application after its file unless ``--name`` says
    otherwise: that name is not a choice, and the config's applies.

    >>> unset_by_submitter({"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
    ...                     "spark.app.name": "checkpoint-sentinel"},
    ...                    {"spark.ui.enabled": "true", "spark.app.name": "spark_submit_main.py"})
    {'spark.sql.session.timeZone': 'UTC', 'spark.app.name': 'checkpoint-sentinel'}
    """
    chosen = {k: v for k, v in given.items() if not (k == "spark.app.name" and v.endswith(".py"))}
    left = {k: v for k, v in settings.items() if k not in chosen}
    for key in sorted(set(settings) - set(left)):
        if chosen[key] != settings[key]:
            log.info("spark-submit set %s=%s: the sentinel's %s is not applied", key, chosen[key], settings[key])
    return left


def build_spark(config: SentinelConfig, app_suffix: str = "") -> SparkSession:
    """Get or create the session described by ``config.spark``, with the Kafka data source
    registered. Under spark-submit, a setting it was given wins over the config's and the
    sentinel's own (:func:`unset_by_submitter`)."""
    ensure_java()
    spark_cfg = config.spark
    builder = SparkSession.builder
    if not submitted():
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        # Two glibc malloc arenas for the JVM this starts and the Python workers it forks (glibc
        # reads the variable when a process starts, so this one's own Python keeps its arenas):
        # with glibc's default of eight a core, memory RocksDB frees stays in the arenas and the
        # JVM's resident memory climbs all run (BENCHMARKS.md, "The JVM's memory"). A value in the
        # environment wins.
        os.environ.setdefault("MALLOC_ARENA_MAX", "2")
        builder = (builder.master(spark_cfg.master)
                   .config("spark.driver.memory", spark_cfg.driver_memory)
                   # Spark's scratch files inside the project's state folder, not /tmp at random (a
                   # cluster's workers have their own SPARK_LOCAL_DIRS).
                   .config("spark.local.dir", str(config.state_dir / "spark-local")))
    settings = {
        "spark.app.name": spark_cfg.app_name + (f"-{app_suffix}" if app_suffix else ""),
        "spark.sql.shuffle.partitions": str(spark_cfg.shuffle_partitions),
        "spark.ui.enabled": str(spark_cfg.ui_enabled).lower(),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
        # transformWithState (the streaming features) needs RocksDB; it also keeps large state off-heap.
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        # A commit writes the changed rows, not a RocksDB snapshot (flush, new SST files, a zip per
        # batch and partition); snapshots are made in the background. Every job's state changes
        # every few seconds, so a snapshot per batch copied the whole state each time.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Spark's checkpoint files on this machine (file:) without Hadoop's .crc file beside each:
        # a micro-batch writes and renames a dozen small files (its offsets, its commit, each
        # partition's state changelog) through Hadoop's FileContext, and the checksummed one
        # doubled what each cost (see BENCHMARKS.md, "2026-11-26, 0b8126f: checkpoint files
        # without `.crc`"). Renames stay atomic (the same call underneath). Only FileContext's:
        # RocksDB's snapshot upload needs Hadoop's FileSystem for file: to stay the checksummed
        # LocalFileSystem (it casts it). Other schemes (s3a:) are untouched; spark.extra_conf may
        # set this back.
        "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
        "spark.sql.warehouse.dir": str(config.state_dir / "spark-warehouse"),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={config.state_dir / 'derby'}",
        # The storage settings first: spark.extra_conf may refine Hadoop's S3 client further.
        **config.storage.spark_conf(), **spark_cfg.extra_conf,
    }
    for key, value in unset_by_submitter(settings, submitted_conf() if submitted() else {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(spark_cfg.log_level)
    spark.dataSource.register(KafkaDataSource)
    return spark


if __name__ == "__main__":  # `python -m pipelines.spark_session`: the Java check `make` runs first
    import sys as _sys

    try:
        print(f"java: {ensure_java()} (Java {java_major_version(ensure_java())})")
    except JavaMissing as exc:
        print(f"error: {exc}", file=_sys.stderr)
        _sys.exit(1)
