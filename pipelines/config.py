"""The one typed configuration of checkpoint-sentinel.

Every path, topic, URI, trigger and threshold lives here, not in code. Values come from, in order
of precedence: ``SENTINEL_...`` environment variables, a YAML file (``--config``, ``$SENTINEL_CONFIG``
or ``./sentinel.yaml`` when present), then the defaults below, which point at the embedded stack.

Environment overrides name a key path with double underscores: ``SENTINEL_KAFKA__BOOTSTRAP_SERVERS``
sets ``kafka.bootstrap_servers``; values are parsed as YAML scalars or flow collections, so
``SENTINEL_KAFKA__CLIENT_OPTIONS='{security_protocol: SASL_SSL}'`` works (a mapping merges into the
file's mapping key by key). Unknown keys, in the file
or in the environment, are errors that name the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Mapping

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError, create_model,
                      field_validator, model_validator)

from pipelines.families import REGISTRY, FamilyName
from pipelines.io.storage import Location, is_uri, local_only, normalize

ENV_PREFIX = "SENTINEL_"
# Variables with the prefix that are not key paths.
ENV_RESERVED = {"SENTINEL_CONFIG"}
DEFAULT_CONFIG_FILE = "sentinel.yaml"
# The checkout the package runs from (an editable install): where the committed corpus lives.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and what is wrong."""


class _Strict(BaseModel):
    # Numbers are accepted for string keys because environment values are parsed as YAML.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)


def _local_path(value: Any) -> Any:
    return local_only(value, "this key") if isinstance(value, str) else value


def _storage_location(value: Any) -> Any:
    # A URI is checked here, so its error names the key; a relative path is made absolute by resolved().
    if isinstance(value, Path):
        return str(value)
    return normalize(value, Path.cwd()) if isinstance(value, str) and is_uri(value) else value


# A path on this host (a file:// URI is one too): PID files, logs, a Prometheus text file, certificates.
LocalPath = Annotated[Path, BeforeValidator(_local_path)]
# A folder on local disk or on shared storage (s3://, gs://, hdfs://, abfs(s)://), for Spark and the
# job's own files alike (pipelines/io/storage.py).
StorageLocation = Annotated[str, BeforeValidator(_storage_location)]


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
_SECRET_WORDS = ("password", "secret", "jaas", "token")


def _secret_key(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_WORDS)


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
        15.0, gt=0, description="How long to wait for the broker, or a topic's metadata, before failing."
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


class SparkConfig(_Strict):
    master: str = Field("local[2]", description="Spark's master when `sentinel` starts Spark itself; under "
                                                 "spark-submit (infra/spark_submit_main.py) its --master wins.")
    app_name: str = Field("checkpoint-sentinel", description="Spark's application name.")
    checkpoint_location: StorageLocation | None = Field(
        None, description="Root folder, a path or a URI (s3://, gs://, hdfs://; default <state_dir>/checkpoints); "
                          "each query checkpoints in its own sub-folder named after it, the detection query's "
                          "incident policy state beside it.",
    )
    trigger_interval: str = Field("5 seconds", description="Processing-time trigger of the live job.")
    shuffle_partitions: int = Field(2, ge=1, description="Partitions of the detection's state: the cores it "
                                                         "runs on (each partition costs a task per micro-batch, "
                                                         "so more than the cores only slows a batch). Fixed by "
                                                         "the checkpoint once it runs (the state buckets are "
                                                         "spread over the checkpoint's).")
    driver_memory: str = Field("2g", description="The driver's memory when `sentinel` starts Spark itself.")
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = Field("WARN", description="Spark's log level.")
    ui_enabled: bool = Field(False, description="Serve Spark's web UI.")
    extra_conf: dict[str, str] = Field(default_factory=dict, description="Any other spark.* settings.")


# One key per family of the registry (pipelines/families.py), its default the family's model_name.
ModelNames = create_model(
    "ModelNames", __base__=_Strict, __module__=__name__, __doc__="The registered model of each family's detector.",
    **{f.name: (str, Field(f.model_name, description=f"The registered model of the {f.name} detector."))
       for f in REGISTRY})


