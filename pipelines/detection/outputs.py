"""The stateful stage's output rows, and the feature log writer that takes its share of them.

Output rows: ``kind`` (``incident``, ``dead_letter``, ``features``, ``late``, ``sample``,
``models``), ``key``, ``payload`` and ``count`` (see :mod:`pipelines.detection.processor`).
:func:`feature_log_writer` is the ``mapInArrow`` after the stateful stage: it writes the
``features`` rows to the feature log and passes every other row on to the driver.

This module imports no models and no scikit-learn, nor anything that does: the feature log
writer's Python workers import it and nothing heavier, a fraction of the stateful processor's
workers' memory (see BENCHMARKS.md, "The Python workers at the job's start
(`benchmarks/worker_start.py`)"). They are not the stateful processor's workers: Spark keeps
Python workers apart by kind.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from feature_store import offline_store
from feature_store.definitions import feature_row_schema
from pipelines.io.storage import Location

INCIDENT, DEAD_LETTER, FEATURES, LATE, SAMPLE, MODELS = "incident", "dead_letter", "features", "late", "sample", "models"
OUTPUT_SCHEMA = StructType([StructField("kind", StringType()), StructField("key", StringType()),
                            StructField("payload", BinaryType()), StructField("count", LongType())])
FEATURE_ROW_ARROW_SCHEMA = to_arrow_schema(feature_row_schema())
# Feature rows per output row: one JVM value each, bounded (a large backlog's rows as one value
# can be more than the JVM's heap).
FEATURE_ROWS_PER_PAYLOAD = 20_000
# The start's warm-up of the Python workers (processor.load_models_on_workers): one row per
# worker, its process id and the versions of the champions it loaded (null: it loads none).
WORKER_SCHEMA = StructType([StructField("pid", LongType()), StructField("models", StringType())])


def feature_rows_payload(rows) -> bytes:
    """The payload of a ``features`` output row: ``rows`` (a pandas frame) as an Arrow stream."""
    table = pa.Table.from_pandas(rows.loc[:, FEATURE_ROW_ARROW_SCHEMA.names], schema=FEATURE_ROW_ARROW_SCHEMA,
                                 preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_feature_rows(payload: bytes) -> pa.Table:
    """The feature rows of a ``features`` output row."""
    return pa.ipc.open_stream(payload).read_all()


def feature_log_writer(root: Location | None, batch_id: int) -> Callable[[Iterator[pa.RecordBatch]],
                                                                         Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: the partition's feature rows to the feature log (a file per
    batch, partition and date, rewritten by a re-run), every other row passed on."""
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        # The worker's collector (imported here: the function is pickled by value, the collector
        # holds a lock). What the worker holds (its libraries) is frozen after the task, not
        # walked by PySpark's collection after every task.
        from pipelines.detection.worker_gc import COLLECTOR
        COLLECTOR.task_started()
        try:
            tables = []
            for batch in batches:
                features = pc.equal(batch.column("kind"), FEATURES)
                tables += [read_feature_rows(p) for p in batch.filter(features).column("payload").to_pylist()]
                yield batch.filter(pc.invert(features))
            if tables and root is not None:
                offline_store.append_feature_log(pa.concat_tables(tables), root, batch_id,
                                                 TaskContext.get().partitionId())
        finally:
            COLLECTOR.task_ended()
    return write


def feature_log_writer_ready(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The warm-up's ``mapInArrow`` in the feature log writer's place, its task as the writer's
    (the same imports, the same collector): the rows before, then this worker's (its process id;
    no models: the writer scores nothing)."""
    from pipelines.detection.worker_gc import COLLECTOR

    COLLECTOR.task_started()
    try:
        yield from batches
        yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "models": None}],
                                         schema=to_arrow_schema(WORKER_SCHEMA))
    finally:
        COLLECTOR.task_ended()
