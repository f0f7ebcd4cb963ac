#!/bin/sh
# A short soak of smelt serve on the built-in model (bench/server/soak.c): clients streaming for
# SECONDS, 30% of the requests hanging up mid-stream. Fails when a request gets a 5xx or a stream is
# cut short by the server, or when the server is not idle with every KV block released afterwards.
# usage: run_soak.sh SMELT MODEL_DIR SOAK_BIN WORK_DIR [SECONDS]
SMELT=$1 MODEL=$2 SOAK=$3 DIR=$4 SECS=${5:-15}
mkdir -p "$DIR"
"$SMELT" serve -m "$MODEL" -np 8 --max-conns-per-ip 0 --port 0 >"$DIR/serve.log" 2>&1 &
SP=$!
URL=
for i in $(seq 1 200); do
  URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$DIR/serve.log" | head -1)
  [ -n "$URL" ] && break
  kill -0 $SP 2>/dev/null || break
  sleep 0.1
done
if [ -z "$URL" ]; then
  echo "the server did not start:"; cat "$DIR/serve.log"; kill $SP 2>/dev/null; exit 1
fi
"$SOAK" --url "$URL" --concurrency 8 --seconds "$SECS" --disconnect 0.3 --max-tokens 48 --prompt-words 24 --report 5
rc=$?
kill $SP
wait $SP
src=$?
[ $rc = 0 ] || exit $rc
# SIGTERM: a clean stop (143 when the shell reports the signal itself)
[ $src = 0 ] || [ $src = 143 ] || { echo "server exit status $src"; cat "$DIR/serve.log"; exit 1; }
