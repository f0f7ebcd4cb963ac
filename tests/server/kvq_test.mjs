// Quantized KV caches (-ctk q8_0 / q4_0) in `smelt serve`: the prefix cache serves a repeated prompt
// from its quantized blocks, and concurrent requests, batched and preempted (requeued and recomputed)
// when the KV runs out, give each request's answer alone. Model: the tiny random-weight test model.
// Outputs are compared with SMELT_CPU_EXACT=1: the same tokens, log-probabilities within 2e-5.
// Env: SMELT_BIN, MAKE_TEST_MODEL, SMELT_TEST_MODEL_DIR, NODE_PATH.
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

const nodePath = process.env.NODE_PATH || path.resolve(path.dirname(new URL(import.meta.url).pathname), '../node/node_modules');
const require = createRequire(path.join(nodePath, 'noop.js'));
let OpenAI;
try {
  OpenAI = require('openai');
  OpenAI = OpenAI.OpenAI || OpenAI.default || OpenAI;
} catch (e) {
  console.log('openai npm package not installed: skipping', e.message);
  process.exit(77);
}
const BIN = process.env.SMELT_BIN;
const ROOT = process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-kvq-server-test';
if (!BIN) { console.log('SMELT_BIN not set: skipping'); process.exit(77); }
fs.rmSync(ROOT, { recursive: true, force: true });
fs.mkdirSync(ROOT, { recursive: true });
const MODEL = path.join(ROOT, 'model');
execFileSync(process.env.MAKE_TEST_MODEL, [MODEL]);
const ENV = { ...process.env, SMELT_CPU_EXACT: '1' };

const servers = [];
function startServer(args) {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, ['serve', '--host', '127.0.0.1', '--port', '0', '-c', '512', '--device', 'cpu', ...args],
      { stdio: ['ignore', 'ignore', 'pipe'], env: ENV });
    servers.push(p);
    let log = '';
    const t = setTimeout(() => reject(new Error('server did not start:\n' + log)), 30000);
    const exited = new Promise((res) => p.on('exit', (code, sig) => res([code, sig])));
    p.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/[^\s]+)/.exec(log);
      if (m) {
        clearTimeout(t);
        const client = new OpenAI({ baseURL: m[1] + '/v1', apiKey: 'x', maxRetries: 0 });
        const stop = async () => {
          p.kill('SIGTERM');
          const [code, sig] = await exited;
          assert.equal(code, 0, `server exited with ${code} (${sig}):\n${log}`);
          return log;
        };
        resolve({ url: m[1], client, log: () => log, stop });
      }
    });
    exited.then(([code]) => { clearTimeout(t); reject(new Error(`server exited (${code}):\n${log}`)); });
  });
}
async function metric(url, name) {
  const t = await (await fetch(url + '/metrics')).text();
  const m = new RegExp('^' + name + ' (\\S+)$', 'm').exec(t);
  return m ? Number(m[1]) : NaN;
}

const results = [];
async function test(name, fn) {
  const t0 = Date.now();
  try { await fn(); results.push([name, true]); console.log(`ok   ${name} (${Date.now() - t0} ms)`); }
  catch (e) { results.push([name, false]); console.log(`FAIL ${name}: ${e.stack || e}`); }
}

const SYSTEM = 'You are a careful assistant for a small library. ' + 'Answer briefly and cite the shelf number. '.repeat(3);
// the question first: prompts share no block, so that four do not fit in the cache together
const ask = (q, extra = {}) => ({ model: 'm', messages: [{ role: 'system', content: q + ' ' + SYSTEM }, { role: 'user', content: q }],
  max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 2, ...extra });
const answer = (c) => c.logprobs.content.map((t) => [t.token, t.logprob]);
// the largest log-probability difference of two answers (Infinity when their tokens differ)
const TOL = 2e-5;
function dist(a, b) {
  if (a.length !== b.length) return Infinity;
  let d = 0;
  for (let i = 0; i < a.length; i++) {
    if (a[i][0] !== b[i][0]) return Infinity;
    d = Math.max(d, Math.abs(a[i][1] - b[i][1]));
  }
  return d;
}
function same(a, b, what) {
  const d = dist(a, b);
  assert.ok(d <= TOL, `${what}: differs by ${d}\n${JSON.stringify(a)}\n${JSON.stringify(b)}`);
  return d;
}
const QS = ['Where are the maps?', 'Who wrote Emma?', 'Is there a reading room on the second floor?', 'What opens at nine?'];

try {
  for (const kv of ['q8_0', 'q4_0']) {
    await test(`-ctk ${kv}: prefix cache hits, batches and preemption give each request's answer alone`, async () => {
      // -np 4 with 24 KV blocks of 16: four requests of ~200 tokens do not fit at once
      const S = await startServer(['-m', MODEL, '-ctk', kv, '-np', '4', '--kv-blocks', '24']);
      const alone = [];
      let worst = 0;
      for (const q of QS) {
        const r = await S.client.chat.completions.create(ask(q));
        assert.equal(r.choices[0].logprobs.content.length, 24);
        alone.push(answer(r.choices[0]));
        // the same prompt again at once (before other prompts evict its blocks): its full blocks come
        // from the prefix cache, the answer is the same
        const again = await S.client.chat.completions.create(ask(q));
        assert.ok(again.usage.prompt_tokens_details.cached_tokens >= 160,
          `prefix cache reuse: ${again.usage.prompt_tokens_details.cached_tokens} cached tokens`);
        worst = Math.max(worst, same(answer(again.choices[0]), alone.at(-1), 'the prompt again (prefix cache)'));
      }
      for (let i = 0; i < QS.length; i++)
        for (let j = 0; j < i; j++) assert.ok(dist(alone[i], alone[j]) > 5 * TOL, `prompts ${i} and ${j} give distinct answers`);
      let preempted = 0;
      for (let round = 0; round < 5 && !preempted; round++) {
        const together = await Promise.all(QS.map((q) => S.client.chat.completions.create(ask(q))));
        together.forEach((r, i) => { worst = Math.max(worst, same(answer(r.choices[0]), alone[i], `concurrent request ${i}`)); });
        preempted = await metric(S.url, 'smelt_preemptions_total');
      }
      console.log(`     ${kv}: largest difference to the answers alone ${worst.toExponential(2)}`);
      assert.ok(preempted > 0, 'a preemption happened');
      assert.equal(await metric(S.url, 'smelt_kv_cache_blocks_used'), 0);
      assert.ok(await metric(S.url, 'smelt_prefix_cache_hit_tokens_total') > 0);
      await S.stop();
    });
  }
} catch (e) {
  console.log('FAIL setup:', e.stack || e);
  results.push(['setup', false]);
} finally {
  for (const p of servers) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
}
const failed = results.filter(([, ok]) => !ok).length;
console.log(`${results.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
