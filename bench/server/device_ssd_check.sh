#!/bin/bash
# The prefix cache's disk tier (--kv-cache-dir, src/server/pcache_disk.c) on the CUDA backend: the
# engine test (blocks evicted from GPU memory written to disk and read back into fresh GPU blocks,
# logits of a memory hit, damaged files refused, the size limit, reuse after a restart), then
# `smelt serve --device cuda` end to end with the built-in model (python3 stdlib): a prompt whose
# prefix was evicted is served from disk with the answer of a server with memory to spare, and the
# smelt_kv_disk_* metrics move.
#
# usage (repo root): source bench/cuda/device_env.sh first, then
#   bash bench/server/device_ssd_check.sh [BUILD_DIR]
#   BUILD_DIR  a smelt build with CUDA (default build-dev; configured and built here when it has no
#              smelt binary)
# environment: OUT (/tmp/out: logs), SSD_DEVICE (cuda; cpu tries the server part here)
# Prints "engine test: PASS", "server on cuda: PASS" and "device_ssd_check: PASS" when all is right.
set -o pipefail
B=${1:-build-dev}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
if [ ! -x "$B/smelt" ] || [ ! -x "$B/tests/server/test_pcache_disk" ]; then
  el "building smelt in $B"
  cmake -S . -B "$B" -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >"$OUT/ssd-cmake.log" 2>&1 &&
    cmake --build "$B" -j"$(nproc)" >"$OUT/ssd-build.log" 2>&1 ||
    { el "build failed"; tail -n 30 "$OUT/ssd-build.log" "$OUT/ssd-cmake.log"; exit 1; }
fi
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
fail=0

# ---- the engine test on the CUDA backend ----
rm -rf "$OUT/ssd-engine"
SMELT_KVDISK_DEVICE=cuda timeout 60 "$B/tests/server/test_pcache_disk" . "$OUT/ssd-engine" >"$OUT/ssd-engine.log" 2>&1
rc=$?
grep -E "^kv disk cache|passed|FAIL" "$OUT/ssd-engine.log"
if [ $rc -eq 0 ]; then echo "engine test: PASS"
elif [ $rc -eq 77 ]; then echo "engine test: SKIPPED (no usable CUDA backend)"; fail=1
else echo "engine test: FAIL (exit $rc; log $OUT/ssd-engine.log)"; tail -20 "$OUT/ssd-engine.log"; fail=1; fi

# ---- smelt serve --device cuda, end to end ----
PY=python3
$PY - "$B/smelt" "$OUT" <<'EOF'
import json, os, re, shutil, subprocess, sys, time, urllib.request
smelt, out = sys.argv[1], sys.argv[2]
kv = os.path.join(out, 'ssd-serve-kv')
shutil.rmtree(kv, ignore_errors=True)
procs = []

def start(args, name):
    log = open(os.path.join(out, name + '.log'), 'w+')
    p = subprocess.Popen([smelt, 'serve', '--device', os.environ.get('SSD_DEVICE', 'cuda'), '-m', 'models/smelt-tiny', '--host', '127.0.0.1',
                          '--port', '0', '-np', '1', '-c', '512'] + args, stderr=log, stdout=subprocess.DEVNULL)
    procs.append(p)
    for _ in range(600):
        time.sleep(0.05)
        log.seek(0)
        m = re.search(r'listening on (http://\S+)', log.read())
        if m: return p, m.group(1), log
        if p.poll() is not None: break
    log.seek(0)
    sys.exit('server did not start:\n' + log.read())

def ask(url, system, q):
    body = json.dumps({'messages': [{'role': 'system', 'content': system}, {'role': 'user', 'content': q}],
                       'max_tokens': 16, 'temperature': 0, 'logprobs': True}).encode()
    r = urllib.request.urlopen(urllib.request.Request(url + '/v1/chat/completions', body,
                                                      {'content-type': 'application/json'}), timeout=60)
    r = json.load(r)
    c = r['choices'][0]
    return c['message']['content'], [round(t['logprob'], 3) for t in c['logprobs']['content']], \
        r['usage']['prompt_tokens_details']['cached_tokens'], r['usage']['prompt_tokens']

def metrics(url):
    t = urllib.request.urlopen(url + '/metrics', timeout=10).read().decode()
    return {k: float(v) for k, v in re.findall(r'^(smelt_\w+) (\S+)$', t, re.M)}

# about 300 tokens each: the second evicts most of the first from 32 blocks of 16
lib = 'You are a careful assistant for a small library. ' + 'Answer briefly and cite the shelf number. ' * 30
sea = 'Completely different text about the weather and the sea. ' * 24
ok = True
try:
    # reference: memory to spare, the prefix reused from memory
    p, url, _ = start(['--kv-blocks', '256'], 'ssd-ref')
    ask(url, lib, 'Where are the maps?')
    ask(url, sea, 'Hi')
    ref = ask(url, lib, 'Who wrote Emma?')
    print(f"prompt tokens {ref[3]}")
    p.terminate(); p.wait()
    # 32 blocks: the second prompt evicts the first one's blocks to disk
    p, url, log = start(['--kv-blocks', '32', '--kv-cache-dir', kv], 'ssd-disk')
    t = time.time()
    ask(url, lib, 'Where are the maps?')
    ask(url, sea, 'Hi')
    m0 = metrics(url)
    got = ask(url, lib, 'Who wrote Emma?')
    m = metrics(url)
    p.terminate(); p.wait()
    print(f"server on {os.environ.get('SSD_DEVICE', 'cuda')}: reference cached_tokens {ref[2]}, disk tier cached_tokens {got[2]}; "
          f"blocks written {m['smelt_kv_disk_writes_total']:.0f}, read back {m['smelt_kv_disk_hits_total']:.0f} "
          f"({m['smelt_kv_disk_read_bytes_total']:.0f} bytes), rejected {m['smelt_kv_disk_rejected_total']:.0f}")
    checks = [(m0['smelt_kv_disk_writes_total'] >= 10, 'evicted blocks written'),
              (m['smelt_kv_disk_hits_total'] >= 10, 'blocks read back'),
              (got[2] == ref[2] and got[2] > 0, 'cached_tokens as with memory to spare'),
              (got[0] == ref[0], 'the same text'),
              (max(abs(a - b) for a, b in zip(got[1], ref[1])) <= 2e-3 and len(got[1]) == len(ref[1]), 'the same logprobs'),
              (m['smelt_kv_disk_rejected_total'] == 0, 'nothing rejected')]
    for c, what in checks:
        if not c:
            print('server on cuda: FAIL:', what, got, ref)
            ok = False
    # a restart reuses what was written at shutdown
    p, url, _ = start(['--kv-blocks', '32', '--kv-cache-dir', kv], 'ssd-restart')
    again = ask(url, lib, 'Who wrote Emma?')
    m = metrics(url)
    p.terminate(); p.wait()
    # the question and answer of the last request were written at shutdown too: at least as much reused
    if again[2] < ref[2] or again[0] != ref[0] or m['smelt_kv_disk_hits_total'] < 10:
        print('server on cuda: FAIL: restart', again, ref, m.get('smelt_kv_disk_hits_total'))
        ok = False
finally:
    for q in procs:
        if q.poll() is None: q.kill()
print('server on cuda:', 'PASS' if ok else 'FAIL')
sys.exit(0 if ok else 1)
EOF
[ $? -eq 0 ] || fail=1
el "done"
[ $fail -eq 0 ] && echo "device_ssd_check: PASS" || { echo "device_ssd_check: FAIL"; exit 1; }
