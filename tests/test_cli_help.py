"""`sentinel --help` and each command's: groups, a summary and an example per command, every option
with help and its default, one duration syntax, `config show` and `config validate`."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest

from pipelines.cli.commands import COMMANDS
from pipelines.cli.parser import GROUPS, build_parser, duration
from tests.helpers.cli import run_sentinel


def _parsers(parser: argparse.ArgumentParser, name: str = "sentinel"):
    """(name, parser) of the command line and of every command and action under it."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


ALL = list(_parsers(build_parser()))
OPTIONS = [(name, action) for name, parser in ALL for action in parser._actions
           if not isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
           and action.help != argparse.SUPPRESS]


@pytest.mark.parametrize("name, action", OPTIONS, ids=[f"{n} {'/'.join(a.option_strings) or a.dest}" for n, a in OPTIONS])
def test_no_option_lacks_help_and_each_default_is_shown(name, action):
    assert action.help and len(action.help) > 10, (name, action.dest)
    parser = dict(ALL)[name]
    if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) and action.const is None:
        shown = parser._get_formatter()._get_help_string(action)  # what --help prints for the option
        assert "default" in shown, (name, action.option_strings, shown)


def test_the_overview_lists_every_command_once_by_group_with_the_production_path_first():
    result = run_sentinel("--help", env={})
    assert result.returncode == 0
    text = result.stdout
    headings = [f"{group} commands:" for group in GROUPS]
    assert [text.index(h) for h in headings] == sorted(text.index(h) for h in headings)
    production = text.split("production commands:")[1].split("models commands:")[0]
    assert [line.split()[0] for line in production.strip().splitlines()] == [
        "collect", "run", "alert", "report", "incidents", "feedback", "selfcheck", "status"]
    for command in COMMANDS:
        assert text.count(f"\n  {command.name} ") == 1, command.name
    assert "``" not in text and "Durations: 30s, 5m" in text


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_each_command_has_a_summary_and_an_example_that_parses(command):
    assert command.group in GROUPS and command.summary and command.examples
    parser = build_parser()
    help_text = dict(ALL)[f"sentinel {command.name}"].format_help()
    assert command.summary in help_text and "example" in help_text
    for example in command.examples:
        words = shlex.split(example.split("#")[0].split("|")[0])
        assert words[0] == "sentinel" and words[1] == command.name
        args = parser.parse_args(words[1:])  # SystemExit if it does not parse
        if command.name == "lab" and args.scenario:  # a name the command knows, not only one that parses
            from pipelines.lab.scenarios import NAMED

            assert args.scenario in NAMED, example


@pytest.mark.parametrize("name", [n for n, _ in ALL if len(n.split()) == 3])
def test_each_action_shows_an_example_of_itself(name):
    """`sentinel config show --help` as well as `sentinel config --help`."""
    help_text = dict(ALL)[name].format_help()
    assert "example" in help_text.split("options of every command")[-1] and f"\n  {name}" in help_text, help_text


def test_every_time_option_takes_the_one_duration_syntax():
    times = [(name, a) for name, a in OPTIONS if a.metavar == "DURATION"]
    assert len(times) >= 10
    assert all(a.type is duration for _, a in times), [n for n, a in times if a.type is not duration]
    args = build_parser().parse_args(["run", "--timeout", "90"])
    assert args.timeout == 90.0
    assert build_parser().parse_args(["collect", "--interval", "500ms"]).interval == 0.5
    assert build_parser().parse_args(["incidents", "--timeout", "2m"]).timeout == 120.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["alert", "--resend-interval", "5 minutes"])


def test_names_mean_the_same_in_every_command():
    parser = build_parser()
    # --dataset is always a folder read; a folder written is --out-dataset, a report folder --out.
    assert parser.parse_args(["simulate", "--out-dataset", "d"]).out_dataset == "d"
    assert parser.parse_args(["lab", "--grid", "corpus", "--out-dataset", "d"]).out_dataset == "d"
    assert parser.parse_args(["evaluate", "--out", "r"]).out == "r"
    assert parser.parse_args(["evaluate", "--report", "r"]).out == "r"  # the old name still works, unlisted
    defaults = {name: parser.parse_args(name.split()).jobs_per_scenario for name in ("simulate", "train", "demo")}
    assert len(set(defaults.values())) == 1, defaults


