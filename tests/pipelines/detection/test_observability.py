"""The job's progress listener on a real Spark session: the progress it reads as one JSON string
is the progress PySpark's own bridge builds field by field, and the metrics listener writes the
registry /metrics serves, with how far the newest event is behind."""

import time

from prometheus_client import generate_latest
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

from pipelines.detection.observability import MetricsListener, ProgressListener, checkpointed_newest_event_s
from pipelines.io.storage import Location
from pipelines.telemetry import DetectionMetrics
from tests.helpers.metrics import metric_names, sample_key, samples
from tests.helpers.waiting import wait_for


class Progresses:
    def __init__(self):
        self.seen = []
        self.ended = False

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        self.seen.append(event.progress)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        self.ended = True  # after the query's last progress


class ByJson(Progresses, ProgressListener):
    pass


class ByFields(Progresses, StreamingQueryListener):
    pass


def summary(progress) -> tuple:
    return (progress.id, progress.name, progress.batchId, progress.numInputRows, sorted(progress.durationMs),
            progress.eventTime.get("watermark"),
            [(s.operatorName, s.numRowsTotal, s.numRowsUpdated, s.numRowsDroppedByWatermark, s.customMetrics)
             for s in progress.stateOperators],
            # Rates to 0.1 row/s, as Spark's JSON has them. Not the sources' offsets: PySpark's two
            # builders write them as different text ('null' or 'None', with spaces or without),
            # and the listeners do not read them.
            round(progress.inputRowsPerSecond, 1), round(progress.processedRowsPerSecond, 1),
            [(s.description, s.numInputRows, round(s.inputRowsPerSecond, 1)) for s in progress.sources])


def test_the_json_progress_is_the_progress_pyspark_builds(spark, tmp_path):
    source = tmp_path / "events"
    source.mkdir()
    for part in range(2):
        spark.createDataFrame([(f"job-{i % 7}", i * 1000 + part) for i in range(50)], "job string, ts long") \
            .write.json(str(source / f"part={part}"))
    by_json, by_fields = ByJson(), ByFields()
    spark.streams.addListener(by_json)
    spark.streams.addListener(by_fields)
    try:
        events = (spark.readStream.schema("job string, ts long").option("maxFilesPerTrigger", 1)
                  .json(str(source / "*"))
                  .withColumn("at", F.timestamp_millis("ts")).withWatermark("at", "5 seconds"))
        query = (events.groupBy("job").count().writeStream.queryName("progress_json").outputMode("update")
                 .format("noop").option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(120) and query.exception() is None
        wait_for(lambda: by_json.ended and by_fields.ended, 60, every_s=0.2)
    finally:
        spark.streams.removeListener(by_json)
        spark.streams.removeListener(by_fields)
    assert [summary(p) for p in by_json.seen] == [summary(p) for p in by_fields.seen]
    assert all(p._jdict is not None for p in by_json.seen)  # built by fromJson: the JSON path was taken
    assert all(p._jdict is None for p in by_fields.seen)
    assert sum(p.numInputRows for p in by_json.seen) == 100
    assert by_json.seen[-1].stateOperators[0].numRowsTotal == 7


def test_the_metrics_listener_writes_the_served_registry_with_the_newest_event_s_lag(spark, tmp_path):
    source = tmp_path / "events"
    newest_ms = int(time.time() * 1000) - 90_000  # ninety seconds ago
    spark.createDataFrame([(f"job-{i % 3}", newest_ms - i * 1000) for i in range(30)], "job string, ts long") \
        .write.json(str(source / "part=0"))
    metrics = DetectionMetrics()
    listener = MetricsListener(tmp_path / "metrics" / "sentinel.prom", metrics=metrics)
    spark.streams.addListener(listener)
    try:
        events = (spark.readStream.schema("job string, ts long").json(str(source / "*"))
                  .withColumn("at", F.timestamp_millis("ts")).withWatermark("at", "5 minutes"))
        query = (events.groupBy("job").count().writeStream.queryName("listened").outputMode("update")
                 .format("noop").option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(120) and query.exception() is None
        # The listener bus delivers progress after the query ends: wait for the file of its last batch.
        last_batch = query.lastProgress["batchId"]
        batch_written = sample_key("checkpoint_sentinel_batch_id", query="listened")
        wait_for(lambda: listener.path.exists() and samples(listener.path.read_text()).get(batch_written) == last_batch,
                 60, every_s=0.2, what="the metrics file of the query's last batch")
    finally:
        spark.streams.removeListener(listener)
    written = listener.path.read_text()
    assert metric_names(written) == metric_names(generate_latest(metrics.registry).decode())  # one registry, both outputs
    scraped = samples(written)
    query_label = (("query", "listened"),)
    assert scraped[("checkpoint_sentinel_newest_event_timestamp_seconds", query_label)] == newest_ms / 1000
    assert 90 <= scraped[("checkpoint_sentinel_event_lag_seconds", query_label)] < 150
    assert scraped[("checkpoint_sentinel_input_rows_total", query_label)] == 30
    # No file left behind but the one node_exporter reads (write_to_textfile renames its temporary).
    assert [p.name for p in listener.path.parent.iterdir()] == ["sentinel.prom"]
    # Restarted onto a quiet input, the job knows the newest event from its checkpoint's watermark.
    assert checkpointed_newest_event_s(Location.of(tmp_path / "checkpoint"), 5 * 60_000) == newest_ms / 1000
    assert checkpointed_newest_event_s(Location.of(tmp_path / "no-checkpoint"), 5 * 60_000) is None
