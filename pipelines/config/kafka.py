"""The ``kafka`` and ``topics`` sections: brokers, security (TLS, SASL, secrets) and topic names."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from pipelines.config.base import ConfigError, LocalPath, _secret_key, _Strict


# kafka-python's names for what `kafka.security` holds, with its key there: setting them in
# client_options too would leave two answers to one question, and a password there would be a plain
# string that any dump of the config shows.
SECURITY_CLIENT_OPTIONS = {
    "security_protocol": "protocol", "ssl_cafile": "ssl_cafile", "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile", "ssl_password": "ssl_key_password", "ssl_check_hostname": "ssl_check_hostname",
    "sasl_mechanism": "sasl_mechanism", "sasl_plain_username": "sasl_username",
    "sasl_plain_password": "sasl_password",
}
# Those of them that carry a secret.
SECRET_CLIENT_OPTIONS = ("ssl_password", "sasl_plain_password")


class KafkaSecurityConfig(_Strict):
    """How every client (kafka-python and Spark's connector alike) encrypts and authenticates.

    Secrets are secret types: shown as ``**********`` wherever the config is printed, and given
    either in the environment (``SENTINEL_KAFKA__SECURITY__SASL_PASSWORD``) or in a file
    (``sasl_password_file``, e.g. a mounted Kubernetes secret; read when a client is made, so a
    rotated file is picked up by the next client).
    """

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="SSL: TLS; SASL_SSL: TLS and SASL; SASL_PLAINTEXT: SASL without TLS.")
    ssl_cafile: LocalPath | None = Field(None, description="PEM file of the CA(s) that signed the brokers' "
                                                           "certificates (default: the system's CAs).")
    ssl_certfile: LocalPath | None = Field(None, description="Client certificate (PEM), for brokers that require "
                                                             "mutual TLS. With kafka.connector: spark, the key must "
                                                             "be in it too.")
    ssl_keyfile: LocalPath | None = Field(None, description="The client certificate's private key (PEM), when it "
                                                            "is not in ssl_certfile.")
    ssl_key_password: SecretStr | None = Field(None, description="Password of an encrypted private key.")
    ssl_key_password_file: LocalPath | None = Field(None, description="A file holding ssl_key_password.")
    ssl_check_hostname: bool = Field(True, description="Check that the broker's certificate names the host "
                                                       "connected to.")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="The SASL mechanism, with protocol SASL_SSL or SASL_PLAINTEXT.")
    sasl_username: str | None = Field(None, description="The SASL user.")
    sasl_password: SecretStr | None = Field(None, description="The SASL user's password (or sasl_password_file).")
    sasl_password_file: LocalPath | None = Field(None, description="A file holding sasl_password.")

    # The keys that name files: made absolute against the config's folder, and checked to exist.
    FILE_KEYS: ClassVar[tuple[str, ...]] = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password_file",
                                            "sasl_password_file")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @model_validator(mode="after")
    def _complete(self) -> "KafkaSecurityConfig":
        problems = []
        for secret in ("ssl_key_password", "sasl_password"):
            if getattr(self, secret) is not None and getattr(self, secret + "_file") is not None:
                problems.append(f"give {secret} or {secret}_file, not both")
        tls_keys = [key for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password",
                                    "ssl_key_password_file") if getattr(self, key) is not None]
        if tls_keys and not self.tls:
            problems.append(f"{', '.join(tls_keys)} set but protocol is {self.protocol}: TLS is off "
                            "(protocol SSL or SASL_SSL turns it on)")
        if self.sasl and (not self.sasl_username or (self.sasl_password is None and self.sasl_password_file is None)):
            problems.append(f"protocol {self.protocol} needs sasl_username and sasl_password "
                            "(or sasl_password_file, or SENTINEL_KAFKA__SECURITY__SASL_PASSWORD)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def secret(self, name: Literal["ssl_key_password", "sasl_password"]) -> str | None:
        """The secret's value, from the config or its file; only for handing to a client."""
        value: SecretStr | None = getattr(self, name)
        if value is not None:
            return value.get_secret_value()
        path: Path | None = getattr(self, name + "_file")
        if path is None:
            return None
        try:
            return path.read_text().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"kafka.security.{name}_file: cannot read {path} ({exc.strerror})") from None

    def missing_files(self) -> list[str]:
        return [f"kafka.security.{key}: {path} does not exist" for key in self.FILE_KEYS
                if (path := getattr(self, key)) is not None and not path.is_file()]

    def kafka_python_options(self) -> dict[str, Any]:
        """kafka-python's options for this security setup (secrets in clear: hand them only to a client)."""
        if self.protocol == "PLAINTEXT":
            return {}
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            options["ssl_check_hostname"] = self.ssl_check_hostname
            for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, key) is not None:
                    options[key] = str(getattr(self, key))
            if (key_password := self.secret("ssl_key_password")) is not None:
                options["ssl_password"] = key_password
        if self.sasl:
            options.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                           sasl_plain_password=self.secret("sasl_password"))
        return options


