"""`sentinel report`: incident pages from real lab runs, rendered by a real headless browser.

Three committed lab runs replayed with the session's champions (``lab_replay``: a leak on
JobManager checkpoint storage, a hot key, severe backpressure); their incidents' pages are
written from the runs' own events, then opened in Debian's chromium.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from PIL import Image

from pipelines.datasets import read_jsonl
from pipelines.families import BACKPRESSURE, SKEW, STATE_LEAK
from pipelines.reports.incident_page import JobMetrics, render_page, write_pages
from tests.conftest import (LAB_BACKPRESSURE_RUN as BACKPRESSURE_RUN, LAB_LEAK_RUN as LEAK_RUN,
                            LAB_SKEW_RUN as SKEW_RUN, debian_binary, first_opened)
from tests.helpers.cli import run_sentinel
from tests.helpers.pages import Page
from tests.helpers.topics import report_topics


@pytest.fixture(scope="module")
def lab_runs(lab_replay):
    events, result, runs = lab_replay
    return events, result.incidents, runs


@pytest.fixture(scope="module")
def pages(lab_runs, tmp_path_factory):
    events, incidents, _ = lab_runs
    folder = tmp_path_factory.mktemp("pages")
    written = write_pages(incidents, (e for path in events for e in read_jsonl(path)), folder)
    return folder, written


def test_every_incident_has_a_self_contained_page_and_the_index_lists_the_open_ones(lab_runs, pages):
    _, incidents, _ = lab_runs
    folder, written = pages
    ids = {i["incident_id"] for i in incidents}
    assert {p.name for p in written} == {"index.html"} | {f"{i}.html" for i in ids}
    for path in written:
        page = Page(path.read_text())
        assert page.fetches == [], (path.name, page.fetches)  # nothing beside the file itself
    index = Page((folder / "index.html").read_text())
    latest = {i["incident_id"]: i for i in incidents}
    still_open = {i for i, e in latest.items() if e["event"] != "resolved"}
    assert f"{len(still_open)} open incident" in index.words
    assert set(index.links) == {f"{i}.html" for i in ids}  # open ones, then the resolved ones


def test_a_leak_page_shows_state_running_into_flinks_own_limit(lab_runs, pages):
    _, incidents, truths = lab_runs
    leak = first_opened(incidents, STATE_LEAK, LEAK_RUN, truths)
    page = Page((pages[0] / f"{leak['incident_id']}.html").read_text())
    assert page.svgs == 2  # the state and its forecast, then the checkpoints
    words = page.words
    # JobManagerCheckpointStorage's 5 MiB, reported with the job: the forecast runs into it.
    assert "State size against its limit" in words and "limit 5.0 MiB" in words
    assert "trend the detector fitted" in words and "forecast: limit in" in words
    assert leak["runbook"][0] in words
    # The run ended with the job, which resolved the incident: no forecast box for what is over.
    resolved = [i for i in incidents if i["incident_id"] == leak["incident_id"] and i["event"] == "resolved"]
    assert ("Forecast:" in words) is not bool(resolved)
    for feature in ("vertex_state_rel_slope_per_h", "state_r2"):
        assert feature in words
    assert leak["model"]["name"] in words and "Checkpoint durations" in words


def test_a_skew_page_has_bars_per_subtask_with_the_hot_one_marked(lab_runs, pages):
    _, incidents, truths = lab_runs
    skew = first_opened(incidents, SKEW, SKEW_RUN, truths)
    text = (pages[0] / f"{skew['incident_id']}.html").read_text()
    words = Page(text).words
    assert f"the hot one #{skew['subtask_index']} in red" in words and "records in /s" in words
    # Bars per subtask, when it opened and latest; the hot subtask's in red.
    assert text.count("fill: #b00020") >= 2 and "subtask (left: when it opened, right: latest)" in words


def test_a_backpressure_page_plots_busy_and_backpressure_per_vertex(lab_runs, pages):
    _, incidents, truths = lab_runs
    backpressure = first_opened(incidents, BACKPRESSURE, BACKPRESSURE_RUN, truths)
    words = Page((pages[0] / f"{backpressure['incident_id']}.html").read_text()).words
    assert "Busy and backpressured time per vertex" in words
    assert f"{backpressure['vertex_name']} (the bottleneck)" in words
    assert "busy ms/s" in words and "backpressured ms/s" in words


def test_without_the_jobs_metrics_the_page_says_so(lab_runs):
    incident = lab_runs[1][0]
    page = Page(render_page([incident], JobMetrics.from_events([])))
    assert "No metrics of this job were found" in page.words and incident["summary"] in page.words
    assert page.svgs == 0


def test_the_page_renders_in_a_headless_browser(lab_runs, pages, tmp_path):
    """What on-call sees: chromium draws the page with its plots (the trend's blue, the opening's
    red) and the text, not a blank or broken page."""
    chromium = debian_binary("chromium", "chromium")
    _, incidents, truths = lab_runs
    leak = first_opened(incidents, STATE_LEAK, LEAK_RUN, truths)
    shot = tmp_path / "leak.png"
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--screenshot={shot}", "--window-size=1100,1500",
                           (pages[0] / f"{leak['incident_id']}.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.is_file(), done.stderr[-2000:]
    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert image.shape[:2] == (1500, 1100)

    def pixels_near(rgb: tuple[int, int, int], tolerance: int = 40) -> int:
        return int((np.abs(image - np.array(rgb)).sum(axis=2) < tolerance).sum())

    assert pixels_near((0x1f, 0x5f, 0xa8)) > 300  # the fitted trend and its forecast
    assert pixels_near((0xb0, 0x00, 0x20)) > 300  # the opening, the limit, the severity badge
    assert pixels_near((0, 0, 0)) > 2000  # the state curve and the text
    assert (image.sum(axis=2) > 740).mean() > 0.5  # a page, mostly white, not a blank or an error


def test_sentinel_report_reads_the_topics(lab_runs, broker_config, new_topic, tmp_path):
    """With no files, the incidents come from the incident topic and the metrics of their jobs from
    the input topic; `--incident` with an unknown id stops with a message."""
    events, incidents, truths = lab_runs
    env = {"SENTINEL_STATE_DIR": str(tmp_path), **report_topics(broker_config.kafka, new_topic, incidents, events)}
    leak = first_opened(incidents, STATE_LEAK, LEAK_RUN, truths)
    done = run_sentinel("report", "--incident", leak["incident_id"], env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"1 incident pages and the index of open incidents -> {tmp_path / 'incidents' / 'index.html'}" in done.stdout
    page = Page((tmp_path / "incidents" / f"{leak['incident_id']}.html").read_text())
    assert page.svgs == 2 and "limit 5.0 MiB" in page.words  # the metrics came from the input topic
    unknown = run_sentinel("report", "--incident", "no-such-id", env=env, timeout=300)
    assert unknown.returncode == 1 and "no incident no-such-id among the" in unknown.stderr
    assert "Traceback" not in unknown.stderr
