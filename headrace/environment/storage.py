"""The files headrace keeps beside a checkpoint, on a local disk or on a Hadoop file system.

A state dir is a local path (``.headrace``, ``/var/lib/app``), a ``file:`` URI, or the URI of
any file system Hadoop reaches (``hdfs://namenode:8020/state``, ``s3a://bucket/state``):

* a local path or a ``file:`` URI is read and written with Python's file functions, with no
  Spark session;
* any other URI goes through Hadoop's ``FileSystem`` API in the JVM of the process's Spark
  session (started with headrace's defaults when there is none yet), with that session's
  Hadoop configuration (``spark.hadoop.*`` settings, ``core-site.xml`` and ``hdfs-site.xml``
  under ``HADOOP_CONF_DIR``): whatever file system Spark's checkpoint can be on, these files
  can be too.

Paths are joined as strings, so a URI keeps its ``//`` (``pathlib`` would make
``hdfs:/namenode:8020/...`` of it). :func:`write_text` is atomic where the file system
allows it: the text goes to a temporary file that is then renamed over the target, locally
and on file systems whose renames are atomic (HDFS, and any that declares
``fs.capability.paths.atomic_rename``); on others, object stores above all (S3, GCS), whose
rename is a copy, the file is written in place, which such a store shows only whole, once
it is closed.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headrace.environment.state_paths import is_remote, join, local_path, scheme  # noqa: F401  (storage.join, ... too)
from headrace.errors import SetupError

ATOMIC_RENAME = "fs.capability.paths.atomic_rename"  # Hadoop's CommonPathCapabilities.FS_ATOMIC_RENAME
HDFS_SCHEMES = ("hdfs", "viewfs", "webhdfs", "swebhdfs")  # atomic renames, though HDFS does not declare them


# -- the operations ---------------------------------------------------------------------------------

def read_text(path: str) -> str:
    """The text of the file at ``path``; FileNotFoundError when there is none."""
    if not is_remote(path):
        return Path(local_path(path)).read_text()
    fs, target, spark = hadoop_file_system(path)
    with _java_errors("read", path):
        stream = fs.open(target)
        try:
            data = spark._jvm.org.apache.hadoop.io.IOUtils.readFullyToByteArray(stream)
        finally:
            stream.close()
    return bytes(data).decode()


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path``, creating its directory; atomic where the file system allows
    (written to a temporary file beside it, flushed to disk, then renamed over ``path``)."""
    if not is_remote(path):
        return _write_local(local_path(path), text)
    fs, target, spark = hadoop_file_system(path)
    jvm = spark._jvm
    with _java_errors("write", path):
        fs.mkdirs(target.getParent())
        if not _atomic_rename(path, fs, target.getParent()):
            return _write_hadoop(fs, target, text.encode(), overwrite=True)
        temporary = jvm.org.apache.hadoop.fs.Path(f"{path}.{uuid.uuid4().hex}.tmp")
        _write_hadoop(fs, temporary, text.encode(), overwrite=False)
        try:
            rename = jvm.org.apache.hadoop.fs.Options.Rename
            overwrite = spark.sparkContext._gateway.new_array(rename, 1)
            overwrite[0] = rename.OVERWRITE
            context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(fs.getUri(), fs.getConf())
            context.rename(temporary, target, overwrite)
        except BaseException:
            fs.delete(temporary, False)
            raise
    return None


def exists(path: str) -> bool:
    """Whether a file or directory is at ``path``."""
    if not is_remote(path):
        return os.path.exists(local_path(path))
    fs, target, _ = hadoop_file_system(path)
    with _java_errors("look for", path):
        return bool(fs.exists(target))


def is_dir(path: str) -> bool:
    """Whether a directory is at ``path``."""
    if not is_remote(path):
        return os.path.isdir(local_path(path))
    fs, target, _ = hadoop_file_system(path)
    try:
        with _java_errors("look for", path):
            return bool(fs.getFileStatus(target).isDirectory())
    except FileNotFoundError:
        return False


def list_names(path: str) -> list[str]:
    """The names of the entries of the directory ``path``; FileNotFoundError when there is none."""
    if not is_remote(path):
        return os.listdir(local_path(path))
    fs, target, _ = hadoop_file_system(path)
    with _java_errors("list", path):
        return [str(status.getPath().getName()) for status in fs.listStatus(target)]


def delete_tree(path: str) -> None:
    """Delete ``path`` and everything under it; nothing when it does not exist."""
    if not is_remote(path):
        shutil.rmtree(local_path(path), ignore_errors=True)
        return
    fs, target, _ = hadoop_file_system(path)
    with _java_errors("delete", path):
        fs.delete(target, True)


# -- local files ------------------------------------------------------------------------------------

def _write_local(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# -- Hadoop's file systems --------------------------------------------------------------------------

def _session() -> Any:
    from headrace.environment.session import get_session

    return get_session()


def hadoop_file_system(path: str) -> tuple[Any, Any, Any]:
    """Hadoop's ``FileSystem`` for ``path``, its ``Path`` and the Spark session they come from."""
    spark = _session()
    target = spark._jvm.org.apache.hadoop.fs.Path(path)
    with _java_errors("reach", path):
        fs = target.getFileSystem(spark._jsc.hadoopConfiguration())
    return fs, target, spark


def _atomic_rename(path: str, fs: Any, folder: Any) -> bool:
    if scheme(path) in HDFS_SCHEMES:
        return True
    try:
        return bool(fs.hasPathCapability(folder, ATOMIC_RENAME))
    except Exception:  # noqa: BLE001 - a file system that cannot say: written in place
        return False


def _write_hadoop(fs: Any, target: Any, data: bytes, *, overwrite: bool) -> None:
    out = fs.create(target, overwrite)
    try:
        out.write(bytearray(data))
        if out.hasCapability("hsync"):
            out.hsync()  # on the DataNodes' disks, as os.fsync does locally
    finally:
        out.close()


@contextmanager
def _java_errors(doing: str, path: str) -> Iterator[None]:
    """Hadoop's FileNotFoundException as Python's; any other Java error as one line naming the path."""
    from py4j.protocol import Py4JJavaError

    try:
        yield
    except Py4JJavaError as exc:
        java = exc.java_exception
        kind = str(java.getClass().getName())
        message = str(java.getMessage() or "").strip().splitlines()
        if "java.io.FileNotFoundException" in _class_names(java.getClass()):
            raise FileNotFoundError(f"{path}: {message[0] if message else 'not found'}") from None
        detail = f"{kind}: {message[0]}" if message else kind
        raise SetupError(f"cannot {doing} {path} through Hadoop's file system API: {detail}",
                         refusal=False) from None  # a remote file system's error: it may pass


def _class_names(java_class: Any) -> list[str]:
    """A Java class's name and its superclasses' (a file system may throw a subclass of
    FileNotFoundException)."""
    names = []
    while java_class is not None:
        names.append(str(java_class.getName()))
        java_class = java_class.getSuperclass()
    return names
