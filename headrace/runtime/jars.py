"""The Spark packages (jars) connectors need, and how a session gets them.

A connector lists the Maven packages it needs (``spark_packages()``, for example Spark's Kafka
connector at the installed pyspark's version). When headrace starts Spark's session it adds
them in one of two ways:

* **a folder of fetched jars** (``HEADRACE_JARS_DIR``, by default ``~/.cache/headrace/jars``,
  filled by ``scripts/fetch_jars.sh``, whose ``jars.txt`` lists the packages it holds): when
  it holds every package needed, its jars go to ``spark.jars``; nothing is downloaded;
* otherwise **Spark's own resolver**: ``spark.jars.packages`` with the packages' coordinates,
  downloaded from Maven Central (or the repositories ``spark.jars.repositories`` names) into
  Ivy's cache when the session starts, as a PySpark user elsewhere does.

A session that started without a package a source or sink needs (it was created before the
pipeline was known, for example) fails the run before the query starts, with one line naming
the package and both ways to get it (``require``).
"""

from __future__ import annotations

import functools
import os
import re
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from headrace import config
from headrace.errors import SetupError

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MANIFEST = "jars.txt"  # in the jars folder: "<coordinate> <jar file>" per line, written by scripts/fetch_jars.sh


def _spark_version() -> str:
    import pyspark

    return pyspark.__version__


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def matching_release(versions: list[str], spark_version: str) -> str:
    """The release of a Spark package to use with ``spark_version``: the same version when it
    is published, else the newest earlier one of the same major version (Maven Central can lag
    behind PyPI: pyspark 4.3.0's connectors were not there in November 2026, 4.2.0's work).

    >>> matching_release(["4.1.0", "4.2.0", "5.0.0"], "4.3.0"), matching_release(["4.3.0"], "4.3.0")
    ('4.2.0', '4.3.0')
    """
    releases = [v for v in versions if re.fullmatch(r"\d+(\.\d+)*", v)]
    if spark_version in releases or not re.fullmatch(r"\d+(\.\d+)*", spark_version):
        return spark_version
    wanted = _release(spark_version)
    earlier = [v for v in releases if _release(v)[0] == wanted[0] and _release(v) < wanted]
    return max(earlier, key=_release) if earlier else spark_version


@dataclass(frozen=True)
class Package:
    """A Spark package on Maven Central, released with Spark's own version numbers, and a class
    it holds (to tell whether a session has it)."""

    group: str
    artifact: str
    probe_class: str

    @property
    def name(self) -> str:
        return f"{self.group}:{self.artifact}"

    @functools.cached_property
    def coordinate(self) -> str:
        """group:artifact:version, the version matching the installed pyspark (``matching_release``;
        ``HEADRACE_SPARK_PACKAGE_VERSION`` overrides it)."""
        version = config.SPARK_PACKAGE_VERSION.get()
        if not version:
            url = f"{MAVEN_CENTRAL}/{self.group.replace('.', '/')}/{self.artifact}/maven-metadata.xml"
            try:
                with urllib.request.urlopen(url, timeout=10) as answer:
                    versions = re.findall(r"<version>([^<]+)</version>", answer.read().decode())
            except OSError:  # no network: Spark's resolver will say what it cannot find
                versions = []
            version = matching_release(versions, _spark_version())
        return f"{self.name}:{version}"


KAFKA = Package("org.apache.spark", "spark-sql-kafka-0-10_2.13", "org.apache.spark.sql.kafka010.KafkaSourceProvider")


def jars_dir() -> str:
    return os.path.expanduser(config.JARS_DIR.get())


def fetched() -> dict[str, list[str]]:
    """The packages of the jars folder: group:artifact -> its jar files (with their dependencies)."""
    folder = jars_dir()
    manifest = os.path.join(folder, MANIFEST)
    if not os.path.exists(manifest):
        return {}
    packages: dict[str, list[str]] = {}
    with open(manifest) as lines:
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and not parts[0].startswith("#") and os.path.exists(os.path.join(folder, parts[1])):
                name = parts[0].rsplit(":", 1)[0]
                packages.setdefault(name, []).append(os.path.join(folder, parts[1]))
    return packages


def session_settings(packages: Iterable[Package]) -> dict[str, str]:
    """The Spark settings that give a new session ``packages``: every jar of the fetched folder
    when it has them all, otherwise ``spark.jars.packages``. Empty when none are needed and
    nothing was fetched."""
    wanted = {p.name: p for p in packages}
    local = fetched()
    if local and all(name in local for name in wanted):
        files = sorted({f for jars in local.values() for f in jars})
        return {"spark.jars": ",".join(files)}
    return {"spark.jars.packages": ",".join(sorted(p.coordinate for p in wanted.values()))} if wanted else {}


def how_to_get(package: Package) -> str:
    return (f"run `bash scripts/fetch_jars.sh` (jars into {jars_dir()}), or let Spark fetch it: "
            f"spark.jars.packages={package.coordinate}")


def require(spark: Any, packages: Iterable[Package], who: str) -> None:
    """Raise one clear line when the session lacks a package ``who`` (a step) needs."""
    utils = spark.sparkContext._jvm.org.apache.spark.util.Utils
    for package in packages:
        if not utils.classIsLoadable(package.probe_class):
            raise SetupError(f"{who} needs the Spark package {package.coordinate}, which this Spark session "
                             f"does not have: {how_to_get(package)}")


def start_failure(exc: BaseException, settings: dict[str, str]) -> SetupError | None:
    """One line for a session that could not start because Spark's resolver could not fetch
    the packages (no network, a repository down); None for other failures."""
    text = str(exc)
    if "spark.jars.packages" not in settings or not any(
            marker in text for marker in ("unresolved dependency", "Ivy", "java.lang.RuntimeException: [")):
        return None
    coordinates = settings["spark.jars.packages"]
    return SetupError(f"Spark could not fetch the packages {coordinates} from Maven Central: run "
                      f"`bash scripts/fetch_jars.sh` on a machine that reaches it (jars into {jars_dir()}), "
                      "or choose the version with HEADRACE_SPARK_PACKAGE_VERSION")
