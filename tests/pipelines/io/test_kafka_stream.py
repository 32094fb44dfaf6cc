"""The connector switch: the same call reads through either Kafka connector, secured alike."""

from __future__ import annotations

import json

import pytest

from pipelines.config import ConfigError
from pipelines.io.kafka_stream import _format_and_options, has_read_to, offsets_read
from tests.conftest import config_for


def test_python_connector_passes_client_options_and_a_bounded_wait(tmp_path):
    config = config_for(tmp_path, kafka__bootstrap_servers="k1:9092,k2:9092", kafka__connect_timeout_s="7",
                        kafka__client_options="{client_id: sentinel-eu1, request_timeout_ms: 60000}")
    fmt, options = _format_and_options(config)
    assert fmt == "sentinel_kafka"
    assert options["kafka.bootstrap.servers"] == "k1:9092,k2:9092"
    assert json.loads(options["clientOptions"]) == {
        "bootstrap_timeout_ms": 7000, "client_id": "sentinel-eu1",
        "request_timeout_ms": 60000}
    assert json.loads(options["clientSecrets"]) == {}
    assert options["metadataTimeoutMs"] == "7000"


def test_python_connector_keeps_secrets_in_an_option_spark_redacts(tmp_path):
    (tmp_path / "password").write_text("s3cr3t \"pw\"\n")
    config = config_for(tmp_path, kafka__security__protocol="SASL_SSL", kafka__security__sasl_username="sentinel",
                        kafka__security__sasl_password_file=str(tmp_path / "password"))
    _, options = _format_and_options(config)
    assert json.loads(options["clientOptions"]) == {
        "bootstrap_timeout_ms": 10000, "security_protocol": "SASL_SSL", "ssl_check_hostname": True,
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "sentinel"}
    # Spark redacts the value of any option whose key matches spark.redaction.regex ("secret").
    assert json.loads(options["clientSecrets"]) == {"sasl_plain_password": 's3cr3t "pw"'}


def test_spark_connector_gets_the_java_clients_names_for_sasl_over_tls(tmp_path):
    (tmp_path / "ca.pem").write_text("CA")
    config = config_for(tmp_path, kafka__connector="spark", kafka__bootstrap_servers="k1:9092",
                        kafka__security__protocol="SASL_SSL", kafka__security__sasl_username="sentinel",
                        kafka__security__sasl_password='pa"ss\\word', kafka__security__ssl_cafile=str(tmp_path / "ca.pem"),
                        kafka__client_options="{request_timeout_ms: 60000, ssl_ciphers: TLS_AES_256_GCM_SHA384}")
    fmt, options = _format_and_options(config)
    assert fmt == "kafka"
    assert options == {
        "kafka.bootstrap.servers": "k1:9092", "kafka.security.protocol": "SASL_SSL",
        "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(tmp_path / "ca.pem"),
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        # JAAS quoting: the password's quote and backslash are escaped, not ending the value.
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="sentinel" password="pa\\"ss\\\\word";',
        "kafka.request.timeout.ms": "60000", "kafka.ssl.cipher.suites": "TLS_AES_256_GCM_SHA384"}


def test_spark_connector_gets_a_pem_key_store_for_mutual_tls(tmp_path):
    for name in ("ca.pem", "client.pem"):
        (tmp_path / name).write_text("PEM")
    config = config_for(tmp_path, kafka__connector="spark", kafka__security__protocol="SSL",
                        kafka__security__ssl_cafile=str(tmp_path / "ca.pem"),
                        kafka__security__ssl_certfile=str(tmp_path / "client.pem"),
                        kafka__security__ssl_key_password="keypass", kafka__security__ssl_check_hostname="false")
    _, options = _format_and_options(config)
    assert options["kafka.security.protocol"] == "SSL"
    assert options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.keystore.location"] == str(tmp_path / "client.pem")
    assert options["kafka.ssl.key.password"] == "keypass"
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""


def test_spark_connector_refuses_a_key_it_cannot_read(tmp_path):
    for name in ("client.pem", "client.key"):
        (tmp_path / name).write_text("PEM")
    config = config_for(tmp_path, kafka__connector="spark", kafka__security__protocol="SSL",
                        kafka__security__ssl_certfile=str(tmp_path / "client.pem"),
                        kafka__security__ssl_keyfile=str(tmp_path / "client.key"))
    with pytest.raises(ConfigError, match="one PEM file; put both in ssl_certfile"):
        _format_and_options(config)


def test_the_offsets_a_query_read_come_from_either_connectors_progress():
    python_source = {"sources": [{"endOffset": {"0": 5, "1": 7}}]}
    spark_source = {"sources": [{"endOffset": json.dumps({"metrics": {"0": 5, "1": 7}})}]}
    for progress in (python_source, spark_source):
        assert offsets_read(progress, "metrics") == {0: 5, 1: 7}
        assert has_read_to(progress, "metrics", {0: 5, 1: 7})
        assert not has_read_to(progress, "metrics", {0: 5, 1: 8})
        assert not has_read_to(progress, "metrics", {0: 5, 1: 7, 2: 1})  # a partition it has not read
    # Before the first batch: nothing read, which is behind any end but an empty topic's.
    assert offsets_read(None, "metrics") == {} and has_read_to(None, "metrics", {})
    assert not has_read_to({"sources": []}, "metrics", {0: 1})
