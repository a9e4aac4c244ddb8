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


def _maven_versions(group: str, artifact: str) -> list[str]:
    """The versions Maven Central lists for group:artifact; empty without network (Spark's
    resolver then says what it cannot find)."""
    url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/maven-metadata.xml"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return re.findall(r"<version>([^<]+)</version>", answer.read().decode())
    except OSError:
        return []


def built_for_spark(pom: str, scala: str = "2.13") -> str | None:
    """The Spark version a package's pom compiles against (its spark-sql dependency).

    >>> built_for_spark("<artifactId>spark-sql_2.13</artifactId>\\n<version>4.2.0</version>")
    '4.2.0'
    """
    found = re.search(rf"<artifactId>spark-sql_{re.escape(scala)}</artifactId>\s*<version>([^<]+)</version>", pom)
    return found.group(1) if found else None


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def release_built_for(group: str, artifact: str, spark_version: str) -> str | None:
    """The newest release of a package with its own version numbers (Delta Lake) that is built
    for ``spark_version``'s minor version: one built for another minor fails in Spark with
    ``NoSuchMethodError``. None when there is none (or no network)."""
    releases = sorted((v for v in _maven_versions(group, artifact) if re.fullmatch(r"\d+(\.\d+)*", v)),
                      key=_release, reverse=True)
    base = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}"
    for version in releases:
        try:
            with urllib.request.urlopen(f"{base}/{version}/{artifact}-{version}.pom", timeout=10) as answer:
                built = built_for_spark(answer.read().decode())
        except OSError:
            return None
        if built and _minor(built) == _minor(spark_version):
            return version
        if built and _release(_minor(built)) < _release(_minor(spark_version)):
            return None  # older releases are built for older Sparks still
    return None


@dataclass(frozen=True)
class Package:
    """A Spark package on Maven Central, a class it holds (to tell whether a session has it),
    and the session settings it needs (set when the session starts).

    Spark's own packages are released with Spark's version numbers (``own_versions`` False);
    a package with its own (Delta Lake) takes the release built for pyspark's Spark minor,
    or the version its setting (``version_setting``) names."""

    group: str
    artifact: str
    probe_class: str
    settings: tuple[tuple[str, str], ...] = ()
    own_versions: bool = False
    version_setting: config.Setting = config.SPARK_PACKAGE_VERSION

    @property
    def name(self) -> str:
        return f"{self.group}:{self.artifact}"

    @functools.cached_property
    def coordinate(self) -> str:
        """group:artifact:version, the version matching the installed pyspark (``matching_release``
        or ``release_built_for``; the package's setting overrides it)."""
        version = self.version_setting.get()
        if not version and self.own_versions:
            version = release_built_for(self.group, self.artifact, _spark_version()) or "<none built for Spark " \
                f"{_minor(_spark_version())}>"
        if not version:
            version = matching_release(_maven_versions(self.group, self.artifact), _spark_version())
        return f"{self.name}:{version}"


KAFKA = Package("org.apache.spark", "spark-sql-kafka-0-10_2.13", "org.apache.spark.sql.kafka010.KafkaSourceProvider")
DELTA = Package("io.delta", "delta-spark_2.13", "org.apache.spark.sql.delta.sources.DeltaDataSource",
                settings=(("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension"),
                          ("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")),
                own_versions=True, version_setting=config.DELTA_VERSION)
# Spark's Avro functions (from_avro), for Kafka values in Avro. Maven Central had no 4.2.x
# release in November 2026; the newest earlier one, 4.1.1, decodes in Spark 4.2 (tested).
AVRO = Package("org.apache.spark", "spark-avro_2.13", "org.apache.spark.sql.avro.AvroDataToCatalyst")
KNOWN = (KAFKA, DELTA, AVRO)


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
    when it has them all, otherwise ``spark.jars.packages``; and the settings of each package
    the session then has (Delta's SQL extension and catalog). Empty when none are needed and
    nothing was fetched."""
    wanted = {p.name: p for p in packages}
    local = fetched()
    if local and all(name in local for name in wanted):
        files = sorted({f for jars in local.values() for f in jars})
        present = [p for p in KNOWN if p.name in local]
        return {"spark.jars": ",".join(files), **{k: v for p in present for k, v in p.settings}}
    if not wanted:
        return {}
    return {"spark.jars.packages": ",".join(sorted(p.coordinate for p in wanted.values())),
            **{k: v for p in wanted.values() for k, v in p.settings}}


def how_to_get(package: Package) -> str:
    settings = "".join(f", {key}={value}" for key, value in package.settings)
    return (f"run `bash scripts/fetch_jars.sh` (jars into {jars_dir()}), or let Spark fetch it: "
            f"spark.jars.packages={package.coordinate}{settings}")


def require(spark: Any, packages: Iterable[Package], who: str) -> None:
    """Raise one clear line when the session lacks a package ``who`` (a step) needs, or a
    setting that package needs at the session's start."""
    utils = spark.sparkContext._jvm.org.apache.spark.util.Utils
    for package in packages:
        if not utils.classIsLoadable(package.probe_class):
            raise SetupError(f"{who} needs the Spark package {package.coordinate}, which this Spark session "
                             f"does not have: {how_to_get(package)}")
        for key, value in package.settings:
            if value not in (spark.conf.get(key, "") or "").split(","):
                raise SetupError(f"{who} needs the Spark setting {key}={value}, which this Spark session was "
                                 "started without (it can only be set before the session starts): start the "
                                 f"session with headrace's runner, or set it yourself; {how_to_get(package)}")


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
