"""Hostile names and ids through every text output: `sentinel report`'s pages and the CLI's tables.

Flink names operators after their SQL (`Calc(select=[a, EXPR$0])`), job names are whatever a
user typed, and the incident topic is anyone's to write to. Names that look like matplotlib math,
HTML, paths, terminal escapes, emoji or a novel must come out as plain text: the report completes,
every page lands inside ``--out`` and shows the name as written, and a table keeps one line per
incident. The incidents are the lab runs' own (the session's champions on real Flink runs, the
fixture `test_incident_page` uses), renamed; the report runs as the `sentinel` command.
"""

from __future__ import annotations

import html
import json
import re
import unicodedata
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from models.post_rule import PostRule
from pipelines.datasets import read_jsonl, write_jsonl
from pipelines.families import BACKPRESSURE, SKEW, STATE_LEAK
from pipelines.incidents import policy
from pipelines.incidents.comparison import compare
from pipelines.reports.backtest import Evaluation
from tests.conftest import LAB_BACKPRESSURE_RUN, LAB_LEAK_RUN, LAB_SKEW_RUN, first_opened
from tests.helpers.cli import environment_without_settings, run_sentinel
from tests.helpers.incidents import rows_and_scores
from tests.helpers.pages import Page
from tests.helpers.topics import publish_incidents, report_topics

MATH = "$x_1_2$"  # mathtext: a double subscript, a ParseFatalException
SQL = "Calc(select=[a, EXPR$0])"  # how Flink SQL names an operator
MATH_TOO = r"$\frac{a}{b}$ at $5 and $6"
MARKUP = "<script>alert(1)</script>"
QUOTES = "a \"quoted\" & 'single' <b>bold</b> name"
TERMINAL = "line one\nline two\r\x1b[2J\x1b[31mred\x1b[0m\x07\ttab\u2028sep\x85nel\u202eevil\ud800lone"
# How it is shown, on a page and in a terminal: each of those characters as its escape.
TERMINAL_SHOWN = r"line one\nline two\r\x1b[2J\x1b[31mred\x1b[0m\x07\ttab\u2028sep\x85nel\u202eevil\ud800lone"
EMOJI = "🔥 orders ✓ 日本語"
LONG = "VeryLongOperatorName" * 40
SAFE_PAGE_NAME = re.compile(r"[a-z0-9][a-z0-9._~-]*\.html")


@pytest.fixture(scope="module")
def lab(lab_replay):
    """The lab runs' event files, incident events, and the first leak, skew and backpressure incident."""
    events, result, runs = lab_replay
    incidents = result.incidents
    return (events, incidents, first_opened(incidents, STATE_LEAK, LAB_LEAK_RUN, runs),
            first_opened(incidents, SKEW, LAB_SKEW_RUN, runs),
            first_opened(incidents, BACKPRESSURE, LAB_BACKPRESSURE_RUN, runs))


def renamed(incidents: list[dict], events: list[Path], jobs: dict = (), vertices: dict = (), ids: dict = ()):
    """The incidents and events with names replaced: ``jobs`` {job_id: {field: value}} (cluster,
    job_name), ``vertices`` {(job_id, vertex_id): name}, ``ids`` {incident_id: new id}."""
    jobs, vertices, ids = dict(jobs), dict(vertices), dict(ids)

    def job_fields(record: dict) -> dict:
        return {**record, **jobs.get(record.get("job_id"), {})}

    out_incidents = []
    for incident in incidents:
        incident = job_fields(json.loads(json.dumps(incident)))
        job = incident["job_id"]
        if (job, incident.get("vertex_id")) in vertices:
            incident["vertex_name"] = vertices[(job, incident["vertex_id"])]
        for symptom in incident.get("symptoms") or []:
            if (job, symptom.get("vertex_id")) in vertices:
                symptom["vertex_name"] = vertices[(job, symptom["vertex_id"])]
        incident["incident_id"] = ids.get(incident["incident_id"], incident["incident_id"])
        out_incidents.append(incident)
    out_events = []
    for path in events:
        for event in read_jsonl(path):
            event = job_fields(event)
            if (event.get("job_id"), event.get("vertex_id")) in vertices:
                event["vertex_name"] = vertices[(event["job_id"], event["vertex_id"])]
            for vertex in event.get("vertices") or []:
                if (event.get("job_id"), vertex.get("vertex_id")) in vertices:
                    vertex["vertex_name"] = vertices[(event["job_id"], vertex["vertex_id"])]
            out_events.append(event)
    return out_incidents, out_events


