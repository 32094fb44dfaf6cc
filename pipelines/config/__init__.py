"""The one typed configuration of checkpoint-sentinel (pydantic, unknown keys rejected).

Every path, topic, URI, trigger and threshold lives here, not in code; ``load_config`` reads
``SENTINEL_...`` variables, then a YAML file, then the defaults (``loading``). Sections by what
they configure: ``kafka`` (brokers, security, topics), ``detection`` (Spark, MLflow, features, the
incident policy), ``services`` (storage, the embedded stack, collector, alert relay, lab);
``base`` holds what they share. Part of the foundation layer: imports only pydantic, yaml and
pipelines.io/families. Every name is re-exported here, the import path the code uses.
"""

from pipelines.config.base import ConfigError, LocalPath, StorageLocation
from pipelines.config.detection import (DetectionConfig, FeaturesConfig, JobOverride, MlflowConfig,
                                        ModelNames, SparkConfig)
from pipelines.config.kafka import (SECRET_CLIENT_OPTIONS, SECURITY_CLIENT_OPTIONS, KafkaConfig,
                                    KafkaSecurityConfig, TopicsConfig)
from pipelines.config.loading import (DEFAULT_CONFIG_FILE, ENV_PREFIX, ENV_RESERVED, PROJECT_ROOT, SentinelConfig,
                                      load_config)
from pipelines.config.services import (AlertConfig, CollectorConfig, FlinkClusterEndpoint, HttpClientSecurity,
                                       LabConfig, StackConfig, StorageConfig)

__all__ = ["AlertConfig", "CollectorConfig", "ConfigError", "DEFAULT_CONFIG_FILE", "DetectionConfig", "ENV_PREFIX",
           "ENV_RESERVED", "FeaturesConfig", "FlinkClusterEndpoint", "HttpClientSecurity", "JobOverride", "KafkaConfig", "KafkaSecurityConfig",
           "LabConfig", "LocalPath", "MlflowConfig", "ModelNames", "PROJECT_ROOT", "SECRET_CLIENT_OPTIONS",
           "SECURITY_CLIENT_OPTIONS", "SentinelConfig", "SparkConfig", "StackConfig", "StorageConfig",
           "StorageLocation", "TopicsConfig", "load_config"]
