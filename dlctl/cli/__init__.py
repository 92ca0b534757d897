"""The command line: parses arguments, confirms, calls an operation, renders the result.

It never talks to ZooKeeper or SSH itself; that is ``dlctl.ops`` and the library below it.
"""