class KafkaConfig(_Strict):
    bootstrap_servers: str = Field(
        "127.0.0.1:19092", description="Comma-separated host:port list of the Kafka brokers."
    )
    security: KafkaSecurityConfig = Field(default_factory=KafkaSecurityConfig,
                                          description="TLS and SASL of every client, with its secrets.")
    client_options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Other options passed through to every kafka-python client (and, as Java names prefixed with "
            "'kafka.', to Spark's native connector): client_id, request_timeout_ms, ssl_ciphers, ... "
            "Security settings and secrets belong in kafka.security."
        ),
    )
    connector: Literal["python", "spark"] = Field(
        "python",
        description=(
            "'python': the project's Python Data Source over kafka-python; 'spark': Spark's native "
            "'kafka' format (needs spark-sql-kafka on the classpath)."
        ),
    )
    topic_partitions: int = Field(3, ge=1, description="Partitions of topics that `sentinel up` creates.")
    starting_offsets: str = Field("earliest", description="earliest, latest, or JSON {partition: offset}.")
    max_offsets_per_trigger: int | None = Field(100_000, ge=1, description="Records per micro-batch at most (a "
                                                                          "backlog is read in batches this size; "
                                                                          "null: all at once, which a large "
                                                                          "backlog may not fit in memory).")
    read_tasks: int | None = Field(None, ge=0, description="Spark tasks each micro-batch of the input is read in, "
                                                           "of about equal size (null: as many as Spark has cores; "
                                                           "0: one per Kafka partition). The python connector only.")
    fail_on_data_loss: bool = Field(True, description="Stop the query when offsets it has not read were deleted or "
                                                      "the topic was reset; false: log it and skip the lost offsets.")
    connect_timeout_s: float = Field(
        10.0, gt=0, description="How long to wait for the broker, or a topic's metadata, before failing (a "
                                 "command that cannot reach it ends within this and its start-up)."
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers_have_ports(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers:
            raise ValueError("needs at least one host:port")
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"'{server}' is not host:port")
        return ",".join(servers)

    @property
    def bootstrap_list(self) -> list[str]:
        return self.bootstrap_servers.split(",")

    @field_validator("client_options")
    @classmethod
    def _no_security_in_client_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        for key in options:
            name = key.replace(".", "_")
            if name in SECURITY_CLIENT_OPTIONS:
                raise ValueError(f"'{key}' belongs in kafka.security.{SECURITY_CLIENT_OPTIONS[name]}")
            if _secret_key(name):
                raise ValueError(f"'{key}' looks like a secret: kafka.security holds the secrets, as secret "
                                 "types read from the environment or a file")
        return options

    def client_kwargs(self) -> dict[str, Any]:
        """Options for every kafka-python client: security, the pass-through ones, a bounded bootstrap."""
        return {"bootstrap_timeout_ms": int(self.connect_timeout_s * 1000), **self.security.kafka_python_options(),
                **self.client_options}


class TopicsConfig(_Strict):
    input: str = Field("flink.metrics", description="Flink metric events the collector publishes and the job reads.")
    incidents: str = Field("flink.incidents", description="Incident events the job publishes (`sentinel alert`, "
                                                          "`sentinel incidents`, `sentinel report` read them).")
    dead_letter: str = Field("flink.metrics.dlq", description="Input records the job cannot use, with the reason.")
    feedback: str = Field("flink.incidents.feedback", description="On-call's verdicts on incidents "
                                                                  "(`sentinel feedback`, read by `sentinel train --feedback`).")
