"""The project's Spark session, as `sentinel` builds it."""

from __future__ import annotations

import json
import os


def test_a_local_checkpoint_is_written_without_checksum_files_and_resumes(spark, tmp_path):
    # The session writes Spark's checkpoint files through Hadoop's raw local FileContext (no .crc
    # beside each, which made a micro-batch's offsets, commit and state changelogs twice as dear):
    # a query's checkpoint must still hold what a restarted query resumes from.
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    seen: list[int] = []

    def run_once() -> None:
        query = (spark.readStream.schema("n long").json(str(source))
                 .groupBy().count()  # state in the state store, as the detection job keeps it
                 .writeStream.outputMode("complete")
                 .foreachBatch(lambda batch, _: seen.extend(row["count"] for row in batch.collect()))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    (source / "a.json").write_text("\n".join(json.dumps({"n": n}) for n in range(3)))
    run_once()
    (source / "b.json").write_text("\n".join(json.dumps({"n": n}) for n in range(4)))
    run_once()

    assert seen == [3, 7]  # the second run read only the new file, and counted on from the stored state
    written = [p for p in checkpoint.rglob("*") if p.is_file()]
    assert any(p.parent.name == "commits" for p in written) and any(p.parent.name == "offsets" for p in written)
    assert not [p for p in written if p.name.endswith(".crc")]


def test_the_jvm_and_its_python_workers_run_with_two_malloc_arenas(spark):
    # build_spark caps glibc's arenas for the JVM it starts (a value already in the environment
    # wins): the JVM's resident memory climbed all run with the default (BENCHMARKS.md, "The
    # JVM's memory"). The JVM and the Python workers it forks must have it in their environment
    # from their start.
    expected = os.environ.get("MALLOC_ARENA_MAX")
    assert expected is not None, "build_spark did not set MALLOC_ARENA_MAX before starting the JVM"
    assert spark.sparkContext._jvm.java.lang.System.getenv("MALLOC_ARENA_MAX") == expected
    seen = spark.sparkContext.parallelize([0], 1).map(lambda _: os.environ.get("MALLOC_ARENA_MAX")).collect()
    assert seen == [expected]


def test_spark_submit_s_conf_wins_over_the_sentinel_s_settings_and_fills_in_the_rest(tmp_path):
    """PySpark applies a builder's options over SparkConf: build_spark must not set what the
    submitter gave (a real spark-submit, --conf and --name), and must set what it did not."""
    import subprocess
    import sys
    from pathlib import Path

    import pyspark

    from tests.helpers.cli import environment_without_settings

    driver = tmp_path / "driver.py"
    driver.write_text(
        "import json, sys\n"
        "from pipelines.config import load_config\n"
        "from pipelines.spark_session import build_spark\n"
        "spark = build_spark(load_config())\n"
        "keys = ['spark.sql.shuffle.partitions', 'spark.ui.enabled', 'spark.app.name', 'spark.sql.session.timeZone',\n"
        "        'spark.sql.streaming.stateStore.providerClass', 'spark.sql.warehouse.dir', 'spark.master']\n"
        "print('CONF ' + json.dumps({k: spark.conf.get(k) for k in keys}), flush=True)\n"
        "spark.stop()\n")
    spark_home = Path(pyspark.__file__).parent
    env = {**environment_without_settings(), "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SENTINEL_STATE_DIR": str(tmp_path / "state"), "SENTINEL_SPARK__SHUFFLE_PARTITIONS": "2",
           "SENTINEL_SPARK__UI_ENABLED": "false", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    submitted = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]", "--name", "sentinel-on-the-cluster",
         "--conf", "spark.sql.shuffle.partitions=5", "--conf", "spark.ui.enabled=true",
         "--conf", "spark.ui.port=0", "--conf", f"spark.pyspark.driver.python={sys.executable}",
         "--conf", f"spark.pyspark.python={sys.executable}", str(driver)],
        env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in submitted.stdout.splitlines() if line.startswith("CONF ")]
    assert submitted.returncode == 0 and lines, submitted.stdout[-2000:] + submitted.stderr[-3000:]
    conf = json.loads(lines[0][5:])
    # The submitter's, not the config's (2, false) nor the sentinel's.
    assert conf["spark.sql.shuffle.partitions"] == "5"
    assert conf["spark.ui.enabled"] == "true"
    assert conf["spark.app.name"] == "sentinel-on-the-cluster"
    assert conf["spark.master"] == "local[1]"
    # What the submitter left unset, the sentinel sets.
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.streaming.stateStore.providerClass"].endswith("RocksDBStateStoreProvider")
    assert conf["spark.sql.warehouse.dir"].endswith(str(tmp_path / "state" / "spark-warehouse"))
