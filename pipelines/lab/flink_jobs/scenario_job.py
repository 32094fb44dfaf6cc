"""One PyFlink job that reproduces a failure mode of the lab (run by Flink's Python, not ours).

This file runs inside the lab's Flink virtualenv (``lab.flink_venv``), submitted by
``flink run --python``; it imports nothing from checkpoint-sentinel. Every scenario has the same
shape, so the detectors see the same vertices whatever the fault:

    datagen source -> assign-key -> keyed-state -> enrich -> discard

``--onset-ms`` is an epoch time: the fault begins when the wall clock passes it, so the lab
knows the onset of its ground truth exactly. Scenarios:

- ``leak``: every record has a new key whose state is never cleared (no TTL, no timer);
- ``healthy_ttl``: the same keys with a 20 s state TTL: state grows for 20 s, then levels off;
- ``warmup``: a long TTL: state grows for minutes, then levels off (a leak until it does not);
- ``backpressure``: ``enrich`` slows down at the onset; its input fills, barriers queue behind data;
- ``skew``: from the onset 90 % of the records carry one key, so one ``keyed-state`` subtask gets
  them (parallelism >= 2);
- ``checkpoint_timeout``: ``enrich`` nearly stops at the onset with a short checkpoint timeout,
  so checkpoints expire.
"""

import argparse
import random
import time

from pyflink.common import Configuration, Types
from pyflink.common.time import Time
from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
from pyflink.datastream.functions import KeyedProcessFunction, MapFunction, RuntimeContext
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor
from pyflink.table import StreamTableEnvironment

HOT_KEY = 0


def now_ms() -> int:
    return int(time.time() * 1000)


class AssignKey(MapFunction):
    """Chooses the key: random and effectively never repeated, or the hot key once skew begins."""

    def __init__(self, scenario: str, onset_ms: int, hot_share: float):
        self.scenario, self.onset_ms, self.hot_share = scenario, onset_ms, hot_share

    def open(self, runtime_context: RuntimeContext):
        self.rng = random.Random()

    def map(self, row):
        key = row[0]
        if self.scenario == "skew" and now_ms() >= self.onset_ms and self.rng.random() < self.hot_share:
            key = HOT_KEY
        return key, row[1]


class KeyedState(KeyedProcessFunction):
    """Keeps the latest payload of each key; with ``ttl_s`` the state expires, otherwise never."""

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s

    def open(self, runtime_context: RuntimeContext):
        descriptor = ValueStateDescriptor("last_payload", Types.STRING())
        if self.ttl_s > 0:
            ttl = (StateTtlConfig.new_builder(Time.milliseconds(int(self.ttl_s * 1000)))
                   .set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)
                   .set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)
                   .cleanup_full_snapshot()
                   .cleanup_incrementally(10, True)
                   .build())
            descriptor.enable_time_to_live(ttl)
        self.last_payload = runtime_context.get_state(descriptor)

    def process_element(self, value, ctx):
        self.last_payload.update(value[1])
        yield value


class Enrich(MapFunction):
    """The operator that slows down at the onset (backpressure, checkpoint timeouts)."""

    def __init__(self, onset_ms: int, slow_records_per_s: float):
        self.onset_ms, self.slow_records_per_s = onset_ms, slow_records_per_s

    def map(self, value):
        if self.slow_records_per_s > 0 and now_ms() >= self.onset_ms:
            time.sleep(1.0 / self.slow_records_per_s)
        return value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--job-name", required=True)
    parser.add_argument("--onset-ms", type=int, required=True)
    parser.add_argument("--rate", type=int, default=200, help="records per second from the source")
    parser.add_argument("--payload-bytes", type=int, default=64)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--ttl-s", type=float, default=0.0)
    parser.add_argument("--slow-records-per-s", type=float, default=0.0)
    parser.add_argument("--hot-share", type=float, default=0.9)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=3000)
    parser.add_argument("--checkpoint-timeout-ms", type=int, default=60000)
    parser.add_argument("--tolerable-failed-checkpoints", type=int, default=1000)
    parser.add_argument("--checkpoint-storage", default="filesystem", choices=["filesystem", "jobmanager"])
    args = parser.parse_args()

    config = Configuration()
    config.set_string("pipeline.name", args.job_name)
    config.set_string("state.backend.type", "hashmap")
    config.set_string("execution.checkpointing.storage", args.checkpoint_storage)
    # Small Python bundles: a barrier waits for the bundle in flight, as it would for one record in Java.
    config.set_string("python.fn-execution.bundle.size", "50")
    config.set_string("python.fn-execution.bundle.time", "100")
    config.set_string("python.operator-chaining.enabled", "false")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(args.parallelism)
    # One vertex per operator, so the collector can say which one is slow, hot or leaking.
    env.disable_operator_chaining()
    env.enable_checkpointing(args.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    checkpoints = env.get_checkpoint_config()
    checkpoints.set_checkpoint_timeout(args.checkpoint_timeout_ms)
    checkpoints.set_tolerable_checkpoint_failure_number(args.tolerable_failed_checkpoints)

    tables = StreamTableEnvironment.create(env)
    tables.execute_sql(f"""
        CREATE TABLE records (k BIGINT, payload STRING) WITH (
            'connector' = 'datagen',
            'rows-per-second' = '{args.rate}',
            'fields.k.min' = '1', 'fields.k.max' = '1000000000000',
            'fields.payload.length' = '{args.payload_bytes}')""")
    source = tables.to_data_stream(tables.from_path("records"))
    pair = Types.TUPLE([Types.LONG(), Types.STRING()])
    (source
     .map(AssignKey(args.scenario, args.onset_ms, args.hot_share), output_type=pair).name("assign-key")
     .key_by(lambda value: value[0], key_type=Types.LONG())
     .process(KeyedState(args.ttl_s), output_type=pair).name("keyed-state").uid("keyed-state")
     .map(Enrich(args.onset_ms, args.slow_records_per_s), output_type=pair).name("enrich")
     .filter(lambda value: False).name("discard")
     .print().name("sink"))
    env.execute_async(args.job_name)


if __name__ == "__main__":
    main()
