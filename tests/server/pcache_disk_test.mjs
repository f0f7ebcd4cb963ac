// The disk tier of the server's prefix cache (--kv-cache-dir DIR, --kv-cache-disk-size BYTES): with a
// memory cache too small to keep a long shared prefix, a second request with that prefix is served
// from disk (cached_tokens as large as a server with memory to spare reports, the disk counters of
// /metrics move) and answers exactly as a server computing everything; the files stay within the
// size limit; corrupt, truncated and other-model files are logged, deleted and never used (the
// answer stays right); a restarted server reuses what the previous one wrote at shutdown.
// Model: the tiny random-weight test model (make_test_model), byte-level tokenizer.
// Env: SMELT_BIN, MAKE_TEST_MODEL, SMELT_TEST_MODEL_DIR, NODE_PATH.
import { spawnSync, execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import * as L from './lib.mjs';
import { test } from './lib.mjs';

const { OpenAI } = L.requirePackages({ OpenAI: 'openai' });
const [BIN] = L.needEnv('SMELT_BIN');
const ROOT = process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-pcache-disk-test';
fs.rmSync(ROOT, { recursive: true, force: true });
fs.mkdirSync(ROOT, { recursive: true });
const MODEL = path.join(ROOT, 'model');
execFileSync(process.env.MAKE_TEST_MODEL, [MODEL, '2']);
const DEVICE = process.env.SMELT_TEST_DEVICE ? ['--device', process.env.SMELT_TEST_DEVICE] : [];

// one sequence of 512 tokens and no more KV blocks than it needs (32 of 16): a prompt of 400
// tokens evicts most of what the one before it left in the memory cache
const SMALL = ['-np', '1', '-c', '512', '--kv-blocks', '32'];
const startServer = (args) => L.startServer(BIN, ['serve', ...L.LOCAL, '-m', MODEL, ...DEVICE, ...args], { OpenAI });
const refuse = (args) => L.refuse(BIN, ['serve', ...L.LOCAL, '-m', MODEL, ...args]);
const metrics = L.metricMap;

// byte-level tokenizer: about a token per byte
const LIBRARY = 'You are a careful assistant for a small library. ' + 'Answer briefly and cite the shelf number. '.repeat(5);
const WEATHER = 'Completely different text about the weather and the sea. '.repeat(7);
const ask = (sys, q, n = 8) => ({ model: 'm', messages: [{ role: 'system', content: sys }, { role: 'user', content: q }],
  max_tokens: n, temperature: 0, logprobs: true, top_logprobs: 2 });
const answer = (r) => JSON.stringify([r.choices[0].message.content, r.choices[0].logprobs.content.map((t) => [t.token, t.logprob.toFixed(4)])]);
const cached = (r) => r.usage.prompt_tokens_details.cached_tokens;
const blockFiles = (dir) => {
  const subs = fs.existsSync(dir) ? fs.readdirSync(dir) : [];
  assert.ok(subs.length <= 1, `one model directory (${subs})`);
  if (!subs.length) return [];
  const sub = path.join(dir, subs[0]);
  return fs.readdirSync(sub).map((f) => path.join(sub, f));
};
const dirBytes = (dir) => blockFiles(dir).reduce((a, f) => a + fs.statSync(f).size, 0);
// files are written by the tier's writer thread: wait until the directory holds what /metrics counts
async function settled(url, dir) {
  for (let i = 0; i < 200; i++) {
    const m = await metrics(url);
    const files = blockFiles(dir);
    if (!files.some((f) => f.endsWith('.tmp')) && files.length === m.smelt_kv_disk_files) return m;
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.fail(`the files of ${dir} never matched /metrics`);
}

// CRC-32 (zlib's polynomial), to forge a well-formed file of another model
const CRC = new Uint32Array(256).map((_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
const crc32 = (b) => {
  let c = 0xffffffff;
  for (const x of b) c = CRC[(c ^ x) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
};

// the reference: a server with memory to spare and no disk tier
const REF = {};
try {
  const R = await startServer(['-np', '1', '-c', '512', '--kv-blocks', '256']);
  REF.first = await R.client.chat.completions.create(ask(LIBRARY, 'Where are the maps?'));
  await R.client.chat.completions.create(ask(WEATHER, 'Hi'));
  REF.again = await R.client.chat.completions.create(ask(LIBRARY, 'Who wrote Emma?'));
  assert.ok(cached(REF.again) >= 200, `the memory cache reuses the shared prefix (${cached(REF.again)})`);
  await R.stop();
  const C = await startServer(['-np', '1', '-c', '512', '--no-prefix-cache']);
  REF.cold = await C.client.chat.completions.create(ask(LIBRARY, 'Who wrote Emma?'));
  assert.equal(cached(REF.cold), 0);
  assert.equal(answer(REF.cold), answer(REF.again));
  await C.stop();

  const DIR = path.join(ROOT, 'kv');
  await test('evicted blocks go to disk and a later prompt with the prefix reads them back', async () => {
    const S = await startServer([...SMALL, '--kv-cache-dir', DIR]);
    assert.match(S.log(), /KV disk cache .*: 0 blocks \(0 bytes\) from earlier runs/);
    const r1 = await S.client.chat.completions.create(ask(LIBRARY, 'Where are the maps?'));
    assert.equal(answer(r1), answer(REF.first));
    let m = await metrics(S.url);
    assert.equal(m.smelt_kv_disk_writes_total, 0, 'nothing evicted yet');
    await S.client.chat.completions.create(ask(WEATHER, 'Hi'));
    m = await settled(S.url, DIR);
    assert.ok(m.smelt_kv_disk_writes_total >= 10, `the library prefix was evicted to disk (${m.smelt_kv_disk_writes_total})`);
    assert.equal(m.smelt_kv_disk_files, blockFiles(DIR).length);
    assert.equal(m.smelt_kv_disk_bytes, dirBytes(DIR));
    assert.equal(m.smelt_kv_disk_written_bytes_total, m.smelt_kv_disk_bytes);
    const r2 = await S.client.chat.completions.create(ask(LIBRARY, 'Who wrote Emma?'));
    assert.equal(cached(r2), cached(REF.again), 'as much reused as with memory to spare');
    assert.equal(answer(r2), answer(REF.cold), 'the KV read back gives the computed answer');
    const m2 = await metrics(S.url);
    assert.ok(m2.smelt_kv_disk_hits_total >= 10, `blocks read back (${m2.smelt_kv_disk_hits_total})`);
    assert.equal(m2.smelt_kv_disk_hit_tokens_total, 16 * m2.smelt_kv_disk_hits_total);
    assert.ok(m2.smelt_kv_disk_hit_tokens_total <= cached(r2));
    assert.equal(m2.smelt_kv_disk_read_bytes_total, m2.smelt_kv_disk_hits_total * fs.statSync(blockFiles(DIR)[0]).size);
    assert.equal(m2.smelt_kv_disk_rejected_total, 0);
    assert.equal(m2.smelt_kv_disk_limit_bytes, 10 * 2 ** 30, 'the default limit');
    await S.stop();
  });

  await test('a server restarted with the directory reuses the blocks written at shutdown', async () => {
    const DIR2 = path.join(ROOT, 'kv-restart');
    const A = await startServer(['-np', '1', '-c', '512', '--kv-cache-dir', DIR2]);
    await A.client.chat.completions.create(ask(LIBRARY, 'Where are the maps?'));
    assert.equal((await metrics(A.url)).smelt_kv_disk_writes_total, 0, 'nothing evicted');
    const log = await A.stop();
    const n = Number(/(\d+) blocks written at shutdown/.exec(log)?.[1]);
    assert.ok(n >= 10, `the prefix cache written at shutdown (${n})`);
    assert.equal(blockFiles(DIR2).length, n);
    const B = await startServer(['-np', '1', '-c', '512', '--kv-cache-dir', DIR2]);
    assert.match(B.log(), new RegExp(`KV disk cache .*: ${n} blocks \\(\\d+ bytes\\) from earlier runs`));
    const r = await B.client.chat.completions.create(ask(LIBRARY, 'Who wrote Emma?'));
    assert.equal(cached(r), cached(REF.again), 'its first request reuses the prefix');
    assert.equal(answer(r), answer(REF.cold));
    assert.equal((await metrics(B.url)).smelt_kv_disk_hit_tokens_total, cached(r));
    const log2 = await B.stop();
    // only the blocks of the new question and answer: those read back are on disk already
    const w = Number(/(\d+) blocks written at shutdown/.exec(log2)?.[1]);
    assert.ok(w >= 1 && w <= 3, `${w} new blocks written at shutdown`);
    assert.equal(blockFiles(DIR2).length, n + w);
  });

  await test('the files stay within --kv-cache-disk-size, the least recently used deleted', async () => {
    const DIR3 = path.join(ROOT, 'kv-small');
    const one = fs.statSync(blockFiles(DIR)[0]).size;
    const limit = 6 * one + 100;
    const S = await startServer([...SMALL, '--kv-cache-dir', DIR3, '--kv-cache-disk-size', String(limit)]);
    for (const [sys, q] of [[LIBRARY, 'a'], [WEATHER, 'b'], [LIBRARY, 'c'], [WEATHER, 'd']]) {
      await S.client.chat.completions.create(ask(sys, q));
      await settled(S.url, DIR3);
      assert.ok(dirBytes(DIR3) <= limit, `${dirBytes(DIR3)} bytes on disk, limit ${limit}`);
    }
    const m = await metrics(S.url);
    assert.equal(m.smelt_kv_disk_limit_bytes, limit);
    assert.equal(m.smelt_kv_disk_files, 6);
    assert.ok(m.smelt_kv_disk_evictions_total > 0, 'old files were deleted');
    assert.equal(m.smelt_kv_disk_writes_total - m.smelt_kv_disk_evictions_total, 6);
    await S.stop();
    assert.ok(dirBytes(DIR3) <= limit, 'also after shutdown');
    // a smaller limit at the next start deletes the oldest files
    const T = await startServer([...SMALL, '--kv-cache-dir', DIR3, '--kv-cache-disk-size', String(2 * one)]);
    assert.equal(blockFiles(DIR3).length, 2);
    await T.stop();
  });

  // damaged copies of a directory the first test filled
  const PRISTINE = path.join(ROOT, 'kv-pristine');
  fs.cpSync(DIR, PRISTINE, { recursive: true });
  const damaged = async (name, damage, logRe) => {
    await test(name, async () => {
      const D = path.join(ROOT, 'kv-damaged');
      fs.rmSync(D, { recursive: true, force: true });
      fs.cpSync(PRISTINE, D, { recursive: true });
      const before = blockFiles(D).length;
      const S = await startServer([...SMALL, '--kv-cache-dir', D]);
      for (const f of blockFiles(D)) damage(f);
      const r = await S.client.chat.completions.create(ask(LIBRARY, 'Who wrote Emma?'));
      assert.equal(answer(r), answer(REF.cold), 'the answer is still the computed one');
      const m = await settled(S.url, D);
      assert.equal(m.smelt_kv_disk_hits_total, 0, 'no damaged file used');
      assert.ok(m.smelt_kv_disk_rejected_total >= 1);
      assert.equal(m.smelt_kv_disk_files, before + m.smelt_kv_disk_writes_total - m.smelt_kv_disk_rejected_total -
        m.smelt_kv_disk_evictions_total);
      assert.equal(blockFiles(D).length, m.smelt_kv_disk_files, 'refused files are deleted');
      const log = await S.stop();
      assert.match(log, logRe);
      assert.match(log, /deleted/);
      const gone = log.match(/KV disk cache: .*deleted/g).length;
      assert.equal(gone, m.smelt_kv_disk_rejected_total, 'each refused file is logged once');
    });
  };
  await damaged('a corrupt file (a flipped byte) is refused, deleted and never used', (f) => {
    const b = fs.readFileSync(f);
    b[b.length >> 1] ^= 0x20;
    fs.writeFileSync(f, b);
  }, /checksum mismatch \(the file is corrupt\): deleted, never used/);
  await damaged('a truncated file is refused, deleted and never used', (f) => {
    fs.truncateSync(f, fs.statSync(f).size - 100);
  }, /truncated or damaged\): deleted, never used/);
  await damaged('a file of another model (a well-formed one) is refused, deleted and never used', (f) => {
    const b = fs.readFileSync(f);
    b[20] ^= 0xff; // the model fingerprint, with the checksum made right again
    b.writeUInt32LE(crc32(b.subarray(0, b.length - 4)), b.length - 4);
    fs.writeFileSync(f, b);
  }, /made with another model/);
  await test('files damaged before a start: the wrong size is deleted at start', async () => {
    const D = path.join(ROOT, 'kv-damaged-start');
    fs.rmSync(D, { recursive: true, force: true });
    fs.cpSync(PRISTINE, D, { recursive: true });
    const files = blockFiles(D);
    for (const f of files) fs.truncateSync(f, 1000);
    fs.writeFileSync(files[0] + '.tmp', 'a write a crash cut short');
    const S = await startServer([...SMALL, '--kv-cache-dir', D]);
    assert.match(S.log(), /truncated or damaged\): deleted/);
    assert.match(S.log(), /: 0 blocks \(0 bytes\) from earlier runs/);
    assert.equal(blockFiles(D).length, 0, 'the damaged and temporary files are gone');
    const r = await S.client.chat.completions.create(ask(LIBRARY, 'Who wrote Emma?'));
    assert.equal(answer(r), answer(REF.cold));
    assert.equal(cached(r), 0);
    await S.stop();
  });

  await test('bad flags', async () => {
    let [st, err] = refuse(['--kv-cache-disk-size', '1G']);
    assert.equal(st, 2, err);
    assert.match(err, /--kv-cache-disk-size needs --kv-cache-dir/);
    [st, err] = refuse(['--kv-cache-dir', path.join(ROOT, 'x'), '--kv-cache-disk-size', '-3']);
    assert.equal(st, 2, err);
    assert.match(err, /--kv-cache-disk-size: '-3' is not a byte count/);
    [st, err] = refuse(['--kv-cache-dir', path.join(ROOT, 'x'), '--no-prefix-cache']);
    assert.equal(st, 2, err);
    assert.match(err, /--no-prefix-cache/);
    const file = path.join(ROOT, 'a-file');
    fs.writeFileSync(file, 'x');
    [st, err] = refuse(['--kv-cache-dir', file]);
    assert.equal(st, 1, err);
    assert.match(err, /--kv-cache-dir: .*a-file is not a directory/);
    const h = spawnSync(BIN, ['serve', '--help'], { encoding: 'utf8' });
    assert.match(h.stdout, /--kv-cache-dir DIR/);
    assert.match(h.stdout, /--kv-cache-disk-size BYTES/);
  });
} catch (e) {
  L.setupFailed(e);
} finally {
  L.stopAll();
}
L.finish();
