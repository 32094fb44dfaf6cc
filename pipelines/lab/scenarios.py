"""The lab's scenarios: real Flink jobs that fail (or stay healthy) in a known way, as run specs.

A :class:`LabVariant` is one run: the scenario it belongs to, the flags of the PyFlink job
(``flink_jobs/scenario_job.py``), when its fault begins (seconds after the job starts), how long
it runs and the faults it must be labelled with. Scenario builders turn a few parameters into a
variant, so the corpus (``pipelines/lab/corpus.py``) is a grid of parameter combinations and
``sentinel lab NAME`` runs one named variant.

Faults name the operator they live in (the DataStream job names its vertices after its
operators; a SQL job's vertex is found by a pattern over the names Flink gave it) or nothing for
a job-level fault. A fault caused by another (failing checkpoints behind
backpressure, backpressure behind a hot key) is listed too: on-call must hear of it, in the
cause's incident or in its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.post_rule import DEFAULT_WARMUP_HORIZON_S
from pipelines.families import BACKPRESSURE, CHECKPOINT_FAILURE, SKEW, STATE_LEAK

DATASTREAM, SQL = "datastream", "sql"
ORIGINAL_VERSION = "2.3.0"  # the Flink version the corpus was first recorded on
LONG_RUN_S = 1800


@dataclass(frozen=True)
class LabFault:
    family: str
    vertex: str | None  # operator name; None: the job as a whole
    hot_subtask: bool = False  # a skew's hot subtask is read from the run (most records after the onset)
    at_first_failure: bool = False  # onset = the first failed checkpoint after the fault's onset, if any
    # A vertex whose name Flink generates (SQL): a regular expression its REST name must match, alone.
    vertex_pattern: str | None = None
    # A fault that ends (a leak that is fixed): seconds after the job starts, counted as onsets are;
    # the ground truth gives it as ``end_ts`` (epoch ms). None: it lasts to the end of the run.
    end_s: float | None = None


@dataclass(frozen=True)
class LabVariant:
    run_id: str
    scenario: str
    description: str
    job_args: dict
    faults: tuple[LabFault, ...] = ()
    onset_s: float = 0.0  # after the job starts; 0: from the start
    onset_args: tuple[str, ...] = ()  # job flags that receive the onset as an epoch time
    duration_s: int = 300
    storage_outage: tuple[float, float] | None = None  # (period, down) seconds: checkpoint storage unwritable
    split: str = "test"
    kind: str = DATASTREAM  # the job's API: a DataStream job or a SQL / Table API job
    script: str = "scenario_job.py"  # in flink_jobs/
    flink_version: str = ORIGINAL_VERSION
    # The warm-up its operator would declare (``detection.job_overrides``); None: the default horizon.
    warmup_horizon_s: float | None = None
    # Job flags that receive an epoch time this many seconds after the job starts (as onsets do):
    # ``(("reject-new-keys-onset-ms", 300.0),)``.
    at_args: tuple[tuple[str, float], ...] = ()
    # What the run must show to be sound (``pipelines.lab.unsound``): True, checkpoints that fail
    # after the onset (a build-up that must end in failures); False, none (a healthy twin); None: no check.
    expect_failures: bool | None = None

    @property
    def length(self) -> str:
        """``long`` for runs at production time scales (half an hour or more), else ``short``."""
        return "long" if self.duration_s >= LONG_RUN_S else "short"

    @property
    def family(self) -> str:
        """The run's primary family (the first fault's), or healthy."""
        return self.faults[0].family if self.faults else "healthy"

    @property
    def parallelism(self) -> int:
        return int(self.job_args.get("parallelism", 1))

    def with_(self, **changes) -> "LabVariant":
        from dataclasses import replace
        return replace(self, **changes)

    def on_version(self, version: str) -> "LabVariant":
        """The same run on another Flink version; its run id names the version unless it is the
        corpus's original one (whose run ids predate versions)."""
        suffix = "" if version == ORIGINAL_VERSION else f"-v{version}"
        return self.with_(flink_version=version, run_id=self.run_id + suffix)


BASE_ARGS = {"rate": 150, "payload-bytes": 100, "checkpoint-interval-ms": 3000}


def _args(**overrides) -> dict:
    args = dict(BASE_ARGS)
    args.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return args


