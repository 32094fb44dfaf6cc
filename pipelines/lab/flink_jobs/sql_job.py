"""SQL / Table API jobs for the lab: the shapes production SQL jobs have, healthy or failing.

This file runs inside the lab's Flink virtualenv (``lab.flink_venv``), submitted by
``flink run --python``; it imports nothing from checkpoint-sentinel. Unlike the DataStream
scenario job, operators chain as Flink's planner chooses and the vertices carry the names Flink
generates (``GroupAggregate[5] -> ...``, ``Join[6]``), which the lab reads back from the REST API
for its ground truth. ``--query`` picks the job:

- ``window``: a tumbling processing-time window aggregation (healthy: its state fills and empties);
- ``join``: a regular inner join of two streams on keys that rarely match, without state TTL:
  both sides keep every row, so state grows from the start (a leak);
- ``dedup``: keep the first row per key with ``table.exec.state.ttl``: state grows for the TTL,
  then stays flat (a healthy warm-up);
- ``skew``: a GROUP BY over a bounded key space where, from ``--hot-onset-ms``, a share of the
  records carries one key (skew);
- ``bounded_agg``: a GROUP BY over a bounded key space (``--keys``, keys drawn uniformly), no
  TTL: a per-user aggregate over a fixed population, whose state fills and levels off;
- ``cep``: ``MATCH_RECOGNIZE`` (``PATTERN (A B)``, B right after A, per key): with keys that never
  repeat (``--keys 0``) and no ``WITHIN`` every partial match waits forever (a leak); over a
  bounded key space with ``--within-s`` the partial matches are bounded (healthy);
- ``join`` with ``--ttl-s`` (``table.exec.state.ttl``): the same join whose rows expire (healthy);
- ``slow_udf``: a Python scalar function that, from ``--slow-onset-ms``, handles at most
  ``--slow-records-per-s`` (backpressure behind it); the source runs apart from it
  (``scan.parallelism`` 1 under a wider job), so the slow function has a vertex to back up into.

Every ``--*-onset-ms`` is an epoch time: the fault begins when the wall clock passes it.
"""

import argparse
import time

from pyflink.common import Configuration
from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
from pyflink.table import DataTypes, StreamTableEnvironment
from pyflink.table.udf import ScalarFunction, udf

NEVER = -1
QUERIES = ("window", "join", "dedup", "skew", "slow_udf", "bounded_agg", "cep")


class SlowEnrich(ScalarFunction):
    """Slows down from the onset: the enrichment call that became slow (a remote lookup, a model)."""

    def __init__(self, onset_ms, records_per_s):
        self.onset_ms, self.records_per_s = onset_ms, records_per_s

    def eval(self, payload):
        if self.records_per_s > 0 and self.onset_ms != NEVER and time.time() * 1000 >= self.onset_ms:
            time.sleep(1.0 / self.records_per_s)
        return payload[:16]


def source(name: str, rate: int, payload_bytes: int, key_max: int, extra: str = "") -> str:
    return f"""
        CREATE TABLE {name} (
            k BIGINT, payload STRING, r INT, pt AS PROCTIME()
        ) WITH (
            'connector' = 'datagen', 'rows-per-second' = '{rate}',
            'fields.k.min' = '1', 'fields.k.max' = '{key_max}',
            'fields.r.min' = '0', 'fields.r.max' = '99',
            'fields.payload.length' = '{payload_bytes}'{extra})"""


