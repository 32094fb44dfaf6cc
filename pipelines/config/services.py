"""The sections of the other services: shared storage, the embedded stack, the collector, the alert
relay and the lab."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from pipelines.config.base import ConfigError, LocalPath, StorageLocation, _http_url, _Strict


class HttpClientSecurity(_Strict):
    """TLS and authentication of an HTTP client (`sentinel collect` to Flink's REST API, `sentinel
    alert` to Alertmanager). Secrets are secret types, from the environment or from a file read
    each time a client is made (a mounted Kubernetes secret, rotated in place), as for Kafka."""

    ca_file: LocalPath | None = Field(None, description="PEM file of the CA(s) that signed the server's certificate "
                                                        "(default: the system's CAs), for an https:// URL.")
    cert_file: LocalPath | None = Field(None, description="Client certificate (PEM; its key too unless key_file), "
                                                          "for a server that requires mutual TLS.")
    key_file: LocalPath | None = Field(None, description="The client certificate's private key (PEM), when it is "
                                                         "not in cert_file.")
    check_hostname: bool = Field(True, description="Check that the server's certificate names the host connected "
                                                   "to.")
    username: str | None = Field(None, description="HTTP basic authentication's user (with password).")
    password: SecretStr | None = Field(None, description="Basic authentication's password (or password_file).")
    password_file: LocalPath | None = Field(None, description="A file holding password.")
    bearer_token: SecretStr | None = Field(None, description="A bearer token sent as `Authorization: Bearer` (or "
                                                             "bearer_token_file), instead of basic authentication.")
    bearer_token_file: LocalPath | None = Field(None, description="A file holding bearer_token.")

    FILE_KEYS: ClassVar[tuple[str, ...]] = ("ca_file", "cert_file", "key_file", "password_file", "bearer_token_file")

    @model_validator(mode="after")
    def _complete(self) -> "HttpClientSecurity":
        problems = []
        for secret in ("password", "bearer_token"):
            if getattr(self, secret) is not None and getattr(self, secret + "_file") is not None:
                problems.append(f"give {secret} or {secret}_file, not both")
        basic = self.username is not None or self.password is not None or self.password_file is not None
        if basic and (self.username is None or (self.password is None and self.password_file is None)):
            problems.append("basic authentication needs username and password (or password_file)")
        if basic and (self.bearer_token is not None or self.bearer_token_file is not None):
            problems.append("give basic authentication (username, password) or a bearer token, not both")
        if self.key_file is not None and self.cert_file is None:
            problems.append("key_file needs cert_file (the certificate it is the key of)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def secret(self, name: Literal["password", "bearer_token"], section: str) -> str | None:
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
            raise ConfigError(f"{section}.security.{name}_file: cannot read {path} ({exc.strerror})") from None

    def missing_files(self, section: str) -> list[str]:
        return [f"{section}.security.{key}: {path} does not exist" for key in self.FILE_KEYS
                if (path := getattr(self, key)) is not None and not path.is_file()]


class StorageConfig(_Strict):
    """How the storage behind s3:// locations is reached, by Spark (Hadoop's s3a) and by the job's own
    files (pyarrow) alike. Credentials are not here: both take them from the standard AWS chain
    (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance or pod role)."""

    s3_endpoint_url: str | None = Field(None, description="An S3-compatible store's endpoint (MinIO, Ceph), "
                                                          "e.g. http://minio:9000; its buckets are addressed by "
                                                          "path. Unset: AWS S3.")
    s3_region: str | None = Field(None, description="The buckets' region (unset: the SDKs' default chain).")

    @field_validator("s3_endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return None if value is None else _http_url(value)

    def spark_conf(self) -> dict[str, str]:
        """The same settings for Hadoop's S3 client (``spark.hadoop.fs.s3a.*``)."""
        conf = {}
        if self.s3_endpoint_url:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.s3_endpoint_url
            conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(self.s3_endpoint_url.startswith("https")).lower()
        if self.s3_region:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = self.s3_region
        return conf


class StackConfig(_Strict):
    """The embedded local stack that `sentinel up` starts (the broker listens on kafka.bootstrap_servers)."""

    mlflow_host: str = Field("127.0.0.1", description="Where the embedded MLflow server listens.")
    mlflow_port: int = Field(15000, ge=1, le=65535, description="Its port (the UI).")
    start_mlflow_server: bool = Field(True, description="Whether `sentinel up` starts the MLflow server and UI "
                                                        "(the job opens the sqlite store without it).")
    startup_timeout_s: float = Field(60.0, gt=0, description="How long `sentinel up` waits for each service.")


class FlinkClusterEndpoint(_Strict):
    """One Flink deployment the collector polls."""

    name: str = Field(..., min_length=1, description="The `cluster` field of its events (and half of their key).")
    rest_url: str = Field(..., description="Base URL of the JobManager's REST API, e.g. http://flink-jm:8081.")
    max_state_size_bytes: int | None = Field(
        None, ge=1, description="A known hard limit for state or checkpoint size on this cluster; when unset, "
                                "jobs on JobManagerCheckpointStorage get its 5 MiB default.")

    @field_validator("rest_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _http_url(value)


class CollectorConfig(_Strict):
    """`sentinel collect`: Flink REST API -> the input topic."""

    clusters: list[FlinkClusterEndpoint] = Field(default_factory=list, description="Clusters to poll (--flink-rest "
                                                                                   "and --cluster name one).")
    interval_s: float = Field(5.0, gt=0, description="Time between two polls of a cluster.")
    request_timeout_s: float = Field(5.0, gt=0, description="Timeout of one REST request.")
    retries: int = Field(3, ge=0, description="Retries of a failed REST request within one poll.")
    backoff_s: float = Field(0.5, gt=0, description="First wait before a retry; doubles each time.")
    max_backoff_s: float = Field(60.0, gt=0, description="Longest wait between polls of an unreachable cluster.")
    max_concurrent_requests: int = Field(16, ge=1, le=1024, description="REST requests under way at once per "
                                                                        "cluster (and kept-alive connections to it).")
    shard: str | None = Field(None, pattern=r"^\d+/\d+$", description="i/N: poll only the jobs a hash of the job id "
                                                                      "gives to shard i of N collector processes "
                                                                      "(--shard); null: every job.")
    state_dir: StorageLocation | None = Field(None, description="Where the last published checkpoint of each job "
                                                                "is kept, a path or a URI (default "
                                                                "<state_dir>/collector).")
    metrics_host: str = Field("127.0.0.1", description="Where `sentinel collect` serves /metrics for Prometheus.")
    metrics_port: int | None = Field(9465, ge=0, le=65535, description="Its port (0: any free one; null: off).")
    security: HttpClientSecurity = Field(default_factory=HttpClientSecurity,
                                         description="TLS and authentication to the clusters' REST APIs (Flink's "
                                                     "security.ssl.rest.*; a proxy's basic or bearer auth).")

    @field_validator("shard")
    @classmethod
    def _shard_in_range(cls, value: str | None) -> str | None:
        if value is not None:
            index, count = map(int, value.split("/"))
            if not 0 <= index < count:
                raise ValueError(f"shard {value}: i/N needs 0 <= i < N, e.g. 0/4")
        return value


class AlertConfig(_Strict):
    """`sentinel alert`: the incident topic -> Alertmanager's v2 API."""

    alertmanager_urls: list[str] = Field(default_factory=list, description="Alertmanager base URLs (every member of "
                                                                          "an HA pair); --alertmanager overrides.")
    group_id: str = Field("checkpoint-sentinel-alert", min_length=1,
                          description="Consumer group whose committed offsets mark what has been delivered.")
    resend_interval_s: float = Field(60.0, gt=0, description="Open alerts are re-sent this often.")
    open_alert_ttl_s: float = Field(3900.0, gt=0, description="An open alert's endsAt is this far after each send: "
                                                              "how long it stays firing if the relay stops (an "
                                                              "outage of the relay up to this long does not read as "
                                                              "resolved; a resolve it missed shows this late).")
    request_timeout_s: float = Field(10.0, gt=0, description="Timeout of one request to an Alertmanager.")
    max_backoff_s: float = Field(30.0, gt=0, description="Longest wait between two tries while no Alertmanager "
                                                         "accepts the alerts (nothing is dropped meanwhile).")
    incident_url: str | None = Field(None, description="Link to an incident's page, with {incident_id} in it, "
                                                       "e.g. https://sentinel.example/incidents/{incident_id}.html "
                                                       "(the annotation `incident_url`).")
    metrics_host: str = Field("127.0.0.1", description="Where `sentinel alert` serves /metrics for Prometheus.")
    metrics_port: int | None = Field(9466, ge=0, le=65535, description="Its port (0: any free one; null: off).")
    security: HttpClientSecurity = Field(default_factory=HttpClientSecurity,
                                         description="TLS and authentication to Alertmanager (its "
                                                     "--web.config.file: tls_server_config, basic_auth_users).")

    @field_validator("alertmanager_urls")
    @classmethod
    def _http_urls(cls, values: list[str]) -> list[str]:
        return [_http_url(value) for value in values]

    @model_validator(mode="after")
    def _ttl_outlasts_a_resend(self) -> "AlertConfig":
        if self.open_alert_ttl_s <= 2 * self.resend_interval_s:
            raise ValueError(f"alert.open_alert_ttl_s ({self.open_alert_ttl_s:g}) must be more than twice "
                             f"alert.resend_interval_s ({self.resend_interval_s:g}): an open alert would end "
                             "between two re-sends")
        return self


class LabConfig(_Strict):
    """`sentinel lab`: a local Flink standalone cluster running real failure scenarios."""

    flink_version: str = Field("2.3.0", description="apache-flink from PyPI; each version in its own virtualenv, "
                                                   "its own cluster folder (<state_dir>/flink-<version>).")
    flink_venv: LocalPath | None = Field(None, description="Virtualenv the lab creates for apache-flink (its "
                                                           "dependencies clash with the main one); default .venv-flink "
                                                           "for the default version, .venv-flink-<version> for others.")
    rest_port: int = Field(18081, ge=1, le=65535, description="The lab cluster's REST port (on loopback).")
    rpc_port: int = Field(16123, ge=1, le=65535, description="The lab cluster's RPC port (on loopback).")
    taskmanager_slots: int = Field(8, ge=2, description="Slots of the lab's TaskManager: a grid runs jobs side "
                                                         "by side while their parallelism fits.")
    jobmanager_memory: str = Field("1024m", description="The lab JobManager's process memory.")
    taskmanager_memory: str = Field("4096m", description="The lab TaskManager's process memory.")
    taskmanager_metaspace: str = Field("1024m", description="The TaskManager's JVM metaspace: every PyFlink job loads "
                                                            "its classes again, and Flink's 256m default runs out "
                                                            "after about ten jobs on one TaskManager.")
    startup_timeout_s: float = Field(90.0, gt=0, description="How long to wait for the lab cluster to start.")
    datasets_dir: LocalPath | None = Field(None, description="Where lab runs are recorded (default <state_dir>/lab).")
    corpus_dir: LocalPath | None = Field(None, description="The real-Flink corpus (default: data/lab of the checkout): "
                                                           "`sentinel lab --grid` records into it, `sentinel train` "
                                                           "trains on it.")

    @classmethod
    def default_venv(cls, version: str) -> Path:
        default = cls.model_fields["flink_version"].default
        return Path(".venv-flink" if version == default else f".venv-flink-{version}")
