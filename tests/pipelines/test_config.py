from pathlib import Path

import pytest

from pipelines.config import ConfigError, load_config


def test_defaults_point_at_the_embedded_stack(tmp_path):
    config = load_config(environ={}, base_dir=tmp_path)
    assert config.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert (config.topics.input, config.topics.incidents, config.topics.dead_letter) == (
        "flink.metrics", "flink.incidents", "flink.metrics.dlq",
    )
    assert config.state_dir == tmp_path / ".sentinel"
    assert config.spark.checkpoint_location == str(tmp_path / ".sentinel" / "checkpoints")
    assert config.mlflow.tracking_uri == f"sqlite:///{tmp_path / '.sentinel' / 'mlflow' / 'mlflow.db'}"
    assert config.mlflow.registry_uri == config.mlflow.tracking_uri
    assert config.mlflow.models.state_leak == "sentinel-state-leak"
    assert config.mlflow.alias == "champion"
    assert config.checkpoint_dir("detector").uri == str(tmp_path / ".sentinel" / "checkpoints" / "detector")


def test_yaml_file_then_environment_overrides(tmp_path):
    path = tmp_path / "conf" / "prod.yaml"
    path.parent.mkdir()
    path.write_text(
        "kafka:\n"
        "  bootstrap_servers: kafka-1:9092,kafka-2:9092\n"
        "  client_options: {client_id: sentinel, request_timeout_ms: 60000}\n"
        "topics: {input: prod.flink.metrics}\n"
        "spark: {checkpoint_location: ckpt, shuffle_partitions: 8}\n"
        "mlflow: {tracking_uri: 'http://mlflow:5000', alias: champion}\n"
    )
    config = load_config(
        path,
        environ={"SENTINEL_SPARK__SHUFFLE_PARTITIONS": "16", "SENTINEL_TOPICS__INCIDENTS": "prod.incidents",
                 "SENTINEL_KAFKA__CLIENT_OPTIONS": "{client_id: sentinel-eu1, retries: 7}"},
    )
    assert config.kafka.bootstrap_list == ["kafka-1:9092", "kafka-2:9092"]
    # A mapping from the environment merges into the file's, key by key.
    assert config.kafka.client_options == {"client_id": "sentinel-eu1", "request_timeout_ms": 60000, "retries": 7}
    assert config.topics.input == "prod.flink.metrics"
    assert config.topics.incidents == "prod.incidents"
    assert config.topics.dead_letter == "flink.metrics.dlq"
    assert config.spark.shuffle_partitions == 16
    # Relative paths are relative to the config file's folder.
    assert config.spark.checkpoint_location == str(path.parent / "ckpt")
    assert config.mlflow.tracking_uri == config.mlflow.registry_uri == "http://mlflow:5000"
    # A tracking server keeps artifacts where it is told to, unless the config says otherwise.
    assert config.mlflow.artifact_root is None


@pytest.mark.parametrize("given, expected", [
    (None, "{state}/mlflow/artifacts"),  # a local store's artifacts beside it, never ./mlruns
    ("models", "{base}/models"),
    ("s3://bucket/sentinel", "s3://bucket/sentinel"),
    ("mlflow-artifacts:/sentinel", "mlflow-artifacts:/sentinel"),
])
def test_the_artifact_root_is_a_uri(tmp_path, given, expected):
    environ = {} if given is None else {"SENTINEL_MLFLOW__ARTIFACT_ROOT": given}
    config = load_config(environ=environ, base_dir=tmp_path)
    expected = expected.format(state=(tmp_path / ".sentinel").as_uri(), base=tmp_path.as_uri())
    assert config.mlflow.artifact_root == expected


def test_storage_locations_are_paths_or_uris_for_spark_and_the_job_alike(tmp_path):
    config = load_config(environ={
        "SENTINEL_SPARK__CHECKPOINT_LOCATION": "s3://fleet-state/sentinel/checkpoints/",
        "SENTINEL_FEATURES__OFFLINE_PATH": (tmp_path / "store dir").as_uri(),
        "SENTINEL_COLLECTOR__STATE_DIR": "collector-ledgers",
        "SENTINEL_STORAGE__S3_ENDPOINT_URL": "http://minio:9000/",
    }, base_dir=tmp_path)
    checkpoints = config.checkpoint_dir("detection")
    assert checkpoints.uri == "s3://fleet-state/sentinel/checkpoints/detection"
    assert checkpoints.spark_path == "s3a://fleet-state/sentinel/checkpoints/detection"  # Hadoop's S3 client
    assert not checkpoints.is_local and checkpoints.settings is config.storage
    assert config.offline_store.uri == str(tmp_path / "store dir") and config.offline_store.is_local
    assert config.collector.state_dir == str(tmp_path / "collector-ledgers")
    assert config.storage.spark_conf() == {"spark.hadoop.fs.s3a.endpoint": "http://minio:9000",
                                           "spark.hadoop.fs.s3a.path.style.access": "true",
                                           "spark.hadoop.fs.s3a.connection.ssl.enabled": "false"}


