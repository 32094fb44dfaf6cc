"""Storage by URI: the job's own files on the same storage as Spark's checkpoints.

A location is a local path or a URI (``s3://bucket/sentinel``, ``gs://...``, ``hdfs://nn:8020/...``,
``abfss://container@account.dfs.core.windows.net/...``). Spark reaches it through Hadoop's
filesystems (``s3`` becomes ``s3a``, Hadoop's S3 client; its jars come with the Spark deployment),
and the job's own files (the policy state beside the checkpoints, the live feature log, the offline
store's markers, the collector's ledger) go through ``pyarrow.fs`` with the same settings
(``storage`` in the config). Credentials are not in the config: both sides take them from the
filesystem's standard chain (``AWS_*`` variables, profiles and instance roles; Google's application
default credentials; Hadoop's own configuration for HDFS).

>>> loc = Location.of("/var/lib/sentinel/checkpoints") / "detection"
>>> loc.uri, loc.spark_path, loc.is_local
('/var/lib/sentinel/checkpoints/detection', '/var/lib/sentinel/checkpoints/detection', True)
>>> remote = Location.of("s3://fleet-state/sentinel/") / "checkpoints"
>>> remote.uri, remote.spark_path, remote.is_local
('s3://fleet-state/sentinel/checkpoints', 's3a://fleet-state/sentinel/checkpoints', False)
>>> normalize("file:///srv/x%20y", base_dir=Path("/"))
'/srv/x y'
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

from pipelines.errors import SetupError

# What a location may start with: scheme -> (pyarrow.fs's scheme, Hadoop's scheme for Spark).
SCHEMES: dict[str, tuple[str, str]] = {
    "file": ("file", "file"),
    "s3": ("s3", "s3a"),
    "s3a": ("s3", "s3a"),
    "gs": ("gs", "gs"),
    "hdfs": ("hdfs", "hdfs"),
    "abfs": ("abfs", "abfs"),
    "abfss": ("abfss", "abfss"),
}


class StorageError(SetupError, OSError):
    """A location cannot be read or written; the message names it and what to check."""


class StorageSettings(Protocol):
    """What reaching a store needs beyond its URI (``pipelines.config.StorageConfig``)."""

    s3_endpoint_url: str | None
    s3_region: str | None


def is_uri(value: str) -> bool:
    """``s3://b/x``, ``file:///x``, ``mlflow-artifacts:/x``; not a path (a Windows drive is no scheme)."""
    scheme, sep, _ = value.partition(":")
    return bool(sep) and len(scheme) > 1 and scheme.replace("-", "").replace("+", "").replace(".", "").isalnum()


def normalize(value: str | Path, base_dir: Path) -> str:
    """A location as the config keeps it: an absolute local path, or a URI of a supported scheme.

    Raises ValueError (which the config reports with the key) for another scheme."""
    text = str(value).strip()
    if not is_uri(text):
        path = Path(text).expanduser()
        return str(path if path.is_absolute() else (base_dir / path).resolve())
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"'{text}': the scheme {scheme}:// is not supported here; use a local path or one of "
                         + ", ".join(f"{s}://" for s in SCHEMES))
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"'{text}': a file:// URI names a path on this host (file:///path), not on "
                             f"'{parts.netloc}'")
        return normalize(unquote(parts.path), base_dir)
    if not parts.netloc:
        raise ValueError(f"'{text}' names no bucket or host ({scheme}://<bucket-or-host>/<path>)")
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def local_only(value: str | Path, what: str) -> Path:
    """A path that must be on this host (a PID file, a Prometheus text file): a path or a file:// URI."""
    text = str(value)
    if is_uri(text):
        scheme = text.partition(":")[0].lower()
        if scheme != "file":
            raise ValueError(f"'{text}': {what} must be on this host; give a local path or a file:// URI")
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"'{text}': a file:// URI names a path on this host (file:///path)")
        return Path(unquote(parts.path))
    return Path(text)


