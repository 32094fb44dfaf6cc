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