def report(tmp_path: Path, incidents: list[dict], events: list[dict], *args: str):
    """`sentinel report` from files into ``tmp_path/site/deep/out``: (the finished process, out)."""
    inputs = tmp_path / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    write_jsonl(inputs / "incidents.jsonl", incidents)
    write_jsonl(inputs / "events.jsonl", events)
    out = tmp_path / "site" / "deep" / "out"
    done = run_sentinel("report", "--incidents", str(inputs / "incidents.jsonl"), "--events",
                        str(inputs / "events.jsonl"), "--out", str(out), *args,
                        env={"SENTINEL_STATE_DIR": str(tmp_path / "state")}, timeout=600)
    return done, out


class Elements(HTMLParser):
    """Every element and attribute a browser would build from a page."""

    def __init__(self, text: str):
        super().__init__()
        self.tags, self.attributes = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += [name for name, _ in attrs]


def svgs_of(text: str) -> list[str]:
    return re.findall(r"<svg.*?</svg>", text, flags=re.S)


def shown_id(text: str) -> str:
    """The incident id a page's header shows."""
    return html.unescape(re.search(r"incident <code>(.*?)</code>", text, flags=re.S).group(1))


def page_text(out: Path, index_links: list[str], incident_id: str) -> str:
    """The page the index links for ``incident_id`` (the one whose header shows that id)."""
    for link in index_links:
        text = (out / link).read_text()
        if shown_id(text) == incident_id:
            return text
    raise AssertionError(f"no page in the index shows incident {incident_id!r}")


def page_of(out: Path, index_links: list[str], incident_id: str) -> Page:
    return Page(page_text(out, index_links, incident_id))


def test_names_that_look_like_math_are_plotted_as_written(lab, tmp_path):
    """A vertex named `$x_1_2$` aborted the whole report (matplotlib's mathtext); Flink SQL's
    `EXPR$0` and a dollar amount in a summary are text too."""
    events, incidents, leak, skew, backpressure = lab
    vertices = {(leak["job_id"], leak["vertex_id"]): MATH, (skew["job_id"], skew["vertex_id"]): MATH_TOO,
                (backpressure["job_id"], backpressure["vertex_id"]): MATH}
    # The other vertices of the backpressure job: operator chains as Flink SQL names them, thousands
    # of characters, told apart only at their ends.
    others = sorted({e["vertex_id"] for path in events for e in read_jsonl(path)
                     if e.get("job_id") == backpressure["job_id"] and e.get("kind") == "vertex_metrics"}
                    - {backpressure["vertex_id"]})
    assert others
    chains = {vertex: f"Source: orders -> {SQL} -> " * 60 + f"Sink: out{n}" for n, vertex in enumerate(others)}
    vertices.update({(backpressure["job_id"], vertex): name for vertex, name in chains.items()})
    jobs = {leak["job_id"]: {"job_name": SQL}, backpressure["job_id"]: {"job_name": MATH_TOO}}
    hostile, job_events = renamed(incidents, events, jobs, vertices)
    for incident in hostile:
        incident["summary"] += f" {MATH}"
        incident["runbook"] = [*incident["runbook"], f"look at {SQL}"]
    done, out = report(tmp_path, hostile, job_events)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    index = Page((out / "index.html").read_text())
    leak_page = page_of(out, index.links, leak["incident_id"])
    assert leak_page.svgs == 2  # the state against its limit, the checkpoints: no plot dropped
    assert f"{SQL} / {MATH}" in leak_page.words and f"look at {SQL}" in leak_page.words
    # The legend names the vertex as written: not typeset, not backslash-escaped.
    assert any(f"{MATH}: " in svg for svg in svgs_of(page_text(out, index.links, leak["incident_id"])))
    backpressure_page = page_of(out, index.links, backpressure["incident_id"])
    assert backpressure_page.svgs == 2 and f"{MATH} (the bottleneck)" in backpressure_page.words
    # A legend entry per vertex, each telling which, and the plots as wide as with short names.
    backpressure_text = page_text(out, index.links, backpressure["incident_id"])
    assert all(f"Sink: out{n}" in backpressure_page.words for n in range(len(others)))
    widths = [float(w) for w in re.findall(r'<svg[^>]*? width="([0-9.]+)pt"', backpressure_text)]
    assert len(widths) == 2 and max(widths) < 1000, widths
    skew_page = page_of(out, index.links, skew["incident_id"])
    assert skew_page.svgs == 2 and f"{MATH_TOO}: load per subtask" in skew_page.words