def test_config_show_masks_secrets_and_validate_says_where_values_came_from(tmp_path):
    env = {"SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__SECURITY__PROTOCOL": "SASL_SSL",
           "SENTINEL_KAFKA__SECURITY__SASL_USERNAME": "sentinel",
           "SENTINEL_KAFKA__SECURITY__SASL_PASSWORD": "hunter2-secret",
           "SENTINEL_MLFLOW__TRACKING_URI": "https://ml:pa55word@mlflow.internal:5000"}
    shown = run_sentinel("config", "show", "--output", "json", env=env)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["kafka"]["security"]["sasl_password"] == "**********"
    assert data["mlflow"]["tracking_uri"] == "https://ml:**********@mlflow.internal:5000"
    assert data["state_dir"] == str(tmp_path) and "hunter2" not in shown.stdout and "pa55word" not in shown.stdout
    one = run_sentinel("config", "show", "kafka.security.sasl_username", env=env)
    assert one.stdout.strip() == "sentinel"
    missing = run_sentinel("config", "show", "kafka.nope", env=env)
    assert missing.returncode == 2 and "no key 'kafka.nope'" in missing.stderr

    valid = run_sentinel("config", "validate", env=env)
    assert valid.returncode == 0 and "config is valid" in valid.stdout
    assert "environment: SENTINEL_KAFKA__SECURITY__PROTOCOL" in valid.stdout
    bad = run_sentinel("config", "validate", env={**env, "SENTINEL_KAFKA__CONECT_TIMEOUT_S": "3"})
    assert bad.returncode == 2 and "kafka.conect_timeout_s: unknown key" in bad.stderr


def test_logs_as_json_and_debug_with_vv(tmp_path):
    result = run_sentinel("-vv", "--log-format", "json", "config", "validate", env={"SENTINEL_STATE_DIR": str(tmp_path)})
    assert result.returncode == 0
    # A command that fails logs its traceback at DEBUG: with -vv, as one JSON object above the reason.
    from infra.embedded_stack import free_port

    failed = run_sentinel("-vv", "--log-format", "json", "incidents", "--timeout", "1s", env={
        "SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "SENTINEL_KAFKA__CONNECT_TIMEOUT_S": "1"})
    *logged, last = failed.stderr.strip().splitlines()
    assert failed.returncode == 1 and last.startswith("sentinel incidents: Kafka at ")
    entries = [json.loads(line) for line in logged]
    assert [(e["level"], e["logger"], e["message"]) for e in entries] == [
        ("debug", "pipelines.cli", "sentinel incidents failed")]
    assert "KafkaUnavailable" in entries[0]["exception"]
    import logging

    from pipelines.cli.app import JsonFormatter, LogfmtFormatter, setup_logging

    setup_logging(2, "json")
    assert logging.getLogger("pipelines.cli").isEnabledFor(logging.DEBUG)
    record = logging.LogRecord("pipelines.x", logging.INFO, __file__, 1, 'said "%s"', ("hi",), None)
    assert json.loads(JsonFormatter().format(record))["message"] == 'said "hi"'
    assert 'level=info logger=pipelines.x msg="said \\"hi\\""' in LogfmtFormatter().format(record)
    setup_logging(0, "text")
    assert not logging.getLogger("pipelines.cli").isEnabledFor(logging.INFO)


@pytest.mark.parametrize("argv", [["train"], ["demo"]], ids=["train", "demo"])
def test_a_command_that_trains_on_a_fresh_registry_finds_its_dataset_options(argv, tmp_path, monkeypatch):
    """`sentinel demo` (what `make run` runs) trains the initial detectors with the same helper as
    `sentinel train`, though it has no --dataset of its own: it simulates the default dataset."""
    from pipelines import simulator
    from pipelines.cli.model_commands import training_datasets
    from tests.conftest import config_for

    written = []
    monkeypatch.setattr(simulator, "write_dataset", lambda folder, *rest: written.append(folder))
    config = config_for(tmp_path, lab__corpus_dir=str(tmp_path / "no-corpus"))
    args = build_parser().parse_args([*argv, "--seed", "3"])
    expected = tmp_path / "datasets" / "simulated-seed3"
    assert training_datasets(config, args) == [expected] and written == [expected]
