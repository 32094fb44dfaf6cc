"""One PyFlink job whose flags reproduce the lab's failure modes (run by Flink's Python, not ours).

This file runs inside the lab's Flink virtualenv (``lab.flink_venv``), submitted by
``flink run --python``; it imports nothing from checkpoint-sentinel. The job always has the
same spine, so only the fault differs between runs of one shape:

    datagen source -> assign-key -> <stateful> [-> keyed-state-b] -> enrich -> discard -> sink

``<stateful>`` is ``keyed-state`` (a KeyedProcessFunction holding the latest payload per key,
with a state TTL or none), ``window`` (a tumbling processing-time window that keeps every
element until it fires) or ``timer-state`` (state cleared by a processing-time timer). Every
``--*-onset-ms`` is an epoch time: the fault begins when the wall clock passes it, so the lab
knows the onsets of its ground truth exactly. The faults:

- leak: ``--ttl-s 0`` keeps every key forever; ``--leak-onset-ms`` with ``--leak-share`` also
  keeps that share of the records in a state without TTL from the onset on (a leak after a
  plateau, or a slow leak on top of TTL-bounded state), in ``keyed-state`` or ``keyed-state-b``;
- skew: from ``--hot-onset-ms`` a share of the records carries one key (with ``--hot-ramp-s`` the
  share rises linearly from nothing to ``--hot-share`` over that many seconds: skew that drifts
  in); ``--keyed-cost-ms`` makes each record cost time in the stateful operator, so the hot
  subtask can saturate;
- backpressure: from ``--slow-onset-ms`` ``enrich`` handles at most ``--slow-records-per-s``,
  always or ``--slow-on-s`` of every ``--slow-period-s`` (intermittent);
- a failing task: from ``--fail-onset-ms`` ``enrich`` raises ``--fail-after-s`` after each
  (re)start, so the job restarts in a loop;
- a bounded key space: ``--key-space K`` draws every record's key uniformly from K keys (a
  per-user aggregate over a fixed population: without TTL the state fills like
  K(1 - exp(-rate t / K)) and levels off);
- a leak that is fixed: from ``--reject-new-keys-onset-ms`` ``keyed-state`` only updates keys it
  holds already and stores no new ones, so state that grew from the start stays flat;
- backpressure that deepens: with ``--slow-ramp-s`` ``enrich``'s capacity falls linearly from
  ``--slow-start-records-per-s`` at ``--slow-onset-ms`` to ``--slow-records-per-s`` over that many
  seconds (from above the input rate to well under it);
- ``--checkpoint-min-pause-ms``: the pause between checkpoints, which is also the earliest the
  first checkpoint is triggered (Flink draws its first trigger between the pause and the
  interval), so a tight timeout does not fail the first checkpoints while the Python workers
  warm up;
- healthy variety: bursts (``--burst-factor`` records per record for ``--burst-on-s`` of every
  ``--burst-period-s``), sub-second checkpoint intervals with concurrent checkpoints, RocksDB
  with full or incremental checkpoints, unaligned checkpoints.
"""

import argparse
import random
import time

from pyflink.common import Configuration, Types
from pyflink.common.time import Time
from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
from pyflink.datastream.functions import (FlatMapFunction, KeyedProcessFunction, MapFunction,
                                          ProcessWindowFunction, RuntimeContext)
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor
from pyflink.datastream.window import TumblingProcessingTimeWindows
from pyflink.table import StreamTableEnvironment

HOT_KEY = 0
NEVER = -1


def now_ms() -> int:
    return int(time.time() * 1000)


def started(onset_ms: int) -> bool:
    return onset_ms != NEVER and now_ms() >= onset_ms


def in_phase(period_s: float, on_s: float) -> bool:
    """True for the first ``on_s`` seconds of every ``period_s`` of wall-clock time."""
    return period_s <= 0 or (time.time() % period_s) < on_s


