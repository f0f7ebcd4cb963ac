// Hybrid models (recurrent layers next to attention) in `smelt serve`: each sequence's recurrent state
// follows it through continuous batches, n > 1 (forked state), preemption (requeued and recomputed)
// and repeated prompts; the prefix cache is not used (cached_tokens 0); prompt cache files and slot
// save/restore are refused with a message. Models: the tiny random-weight test model in the layouts of
// Qwen3.5 (Gated DeltaNet), LFM2 (short convolution) and Nemotron-H (Mamba-2), two layers each.
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
const ROOT = process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-hybrid-server-test';
fs.rmSync(ROOT, { recursive: true, force: true });
fs.mkdirSync(ROOT, { recursive: true });
const FAMILIES = ['qwen3_5_text', 'lfm2', 'nemotron_h'];
const MODELS = {};
for (const f of FAMILIES) {
  MODELS[f] = path.join(ROOT, f);
  execFileSync(process.env.MAKE_TEST_MODEL, [MODELS[f], '2', f]);
}
const ENV = { ...process.env, SMELT_CPU_EXACT: '1' };

const SERVE = ['serve', ...L.LOCAL, '-c', '512'];
const startServer = (args) => L.startServer(BIN, [...SERVE, ...args], { env: ENV, OpenAI });
const refuse = (args) => L.refuse(BIN, [...SERVE, ...args], { env: ENV });

const SYSTEM = 'You are a careful assistant for a small library. ' + 'Answer briefly and cite the shelf number. '.repeat(3);
const ask = (q, extra = {}) => ({ model: 'm', messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: q }],
  max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 2, ...extra });
// the tokens and their log-probabilities of a choice
const answer = (c) => c.logprobs.content.map((t) => [t.token, t.logprob]);
const QS = ['Where are the maps?', 'Who wrote Emma?', 'Is there a reading room on the second floor?', 'What opens at nine?'];

try {
  for (const fam of FAMILIES) {
    await test(`${fam}: batches, repeats, n = 2 and preemption give each request's answer alone`, async () => {
      // -np 4 with 24 KV blocks of 16: four requests of ~200 tokens do not fit at once
      const S = await startServer(['-m', MODELS[fam], '-np', '4', '--kv-blocks', '24']);
      assert.match(S.log(), new RegExp(`model '.*' \\(${fam}\\)`));
      const alone = [];
      for (const q of QS) {
        const r = await S.client.chat.completions.create(ask(q));
        assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0, 'no prefix reuse for recurrent models');
        assert.equal(r.choices[0].logprobs.content.length, 24);
        alone.push(answer(r.choices[0]));
      }
      for (let i = 0; i < QS.length; i++)
        for (let j = 0; j < i; j++) assert.ok(dist(alone[i], alone[j]) > 5 * TOL, `prompts ${i} and ${j} give distinct answers`);
      // the same prompt again: a fresh state, the same answer
      const again = await S.client.chat.completions.create(ask(QS[0]));
      assert.equal(again.usage.prompt_tokens_details.cached_tokens, 0);
      let worst = same(answer(again.choices[0]), alone[0], 'the prompt again');
      // n = 2: both choices continue from (a copy of) the prompt's state
      const two = await S.client.chat.completions.create(ask(QS[1], { n: 2 }));
      assert.equal(two.choices.length, 2);
      for (const c of two.choices) worst = Math.max(worst, same(answer(c), alone[1], 'a choice of n = 2'));
      // concurrent requests: in one batch, and preempted (requeued, state recomputed) when the KV runs out
      let preempted = 0;
      for (let round = 0; round < 5 && !preempted; round++) {
        const together = await Promise.all(QS.map((q) => S.client.chat.completions.create(ask(q, { max_tokens: 24 }))));
        together.forEach((r, i) => { worst = Math.max(worst, same(answer(r.choices[0]), alone[i], `concurrent request ${i}`)); });
        preempted = await metric(S.url, 'smelt_preemptions_total');
      }
      console.log(`     ${fam}: largest difference to the answers alone ${worst.toExponential(2)}`);
      assert.ok(preempted > 0, 'a preemption happened');
      assert.equal(await metric(S.url, 'smelt_kv_cache_blocks_used'), 0);
      assert.equal(await metric(S.url, 'smelt_prefix_cache_hit_tokens_total'), 0);
      await S.stop();
    });
  }

  await test('prompt cache files and slot save/restore are refused for recurrent models', async () => {
    const m = MODELS.qwen3_5_text;
    const [st, err] = refuse(['-m', m, '--prompt-cache', path.join(ROOT, 'p.kv')]);
    assert.equal(st, 1, err);
    assert.match(err, /--prompt-cache: models with recurrent layers \(qwen3_5_text\) do not use the prefix cache/);
    const DIR = path.join(ROOT, 'slots');
    fs.mkdirSync(DIR, { recursive: true });
    const S = await startServer(['-m', m, '--slot-save-path', DIR]);
    await S.client.chat.completions.create(ask(QS[0]));
    for (const action of ['save', 'restore']) {
      const r = await fetch(`${S.url}/slots/0?action=${action}`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ filename: 'zero.kv' }) });
      assert.equal(r.status, 501, action);
      assert.match((await r.json()).error.message, /recurrent layers \(qwen3_5_text\)/);
    }
    assert.ok(!fs.existsSync(path.join(DIR, 'zero.kv')));
    const e = await fetch(`${S.url}/slots/0?action=erase`, { method: 'POST' });
    assert.equal(e.status, 200);
    await S.stop();
  });
} catch (e) {
  L.setupFailed(e);
} finally {
  L.stopAll();
}
L.finish();
