#!/usr/bin/env bash
# The main job on the embedded sandbox: two clusters of 3 regions on loopback addresses; a log
# written through the write proxies and read back at east, an agent killed mid-way and the log
# still writable and readable, the oldest segments truncated and their space reclaimed, then a
# second cluster (west) joining late: a Spark bootstrap copies what east retains and a
# replication stream carries on with new writes.
set -euo pipefail
cd "$(dirname "$0")/.."
DLCTL=${DLCTL:-.venv/bin/dlctl}
PY=${PY:-.venv/bin/python}
export DLCTL_SANDBOX_DIR=${DLCTL_SANDBOX_DIR:-$PWD/.sandbox}
export DLCTL_CONFIG=$DLCTL_SANDBOX_DIR/config.toml
EAST="$DLCTL --cluster east"
WEST="$DLCTL --cluster west"

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
cleanup() { step "tear down"; $DLCTL --yes sandbox down --purge; }
trap cleanup EXIT

step "start the sandbox: ZooKeeper + clusters east and west, each 3 regions x 2 agents"
$DLCTL --yes sandbox up --clusters 2 --nodes-per-region 2
$EAST cluster status

step "create a log at east (E=3, W=3, A=2, 64 KiB segments) and append 10,000 records through its owning agent"
$EAST log create orders --ensemble-size 3 --write-quorum 3 --ack-quorum 2 --roll-bytes 65536
seq 1 10000 | sed 's/^/order-/' | $EAST --yes log append orders
$EAST log read orders --limit 3

victim=$($EAST -o json log show orders | json "d['segments'][-1]['ensemble'].split(',')[0]")
pid=$($DLCTL -o json sandbox status | json "[n['pid'] for n in d['nodes'] if n['node'] == '$victim'][0]")
step "SIGKILL agent $victim (pid $pid), a member of the log's ensemble"
kill -9 "$pid"

step "the log stays writable: append 10,000 more records"
seq 10001 20000 | sed 's/^/order-/' | $EAST --yes log append orders

step "and readable: every record, in order, from the surviving replicas"
count=$($EAST log read orders | wc -l)
echo "read $count records (expected 20000)"
[ "$count" -eq 20000 ]
$EAST log read orders --from-txid 19997

step "truncate everything before the 4th segment, then gc: agents delete those replicas"
point=$($EAST -o json log show orders | json "str(d['segments'][3]['seq']) + '/0/0'")
$EAST truncate orders --to "$point" --dry-run
$EAST --yes truncate orders --to "$point"
$EAST --yes gc
$EAST log read orders --limit 1 2>&1
$EAST cluster status

step "west joins late: init-replication sees that east no longer holds the whole log and bootstraps it (Spark), then streams"
# A copy this small would run in-process by default (below --bootstrap-local-below, 1 GiB):
# the demo puts it on Spark, as a copy of a real log would be.
$DLCTL init-replication --source east --sink west --logs orders --bootstrap-local-below 0 --dry-run
$DLCTL --yes init-replication --source east --sink west --logs orders --bootstrap-local-below 0
seq 20001 21000 | sed 's/^/order-/' | $EAST --yes log append orders
$WEST replication wait-drain east-to-west --timeout 120
east=$($EAST log read orders 2>/dev/null | wc -l)
west=$($WEST log read orders | wc -l)
echo "east holds $east records, west $west (expected equal)"
[ "$east" -eq "$west" ]
$WEST log read orders | tail -3
$WEST replication status

step "cluster status: $victim is unreachable (then down once its ZooKeeper session expires); the others serve"
$EAST cluster status