def _backend(name: str) -> dict:
    """``hashmap``, ``rocksdb`` (full checkpoints) or ``rocksdb_inc`` (incremental)."""
    return {"hashmap": {"state-backend": "hashmap"}, "rocksdb": {"state-backend": "rocksdb", "incremental": "false"},
            "rocksdb_inc": {"state-backend": "rocksdb", "incremental": "true"}}[name]


def _id(*parts) -> str:
    return "-".join(str(p) for p in parts if p not in (None, ""))


# --- healthy ---------------------------------------------------------------------------------------

def healthy_ttl(ttl_s=30, backend="hashmap", p=1, rate=150, payload=100, interval_ms=3000, duration_s=300,
                horizon_s=None):
    """``horizon_s``: the warm-up horizon its operator declares; None: :func:`declared_horizon`."""
    return LabVariant(_id("healthy_ttl", f"ttl{ttl_s}", backend, f"p{p}", f"r{rate}", f"i{interval_ms}"), "healthy_ttl",
                      f"state TTL {ttl_s}s: state grows for {ttl_s}s, then stays flat",
                      _args(ttl_s=ttl_s, parallelism=p, rate=rate, payload_bytes=payload,
                            checkpoint_interval_ms=interval_ms, **_backend(backend)), duration_s=duration_s,
                      warmup_horizon_s=declared_horizon(ttl_s) if horizon_s is None else float(horizon_s))


def declared_horizon(ttl_s: float) -> float | None:
    """The warm-up horizon an operator declares for a job whose state TTL outlasts the default
    horizon (the TTL and a minute for the last keys' expiry to show in a checkpoint); None where
    the default covers it."""
    return float(ttl_s) + 60.0 if ttl_s > DEFAULT_WARMUP_HORIZON_S else None


def healthy_window(window_s=60, p=1, rate=150, backend="hashmap", duration_s=300):
    return LabVariant(_id("healthy_window", f"w{window_s}", backend, f"p{p}", f"r{rate}"), "healthy_window",
                      f"a {window_s}s tumbling window keeps its elements until it fires: state fills and empties",
                      _args(stateful="window", window_s=window_s, parallelism=p, rate=rate, **_backend(backend)),
                      duration_s=duration_s)


def healthy_timer(timer_s=60, p=1, rate=150, backend="hashmap", duration_s=300):
    return LabVariant(_id("healthy_timer", f"t{timer_s}", backend, f"p{p}", f"r{rate}"), "healthy_timer",
                      f"a processing-time timer clears each key {timer_s}s after it appears",
                      _args(stateful="timer", timer_s=timer_s, parallelism=p, rate=rate, **_backend(backend)),
                      duration_s=duration_s)


def healthy_bursty(factor=3, period_s=60, on_s=15, p=1, rate=80, ttl_s=30, duration_s=300):
    return LabVariant(_id("healthy_bursty", f"x{factor}", f"per{period_s}", f"p{p}", f"r{rate}"), "healthy_bursty",
                      f"input bursts to {factor}x for {on_s}s of every {period_s}s, with spare capacity",
                      _args(burst_factor=factor, burst_period_s=period_s, burst_on_s=on_s, ttl_s=ttl_s, parallelism=p,
                            rate=rate), duration_s=duration_s)


def healthy_subsecond(interval_ms=500, concurrent=2, p=1, rate=100, ttl_s=30, backend="hashmap", duration_s=300):
    return LabVariant(_id("healthy_subsecond", f"i{interval_ms}", f"c{concurrent}", backend, f"p{p}"), "healthy_subsecond",
                      f"checkpoints every {interval_ms} ms, up to {concurrent} at once",
                      _args(checkpoint_interval_ms=interval_ms, max_concurrent_checkpoints=concurrent, ttl_s=ttl_s,
                            parallelism=p, rate=rate, **_backend(backend)), duration_s=duration_s)


# --- state leaks -------------------------------------------------------------------------------------

def leak_start(backend="hashmap", storage="filesystem", p=1, rate=150, payload=100, interval_ms=3000, duration_s=360):
    faults = [LabFault(STATE_LEAK, "keyed-state")]
    if storage == "jobmanager":  # the 5 MiB limit: past it every checkpoint fails
        faults.append(LabFault(CHECKPOINT_FAILURE, None, at_first_failure=True))
    return LabVariant(_id("leak_start", backend, storage, f"p{p}", f"r{rate}", f"b{payload}", f"i{interval_ms}"),
                      "leak_start", "every record a new key, never cleared: state grows from the start",
                      _args(ttl_s=0, checkpoint_storage=storage, parallelism=p, rate=rate, payload_bytes=payload,
                            checkpoint_interval_ms=interval_ms, **_backend(backend)),
                      tuple(faults), duration_s=duration_s)


