"""The contract between the detection job and the installed PySpark
(:mod:`pipelines.detection.spark_state`), held against the real thing: a local Spark session,
its state server, its hash partitioning and the checkpoints it writes. A PySpark upgrade that
breaks what the job relies on fails here, and the job itself refuses a version outside the
range these tests passed on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from pipelines.detection import spark_state
from pipelines.detection.spark_state import (JobStates, StoredValue, UnsupportedPySpark, check_pyspark,
                                             check_spark_versions, checkpoint_watermark_ms, get_map_values, map_state_frames,
                                             relocate_checkpoint, spark_int_hash, state_keys, state_partitions,
                                             supported_range, update_map_values)
from pipelines.io.storage import Location

PROJECT_ROOT = Path(__file__).resolve().parents[3]


# --- versions ---------------------------------------------------------------------------------


def test_the_supported_range_is_the_pinned_one_and_the_installed_pyspark_is_in_it(spark):
    import pyspark

    pin = re.search(r'"pyspark==(\d+)\.(\d+)\.\*"', (PROJECT_ROOT / "pyproject.toml").read_text())
    assert pin is not None, "pyproject.toml pins pyspark as major.minor.*"
    major, minor = int(pin[1]), int(pin[2])
    assert spark_state.SUPPORTED_PYSPARK == ((major, minor), (major, minor + 1))
    assert supported_range() == f">={major}.{minor},<{major}.{minor + 1}"
    assert check_pyspark() == pyspark.__version__
    check_spark_versions(spark)  # the session's JVM too
    assert check_pyspark(f"{major}.{minor}.9") == f"{major}.{minor}.9"


@pytest.mark.parametrize("version", ["4.4.0", "4.2.1", "3.5.3", "5.0.0.dev0", "4", "nonsense"])
def test_an_unsupported_pyspark_is_refused_with_the_supported_range(version):
    with pytest.raises(UnsupportedPySpark) as refused:
        check_pyspark(version)
    message = str(refused.value)
    assert f"pyspark {supported_range()}" in message and f"is {version}:" in message, message


def test_the_job_and_sentinel_run_stop_at_start_on_an_unsupported_pyspark(spark, config, monkeypatch, capsys):
    """Before the query starts (nothing left running) and in ``sentinel run``'s checks, before
    its broker, registry or Spark are touched."""
    import pyspark

    from pipelines.cli import EXIT_FAILED, main
    from pipelines.detection.job import start_detection

    monkeypatch.setattr(pyspark, "__version__", "4.4.0")
    with pytest.raises(UnsupportedPySpark, match=re.escape(f"supports pyspark {supported_range()}, and PySpark here "
                                                           "is 4.4.0")):
        start_detection(spark, config, cache=None)
    assert not spark.streams.active
    assert not config.checkpoint_dir("detection").exists()
    # An unreachable broker would be reported first if the check came after it.
    monkeypatch.setenv("SENTINEL_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("SENTINEL_STATE_DIR", str(config.state_dir))
    assert main(["run", "--available-now"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert f"sentinel run: the detection job supports pyspark {supported_range()}, and PySpark here is 4.4.0" in err


# --- partitioning -------------------------------------------------------------------------------


def test_the_murmur3_of_an_int_is_sparks_own_hash(spark):
    values = [0, 1, -1, 42, 2**31 - 1, -(2**31), 123456789, -987654321, *range(2, 400, 7)]
    frame = spark.createDataFrame([(v,) for v in values], "v int")
    spark_hashes = {r.v: r.h for r in frame.select("v", F.hash("v").alias("h")).collect()}
    assert spark_hashes == {v: spark_int_hash(v) for v in values}


def test_buckets_spread_evenly_over_the_state_partitions(spark):
    """Spark's own hash partitioning (that of the stateful stage's shuffle) gives every partition
    the same number of buckets, so no task has more jobs than the others."""
    for buckets, partitions in ((64, 2), (64, 3), (10, 4), (1, 2)):
        keys = state_keys(buckets, partitions)
        assert len(set(keys)) == buckets
        frame = spark.createDataFrame([(k,) for k in keys], "bucket int").repartition(partitions, "bucket")
        counts = sorted(r["count"] for r in frame.groupBy(F.spark_partition_id().alias("p")).count().collect())
        assert counts[-1] - counts[0] <= 1 and sum(counts) == buckets, (buckets, partitions, counts)
        # ... bucket b on partition b % partitions, as state_keys says
        assert {r.bucket: r.p for r in frame.select("bucket", F.spark_partition_id().alias("p")).collect()} == \
            {k: b % partitions for b, k in enumerate(keys)}


# --- the checkpoint -------------------------------------------------------------------------------


def test_the_shuffle_partitions_are_read_from_the_offsets_log_spark_wrote(spark, tmp_path):
    """A stateful query's checkpoint keeps the partitions of its first run; a later session's
    setting does not change them, and the offsets log says which they are."""
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    assert state_partitions(Location.of(checkpoint)) is None  # before the first batch

    def run(partitions: int, batch: int) -> None:
        (source / f"{batch}.json").write_text("".join(json.dumps({"k": k % 5}) + "\n" for k in range(20)))
        before = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        try:
            query = (spark.readStream.schema("k int").json(str(source)).groupBy("k").count().writeStream
                     .format("noop").outputMode("update").option("checkpointLocation", str(checkpoint))
                     .trigger(availableNow=True).start())
            try:
                query.awaitTermination(300)
            finally:
                query.stop()
            assert query.exception() is None
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", before)

    run(3, 0)
    assert state_partitions(Location.of(checkpoint)) == 3
    run(5, 1)
    assert sorted(int(n) for n in Location.of(checkpoint / "offsets").names() if n.isdigit()) == [0, 1]
    assert state_partitions(Location.of(checkpoint)) == 3


def test_the_detection_checkpoint_of_the_fixture_names_its_partitions_and_watermark():
    """The v1 fixture's checkpoint, written by the detection job: its partitions, and a watermark
    that is the newest event time read (in its first batch, all of them) less the watermark's delay."""
    import gzip

    fixture = PROJECT_ROOT / "tests" / "fixtures" / "state_v1"
    manifest = json.loads((fixture / "manifest.json").read_text())
    checkpoint = Location.of(fixture / "checkpoint")
    assert state_partitions(checkpoint) == manifest["shuffle_partitions"]
    with gzip.open(fixture / "events.jsonl.gz", "rt") as lines:
        newest = max(json.loads(line)["ts"] for _, line in zip(range(manifest["events_read"]), lines))
    delay_ms = int(max(manifest["features"]["max_source_delay_s"], 10.0) * 1000)  # and lateness_s, 10 s
    assert checkpoint_watermark_ms(checkpoint) == newest - delay_ms
    assert checkpoint_watermark_ms(Location.of(fixture / "no-checkpoint")) is None


