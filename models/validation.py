"""The training set's Great Expectations suite, defined in code.

Two checks, both GX: the rows (columns present, keys and labels not null, labels known, ratios
and sizes in range) and the label summary (every family present, enough rows of each, healthy
rows neither missing nor all there is). A failed validation stops training with a report that
names each broken expectation; nothing is registered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import great_expectations as gx  # noqa: E402
from great_expectations.data_context.types.base import ProgressBarsConfig  # noqa: E402

from pipelines.errors import SetupError

KEYS = ("cluster", "job_id", "ts", "label")
RATIOS = ("busy_max", "busy_mean", "backpressured_max", "backpressured_mean", "idle_mean", "state_r2",
          "state_r2_long", "vertex_state_r2", "checkpoint_failed_fraction", "state_frac_increasing",
          "in_pool_max", "out_pool_max")
NON_NEGATIVE = ("state_size_bytes", "vertex_state_size_bytes", "limit_ratio", "job_age_checkpoints",
                "checkpoints_in_progress", "start_delay_max_ms", "alignment_max_ms", "records_in_max_over_mean",
                "records_in_over_usual", "busiest_input_over_usual")


class TrainingSetInvalid(SetupError, ValueError):
    """The training set broke its expectations; the message is the report."""


@dataclass
class ValidationReport:
    success: bool
    checked: int
    failures: list[str] = field(default_factory=list)

    def text(self) -> str:
        head = f"training set validation: {self.checked - len(self.failures)} of {self.checked} expectations met"
        return "\n".join([head] + [f"  FAILED {f}" for f in self.failures])


def run_expectations(frame: pd.DataFrame, expectations: list, name: str) -> tuple[int, list[str]]:
    context = gx.get_context(mode="ephemeral")
    # No "Calculating Metrics" bar on stderr: the detection job validates a sample every minute,
    # and its log is read by people and log shippers, not watched in a terminal (GX passes tqdm
    # its own `disable`, so TQDM_DISABLE does not reach it).
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (context.data_sources.add_pandas(name=f"{name}_source").add_dataframe_asset(name=name)
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    suite = gx.ExpectationSuite(name=f"{name}_suite")
    for expectation in expectations:
        suite.add_expectation(expectation)
    result = batch.validate(suite)
    failures = []
    for r in result.results:
        if r.success:
            continue
        config = r.expectation_config
        args = ", ".join(f"{k}={v}" for k, v in config.kwargs.items() if k not in ("batch_id",))
        seen = {k: r.result[k] for k in ("unexpected_count", "partial_unexpected_list", "observed_value") if k in r.result}
        failures.append(f"{name}: {config.type}({args}) {seen}")
    return len(result.results), failures


def validate_training_set(frame: pd.DataFrame, features: Sequence[str], families: Sequence[str],
                          min_rows_per_family: int = 50, max_healthy_share: float = 0.99,
                          known_labels: Sequence[str] | None = None) -> ValidationReport:
    """Check ``frame`` (labelled feature rows) for training ``families``; the report lists every
    broken expectation. ``known_labels`` (default: ``families``) are the labels allowed at all."""
    E = gx.expectations
    rows = [E.ExpectColumnToExist(column=c) for c in (*KEYS, *features)]
    present = set(frame.columns)
    rows += [E.ExpectColumnValuesToNotBeNull(column=c) for c in KEYS if c in present]
    if "label" in present:
        rows.append(E.ExpectColumnValuesToBeInSet(column="label", value_set=["healthy", *(known_labels or families)]))
    rows += [E.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=1.0001)
             for c in RATIOS if c in present and c in features]
    rows += [E.ExpectColumnValuesToBeBetween(column=c, min_value=0) for c in NON_NEGATIVE if c in present and c in features]
    checked, failures = run_expectations(frame, rows, "rows")

    if "label" in present and len(frame):
        counts = frame.loc[frame["label"].isin(["healthy", *families]), "label"].value_counts()
        summary = pd.DataFrame({"label": counts.index.astype(str), "rows": counts.to_numpy(),
                                "share": (counts / counts.sum()).to_numpy()})
        wanted = ["healthy", *families]
        label_checks = [
            E.ExpectColumnDistinctValuesToContainSet(column="label", value_set=wanted),
            E.ExpectColumnValuesToBeBetween(column="rows", min_value=min_rows_per_family),
        ]
        n, more = run_expectations(summary, label_checks, "labels")
        healthy = summary.loc[summary["label"] == "healthy", "share"]
        n2, more2 = run_expectations(pd.DataFrame({"healthy_share": healthy.to_numpy() if len(healthy) else [0.0]}),
                         [E.ExpectColumnValuesToBeBetween(column="healthy_share", min_value=0.05, max_value=max_healthy_share)],
                         "balance")
        checked, failures = checked + n + n2, failures + more + more2
    elif not len(frame):
        checked, failures = checked + 1, failures + ["rows: the training set is empty"]
    return ValidationReport(not failures, checked, failures)
