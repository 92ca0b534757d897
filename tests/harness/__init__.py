"""Real-components test harness: processes, ZooKeeper, sshd nodes and a fault-injection proxy.

Everything here drives real programs (java, sshd, agents) on loopback addresses; nothing is
faked. ``tests/conftest.py`` puts ``tests/`` on ``sys.path``, so import it as ``harness``::

    from harness.procs import wait_until, free_port
    from harness.zk import expire_session

Fixtures (see ``tests/conftest.py``)::

    procs               ProcessRegistry: procs.start(argv, name=, env=, cwd=) -> ManagedProcess
    zk                  ZkNamespace on the session's server (a fresh chroot per test)
    zk_private_server   ZkNamespace on a server of the test's own (.server may be killed)
    zk_ensemble         ZkNamespace on a 3-server ensemble (.ensemble.kill(i)/pause(i)...)
    ssh_nodes           ssh_nodes(nodes=3, regions=1, *, fresh=False, session_env=None)
    fault_network       FaultNetwork: .proxy(target), .partition(a, b), .heal(), ...

Addresses: ZooKeeper on 127.0.0.1; sshd node ``r<R>n<I>`` on 127.0.<R>.<I> (unique for the
session). Every started process logs to a file that error messages name.
"""
