"""What a record costs on its way into the stateful processor, in Spark's two flavours, without
Spark: the detection input's columns (as ``pipelines.detection.processor.detect`` hands them over)
in one Arrow batch, turned into what each flavour's Python worker gives the processor, the way
PySpark 4.3's ``worker.py`` does it, and read the way the processor reads it.

* Row flavour (``transformWithState``): a ``Row`` per record from one Arrow scalar per column,
  then the processor's access by name; the same with the six columns ``detect`` handed over
  from 2026-11-26 (no event time, the record's place in Kafka in one string), read by position;
  and with the two it hands over since (the bucket and the record packed into one binary value,
  ``pipelines.detection.processor.packed_record``), unpacked into the processor's records;
* pandas flavour (``transformWithStateInPandas``): the batch to pandas, its rows regrouped by key
  into DataFrames, then the processor's column-at-a-time read.

Usage: ``.venv/bin/python benchmarks/stateful_input.py [--records N] [--buckets B]``. One core.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import time

import pandas as pd
import pyarrow as pa
from pyspark.sql import Row

from pipelines.detection.flink_job import Record
from pipelines.detection.processor import unpacked_record

FIELDS = ("cluster", "job_id", "value", "key", "topic", "partition", "offset", "kafka_timestamp_ms")


def input_batch(records: int, buckets: int) -> pa.RecordBatch:
    """The stateful stage's input columns, grouping key first, sorted by it (as Spark hands them)."""
    value = b'{"x":"' + b"1" * 1150 + b'"}'  # an input event's mean size
    at = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    return pa.RecordBatch.from_pydict({
        "bucket": pa.array([i * buckets // records for i in range(records)], pa.int32()),
        "cluster": pa.array(["cluster-3"] * records),
        "job_id": pa.array(["0123456789abcdef0123456789abcdef"] * records),
        "event_time": pa.array([at] * records, pa.timestamp("us", tz="UTC")),
        "key": pa.array([b"cluster-3/0123456789abcdef0123456789abcdef"] * records),
        "value": pa.array([value] * records),
        "topic": pa.array(["sentinel.input"] * records),
        "partition": pa.array([i % 3 for i in range(records)], pa.int32()),
        "offset": pa.array(list(range(records)), pa.int64()),
        "kafka_timestamp_ms": pa.array(list(range(records)), pa.int64()),
    })


def six_column_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The same records as ``detect`` handed them over from 2026-11-26: no event time, the
    record's place in Kafka as one ``partition:offset:timestamp:topic`` string."""
    source = [f"{p}:{o}:{t}:{topic}" for p, o, t, topic in zip(*(batch.column(c).to_pylist() for c in (
        "partition", "offset", "kafka_timestamp_ms", "topic")))]
    return pa.RecordBatch.from_arrays([batch.column(c) for c in ("bucket", "cluster", "job_id", "key", "value")]
                                      + [pa.array(source)], names=["bucket", "cluster", "job_id", "key", "value",
                                                                   "source"])


def row_groups(batch: pa.RecordBatch):
    """Each state key's records as ``Row`` objects, one Arrow scalar per column, regrouped by key:
    as PySpark 4.3's worker does for transformWithState."""
    data_row = Row(*batch.schema.names)

    def rows():
        for i in range(batch.num_rows):
            yield (batch[0][i].as_py(),), data_row(*(batch.column(c)[i].as_py() for c in range(batch.num_columns)))

    for _, group in itertools.groupby(rows(), key=lambda kv: kv[0]):
        yield (r for _, r in group)


def row_flavour(batch: pa.RecordBatch) -> int:
    read = 0
    for group in row_groups(batch):
        for r in group:
            fields = tuple(r[name] for name in FIELDS)  # the processor's access by name
            read += fields[6] is not None
    return read


def row_flavour_six_columns(batch: pa.RecordBatch) -> int:
    read = 0
    for group in row_groups(batch):
        for _, cluster, job_id, key, value, source in group:  # as the processor read them
            partition, offset, timestamp, topic = source.split(":", 3)
            record = Record(value, key, topic, int(partition), int(offset), int(timestamp) if timestamp else None)
            read += record.offset is not None
    return read


def packed_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The same records as ``detect`` hands them over now: the bucket and ``packed_record``'s
    binary value (written here as Spark's expression writes it; the job's tests check that)."""
    packed = []
    for p, o, t, topic, *fields in zip(*(batch.column(c).to_pylist() for c in (
            "partition", "offset", "kafka_timestamp_ms", "topic", "cluster", "job_id", "key", "value"))):
        raw = [f.encode() if isinstance(f, str) else f for f in fields]
        header = ":".join([str(p), str(o), "" if t is None else str(t), *(str(len(f)) for f in raw), topic])
        packed.append(header.encode() + b"\n" + b"".join(raw))
    return pa.RecordBatch.from_arrays([batch.column("bucket"), pa.array(packed, pa.binary())],
                                      names=["bucket", "record"])


def row_flavour_packed(batch: pa.RecordBatch) -> int:
    read = 0
    for group in row_groups(batch):
        for _, packed in group:  # as the processor reads them
            read += unpacked_record(packed)[2].offset is not None
    return read


def pandas_flavour(batch: pa.RecordBatch) -> int:
    read = 0

    def rows():
        for row in batch.to_pandas().itertuples(index=False):  # as PySpark 4.3's worker does
            yield (row[0],), row

    for _, group in itertools.groupby(rows(), key=lambda kv: kv[0]):
        frame = pd.DataFrame([r for _, r in group]).iloc[:, 1:]
        for fields in zip(*(frame[name].tolist() for name in FIELDS)):  # a column at a time
            read += fields[6] is not None
    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--buckets", type=int, default=32, help="state keys in the batch (a task's share of 64)")
    args = parser.parse_args()
    batch = input_batch(args.records, args.buckets)
    print("| flavour | records | us per record (best of 3) |\n|---|---:|---:|")
    for name, read, given in (
            ("Row (transformWithState), ten columns by name", row_flavour, batch),
            ("Row, six columns (no event time, one source string) by position", row_flavour_six_columns,
             six_column_batch(batch)),
            ("Row, two columns (the bucket, the packed record)", row_flavour_packed, packed_batch(batch)),
            ("pandas (transformWithStateInPandas), ten columns", pandas_flavour, batch)):
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            assert read(given) == args.records
            best = min(best, time.perf_counter() - started)
        print(f"| {name} | {args.records:,} | {best / args.records * 1e6:.1f} |")


if __name__ == "__main__":
    main()
