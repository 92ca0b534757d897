"""The process helpers act on real processes: pause, resume, kill the whole tree, wait."""

from __future__ import annotations

import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.procs import ManagedProcess, ProcessRegistry, free_port, pid_alive, wait_until

# A one-line-per-request TCP server: answers "pong" to each line (so a frozen process is
# visible as a read timeout).
PONG_SERVER = textwrap.dedent(
    """
    import socket, sys
    srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
    print("ready", flush=True)
    conn, _ = srv.accept()
    f = conn.makefile("rb")
    for line in f:
        conn.sendall(b"pong\\n")
    """
)

# Starts one child in its own group and one that escapes with setsid (as sshd's per-connection
# children do), records their pids, then waits.
FAMILY = textwrap.dedent(
    """
    import subprocess, sys, time
    same = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                               start_new_session=True)
    print("pids", same.pid, escaped.pid, flush=True)
    time.sleep(600)
    """
)


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def _logged(proc: ManagedProcess, text: str) -> bool:
    return text in proc.output()


def test_pause_stops_answers_and_resume_brings_them_back(procs: ProcessRegistry) -> None:
    port = free_port("127.0.0.1")
    proc = procs.start(_python(PONG_SERVER, "127.0.0.1", str(port)), name="pong")
    wait_until(lambda: _logged(proc, "ready"), 10, message="pong server ready", watch=proc)

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"ping\n")
        assert s.recv(16) == b"pong\n"

        proc.pause()
        assert proc.paused and proc.running
        s.settimeout(0.5)
        s.sendall(b"ping\n")
        with pytest.raises(TimeoutError):
            s.recv(16)

        proc.resume()
        s.settimeout(5)
        assert s.recv(16) == b"pong\n"  # the request sent while frozen is answered now


def test_kill_ends_the_group_and_escaped_descendants(procs: ProcessRegistry) -> None:
    proc = procs.start(_python(FAMILY), name="family")
    line = wait_until(
        lambda: next((ln for ln in proc.output().splitlines() if ln.startswith("pids ")), None),
        10,
        message="family to print its children's pids",
        watch=proc,
    )
    children = [int(p) for p in line.split()[1:]]
    assert all(pid_alive(p) for p in children)

    proc.kill()

    assert proc.returncode == -9
    # The children were reparented to init when killed; give it a moment to reap them.
    wait_until(
        lambda: not any(pid_alive(p) for p in children),
        5,
        message=f"children {children} to be gone",
    )


def test_terminate_escalates_to_sigkill(procs: ProcessRegistry) -> None:
    stubborn = procs.start(
        _python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                " print('ready', flush=True); time.sleep(600)"),
        name="stubborn",
    )
    wait_until(lambda: _logged(stubborn, "ready"), 10, message="stubborn ready", watch=stubborn)
    started = time.monotonic()
    assert stubborn.terminate(timeout=0.5) == -9
    assert time.monotonic() - started < 5


def test_terminate_reaches_a_paused_process(procs: ProcessRegistry) -> None:
    sleeper = procs.start(_python("import time; time.sleep(600)"), name="sleeper")
    sleeper.pause()
    assert sleeper.terminate(timeout=5) == -15  # SIGTERM, delivered once continued


def test_registry_close_ends_everything(tmp_path: Path) -> None:
    registry = ProcessRegistry(tmp_path)
    sleep = _python("import time; time.sleep(600)")
    started = [registry.start(sleep, name=f"s{i}") for i in range(3)]
    started[1].pause()
    registry.close(timeout=1)
    assert not any(p.running for p in started)
    assert not any(pid_alive(p.pid) for p in started)


def test_wait_until_names_what_it_waited_for(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    log.write_text("line one\nthe last words of the service\n")

    def flaky() -> bool:
        raise ConnectionRefusedError("nobody home")

    with pytest.raises(AssertionError) as info:
        wait_until(flaky, 0.3, message="the moon to turn blue", logs=log, ignore=(OSError,))
    text = str(info.value)
    assert "timed out after 0.3s waiting for: the moon to turn blue" in text
    assert "nobody home" in text  # the last swallowed error
    assert str(log) in text and "the last words of the service" in text


def test_wait_until_returns_the_value_and_fails_fast_on_a_dead_process(
    procs: ProcessRegistry,
) -> None:
    assert wait_until(lambda: 42, 1) == 42

    doomed = procs.start(
        _python("import sys; print('boom: bad config'); sys.exit(3)"), name="doomed"
    )
    started = time.monotonic()
    with pytest.raises(AssertionError) as info:
        wait_until(lambda: False, 30, message="doomed to be ready", watch=doomed)
    assert time.monotonic() - started < 10
    assert "exited with code 3" in str(info.value)
    assert "boom: bad config" in str(info.value)
    assert str(doomed.log_path) in str(info.value)


def test_unexpected_exceptions_are_not_swallowed() -> None:
    def broken() -> bool:
        raise KeyError("a bug, not a wait")

    with pytest.raises(KeyError):
        wait_until(broken, 5)


def test_free_port_is_bindable_on_a_node_address() -> None:
    ports = {free_port("127.0.3.4") for _ in range(20)}
    assert len(ports) == 20
    for port in list(ports)[:3]:
        with socket.create_server(("127.0.3.4", port)):
            pass