def test_a_stateful_checkpoint_copied_elsewhere_resumes_there_once_relocated(spark, tmp_path):
    """Spark's transformWithState metadata names its schema files by absolute path:
    relocate_checkpoint points a copy at its own, and the copy resumes with the state it holds."""
    import shutil

    class Count(StatefulProcessor):
        def init(self, handle) -> None:
            self.count = StoredValue(handle, "count")

        def handleInputRows(self, key, rows, timerValues):
            total = int(self.count.get() or b"0") + sum(1 for _ in rows)
            self.count.put(b"%d" % total)
            yield Row(key=key[0], position=total, value=None)

        def close(self) -> None:
            pass

    source = tmp_path / "in"
    source.mkdir()

    def run(checkpoint: Path, batch: int) -> dict[int, int]:
        (source / f"{batch}.json").write_text("".join(json.dumps({"key": k % 3}) + "\n" for k in range(9)))
        counts: dict[int, int] = {}
        query = (spark.readStream.schema("key int").json(str(source)).groupBy("key")
                 .transformWithState(Count(), ROWS, "Append", "None").writeStream
                 .foreachBatch(lambda rows, _: counts.update({r.key: r.position for r in rows.collect()}))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        try:
            query.awaitTermination(300)
        finally:
            query.stop()
        assert query.exception() is None
        return counts

    written, copy = tmp_path / "written", tmp_path / "copy"
    assert run(written, 0) == {0: 3, 1: 3, 2: 3}
    shutil.copytree(written, copy)
    shutil.rmtree(written)  # the folder the metadata names is gone, as after a restore elsewhere
    assert relocate_checkpoint(Location.of(copy)) == [str(Location.of(copy) / "state" / "0" / "_metadata" / "v2" / "0")]
    assert relocate_checkpoint(Location.of(copy)) == []
    assert run(copy, 1) == {0: 6, 1: 6, 2: 6}  # the counts went on from the copy's state


def test_an_offsets_entry_that_is_not_sparks_is_named(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\nnot json\n")
    with pytest.raises(ValueError, match=r"offsets/0: not a Spark offsets log entry"):
        state_partitions(Location.of(tmp_path))


# --- the state server's protocol --------------------------------------------------------------


ROWS = StructType([StructField("key", IntegerType()), StructField("position", IntegerType()),
                   StructField("value", BinaryType())])


def test_job_states_written_and_read_back_in_one_exchange_with_the_state_server(spark):
    """update_map_values and get_map_values send all their requests before reading the answers:
    each answer must still be its own request's (in order, a job never written read as None, a
    single key through PySpark's own call), in a real transformWithState on the RocksDB store;
    JobStates and StoredValue, the processor's view, on the same store."""

    class WriteThenRead(StatefulProcessor):
        def init(self, handle) -> None:
            self.jobs = handle.getMapState("jobs", spark_state.JOB_KEY_SCHEMA, spark_state.STATE_SCHEMA)
            self.states = JobStates(handle, "states")
            self.value = StoredValue(handle, "value")

        def handleInputRows(self, key, rows, timerValues):
            size = sum(1 for _ in rows) + 2
            names = [(f"c/{key[0]}-{i}",) for i in range(size)]
            update_map_values(self.jobs, [(name, (bytes([i]) * (5_000 + i),)) for i, name in enumerate(names)])
            update_map_values(self.jobs, [(names[1], (b"rewritten",))])  # one: PySpark's own call
            wanted = [names[-1], ("c/never",), *names[:-1]]
            got = get_map_values(self.jobs, wanted) + get_map_values(self.jobs, [names[1]])
            self.states.write([(f"j{i}", b"%d" % i * 3) for i in range(3)])
            self.states.remove("j1")
            assert self.value.get() is None
            self.value.put(b"due")
            got += [(v,) for v in self.states.read(["j2", "j1", "j0"])] + [(self.value.get(),)]
            self.value.clear()
            got.append((self.value.get(),))
            for position, value in enumerate(got):
                yield Row(key=key[0], position=position, value=None if value is None else value[0])

        def close(self) -> None:
            pass

    frame = spark.createDataFrame([(k % 5,) for k in range(20)], "key int")
    read = frame.groupBy("key").transformWithState(WriteThenRead(), ROWS, "Append", "None").collect()
    size = 4 + 2  # four rows a key
    expected_values = [bytes([size - 1]) * (5_000 + size - 1), None, bytes([0]) * 5_000, b"rewritten",
                       *[bytes([i]) * (5_000 + i) for i in range(2, size - 1)], b"rewritten",
                       b"222", None, b"000", b"due", None]
    assert len(read) == 5 * len(expected_values)
    for bucket in range(5):
        got = [r.value for r in sorted((r for r in read if r.key == bucket), key=lambda r: r.position)]
        assert got == expected_values, bucket


def test_the_batched_requests_are_the_bytes_pysparks_own_client_sends(spark):
    """map_state_frames writes, for each call, what PySpark's map state client writes to the
    state server's socket for the same call (recorded off the socket in a real transformWithState)."""

    class Recording:
        def __init__(self, inner):
            self.inner, self.written = inner, bytearray()

        def write(self, data):
            self.written += data
            return self.inner.write(data)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class Compare(StatefulProcessor):
        def init(self, handle) -> None:
            self.jobs = handle.getMapState("jobs", spark_state.JOB_KEY_SCHEMA, spark_state.STATE_SCHEMA)

        def handleInputRows(self, key, rows, timerValues):
            api = self.jobs._mapStateClient._stateful_processor_api_client
            calls = [("updateValue", (f"c/{key[0]}",), (b"\x00state\xff" * 100,)), ("getValue", (f"c/{key[0]}",), None),
                     ("getValue", ("c/never",), None)]
            recorder = api.sockfile = Recording(api.sockfile)
            try:
                sent = []
                for kind, job, value in calls:
                    recorder.written.clear()
                    if kind == "updateValue":
                        self.jobs.updateValue(job, value)  # PySpark's own call
                    else:
                        self.jobs.getValue(job)
                    sent.append(bytes(recorder.written))
            finally:
                api.sockfile = recorder.inner
            ours = map_state_frames(self.jobs, calls)
            yield Row(key=key[0], position=0, value=b"".join(sent))
            yield Row(key=key[0], position=1, value=ours)

        def close(self) -> None:
            pass

    frame = spark.createDataFrame([(k,) for k in range(3)], "key int")
    read = frame.groupBy("key").transformWithState(Compare(), ROWS, "Append", "None").collect()
    by_key: dict[int, dict[int, bytes]] = {}
    for row in read:
        by_key.setdefault(row.key, {})[row.position] = bytes(row.value)
    assert sorted(by_key) == [0, 1, 2]
    for key, sent in by_key.items():
        assert len(sent[0]) > 3 * 8 + 800  # three frames, one with the 900-byte value
        assert sent[1] == sent[0], key
