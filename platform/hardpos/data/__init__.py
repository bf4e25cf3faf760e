"""The data layer: reading and writing what the stages exchange, and nothing else.

Modules (import the one you need; nothing here is imported eagerly so the CLI stays fast):

* :mod:`hardpos.data.captions`  -- caption sources: :mod:`~hardpos.data.captions.formats` (every
  caption format, ``read_captions(uri)``), :mod:`~hardpos.data.captions.stream` (a source at scale,
  read by Ray Data: the generate stage's input), :mod:`~hardpos.data.captions.training` (captions
  with their images for training and evaluation: triplet files, inline parquet, webdataset).
* :mod:`hardpos.data.triplets`  -- the triplet row contract: make/read/write.
* :mod:`hardpos.data.images`    -- one image from a path, ``s3://`` or ``http(s)://`` URI.

What edits a caption is :mod:`hardpos.rules`; the synthetic world is :mod:`hardpos.world`;
the text-only audits are :mod:`hardpos.audit`.
"""