def test_markup_in_any_field_is_shown_as_text(lab, tmp_path):
    """`<script>`, quotes and `&` in names, summaries, runbooks, evidence, symptoms, the forecast
    and the model's name: the browser builds no element and no attribute from any of them."""
    events, incidents, leak, skew, backpressure = lab
    jobs = {skew["job_id"]: {"job_name": MARKUP, "cluster": QUOTES}}
    vertices = {(skew["job_id"], skew["vertex_id"]): f"{MARKUP} {QUOTES}"}
    hostile, job_events = renamed(incidents, events, jobs, vertices)
    hostile = [i for i in hostile if not (i["incident_id"] == skew["incident_id"] and i["event"] == "resolved")]
    for incident in hostile:
        if incident["incident_id"] != skew["incident_id"]:
            continue
        incident["summary"] = f"{MARKUP} {QUOTES}"
        incident["runbook"] = [MARKUP, QUOTES]
        incident["evidence"] = {**incident["evidence"], MARKUP: QUOTES,
                                "features": {**incident["evidence"].get("features", {}), MARKUP: 1.5}}
        incident["symptoms"] = [{"family": "checkpoint_failure", "first_at": incident["opened_at"],
                                 "evidence": {"features": {MARKUP: 0.5, QUOTES: 2.0}}}]
        incident["forecast"] = {"metric": MARKUP, "limit": None, "limit_source": MARKUP, "eta_ms": 600_000}
        incident["model"] = {"name": MARKUP, "version": QUOTES, "alias": MARKUP}
        incident["labels"] = {**incident["labels"], MARKUP: QUOTES}
    done, out = report(tmp_path, hostile, job_events)
    assert done.returncode == 0, done.stderr[-3000:]
    pages = sorted(out.iterdir())
    assert len(pages) == 1 + len({i["incident_id"] for i in hostile})
    for path in pages:
        built = Elements(path.read_text())
        assert "script" not in built.tags, path.name
        assert not [a for a in built.attributes if a.startswith("on")], path.name
    index = Page((out / "index.html").read_text())
    assert f"{MARKUP} / {MARKUP} {QUOTES}" in index.words
    page = page_of(out, index.links, skew["incident_id"])
    words = page.words
    assert f"{MARKUP} {QUOTES}" in words and f"cluster {QUOTES}" in words  # `<b>bold</b>` as text
    assert f"{MARKUP} reaches its limit ({MARKUP})" in words  # the forecast box
    assert f"{MARKUP} 0.5" in words  # the symptom's evidence
    # The plot's title names the vertex (cut in the middle, long as it is), as escaped text.
    assert page.svgs == 2 and ": load per subtask" in words
    plot_titles = re.findall(r"<text[^>]*>([^<]*: load per subtask[^<]*)</text>",
                             page_text(out, index.links, skew["incident_id"]))
    assert plot_titles and plot_titles[0].startswith("&lt;script&gt;alert(1)&lt;/script&gt; a ")


