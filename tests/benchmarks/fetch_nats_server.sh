#!/usr/bin/env bash
# Puts Debian trixie's nats-server (2.10) next to the venv's python, for bench_vs_jetstream.py.
#
#     bash tests/benchmarks/fetch_nats_server.sh [DEST]        # default DEST: .venv/bin/nats-server
#
# Why not bookworm's package: nats-server 2.9 has no `sync_interval: always`, so JetStream can
# only be measured acknowledging out of its replicas' page caches, while dlctl's agents fdatasync
# before they acknowledge. 2.10 accepts it, and the benchmark then also runs a JetStream cluster
# that fsyncs every write: the like-for-like durability column.
#
# The machine's apt sources are left alone: the package index and the .deb go to a private apt
# state in a temporary directory (the same Debian archive the machine is configured with, another
# suite), and only the binary is extracted. Needs apt-get and dpkg-deb (Debian), and root or a writable DEST.
set -euo pipefail
cd "$(dirname "$0")/../.."

dest=${1:-.venv/bin/nats-server}
suite=trixie
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
# The machine's own Debian archive (as its apt configuration names it: a mirror, a proxy), not
# a host written here: the first index target labelled "Debian" (not -Security) gives its URI.
archive=$(apt-get indextargets --format '$(LABEL) $(REPO_URI)' | awk '$1 == "Debian" { print $2; exit }')
if [ -z "$archive" ]; then
    echo "fetch_nats_server: the machine's apt sources name no Debian archive (apt-get indextargets)" >&2
    exit 1
fi
echo "deb $archive $suite main" >"$tmp/sources.list"
apt=(apt-get -qq
     -o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
     -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache"
     -o "APT::Sandbox::User=root")
"${apt[@]}" update
(cd "$tmp" && "${apt[@]}" download nats-server)
dpkg-deb -x "$tmp"/nats-server_*.deb "$tmp/root"
mkdir -p "$(dirname "$dest")"
install -m 0755 "$tmp/root/usr/sbin/nats-server" "$dest"
echo "installed $("$dest" --version) at $dest" >&2
