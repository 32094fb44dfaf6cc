"""Every feature, declared once: name, type, unit, family, level, window and meaning.

The training code, the streaming job and the docs read :data:`FEATURES`; the computation in
``feature_store/job_features.py`` must produce exactly these names (a test holds it to that).
Features are emitted per evaluation point: at each checkpoint and each job-status poll of a job,
one **job** row (``vertex_id`` null) and one **vertex** row per known vertex. Job rows carry the
job features (vertex features null); vertex rows carry their vertex features and, as context,
the job features of the same moment.
Every feature is nullable: null means "not known" (a metric Flink did not report, too little
history), never zero; the ``*_reported`` indicators say which raw signals were present.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

from feature_store.trajectory import (FORECAST_MIN_POINTS, FORECAST_WINDOW_MS, GROWTH_MIN_POINTS, GROWTH_WINDOW_MS,
                                      OPENING_MIN_POINTS, RECENT_MIN_POINTS, RECENT_MIN_SPAN_MS, TRAJECTORY_POINTS,
                                      WINDOW_POINTS)
from pipelines.families.base import BARRIER_METRIC, TIMEOUT_FORECASTS, TIMEOUT_METRIC

SHORT_WINDOW_CHECKPOINTS = 12
HEAP_POLLS = 20
LONG_WINDOW_MS = 90 * 60_000
METRIC_POLLS_AVERAGED = 4
# A vertex's usual input rate: the median of its input rates over this window, one every spacing.
INPUT_RATE_WINDOW_MS = 10 * 60_000
INPUT_RATE_SPACING_MS = 10_000
INPUT_RATE_MIN_SPAN_MS = 2 * 60_000
RESTART_WINDOW_MS = 30 * 60_000
FAILURE_COUNT_WINDOW_MS = 2 * 60_000
# A plateau: at least FLAT_MIN_POINTS completed checkpoints over FLAT_MIN_SPAN_MS whose fitted
# trend moves the state by at most FLAT_MAX_GROWTH of its mean, all within FLAT_MAX_SPREAD of it
# (TTL-bounded state jitters with the input rate; RocksDB's sizes by +-10 % with flushes).
FLAT_MIN_POINTS = 5
FLAT_MIN_SPAN_MS = 30_000
FLAT_MAX_GROWTH = 0.05
FLAT_MAX_SPREAD = 0.3

FAMILIES = ("state_leak", "backpressure", "skew", "checkpoint_failure", "context")


@dataclass(frozen=True)
class Feature:
    name: str
    family: str
    level: str  # "job" or "vertex"
    unit: str
    window: str
    description: str
    dtype: str = "double"


_SHORT = f"last {SHORT_WINDOW_CHECKPOINTS} completed checkpoints"
_SHORT_ANY = f"last {SHORT_WINDOW_CHECKPOINTS} checkpoints"  # completed or failed
_LONG = f"completed checkpoints of the last {LONG_WINDOW_MS // 60_000} min"


def _growth_window(min_points: int) -> str:
    return (f"completed checkpoints of the last {GROWTH_WINDOW_MS // 1000} s (at least {min_points}), "
            f"thinned to {WINDOW_POINTS}")


_GROWTH, _OPENING = _growth_window(GROWTH_MIN_POINTS), _growth_window(OPENING_MIN_POINTS)
_RECENT = (f"the growth window, after its last change of pace (at least {RECENT_MIN_SPAN_MS // 1000} s and "
           f"{RECENT_MIN_POINTS} checkpoints)")
_FORECAST = (f"completed checkpoints of the last {FORECAST_WINDOW_MS // 60_000} min (at least "
             f"{FORECAST_MIN_POINTS})")
_HISTORY = f"since first seen (up to {LONG_WINDOW_MS // 60_000} min), thinned to {TRAJECTORY_POINTS}"
_POLLS = f"mean of the last {METRIC_POLLS_AVERAGED} metric polls (each a Flink 1-min average)"


# A forecast against the checkpoint timeout, as features (feature_store/failure_forecast.py's
# ``failure_eta``): the columns the families read it from.
TIMEOUT_FORECAST_COLUMNS = TIMEOUT_FORECASTS[TIMEOUT_METRIC]
BARRIER_WAIT_FORECAST_COLUMNS = TIMEOUT_FORECASTS[BARRIER_METRIC]


def _timeout_forecast_features(columns: tuple[str, str, str, str], family: str, level: str, window: str,
                               subject: str) -> tuple[Feature, ...]:
    eta, low, high, over = columns
    return (
        Feature(eta, family, level, "s", window,
                f"seconds until {subject} reaches the checkpoint timeout on its least-squares trend since its last "
                "change of pace (0: at it; null: no rising trend or no timeout known)"),
        Feature(low, family, level, "s", window, "the earliest of that forecast's 95 % band (the trend's steepest slope)"),
        Feature(high, family, level, "s", window,
                "the latest of that band (the flattest slope; null where the trend may not rise at all)"),
        Feature(over, family, level, "s", window, "the span of checkpoints that forecast is fitted over"),
    )


def _growth_features(prefix: str, level: str, subject: str) -> tuple[Feature, ...]:
    """The growth test's and the growth shape's features of the job's full state or a vertex's."""
    return (
        Feature(f"{prefix}growth_low_per_h", "state_leak", level, "1/h", _GROWTH,
                f"lower 95 % bound of the relative slope of {subject} (error widened for autocorrelated residuals)"),
        Feature(f"{prefix}growth_high_per_h", "state_leak", level, "1/h", _GROWTH, "upper 95 % bound of that slope"),
        Feature(f"{prefix}growth_opening_low_per_h", "state_leak", level, "1/h", _OPENING,
                f"lower 99.9 % bound of the relative slope of {subject}: the bound a leak opens on"),
        Feature(f"{prefix}recent_growth_low_per_h", "state_leak", level, "1/h", _RECENT,
                f"lower 95 % bound of the relative slope of {subject} since its last change of pace: above 0 while "
                "it still grows"),
        Feature(f"{prefix}filling", "state_leak", level, "0/1", _HISTORY,
                f"1 if {subject} decelerates toward an asymptote (a saturating curve explains its history, with no "
                "linear growth beside it, and its growth now is the curve's); null with too short a history"),
        Feature(f"{prefix}plateau_bytes", "state_leak", level, "bytes", _HISTORY,
                f"where {subject} levels off, when it is filling (null otherwise)"),
        Feature(f"{prefix}plateau_eta_s", "state_leak", level, "s", _HISTORY,
                f"seconds until {subject} is within 1 % of its plateau, when it is filling"),
    )


FEATURES: tuple[Feature, ...] = (
    # --- context ---------------------------------------------------------------------------------
    Feature("job_age_checkpoints", "context", "job", "checkpoints", "since first seen",
            "checkpoints seen since the job appeared (young jobs are still warming up)"),
    Feature("checkpoint_interval_ms", "context", "job", "ms", "latest", "configured checkpoint interval"),
    Feature("job_age_s", "context", "job", "s", "since the job (re)started",
            "time since the job's latest restart, else since it started: first seen, or earlier when its first "
            "checkpoint id says it ran before (ids start at 1)"),
    # --- state leak, job level -------------------------------------------------------------------
    Feature("state_size_bytes", "state_leak", "job", "bytes", "latest", "full state of the latest completed checkpoint"),
    Feature("state_rel_slope_per_h", "state_leak", "job", "1/h", _SHORT,
            "least-squares slope of full state size divided by its mean"),
    Feature("state_r2", "state_leak", "job", "ratio", _SHORT, "R^2 of the linear fit of full state size"),
    Feature("state_frac_increasing", "state_leak", "job", "ratio", _SHORT, "fraction of checkpoint-to-checkpoint steps that grew"),
    Feature("state_rel_slope_long_per_h", "state_leak", "job", "1/h", _LONG, "relative slope of full state over the long horizon"),
    Feature("state_r2_long", "state_leak", "job", "ratio", _LONG, "R^2 of full state over the long horizon"),
    Feature("state_deceleration", "state_leak", "job", "ratio", _LONG,
            "slope of the later half over slope of the earlier half: ~1 for a leak, ~0 for a warm-up levelling off"),
    Feature("state_over_prior_max", "state_leak", "job", "ratio", "since first seen",
            "full state over the largest full state before the short window: above 1 only while state makes new highs"),
    Feature("state_over_plateau", "state_leak", "job", "ratio", "since first seen",
            f"full state over the highest plateau it held (>= {FLAT_MIN_POINTS} checkpoints over >= "
            f"{FLAT_MIN_SPAN_MS // 1000} s trending by at most {FLAT_MAX_GROWTH:.0%}); null before any: above 1, growth "
            "resumed after a plateau, which is not warm-up"),
    *_growth_features("state_", "job", "full state"),
    Feature("checkpointed_rel_slope_per_h", "state_leak", "job", "1/h", _SHORT,
            "relative slope of the persisted (checkpointed) size; flat under incremental checkpoints"),
    Feature("state_growth_bytes_per_record", "state_leak", "job", "bytes/record", _SHORT,
            "state growth rate over the sources' output rate"),
    Feature("limit_ratio", "state_leak", "job", "ratio", "latest",
            "largest subtask state over max_state_size_bytes (null: no known limit)"),
    Feature("state_limit_bytes", "state_leak", "job", "bytes", "latest",
            "the job's own state limit, max_state_size_bytes (null: none known)"),
    Feature("limit_eta_s", "state_leak", "job", "s", _SHORT,
            "time until the largest subtask state reaches the limit at its current slope (null: not growing or no limit)"),
    Feature("limit_eta_low_s", "state_leak", "job", "s", _SHORT,
            "the earliest of that forecast's 95 % band (the line's steepest slope, errors widened for "
            "autocorrelated residuals)"),
    Feature("limit_eta_high_s", "state_leak", "job", "s", _SHORT,
            "the latest of that band (the flattest slope; null where the line may not rise at all)"),
    Feature("limit_fitted_over_s", "state_leak", "job", "s", _SHORT,
            "the span of checkpoints that forecast is fitted over"),
    # --- checkpoint health -----------------------------------------------------------------------
    Feature("checkpoint_failed_fraction", "checkpoint_failure", "job", "ratio", _SHORT_ANY, "share of FAILED checkpoints"),
    Feature("checkpoint_consecutive_failures", "checkpoint_failure", "job", "checkpoints", "latest", "FAILED checkpoints in a row"),
    Feature("checkpoint_duration_over_interval", "checkpoint_failure", "job", "ratio", "latest",
            "end-to-end duration of the latest checkpoint over the interval"),
    Feature("checkpoint_duration_over_timeout", "checkpoint_failure", "job", "ratio", "latest",
            "end-to-end duration of the latest checkpoint over the timeout"),
    Feature("checkpoint_duration_rel_slope_per_h", "checkpoint_failure", "job", "1/h", _SHORT_ANY,
            "relative slope of end-to-end checkpoint duration"),
    Feature("checkpoints_in_progress", "checkpoint_failure", "job", "checkpoints", "latest poll", "checkpoints in flight"),
    Feature("restarts_in_window", "checkpoint_failure", "job", "restarts", f"last {RESTART_WINDOW_MS // 60_000} min",
            "job restarts"),
    Feature("checkpoint_failures_counted", "checkpoint_failure", "job", "checkpoints",
            f"last {FAILURE_COUNT_WINDOW_MS // 60_000} min",
            "increase of Flink's failed-checkpoint counter: also failures that never reach the checkpoint history, "
            "less the triggers a run's starting tasks decline (before its first checkpoint in the history)"),
    Feature("jm_heap_ratio", "checkpoint_failure", "job", "ratio", "latest poll", "JobManager heap used over max"),
    Feature("jm_heap_rel_slope_per_h", "checkpoint_failure", "job", "1/h", f"last {HEAP_POLLS} polls", "relative slope of JobManager heap"),
    Feature("checkpoint_timeout_ms", "context", "job", "ms", "latest", "configured checkpoint timeout"),
    *_timeout_forecast_features(TIMEOUT_FORECAST_COLUMNS, "checkpoint_failure", "job", _FORECAST,
                                "completed checkpoints' end-to-end duration"),
    Feature("persisted_inflight_rel_slope_per_h", "backpressure", "job", "1/h", _SHORT_ANY,
            "relative slope of in-flight data persisted by unaligned checkpoints"),
    Feature("persisted_inflight_bytes", "backpressure", "job", "bytes", "latest", "in-flight data persisted by the latest checkpoint"),
    # --- state leak, vertex level ----------------------------------------------------------------
    Feature("vertex_state_size_bytes", "state_leak", "vertex", "bytes", "latest", "full state of the vertex at the latest completed checkpoint"),
    Feature("vertex_state_rel_slope_per_h", "state_leak", "vertex", "1/h", _SHORT, "relative slope of the vertex's full state"),
    Feature("vertex_state_r2", "state_leak", "vertex", "ratio", _SHORT, "R^2 of the vertex's full state"),
    Feature("vertex_state_rel_slope_long_per_h", "state_leak", "vertex", "1/h", _LONG, "relative slope of the vertex's state, long horizon"),
    Feature("vertex_state_r2_long", "state_leak", "vertex", "ratio", _LONG, "R^2 of the vertex's state, long horizon"),
    Feature("vertex_state_deceleration", "state_leak", "vertex", "ratio", _LONG, "later-half over earlier-half slope of the vertex's state"),
    *_growth_features("vertex_state_", "vertex", "the vertex's state"),
    Feature("vertex_limit_ratio", "state_leak", "vertex", "ratio", "latest", "largest subtask state of the vertex over the limit"),
    Feature("vertex_state_over_prior_max", "state_leak", "vertex", "ratio", "since first seen",
            "the vertex's state over its largest state before the short window"),
    Feature("vertex_state_over_plateau", "state_leak", "vertex", "ratio", "since first seen",
            "the vertex's state over the highest plateau it held (null before any)"),
    # --- backpressure, vertex level --------------------------------------------------------------
    Feature("busy_max", "backpressure", "vertex", "ratio", _POLLS, "busiest subtask's busy time over 1000 ms/s"),
    Feature("busy_mean", "backpressure", "vertex", "ratio", _POLLS, "mean subtask busy time over 1000 ms/s"),
    Feature("backpressured_max", "backpressure", "vertex", "ratio", _POLLS, "most backpressured subtask, over 1000 ms/s"),
    Feature("backpressured_mean", "backpressure", "vertex", "ratio", _POLLS, "mean backpressured time over 1000 ms/s"),
    Feature("idle_mean", "backpressure", "vertex", "ratio", _POLLS, "mean idle time over 1000 ms/s"),
    Feature("downstream_of_backpressure", "backpressure", "vertex", "ratio", _POLLS,
            "busy_max of this vertex times the largest backpressured_mean among the job's other vertices: high for the bottleneck"),
    Feature("is_busiest_vertex", "backpressure", "vertex", "0/1", _POLLS, "1 if this vertex has the job's highest busy_max"),
    Feature("others_backpressured_max", "backpressure", "vertex", "ratio", _POLLS,
            "the most backpressured subtask of the job's other vertices: a bottleneck makes its upstream wait"),
    Feature("records_in_over_usual", "backpressure", "vertex", "ratio",
            f"{_POLLS}, over the median of the last {INPUT_RATE_WINDOW_MS // 60_000} min (null before "
            f"{INPUT_RATE_MIN_SPAN_MS // 60_000} min)",
            "the vertex's input rate (all subtasks) over its usual: below 1 when it slowed down, above 1 when "
            "more load came in (a surge it is working through is not a slowdown)"),
    Feature("in_pool_max", "backpressure", "vertex", "ratio", _POLLS, "highest input buffer pool usage"),
    Feature("out_pool_max", "backpressure", "vertex", "ratio", _POLLS, "highest output buffer pool usage"),
    Feature("start_delay_max_ms", "backpressure", "vertex", "ms", "latest completed or failed checkpoint",
            "largest barrier start delay among the vertex's subtasks (a subtask that never acknowledged a failed "
            "checkpoint: at least that checkpoint's duration)"),
    Feature("alignment_max_ms", "backpressure", "vertex", "ms", "latest completed or failed checkpoint",
            "largest alignment duration among the vertex's subtasks"),
    Feature("start_delay_rel_slope_per_h", "backpressure", "vertex", "1/h", _SHORT_ANY, "relative slope of the largest start delay"),
    Feature("alignment_rel_slope_per_h", "backpressure", "vertex", "1/h", _SHORT_ANY,
            "relative slope of the largest alignment duration"),
    *_timeout_forecast_features(BARRIER_WAIT_FORECAST_COLUMNS, "backpressure", "vertex", _SHORT_ANY,
                                "the vertex's barrier wait (its largest start delay plus its largest alignment, per "
                                "checkpoint)"),
    # --- skew, vertex level ----------------------------------------------------------------------
    Feature("records_in_max_over_mean", "skew", "vertex", "ratio", _POLLS, "busiest subtask's input rate over the mean"),
    Feature("records_in_cv", "skew", "vertex", "ratio", _POLLS, "coefficient of variation of subtask input rates"),
    Feature("state_max_over_mean", "skew", "vertex", "ratio", "latest completed checkpoint", "largest subtask state over the mean"),
    Feature("state_cv", "skew", "vertex", "ratio", "latest completed checkpoint", "coefficient of variation of subtask state"),
    Feature("records_in_hot_excess", "skew", "vertex", "ratio", _POLLS,
            "the busiest subtask's share of the input beyond 1/parallelism, scaled to [0, 1] (same reading at any "
            "parallelism)"),
    Feature("state_hot_excess", "skew", "vertex", "ratio", "latest completed checkpoint",
            "the largest subtask's share of the state beyond 1/parallelism, scaled to [0, 1]"),
    Feature("start_delay_max_over_median", "skew", "vertex", "ratio", "latest checkpoint",
            "largest subtask start delay over the median (barrier alignment waiting on one subtask)"),
    Feature("hot_subtask", "skew", "vertex", "index", "latest",
            "index of the subtask with the largest input rate (or state, when records are balanced)"),
    # --- missing-value indicators ----------------------------------------------------------------
    Feature("busy_reported", "context", "vertex", "0/1", "latest poll", "1 if Flink reported busy time for this vertex (sources often report NaN)"),
    Feature("state_reported", "context", "vertex", "0/1", "latest checkpoint", "1 if the latest checkpoint had per-subtask state for this vertex"),
    Feature("limit_known", "context", "job", "0/1", "latest poll", "1 if the job reports max_state_size_bytes"),
    Feature("busiest_input_over_usual", "context", "job", "ratio", "latest poll",
            "records_in_over_usual of the job's busiest vertex (highest busy_max): above 1 while the job works "
            "through more load than usual"),
)

FEATURE_NAMES = tuple(f.name for f in FEATURES)
JOB_FEATURES = tuple(f.name for f in FEATURES if f.level == "job")
VERTEX_FEATURES = tuple(f.name for f in FEATURES if f.level == "vertex")

KEY_COLUMNS = ("cluster", "job_id", "vertex_id")
ROW_COLUMNS: tuple[tuple[str, object], ...] = (
    ("cluster", StringType()), ("job_id", StringType()), ("job_name", StringType()),
    ("vertex_id", StringType()), ("vertex_name", StringType()), ("ts", LongType()), ("trigger_kind", StringType()),
    ("is_late", BooleanType()),
    # Context for incidents, not features: the job's latest reported status and failure message.
    ("job_state", StringType()), ("last_failure_message", StringType()),
)


def feature_row_schema() -> StructType:
    """The schema of a feature row: keys, event time, the evaluation's trigger, then every feature."""
    return StructType([StructField(name, dtype, True) for name, dtype in ROW_COLUMNS]
                      + [StructField(f.name, DoubleType(), True) for f in FEATURES])


def features_of(family: str, level: str | None = None) -> tuple[str, ...]:
    return tuple(f.name for f in FEATURES if f.family == family and (level is None or f.level == level))


def markdown_table() -> str:
    """The feature reference for the docs, generated from the definitions."""
    lines = ["| feature | family | level | unit | window | meaning |", "|---|---|---|---|---|---|"]
    lines += [f"| `{f.name}` | {f.family} | {f.level} | {f.unit} | {f.window} | {f.description} |" for f in FEATURES]
    return "\n".join(lines)
