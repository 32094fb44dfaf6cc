"""The configuration reference (docs/CONFIGURATION.md) is generated from the config models."""

from pipelines.config import SentinelConfig
from pipelines.config_reference import documented_keys, field_type, markdown
from tests.conftest import PROJECT_ROOT


def test_the_committed_reference_is_the_generated_one():
    committed = (PROJECT_ROOT / "docs" / "CONFIGURATION.md").read_text()
    assert committed == markdown(), ("docs/CONFIGURATION.md is stale: "
                                     "python -m pipelines.config_reference > docs/CONFIGURATION.md")


def test_every_key_of_the_models_has_a_row_with_its_type_default_and_description():
    page = markdown()
    rows = {line.split(" | ")[0].strip("| `"): line for line in page.splitlines() if line.startswith("| `")}
    assert set(rows) == documented_keys()
    assert {"kafka.security.sasl_password_file", "detection.job_overrides[].mute",
            "collector.clusters[].rest_url"} <= set(rows)
    assert rows["detection.warmup_horizon_s"].startswith(
        "| `detection.warmup_horizon_s` | float (> 0) | `180.0` | How long after a job starts or restarts")
    assert rows["collector.clusters[].name"].startswith("| `collector.clusters[].name` | str (at least 1 long) | required |")
    # A placeholder outside a code span would be an HTML tag to a Markdown renderer.
    assert "(default &lt;state_dir>/collector)" in rows["collector.state_dir"]


def test_types_say_where_a_path_may_live():
    fields = SentinelConfig.model_fields
    assert field_type(fields["state_dir"]) == "local path"
    security = fields["kafka"].annotation.model_fields["security"].annotation.model_fields
    assert field_type(security["ssl_key_password"]) == "secret | null"
    assert field_type(fields["spark"].annotation.model_fields["checkpoint_location"]) == "path or URI | null"


def _commented_list_items(example: str) -> dict[str, set[str]]:
    """The keys of the example items shown, commented out, under each empty list of the example
    config (``job_overrides: []`` then ``#  - job_name: ...``), by the list's key path."""
    import re

    import yaml

    lines, items, path = example.split("\n"), {}, []
    for index, line in enumerate(lines):
        if (key := re.match(r"^( *)(\w+):", line)) is None:
            continue
        depth = len(key.group(1)) // 2
        path = path[:depth] + [key.group(2)]
        if not line.split("#")[0].rstrip().endswith(": []"):
            continue
        block = []
        for following in lines[index + 1:]:
            if not following.lstrip().startswith("#  "):
                break
            block.append(following.replace("#", " ", 1))
        shown = yaml.safe_load("\n".join(block)) if block else None
        if isinstance(shown, list) and shown and all(isinstance(item, dict) for item in shown):
            items[".".join(path)] = set().union(*shown)
    return items


def test_the_example_config_shows_every_key_of_a_list_item():
    example = (PROJECT_ROOT / "infra" / "sentinel.example.yaml").read_text()
    item_keys = {}
    for key in documented_keys():
        if "[]." in key:
            list_key, _, field = key.partition("[].")
            item_keys.setdefault(list_key, set()).add(field)
    assert item_keys.keys() == {"detection.job_overrides", "collector.clusters"}
    assert _commented_list_items(example) == item_keys
