// Several models in one `smelt serve` (--models-dir, repeated -m): routing by the request's
// `model`, /v1/models with each model's status, 404 model_not_found, loading on demand into an
// LRU pool of one model, concurrent requests to both models (none fails: a model with requests
// in flight is never unloaded), the bounded wait for a model that cannot be loaded yet, per-model
// metrics. Models: two tiny random-weight test models of different depth (make_test_model) and
// the built-in smelt-tiny (slow enough on the CPU to hold a model while another waits).
// Answers are compared with single-model servers of the same models, not with fixed strings.
// Env: SMELT_BIN, MAKE_TEST_MODEL, SMELT_TEST_MODEL_DIR, SMELT_TINY, NODE_PATH.
import { spawnSync, execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import * as L from './lib.mjs';
import { test, post, metricValue as metric } from './lib.mjs';

const { OpenAI } = L.requirePackages({ OpenAI: 'openai' });
const [BIN, TINY] = L.needEnv('SMELT_BIN', 'SMELT_TINY');
const ROOT = process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-models-test';
fs.rmSync(ROOT, { recursive: true, force: true });
fs.mkdirSync(ROOT, { recursive: true });
const ALPHA = path.join(ROOT, 'alpha'), BETA = path.join(ROOT, 'beta');
execFileSync(process.env.MAKE_TEST_MODEL, [ALPHA, '2']);
execFileSync(process.env.MAKE_TEST_MODEL, [BETA, '3']);
// a directory that holds no model is left out of --models-dir
fs.mkdirSync(path.join(ROOT, 'empty'));

const startServer = (args) => L.startServer(BIN, ['serve', ...L.LOCAL, ...args]);
const metrics = L.metricsText;

// a chat request whose answer (text and logprobs) depends on the model's weights
const ask = (model, q, n = 12) => ({ model, messages: [{ role: 'user', content: q }], max_tokens: n, temperature: 0,
  logprobs: true, top_logprobs: 2 });
const answer = (r) => JSON.stringify([r.choices[0].message.content, r.choices[0].logprobs.content.map((t) => [t.token, t.logprob.toFixed(4)])]);

try {
  const SA = await startServer(['-m', ALPHA, '-np', '2', '-c', '256']);
  const SB = await startServer(['-m', BETA, '-np', '2', '-c', '256']);
  const M = await startServer(['--models-dir', ROOT, '--models-max', '1', '-np', '2', '-c', '256']);
  const m = new OpenAI({ baseURL: M.url + '/v1', apiKey: 'x', maxRetries: 0 });
  const ref = {};
  for (const [name, S] of [['alpha', SA], ['beta', SB]]) {
    const c = new OpenAI({ baseURL: S.url + '/v1', apiKey: 'x', maxRetries: 0 });
    ref[name] = [];
    for (const q of ['Hello', 'What is two plus two?', 'Name a colour'])
      ref[name].push(answer(await c.chat.completions.create(ask('whatever', q))));
  }

  await test('the two test models answer differently (so routing can be seen)', async () => {
    assert.notEqual(ref.alpha[0], ref.beta[0]);
  });

  await test('/v1/models lists every model of --models-dir, none loaded yet', async () => {
    const l = await m.models.list();
    assert.deepEqual(l.data.map((x) => x.id), ['alpha', 'beta']);
    for (const x of l.data) assert.equal(x.status.value, 'unloaded');
    assert.match(M.log(), /2 models, loaded on first use \(at most 1 at once\)/);
  });

  await test('an unknown model is a 404 model_not_found (also GET /v1/models/{id})', async () => {
    await assert.rejects(m.chat.completions.create(ask('gamma', 'Hello')),
      (e) => e.status === 404 && e.code === 'model_not_found' && /gamma/.test(e.message));
    const r = await fetch(M.url + '/v1/models/gamma');
    assert.equal(r.status, 404);
    assert.equal((await r.json()).error.code, 'model_not_found');
    const e = await post(M.url + '/v1/embeddings', { model: 'gamma', input: 'x' });
    assert.equal(e.status, 404);
  });

  await test('the request\'s model picks the model: answers equal the single-model servers\'', async () => {
    for (const name of ['alpha', 'beta', 'alpha']) {
      const r = await m.chat.completions.create(ask(name, 'Hello'));
      assert.equal(r.model, name);
      assert.equal(answer(r), ref[name][0], name);
    }
    // completions and the utility endpoints route too
    const c = await (await post(M.url + '/v1/completions', { model: 'beta', prompt: 'Hi', max_tokens: 4, temperature: 0 })).json();
    assert.equal(c.model, 'beta');
    const props = await (await fetch(M.url + '/props?model=beta')).json();
    assert.equal(props.model_alias, 'beta');
    const tk = await (await post(M.url + '/tokenize', { model: 'alpha', content: 'abc' })).json();
    assert.equal(tk.tokens.length, 3);
  });

  await test('a budget of one model: the least recently used one is unloaded', async () => {
    await m.chat.completions.create(ask('alpha', 'Hello', 2));
    let t = await metrics(M.url);
    assert.equal(metric(t, 'smelt_model_loaded{model="alpha"}'), 1);
    assert.equal(metric(t, 'smelt_model_loaded{model="beta"}'), 0);
    const unloads = metric(t, 'smelt_model_unloads_total{model="beta"}');
    assert.ok(unloads >= 1, 'beta was unloaded for alpha');
    const l = await m.models.list();
    assert.deepEqual(l.data.map((x) => x.status.value), ['loaded', 'unloaded']);
    await m.chat.completions.create(ask('beta', 'Hello', 2));
    t = await metrics(M.url);
    assert.equal(metric(t, 'smelt_model_loaded{model="alpha"}'), 0);
    assert.equal(metric(t, 'smelt_model_loaded{model="beta"}'), 1);
    assert.ok(metric(t, 'smelt_model_unloads_total{model="alpha"}') >= 1);
    // per-model series
    assert.ok(metric(t, 'smelt_generation_tokens_total{model="alpha"}') > 0);
    assert.ok(metric(t, 'smelt_generation_tokens_total{model="beta"}') > 0);
    assert.ok(metric(t, 'smelt_kv_cache_blocks_total{model="beta"}') > 0);
    assert.ok(Number.isNaN(metric(t, 'smelt_kv_cache_blocks_total{model="alpha"}')), 'no gauges of an unloaded model');
  });

  await test('concurrent requests to both models under a budget of one: all answered, as alone', async () => {
    const t0 = await metrics(M.url);
    const jobs = [];
    for (let i = 0; i < 4; i++)
      for (const name of ['alpha', 'beta'])
        jobs.push(m.chat.completions.create(ask(name, ['Hello', 'What is two plus two?', 'Name a colour'][i % 3])).then((r) => [name, i, r]));
    const got = await Promise.all(jobs);
    for (const [name, i, r] of got) {
      assert.equal(r.model, name);
      assert.equal(answer(r), ref[name][i % 3], `${name} ${i}`);
    }
    const t1 = await metrics(M.url);
    const loads = (n) => metric(t1, `smelt_model_loads_total{model="${n}"}`) - metric(t0, `smelt_model_loads_total{model="${n}"}`);
    assert.ok(loads('alpha') + loads('beta') >= 1, 'a model was swapped in');
  });

  await test('requests for a model being loaded wait for it: one load serves them all', async () => {
    const D = await startServer(['-m', ALPHA, '-m', BETA, '--models-max', '2', '-np', '4', '-c', '256']);
    const d = new OpenAI({ baseURL: D.url + '/v1', apiKey: 'x', maxRetries: 0 });
    // -m paths: the models are named by their directories; the first is the default
    assert.deepEqual((await d.models.list()).data.map((x) => x.id), ['alpha', 'beta']);
    const rs = await Promise.all([0, 1, 2].map(() => d.chat.completions.create(ask('beta', 'Hello'))));
    for (const r of rs) assert.equal(answer(r), ref.beta[0]);
    const t = await metrics(D.url);
    assert.equal(metric(t, 'smelt_model_loads_total{model="beta"}'), 1);
    // no model named: the first -m
    const r = await (await post(D.url + '/v1/chat/completions', { ...ask(undefined, 'Hello') })).json();
    assert.equal(r.model, 'alpha');
    assert.equal(answer(r), ref.alpha[0]);
    // both loaded (--models-max 2), requests to both at once
    const both = await Promise.all(['alpha', 'beta', 'alpha', 'beta'].map((n) => d.chat.completions.create(ask(n, 'Name a colour'))));
    both.forEach((x, i) => assert.equal(answer(x), ref[i % 2 ? 'beta' : 'alpha'][2]));
    assert.equal(metric(await metrics(D.url), 'smelt_model_unloads_total{model="alpha"}'), 0);
  });

  await test('a model that cannot be loaded in time: 503 model_loading after --models-load-timeout', async () => {
    const W = await startServer(['-m', TINY, '-m', ALPHA, '--models-max', '1', '--models-load-timeout', '1', '-np', '1', '-c', '512']);
    const w = new OpenAI({ baseURL: W.url + '/v1', apiKey: 'x', maxRetries: 0 });
    // smelt-tiny (the first, default model) is held by requests in flight or queued for it: 24
    // answers of 480 tokens one after another (-np 1) take far longer than the 1 s wait below
    const stop = new AbortController();
    let done = 0;
    const long = [...Array(24)].map(() => w.completions.create(
      { model: 'smelt-tiny', prompt: 'Once upon a time', max_tokens: 480, temperature: 0, ignore_eos: true },
      { signal: stop.signal }).then((r) => { done++; return r; }, (e) => e));
    const first = await Promise.race(long);
    assert.equal(first.usage.completion_tokens, 480);
    const t0 = Date.now();
    await assert.rejects(w.chat.completions.create(ask('alpha', 'Hello')),
      (e) => e.status === 503 && e.code === 'model_loading');
    assert.ok(Date.now() - t0 >= 900, 'waited about --models-load-timeout');
    // the wait cut none of them short, and some were still queued or running when it ended
    assert.ok(done < 24, 'the model was free before the wait ended: the test proves nothing');
    stop.abort();
    for (const r of await Promise.all(long))
      assert.ok(r.usage ? r.usage.completion_tokens === 480 : r.name === 'APIUserAbortError' || /abort/i.test(String(r)), String(r));
    // once it is free, alpha comes in
    const r = await w.chat.completions.create(ask('alpha', 'Hello'));
    assert.equal(answer(r), ref.alpha[0]);
  });

  await test('bad model lists are refused at start', async () => {
    const empty = path.join(ROOT, 'empty');
    let r = spawnSync(BIN, ['serve', '--models-dir', empty, '--port', '0'], { encoding: 'utf8', timeout: 20000 });
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /holds no model/);
    r = spawnSync(BIN, ['serve', '-m', ALPHA, '-m', BETA, '--alias', 'x', '--port', '0'], { encoding: 'utf8', timeout: 20000 });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /--alias names the one model/);
    r = spawnSync(BIN, ['serve', '-m', ALPHA, '-m', ALPHA, '--port', '0'], { encoding: 'utf8', timeout: 20000 });
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /two models are named 'alpha'/);
    r = spawnSync(BIN, ['serve', '--models-dir', ROOT, '--models-memory', 'lots', '--port', '0'], { encoding: 'utf8', timeout: 20000 });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /--models-memory: 'lots'/);
  });

  await test('--models-memory: a model larger than the budget is refused with a clear error', async () => {
    const S = await startServer(['--models-dir', ROOT, '--models-memory', '1K', '-np', '1', '-c', '128']);
    const r = await post(S.url + '/v1/chat/completions', ask('alpha', 'Hello'));
    assert.equal(r.status, 500);
    const e = (await r.json()).error;
    assert.equal(e.code, 'model_load_failed');
    assert.match(e.message, /needs about .* more than --models-memory/);
    const l = await (await fetch(S.url + '/v1/models')).json();
    assert.equal(l.data[0].status.value, 'failed');
  });

  await test('servers exit cleanly on SIGTERM', async () => {
    for (const s of L.servers) {
      if (s.exitCode !== null || s.signalCode !== null) continue;
      const done = new Promise((res) => s.on('exit', (code, sig) => res([code, sig])));
      s.kill('SIGTERM');
      const [code, sig] = await done;
      assert.equal(code, 0, `server exited with ${code} (signal ${sig})`);
    }
  });
} catch (e) {
  L.setupFailed(e);
} finally {
  L.stopAll();
}
L.finish();