def leak_after_plateau(ttl_s=30, onset_s=120, backend="hashmap", p=1, rate=150, duration_s=330):
    return LabVariant(_id("leak_after_plateau", f"ttl{ttl_s}", f"on{onset_s}", backend, f"p{p}", f"r{rate}"),
                      "leak_after_plateau", f"TTL-bounded state ({ttl_s}s) until a change at {onset_s}s keeps every key",
                      _args(ttl_s=ttl_s, leak_share=1.0, parallelism=p, rate=rate, **_backend(backend)),
                      (LabFault(STATE_LEAK, "keyed-state"),), onset_s, ("leak-onset-ms",), duration_s)


def leak_slow_on_ttl(ttl_s=45, share=0.2, onset_s=90, backend="hashmap", p=1, rate=200, duration_s=360):
    return LabVariant(_id("leak_slow_on_ttl", f"ttl{ttl_s}", f"s{share}", f"on{onset_s}", backend, f"p{p}", f"r{rate}"),
                      "leak_slow_on_ttl", f"{share:.0%} of the records are kept forever on top of a {ttl_s}s TTL",
                      _args(ttl_s=ttl_s, leak_share=share, parallelism=p, rate=rate, **_backend(backend)),
                      (LabFault(STATE_LEAK, "keyed-state"),), onset_s, ("leak-onset-ms",), duration_s)


def leak_one_of_two(operator="b", onset_s=0, p=1, rate=150, backend="hashmap", duration_s=360):
    vertex = "keyed-state" if operator == "a" else "keyed-state-b"
    return LabVariant(_id("leak_one_of_two", operator, f"on{onset_s}", backend, f"p{p}", f"r{rate}"), "leak_one_of_two",
                      f"two stateful operators with a 30s TTL; {vertex} also keeps every key from {onset_s}s",
                      _args(ttl_s=30, ttl_b_s=30, second_stateful="true", leak_operator=operator, leak_share=1.0,
                            leak_onset_ms=-1, parallelism=p, rate=rate, **_backend(backend)),
                      (LabFault(STATE_LEAK, vertex),), onset_s, ("leak-onset-ms",), duration_s)


# --- growth that levels off, leaks that begin late or are fixed (issue 57) ------------------------------

def bounded_keys(keys=20000, rate=200, payload=60, backend="hashmap", p=1, interval_ms=3000, plateau_s=420,
                 duration_s=None):
    """Every record's key drawn uniformly from ``keys`` keys, one small value per key, no TTL: a
    per-user aggregate over a fixed population. The state fills like K(1 - exp(-rate t / K)) with
    the time constant K / rate and levels off; the run lasts three time constants (95 %) and
    ``plateau_s``."""
    tau = keys / rate
    duration_s = duration_s or int(round(3 * tau + plateau_s, -1))
    return LabVariant(_id("bounded_keys", f"k{keys}", backend, f"p{p}", f"r{rate}", f"b{payload}"), "bounded_keys",
                      f"keys drawn uniformly from {keys:,}, no TTL: state fills with a {tau:.0f}s time constant "
                      "and levels off", _args(ttl_s=0, key_space=keys, parallelism=p, rate=rate, payload_bytes=payload,
                                              checkpoint_interval_ms=interval_ms, **_backend(backend)),
                      duration_s=duration_s)


def ttl_horizon(ttl_s=300, offset_s=30, backend="hashmap", p=1, rate=100, extra_s=420):
    """A TTL warm-up whose declared horizon is the TTL and ``offset_s``: on heap state the plateau
    comes about 30 s after the TTL, so 60 puts the horizon just after the plateau begins, 30 at it
    and 0 just before it. The run lasts the TTL and ``extra_s``."""
    horizon = ttl_s + offset_s
    variant = healthy_ttl(ttl_s, backend, p, rate, duration_s=ttl_s + extra_s, horizon_s=horizon)
    return variant.with_(run_id=_id("ttl_horizon", f"ttl{ttl_s}", f"h{horizon}", backend, f"p{p}", f"r{rate}"),
                         scenario="ttl_horizon",
                         description=f"state TTL {ttl_s}s (plateau about {ttl_s + 30}s), declared warm-up horizon "
                                     f"{horizon}s")


