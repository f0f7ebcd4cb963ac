#!/bin/sh
# Ranks on several hosts (--nnodes, --node-rank, --master-addr), here two "hosts" on 127.0.0.1 with CPU ranks:
# smelt generate -tp 2 over 2 nodes and -tp 4 over 2 nodes (2 ranks each), and -pp 2 and -pp 4, print the
# unsplit model's greedy text, node 1's process ends with status 0 when rank 0 does, and a node that loads
# other model files is refused by name. usage: run_tp_nodes.sh SMELT MAKE_TEST_MODEL WORKDIR
set -u
SMELT=$1 MAKE=$2 W=$3
rm -rf "$W" && mkdir -p "$W" || exit 1
"$MAKE" "$W/model" >/dev/null || exit 1 # 4 heads, 2 KV heads, bf16: splits over 4
P="The capital of France is"
fail() { echo "FAIL: $*"; exit 1; }
gen() { "$SMELT" generate -p "$P" -n 16 --temp 0 --device cpu -t 1 "$@"; }
port() { echo $((20000 + ($$ * 7 + $1) % 20000)); }
# NODE_MODEL NODE0_MODEL TP: node 1 in the background, node 0 here; prints node 0's text, node 1's status in $W/rc1
SPLIT=-tp # or -pp: the layers in stages
pair() {
  pt=$(port "$3")
  (gen -m "$1" $SPLIT "$3" --nnodes 2 --node-rank 1 --master-addr "127.0.0.1:$pt" >"$W/out1" 2>"$W/err1"
   echo $? >"$W/rc1") &
  timeout 120 "$SMELT" generate -p "$P" -n 16 --temp 0 --device cpu -t 1 -m "$2" $SPLIT "$3" --nnodes 2 --node-rank 0 \
    --master-addr "127.0.0.1:$pt" 2>"$W/err0"
  echo $? >"$W/rc0"
  wait
}
for case in "smelt-tiny 2" "$W/model 2" "$W/model 4"; do
  set -- $case
  one=$(gen -m "$1" 2>/dev/null) || fail "unsplit $1"
  two=$(pair "$1" "$1" "$2")
  [ "$(cat "$W/rc0")" = 0 ] || fail "node 0 of -tp $2 ($1): $(cat "$W/err0")"
  [ "$(cat "$W/rc1")" = 0 ] || fail "node 1 of -tp $2 ($1) ended with $(cat "$W/rc1"): $(cat "$W/err1")"
  [ -n "$one" ] && [ "$one" = "$two" ] || fail "-tp $2 over 2 hosts ($1) printed another text:
$one
---
$two"
  echo "ok   -tp $2 over 2 hosts ($1): the unsplit text"
done
# pipeline stages on two hosts: -pp 2 (one stage a host) and -pp 4 (two a host) of the built-in model's 6 layers
SPLIT=-pp
for n in 2 4; do
  one=$(gen -m smelt-tiny 2>/dev/null) || fail "unsplit smelt-tiny"
  two=$(pair smelt-tiny smelt-tiny "$n")
  [ "$(cat "$W/rc0")" = 0 ] && [ "$(cat "$W/rc1")" = 0 ] || fail "-pp $n over 2 hosts: $(cat "$W/err0") $(cat "$W/err1")"
  [ -n "$one" ] && [ "$one" = "$two" ] || fail "-pp $n over 2 hosts printed another text:
$one
---
$two"
  echo "ok   -pp $n over 2 hosts: the unsplit text"
done
SPLIT=-tp
# node 1 with other model files than node 0
pair "$W/model" smelt-tiny 2 >/dev/null
[ "$(cat "$W/rc0")" != 0 ] && grep -q "loaded other model files\|split evenly\|rank 1" "$W/err0" ||
  fail "other files on node 1: node 0 ended with $(cat "$W/rc0"): $(cat "$W/err0")"
echo "ok   other model files on node 1 are refused: $(tail -1 "$W/err0")"
# rank 0's host killed: the other host's process ends too (no rank waits forever)
pt=$(port 9)
"$SMELT" serve -m "$W/model" --device cpu -t 1 -tp 2 --nnodes 2 --node-rank 1 --master-addr "127.0.0.1:$pt" \
  >/dev/null 2>"$W/errs1" &
n1=$!
"$SMELT" serve -m "$W/model" --device cpu -t 1 -tp 2 --nnodes 2 --node-rank 0 --master-addr "127.0.0.1:$pt" \
  --host 127.0.0.1 --port 0 >/dev/null 2>"$W/errs0" &
n0=$!
k=0
until grep -q "listening on" "$W/errs0" 2>/dev/null; do
  k=$((k + 1)); [ $k -gt 300 ] && fail "the split server did not start: $(cat "$W/errs0")"; sleep 0.1
done
kill -9 $n0
k=0
while kill -0 $n1 2>/dev/null; do
  k=$((k + 1)); [ $k -gt 300 ] && { kill -9 $n1; fail "node 1 still runs 30 s after rank 0 was killed"; }; sleep 0.1
done
echo "ok   node 1 ends when rank 0's host is killed ($(tail -1 "$W/errs1"))"