def statements(args) -> list[str]:
    """The DDL and the INSERT of the chosen query."""
    sink_columns = {"window": "bucket BIGINT, window_start TIMESTAMP(3), cnt BIGINT, longest INT",
                    "join": "k BIGINT, order_payload STRING, payment_payload STRING",
                    "dedup": "k BIGINT, payload STRING",
                    "skew": "bucket BIGINT, cnt BIGINT, latest STRING",
                    "slow_udf": "k BIGINT, enriched STRING",
                    "bounded_agg": "k BIGINT, cnt BIGINT, latest STRING",
                    "cep": "k BIGINT, a_payload STRING, b_r INT"}[args.query]
    ddl = [f"CREATE TABLE results ({sink_columns}) WITH ('connector' = 'blackhole')"]
    if args.query == "window":
        ddl += [source("records", args.rate, args.payload_bytes, 10**12),
                f"CREATE TEMPORARY VIEW bucketed AS SELECT MOD(k, {args.keys}) AS bucket, payload, pt FROM records"]
        query = f"""
            INSERT INTO results
            SELECT bucket, window_start, COUNT(*), MAX(CHAR_LENGTH(payload))
            FROM TABLE(TUMBLE(TABLE bucketed, DESCRIPTOR(pt), INTERVAL '{int(args.window_s)}' SECOND))
            GROUP BY bucket, window_start, window_end"""
    elif args.query == "join":
        half = max(1, args.rate // 2)
        ddl += [source("orders", half, args.payload_bytes, 10**12),
                source("payments", half, args.payload_bytes, 10**12)]
        query = """
            INSERT INTO results
            SELECT o.k, o.payload, p.payload FROM orders AS o JOIN payments AS p ON o.k = p.k"""
    elif args.query == "dedup":
        ddl.append(source("records", args.rate, args.payload_bytes, 10**12))
        query = """
            INSERT INTO results
            SELECT k, payload FROM (
                SELECT k, payload, ROW_NUMBER() OVER (PARTITION BY k ORDER BY pt ASC) AS rn FROM records)
            WHERE rn = 1"""
    elif args.query == "skew":
        ddl.append(source("records", args.rate, args.payload_bytes, 10**12))
        hot = round(args.hot_share * 100)
        onset = args.hot_onset_ms if args.hot_onset_ms != NEVER else 4102444800000  # 2100: never
        query = f"""
            INSERT INTO results
            SELECT bucket, COUNT(*), MAX(payload) FROM (
                SELECT CASE WHEN pt >= TO_TIMESTAMP_LTZ({onset}, 3) AND r < {hot} THEN CAST(0 AS BIGINT)
                            ELSE MOD(k, {args.keys}) + 1 END AS bucket, payload
                FROM records)
            GROUP BY bucket"""
    elif args.query == "bounded_agg":
        ddl.append(source("records", args.rate, args.payload_bytes, args.keys))
        query = """
            INSERT INTO results
            SELECT k, COUNT(*), MAX(payload) FROM records GROUP BY k"""
    elif args.query == "cep":
        ddl.append(source("records", args.rate, args.payload_bytes, args.keys if args.keys > 0 else 10**12))
        within = f"WITHIN INTERVAL '{int(args.within_s)}' SECOND" if args.within_s > 0 else ""
        query = f"""
            INSERT INTO results
            SELECT k, a_payload, b_r FROM records
            MATCH_RECOGNIZE (
                PARTITION BY k ORDER BY pt
                MEASURES A.payload AS a_payload, B.r AS b_r
                ONE ROW PER MATCH
                AFTER MATCH SKIP PAST LAST ROW
                PATTERN (A B) {within}
                DEFINE A AS A.r < 50, B AS B.r >= 90)"""
    else:
        ddl.append(source("records", args.rate, args.payload_bytes, 10**12, ", 'scan.parallelism' = '1'"))
        query = """
            INSERT INTO results
            SELECT k, slow_enrich(payload) FROM records"""
    return ddl + [query]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-name", required=True)
    parser.add_argument("--query", required=True, choices=QUERIES)
    parser.add_argument("--rate", type=int, default=100, help="records per second from the source(s)")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--state-backend", default="hashmap", choices=["hashmap", "rocksdb"])
    parser.add_argument("--incremental", default="false", choices=["true", "false"])
    parser.add_argument("--checkpoint-interval-ms", type=int, default=3000)
    parser.add_argument("--checkpoint-timeout-ms", type=int, default=60000)
    parser.add_argument("--tolerable-failed-checkpoints", type=int, default=1000)
    parser.add_argument("--ttl-s", type=float, default=0.0, help="table.exec.state.ttl; 0: state never expires")
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--keys", type=int, default=1000, help="the key space of window, skew, bounded_agg and cep "
                                                                "(cep: 0 for keys that never repeat)")
    parser.add_argument("--within-s", type=float, default=0.0, help="cep: WITHIN INTERVAL seconds; 0: none")
    parser.add_argument("--hot-onset-ms", type=int, default=NEVER)
    parser.add_argument("--hot-share", type=float, default=0.85)
    parser.add_argument("--slow-onset-ms", type=int, default=NEVER)
    parser.add_argument("--slow-records-per-s", type=float, default=0.0)
    args = parser.parse_args()

    config = Configuration()
    config.set_string("pipeline.name", args.job_name)
    config.set_string("state.backend.type", args.state_backend)
    config.set_string("execution.checkpointing.incremental", args.incremental)
    # Small Python bundles: a slow function holds back the records it has, not a hundred thousand.
    config.set_string("python.fn-execution.bundle.size", "50")
    config.set_string("python.fn-execution.bundle.time", "100")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(args.parallelism)
    env.enable_checkpointing(args.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    checkpoints = env.get_checkpoint_config()
    checkpoints.set_checkpoint_timeout(args.checkpoint_timeout_ms)
    checkpoints.set_tolerable_checkpoint_failure_number(args.tolerable_failed_checkpoints)
    tables = StreamTableEnvironment.create(env)
    table_config = tables.get_config()
    table_config.set("table.exec.state.ttl", f"{int(args.ttl_s * 1000)} ms")
    table_config.set("pipeline.name", args.job_name)
    tables.create_temporary_function(
        "slow_enrich", udf(SlowEnrich(args.slow_onset_ms, args.slow_records_per_s), result_type=DataTypes.STRING()))
    *ddl, insert = statements(args)
    for statement in ddl:
        tables.execute_sql(statement)
    tables.execute_sql(insert)  # submits the job and returns (detached)


if __name__ == "__main__":
    main()
