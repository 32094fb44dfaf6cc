"""The job's own files on local disk and on S3 (a real S3 API server), through one storage layer."""

from __future__ import annotations

import json
import uuid

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipelines.collector.ledger import CheckpointLedger
from pipelines.config import StorageConfig
from feature_store.offline_store import append_feature_log
from pipelines.io.storage import Location, StorageError
from tests.conftest import S3_CREDENTIALS


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path, monkeypatch) -> Location:
    """A fresh folder: a local path, or a prefix in the session's S3 bucket reached by URI."""
    if request.param == "local":
        return Location.of(tmp_path / "shared")
    store = request.getfixturevalue("s3_store")
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return Location.of(f"s3://{store.bucket}/{uuid.uuid4().hex[:8]}", StorageConfig(s3_endpoint_url=store.endpoint_url))


def test_files_are_written_whole_listed_and_deleted(root):
    folder = root / "policy"
    assert not folder.exists() and folder.names() == []
    folder.make_dirs()
    (folder / "a.json").write_text('{"v": 1}')
    (folder / "a.json").write_text('{"v": 2}')  # replaced, not appended
    (folder / "b.json").write_bytes(b"{}")
    assert folder.is_dir() and folder.names() == ["a.json", "b.json"]
    assert json.loads((folder / "a.json").read_text()) == {"v": 2}
    (folder / "a.json").delete()
    (folder / "a.json").delete()  # gone already: nothing to do
    assert folder.names() == ["b.json"]
    with pytest.raises(StorageError, match="cannot read .*missing.json"):
        (folder / "missing.json").read_text()


def test_the_feature_log_is_parquet_by_date_one_file_per_batch(root):
    day = 86_400_000
    from feature_store.definitions import feature_row_schema

    rows = pd.DataFrame({field.name: [None] * 3 for field in feature_row_schema().fields}
                        | {"ts": [day + 1, day + 2, 2 * day + 5]})
    append_feature_log(rows, root / "live", batch_id=7, part=1)
    append_feature_log(rows, root / "live", batch_id=7, part=1)  # a re-run batch overwrites its own file
    assert (root / "live").names() == ["date=1970-01-02", "date=1970-01-03"]
    assert (root / "live" / "date=1970-01-02").names() == ["live-batch-000000000007-00001.parquet"]
    filesystem, path = (root / "live" / "date=1970-01-02" / "live-batch-000000000007-00001.parquet").arrow()
    assert pq.read_table(path, filesystem=filesystem).column("ts").to_pylist() == [day + 1, day + 2]


def test_the_collector_ledger_survives_a_restart_on_the_store(root):
    history = [{"id": 5, "status": "COMPLETED"}, {"id": 6, "status": "IN_PROGRESS"}]
    ledger = CheckpointLedger(root / "collector" / "prod-eu.json")
    ledger.mark_published("job-a", [5], history)
    ledger.save()
    assert CheckpointLedger(root / "collector" / "prod-eu.json").jobs == ledger.jobs


def test_selfcheck_probes_every_place_the_job_keeps_state(s3_store, tmp_path, monkeypatch):
    from pipelines.selfcheck import check_storage
    from tests.conftest import config_for

    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    prefix = f"s3://{s3_store.bucket}/probe-{uuid.uuid4().hex[:8]}"
    config = config_for(tmp_path, spark__checkpoint_location=f"{prefix}/checkpoints",
                        features__offline_path=f"{prefix}/feature_store",
                        storage__s3_endpoint_url=s3_store.endpoint_url)
    lines = check_storage(config)
    assert [line.partition(": write, read, delete OK in ")[0] for line in lines] == [
        f"{tmp_path}/collector", f"{prefix}/checkpoints", f"{prefix}/feature_store"]
    assert all(": write, read, delete OK in " in line for line in lines)
    assert s3_store.keys(prefix.split("/", 3)[3]) == []  # the probes are gone


def test_an_unreachable_store_says_what_to_check(monkeypatch):
    from infra.embedded_stack import free_port

    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    nowhere = Location.of("s3://sentinel-shared/x", StorageConfig(s3_endpoint_url=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(StorageError) as error:
        (nowhere / "state.json").write_text("{}")
    assert "cannot write s3://sentinel-shared/x/state.json" in str(error.value)
    assert "storage.s3_endpoint_url" in str(error.value)


def test_a_remote_location_is_refused_where_a_local_path_is_needed():
    with pytest.raises(StorageError, match="s3://b/x is not on this host"):
        Location.of("s3://b/x").local_path()
