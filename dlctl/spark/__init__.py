"""Bulk copy (bootstrap) of logs between clusters on Spark (DESIGN.md §8).

``plan`` (pure decisions), ``transform`` (re-encoding entries with origins, content digests),
``task`` (what an executor runs), ``credentials`` (secrets for executors), ``engine`` (the
SparkContext, stages, live results, progress), ``job`` (the driver: pin, reserve, copy, verify,
commit, clean up, release).
"""
