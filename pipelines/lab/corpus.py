"""The real-Flink corpus: grids of lab variants, split by variant into train, validation and test.

Each entry is one parameter combination of a scenario (state backend, parallelism, rate, record
size, checkpoint interval, TTL or window length, severity, onset), recorded once per Flink
version. Splits are by variant and stratified by Flink version, job kind (DataStream or SQL),
length (short or long) and scenario, so the test split holds parameter combinations that
training never saw. The assignment is a seeded shuffle per stratum: adding variants to one
stratum does not move another's runs between splits. The DataStream grid as first recorded
(Flink 2.3.0, short runs) keeps the strata and splits it had: one stratum per scenario.

A stratum of one run goes to test, of two to test and train: a long run (too few to train on,
and what the test split must show) and a SQL scenario recorded on two versions (one version in
test, the other in train).

``sentinel lab --grid NAME`` records the grid's variants for the configured Flink version
(``lab.flink_version``) that the dataset folder does not hold yet; the committed recordings are
under ``data/lab/``.
"""

from __future__ import annotations

import random
from fnmatch import fnmatch

from pipelines.lab.scenarios import (DATASTREAM, ORIGINAL_VERSION, LabVariant, backpressure, backpressure_deepening,
                                     bounded_keys, checkpoint_timeout, healthy_bursty, healthy_large_state,
                                     healthy_subsecond, healthy_timer, healthy_ttl, healthy_window, leak_after_plateau,
                                     leak_fixed, leak_late, leak_one_of_two, leak_slow_on_ttl, leak_start,
                                     leak_to_limit, leak_to_timeout, restart_loop, skew, sql_bounded_keys,
                                     sql_cep_bounded, sql_cep_leak, sql_dedup_ttl, sql_join_leak, sql_join_ttl,
                                     sql_skew, sql_slow_udf, sql_window, storage_outage, ttl_horizon)

SPLIT_SEED = 0  # the first seed whose test and validation splits cover every sub-variant (severity, with or without backpressure, leak kinds)
FRACTIONS = (0.6, 0.2, 0.2)
LAB_VERSIONS = (ORIGINAL_VERSION, "1.20.5")  # the versions whose runs share strata (and so a SQL scenario's splits)
LONG_MIN = 38  # the long runs' length: half an hour and more, done within one working session