class AssignKey(FlatMapFunction):
    """Chooses the key (random and effectively never repeated, or the hot key once skew begins)
    and multiplies records during bursts."""

    def __init__(self, hot_onset_ms, hot_share, burst_factor, burst_period_s, burst_on_s, hot_ramp_s=0.0, key_space=0):
        self.hot_onset_ms, self.hot_share, self.hot_ramp_s = hot_onset_ms, hot_share, hot_ramp_s
        self.key_space = key_space
        self.burst_factor, self.burst_period_s, self.burst_on_s = burst_factor, burst_period_s, burst_on_s

    def open(self, runtime_context: RuntimeContext):
        self.rng = random.Random()

    def flat_map(self, row):
        copies = self.burst_factor if self.burst_factor > 1 and in_phase(self.burst_period_s, self.burst_on_s) else 1
        for copy in range(copies):
            key = row[0] if copy == 0 else self.rng.randrange(1, 10**12)
            if self.key_space > 0:
                key = self.rng.randrange(1, self.key_space + 1)
            if started(self.hot_onset_ms) and self.rng.random() < self.current_hot_share():
                key = HOT_KEY
            yield key, row[1]

    def current_hot_share(self) -> float:
        if self.hot_ramp_s <= 0:
            return self.hot_share
        return self.hot_share * min(1.0, (now_ms() - self.hot_onset_ms) / (self.hot_ramp_s * 1000.0))


def ttl_config(ttl_s: float):
    # Time.milliseconds, not Duration: a Duration built in open() starts a Java gateway in the worker.
    return (StateTtlConfig.new_builder(Time.milliseconds(int(ttl_s * 1000)))
            .set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)
            .set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)
            .cleanup_full_snapshot()
            .cleanup_incrementally(10, True)
            .build())


class KeyedState(KeyedProcessFunction):
    """Keeps the latest payload of each key (expiring after ``ttl_s``, or never with 0); from
    ``leak_onset_ms`` a ``leak_share`` of the records is also kept in a state that never expires.
    With ``timer_s`` a processing-time timer clears the key instead of a TTL."""

    def __init__(self, ttl_s, leak_onset_ms, leak_share, cost_ms, timer_s=0.0, reject_new_onset_ms=NEVER):
        self.ttl_s, self.leak_onset_ms, self.leak_share = ttl_s, leak_onset_ms, leak_share
        self.cost_ms, self.timer_s = cost_ms, timer_s
        self.reject_new_onset_ms = reject_new_onset_ms

    def open(self, runtime_context: RuntimeContext):
        latest = ValueStateDescriptor("latest_payload", Types.STRING())
        if self.ttl_s > 0:
            latest.enable_time_to_live(ttl_config(self.ttl_s))
        self.latest = runtime_context.get_state(latest)
        self.retained = runtime_context.get_state(ValueStateDescriptor("retained_payload", Types.STRING()))
        self.rng = random.Random()

    def process_element(self, value, ctx):
        if self.cost_ms > 0:
            time.sleep(self.cost_ms / 1000.0)
        if started(self.reject_new_onset_ms) and self.latest.value() is None:
            yield value  # the fix: a key the operator does not hold yet is no longer stored
            return
        if self.timer_s > 0 and self.latest.value() is None:
            ctx.timer_service().register_processing_time_timer(
                ctx.timer_service().current_processing_time() + int(self.timer_s * 1000))
        self.latest.update(value[1])
        if started(self.leak_onset_ms) and self.rng.random() < self.leak_share:
            self.retained.update(value[1])
        yield value

    def on_timer(self, timestamp, ctx):
        self.latest.clear()
        return iter(())  # PyFlink iterates what a timer emits: nothing here


class WindowContents(ProcessWindowFunction):
    """Sees every element of the window when it fires (so the window keeps them all until then)."""

    def process(self, key, context, elements):
        count = 0
        for element in elements:
            count += 1
        yield key, str(count)


