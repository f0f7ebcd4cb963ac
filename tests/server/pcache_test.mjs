// Prompt cache files in `smelt serve` (--prompt-cache FILE, --prompt-cache-ro): the longest prompt
// prefix that requests shared is written at shutdown; a server started with the file reuses it
// for its very first request (cached_tokens, prefix-cache metrics) with the same answer as a
// server without it; -ro never writes; corrupt, truncated, other-model and other-KV-type files
// are refused at start with a message saying which. Model: the tiny random-weight test model
// (make_test_model) and a deeper one for the mismatch.
// Env: SMELT_BIN, MAKE_TEST_MODEL, SMELT_TEST_MODEL_DIR, NODE_PATH.
import { execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import * as L from './lib.mjs';
import { test, metric } from './lib.mjs';

const { OpenAI } = L.requirePackages({ OpenAI: 'openai' });
const [BIN] = L.needEnv('SMELT_BIN');
const ROOT = process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-pcache-test';
fs.rmSync(ROOT, { recursive: true, force: true });
fs.mkdirSync(ROOT, { recursive: true });
const MODEL = path.join(ROOT, 'model'), OTHER = path.join(ROOT, 'other');
execFileSync(process.env.MAKE_TEST_MODEL, [MODEL, '2']);
execFileSync(process.env.MAKE_TEST_MODEL, [OTHER, '3']);
const FILE = path.join(ROOT, 'system.kv');

const SERVE = ['serve', ...L.LOCAL, '-np', '2', '-c', '512'];
const startServer = (args) => L.startServer(BIN, [...SERVE, ...args], { OpenAI });
// a server that must not start: its status and message
const refuse = (args) => L.refuse(BIN, [...SERVE, ...args]);

const SYSTEM = 'You are a careful assistant for a small library. ' + 'Answer briefly and cite the shelf number. '.repeat(5);
const ask = (q, n = 8) => ({ model: 'm', messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: q }],
  max_tokens: n, temperature: 0, logprobs: true, top_logprobs: 2 });
const answer = (r) => JSON.stringify([r.choices[0].message.content, r.choices[0].logprobs.content.map((t) => [t.token, t.logprob.toFixed(4)])]);
const sha = (f) => crypto.createHash('sha256').update(fs.readFileSync(f)).digest('hex');

