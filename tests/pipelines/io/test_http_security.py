"""The HTTP clients' TLS and authentication settings (collector.security, alert.security): what the
config accepts, what a client is given, and secrets that stay secret."""

from __future__ import annotations

import base64

import pytest

from pipelines.config import ConfigError, load_config
from pipelines.io import http_security


def test_basic_auth_comes_from_a_file_read_for_each_client_so_a_rotated_secret_is_used(tmp_path):
    (tmp_path / "password").write_text("first-f00d1e\n")
    config = load_config(environ={"SENTINEL_ALERT__SECURITY__USERNAME": "sentinel",
                                  "SENTINEL_ALERT__SECURITY__PASSWORD_FILE": str(tmp_path / "password")},
                         base_dir=tmp_path)
    header = http_security.authorization(config.alert.security, "alert")["Authorization"]
    assert base64.b64decode(header.removeprefix("Basic ")) == b"sentinel:first-f00d1e"
    (tmp_path / "password").write_text("second-5ec0nd\n")
    header = http_security.authorization(config.alert.security, "alert")["Authorization"]
    assert base64.b64decode(header.removeprefix("Basic ")) == b"sentinel:second-5ec0nd"
    assert "5ec0nd" not in repr(config) and "f00d1e" not in config.model_dump_json()


def test_a_bearer_token_is_sent_as_such_and_nothing_without_credentials():
    config = load_config(environ={"SENTINEL_COLLECTOR__SECURITY__BEARER_TOKEN": "t0k3n"})
    assert http_security.authorization(config.collector.security, "collector") == {"Authorization": "Bearer t0k3n"}
    assert http_security.authorization(load_config(environ={}).collector.security, "collector") == {}
    assert "t0k3n" not in repr(config.collector)


@pytest.mark.parametrize("environ, said", [
    ({"SENTINEL_ALERT__SECURITY__USERNAME": "u"}, "alert.security: Value error, basic authentication needs username and password"),
    ({"SENTINEL_ALERT__SECURITY__PASSWORD": "p", "SENTINEL_ALERT__SECURITY__PASSWORD_FILE": "/etc/hosts",
      "SENTINEL_ALERT__SECURITY__USERNAME": "u"}, "give password or password_file, not both"),
    ({"SENTINEL_COLLECTOR__SECURITY__USERNAME": "u", "SENTINEL_COLLECTOR__SECURITY__PASSWORD": "p",
      "SENTINEL_COLLECTOR__SECURITY__BEARER_TOKEN": "t"}, "or a bearer token, not both"),
    ({"SENTINEL_COLLECTOR__SECURITY__KEY_FILE": "/etc/hosts"}, "key_file needs cert_file"),
    ({"SENTINEL_COLLECTOR__SECURITY__CA_FILE": "/no/such/ca.pem"}, "collector.security.ca_file: /no/such/ca.pem does not exist"),
])
def test_an_incomplete_setup_names_the_key_to_fix(environ, said):
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_config(environ=environ)


def test_a_certificate_that_cannot_be_loaded_names_its_key(tmp_path):
    (tmp_path / "client.pem").write_text("not a certificate")
    config = load_config(environ={"SENTINEL_COLLECTOR__SECURITY__CERT_FILE": str(tmp_path / "client.pem")})
    with pytest.raises(ValueError, match="collector.security.cert_file: cannot load"):
        http_security.ssl_context(config.collector.security, "collector")
