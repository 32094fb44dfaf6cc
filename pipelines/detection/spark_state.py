"""What the detection job relies on of Spark beyond its public API, in one place: the
stateful processor's state-server protocol, Spark's hash partitioning, the checkpoint's offsets
log and operator metadata, the query listener's JVM hook, and the PySpark versions all of that
was checked against.

The processor (:mod:`pipelines.detection.processor`) sees a small interface:

- :class:`JobStates`: a bucket's map of Flink job states (job name -> bytes), read and written
  many keys per exchange with Spark's state server;
- :class:`StoredValue`: one value of bytes per bucket (the jobs' due times);
- :func:`state_keys`: grouping keys that Spark's shuffle spreads evenly over the partitions;
- :func:`state_partitions`, :func:`checkpoint_watermark_ms`: what a query's checkpoint fixed
  and how far its event time came;
- :func:`relocate_checkpoint`: a checkpoint copied to another folder made resumable there;
- :class:`ProgressListener`: a query listener whose progress crosses from the JVM as one JSON;
- :func:`check_spark_versions` / :func:`check_pyspark`: the job refuses a PySpark outside
  :data:`SUPPORTED_PYSPARK` at start, with that range in the message.

The state server speaks length-framed protobuf over a socket, and PySpark's client waits out one
round trip per call; a task writes hundreds of job states per micro-batch.
:func:`update_map_values` and :func:`get_map_values` therefore write PySpark's own requests for
many keys, then read every answer. They use PySpark's private client (its socket, serialisers and
messages), which may change in any release: ``tests/pipelines/detection/test_spark_state.py`` holds
them to the installed PySpark, and the version check keeps the job from running on one that was not
tested.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import orjson
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from pipelines.errors import SetupError

# [from, to) of PySpark's major.minor that this module was tested with: pyproject.toml's
# ``pyspark==4.3.*``. A new minor version is added here once the contract test passes on it.
SUPPORTED_PYSPARK = ((4, 3), (4, 4))

STATE_SCHEMA = StructType([StructField("state", BinaryType())])
JOB_KEY_SCHEMA = StructType([StructField("job", StringType())])
JOB_STATES, DUES = "jobs", "dues"  # the processor's state variables
# Spark's hash partitioning: Murmur3_x86_32 of the grouping key with this seed (HashPartitioning).
SPARK_HASH_SEED = 42


class UnsupportedPySpark(SetupError, RuntimeError):
    """The installed PySpark (or the cluster's Spark) is outside :data:`SUPPORTED_PYSPARK`."""


# --- versions ---------------------------------------------------------------------------------


def supported_range() -> str:
    """:data:`SUPPORTED_PYSPARK` as a version specifier, e.g. ``>=4.3,<4.4``."""
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_PYSPARK
    return f">={low_major}.{low_minor},<{high_major}.{high_minor}"


def check_pyspark(installed: str | None = None, what: str = "PySpark") -> str:
    """``installed`` (by default this interpreter's ``pyspark.__version__``), if supported; else
    :class:`UnsupportedPySpark` naming the supported range and the version found."""
    if installed is None:
        import pyspark

        installed = pyspark.__version__
    found = re.match(r"(\d+)\.(\d+)", installed)
    if found is None or not SUPPORTED_PYSPARK[0] <= (int(found[1]), int(found[2])) < SUPPORTED_PYSPARK[1]:
        raise UnsupportedPySpark(
            f"the detection job supports pyspark {supported_range()}, and {what} here is {installed}: its "
            "stateful processor uses PySpark's state-server client, which changes between versions. Install a "
            f"supported version (pip install 'pyspark{supported_range()}') or run the Spark it was made for")
    return installed


def check_spark_versions(spark) -> None:
    """The driver's PySpark and the Spark its session runs (a cluster's may differ), both supported."""
    check_pyspark()
    check_pyspark(spark.version, what="the session's Spark")


@lru_cache(maxsize=1)
def check_worker_pyspark() -> str:
    """:func:`check_pyspark` in a Python worker (once): on a cluster, the executors' PySpark is
    the cluster's, not the driver's."""
    return check_pyspark(what="the Python workers' PySpark")


# --- partitioning -------------------------------------------------------------------------------


def state_keys(buckets: int, partitions: int) -> list[int]:
    """The state key of each bucket: an integer that Spark's hash partitioning (Murmur3, seed 42,
    of the grouping key) sends to shuffle partition ``bucket % partitions``, so that every
    partition (a task, a core) has the same number of buckets. With the buckets' numbers as keys,
    64 buckets fell 37/27 on two partitions and the larger task set the micro-batch's length."""
    per_partition: list[list[int]] = [[] for _ in range(partitions)]
    wanted = -(-buckets // partitions)
    candidate = 0
    while min(len(keys) for keys in per_partition) < wanted:
        keys = per_partition[spark_int_hash(candidate) % partitions]
        if len(keys) < wanted:
            keys.append(candidate)
        candidate += 1
    return [per_partition[b % partitions][b // partitions] for b in range(buckets)]


def spark_int_hash(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash()`` of an int column (Murmur3_x86_32.hashInt), as a signed 32-bit integer."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 = (h1 ^ (h1 >> 16)) * 0x85EBCA6B & 0xFFFFFFFF
    h1 = (h1 ^ (h1 >> 13)) * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


# --- the checkpoint -------------------------------------------------------------------------------


def latest_batch_metadata(checkpoint) -> dict | None:
    """The metadata of the latest batch in a query's checkpoint (a
    :class:`~pipelines.io.storage.Location`) offsets log; None before its first batch. An entry is
    a version line (``v1``), the batch's metadata as JSON (``batchWatermarkMs``, ``conf``...), then
    a line per source."""
    offsets = checkpoint / "offsets"
    batches = [int(name) for name in offsets.names() if name.isdigit()]
    if not batches:
        return None
    latest = offsets / str(max(batches))
    lines = latest.read_text().splitlines()
    try:
        return orjson.loads(lines[1]) if len(lines) > 1 else {}
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{latest}: not a Spark offsets log entry (its second line is not JSON: {exc})") from None


def state_partitions(checkpoint) -> int | None:
    """The shuffle partitions a query's checkpoint fixed (Spark keeps them from its first run on,
    whatever the session says later); None before its first batch."""
    value = (latest_batch_metadata(checkpoint) or {}).get("conf", {}).get("spark.sql.shuffle.partitions")
    return int(value) if value is not None else None


def checkpoint_watermark_ms(checkpoint) -> int | None:
    """The event-time watermark of a query's latest checkpointed batch; None before it has one."""
    watermark = (latest_batch_metadata(checkpoint) or {}).get("batchWatermarkMs", 0)
    return watermark if watermark > 0 else None


def relocate_checkpoint(checkpoint) -> list[str]:
    """Point a copied checkpoint's state schema files at the copy; returns the entries changed.

    Spark's metadata of a ``transformWithState`` operator (``state/<op>/_metadata/v2/<batch>``)
    names its schema files by absolute path, so a checkpoint copied or restored to another folder
    fails on resume with a missing file of the folder it was written in. Each path is pointed at
    the same file under ``checkpoint`` where the copy holds it."""
    state = checkpoint / "state"
    changed = []
    for operator in state.names():
        folder = state / operator / "_metadata" / "v2"
        for batch in folder.names():
            if not batch.isdigit():
                continue
            entry = folder / batch
            version, _, body = entry.read_text().partition("\n")
            metadata = orjson.loads(body)
            moved = False
            for store in metadata.get("stateStoreInfo", []):
                paths = store.get("stateSchemaFilePaths") or []
                for i, path in enumerate(paths):
                    inside = path.rpartition(f"/state/{operator}/")[2]
                    here = state / operator / inside
                    qualified = f"file:{here.local_path()}" if here.is_local else here.spark_path
                    if inside != path and qualified != path and here.exists():
                        paths[i], moved = qualified, True
            if moved:
                entry.write_bytes(f"{version}\n".encode() + orjson.dumps(metadata))
                checksum = folder / f".{batch}.crc"  # Hadoop's checksum of the old content
                if checksum.is_local and checksum.exists():
                    checksum.local_path().unlink()
                changed.append(str(entry))
    return changed


# --- the query listener -------------------------------------------------------------------------


class ProgressListener(StreamingQueryListener):
    """A ``StreamingQueryListener`` whose progress events cross from the JVM as one JSON string.

    PySpark's own bridge builds each ``StreamingQueryProgress`` field by field, about a hundred
    Py4J calls per event (every state operator's and source's metric is one), a steady cost in
    the JVM's listener thread (see BENCHMARKS.md, "2026-11-27, fc7c750, c296c97 and d690f5f: where
    the two cores go in the aged fleet (Intel Xeon)"). Here the event's JSON is read in one call
    and parsed in Python with PySpark's ``fromJson``; the listener sees the same
    ``QueryProgressEvent``, its rates rounded to 0.1 row/s as Spark's JSON has them."""

    # PySpark's private hook: what StreamingQueryManager.addListener hands to the JVM.
    # tests/pipelines/detection/test_observability.py fails if an upgrade bypasses it.
    @property
    def _jlistener(self) -> Any:
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(_JsonProgressEvents(self))
        return self._jlistenerobj


class _JsonProgressEvents(JStreamingQueryListener):
    def onQueryProgress(self, jevent: Any) -> None:
        self.pylistener.onQueryProgress(QueryProgressEvent.fromJson(json.loads(jevent.json())))


# --- state variables --------------------------------------------------------------------------


class StoredValue:
    """One value of bytes per state key (Spark's value state), or None."""

    def __init__(self, handle, name: str):
        self._state = handle.getValueState(name, STATE_SCHEMA)

    def get(self) -> bytes | None:
        stored = self._state.get()  # one round trip (exists() then get() would be two)
        return None if stored is None else stored[0]

    def put(self, value: bytes) -> None:
        self._state.update((value,))

    def clear(self) -> None:
        self._state.clear()


class JobStates:
    """A state key's map of Flink job states, job name -> bytes (Spark's map state), in a Python
    worker whose PySpark is checked (:func:`check_worker_pyspark`)."""

    def __init__(self, handle, name: str = JOB_STATES):
        check_worker_pyspark()
        self._map = handle.getMapState(name, JOB_KEY_SCHEMA, STATE_SCHEMA)

    def read(self, names: list[str]) -> list[bytes | None]:
        """Each job's state in the order of ``names`` (None for a job the map does not hold), in one exchange."""
        return [None if value is None else value[0] for value in get_map_values(self._map, [(n,) for n in names])]

    def write(self, states: list[tuple[str, bytes]]) -> None:
        """``(job name, state)`` each, in order, in one exchange."""
        update_map_values(self._map, [((name,), (state,)) for name, state in states])

    def remove(self, name: str) -> None:
        self._map.removeKey((name,))


# --- the state server's protocol --------------------------------------------------------------


def update_map_values(state, entries: list[tuple[tuple, tuple]]) -> None:
    """``state.updateValue(key, value)`` for each of ``entries`` on a map state, in order, in one
    exchange with Spark's state server: every request sent, then every answer read."""
    answers = _map_state_exchange(state, [("updateValue", key, value) for key, value in entries])
    if answers is None:
        for key, value in entries:
            state.updateValue(key, value)
        return
    errors = [error for status, error, _ in answers if status != 0]
    if errors:
        raise RuntimeError(f"the state store refused {len(errors)} of {len(entries)} job states: {errors[0]}")


def get_map_values(state, keys: list[tuple]) -> list[tuple | None]:
    """``state.getValue(key)`` for each of ``keys`` (None where the map has no such key), in one
    exchange with Spark's state server, as :func:`update_map_values` writes them."""
    answers = _map_state_exchange(state, [("getValue", key, None) for key in keys])
    if answers is None:
        return [state.getValue(key) for key in keys]
    errors = [error for status, error, _ in answers if status != 0]
    if errors:
        raise RuntimeError(f"the state store failed {len(errors)} of {len(keys)} job state reads: {errors[0]}")
    api = state._mapStateClient._stateful_processor_api_client
    return [tuple(api._deserialize_from_bytes(value)) if value else None for _, _, value in answers]


def map_state_frames(state, calls: list[tuple[str, tuple, tuple | None]]) -> bytes:
    """The bytes PySpark's map state client sends for each of ``calls`` (``("updateValue", key,
    value)`` or ``("getValue", key, None)``), framed as its ``_send_proto_message`` frames a
    request: a message version (0) and the length as 4-byte big-endian integers, then the
    serialised ``StateRequest``."""
    import pyspark.sql.streaming.proto.StateMessage_pb2 as messages

    client = state._mapStateClient
    api = client._stateful_processor_api_client
    frames = bytearray()
    for kind, key, value in calls:
        user_key = api._serialize_to_bytes(client.user_key_schema, key)
        if kind == "updateValue":
            request = messages.MapStateCall(stateName=state._stateName, updateValue=messages.UpdateValue(
                userKey=user_key, value=api._serialize_to_bytes(client.value_schema, value)))
        elif kind == "getValue":
            request = messages.MapStateCall(stateName=state._stateName, getValue=messages.GetValue(userKey=user_key))
        else:
            raise ValueError(f"no batched map state call {kind!r} (updateValue, getValue)")
        message = messages.StateRequest(stateVariableRequest=messages.StateVariableRequest(
            mapStateCall=request)).SerializeToString()
        frames += _frame(message)
    return bytes(frames)


def _frame(message: bytes) -> bytes:
    return (0).to_bytes(4, "big", signed=True) + len(message).to_bytes(4, "big", signed=True) + message


def _map_state_exchange(state, calls: list[tuple[str, tuple, tuple | None]]) -> list[tuple[int, str, bytes]] | None:
    """Send the map state ``calls`` to Spark's state server together, then read every answer,
    failed or not, so that the next request meets its own: (status, error message, value) each.
    None where PySpark's client is not there to use, or for fewer than two calls (the caller
    makes them one by one through the public API)."""
    client = getattr(state, "_mapStateClient", None)
    api: Any = getattr(client, "_stateful_processor_api_client", None)
    if api is None or len(calls) < 2:
        return None
    api.sockfile.write(map_state_frames(state, calls))
    api.sockfile.flush()
    return [api._receive_proto_message() for _ in calls]