def _variants() -> list[LabVariant]:
    return [
        # Healthy: TTL warm-ups of several lengths (all shorter than the default warm-up horizon),
        # windows filling and firing, timers clearing state, bursty input, sub-second intervals.
        healthy_ttl(20, "hashmap", 1, 150),
        healthy_ttl(45, "rocksdb", 2, 120),
        healthy_ttl(60, "hashmap", 1, 200, interval_ms=2000),
        healthy_ttl(90, "rocksdb_inc", 1, 150),
        healthy_ttl(120, "hashmap", 2, 100, interval_ms=5000, duration_s=330),
        healthy_ttl(150, "hashmap", 1, 100, duration_s=360),
        healthy_ttl(30, "rocksdb_inc", 3, 150),
        healthy_ttl(75, "hashmap", 1, 250, interval_ms=1000),
        healthy_ttl(100, "rocksdb", 1, 120, payload=300, duration_s=330),
        healthy_ttl(135, "rocksdb_inc", 2, 100, duration_s=360),
        healthy_window(30, 1, 150),
        healthy_window(60, 2, 120, "rocksdb"),
        healthy_window(45, 1, 200),
        healthy_window(90, 1, 100, duration_s=330),
        healthy_timer(30, 1, 150),
        healthy_timer(60, 2, 120, "rocksdb"),
        healthy_timer(90, 1, 100),
        healthy_timer(45, 1, 200, "rocksdb_inc"),
        healthy_bursty(3, 60, 15, 1, 80),
        healthy_bursty(2, 45, 15, 2, 70),
        healthy_bursty(3, 90, 20, 1, 60),
        healthy_bursty(4, 60, 10, 1, 50),
        healthy_subsecond(500, 2, 1, 100),
        healthy_subsecond(700, 3, 1, 100, backend="rocksdb"),
        healthy_subsecond(500, 3, 2, 80),
        healthy_subsecond(800, 2, 1, 120, backend="rocksdb_inc"),
        # State leaks: from the start (no limit known, the JobManager's 5 MiB, RocksDB full and
        # incremental), after a plateau, slow on top of TTL-bounded state, in one of two operators.
        leak_start("hashmap", "filesystem", 1, 150),
        leak_start("rocksdb", "filesystem", 1, 150),
        leak_start("rocksdb_inc", "filesystem", 2, 120),
        leak_start("hashmap", "jobmanager", 1, 100),
        leak_start("hashmap", "filesystem", 2, 80, payload=300),
        leak_start("rocksdb_inc", "filesystem", 1, 60, interval_ms=5000),
        leak_start("hashmap", "filesystem", 1, 250, interval_ms=1000),
        leak_start("rocksdb", "filesystem", 3, 100),
        leak_start("hashmap", "jobmanager", 2, 120),
        leak_after_plateau(30, 120, "hashmap", 1, 150),
        leak_after_plateau(45, 100, "rocksdb", 1, 150),
        leak_after_plateau(20, 150, "rocksdb_inc", 2, 120, duration_s=360),
        leak_after_plateau(60, 130, "hashmap", 2, 100, duration_s=360),
        leak_after_plateau(30, 90, "hashmap", 1, 200),
        leak_slow_on_ttl(45, 0.2, 90, "hashmap", 1, 200),
        leak_slow_on_ttl(30, 0.1, 60, "rocksdb", 1, 250),
        leak_slow_on_ttl(60, 0.3, 100, "rocksdb_inc", 2, 150),
        leak_slow_on_ttl(40, 0.15, 90, "hashmap", 1, 200),
        leak_slow_on_ttl(50, 0.25, 80, "hashmap", 2, 150),
        leak_one_of_two("b", 0, 1, 150),
        leak_one_of_two("a", 0, 1, 150),
        leak_one_of_two("b", 90, 1, 150, "rocksdb"),
        leak_one_of_two("a", 100, 2, 120),
        leak_one_of_two("b", 0, 2, 100, "rocksdb_inc"),
        # Backpressure: severe, mild and intermittent; aligned and unaligned checkpoints.
        backpressure("severe", False, 1, 200),
        backpressure("severe", True, 1, 200),
        backpressure("mild", False, 1, 200),
        backpressure("mild", True, 2, 150),
        backpressure("intermittent", False, 1, 200),
        backpressure("intermittent", True, 1, 250),
        backpressure("severe", False, 2, 120),
        backpressure("mild", False, 1, 300),
        # Skew at parallelism 2 to 4, with and without the hot subtask saturating.
        skew(2, 0.85, False, 150),
        skew(3, 0.8, False, 200),
        skew(4, 0.7, False, 200),
        skew(2, 0.9, True, 150),
        skew(3, 0.85, True, 150),
        skew(4, 0.8, True, 120),
        skew(2, 0.75, False, 250),
        skew(3, 0.9, False, 120),
        # Checkpoint failures: timeouts, a task failing in a loop, checkpoint storage refusing writes.
        checkpoint_timeout(5000, 1, 200),
        checkpoint_timeout(8000, 1, 300),
        checkpoint_timeout(3000, 2, 150),
        checkpoint_timeout(6000, 1, 150),
        restart_loop(30, 1, 150),
        restart_loop(20, 2, 150),
        restart_loop(45, 1, 150),
        restart_loop(25, 1, 200),
        storage_outage(40, 25, 1, 150),
        storage_outage(60, 30, 1, 150, "rocksdb"),
        storage_outage(30, 20, 2, 120),
    ]