def leak_late(ttl_s=60, onset_s=600, backend="hashmap", p=1, rate=120, extra_s=480):
    """TTL-bounded state for ``onset_s``, then every key is kept (a change late in the job's life);
    the run lasts the onset and ``extra_s``."""
    variant = leak_after_plateau(ttl_s, onset_s, backend, p, rate, duration_s=onset_s + extra_s)
    return variant.with_(run_id=_id("leak_late", f"ttl{ttl_s}", f"on{onset_s}", backend, f"p{p}", f"r{rate}"),
                         scenario="leak_late",
                         description=f"TTL-bounded state ({ttl_s}s) until a change at {onset_s}s keeps every key")


def leak_fixed(fix_s=300, backend="hashmap", p=1, rate=150, payload=100, extra_s=900, duration_s=None):
    """Every key kept from the start; from ``fix_s`` the operator stores no new keys (the fix), so
    the state stays flat. The leak's ground truth ends there (``end_ts``)."""
    return LabVariant(_id("leak_fixed", f"fix{fix_s}", backend, f"p{p}", f"r{rate}", f"b{payload}"), "leak_fixed",
                      f"every record a new key, never cleared, until a fix at {fix_s}s stops storing new keys",
                      _args(ttl_s=0, parallelism=p, rate=rate, payload_bytes=payload, **_backend(backend)),
                      (LabFault(STATE_LEAK, "keyed-state", end_s=float(fix_s)),), duration_s=duration_s or fix_s + extra_s,
                      at_args=(("reject-new-keys-onset-ms", float(fix_s)),))


# --- build-up until checkpoints fail, and its healthy twins (issue 58) ---------------------------------

def leak_to_timeout(rate=300, payload=3000, timeout_ms=3000, interval_ms=10000, p=1, duration_s=720):
    """Heap state, full snapshots, every record a new key with a large payload, a tight checkpoint
    timeout: each snapshot takes longer as the state grows, until checkpoints expire. The first
    checkpoint waits for the pause between checkpoints (the interval), so the tight timeout does
    not fail the first checkpoints while the Python workers warm up."""
    return LabVariant(_id("leak_to_timeout", f"r{rate}", f"b{payload}", f"to{timeout_ms}", f"i{interval_ms}", f"p{p}"),
                      "leak_to_timeout", f"{rate * payload / 1e6:.1f} MB/s of new keys into heap state under a "
                      f"{timeout_ms / 1000:g}s checkpoint timeout: snapshots grow until checkpoints expire",
                      _args(ttl_s=0, parallelism=p, rate=rate, payload_bytes=payload, checkpoint_interval_ms=interval_ms,
                            checkpoint_timeout_ms=timeout_ms, checkpoint_min_pause_ms=interval_ms, **_backend("hashmap")),
                      (LabFault(STATE_LEAK, "keyed-state"), LabFault(CHECKPOINT_FAILURE, None, at_first_failure=True)),
                      duration_s=duration_s, expect_failures=True)


def leak_to_limit(rate=120, payload=100, p=1, interval_ms=3000, duration_s=None):
    """Every record a new key into the JobManager's checkpoint storage: past its 5 MiB limit every
    checkpoint fails. About 140 bytes of checkpointed state a record: the limit is reached after
    about 5 MiB / (140 rate) seconds, and the run lasts that and four minutes."""
    build_up = 5 * 2**20 / (rate * (payload + 40))
    duration_s = duration_s or int(round(build_up + 240, -1))
    variant = leak_start("hashmap", "jobmanager", p, rate, payload, interval_ms, duration_s)
    return variant.with_(run_id=_id("leak_to_limit", f"r{rate}", f"b{payload}", f"p{p}", f"i{interval_ms}"),
                         scenario="leak_to_limit", expect_failures=True,
                         description=f"every record a new key into JobManager checkpoint storage: its 5 MiB limit "
                                     f"after about {build_up / 60:.0f} min, then every checkpoint fails")