class MlflowConfig(_Strict):
    tracking_uri: str | None = Field(
        None, description="Defaults to the embedded sqlite store under the state folder."
    )
    registry_uri: str | None = Field(None, description="Defaults to the tracking URI.")
    artifact_root: str | None = Field(
        None, description="Where the experiment keeps its artifacts (the models): a path or a URI (file://, s3://, "
                          "mlflow-artifacts:/ of a tracking server that serves them). Set on the experiment when "
                          "`sentinel train` creates it. Defaults to <state_dir>/mlflow/artifacts for a local store; "
                          "with an http(s) tracking URI, to the server's own default.")
    experiment: str = Field("checkpoint-sentinel", description="The MLflow experiment `sentinel train` logs to.")
    models: ModelNames = Field(default_factory=ModelNames, description="Registered model name of each family's "
                                                                       "detector.")
    alias: str = Field("champion", description="The alias the job loads and follows; the gate moves it.")

    @property
    def tracking_server(self) -> bool:
        """True when MLflow is reached over HTTP (a tracking server), not a store opened in-process."""
        return (self.tracking_uri or "").lower().startswith(("http://", "https://"))


class FeaturesConfig(_Strict):
    offline_path: StorageLocation | None = Field(None, description="Root of the Parquet offline store, a path or "
                                                                   "a URI (default <state_dir>/feature_store).")
    lateness_s: float = Field(10.0, ge=0, description="How far behind its job's latest event (event time) an event "
                                                     "may arrive and still be used; above the collector's poll "
                                                     "interval, which is how late it reports a checkpoint. Nothing "
                                                     "waits for it: events are used as they arrive.")
    max_source_delay_s: float = Field(300.0, gt=0, description="How far behind the newest event of the whole input "
                                                               "an event may arrive (clock skew, a collector behind "
                                                               "the others) before it is late; also how long "
                                                               "after its idle timeout a silent job is forgotten.")
    idle_timeout_s: float = Field(1800.0, gt=0, description="A job silent this long (event time) is forgotten.")

    @property
    def watermark_delay(self) -> str:
        """Spark's watermark delay: the sources' delay, and never less than the allowed lateness."""
        return f"{int(max(self.max_source_delay_s, self.lateness_s) * 1000)} milliseconds"

    @property
    def idle_timeout_ms(self) -> int:
        return int(self.idle_timeout_s * 1000)


class JobOverride(_Strict):
    """What the operator knows about some jobs; the first entry whose glob matches the job name wins."""

    job_name: str = Field(..., min_length=1, description="A glob on the Flink job name, e.g. 'sessions-*'.")
    warmup_horizon_s: float | None = Field(None, gt=0, description="How long after a (re)start this job's state "
                                                                   "may grow healthily (its longest window or TTL).")
    state_limit_bytes: int | None = Field(None, ge=1, description="A hard limit for this job's state, for forecasts.")
    mute: list[FamilyName] = Field(
        default_factory=list, description="Families that never open an incident for these jobs.")


