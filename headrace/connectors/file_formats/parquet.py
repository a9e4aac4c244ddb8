"""Parquet: read with pyarrow and cast to the schema (missing columns null).

A column that cannot be cast raises ``SourceError``: a Parquet source has no dead letters.
Without an explicit schema the source takes one file's schema (:func:`parquet_schema`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from headrace.connectors.file_formats.reader import CHUNK_LINES, FileReader, batch_schema
from headrace.contract import CONTROL_COLUMN
from headrace.errors import PlanError, SourceError
from headrace.schema import Schema, type_name_of_arrow


def parquet_schema(path: str, where: str) -> Schema:
    """The schema of the Parquet file ``path``; a column headrace cannot carry is a PlanError."""
    import pyarrow.parquet as pq

    arrow = pq.read_schema(path)
    return tuple((f.name, _type_name(f, where)) for f in arrow)


def _type_name(field: pa.Field, where: str) -> str:
    try:
        return type_name_of_arrow(field.type, widen=True)
    except TypeError:
        raise PlanError(f"{where}: column {field.name!r} has the Parquet type {field.type}, which headrace "
                        "cannot carry; pass schema= with the columns you need") from None


class ParquetReader(FileReader):
    def read(self) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        arrow = batch_schema(self.schema, dead_letters=False)
        parquet = pq.ParquetFile(self.path)
        present = set(parquet.schema_arrow.names)
        wanted = [name for name in self.names if name in present]
        for batch in parquet.iter_batches(batch_size=CHUNK_LINES, columns=wanted):
            arrays = []
            for field in arrow:
                if field.name == CONTROL_COLUMN:
                    arrays.append(pa.nulls(batch.num_rows, pa.int64()))
                elif field.name not in present:
                    arrays.append(pa.nulls(batch.num_rows, field.type))
                else:
                    column = batch.column(field.name)
                    try:
                        arrays.append(pc.cast(column, options=pc.CastOptions(
                            field.type, allow_time_truncate=True)))
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                        raise SourceError(
                            f"source {self.source!r}: {self.path}: column {field.name!r} of type "
                            f"{column.type} cannot be read as {field.type}: {exc}") from None
            yield pa.RecordBatch.from_arrays(arrays, schema=arrow)
