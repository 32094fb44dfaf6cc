"""The incident policy's settings: the configured defaults and what the operator knows per job.

:class:`PolicySettings` is the policy's view of ``detection`` (and the idle timeout);
:meth:`PolicySettings.for_job` resolves one job's warm-up horizon, state limit, warning horizon and
muted families from the first matching ``job_overrides`` entry (a glob on the job name).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase

from models.post_rule import DEFAULT_WARMUP_HORIZON_S


@dataclass(frozen=True)
class JobOverride:
    """What the operator knows about the jobs whose name matches ``job_name`` (a glob)."""

    job_name: str
    warmup_horizon_s: float | None = None
    state_limit_bytes: int | None = None
    mute: tuple[str, ...] = ()
    warning_horizon_s: float | None = None


@dataclass(frozen=True)
class JobSettings:
    warmup_horizon_s: float
    state_limit_bytes: int | None
    mute: tuple[str, ...]
    warning_horizon_s: float = 900.0


@dataclass(frozen=True)
class PolicySettings:
    resolve_after_ms: int = 600_000
    eta_change_ratio: float = 0.25
    critical_eta_s: float = 3600.0
    state_limit_bytes: int | None = None
    forget_after_ms: int = 1_800_000  # a job back after this long, with nothing open, starts afresh
    warmup_horizon_s: float = DEFAULT_WARMUP_HORIZON_S
    job_overrides: tuple[JobOverride, ...] = field(default=())
    eta_change_min_ms: int = 300_000
    min_update_interval_ms: int = 300_000
    warning_horizon_s: float = 900.0
    predict_failures: bool = True
    _resolved: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # job name -> JobSettings

    @classmethod
    def from_config(cls, config) -> "PolicySettings":
        detection = config.detection
        overrides = tuple(JobOverride(o.job_name, o.warmup_horizon_s, o.state_limit_bytes, tuple(o.mute),
                                      o.warning_horizon_s) for o in detection.job_overrides)
        return cls(int(detection.resolve_after_s * 1000), detection.eta_change_ratio, detection.critical_eta_s,
                   detection.state_limit_bytes, config.features.idle_timeout_ms, detection.warmup_horizon_s, overrides,
                   eta_change_min_ms=int(detection.eta_change_min_s * 1000),
                   min_update_interval_ms=int(detection.min_update_interval_s * 1000),
                   warning_horizon_s=detection.warning_horizon_s, predict_failures=detection.predict_failures)

    def for_job(self, job_name: str | None) -> JobSettings:
        """The settings of one job: the first matching override, over the defaults."""
        name = job_name or ""
        resolved = self._resolved.get(name)
        if resolved is None:
            if len(self._resolved) > 65536:
                self._resolved.clear()
            resolved = self._resolved[name] = job_settings_of(self, name)
        return resolved

    def without_predictions(self) -> "PolicySettings":
        """These settings with no predicted incidents: the decisions of the detectors (or of the
        static alarms) alone."""
        return replace(self, predict_failures=False, _resolved={})

    def with_overrides(self, overrides) -> "PolicySettings":
        """These settings with ``overrides`` tried before the configured ones."""
        return replace(self, job_overrides=tuple(overrides) + self.job_overrides, _resolved={})


def job_settings_of(settings: PolicySettings, job_name: str) -> JobSettings:
    for override in settings.job_overrides:
        if fnmatchcase(job_name, override.job_name):
            return JobSettings(
                override.warmup_horizon_s if override.warmup_horizon_s is not None else settings.warmup_horizon_s,
                override.state_limit_bytes if override.state_limit_bytes is not None else settings.state_limit_bytes,
                override.mute,
                override.warning_horizon_s if override.warning_horizon_s is not None else settings.warning_horizon_s)
    return JobSettings(settings.warmup_horizon_s, settings.state_limit_bytes, (), settings.warning_horizon_s)