def test_every_page_lands_inside_out_under_its_own_name(lab, tmp_path):
    """Ids that are paths (relative, absolute), that only differ in what a file name cannot hold,
    that are the index's name, too long for a file name, or markup: one page each, all inside
    ``--out``, linked from the index; nothing written anywhere else."""
    events, incidents, leak, skew, backpressure = lab
    (tmp_path / "outside").mkdir()
    outside = str(tmp_path / "outside" / "abs")
    ids = {leak["incident_id"]: "../../x", skew["incident_id"]: outside}
    hostile, job_events = renamed(incidents, events, ids=ids)
    clones = ["index", "a/b", "a_b", "A_B", "a?b", MARKUP, "..", ".", "x" * 300, EMOJI, f"{EMOJI}\n{TERMINAL}"]
    leak_events = [i for i in hostile if i["incident_id"] == "../../x"]
    hostile += [{**e, "incident_id": clone} for clone in clones for e in leak_events]
    done, out = report(tmp_path, hostile, job_events)
    assert done.returncode == 0, done.stderr[-3000:]
    every_id = {i["incident_id"] for i in hostile}
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()
               and not p.is_relative_to(tmp_path / "state")}
    inputs = {Path("inputs/incidents.jsonl"), Path("inputs/events.jsonl")}
    pages = {p for p in written if p.parent == out.relative_to(tmp_path)}
    assert written - inputs - pages == set()  # nothing beside --out but the state folder
    assert len(pages) == 1 + len(every_id)
    for page in pages:
        assert SAFE_PAGE_NAME.fullmatch(page.name) and len(page.name.encode()) <= 255, page.name
    index_text = (out / "index.html").read_text()
    assert re.search(r"<h1>\d+ open incidents?</h1>", index_text)  # the index, not incident "index"'s page
    index = Page(index_text)
    assert set(index.links) == {p.name for p in pages} - {"index.html"}
    shown = [shown_id((out / link).read_text()) for link in index.links]
    as_shown = {i: i.replace(f"\n{TERMINAL}", f"\\n{TERMINAL_SHOWN}") for i in every_id}
    assert sorted(shown) == sorted(as_shown.values())  # each id its own page
    # The detector's ids are already file names: their pages keep `{incident_id}.html`, which
    # `alert.incident_url` links alerts to.
    assert f"{backpressure['incident_id']}.html" in index.links
    # One id alone, and an unknown one told on one line without the terminal's escapes.
    only, only_out = report(tmp_path / "one", hostile, job_events, "--incident", "../../x")
    assert only.returncode == 0, only.stderr[-3000:]
    assert len(list(only_out.iterdir())) == 2 and not (tmp_path / "one" / "site" / "x.html").exists()
    in_argv = TERMINAL.replace("\ud800", "")  # a lone surrogate cannot be an argument
    unknown, _ = report(tmp_path / "unknown", hostile, job_events, "--incident", in_argv)
    assert unknown.returncode == 1 and "no incident" in unknown.stderr
    assert unknown.stderr.count("\n") == 1 and "\x1b" not in unknown.stderr


def test_from_the_topics_records_that_are_not_incidents_are_skipped_and_told(lab, broker_config, new_topic, tmp_path):
    """The incident topic is anyone's to write to: a record that is not an incident event (fields
    missing, not an object, not JSON) is skipped and counted on stderr, a cluster name no UTF-8
    key can hold (a lone surrogate) finds no metrics, an incident whose free-form values no page
    can draw is told and listed without a link; every other incident gets its page."""
    events, incidents, leak, skew, backpressure = lab
    odd = [{**e, "incident_id": "odd-cluster", "cluster": f"lab{TERMINAL}"} for e in incidents
           if e["incident_id"] == skew["incident_id"]]
    # Incident events the contract accepts, with values it leaves free that no page can draw.
    opened = [e for e in incidents if e["incident_id"] == leak["incident_id"]][:1]
    undrawable = [{**opened[0], "incident_id": "odd-forecast", "forecast": {"eta_ms": "soon", "limit": "big"}},
                  {**opened[0], "incident_id": "odd-opened", "opened_at": None}]
    records = [*incidents, *odd, *undrawable, json.dumps({"incident_id": MARKUP, "summary": TERMINAL}).encode(),
               b"[1, 2]", b'"a string"', b"\xff not JSON"]
    env = {"SENTINEL_STATE_DIR": str(tmp_path), **report_topics(broker_config.kafka, new_topic, records, events)}
    done = run_sentinel("report", env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipped 3 record(s) that are not incident events" in done.stderr and "\x1b" not in done.stderr
    assert "no page for incident odd-forecast: TypeError" in done.stderr
    assert "no page for incident odd-opened: TypeError" in done.stderr
    ids = {i["incident_id"] for i in [*incidents, *odd]}
    out = tmp_path / "incidents"
    assert f"{len(ids)} incident pages and the index" in done.stdout
    index = Page((out / "index.html").read_text())
    assert len(index.links) == len(ids) and len(list(out.iterdir())) == 1 + len(ids)
    assert index.words.count("(no page: see the report's log)") == 2  # listed, not linked
    assert page_of(out, index.links, skew["incident_id"]).svgs == 2  # its metrics, from the input topic
    odd_page = page_of(out, index.links, "odd-cluster")
    assert odd_page.svgs == 0 and f"cluster lab{TERMINAL_SHOWN}" in odd_page.words  # no metrics under that key


def _terminal_safe(text: str) -> bool:
    """No character that moves the cursor, ends a line, or reorders what follows."""
    return not any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") or c in "\u202a\u202b\u202c\u202d\u202e"
                   "\u2066\u2067\u2068\u2069" for c in text)


