"""Cold storage of segments (issue 25): a bucket or a filesystem path that holds copies of a
log's completed segments, each as one object plus a manifest.

- ``config``: the ``[clusters.<c>.cold_storage]`` table of the inventory;
- ``store``: the store interface and the filesystem store; ``s3``: the S3-compatible store;
- ``segobject``: a segment's entries as one object, and reading them back verified;
- ``manifest``: what is known about an object (segment record, digest, txid and time range).

Operations on it (backup, later offload, cold reads and restore) live in ``dlctl.ops``.
"""