@dataclass(frozen=True)
class Location:
    """A file or folder on local disk or on remote storage; ``/`` joins names as for a Path."""

    uri: str
    settings: StorageSettings | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, value: "str | Path | Location", settings: StorageSettings | None = None) -> "Location":
        if isinstance(value, Location):
            return value if settings is None else Location(value.uri, settings)
        return cls(normalize(value, Path.cwd()), settings)

    def __truediv__(self, name: str) -> "Location":
        return Location(f"{self.uri.rstrip('/')}/{name}", self.settings)

    def __str__(self) -> str:
        return self.uri

    @property
    def scheme(self) -> str:
        return self.uri.partition("://")[0] if "://" in self.uri else "file"

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def spark_path(self) -> str:
        """The same place as Spark's Hadoop filesystems name it (``s3://`` is ``s3a://`` there)."""
        if self.is_local:
            return self.uri
        return f"{SCHEMES[self.scheme][1]}://{self.uri.partition('://')[2]}"

    def local_path(self) -> Path:
        if not self.is_local:
            raise StorageError(f"{self.uri} is not on this host; this use needs a local path")
        return Path(self.uri)

    # --- through pyarrow.fs ----------------------------------------------------------------------

    def arrow(self):
        """``(pyarrow filesystem, path in it)``, e.g. for ``pyarrow.parquet.write_table(filesystem=...)``."""
        if self.is_local:
            from pyarrow import fs

            return fs.LocalFileSystem(), self.uri
        return _remote_filesystem(self.uri, self.settings), _path_in_filesystem(self.uri)

    def exists(self) -> bool:
        from pyarrow import fs

        return self._info().type != fs.FileType.NotFound

    def is_dir(self) -> bool:
        from pyarrow import fs

        return self._info().type == fs.FileType.Directory

    def names(self) -> list[str]:
        """Names of what the folder holds (none when it does not exist)."""
        from pyarrow import fs

        filesystem, path = self.arrow()
        infos = self._call("list", lambda: filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True)))
        return sorted(info.base_name for info in infos)

    def read_bytes(self) -> bytes:
        filesystem, path = self.arrow()

        def read() -> bytes:
            with filesystem.open_input_stream(path) as stream:
                return stream.read()

        return self._call("read", read)

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def write_bytes(self, data: bytes) -> None:
        """Replace the file whole: a reader sees the old content or the new, never a part."""
        if self.is_local:
            path = self.local_path()
            temporary = path.with_name(path.name + ".tmp")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(temporary, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, path)
            except OSError as exc:
                raise StorageError(f"cannot write {self.uri}: {exc}") from exc
            return
        # An object store's PUT is atomic already; a rename there would be a copy.
        filesystem, path = self.arrow()

        def write() -> None:
            with filesystem.open_output_stream(path) as stream:
                stream.write(data)

        self._call("write", write)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    def delete(self) -> None:
        """Delete the file if it is there."""
        if not self.exists():
            return
        filesystem, path = self.arrow()
        self._call("delete", lambda: filesystem.delete_file(path))

    def delete_tree(self) -> None:
        """Delete the folder and everything in it, if it is there."""
        if not self.exists():
            return
        filesystem, path = self.arrow()
        self._call("delete", lambda: filesystem.delete_dir(path))

    def make_dirs(self) -> None:
        filesystem, path = self.arrow()
        self._call("create", lambda: filesystem.create_dir(path, recursive=True))

    def _info(self):
        filesystem, path = self.arrow()
        return self._call("reach", lambda: filesystem.get_file_info(path))

    def _call(self, verb: str, action):
        try:
            return action()
        except StorageError:
            raise
        except (OSError, RuntimeError) as exc:  # pyarrow raises OSError, ArrowException (a RuntimeError) too
            hint = "" if self.is_local else (
                "; check storage.s3_endpoint_url / storage.s3_region and the AWS credentials (AWS_* variables, "
                "a profile or an instance role)" if SCHEMES[self.scheme][0] == "s3" else
                "; check that this host can reach it with its credentials")
            raise StorageError(f"cannot {verb} {self.uri}: {exc}{hint}") from exc


def probe(folder: Location) -> str:
    """Write, read back and delete a small file in ``folder``: what the job will do there."""
    import time
    import uuid

    started = time.monotonic()
    marker = folder / f"_sentinel-probe-{uuid.uuid4().hex[:8]}"
    payload = uuid.uuid4().hex.encode()
    marker.write_bytes(payload)
    try:
        if marker.read_bytes() != payload:
            raise StorageError(f"{marker.uri} did not read back what was written")
    finally:
        marker.delete()
    return f"{folder.uri}: write, read, delete OK in {time.monotonic() - started:.2f}s"


_FILESYSTEMS: dict[tuple, object] = {}
_FILESYSTEMS_LOCK = threading.Lock()


def _path_in_filesystem(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    if SCHEMES[scheme][0] in ("s3", "gs"):
        return rest  # bucket/key
    parts = urlsplit(uri)
    if scheme in ("abfs", "abfss"):  # <container>@<account>.dfs.core.windows.net/<path>: container/path
        return parts.netloc.split("@", 1)[0] + parts.path
    return parts.path


def _remote_filesystem(uri: str, settings: StorageSettings | None):
    """One pyarrow filesystem per store and settings (making one resolves credentials)."""
    from pyarrow import fs

    parts = urlsplit(uri)
    arrow_scheme = SCHEMES[parts.scheme][0]
    endpoint = getattr(settings, "s3_endpoint_url", None)
    region = getattr(settings, "s3_region", None)
    key = (arrow_scheme, parts.netloc if arrow_scheme not in ("s3", "gs") else "", endpoint, region)
    with _FILESYSTEMS_LOCK:
        if key not in _FILESYSTEMS:
            try:
                if arrow_scheme == "s3":
                    options: dict = {}
                    if endpoint:
                        endpoint_parts = urlsplit(endpoint)
                        options.update(endpoint_override=endpoint_parts.netloc or endpoint,
                                       scheme=endpoint_parts.scheme or "https")
                    if region:
                        options["region"] = region
                    _FILESYSTEMS[key] = fs.S3FileSystem(**options)
                elif arrow_scheme == "gs":
                    _FILESYSTEMS[key] = fs.GcsFileSystem()
                else:
                    _FILESYSTEMS[key] = fs.FileSystem.from_uri(f"{parts.scheme}://{parts.netloc}/")[0]
            except (OSError, RuntimeError) as exc:
                raise StorageError(f"cannot open {uri}: {exc}"
                                   + ("; pyarrow reaches HDFS through libhdfs (set ARROW_LIBHDFS_DIR, HADOOP_HOME "
                                      "and CLASSPATH as for the Hadoop client)" if arrow_scheme == "hdfs" else "")
                                   ) from exc
        return _FILESYSTEMS[key]