def backpressure_deepening(rate=200, start=1.5, end=0.2, onset_s=60, ramp_s=480, timeout_ms=20000, p=1,
                           duration_s=None):
    """From ``onset_s``, enrich's capacity falls linearly from ``start`` times the input rate to
    ``end`` times it over ``ramp_s``: backpressure begins where it crosses the input rate and
    deepens, alignment and start delay grow until checkpoints expire at the timeout."""
    duration_s = duration_s or onset_s + ramp_s + 120
    return LabVariant(_id("backpressure_deepening", f"c{start}-{end}", f"ramp{ramp_s}", f"to{timeout_ms}", f"p{p}",
                          f"r{rate}"), "backpressure_deepening",
                      f"enrich's capacity falls from {start * rate:.0f} to {end * rate:.0f} records/s (input {rate}) "
                      f"over {ramp_s}s, under a {timeout_ms / 1000:g}s checkpoint timeout",
                      _args(ttl_s=30, slow_start_records_per_s=start * rate / p, slow_records_per_s=end * rate / p,
                            slow_ramp_s=ramp_s, checkpoint_timeout_ms=timeout_ms, parallelism=p, rate=rate),
                      (LabFault(BACKPRESSURE, "enrich"), LabFault(CHECKPOINT_FAILURE, None, at_first_failure=True)),
                      onset_s, ("slow-onset-ms",), duration_s, expect_failures=True)


def healthy_large_state(keys=30000, rate=300, payload=3000, timeout_ms=6000, interval_ms=10000, p=1,
                        duration_s=None):
    """The healthy twin of :func:`leak_to_timeout`: a bounded key space with a large payload that
    fills within minutes and levels off, its full snapshots taking much of a checkpoint timeout
    that they stay under."""
    tau = keys / rate
    duration_s = duration_s or int(round(3 * tau + 420, -1))
    return LabVariant(_id("healthy_large_state", f"k{keys}", f"b{payload}", f"to{timeout_ms}", f"p{p}", f"r{rate}"),
                      "healthy_large_state", f"{keys:,} keys of {payload} bytes (about {keys * payload / 1e6:.0f} MB) "
                      f"filled with a {tau:.0f}s time constant, under a {timeout_ms / 1000:g}s checkpoint timeout",
                      _args(ttl_s=0, key_space=keys, parallelism=p, rate=rate, payload_bytes=payload,
                            checkpoint_interval_ms=interval_ms, checkpoint_timeout_ms=timeout_ms,
                            checkpoint_min_pause_ms=interval_ms, **_backend("hashmap")),
                      duration_s=duration_s, expect_failures=False)


# --- backpressure ------------------------------------------------------------------------------------

def backpressure(severity="severe", unaligned=False, p=1, rate=200, onset_s=75, duration_s=300, period_s=60, slow_s=20):
    """``severe``: enrich handles a quarter of the input; ``mild``: 70 %; ``intermittent``: a
    quarter for ``slow_s`` of every ``period_s`` seconds (of wall-clock time)."""
    capacity = {"severe": 0.25, "mild": 0.7, "intermittent": 0.25}[severity] * rate * p
    intermittent = {"slow_period_s": period_s, "slow_on_s": slow_s} if severity == "intermittent" else {}
    episodes = f"per{period_s}-on{slow_s}" if intermittent and (period_s, slow_s) != (60, 20) else ""
    faults = (LabFault(BACKPRESSURE, "enrich"), LabFault(CHECKPOINT_FAILURE, None, at_first_failure=True))
    return LabVariant(_id("backpressure", severity, episodes, "unaligned" if unaligned else "aligned", f"p{p}", f"r{rate}"),
                      "backpressure", f"{severity} backpressure: enrich slows to {capacity:.0f} records/s under {rate * p}"
                      + (f" for {slow_s}s of every {period_s}s" if intermittent else ""),
                      _args(ttl_s=30, slow_records_per_s=capacity / p, unaligned=str(unaligned).lower(), parallelism=p,
                            rate=rate * p, **intermittent),
                      faults, onset_s, ("slow-onset-ms",), duration_s)


# --- skew --------------------------------------------------------------------------------------------

