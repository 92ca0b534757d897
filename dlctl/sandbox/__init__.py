"""The embedded sandbox: a local multi-region cluster (ZooKeeper + agents on loopback addresses)."""
