"""Asynchronous, pull-based replication of logs between clusters (DESIGN.md §7).

``origin`` (record headers), ``causal`` (vector time and the causality filter), ``records``
(stream metadata as values), ``store`` (stream metadata in the sink's ZooKeeper), ``decision``
(the bootstrap decision), ``worker`` (one (stream, log) replication loop), ``lag`` (how far a
sink is behind), ``assignment`` (which agent runs which worker).
"""