class DetectionConfig(_Strict):
    """The live job's scoring and incident policy (`sentinel run`, `sentinel replay`, `sentinel evaluate`)."""

    model_refresh_s: float = Field(60.0, gt=0, description="How often the job re-reads the model aliases.")
    resolve_after_s: float = Field(600.0, ge=0, description="Event time a condition must stay clear before "
                                                           "its incident is resolved.")
    eta_change_ratio: float = Field(0.25, gt=0, description="A forecast ETA that moves by more than this share "
                                                           "updates the incident.")
    critical_eta_s: float = Field(3600.0, gt=0, description="A leak reaching its limit sooner is critical.")
    state_limit_bytes: int | None = Field(None, ge=1, description="Limit for forecasts when a job reports none "
                                                                  "(max_state_size_bytes wins).")
    warmup_horizon_s: float = Field(180.0, gt=0, description="How long after a job starts or restarts its state may "
                                                            "grow healthily; steady growth beyond it is a leak even "
                                                            "with no limit in sight (growth after a plateau is "
                                                            "judged at once).")
    job_overrides: list[JobOverride] = Field(default_factory=list, description="Per-job warm-up horizon, state "
                                                                               "limit and muted families.")
    max_future_s: float = Field(300.0, gt=0, description="Events further in the future than this are rejected.")
    state_buckets: int = Field(64, ge=1, description="The buckets Flink jobs are hashed into in Spark's state store "
                                                     "(each costs a little per micro-batch; a few per shuffle "
                                                     "partition at least). Changing it makes every job start "
                                                     "afresh once.")
    state_cache_jobs: int = Field(10_000, ge=0, description="Flink job states each Python worker keeps parsed "
                                                            "between micro-batches (about 50 KB each), read from "
                                                            "Spark's state store only when another worker wrote them "
                                                            "last; 0: always read.")
    keep_workers_warm_s: float | None = Field(30.0, gt=0, lt=60, description="While no micro-batch has read input "
                                              "for this long, `sentinel run` has its Python workers load the "
                                              "champions again, so that Spark, which stops a Python worker idle "
                                              "for a minute, keeps them (a new worker loads the models for 8-15 s "
                                              "while the first events after the pause wait); null: never.")
    gx_sample_rows: int = Field(2000, ge=1, description="Input rows sampled per Great Expectations validation.")
    gx_min_interval_s: float = Field(30.0, ge=0, description="At most one input validation this often "
                                                             "(it runs beside the job, off its critical path).")
    dead_letter_value_bytes: int = Field(32_768, ge=0, le=262_144, description="At most this many of an unusable "
                                         "record's bytes go into its dead letter (with the size and SHA-256 of the "
                                         "whole), so that no dead letter is refused for its size.")
    dead_letter_spool: LocalPath | None = Field(None, description="Where dead letters wait until the dead-letter "
                                                "topic takes them (default <state_dir>/dead_letter_spool): a topic "
                                                "that is down or missing holds back neither incidents nor batches.")
    metrics_file: LocalPath | None = Field(None, description="Prometheus text file (default "
                                                             "<state_dir>/metrics/sentinel.prom).")
    metrics_host: str = Field("127.0.0.1", description="Where `sentinel run` serves /metrics for Prometheus.")
    metrics_port: int | None = Field(9464, ge=0, le=65535, description="Its port (0: any free one; null: off).")


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


def _http_url(value: str) -> str:
    """A base URL of an HTTP API, without its trailing slash."""
    if not re.fullmatch(r"https?://[^/\s]+(/.*)?", value):
        raise ValueError(f"'{value}' is not an http(s):// URL")
    return value.rstrip("/")


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


