"""How a file of each format becomes record batches: one reader class per format.

* ``jsonl.py``: JSON lines, one object per line.
* ``csv.py``: CSV rows, with or without a header row.
* ``parquet.py``: Parquet files, cast to the schema.
* ``values.py``: value conversion shared by the text formats (timestamps, dates, base64).
* ``reader.py``: what every reader shares: the source's Arrow schema and dead-letter rows.

The connector (options, file discovery, offsets, the Spark data source) is
``headrace/connectors/files_source.py``; it picks the reader from :data:`READERS`.
"""

from __future__ import annotations

from headrace.connectors.file_formats.csv import CsvReader
from headrace.connectors.file_formats.jsonl import JsonLinesReader
from headrace.connectors.file_formats.parquet import ParquetReader
from headrace.connectors.file_formats.reader import FileReader

READERS: dict[str, type[FileReader]] = {"jsonl": JsonLinesReader, "csv": CsvReader, "parquet": ParquetReader}
FORMATS = tuple(READERS)