@pytest.mark.parametrize("environ, expected", [
    ({"SENTINEL_SPARK__CHECKPOINT_LOCATION": "ftp://host/x"},
     "spark.checkpoint_location: Value error, 'ftp://host/x': the scheme ftp:// is not supported here"),
    ({"SENTINEL_FEATURES__OFFLINE_PATH": "s3:///no-bucket"}, "features.offline_path: Value error, 's3:///no-bucket' "
                                                             "names no bucket or host"),
    ({"SENTINEL_STATE_DIR": "s3://bucket/state"}, "state_dir: Value error, 's3://bucket/state': this key must be on "
                                                  "this host; give a local path or a file:// URI"),
    ({"SENTINEL_DETECTION__METRICS_FILE": "file://other-host/m.prom"}, "detection.metrics_file: Value error"),
    ({"SENTINEL_STORAGE__S3_ENDPOINT_URL": "minio:9000"}, "storage.s3_endpoint_url: Value error, 'minio:9000' is "
                                                          "not an http(s):// URL"),
])
def test_a_location_that_cannot_work_names_its_key(tmp_path, environ, expected):
    with pytest.raises(ConfigError) as error:
        load_config(environ=environ, base_dir=tmp_path)
    assert expected in str(error.value)


def test_local_keys_take_file_uris(tmp_path):
    config = load_config(environ={"SENTINEL_STATE_DIR": (tmp_path / "state").as_uri()}, base_dir=tmp_path)
    assert config.state_dir == tmp_path / "state"
    assert config.spark.checkpoint_location == str(tmp_path / "state" / "checkpoints")


def test_sentinel_config_variable_names_the_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("topics: {input: from-env-file}\n")
    assert load_config(environ={"SENTINEL_CONFIG": str(path)}).topics.input == "from-env-file"


def test_client_kwargs_bound_the_bootstrap_wait(tmp_path):
    config = load_config(environ={"SENTINEL_KAFKA__CONNECT_TIMEOUT_S": "2.5",
                                  "SENTINEL_KAFKA__CLIENT_OPTIONS": "{client_id: sentinel}"}, base_dir=tmp_path)
    assert config.kafka.client_kwargs() == {"bootstrap_timeout_ms": 2500, "client_id": "sentinel"}


