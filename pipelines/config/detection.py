"""The sections of the detection job: Spark, MLflow, features and the incident policy's ``detection``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, create_model

from pipelines.config.base import LocalPath, StorageLocation, _Strict
from pipelines.families import REGISTRY, FamilyName


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
    warning_horizon_s: float | None = Field(None, gt=0, description="How far ahead a forecast that checkpoints will "
                                                                    "fail is a warning for these jobs.")
    mute: list[FamilyName] = Field(
        default_factory=list, description="Families that never open an incident for these jobs.")


class DetectionConfig(_Strict):
    """The live job's scoring and incident policy (`sentinel run`, `sentinel replay`, `sentinel evaluate`)."""

    model_refresh_s: float = Field(60.0, gt=0, description="How often the job re-reads the model aliases.")
    resolve_after_s: float = Field(600.0, ge=0, description="Event time a condition must stay clear before "
                                                           "its incident is resolved.")
    eta_change_ratio: float = Field(0.25, gt=0, description="A forecast ETA that moves by more than this share "
                                                           "updates the incident.")
    eta_change_min_s: float = Field(300.0, ge=0, description="A forecast ETA update also needs a move of at "
                                                            "least this many seconds (a shrinking ETA moves by a "
                                                            "large share near its end).")
    min_update_interval_s: float = Field(300.0, ge=0, description="At most one forecast update per incident in "
                                                                 "this long (severity changes are always "
                                                                 "published).")
    critical_eta_s: float = Field(3600.0, gt=0, description="A leak reaching its limit sooner is critical.")
    warning_horizon_s: float = Field(900.0, gt=0, description="A forecast that checkpoints will exceed their "
                                                              "timeout within this long is a warning: the cause's "
                                                              "incident carries it and says so in its summary.")
    predict_failures: bool = Field(True, description="With no cause's incident open, a credible forecast that "
                                                     "checkpoints will exceed their timeout within the warning "
                                                     "horizon opens a predicted checkpoint_failure incident.")
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
