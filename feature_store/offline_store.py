"""The offline feature store: Parquet partitioned by date, and point-in-time training sets.

Written two ways with the same layout (``<root>/date=YYYY-MM-DD/part-*.parquet``; the root is a
local folder or a URI, see :mod:`pipelines.io.storage`):
the live job's feature log (:func:`append_feature_log`, each micro-batch's rows in a file named
by its batch id, so a re-run batch replaces its own file: exactly once) and a batch backfill from
recorded event files (:func:`backfill`). Training sets join
feature rows with labels from ground truth *as of each row's time* (:func:`label_features`),
and arbitrary label times with the latest features at or before them (:func:`as_of_join`):
nothing from after the prediction time leaks into a training row.
"""

from __future__ import annotations

import json
from functools import reduce
from pathlib import Path
from typing import Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from feature_store.compute import batch_features, event_frame
from feature_store.definitions import feature_row_schema
from feature_store.job_features import DEFAULT_IDLE_TIMEOUT_MS
from feature_store.labels import LABEL_COLUMNS, label_rows
from pipelines.datasets import dataset_files, read_jsonl  # noqa: F401  (the layout the store backfills from)
from pipelines.io.storage import Location

Root = str | Path | Location


def _spark_path(root: Root) -> str:
    return Location.of(root).spark_path

def _with_date(features: DataFrame) -> DataFrame:
    return features.withColumn("date", F.to_date(F.timestamp_millis("ts")))


def write_features(features: DataFrame, root: Root) -> None:
    """Write a batch of feature rows; the dates it covers are replaced, others kept."""
    (_with_date(features).write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy("date").parquet(_spark_path(root)))


def append_feature_log(rows: pd.DataFrame | pa.Table, root: Root, batch_id: int, part: int | None = None) -> None:
    """The live job's feature log: one micro-batch's feature rows under
    ``root/date=YYYY-MM-DD/live-batch-<id>[-<part>].parquet`` (``part``: the batch's partition,
    for a writer per partition); a re-run batch overwrites its own files."""
    if len(rows) == 0:
        return
    root = Location.of(root)
    schema = to_arrow_schema(feature_row_schema())
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pandas(rows.loc[:, schema.names], schema=schema,
                                                                        preserve_index=False)
    table = table.select(schema.names)
    dates = pc.strftime(pc.cast(table["ts"], pa.timestamp("ms", tz="UTC")), format="%Y-%m-%d")
    name = f"live-batch-{batch_id:012d}" + (f"-{part:05d}" if part is not None else "") + ".parquet"
    for date in pc.unique(dates).to_pylist():
        folder = root / f"date={date}"
        folder.make_dirs()
        filesystem, path = (folder / name).arrow()
        pq.write_table(table.filter(pc.equal(dates, date)), path, filesystem=filesystem)


def read_features(spark: SparkSession, root: Root, start_ts: int | None = None,
                  end_ts: int | None = None) -> DataFrame:
    """Feature rows in ``[start_ts, end_ts)`` (epoch ms); date partitions outside are not read."""
    df = spark.read.schema(feature_row_schema().add("date", "date")).parquet(_spark_path(root))
    if start_ts is not None:
        df = df.filter((F.col("date") >= F.to_date(F.timestamp_millis(F.lit(start_ts)))) & (F.col("ts") >= start_ts))
    if end_ts is not None:
        df = df.filter((F.col("date") <= F.to_date(F.timestamp_millis(F.lit(end_ts)))) & (F.col("ts") < end_ts))
    return df


