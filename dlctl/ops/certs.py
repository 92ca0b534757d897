"""Agent certificates: delivery (``agent install``), rotation (``cluster rotate-certs``), status.

An agent re-reads its TLS files when they change (``dlctl.log.tls.TlsFiles``), so delivering new
files is the whole rotation: connections already open keep their session, the next ones get the
new certificate, nothing restarts. Each upload is an atomic SFTP rename; the key goes before its
certificate (until the pair matches, the agent keeps serving with the previous pair).

Rotating the CA itself (``--new-ca``) runs in three rounds so that at every moment every
certificate in use is trusted by everyone:

1. every agent and the operator trust both CAs (bundle old+new);
2. every agent, and the operator, get a certificate of the new CA;
3. every agent and the operator trust only the new CA.

The new CA's key waits in ``ca-next.key`` until round 2, so an interrupted rotation is resumed
by running the command again. Each delivery is checked by connecting to the agent: the
certificate it presents (or the CA bundle it trusts) must be the new one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import ssl
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import pki
from .. import tomltext as toml
from ..certdir import AGENT_CA, AGENT_CERT, AGENT_DIR, AGENT_KEY, CA_KEY, CertDir
from ..errors import ConfigError, DlctlError
from ..inventory import Node
from ..plan import Plan, Step
from ..remote.fanout import Deadline, FanoutEvent, fan_out, outcome
from ..remote.transport import Transport
from ..secrets import write_secret_file

if TYPE_CHECKING:  # agents imports this module (agent install delivers certificates)
    from .agents import Fleet

NEXT_CA_KEY = "ca-next.key"
VERIFY_TIMEOUT = 30.0


def agent_hosts(node: Node) -> list[str]:
    """Every name a client may dial the agent by: its listen host and its SSH host."""
    listen_host = node.listen.rpartition(":")[0].strip("[]")
    return [h for h in dict.fromkeys((listen_host, node.host)) if h]


def tls_table(node: Node) -> str:
    """The agent.toml ``[tls]`` table pointing at the delivered files."""
    base = f"{node.home}/{AGENT_DIR}"
    return "\n".join(
        [toml.table("tls"), toml.line("ca_file", f"{base}/{AGENT_CA}"), toml.line("cert_file", f"{base}/{AGENT_CERT}"), toml.line("key_file", f"{base}/{AGENT_KEY}")]
    ) + "\n"


def upload_private(t: Transport, directory: str, files: Sequence[tuple[str, bytes]], remaining: Callable[[], float]) -> None:
    """``files`` (path under ``directory``, bytes) into ``directory`` (0700, as is every
    subdirectory they name), each 0600, in the order given: by SFTP, never in argv."""
    subdirs = sorted({f"{directory}/{name.rpartition('/')[0]}" for name, _ in files if "/" in name})
    t.run(["mkdir", "-p", "-m", "700", directory, *subdirs], timeout=remaining()).check()
    with tempfile.TemporaryDirectory(prefix="dlctl-upload-") as scratch:
        for i, (name, data) in enumerate(files):
            local = Path(scratch) / str(i)
            write_secret_file(local, data)
            t.put(local, f"{directory}/{name}", 0o600, timeout=remaining())


def _upload(t: Transport, node: Node, files: Sequence[tuple[str, bytes]], remaining: Callable[[], float]) -> None:
    """``files`` (name, bytes) into ``<home>/tls/``."""
    upload_private(t, f"{node.home}/{AGENT_DIR}", files, remaining)


def deliver_certificate(t: Transport, node: Node, certs: CertDir, remaining: Callable[[], float], *, with_bundle: bool = True) -> dict[str, Any]:
    """Issue ``node`` a certificate of the current CA and upload it (and the CA bundle)."""
    issued = certs.issue_agent(node.id, agent_hosts(node))
    files = [(AGENT_CA, certs.bundle())] if with_bundle else []
    _upload(t, node, files + [(AGENT_KEY, issued.key_pem), (AGENT_CERT, issued.cert_pem)], remaining)
    info = pki.describe(issued.cert_pem)
    return {"certificate": info.fingerprint, "not_after": info.not_after.isoformat(), "names": list(info.names)}


def deliver_bundle(t: Transport, node: Node, certs: CertDir, remaining: Callable[[], float]) -> dict[str, Any]:
    _upload(t, node, [(AGENT_CA, certs.bundle())], remaining)
    return {"trusts": [pki.describe(pem).subject for pem in pki.split_bundle(certs.bundle())]}


# -- checking what an agent presents ---------------------------------------------------------------


async def _presented(node: Node, certs: CertDir) -> bytes:
    """The certificate agent ``node`` presents now to a client of this cluster (DER)."""
    host, _, port = node.listen.rpartition(":")
    context = certs.client_files().client()
    _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port), ssl=context, server_hostname=host.strip("[]")), 10.0)
    try:
        return writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()


def wait_presenting(node: Node, certs: CertDir, fingerprint: str, timeout: float = VERIFY_TIMEOUT) -> None:
    """Wait until ``node`` serves the certificate with ``fingerprint`` (it reloads on change)."""

    async def go() -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        last: object = None
        while True:
            try:
                if hashlib.sha256(await _presented(node, certs)).hexdigest() == fingerprint:
                    return
                last = "it still presents its previous certificate"
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                last = exc
            if asyncio.get_running_loop().time() > deadline:
                raise DlctlError(
                    f"agent {node.id} ({node.listen}) does not present its new certificate after {timeout:g}s: {last}",
                    hint="check the agent's log (`dlctl agent logs`); re-run rotate-certs: it is safe to repeat",
                )
            await asyncio.sleep(0.2)  # the agent reloads on its next accepted connection: poll it

    asyncio.run(go())


# -- plans -------------------------------------------------------------------------------------------


def _fan(fleet: Fleet, nodes: Sequence[Node], what: str, one: Callable[[Node, Deadline], dict[str, Any]], progress: Callable[[FanoutEvent], None] | None) -> dict[str, Any]:
    options = fleet.options
    # One node at a time by default when the fleet is serial by region; bounded otherwise.
    results = fan_out(list(nodes), one, timeout=max(options.timeout, 120.0), max_concurrency=options.max_concurrency, region_serial=options.region_serial, progress=progress)
    return outcome(results, action=what)


def rotate_plan(fleet: Fleet, certs: CertDir, nodes: Sequence[Node], *, new_ca: bool, progress: Callable[[FanoutEvent], None] | None = None) -> Plan:
    if not certs.exists():
        raise ConfigError(
            f"cluster {certs.cluster!r} has no TLS directory at {certs.path}",
            hint="a cluster initialised with --no-tls has no certificates to rotate; TLS is set up by `dlctl cluster init`",
        )

    def leaf(node: Node, deadline: Deadline) -> dict[str, Any]:
        remaining = lambda: max(1.0, deadline.remaining())  # noqa: E731
        done = deliver_certificate(fleet.transport(node), node, certs, remaining, with_bundle=False)
        wait_presenting(node, certs, done["certificate"])
        return done

    def bundle_round(node: Node, deadline: Deadline) -> dict[str, Any]:
        remaining = lambda: max(1.0, deadline.remaining())  # noqa: E731
        return deliver_bundle(fleet.transport(node), node, certs, remaining)

    ids = ", ".join(n.id for n in nodes)
    steps: list[Step] = []
    if new_ca:
        next_key = certs.path / NEXT_CA_KEY

        def start_new_ca() -> dict[str, Any]:
            current = certs.ca()
            if next_key.exists():  # an interrupted rotation: carry on with its CA
                key = next_key.read_bytes()
                nxt = pki.Issued(pki.signer_of(certs.bundle(), key), key)
                resumed = True
            else:
                generation = len(pki.split_bundle(certs.bundle())) + 1
                nxt = pki.new_ca(certs.cluster, generation=generation)
                write_secret_file(next_key, nxt.key_pem)
                resumed = False
            write_secret_file(certs.ca_file, pki.bundle(current.cert_pem, nxt.cert_pem))
            return {"new_ca": pki.describe(nxt.cert_pem).fingerprint, "resumed": resumed}

        def switch_signer() -> dict[str, Any]:
            if next_key.exists():
                os.replace(next_key, certs.path / CA_KEY)
            return {"signing_ca": pki.describe(certs.ca().cert_pem).fingerprint, "operator": certs.renew_client().fingerprint}

        def drop_old_ca() -> dict[str, Any]:
            write_secret_file(certs.ca_file, certs.ca().cert_pem)
            return {"trusted": pki.describe(certs.bundle()).subject}

        steps += [
            Step("new-ca", str(certs.path), "create the new CA; the operator trusts old and new", run=start_new_ca),
            Step("trust-both", ids, "every agent trusts both CAs", run=lambda: _fan(fleet, nodes, "trust both CAs", bundle_round, progress)),
            Step("switch-ca", str(certs.path), "the new CA signs from now on; a new operator certificate", run=switch_signer),
        ]
    steps.append(Step("rotate", ids, "issue and deliver each agent a new certificate, and check it presents it", run=lambda: _fan(fleet, nodes, "rotate certificates", leaf, progress)))
    if new_ca:
        steps += [
            Step("drop-old-ca", str(certs.path), "the operator trusts only the new CA", run=drop_old_ca),
            Step("trust-new", ids, "every agent trusts only the new CA", run=lambda: _fan(fleet, nodes, "trust the new CA", bundle_round, progress)),
        ]
    else:
        steps.append(Step("renew-operator", str(certs.path / "client.pem"), "a new operator certificate", run=lambda: certs.renew_client().to_dict()))
    return Plan.of("cluster rotate-certs", steps)


def status(certs: CertDir | None) -> dict[str, Any]:
    """The operator's view of the cluster's TLS: CAs trusted, signer, operator certificate."""
    if certs is None or not certs.exists():
        return {"tls": False, "dir": str(certs.path) if certs else None}
    out: dict[str, Any] = {"tls": True, "dir": str(certs.path), "trusted": [pki.describe(p).to_dict() for p in pki.split_bundle(certs.bundle())]}
    try:
        out["signing_ca"] = pki.describe(certs.ca().cert_pem).fingerprint
    except ConfigError as exc:
        out["signing_ca"] = None
        out["problem"] = exc.message
    out["operator"] = pki.describe(certs.client_files().cert_file.read_bytes()).to_dict()
    out["rotation_in_progress"] = (certs.path / NEXT_CA_KEY).exists()
    return out


__all__ = ["agent_hosts", "deliver_bundle", "deliver_certificate", "rotate_plan", "status", "tls_table", "wait_presenting"]
