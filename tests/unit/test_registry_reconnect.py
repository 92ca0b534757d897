"""Registration while kazoo is between an expired session and the next one (client_id None)."""

from __future__ import annotations

from types import SimpleNamespace

from kazoo.exceptions import NodeExistsError

from dlagent.registry import Registration


class _Reconnecting:
    """A scripted client: the stale record exists, and the first look at it happens while
    kazoo has no session (client_id None); then a new session finds the record gone."""

    def __init__(self) -> None:
        self.client_id = None
        self.creates = 0
        self.listeners: list = []

    def add_listener(self, fn) -> None:
        self.listeners.append(fn)

    def create(self, *args, **kwargs) -> None:
        self.creates += 1
        if self.creates == 1:
            raise NodeExistsError()
        self.client_id = (0x99, b"")  # the retry runs in the new session

    def exists(self, path, watch=None):
        return SimpleNamespace(ephemeralOwner=0x1234, version=0)  # read while client_id is None


def test_a_record_checked_without_a_session_is_retried_not_a_crash():
    client = _Reconnecting()
    registration = Registration(client, "c1", "n1", {"address": "127.0.0.1:1"}, None)  # type: ignore[arg-type]
    registration.start(wait_for_stale=5)  # was: TypeError: 'NoneType' object is not subscriptable
    assert registration.registrations == 1 and client.creates == 2