class Enrich(MapFunction):
    """The operator that slows down (backpressure, checkpoint timeouts) or fails (restart loops)."""

    def __init__(self, slow_onset_ms, slow_records_per_s, slow_period_s, slow_on_s, fail_onset_ms, fail_after_s,
                 slow_start_records_per_s=0.0, slow_ramp_s=0.0):
        self.slow_onset_ms, self.slow_records_per_s = slow_onset_ms, slow_records_per_s
        self.slow_start_records_per_s, self.slow_ramp_s = slow_start_records_per_s, slow_ramp_s
        self.slow_period_s, self.slow_on_s = slow_period_s, slow_on_s
        self.fail_onset_ms, self.fail_after_s = fail_onset_ms, fail_after_s

    def open(self, runtime_context: RuntimeContext):
        self.opened_ms = now_ms()

    def map(self, value):
        if self.slow_records_per_s > 0 and started(self.slow_onset_ms) and in_phase(self.slow_period_s, self.slow_on_s):
            time.sleep(1.0 / self.capacity())
        if started(self.fail_onset_ms) and now_ms() - max(self.opened_ms, self.fail_onset_ms) > self.fail_after_s * 1000:
            raise RuntimeError("lab: enrich fails (a poison record in a restart loop)")
        return value

    def capacity(self) -> float:
        """Records per second enrich handles now: constant, or falling linearly over the ramp."""
        if self.slow_ramp_s <= 0 or self.slow_start_records_per_s <= 0:
            return self.slow_records_per_s
        done = min(1.0, (now_ms() - self.slow_onset_ms) / (self.slow_ramp_s * 1000.0))
        return self.slow_start_records_per_s + (self.slow_records_per_s - self.slow_start_records_per_s) * done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-name", required=True)
    parser.add_argument("--rate", type=int, default=100, help="records per second from the source")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--state-backend", default="hashmap", choices=["hashmap", "rocksdb"])
    parser.add_argument("--incremental", default="false", choices=["true", "false"])
    parser.add_argument("--checkpoint-storage", default="filesystem", choices=["filesystem", "jobmanager"])
    parser.add_argument("--checkpoint-interval-ms", type=int, default=3000)
    parser.add_argument("--checkpoint-timeout-ms", type=int, default=60000)
    parser.add_argument("--max-concurrent-checkpoints", type=int, default=1)
    parser.add_argument("--unaligned", default="false", choices=["true", "false"])
    parser.add_argument("--tolerable-failed-checkpoints", type=int, default=1000)
    parser.add_argument("--stateful", default="keyed", choices=["keyed", "window", "timer"])
    parser.add_argument("--ttl-s", type=float, default=0.0, help="state TTL of keyed-state; 0: never expires")
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--timer-s", type=float, default=60.0)
    parser.add_argument("--window-keys", type=int, default=1000)
    parser.add_argument("--second-stateful", default="false", choices=["true", "false"])
    parser.add_argument("--ttl-b-s", type=float, default=30.0)
    parser.add_argument("--leak-operator", default="a", choices=["a", "b"])
    parser.add_argument("--leak-onset-ms", type=int, default=NEVER)
    parser.add_argument("--leak-share", type=float, default=1.0)
    parser.add_argument("--hot-onset-ms", type=int, default=NEVER)
    parser.add_argument("--hot-share", type=float, default=0.9)
    parser.add_argument("--hot-ramp-s", type=float, default=0.0, help="seconds over which the hot share rises to --hot-share")
    parser.add_argument("--keyed-cost-ms", type=float, default=0.0)
    parser.add_argument("--slow-onset-ms", type=int, default=NEVER)
    parser.add_argument("--slow-records-per-s", type=float, default=0.0)
    parser.add_argument("--slow-period-s", type=float, default=0.0)
    parser.add_argument("--slow-on-s", type=float, default=0.0)
    parser.add_argument("--fail-onset-ms", type=int, default=NEVER)
    parser.add_argument("--fail-after-s", type=float, default=30.0)
    parser.add_argument("--key-space", type=int, default=0, help="keys drawn uniformly from this many; 0: unbounded")
    parser.add_argument("--reject-new-keys-onset-ms", type=int, default=NEVER)
    parser.add_argument("--slow-start-records-per-s", type=float, default=0.0)
    parser.add_argument("--slow-ramp-s", type=float, default=0.0)
    parser.add_argument("--checkpoint-min-pause-ms", type=int, default=0)
    parser.add_argument("--burst-factor", type=int, default=1)
    parser.add_argument("--burst-period-s", type=float, default=60.0)
    parser.add_argument("--burst-on-s", type=float, default=15.0)
    args = parser.parse_args()

    config = Configuration()
    config.set_string("pipeline.name", args.job_name)
    config.set_string("state.backend.type", args.state_backend)
    config.set_string("execution.checkpointing.incremental", args.incremental)
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
    checkpoints.set_max_concurrent_checkpoints(args.max_concurrent_checkpoints)
    if args.max_concurrent_checkpoints > 1:
        checkpoints.set_min_pause_between_checkpoints(0)
    elif args.checkpoint_min_pause_ms > 0:
        checkpoints.set_min_pause_between_checkpoints(args.checkpoint_min_pause_ms)
    if args.unaligned == "true":
        checkpoints.enable_unaligned_checkpoints()

    tables = StreamTableEnvironment.create(env)
    tables.execute_sql(f"""
        CREATE TABLE records (k BIGINT, payload STRING) WITH (
            'connector' = 'datagen',
            'rows-per-second' = '{args.rate}',
            'fields.k.min' = '1', 'fields.k.max' = '1000000000000',
            'fields.payload.length' = '{args.payload_bytes}')""")
    source = tables.to_data_stream(tables.from_path("records"))
    pair = Types.TUPLE([Types.LONG(), Types.STRING()])
    keyed = (source
             .flat_map(AssignKey(args.hot_onset_ms, args.hot_share, args.burst_factor, args.burst_period_s,
                                 args.burst_on_s, args.hot_ramp_s, args.key_space), output_type=pair).name("assign-key"))
    leak_a = args.leak_onset_ms if args.leak_operator == "a" else NEVER
    leak_b = args.leak_onset_ms if args.leak_operator == "b" else NEVER
    if args.stateful == "window":
        windows = args.window_keys
        stateful = (keyed.key_by(lambda value: value[0] % windows, key_type=Types.LONG())
                    .window(TumblingProcessingTimeWindows.of(Time.milliseconds(int(args.window_s * 1000))))
                    .process(WindowContents(), output_type=pair).name("window").uid("window"))
    elif args.stateful == "timer":
        stateful = (keyed.key_by(lambda value: value[0], key_type=Types.LONG())
                    .process(KeyedState(0.0, leak_a, args.leak_share, args.keyed_cost_ms, timer_s=args.timer_s),
                             output_type=pair).name("timer-state").uid("timer-state"))
    else:
        stateful = (keyed.key_by(lambda value: value[0], key_type=Types.LONG())
                    .process(KeyedState(args.ttl_s, leak_a, args.leak_share, args.keyed_cost_ms,
                                        reject_new_onset_ms=args.reject_new_keys_onset_ms), output_type=pair)
                    .name("keyed-state").uid("keyed-state"))
    if args.second_stateful == "true":
        stateful = (stateful.key_by(lambda value: value[0] // 7 + 1, key_type=Types.LONG())
                    .process(KeyedState(args.ttl_b_s, leak_b, args.leak_share, 0.0), output_type=pair)
                    .name("keyed-state-b").uid("keyed-state-b"))
    (stateful
     .map(Enrich(args.slow_onset_ms, args.slow_records_per_s, args.slow_period_s, args.slow_on_s,
                 args.fail_onset_ms, args.fail_after_s, args.slow_start_records_per_s, args.slow_ramp_s),
          output_type=pair).name("enrich")
     .filter(lambda value: False).name("discard")
     .print().name("sink"))
    env.execute_async(args.job_name)


if __name__ == "__main__":
    main()
