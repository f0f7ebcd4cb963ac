// Quantized KV caches (-ctk q8_0 / q4_0) in `smelt serve`: the prefix cache serves a repeated prompt
// from its quantized blocks, and concurrent requests, batched and preempted (requeued and recomputed)
// when the KV runs out, give each request's answer alone. Model: the tiny random-weight test model.
// Outputs are compared with SMELT_CPU_EXACT=1: the same tokens, log-probabilities within 2e-5.
// Env: SMELT_BIN, MAKE_TEST_MODEL, SMELT_TEST_MODEL_DIR, NODE_PATH.
import { execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import * as L from './lib.mjs';
import { test, metric, same, dist, TOL } from './lib.mjs';

const { OpenAI } = L.requirePackages({ OpenAI: 'openai' });
const [BIN] = L.needEnv('SMELT_BIN');
const ROOT = process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-kvq-server-test';
fs.rmSync(ROOT, { recursive: true, force: true });
fs.mkdirSync(ROOT, { recursive: true });
const MODEL = path.join(ROOT, 'model');
execFileSync(process.env.MAKE_TEST_MODEL, [MODEL]);
const ENV = { ...process.env, SMELT_CPU_EXACT: '1' };

const startServer = (args) => L.startServer(BIN, ['serve', ...L.LOCAL, '-c', '512', '--device', 'cpu', ...args], { env: ENV, OpenAI });

const SYSTEM = 'You are a careful assistant for a small library. ' + 'Answer briefly and cite the shelf number. '.repeat(3);
// the question first: prompts share no block, so that four do not fit in the cache together
const ask = (q, extra = {}) => ({ model: 'm', messages: [{ role: 'system', content: q + ' ' + SYSTEM }, { role: 'user', content: q }],
  max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 2, ...extra });
const answer = (c) => c.logprobs.content.map((t) => [t.token, t.logprob]);
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
  L.setupFailed(e);
} finally {
  L.stopAll();
}
L.finish();
