"""The connector switch: the same call reads through either Kafka connector."""

from __future__ import annotations

import json

from pipelines.io.kafka_stream import _format_and_options
from tests.conftest import config_for


def test_python_connector_passes_client_options_and_a_bounded_wait(tmp_path):
    config = config_for(tmp_path, kafka__bootstrap_servers="k1:9092,k2:9092", kafka__connect_timeout_s="7",
                        kafka__client_options="{security_protocol: SASL_SSL, sasl_mechanism: PLAIN}")
    fmt, options = _format_and_options(config)
    assert fmt == "sentinel_kafka"
    assert options["kafka.bootstrap.servers"] == "k1:9092,k2:9092"
    assert json.loads(options["clientOptions"]) == {
        "bootstrap_timeout_ms": 7000, "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}
    assert options["metadataTimeoutMs"] == "7000"


def test_spark_connector_gets_java_style_kafka_options(tmp_path):
    config = config_for(tmp_path, kafka__connector="spark", kafka__bootstrap_servers="k1:9092",
                        kafka__client_options="{security_protocol: SASL_SSL, sasl.jaas.config: 'x required;'}")
    fmt, options = _format_and_options(config)
    assert fmt == "kafka"
    assert options == {"kafka.bootstrap.servers": "k1:9092", "kafka.security.protocol": "SASL_SSL",
                       "kafka.sasl.jaas.config": "x required;"}
