"""The Files source's Spark data source (``headrace_files``, its Python reader): the new files of
each micro-batch, one partition each, read by ``headrace/connectors/file_formats/``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from headrace.connectors.base import ExhaustedMark, flush_batch, spark_schema, stop_requested
from headrace.connectors.file_formats import READERS
from headrace.connectors.file_formats.reader import batch_schema
from headrace.connectors.files_native import list_files
from headrace.contract import FLUSHED
from headrace.environment.admission import backlog
from headrace.errors import SourceError
from headrace.schema import Schema, schema_of


class FilePartition(InputPartition):
    """One file to read (``path`` set) or the flush row (``path`` None)."""

    def __init__(self, path: str | None) -> None:
        super().__init__(path)
        self.path = path


def _options_schema(options: dict[str, str]) -> Schema:
    text = options.get("schema")
    if not text:
        raise SourceError("headrace_files: the option 'schema' is required")
    if text.lstrip().startswith("["):
        return schema_of([tuple(pair) for pair in json.loads(text)])
    return schema_of(text)


class FileStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.path = options.get("path", "")
        self.format = options.get("format", "jsonl")
        self.bounded = options.get("bounded", "false").lower() == "true"
        self.schema = _options_schema(options)
        self.dead_letters = self.format != "parquet"
        self.max_files = int(options["max_files_per_batch"]) if options.get("max_files_per_batch") else None
        self._exhausted = ExhaustedMark(options)
        self._backlog: int | None = None

    def initialOffset(self) -> dict:
        return {"files": []}

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        if self._exhausted.past_flush(start) or stop_requested(self.options):
            return start
        try:
            names = list_files(self.path)
        except OSError as exc:
            raise SourceError(f"source {self.options.get('hr_source', 'files')!r}: cannot list the "
                              f"directory {self.path!r}: {exc}") from None
        seen = list(start["files"])
        # A bounded source takes the files of its first listing ("pending" until taken).
        waiting = start.get("pending") if self.bounded else None
        if waiting is None:
            waiting = sorted(set(names) - set(seen))
        taken, rest = (waiting, []) if self.max_files is None else (waiting[:self.max_files], waiting[self.max_files:])
        self._backlog = len(rest)
        if self.bounded:
            if rest:
                return {"files": sorted(seen + taken), "pending": rest}
            self._exhausted()
            return {"files": sorted(seen + taken), FLUSHED: True}
        if not taken:
            return start
        return {"files": sorted(seen + taken)}

    def reportLatestOffset(self) -> dict | None:
        return None if self._backlog is None else backlog(self._backlog, "files")

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        seen = set(start["files"])
        parts: list[InputPartition] = [
            FilePartition(os.path.join(self.path, name)) for name in end["files"] if name not in seen
        ]
        if end.get(FLUSHED) and not start.get(FLUSHED):
            parts.append(FilePartition(None))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        if partition.path is None:
            yield flush_batch(batch_schema(self.schema, self.dead_letters))
            return
        yield from READERS[self.format](self.options, self.schema, partition.path).read()


class FileDataSource(DataSource):
    """Spark data source ``headrace_files``; options as produced by ``FileSource.options()``."""

    @classmethod
    def name(cls) -> str:
        return "headrace_files"

    def schema(self) -> str:
        options = dict(self.options)
        return spark_schema(_options_schema(options), options.get("format", "jsonl") != "parquet")

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return FileStreamReader(dict(self.options))