def test_numeric_looking_strings_from_the_environment_stay_strings(tmp_path):
    config = load_config(environ={"SENTINEL_MLFLOW__ALIAS": "2024"}, base_dir=tmp_path)
    assert config.mlflow.alias == "2024"


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("kafka: {bootstrap_server: x:1}\n", "kafka.bootstrap_server: unknown key"),
        ("spark: {shuffle_partitions: 0}\n", "spark.shuffle_partitions: Input should be greater than or equal to 1"),
        ("kafka: {bootstrap_servers: 'kafka-1'}\n", "kafka.bootstrap_servers: Value error, 'kafka-1' is not host:port"),
        ("kafka: {connector: jvm}\n", "kafka.connector: Input should be 'python' or 'spark'"),
        ("- just\n- a list\n", "must hold a mapping of keys"),
    ],
)
def test_bad_file_names_the_key_and_the_problem(tmp_path, yaml_text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert expected in str(error.value)


def test_unknown_environment_key_is_named(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(environ={"SENTINEL_KAFKA__BOOTSTRAP": "x:1"}, base_dir=tmp_path)
    message = str(error.value)
    assert "kafka.bootstrap: unknown key" in message
    assert "SENTINEL_KAFKA__BOOTSTRAP" in message


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_every_error_is_reported_at_once(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(environ={"SENTINEL_SPARK__SHUFFLE_PARTITIONS": "-1", "SENTINEL_KAFKA__TOPIC_PARTITIONS": "zero"},
                    base_dir=Path(tmp_path))
    assert "spark.shuffle_partitions" in str(error.value)
    assert "kafka.topic_partitions" in str(error.value)


def test_the_documented_example_file_is_the_defaults():
    from tests.conftest import PROJECT_ROOT

    example = PROJECT_ROOT / "infra" / "sentinel.example.yaml"
    assert load_config(example, environ={}) == load_config(environ={}, base_dir=example.parent)


def _model_keys(model: type, prefix: str = "") -> set[str]:
    from pydantic import BaseModel

    keys = set()
    for name, field in model.model_fields.items():
        keys.add(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys |= _model_keys(field.annotation, f"{prefix}{name}.")
    return keys


def _file_keys(document: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in document.items():
        keys.add(prefix + name)
        if isinstance(value, dict):
            keys |= _file_keys(value, f"{prefix}{name}.")
    return keys


def test_the_example_file_lists_every_key_of_the_config_models():
    import yaml

    from pipelines.config import SentinelConfig
    from tests.conftest import PROJECT_ROOT

    listed = _file_keys(yaml.safe_load((PROJECT_ROOT / "infra" / "sentinel.example.yaml").read_text()))
    assert sorted(_model_keys(SentinelConfig) - listed) == []  # a key the example does not show
    assert sorted(listed - _model_keys(SentinelConfig)) == []


def test_collector_clusters_are_checked_and_paths_resolved(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("collector:\n  clusters:\n    - {name: prod-eu, rest_url: 'http://flink-jm:8081/'}\n")
    config = load_config(good, environ={})
    assert config.collector.clusters[0].rest_url == "http://flink-jm:8081"
    assert config.collector.state_dir == str(tmp_path / ".sentinel" / "collector")
    assert config.lab.flink_venv == tmp_path / ".venv-flink"
    bad = tmp_path / "bad.yaml"
    bad.write_text("collector:\n  clusters:\n    - {name: prod-eu, rest_url: 'flink-jm:8081'}\n")
    with pytest.raises(ConfigError, match=r"collector.clusters.0.rest_url: .*not an http"):
        load_config(bad, environ={})


def test_kafka_secrets_are_secret_types_from_the_environment_or_a_file(tmp_path):
    (tmp_path / "sasl-password").write_text("from-a-file\n")
    (tmp_path / "ca.pem").write_text("PEM")
    config = load_config(environ={"SENTINEL_KAFKA__SECURITY__PROTOCOL": "SASL_SSL",
                                  "SENTINEL_KAFKA__SECURITY__SASL_USERNAME": "sentinel",
                                  "SENTINEL_KAFKA__SECURITY__SASL_PASSWORD_FILE": "sasl-password",
                                  "SENTINEL_KAFKA__SECURITY__SSL_CAFILE": "ca.pem",
                                  # Taken as it is, not as YAML (which would make it False).
                                  "SENTINEL_KAFKA__SECURITY__SSL_KEY_PASSWORD": "no"}, base_dir=tmp_path)
    security = config.kafka.security
    assert security.ssl_cafile == tmp_path / "ca.pem"
    assert security.secret("sasl_password") == "from-a-file"
    assert security.secret("ssl_key_password") == "no"
    assert "no" not in repr(security.ssl_key_password) and "from-a-file" not in config.model_dump_json()
    kwargs = config.kafka.client_kwargs()
    assert kwargs["sasl_plain_password"] == "from-a-file" and kwargs["ssl_password"] == "no"
    assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["ssl_cafile"] == str(tmp_path / "ca.pem")
    # A rotated file reaches the next client.
    (tmp_path / "sasl-password").write_text("rotated")
    assert config.kafka.client_kwargs()["sasl_plain_password"] == "rotated"


@pytest.mark.parametrize("environ, expected", [
    ({"SENTINEL_KAFKA__SECURITY__PROTOCOL": "SASL_SSL", "SENTINEL_KAFKA__SECURITY__SASL_USERNAME": "u"},
     "protocol SASL_SSL needs sasl_username and sasl_password"),
    ({"SENTINEL_KAFKA__SECURITY__SSL_CAFILE": "/etc/ca.pem"},
     "ssl_cafile set but protocol is PLAINTEXT: TLS is off"),
    ({"SENTINEL_KAFKA__SECURITY__PROTOCOL": "SSL", "SENTINEL_KAFKA__SECURITY__SSL_CAFILE": "/nowhere/ca.pem"},
     "kafka.security.ssl_cafile: /nowhere/ca.pem does not exist"),
    ({"SENTINEL_KAFKA__CLIENT_OPTIONS": "{sasl_plain_password: hunter2}"},
     "'sasl_plain_password' belongs in kafka.security.sasl_password"),
    ({"SENTINEL_KAFKA__CLIENT_OPTIONS": "{sasl.jaas.config: 'x required password=hunter2;'}"},
     "'sasl.jaas.config' looks like a secret"),
])
def test_an_incomplete_or_misplaced_kafka_security_setup_says_what_to_fix(tmp_path, environ, expected):
    with pytest.raises(ConfigError) as error:
        load_config(environ=environ, base_dir=tmp_path)
    assert expected in str(error.value)
    assert "hunter2" not in str(error.value)
