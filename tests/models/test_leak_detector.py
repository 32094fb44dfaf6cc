"""The leak detector earns its keep: silent on warm-ups, early on seed 000 (issue's acceptance test).

Scored with the session's champion exactly as the live job decides: the detector's score, then
the post-rule saved with it (persistence and the warm-up guard).
"""

from __future__ import annotations

import pandas as pd
import pytest

from feature_store.job_features import features_for_events
from models import registry
from models.detectors import rows_for
from models.post_rule import DEFAULT_WARMUP_HORIZON_S
from pipelines import simulator

WARM_UPS = ["healthy_warmup", "healthy_window_fill", "healthy_cep_key_rotation"]


def decisions(leak, job) -> pd.DataFrame:
    """Where the champion decides a leak, with the warm-up horizon the job's operator declares
    (the simulator's long warm-ups) or the default."""
    rows = rows_for(pd.DataFrame(features_for_events(job.events)), "vertex")
    rows = rows.assign(score=leak.detector.score(rows))
    horizon = job.truth.get("warmup_horizon_s", DEFAULT_WARMUP_HORIZON_S)
    return rows[leak.post_rule.decisions(rows, horizon_s=horizon).to_numpy()]


@pytest.fixture(scope="module")
def leak(trained_store):
    registry.use_config(trained_store)
    return registry.load_detector(trained_store.mlflow.models.state_leak, "champion")


@pytest.mark.parametrize("scenario", WARM_UPS)
def test_the_leak_detector_does_not_fire_on_warm_ups(leak, scenario):
    for index in range(3):  # jobs the detector was not trained on (another seed)
        job = simulator.simulate_job(scenario, seed=101, index=index, duration_ms=90 * 60_000)
        fired = decisions(leak, job)
        assert fired.empty, f"{scenario} #{index} fired at {((fired['ts'] - job.truth['start_ts']) / 60_000).tolist()[:5]} min"


def test_the_leak_detector_catches_seed_000_before_its_first_failed_checkpoint(leak):
    for index in range(3):
        job = simulator.simulate_job("leak_seed000", seed=101, index=index)
        first_failure = min(e["ts"] for e in job.events if e["kind"] == "checkpoint" and e["status"] == "FAILED")
        fired = decisions(leak, job)
        assert not fired.empty and fired["ts"].min() < first_failure


@pytest.mark.parametrize("scenario", ["leak_linear", "leak_accelerating", "leak_cep_key_rotation"])
def test_the_leak_detector_catches_leaks_that_do_not_level_off(leak, scenario):
    job = simulator.simulate_job(scenario, seed=101, index=0, duration_ms=90 * 60_000)
    fired = decisions(leak, job)
    onset = job.truth["faults"][0]["onset_ts"]
    assert not fired.empty and fired["ts"].min() >= onset - 5 * 60_000
    # Soon after the later of its onset and the end of its warm-up horizon (declared, else the
    # default): these leaks add tens of percent an hour, so soon is within twenty minutes.
    horizon_ms = job.truth.get("warmup_horizon_s", DEFAULT_WARMUP_HORIZON_S) * 1000
    assert fired["ts"].min() <= max(onset, job.truth["start_ts"] + horizon_ms) + 20 * 60_000
