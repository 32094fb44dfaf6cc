"""Several small SQL jobs on one Flink cluster from one submission (run inside the lab's Flink
virtualenv by ``flink run --python``; imports nothing from checkpoint-sentinel).

Each job: a datagen source, a keyed GROUP BY (state that grows with the keys seen) and a blackhole
sink, parallelism 1, a checkpoint every ``--checkpoint-interval-ms``. Every INSERT is its own job,
named ``<--prefix>-<i>``; all of them run in the JVM (no Python function), so eight cost the
machine little beside the one client that submits them.
"""

import argparse


def main() -> None:
    from pyflink.common import Configuration
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.table import StreamTableEnvironment

    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--prefix", default="fleet")
    parser.add_argument("--rate", type=int, default=20)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    args = parser.parse_args()

    env = StreamExecutionEnvironment.get_execution_environment(Configuration())
    env.set_parallelism(1)
    env.enable_checkpointing(args.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    tables = StreamTableEnvironment.create(env)
    for i in range(args.jobs):
        tables.execute_sql(f"""
            CREATE TABLE records_{i} (k BIGINT, payload STRING) WITH (
                'connector' = 'datagen', 'rows-per-second' = '{args.rate}',
                'fields.k.min' = '1', 'fields.k.max' = '100000', 'fields.payload.length' = '20')""")
        tables.execute_sql(f"CREATE TABLE results_{i} (k BIGINT, cnt BIGINT) WITH ('connector' = 'blackhole')")
    for i in range(args.jobs):
        tables.get_config().set("pipeline.name", f"{args.prefix}-{i}")
        tables.execute_sql(f"INSERT INTO results_{i} SELECT k, COUNT(*) FROM records_{i} GROUP BY k")


if __name__ == "__main__":
    main()
