"""Caption sources: every way HardPos reads captions (and their images) from files.

One family, a module per idea:

* :mod:`hardpos.data.captions.formats`  -- the caption formats (COCO captions json, SugarCrepe
  json, json / jsonl / parquet rows, NegCLIP tsv / csv) and their columns:
  :func:`~hardpos.data.captions.formats.read_captions` reads one file whole into normalised
  caption rows. The perturb stage, the generate stage's planning and the blind audit read
  captions with it.
* :mod:`hardpos.data.captions.stream`   -- a caption source at scale (a file, a folder or a
  glob; local or s3://) checked on the driver from file heads and read by Ray Data on the
  workers into caption blocks kept in the object store: the generate stage's input.
* :mod:`hardpos.data.captions.training` -- captions with their images for training and
  evaluation (triplet files, parquet with inline images, webdataset shards) as one row schema
  in a Ray Dataset, and the thread-pooled image fetch beside it.
* :mod:`hardpos.data.captions.files`    -- what the readers share about files: UTF-8 text and
  parquet footers read with errors that name the file.

This module holds the family's errors: every reader raises :class:`SourceError` (or its
:class:`CaptionSourceError`) naming the file, before any work where it can.
"""
from __future__ import annotations


class SourceError(ValueError):
    """An input source is missing, empty, malformed or mixes layouts/schemas (message names the file)."""


class CaptionSourceError(SourceError):
    """A caption source is missing, unreadable or has no caption column (message names the file)."""