def skew(p=2, share=0.85, with_backpressure=False, rate=150, onset_s=75, duration_s=300, ramp_s=0):
    """``ramp_s``: the hot key's share rises linearly from nothing at the onset to ``share``
    (skew that drifts in); the onset labelled is where it starts rising."""
    faults = [LabFault(SKEW, "keyed-state", hot_subtask=True)]
    cost = 0.0
    if with_backpressure:
        # Each record costs enough that the hot subtask cannot keep up once it gets most of them.
        cost = round(1.3 * 1000.0 / (share * rate), 2)
        faults += [LabFault(BACKPRESSURE, "keyed-state"), LabFault(CHECKPOINT_FAILURE, None, at_first_failure=True)]
    ramp = {"hot_ramp_s": ramp_s} if ramp_s else {}
    return LabVariant(_id("skew", f"p{p}", f"s{share}", "bp" if with_backpressure else "nobp", f"r{rate}",
                          f"ramp{ramp_s}" if ramp_s else ""), "skew",
                      f"{share:.0%} of the records carry one key" + (f", reached over {ramp_s}s" if ramp_s else "")
                      + (", and the hot subtask saturates" if with_backpressure else ""),
                      _args(ttl_s=30, hot_share=share, keyed_cost_ms=cost, parallelism=p, rate=rate, **ramp),
                      tuple(faults), onset_s, ("hot-onset-ms",), duration_s)


# --- checkpoint failures -----------------------------------------------------------------------------

def checkpoint_timeout(timeout_ms=5000, p=1, rate=200, onset_s=75, duration_s=300):
    return LabVariant(_id("checkpoint_timeout", f"to{timeout_ms}", f"p{p}", f"r{rate}"), "checkpoint_timeout",
                      f"enrich nearly stops under a {timeout_ms / 1000:g}s checkpoint timeout: checkpoints expire",
                      _args(ttl_s=30, slow_records_per_s=10, checkpoint_timeout_ms=timeout_ms, parallelism=p, rate=rate),
                      (LabFault(CHECKPOINT_FAILURE, None), LabFault(BACKPRESSURE, "enrich")),
                      onset_s, ("slow-onset-ms",), duration_s)


def restart_loop(fail_after_s=30, p=1, rate=150, onset_s=75, duration_s=300):
    return LabVariant(_id("restart_loop", f"f{fail_after_s}", f"p{p}", f"r{rate}"), "restart_loop",
                      f"enrich fails {fail_after_s}s after every (re)start: the job restarts in a loop",
                      _args(ttl_s=30, fail_after_s=fail_after_s, parallelism=p, rate=rate),
                      (LabFault(CHECKPOINT_FAILURE, None),), onset_s, ("fail-onset-ms",), duration_s)


def storage_outage(period_s=40, down_s=25, p=1, rate=150, backend="hashmap", onset_s=75, duration_s=300):
    return LabVariant(_id("storage_outage", f"per{period_s}", f"down{down_s}", backend, f"p{p}", f"r{rate}"),
                      "storage_outage", f"the checkpoint storage refuses writes for {down_s}s of every {period_s}s",
                      _args(ttl_s=30, parallelism=p, rate=rate, **_backend(backend)),
                      (LabFault(CHECKPOINT_FAILURE, None),), onset_s, (), duration_s, storage_outage=(period_s, down_s))


# --- SQL / Table API jobs (flink_jobs/sql_job.py) ------------------------------------------------------

def _sql(run_id: str, scenario: str, description: str, query: str, faults=(), onset_s=0.0, onset_args=(),
         duration_s=300, **args) -> LabVariant:
    return LabVariant(run_id, scenario, description, {"query": query, **_args(**args)}, tuple(faults), onset_s,
                      onset_args, duration_s, kind=SQL, script="sql_job.py")


def sql_window(window_s=30, p=1, rate=150, backend="hashmap", duration_s=300):
    return _sql(_id("sql_window", f"w{window_s}", backend, f"p{p}", f"r{rate}"), "sql_window",
                f"SQL: a {window_s}s tumbling window aggregation (TUMBLE, GROUP BY): state fills and empties",
                "window", duration_s=duration_s, window_s=window_s, parallelism=p, rate=rate, **_backend(backend))


def sql_join_leak(p=1, rate=100, backend="hashmap", duration_s=300):
    return _sql(_id("sql_join_leak", backend, f"p{p}", f"r{rate}"), "sql_join_leak",
                "SQL: a regular join of two streams without state TTL: both sides keep every row",
                "join", (LabFault(STATE_LEAK, None, vertex_pattern=r"\bJoin\b"),), duration_s=duration_s,
                parallelism=p, rate=rate, **_backend(backend))