def read_event_files(spark: SparkSession, paths: Sequence[str | Path]) -> DataFrame:
    """An event frame from JSON-lines files of input events (simulator, lab or recorded), in the
    order the files list them (a recording of the input topic is in arrival order)."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"event files not found: {', '.join(missing)}")
    frames = []
    for number, path in enumerate(paths):
        # Within one file, monotonically increasing ids follow its lines: its splits are read in order.
        lines = spark.read.text(str(path))
        frames.append(event_frame(lines, order=F.lit(number).cast("long") * (1 << 42) + F.monotonically_increasing_id()))
    return frames[0] if len(frames) == 1 else reduce(DataFrame.unionByName, frames)


def backfill(spark: SparkSession, event_paths: Sequence[str | Path], root: Root,
             idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS) -> int:
    """Compute features from recorded events with the batch path and write them to the store;
    ``root/_source.json`` remembers what they were computed from (:func:`backfilled_from`)."""
    features = batch_features(read_event_files(spark, event_paths), idle_timeout_ms).cache()
    try:
        write_features(features, root)
        (Location.of(root) / SOURCE_FILE).write_text(json.dumps(_source(event_paths, idle_timeout_ms)))
        return features.count()
    finally:
        features.unpersist()


SOURCE_FILE = "_source.json"


def _source(event_paths: Sequence[str | Path], idle_timeout_ms: int) -> dict:
    from feature_store.definitions import FEATURE_NAMES

    return {"files": sorted([str(Path(p).resolve()), Path(p).stat().st_size, Path(p).stat().st_mtime_ns]
                            for p in event_paths),
            "idle_timeout_ms": idle_timeout_ms, "features": list(FEATURE_NAMES), "code": _code_version()}


def _code_version() -> str:
    """A fingerprint of the feature computation's code (the state machine, the definitions and
    windows it reads, the Spark driver): features computed by other code are stale."""
    import hashlib

    from feature_store import compute, definitions, event_order, feature_rows, job_features, numeric

    digest = hashlib.sha256()
    for module in (job_features, event_order, numeric, feature_rows, definitions, compute):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def backfilled_from(root: Root, event_paths: Sequence[str | Path], idle_timeout_ms: int) -> bool:
    """Whether ``root`` holds features computed by this code from exactly these event files."""
    marker = Location.of(root) / SOURCE_FILE
    try:
        return json.loads(marker.read_text()) == json.loads(json.dumps(_source(event_paths, idle_timeout_ms)))
    except (OSError, ValueError):
        return False


def read_truth_lines(path: str | Path) -> list[dict]:
    """The ground-truth lines of one file, as dicts."""
    return list(read_jsonl(Path(path)))


def read_ground_truth(spark: SparkSession, paths: Sequence[str | Path]) -> DataFrame:
    """Ground-truth lines (one per job, as the simulator and the lab write them)."""
    schema = ("cluster string, job_id string, job_name string, scenario string, family string, "
              "start_ts long, end_ts long, faults array<struct<family: string, onset_ts: long, "
              "vertex_id: string, vertex_name: string, subtask_index: long, description: string, end_ts: long>>")
    return spark.read.schema(schema).json([str(p) for p in paths])


def label_features(features: DataFrame, ground_truth: DataFrame) -> DataFrame:
    """Each feature row with the fault under way at its own time (see ``feature_store/labels.py``).

    Rows of jobs without ground truth are dropped (unlabelled); the ground truth, one line per
    job, is small and travels with the task.
    """
    truths = {(t["cluster"], t["job_id"]): t.asDict(recursive=True) for t in ground_truth.collect()}
    schema = features.schema
    for name, dtype in LABEL_COLUMNS:
        schema = schema.add(name, dtype)

    def label_job(rows: pd.DataFrame) -> pd.DataFrame:
        return label_rows(rows, truths[(rows["cluster"].iloc[0], rows["job_id"].iloc[0])])

    labelled_jobs = F.broadcast(ground_truth.select("cluster", "job_id"))
    return (features.join(labelled_jobs, ["cluster", "job_id"], "left_semi")
            .groupBy("cluster", "job_id").applyInPandas(label_job, schema))


def as_of_join(entities: DataFrame, features: DataFrame, keys: Sequence[str] = ("cluster", "job_id", "vertex_id"),
               ts_column: str = "ts") -> DataFrame:
    """For each entity row (keys + ``ts``), the latest feature row of the same keys at or before ``ts``.

    Entity rows with no earlier features keep null features. Null key parts match nulls
    (a job row has ``vertex_id`` null).
    """
    entities = entities.withColumn("_entity", F.monotonically_increasing_id())
    carried = [c for c in features.columns if c not in keys and c not in ("date", "ts") and c not in entities.columns]
    renamed = features.select(*[F.col(k).alias(f"_f_{k}") for k in keys], F.col("ts").alias("feature_ts"),
                              *[F.col(c).alias(f"_f_{c}") for c in carried])
    condition = [entities[k].eqNullSafe(renamed[f"_f_{k}"]) for k in keys]
    condition.append(renamed["feature_ts"] <= entities[ts_column])
    joined = entities.join(renamed, condition, "left")
    latest = Window.partitionBy("_entity").orderBy(F.col("feature_ts").desc_nulls_last())
    picked = joined.withColumn("_rank", F.row_number().over(latest)).filter(F.col("_rank") == 1)
    originals = [c for c in entities.columns if c != "_entity"]
    return picked.select(*originals, "feature_ts", *[F.col(f"_f_{c}").alias(c) for c in carried])


def training_set(spark: SparkSession, store_root: Root, ground_truth_paths: Sequence[str | Path],
                 start_ts: int | None = None, end_ts: int | None = None) -> DataFrame:
    """Labelled feature rows: the offline store's features of the labelled jobs, labels as of each row."""
    return label_features(read_features(spark, store_root, start_ts, end_ts).drop("date"),
                          read_ground_truth(spark, ground_truth_paths))