class SentinelConfig(_Strict):
    state_dir: LocalPath = Field(Path(".sentinel"), description="Project-local state: logs, PIDs, stores.")
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    topics: TopicsConfig = Field(default_factory=TopicsConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig)
    detection: DetectionConfig = Field(default_factory=DetectionConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    stack: StackConfig = Field(default_factory=StackConfig)
    collector: CollectorConfig = Field(default_factory=CollectorConfig)
    alert: AlertConfig = Field(default_factory=AlertConfig)
    lab: LabConfig = Field(default_factory=LabConfig)

    def resolved(self, base_dir: Path) -> "SentinelConfig":
        """Make relative paths absolute against ``base_dir`` and fill the derived defaults."""
        cfg = self.model_copy(deep=True)
        cfg.state_dir = _absolute(cfg.state_dir, base_dir)
        cfg.spark.checkpoint_location = normalize(cfg.spark.checkpoint_location or cfg.state_dir / "checkpoints",
                                                  base_dir)
        cfg.features.offline_path = normalize(cfg.features.offline_path or cfg.state_dir / "feature_store", base_dir)
        cfg.detection.dead_letter_spool = _absolute(cfg.detection.dead_letter_spool or cfg.state_dir /
                                                    "dead_letter_spool", base_dir)
        cfg.detection.metrics_file = _absolute(cfg.detection.metrics_file or cfg.state_dir / "metrics" / "sentinel.prom",
                                               base_dir)
        cfg.collector.state_dir = normalize(cfg.collector.state_dir or cfg.state_dir / "collector", base_dir)
        security = cfg.kafka.security
        for key in security.FILE_KEYS:
            if getattr(security, key) is not None:
                setattr(security, key, _absolute(getattr(security, key), base_dir))
        cfg.lab.flink_venv = _absolute(cfg.lab.flink_venv or LabConfig.default_venv(cfg.lab.flink_version), base_dir)
        cfg.lab.datasets_dir = _absolute(cfg.lab.datasets_dir or cfg.state_dir / "lab", base_dir)
        cfg.lab.corpus_dir = _absolute(cfg.lab.corpus_dir or PROJECT_ROOT / "data" / "lab", base_dir)
        mlflow_dir = cfg.state_dir / "mlflow"
        if cfg.mlflow.tracking_uri is None:
            cfg.mlflow.tracking_uri = f"sqlite:///{mlflow_dir / 'mlflow.db'}"
        if cfg.mlflow.artifact_root is None and not cfg.mlflow.tracking_server:
            # Without this, MLflow puts a database store's artifacts in ./mlruns of whatever
            # folder the command ran in.
            cfg.mlflow.artifact_root = str(mlflow_dir / "artifacts")
        if cfg.mlflow.artifact_root is not None and not is_uri(cfg.mlflow.artifact_root):
            cfg.mlflow.artifact_root = _absolute(Path(cfg.mlflow.artifact_root), base_dir).as_uri()
        if cfg.mlflow.registry_uri is None:
            cfg.mlflow.registry_uri = cfg.mlflow.tracking_uri
        return cfg

    def location(self, value: str | Path) -> Location:
        """A configured folder as a :class:`~pipelines.io.storage.Location`, reached with ``storage``."""
        return Location.of(value, self.storage)

    def checkpoint_dir(self, query_name: str) -> Location:
        """Each streaming query gets its own checkpoint folder: sharing one corrupts both."""
        return self.location(self.spark.checkpoint_location) / query_name

    @property
    def offline_store(self) -> Location:
        return self.location(self.features.offline_path)


def _absolute(path: Path, base_dir: Path) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else (base_dir / path).resolve()


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Turn ``SENTINEL_A__B=value`` variables into a nested dict ``{"a": {"b": value}}``."""
    overrides: dict[str, Any] = {}
    names: list[str] = []
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_RESERVED:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split("__")]
        if not all(path):
            raise ConfigError(f"{name}: an empty key in the path (use single names joined by '__')")
        try:
            # A secret is taken as it is: as YAML, "no" would become False and "0x1F" a number.
            value = raw if _secret_key(path[-1]) and not path[-1].endswith("_file") else (
                yaml.safe_load(raw) if raw.strip() else None)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{name}: not a valid YAML value ({exc})") from exc
        node = overrides
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: conflicts with another SENTINEL_ variable")
        node[path[-1]] = value
        names.append(name)
    return overrides, names


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _format_validation_error(exc: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration ({origin}):"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "<root>"
        if error["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see pipelines/config.py for the keys)"
        else:
            message = error["msg"]
            if "input" in error and not isinstance(error["input"], dict) and not _secret_key(key):
                message += f" (got {error['input']!r})"
        lines.append(f"  {key}: {message}")
    return "\n".join(lines)


def load_config(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> SentinelConfig:
    """Load the YAML file (if any), apply environment overrides, validate and resolve paths.

    ``path`` None means ``$SENTINEL_CONFIG``, else ``./sentinel.yaml`` if it exists, else defaults only.
    Relative paths in the config are resolved against the config file's folder (or the current
    folder when there is no file). Raises :class:`ConfigError` with every offending key.
    """
    environ = os.environ if environ is None else environ
    explicit = path or environ.get("SENTINEL_CONFIG")
    file_path: Path | None = None
    if explicit:
        file_path = Path(explicit).expanduser()
        if not file_path.is_file():
            raise ConfigError(f"config file {file_path} does not exist")
    elif Path(DEFAULT_CONFIG_FILE).is_file():
        file_path = Path(DEFAULT_CONFIG_FILE)

    data: dict[str, Any] = {}
    origins = []
    if file_path is not None:
        try:
            loaded = yaml.safe_load(file_path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file_path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {file_path} must hold a mapping of keys, not {type(loaded).__name__}")
        data = loaded
        origins.append(str(file_path))
    overrides, env_names = _env_overrides(environ)
    if env_names:
        origins.append("environment: " + ", ".join(env_names))
    data = _deep_merge(data, overrides)
    origin = "; ".join(origins) or "defaults"
    try:
        config = SentinelConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, origin)) from None
    if base_dir is None:
        base_dir = file_path.resolve().parent if file_path is not None else Path.cwd()
    resolved = config.resolved(base_dir)
    if missing := resolved.kafka.security.missing_files():
        raise ConfigError(f"invalid configuration ({origin}):\n  " + "\n  ".join(missing))
    return resolved