def sql_dedup_ttl(ttl_s=90, p=1, rate=150, backend="hashmap", duration_s=300):
    return _sql(_id("sql_dedup_ttl", f"ttl{ttl_s}", backend, f"p{p}", f"r{rate}"), "sql_dedup_ttl",
                f"SQL: first row per key (ROW_NUMBER) with a {ttl_s}s state TTL: state grows for {ttl_s}s, then stays flat",
                "dedup", duration_s=duration_s, ttl_s=ttl_s, parallelism=p, rate=rate, **_backend(backend))


def sql_skew(p=3, share=0.85, rate=200, onset_s=75, duration_s=300):
    return _sql(_id("sql_skew", f"p{p}", f"s{share}", f"r{rate}"), "sql_skew",
                f"SQL: a GROUP BY where {share:.0%} of the records carry one key",
                "skew", (LabFault(SKEW, None, hot_subtask=True, vertex_pattern=r"\bGroupAggregate\b"),), onset_s,
                ("hot-onset-ms",), duration_s, hot_share=share, parallelism=p, rate=rate)


def sql_slow_udf(p=2, capacity=0.25, rate=200, onset_s=75, duration_s=300):
    return _sql(_id("sql_slow_udf", f"c{capacity}", f"p{p}", f"r{rate}"), "sql_slow_udf",
                f"SQL: a Python UDF slows to {capacity:.0%} of the input ({capacity * rate:.0f} records/s under {rate})",
                "slow_udf", (LabFault(BACKPRESSURE, None, vertex_pattern=r"\bPythonCalc\b"),
                             LabFault(CHECKPOINT_FAILURE, None, at_first_failure=True)), onset_s, ("slow-onset-ms",),
                duration_s, slow_records_per_s=round(capacity * rate / p, 2), parallelism=p, rate=rate)


def sql_bounded_keys(keys=20000, p=1, rate=200, backend="hashmap", plateau_s=420, duration_s=None):
    """SQL: a GROUP BY over a bounded key space (keys drawn uniformly), no TTL: fills and levels off."""
    tau = keys / rate
    duration_s = duration_s or int(round(3 * tau + plateau_s, -1))
    return _sql(_id("sql_bounded_keys", f"k{keys}", backend, f"p{p}", f"r{rate}"), "sql_bounded_keys",
                f"SQL: GROUP BY over {keys:,} keys drawn uniformly, no TTL: state fills with a {tau:.0f}s time "
                "constant and levels off", "bounded_agg", duration_s=duration_s, keys=keys, payload_bytes=40,
                parallelism=p, rate=rate, **_backend(backend))


def sql_cep_leak(p=1, rate=150, backend="hashmap", duration_s=420):
    return _sql(_id("sql_cep_leak", backend, f"p{p}", f"r{rate}"), "sql_cep_leak",
                "SQL: MATCH_RECOGNIZE (A B per key) without WITHIN over keys that never repeat: every partial "
                "match waits forever", "cep", (LabFault(STATE_LEAK, None, vertex_pattern=r"\bMatch\b"),),
                duration_s=duration_s, keys=0, parallelism=p, rate=rate, **_backend(backend))


def sql_cep_bounded(keys=5000, within_s=30, p=1, rate=150, backend="hashmap", duration_s=420):
    return _sql(_id("sql_cep_bounded", f"k{keys}", f"w{within_s}", backend, f"p{p}", f"r{rate}"), "sql_cep_bounded",
                f"SQL: MATCH_RECOGNIZE (A B per key) WITHIN {within_s}s over {keys:,} keys: partial matches "
                "stay bounded", "cep", duration_s=duration_s, keys=keys, within_s=within_s, parallelism=p, rate=rate,
                **_backend(backend))


def sql_join_ttl(ttl_s=60, p=1, rate=100, backend="hashmap", duration_s=420):
    return _sql(_id("sql_join_ttl", f"ttl{ttl_s}", backend, f"p{p}", f"r{rate}"), "sql_join_ttl",
                f"SQL: the regular join of sql_join_leak with table.exec.state.ttl {ttl_s}s: rows expire, state "
                "levels off", "join", duration_s=duration_s, ttl_s=ttl_s, parallelism=p, rate=rate,
                **_backend(backend))


