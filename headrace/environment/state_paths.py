"""Where a state dir is: a local path, a ``file:`` URI or a Hadoop URI; how its paths join;
the local folder of the run files of a remote one. Pure string work, no Spark, for the
modules below the session (``headrace/environment/storage.py`` reads and writes the files)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from headrace import config

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")


def scheme(path: str) -> str:
    """The URI scheme of ``path`` in lower case (``hdfs``, ``s3a``, ``file``); empty for a plain path.

    >>> scheme("hdfs://nn:8020/state"), scheme("file:///tmp/state"), scheme(".headrace"), scheme("a:b")
    ('hdfs', 'file', '', '')
    """
    match = _URI.match(path)
    return match.group(1).lower() if match else ""


def is_remote(path: str) -> bool:
    """Whether ``path`` is reached through Hadoop's file system API: a URI other than ``file:``."""
    return scheme(path) not in ("", "file")


def local_path(path: str) -> str:
    """The path on this machine of a plain path or a ``file:`` URI.

    >>> local_path("file:///tmp/my%20state"), local_path("state/p")
    ('/tmp/my state', 'state/p')
    """
    if scheme(path) == "file":
        return unquote(urlsplit(path).path)
    if is_remote(path):
        raise ValueError(f"{path!r} is not on this machine's file system")
    return path


def join(base: str, *parts: str) -> str:
    """``base`` and ``parts`` joined with ``/``; a plain path is joined as ``pathlib`` does.

    >>> join("hdfs://nn:8020/state/", "clicks", "checkpoint"), join("state", "clicks")
    ('hdfs://nn:8020/state/clicks/checkpoint', 'state/clicks')
    """
    if not scheme(base):
        return str(Path(base, *parts))
    return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])


def run_files_dir() -> str:
    """The local folder of the run files of pipelines whose state dir is remote."""
    setting = config.RUN_FILES_DIR.get().strip()
    folder = setting or os.path.join(config.CACHE_DIR.get(), "run")
    return os.path.abspath(os.path.expanduser(folder))
