#!/usr/bin/env bash
# The main job on the embedded sandbox: a 3-region cluster on loopback addresses, a log written
# and read through it, an agent killed mid-way, and the log still writable and readable.
set -euo pipefail
cd "$(dirname "$0")/.."
DLCTL=${DLCTL:-.venv/bin/dlctl}
PY=${PY:-.venv/bin/python}
export DLCTL_SANDBOX_DIR=${DLCTL_SANDBOX_DIR:-$PWD/.sandbox}
export DLCTL_CONFIG=$DLCTL_SANDBOX_DIR/config.toml

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
cleanup() { step "tear down"; $DLCTL --yes sandbox down --purge; }
trap cleanup EXIT

step "start the sandbox: ZooKeeper + 3 regions x 3 agents"
$DLCTL --yes sandbox up
$DLCTL cluster status

step "create a log (E=3, W=3, A=2) and append 10,000 records"
$DLCTL log create orders --ensemble-size 3 --write-quorum 3 --ack-quorum 2
seq 1 10000 | sed 's/^/order-/' | $DLCTL --yes log append orders
$DLCTL log read orders --limit 3

victim=$($DLCTL -o json log show orders | json "d['segments'][-1]['ensemble'].split(',')[0]")
pid=$($DLCTL -o json sandbox status | json "[n['pid'] for n in d['nodes'] if n['node'] == '$victim'][0]")
step "SIGKILL agent $victim (pid $pid), a member of the log's ensemble"
kill -9 "$pid"

step "the log stays writable: append 10,000 more records"
seq 10001 20000 | sed 's/^/order-/' | $DLCTL --yes log append orders

step "and readable: every record, in order, from the surviving replicas"
count=$($DLCTL log read orders | wc -l)
echo "read $count records (expected 20000)"
[ "$count" -eq 20000 ]
$DLCTL log read orders --from-txid 19997
$DLCTL log show orders

step "cluster status: $victim is unreachable (then down once its ZooKeeper session expires); the others serve"
$DLCTL cluster status
