"""Cluster metadata in ZooKeeper: layout, versioned compare-and-set updates, ACLs."""