def _long_variants() -> list[LabVariant]:
    """Production time scales: a slow leak at a realistic rate, a warm-up of a quarter of an hour
    that then plateaus, backpressure in episodes, and skew that drifts in over ten minutes."""
    d = LONG_MIN * 60
    long_runs = [
        # ~20 records/s kept forever (about 2.7 KB/s of checkpointed state) on top of TTL-bounded
        # state that warms up for three minutes.
        leak_slow_on_ttl(180, 0.2, 0, "hashmap", 1, 100, duration_s=d),
        # 60 new keys/s with a 15-minute TTL: state grows for 15 minutes, then stays flat.
        healthy_ttl(900, "hashmap", 1, 60, interval_ms=5000, duration_s=d),
        # enrich slows to a quarter of the input for one minute in every five, from minute five.
        backpressure("intermittent", False, 1, 200, onset_s=300, duration_s=d, period_s=300, slow_s=60),
        # the hot key's share rises from nothing to 85 % over ten minutes, from minute five.
        skew(3, 0.85, False, 150, onset_s=300, duration_s=d, ramp_s=600),
    ]
    return [v.with_(run_id=f"{v.run_id}-d{LONG_MIN}m") for v in long_runs]


HOUR_MIN = 62  # the hour runs' length: an hour and the two minutes a detector needs after it


def _hour_variants() -> list[LabVariant]:
    """An hour on Flink 2.3.0: a healthy job whose state breathes around its plateau (bursty input
    into a 2-minute TTL) and a slow leak under TTL-bounded state for the whole hour (issue 57)."""
    d = HOUR_MIN * 60
    runs = [
        # 60 records/s, 4x for 90 s of every 5 minutes, into a 2-minute TTL: the state rises with
        # every burst to about three times its plateau and falls back, for an hour.
        healthy_bursty(4, 300, 90, 1, 60, ttl_s=120, duration_s=d).with_(
            run_id="healthy_bursty-x4-per300-on90-ttl120-p1-r60"),
        # 100 records/s into a 2-minute TTL, 7 % of them also kept forever (about 1.3 KB/s of
        # checkpointed state) from the start, for an hour.
        leak_slow_on_ttl(120, 0.07, 0, "hashmap", 1, 100, duration_s=d).with_(scenario="leak_slow_hour"),
    ]
    return [v.with_(run_id=f"{v.run_id}-d{HOUR_MIN}m") for v in runs]


def _growth_variants() -> list[LabVariant]:
    """Issue 57, growth that levels off against leaks: bounded key spaces that fill for 2 to 15
    minutes, TTL warm-ups whose plateau comes just before, at or just after the declared horizon,
    leaks that begin 10, 20 and 40 minutes in, leaks that are fixed, and SQL state (a bounded
    GROUP BY, MATCH_RECOGNIZE leaking and bounded, a join whose rows expire)."""
    return [
        # The 40-minute onset first: the longest run (48 min) starts first.
        leak_late(60, 2400, "hashmap", 1, 100),
        leak_late(60, 600, "hashmap", 1, 120),
        leak_late(45, 1200, "rocksdb", 1, 100),
        # Time constants K / rate of 40, 120 and 300 s: the fill lasts 2, 6 and 15 minutes (95 %).
        bounded_keys(6000, 150, 60),
        bounded_keys(18000, 150, 80, "rocksdb"),
        bounded_keys(45000, 150, 60),
        # The plateau (about TTL + 30 s on heap state) just before, at and just after the horizon.
        ttl_horizon(240, 60, rate=100, extra_s=360),
        ttl_horizon(360, 30, rate=120, extra_s=360),
        ttl_horizon(480, 0, rate=80, extra_s=360),
        leak_fixed(300, "hashmap", 1, 150),
        leak_fixed(240, "rocksdb", 1, 120),
        leak_fixed(180, "hashmap", 2, 100),
        sql_bounded_keys(10000, 1, 200, plateau_s=360),
        sql_bounded_keys(15000, 1, 150, "rocksdb", plateau_s=360),
        sql_bounded_keys(30000, 2, 200, plateau_s=360),
        sql_cep_leak(1, 150, duration_s=300), sql_cep_leak(2, 120, "rocksdb", duration_s=300),
        sql_cep_leak(1, 100, duration_s=300),
        sql_cep_bounded(5000, 30, 1, 150, duration_s=300), sql_cep_bounded(2000, 60, 2, 120, "rocksdb", duration_s=300),
        sql_cep_bounded(10000, 20, 1, 200, duration_s=300),
        sql_join_ttl(60, 1, 100, duration_s=300), sql_join_ttl(90, 2, 120, "rocksdb", duration_s=300),
        sql_join_ttl(45, 1, 150, duration_s=300),
    ]