def test_the_incident_table_keeps_one_line_per_incident(config, tmp_path):
    """`sentinel incidents` on the real topic: newlines, carriage returns, ANSI escapes, a bell,
    bidi overrides, emoji and a very long name in job and vertex names stay on their row."""
    names = [(TERMINAL, EMOJI), (LONG, LONG), (EMOJI, TERMINAL), (SQL, MARKUP)]
    incidents = []
    for n, (job_name, vertex_name) in enumerate(names):
        rows, scores = rows_and_scores([(0, 0.9), (1, 0.9)], family="skew", job=f"job-{n}", hot_subtask=1.0,
                                       records_in_max_over_mean=3.0)
        rows["job_name"], rows["vertex_name"] = job_name, vertex_name
        incidents += policy.step({}, rows, scores, {"skew": PostRule(0.5, 2, 3)}, policy.PolicySettings())
    assert len(incidents) == len(names)
    publish_incidents(config.kafka, config.topics.incidents, incidents)
    env = {"SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
           "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents}
    done = run_sentinel("incidents", "--from-beginning", "--max", str(len(incidents)), "--timeout", "30", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert lines[-1] == "" and len(lines) == 1 + len(incidents) + 1  # the header, a row each
    for line in lines[1:-1]:
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  OPEN", line), line
        assert _terminal_safe(line), line
    assert any(EMOJI in line for line in lines) and any(TERMINAL_SHOWN[:40] in line for line in lines)


def test_the_table_stops_when_its_reader_goes_away(config, tmp_path):
    """`sentinel incidents | head -1`: the reader closes the pipe after the header; the command
    stops at once and quietly (it hung with its consumer open: a failed print left it alive)."""
    import subprocess
    import sys
    import time

    from tests.conftest import PROJECT_ROOT

    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9)], family="skew", hot_subtask=1.0, records_in_max_over_mean=3.0)
    (incident,) = policy.step({}, rows, scores, {"skew": PostRule(0.5, 2, 3)}, policy.PolicySettings())
    env = {**environment_without_settings(),
           "SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
           "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents}
    process = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "incidents", "--from-beginning", "--timeout",
                                "20"], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout.readline().startswith(b"event time (UTC)")  # it reads the topic
        process.stdout.close()
        # An incident after the reader has gone: its line is the write that fails.
        publish_incidents(config.kafka, config.topics.incidents, [incident])
        closed = time.monotonic()
        returncode = process.wait(timeout=60)
        stopped_after = time.monotonic() - closed
    finally:
        process.kill()
        process.wait()
    stderr = process.stderr.read().decode()
    assert returncode == 0 and "Traceback" not in stderr, stderr[-2000:]
    assert stopped_after < 15  # not the 20 s of silence it waits for when nobody stops it


def test_the_summary_lines_of_replay_and_evaluate_keep_one_line_per_run():
    """`sentinel replay --truth` and `sentinel evaluate` print a line per fault and per run, with
    the run's name and the incident's vertex and summary in it."""
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9)], family="skew", job="j1", hot_subtask=1.0,
                                   records_in_max_over_mean=3.0)
    rows["job_name"], rows["vertex_name"] = TERMINAL, f"{TERMINAL} {EMOJI}"
    incidents = policy.step({}, rows, scores, {"skew": PostRule(0.5, 2, 3)}, policy.PolicySettings())
    truths = [{"run_id": TERMINAL, "job_name": TERMINAL, "cluster": "c", "job_id": "j1", "scenario": TERMINAL,
               "faults": [{"family": "state_leak", "vertex_id": "v9", "vertex_name": TERMINAL, "onset_ts": 0}]}]
    comparison = compare(truths, incidents)
    lines = comparison.lines()
    assert len(lines) == 3 and [line.split()[0] for line in lines[1:]] == ["MISSED", "FALSE"]
    evaluation = Evaluation("test", comparison, compare(truths, []), pd.DataFrame(), incidents, [], {}, truths)
    run_lines = evaluation.run_lines()
    assert len(run_lines) == 3
    for line in lines + run_lines:
        assert _terminal_safe(line), line
