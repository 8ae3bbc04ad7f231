"""Arrow tables in and out: row status values, conforming a table to a schema, and reading a data
file (CSV, JSONL/JSON, Parquet; local or s3://) into a table with its own column names, with
one-line errors for undecodable bytes and malformed rows."""

from __future__ import annotations

import codecs
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from redline.cluster import storage
from redline.cluster.paths import NotFound
from redline.errors import RedlineError, first_line

# Row status shared by every table: `ok` rows were processed; `rejected` rows are kept with a reason.
STATUS_OK = "ok"
STATUS_REJECTED = "rejected"
STATUS_ERROR = "error"
# A DiaSafety verdict: an empty or whitespace-only response, not classified (counted apart in the figures).
NO_ANSWER = "no-answer"

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

    def streamable(self) -> bool:
        """Whether `stream` reads this file in bounded memory: CSV and Parquet in strict UTF-8 (JSON, other
        encodings and `encoding_errors: replace` are read whole)."""
        try:
            utf8 = codecs.lookup(self.encoding).name == "utf-8"
        except LookupError:
            return False
        return self.detected_format() in ("csv", "parquet") and utf8 and self.encoding_errors == "strict"

    def count_rows(self) -> int:
        """The file's rows: a Parquet file's from its footer, any other by reading it (streamed where it can be)."""
        if self.detected_format() == "parquet":
            try:
                fs, path = storage.resolve(self.path)
                with fs.open_input_file(path) as f:
                    return pq.ParquetFile(f).metadata.num_rows
            except (OSError, pa.ArrowException, RedlineError):
                pass  # read below, where the reader says in one line what is wrong
        return sum(t.num_rows for t in self.stream()) if self.streamable() else self.read().num_rows

    def stream(self, chunk_rows: int = 65_536) -> Iterator[pa.Table]:
        """The file's rows as tables read as they are needed (a file larger than memory streams
        through): Parquet `chunk_rows` rows at a time, CSV one reader block (`max_field_mb`) at a time;
        at least one table, empty for a file with a header and no rows. Errors are `read`'s, one line
        each (an invalid byte names its line)."""
        if not self.streamable():
            yield self.read()
            return
        fs, path = storage.resolve(self.path)
        try:
            info = fs.get_file_info(path)
        except OSError as err:
            raise RedlineError(f"cannot read {self.path}: {first_line(err)}") from None
        if info.type == pafs.FileType.NotFound:
            raise NotFound(f"file not found: {self.path}")
        if info.type == pafs.FileType.Directory:
            raise RedlineError(f"expected a file but found a directory: {self.path}")
        fmt, checked = self.detected_format(), None
        try:
            if fmt == "parquet":
                with fs.open_input_file(path) as f:
                    parquet = pq.ParquetFile(f)
                    self._check_unique(parquet.schema_arrow.names)
                    empty = True
                    for batch in parquet.iter_batches(batch_size=chunk_rows):
                        empty = False
                        yield self._decoded(pa.Table.from_batches([batch]))
                    if empty:
                        yield self._decoded(parquet.schema_arrow.empty_table())
                return
            with fs.open_input_stream(path) as raw:
                checked = _Utf8Checked(raw, self)
                reader = pacsv.open_csv(checked, read_options=pacsv.ReadOptions(block_size=self.max_field_mb << 20),
                                        parse_options=self._csv_parse(), convert_options=self._csv_convert())
                self._check_unique(reader.schema.names)
                empty = True
                for batch in reader:
                    empty = False
                    yield pa.Table.from_batches([batch])
                if empty:
                    yield reader.schema.empty_table()
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as err:
            if checked is not None and checked.error is not None:
                raise checked.error from None
            raise self._parse_error(err, fmt) from None

    def _csv_parse(self) -> pacsv.ParseOptions:
        return pacsv.ParseOptions(delimiter="\t" if self.path.endswith(".tsv") else ",", newlines_in_values=True)

    @staticmethod
    def _csv_convert() -> pacsv.ConvertOptions:
        return pacsv.ConvertOptions(strings_can_be_null=False, quoted_strings_can_be_null=False)

    def _parse_error(self, err: BaseException, fmt: str) -> RedlineError:
        if "straddling" in str(err) or "block size" in str(err):
            return RedlineError(f"{self.path}: a CSV value is longer than {self.max_field_mb} MB, the most the reader "
                                f"takes in one field; set {self.setting}.max_field_mb higher (texts over "
                                f"{self.setting}.max_chars are then rejected with a reason)")
        return RedlineError(f"cannot parse {self.path} as {fmt}: {first_line(err)}")

    def _decoded(self, table: pa.Table) -> pa.Table:
        """`table` with each dictionary-encoded column decoded to its values."""
        decoded = [pa.types.is_dictionary(f.type) for f in table.schema]
        if not any(decoded):
            return table
        return pa.table({f.name: (table.column(i).cast(f.type.value_type) if d else table.column(i))
                         for i, (f, d) in enumerate(zip(table.schema, decoded))})

    def read_text(self) -> str:
        return self.decode(storage.read_bytes(self.path))

    def read(self) -> pa.Table:
        """The file as an Arrow table with its own column names (each named once; a dictionary-encoded
        column decoded to its values)."""
        table = self._parse()
        self._check_unique(table.column_names)
        return self._decoded(table)

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
                return pacsv.read_csv(io.BytesIO(text.encode("utf-8")),
                                      read_options=pacsv.ReadOptions(block_size=self.max_field_mb << 20),
                                      parse_options=self._csv_parse(), convert_options=self._csv_convert())
            return table_from_rows(self.json_rows(text, fmt))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise self._parse_error(err, fmt) from None
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


class _Utf8Checked(io.RawIOBase):
    """A byte stream passed on as it is read, every byte checked to be `data_file`'s strict UTF-8: an
    invalid one is kept as the one-line error `DataFile.decode` gives (naming its byte and line), for
    the reader's caller to raise."""

    def __init__(self, raw: Any, data_file: DataFile) -> None:
        super().__init__()
        self.raw, self.data_file, self.error = raw, data_file, None
        self.decoder, self.lines = codecs.getincrementaldecoder("utf-8")("strict"), 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        chunk = self.raw.read() if size is None or size < 0 else self.raw.read(size)
        pending = self.decoder.getstate()[0]
        try:
            self.decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as err:
            data = pending + chunk
            line = self.lines + data[: err.start].count(b"\n") + 1
            self.error = RedlineError(
                f"{self.data_file.path}: byte 0x{data[err.start]:02x} on line {line} is not valid "
                f"{self.data_file.encoding}; set {self.data_file.setting}.encoding (e.g. latin-1) or "
                f"{self.data_file.setting}.encoding_errors: replace")
            raise OSError("invalid UTF-8") from None
        self.lines += chunk.count(b"\n")
        return bytes(chunk)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


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