def _buildup_variants() -> list[LabVariant]:
    """Issue 58, build-up until checkpoints fail, and healthy twins that stay under their timeout.
    Measured on the lab machine (2 cores, shared): heap snapshots of 4 KB records cost about
    6-8 ms/MB and the barrier needs 1-2 s to cross the job, so a 3-5 s timeout is met at a few
    hundred MB."""
    return [
        leak_to_timeout(300, 4000, 4000, duration_s=600),
        leak_to_timeout(250, 3000, 3000, duration_s=660),
        leak_to_timeout(300, 3000, 5000, duration_s=900),
        # 5 MiB of JobManager checkpoint storage after about 3, 5 and 10 minutes.
        leak_to_limit(200), leak_to_limit(120), leak_to_limit(70),
        backpressure_deepening(200, 1.5, 0.2, 60, 480, 20000),
        backpressure_deepening(150, 2.0, 0.25, 60, 360, 10000),
        backpressure_deepening(250, 1.3, 0.2, 60, 600, 30000),
        healthy_large_state(30000, 300, 3000, 6000, duration_s=600),
        healthy_large_state(40000, 250, 2500, 8000, duration_s=780),
        healthy_large_state(20000, 200, 4000, 6000, duration_s=600),
    ]


def _fixed_variants() -> list[LabVariant]:
    """Issue 57, leaks fixed well after they are found (the growth grid's fixes come within the
    warm-up horizon on a loaded machine, where the job starts a minute or more after its
    submission): their incidents must resolve once the state has stayed flat for the clear time."""
    return [
        leak_fixed(540, "hashmap", 1, 120),
        leak_fixed(600, "rocksdb", 1, 100),
        leak_fixed(480, "hashmap", 2, 100),
    ]


def _sql_variants() -> list[LabVariant]:
    """SQL / Table API jobs, two parameter combinations of each, with the vertex names Flink generates."""
    return [
        sql_window(30, 1, 150), sql_window(60, 2, 120, "rocksdb"),
        sql_join_leak(1, 100), sql_join_leak(2, 120, "rocksdb"),
        sql_dedup_ttl(90, 1, 150), sql_dedup_ttl(60, 2, 120, "rocksdb"),
        sql_skew(3, 0.85, 200), sql_skew(2, 0.9, 150),
        sql_slow_udf(2, 0.25, 200), sql_slow_udf(2, 0.4, 150),
    ]


def stratum(variant: LabVariant) -> str:
    """The group a variant's split is drawn in. The original grid's strata are its scenarios (as
    they were when it was recorded); every other stratum is (version, kind, length, scenario),
    except that a SQL scenario's runs on every version share one (one version's run is tested,
    another's trained on)."""
    if variant.flink_version == ORIGINAL_VERSION and variant.kind == DATASTREAM and variant.length == "short":
        return variant.scenario
    version = "" if variant.kind != DATASTREAM else f"{variant.flink_version}:"
    return f"{version}{variant.kind}:{variant.length}:{variant.scenario}"