BUILDERS = {b.__name__: b for b in (healthy_ttl, healthy_window, healthy_timer, healthy_bursty, healthy_subsecond,
                                    leak_start, leak_after_plateau, leak_slow_on_ttl, leak_one_of_two, backpressure,
                                    skew, checkpoint_timeout, restart_loop, storage_outage, sql_window, sql_join_leak,
                                    sql_dedup_ttl, sql_skew, sql_slow_udf, bounded_keys, ttl_horizon, leak_late,
                                    leak_fixed, leak_to_timeout, leak_to_limit, backpressure_deepening,
                                    healthy_large_state, sql_bounded_keys, sql_cep_leak, sql_cep_bounded,
                                    sql_join_ttl)}


@dataclass(frozen=True)
class NamedScenario:
    """A variant ``sentinel lab NAME`` runs on its own, scaled to the duration asked for."""

    name: str
    build: object
    params: dict = field(default_factory=dict)
    onset_fraction: float | None = None  # of the duration; None: the builder's own onset

    def variant(self, duration_s: int) -> LabVariant:
        params = dict(self.params, duration_s=duration_s)
        if self.onset_fraction is not None:
            params["onset_s"] = round(self.onset_fraction * duration_s)
        return self.build(**params).with_(run_id=self.name)


NAMED: dict[str, NamedScenario] = {s.name: s for s in (
    NamedScenario("leak", leak_start, {"storage": "jobmanager", "rate": 100}),
    NamedScenario("leak_no_limit", leak_start, {"rate": 150}),
    NamedScenario("leak_after_plateau", leak_after_plateau, {}, 0.35),
    NamedScenario("leak_slow_on_ttl", leak_slow_on_ttl, {}, 0.3),
    NamedScenario("leak_one_of_two", leak_one_of_two, {}),
    NamedScenario("leak_rocksdb_incremental", leak_start, {"backend": "rocksdb_inc"}),
    NamedScenario("healthy_ttl", healthy_ttl, {"ttl_s": 20}),
    NamedScenario("warmup", healthy_ttl, {"ttl_s": 120}),
    NamedScenario("healthy_window", healthy_window, {}),
    NamedScenario("healthy_timer", healthy_timer, {}),
    NamedScenario("healthy_bursty", healthy_bursty, {}),
    NamedScenario("healthy_subsecond", healthy_subsecond, {}),
    NamedScenario("backpressure", backpressure, {"rate": 400}, 0.25),
    NamedScenario("backpressure_mild", backpressure, {"severity": "mild"}, 0.25),
    NamedScenario("backpressure_intermittent", backpressure, {"severity": "intermittent"}, 0.25),
    NamedScenario("backpressure_unaligned", backpressure, {"unaligned": True}, 0.25),
    NamedScenario("skew", skew, {"rate": 300, "share": 0.9}, 0.25),
    NamedScenario("skew_backpressure", skew, {"with_backpressure": True, "p": 3}, 0.25),
    NamedScenario("checkpoint_timeout", checkpoint_timeout, {"rate": 300}, 0.25),
    NamedScenario("restart_loop", restart_loop, {}, 0.25),
    NamedScenario("storage_outage", storage_outage, {}, 0.25),
    NamedScenario("sql_window", sql_window, {}),
    NamedScenario("sql_join_leak", sql_join_leak, {}),
    NamedScenario("sql_dedup_ttl", sql_dedup_ttl, {"ttl_s": 60}),
    NamedScenario("sql_skew", sql_skew, {}, 0.25),
    NamedScenario("sql_slow_udf", sql_slow_udf, {}, 0.25),
    NamedScenario("bounded_keys", bounded_keys, {"keys": 12000, "rate": 200}),
    NamedScenario("leak_fixed", leak_fixed, {"fix_s": 120, "extra_s": 120}),
    NamedScenario("leak_to_timeout", leak_to_timeout, {}),
    NamedScenario("leak_to_limit", leak_to_limit, {"rate": 200}),
    NamedScenario("backpressure_deepening", backpressure_deepening, {"ramp_s": 240}),
    NamedScenario("sql_cep_leak", sql_cep_leak, {}),
    NamedScenario("sql_cep_bounded", sql_cep_bounded, {}),
    NamedScenario("sql_join_ttl", sql_join_ttl, {}),
)}
