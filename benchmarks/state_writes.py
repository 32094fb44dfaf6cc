"""What writing Flink job states to Spark's state store costs the stateful processor: one
``MapState.updateValue`` (a round trip to Spark's state server) per job, against
:func:`pipelines.detection.spark_state.update_map_values` (every request sent, then every answer
read), inside a real ``transformWithState`` on a local Spark with the RocksDB state store.

Each of ``--keys`` state keys (a bucket) writes ``--jobs`` states of ``--bytes`` bytes both ways
(two maps, so neither writes over the other), timed inside the processor; two tasks at once, as
the job runs on ``local[2]``. Usage: ``.venv/bin/python benchmarks/state_writes.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import Row  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402
from pyspark.sql.types import DoubleType, LongType, StructField, StructType  # noqa: E402

from pipelines.config import load_config  # noqa: E402
from pipelines.detection.spark_state import JOB_KEY_SCHEMA, STATE_SCHEMA, update_map_values  # noqa: E402
from pipelines.spark_session import build_spark  # noqa: E402

TIMES = StructType([StructField("jobs", LongType()), StructField("one_at_a_time_s", DoubleType()),
                    StructField("one_exchange_s", DoubleType())])


class StateWriter(StatefulProcessor):
    def __init__(self, jobs: int, size: int):
        self.jobs_per_key, self.size = jobs, size

    def init(self, handle) -> None:
        self.one = handle.getMapState("one", JOB_KEY_SCHEMA, STATE_SCHEMA)
        self.batched = handle.getMapState("batched", JOB_KEY_SCHEMA, STATE_SCHEMA)

    def handleInputRows(self, key, rows, timerValues):
        for _ in rows:
            pass
        entries = [((f"cluster/{key[0]:08x}{i:024x}",), (bytes([i % 251]) * self.size,))
                   for i in range(self.jobs_per_key)]
        started = time.perf_counter()
        for name, value in entries:
            self.one.updateValue(name, value)
        one = time.perf_counter() - started
        started = time.perf_counter()
        update_map_values(self.batched, entries)
        batched = time.perf_counter() - started
        assert self.batched.getValue(entries[-1][0]) == entries[-1][1]  # written, and the exchange in step
        yield Row(jobs=len(entries), one_at_a_time_s=one, one_exchange_s=batched)

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=12, help="job states written per key")
    parser.add_argument("--bytes", type=int, default=10_000, help="size of a job's state")
    args = parser.parse_args()
    config = load_config()
    with tempfile.TemporaryDirectory() as tmp:
        config.state_dir = Path(tmp)
        spark = build_spark(config, "state-writes")
        frame = spark.range(0, args.keys, 1, 2).withColumnRenamed("id", "key").groupBy("key")
        for run in range(3):  # the first warms the Python workers up
            rows = frame.transformWithState(StateWriter(args.jobs, args.bytes), TIMES, "Append", "None").collect()
            jobs = sum(r.jobs for r in rows)
            one, batched = sum(r.one_at_a_time_s for r in rows), sum(r.one_exchange_s for r in rows)
            if run:
                print(f"| {args.keys} keys x {args.jobs} states of {args.bytes:,} B | {one / jobs * 1e6:.0f} us | "
                      f"{batched / jobs * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