def assign_splits(variants: list[LabVariant], seed: int = SPLIT_SEED, fractions=FRACTIONS) -> list[LabVariant]:
    """Each variant with its split: per stratum, a seeded shuffle cut at the fractions (a stratum
    of one or two runs: test, then train)."""
    by_stratum: dict[str, list[LabVariant]] = {}
    for variant in variants:
        by_stratum.setdefault(stratum(variant), []).append(variant)
    out = []
    for key, group in by_stratum.items():
        group = sorted(group, key=lambda v: v.run_id)
        random.Random(f"lab-split:{seed}:{key}").shuffle(group)
        n = len(group)
        n_test = max(1, round(n * fractions[2]))
        n_validation = max(1, round(n * fractions[1])) if n >= 3 else 0
        for i, variant in enumerate(group):
            split = "test" if i < n_test else "validation" if i < n_test + n_validation else "train"
            out.append(variant.with_(split=split))
    return out


def _grid(variants: list[LabVariant], only: str | None, version: str) -> list[LabVariant]:
    """The variants recorded on ``version`` with their splits, optionally those whose run id
    matches ``only`` (globs separated by commas), interleaved across scenarios: a grid stopped half-way has recorded
    some of each."""
    variants = [v for v in assign_splits(variants) if v.flink_version == version]
    ids = [v.run_id for v in variants]
    if len(set(ids)) != len(ids):
        raise ValueError("two corpus variants share a run id")
    by_scenario: dict[str, list[LabVariant]] = {}
    for variant in variants:
        by_scenario.setdefault(variant.scenario, []).append(variant)
    interleaved = [group[i] for i in range(max(map(len, by_scenario.values())))
                   for group in by_scenario.values() if i < len(group)]
    patterns = only.split(",") if only else None
    return [v for v in interleaved if patterns is None or any(fnmatch(v.run_id, p) for p in patterns)]


def _on_versions(variants: list[LabVariant], version: str) -> list[LabVariant]:
    versions = dict.fromkeys((*LAB_VERSIONS, version))
    return [v.on_version(ver) for ver in versions for v in variants]


def corpus(only: str | None = None, version: str = ORIGINAL_VERSION) -> list[LabVariant]:
    """The DataStream grid of short runs."""
    return _grid([v.on_version(version) for v in _variants()], only, version)


def long_runs(only: str | None = None, version: str = ORIGINAL_VERSION) -> list[LabVariant]:
    """The DataStream runs at production time scales."""
    return _grid(_on_versions(_long_variants(), version), only, version)


def sql(only: str | None = None, version: str = ORIGINAL_VERSION) -> list[LabVariant]:
    """The SQL / Table API grid of short runs."""
    return _grid(_on_versions(_sql_variants(), version), only, version)


def hour(only: str | None = None, version: str = ORIGINAL_VERSION) -> list[LabVariant]:
    """The hour runs (Flink 2.3.0 only)."""
    return _grid([v.on_version(version) for v in _hour_variants()], only, version)


def growth(only: str | None = None, version: str = ORIGINAL_VERSION) -> list[LabVariant]:
    """Issue 57's runs: growth that levels off, leaks that begin late or are fixed, SQL state."""
    return _grid(_on_versions(_growth_variants(), version), only, version)


def buildup(only: str | None = None, version: str = ORIGINAL_VERSION) -> list[LabVariant]:
    """Issue 58's runs: build-up until checkpoints fail, and healthy twins."""
    return _grid(_on_versions(_buildup_variants(), version), only, version)


def fixed(only: str | None = None, version: str = ORIGINAL_VERSION) -> list[LabVariant]:
    """Issue 57's leaks fixed after they are found."""
    return _grid(_on_versions(_fixed_variants(), version), only, version)


def longest_first(*grids):
    """Several grids as one session's list, longest runs first (so the session ends soonest)."""
    def grid(only: str | None = None, version: str = ORIGINAL_VERSION) -> list[LabVariant]:
        return sorted((v for g in grids for v in g(only, version)), key=lambda v: -v.duration_s)
    return grid


GRIDS = {"corpus": corpus, "long": long_runs, "sql": sql, "hour": hour, "growth": growth, "buildup": buildup,
         "fixed": fixed, "growth+buildup": longest_first(growth, buildup)}