try {
  let saved = 0;
  await test('a new file: written at shutdown with the prefix the requests shared', async () => {
    fs.rmSync(FILE, { force: true });
    const A = await startServer(['-m', MODEL, '--prompt-cache', FILE]);
    assert.match(A.log(), /prompt cache .* does not exist yet: written at shutdown/);
    const r1 = await A.client.chat.completions.create(ask('Where are the maps?'));
    assert.equal(r1.usage.prompt_tokens_details.cached_tokens, 0);
    const r2 = await A.client.chat.completions.create(ask('Who wrote Emma?'));
    const shared = r2.usage.prompt_tokens_details.cached_tokens;
    assert.ok(shared >= 200, `the system prompt was reused (${shared})`);
    assert.ok(!fs.existsSync(FILE), 'written at shutdown, not before');
    const log = await A.stop();
    saved = Number(/prompt cache .*: saved (\d+) tokens/.exec(log)?.[1]);
    assert.equal(saved, shared);
    assert.ok(fs.statSync(FILE).size > 128 + 4 * saved);
  });

  await test('a server started with the file reuses it for its first request, with the same answer', async () => {
    const B = await startServer(['-m', MODEL, '--prompt-cache', FILE, '--prompt-cache-ro']);
    assert.match(B.log(), new RegExp(`prompt cache .*: ${saved} of its ${saved} tokens in the prefix cache`));
    const C = await startServer(['-m', MODEL]); // no file
    for (const q of ['What opens at nine?', 'Is there a reading room?']) {
      const rb = await B.client.chat.completions.create(ask(q));
      const rc = await C.client.chat.completions.create(ask(q));
      assert.equal(rb.usage.prompt_tokens_details.cached_tokens, saved, 'prefill skipped the cached prefix');
      assert.equal(answer(rb), answer(rc), 'the KV from the file gives the computed answer');
      if (q.startsWith('What')) assert.equal(rc.usage.prompt_tokens_details.cached_tokens, 0);
    }
    assert.ok((await metric(B.url, 'smelt_prefix_cache_hit_tokens_total')) >= 2 * saved);
    assert.ok((await metric(C.url, 'smelt_prefix_cache_hit_tokens_total')) < 2 * saved);
    // a prompt that does not start with the file's tokens reuses nothing
    const other = await B.client.chat.completions.create({ ...ask('x'), messages: [{ role: 'user', content: 'Hello there' }] });
    assert.equal(other.usage.prompt_tokens_details.cached_tokens, 0);
    await B.stop();
    await C.stop();
  });

  await test('--prompt-cache-ro never writes; without it a longer shared prefix replaces the file', async () => {
    const before = sha(FILE);
    const long = 'Here is the catalogue entry for the book I am asking about: ' + 'shelf 12, row 4, blue cover. '.repeat(4);
    const share = async (S) => {
      await S.client.chat.completions.create(ask(long + ' Who wrote it?'));
      const r = await S.client.chat.completions.create(ask(long + ' When was it printed?'));
      return r.usage.prompt_tokens_details.cached_tokens;
    };
    const R = await startServer(['-m', MODEL, '--prompt-cache', FILE, '--prompt-cache-ro']);
    assert.ok((await share(R)) > saved);
    const rlog = await R.stop();
    assert.doesNotMatch(rlog, /saved \d+ tokens/);
    assert.equal(sha(FILE), before);
    const W = await startServer(['-m', MODEL, '--prompt-cache', FILE]);
    const longer = await share(W);
    const wlog = await W.stop();
    assert.equal(Number(/saved (\d+) tokens/.exec(wlog)?.[1]), longer);
    assert.notEqual(sha(FILE), before);
    // and the new file serves its (longer) prefix
    const X = await startServer(['-m', MODEL, '--prompt-cache', FILE, '--prompt-cache-ro']);
    const r = await X.client.chat.completions.create(ask(long + ' Is it on loan?'));
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, longer);
    await X.stop();
  });

  await test('a corrupt, truncated, other-model or other-KV-type file is refused at start', async () => {
    const bad = path.join(ROOT, 'bad.kv');
    const buf = fs.readFileSync(FILE);
    const flipped = Buffer.from(buf);
    flipped[Math.floor(buf.length / 2)] ^= 0x40;
    fs.writeFileSync(bad, flipped);
    let [st, err] = refuse(['-m', MODEL, '--prompt-cache', bad]);
    assert.equal(st, 1, err);
    assert.match(err, /checksum mismatch \(the file is corrupt\)/);
    fs.writeFileSync(bad, buf.subarray(0, buf.length - 1000));
    [st, err] = refuse(['-m', MODEL, '--prompt-cache', bad]);
    assert.equal(st, 1, err);
    assert.match(err, /truncated or damaged/);
    fs.writeFileSync(bad, 'not a cache file at all, just some text that is long enough to hold a header '.repeat(4));
    [st, err] = refuse(['-m', MODEL, '--prompt-cache', bad]);
    assert.equal(st, 1, err);
    assert.match(err, /not a smelt prompt cache file/);
    [st, err] = refuse(['-m', OTHER, '--prompt-cache', FILE]);
    assert.equal(st, 1, err);
    assert.match(err, /made with another model/);
    [st, err] = refuse(['-m', MODEL, '--prompt-cache', FILE, '-ctk', 'f32', '-ctv', 'f32']);
    assert.equal(st, 1, err);
    assert.match(err, /KV format .* differs/);
    [st, err] = refuse(['-m', MODEL, '--prompt-cache', path.join(ROOT, 'absent.kv'), '--prompt-cache-ro']);
    assert.equal(st, 1, err);
    assert.match(err, /does not exist/);
    [st, err] = refuse(['-m', MODEL, '-c', '64', '--prompt-cache', FILE]);
    assert.equal(st, 1, err);
    assert.match(err, /more than the context size 64/);
    // never overwritten by a refused start
    assert.ok(fs.existsSync(FILE));
    [st, err] = refuse(['-m', MODEL, '-m', OTHER, '--prompt-cache', FILE]);
    assert.equal(st, 2, err);
    assert.match(err, /--prompt-cache works with one model/);
    [st, err] = refuse(['-m', MODEL, '--prompt-cache-ro']);
    assert.equal(st, 2, err);
    [st, err] = refuse(['-m', MODEL, '--prompt-cache', FILE, '--no-prefix-cache']);
    assert.equal(st, 2, err);
    assert.match(err, /--no-prefix-cache/);
  });

  await test('slots: save a slot to a file, restore it into a fresh server, erase; errors', async () => {
    const DIR = path.join(ROOT, 'slots');
    fs.rmSync(DIR, { recursive: true, force: true });
    fs.mkdirSync(DIR);
    const slot = (S, id, action, body) => fetch(`${S.url}/slots/${id}?action=${action}`, { method: 'POST',
      headers: { 'content-type': 'application/json' }, body: JSON.stringify(body || {}) });
    const A = await startServer(['-m', MODEL, '--slot-save-path', DIR]);
    const ra = await A.client.chat.completions.create(ask('Where are the maps?'));
    const slots = await (await fetch(A.url + '/slots')).json();
    assert.deepEqual(slots.map((x) => [x.id, x.is_processing]), [[0, false], [1, false]]);
    let r = await slot(A, 1, 'save', { filename: 'one.kv' });
    assert.equal(r.status, 400, 'slot 1 was never used');
    r = await (await slot(A, 0, 'save', { filename: 'zero.kv' })).json();
    assert.equal(r.id_slot, 0);
    assert.equal(r.filename, 'zero.kv');
    // the prompt and the generated tokens but the last, in whole blocks of 16
    const held = ra.usage.prompt_tokens + ra.usage.completion_tokens - 1;
    assert.equal(r.n_saved, Math.floor(held / 16) * 16);
    assert.equal(r.n_written, fs.statSync(path.join(DIR, 'zero.kv')).size);
    assert.ok(r.timings.save_ms >= 0);
    const saved = r.n_saved;
    r = await (await slot(A, 0, 'erase')).json();
    assert.deepEqual(r, { id_slot: 0, n_erased: held });
    assert.equal((await slot(A, 0, 'save', { filename: 'zero.kv' })).status, 400, 'erased');
    for (const [id, action, body] of [[9, 'save', { filename: 'x' }], ['x', 'save', { filename: 'x' }], [0, 'load', {}],
      [0, 'save', { filename: '../x' }], [0, 'save', { filename: '.hidden' }], [0, 'save', {}], [0, 'restore', { filename: 'absent.kv' }]]) {
      const e = await slot(A, id, action, body);
      assert.equal(e.status, 400, `${id} ${action} ${JSON.stringify(body)}`);
      assert.ok((await e.json()).error.message.length > 0);
    }
    await A.stop();
    const B = await startServer(['-m', MODEL, '--slot-save-path', DIR]);
    r = await (await slot(B, 1, 'restore', { filename: 'zero.kv' })).json();
    assert.equal(r.n_restored, saved);
    assert.equal(r.n_read, fs.statSync(path.join(DIR, 'zero.kv')).size);
    const rb = await B.client.chat.completions.create(ask('Who wrote Emma?'));
    const C = await startServer(['-m', MODEL]);
    const rc = await C.client.chat.completions.create(ask('Who wrote Emma?'));
    assert.ok(rb.usage.prompt_tokens_details.cached_tokens >= 200, 'the restored prefix is reused');
    assert.equal(rc.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(answer(rb), answer(rc));
    // no --slot-save-path: 501; erase needs no file
    assert.equal((await slot(C, 0, 'save', { filename: 'x.kv' })).status, 501);
    assert.equal((await slot(C, 0, 'erase')).status, 200);
    await B.stop();
    await C.stop();
    const O = await startServer(['-m', OTHER, '--slot-save-path', DIR]);
    const e = await slot(O, 0, 'restore', { filename: 'zero.kv' });
    assert.equal(e.status, 400);
    assert.match((await e.json()).error.message, /made with another model/);
    await O.stop();
    const [st, err] = refuse(['-m', MODEL, '--slot-save-path', path.join(ROOT, 'absent-dir')]);
    assert.equal(st, 2, err);
  });
} catch (e) {
  L.setupFailed(e);
} finally {
  L.stopAll();
}
L.finish();
