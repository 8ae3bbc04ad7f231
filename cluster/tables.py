"""Arrow tables in and out: row status values, conforming a table to a schema, and reading a data
file (CSV, JSONL/JSON, Parquet; local or s3://) into a table with its own column names, with
one-line errors for undecodable bytes and malformed rows."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from redline.cluster import storage
from redline.errors import RedlineError, first_line

# Row status shared by every table: `ok` rows were processed; `rejected` rows are kept with a reason.
STATUS_OK = "ok"
STATUS_REJECTED = "rejected"
STATUS_ERROR = "error"

FORMATS = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json",
           ".parquet": "parquet", ".pq": "parquet"}


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Reorder and cast `table` to `schema`, adding absent nullable columns as nulls."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


@dataclass(frozen=True)
class DataFile:
    """Where a table lives and how to decode it (`setting` names the config field to fix in errors)."""

    path: str
    format: str = "auto"
    encoding: str = "utf-8"
    encoding_errors: str = "strict"
    setting: str = "corpus"
    max_field_mb: int = 16  # CSV: the reader's block; one value longer than this cannot be parsed

    def detected_format(self) -> str:
        if self.format != "auto":
            return self.format
        suffix = Path(self.path.split("?")[0]).suffix.lower()
        if suffix not in FORMATS:
            raise RedlineError(f"cannot tell the format of {self.path} from its extension; set {self.setting}.format")
        return FORMATS[suffix]

    def decode(self, data: bytes) -> str:
        try:
            return data.decode(self.encoding, errors=self.encoding_errors)
        except LookupError:
            raise RedlineError(f"unknown encoding '{self.encoding}' for {self.path}") from None
        except UnicodeDecodeError as err:
            line = data[: err.start].count(b"\n") + 1
            raise RedlineError(
                f"{self.path}: byte 0x{data[err.start]:02x} on line {line} is not valid {self.encoding}; "
                f"set {self.setting}.encoding (e.g. latin-1) or {self.setting}.encoding_errors: replace"
            ) from None

    def read_text(self) -> str:
        return self.decode(storage.read_bytes(self.path))

    def read(self) -> pa.Table:
        """The file as an Arrow table with its own column names (each named once; a dictionary-encoded
        column decoded to its values)."""
        table = self._parse()
        self._check_unique(table.column_names)
        decoded = [pa.types.is_dictionary(f.type) for f in table.schema]
        if any(decoded):
            table = pa.table({f.name: (table.column(i).cast(f.type.value_type) if d else table.column(i))
                              for i, (f, d) in enumerate(zip(table.schema, decoded))})
        return table

    def _check_unique(self, names: list[str]) -> None:
        repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if repeated is not None:
            raise RedlineError(f"{self.path}: the column {repeated!r} appears {names.count(repeated)} times in its "
                               "header; name each column once")

    def _parse(self) -> pa.Table:
        fmt = self.detected_format()
        data = storage.read_bytes(self.path)
        try:
            if fmt == "parquet":
                self._check_unique(pq.read_schema(io.BytesIO(data)).names)
                return pq.read_table(io.BytesIO(data))
            text = self.decode(data)
            if fmt == "csv":
                delimiter = "\t" if self.path.endswith(".tsv") else ","
                return pacsv.read_csv(
                    io.BytesIO(text.encode("utf-8")),
                    read_options=pacsv.ReadOptions(block_size=self.max_field_mb << 20),
                    parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
                    convert_options=pacsv.ConvertOptions(strings_can_be_null=False, quoted_strings_can_be_null=False),
                )
            return table_from_rows(self.json_rows(text, fmt))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            if "straddling" in str(err) or "block size" in str(err):
                raise RedlineError(f"{self.path}: a CSV value is longer than {self.max_field_mb} MB, the most the reader "
                                   f"takes in one field; set {self.setting}.max_field_mb higher (texts over "
                                   f"{self.setting}.max_chars are then rejected with a reason)") from None
            raise RedlineError(f"cannot parse {self.path} as {fmt}: {first_line(err)}") from None
        except RecursionError:
            raise RedlineError(f"{self.path}: a value is nested too deeply to read (JSON objects or lists inside "
                               "each other thousands of levels deep); a corpus row holds flat values") from None

    def json_rows(self, text: str, fmt: str) -> list[dict[str, Any]]:
        if fmt == "json" and text.lstrip().startswith("["):
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as err:
                raise RedlineError(f"{self.path}: invalid JSON at line {err.lineno}: {err.msg}") from None
        else:
            rows = []
            for lineno, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise RedlineError(f"{self.path}: invalid JSON on line {lineno}: {err.msg}") from None
        if not all(isinstance(r, dict) for r in rows):
            raise RedlineError(f"{self.path}: expected JSON objects, one per row")
        return rows


MIXED_KEY = b"redline.mixed_columns"  # schema metadata: columns whose JSON values differ in type


def table_from_rows(rows: list[dict[str, Any]]) -> pa.Table:
    columns: dict[str, list[Any]] = {}
    for i, row in enumerate(rows):
        for key in row:
            columns.setdefault(key, [None] * i)
        for key, values in columns.items():
            values.append(row.get(key))
    # Keep mixed-type columns readable: anything not uniformly scalar becomes a string column.
    arrays, mixed = {}, []
    for key, values in columns.items():
        try:
            arrays[key] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            mixed.append(key)
            arrays[key] = pa.array([None if v is None else json.dumps(v) if isinstance(v, (dict, list)) else str(v)
                                    for v in values])
    table = pa.table(arrays)
    return table.replace_schema_metadata({MIXED_KEY: ",".join(mixed).encode()}) if mixed else table
