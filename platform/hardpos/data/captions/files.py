"""What the caption readers share about files: UTF-8 text and parquet footers, read with
errors that name the file.

Both raise the error class the caller passes (:class:`hardpos.data.captions.SourceError` or
:class:`hardpos.data.captions.CaptionSourceError`), so each reader keeps its own error type
and every message reads the same.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from hardpos import storage
from hardpos.data.captions import SourceError


def decode_utf8(data: bytes, uri: str, error: type[SourceError] = SourceError) -> str:
    """``data`` as text (a UTF-8 byte-order mark dropped); ``error`` names ``uri`` and the first
    invalid byte and its offset when it is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{uri}: not UTF-8 text (invalid byte {data[exc.start:exc.start + 1]!r} at offset {exc.start})"
                    ) from exc


def read_parquet_schema(uri: str, error: type[SourceError] = SourceError) -> pa.Schema:
    """The schema of the parquet file ``uri`` (local or s3://), from its footer alone (random
    access: no row group is read); ``error`` names ``uri`` when it is not a readable parquet file."""
    fs, fs_path = storage.arrow_filesystem(uri)
    try:
        with fs.open_input_file(fs_path) as handle:
            return pq.read_schema(handle)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
        raise error(f"{uri}: not a readable parquet file: {exc}") from exc
