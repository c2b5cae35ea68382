"""S3's size and count limits, in one place: every backend and the transfer code obey the same numbers
(AWS S3 documents them under multipart upload limits, CopyObject and object tagging)."""

from __future__ import annotations

MIB = 1024 * 1024
MIN_PART = 5 * MIB  # smallest part of a multipart upload, but the last
MAX_PART = 5 * 1024**3  # largest part
MAX_PARTS = 10_000  # part numbers run 1..MAX_PARTS
MAX_PUT = 5 * 1024**3  # largest single PUT (EntityTooLarge above)
MAX_COPY = 5 * 1024**3  # largest object one CopyObject copies; above it, UploadPartCopy
MAX_TAGS = 10  # tags per object; keys 1-128 characters, values up to 256
DELETE_BATCH = 1000  # keys per S3 DeleteObjects request, its limit
