// `smelt serve -tp 2`: a model split over two ranks (processes; on the CPU through shared memory, with
// SMELT_TP_DEVICE=cuda over two GPUs through NCCL) behind the official openai client. Its greedy answers
// and log-probabilities are those of the unsplit model, alone and in concurrent batches, streamed, and
// from the prefix cache; the ranks end with the server; a rank that dies takes the server down with an
// error that names it; a model that does not split is refused at start. Split by layers (-pp 2, -sm layer)
// its answers are the unsplit model's too, and more stages than layers are refused.
// Model: the tiny random-weight test model (4 heads, 2 KV heads, bf16). Env: SMELT_BIN, MAKE_TEST_MODEL,
// SMELT_TEST_MODEL_DIR, NODE_PATH, SMELT_TP_DEVICE (cpu).
import { execFileSync, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import * as L from './lib.mjs';
import { test, same } from './lib.mjs';

const { OpenAI } = L.requirePackages({ OpenAI: 'openai' });
const [BIN] = L.needEnv('SMELT_BIN');
const DEV = process.env.SMELT_TP_DEVICE || 'cpu';
if (DEV === 'cuda') {
  const r = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8' });
  if (r.status !== 0 || r.stdout.trim().split('\n').length < 2) { console.log('fewer than two GPUs: skipping'); process.exit(77); }
}
const ROOT = process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-tp-server-test';
fs.rmSync(ROOT, { recursive: true, force: true });
fs.mkdirSync(ROOT, { recursive: true });
const MODEL = path.join(ROOT, 'model');
execFileSync(process.env.MAKE_TEST_MODEL, [MODEL]);
const ENV = { ...process.env, SMELT_CPU_EXACT: '1' };
const serve = (args) => L.startServer(BIN, ['serve', ...L.LOCAL, '-c', '512', '--device', DEV, '-t', '1', '-m', MODEL, '-np', '4', ...args],
  { env: ENV, OpenAI });

const ask = (q) => ({ model: 'm', messages: [{ role: 'user', content: q }], max_tokens: 20, temperature: 0, logprobs: true });
const answer = (c) => c.logprobs.content.map((t) => [t.token, t.logprob]);
const QS = ['Where are the maps?', 'Who wrote Emma?', 'Is there a reading room on the second floor?', 'What opens at nine?'];
const ranksOf = (pid) => spawnSync('pgrep', ['-P', String(pid)], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean).map(Number);
const alive = (pid) => { try { process.kill(pid, 0); return true; } catch { return false; } };

try {
  const A = await serve([]);
  const ref = [];
  for (const q of QS) ref.push(answer((await A.client.chat.completions.create(ask(q))).choices[0]));
  await A.stop();

  await test(`-tp 2 (${DEV}): the unsplit model's answers, alone, together, streamed and from the prefix cache`, async () => {
    const S = await serve(['-tp', '2']);
    const ranks = ranksOf(S.proc.pid);
    assert.equal(ranks.length, 1, `one other rank process (${ranks})`);
    let worst = 0;
    for (let i = 0; i < QS.length; i++) worst = Math.max(worst, same(answer((await S.client.chat.completions.create(ask(QS[i]))).choices[0]), ref[i], `alone ${i}`));
    const together = await Promise.all(QS.map((q) => S.client.chat.completions.create(ask(q))));
    together.forEach((r, i) => { worst = Math.max(worst, same(answer(r.choices[0]), ref[i], `together ${i}`)); });
    const again = await S.client.chat.completions.create(ask(QS[2]));
    worst = Math.max(worst, same(answer(again.choices[0]), ref[2], 'again'));
    assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0, 'prefix cache hit');
    let text = '';
    for await (const ch of await S.client.chat.completions.create({ ...ask(QS[1]), stream: true })) text += ch.choices[0]?.delta?.content || '';
    assert.equal(text, ref[1].map(([t]) => t).join(''), 'streamed text');
    console.log(`     largest log-probability difference to the unsplit model ${worst.toExponential(2)}`);
    await S.stop();
    for (let k = 0; k < 50 && ranks.some(alive); k++) await new Promise((r) => setTimeout(r, 100));
    assert.ok(!ranks.some(alive), 'the other rank ended with the server');
  });

  await test('a rank that dies takes the server down with an error naming it', async () => {
    const S = await serve(['-tp', '2']);
    const [rank] = ranksOf(S.proc.pid);
    const code = new Promise((res) => S.proc.on('exit', (c) => res(c)));
    process.kill(rank, 'SIGKILL');
    const c = await Promise.race([code, new Promise((r) => setTimeout(() => r('timeout'), 15000))]);
    assert.notEqual(c, 'timeout', 'the server did not end');
    assert.notEqual(c, 0);
    assert.match(S.log(), /tensor-parallel rank 1 ended \(signal 9\)/);
  });

  await test("llama-server's -sm row -ts 1,1 splits over two ranks; unequal shares are refused", async () => {
    const S = await serve(['-sm', 'row', '-ts', '1,1']);
    assert.equal(ranksOf(S.proc.pid).length, 1, 'one other rank process');
    same(answer((await S.client.chat.completions.create(ask(QS[0]))).choices[0]), ref[0], 'answer');
    await S.stop();
    const [status, err] = L.refuse(BIN, ['serve', ...L.LOCAL, '--device', DEV, '-m', MODEL, '-sm', 'row', '-ts', '3,1'], { env: ENV });
    assert.equal(status, 2);
    assert.match(err, /equal shares/);
  });

  await test(`-pp 2, -sm layer and unequal -ts (${DEV}): the unsplit model's answers, alone, together and streamed`, async () => {
    for (const args of [['-pp', '2'], ['-sm', 'layer', '-ts', '1,1'], ['-pp', '2', '-ts', '3,1']]) {
      const S = await serve(args);
      assert.equal(ranksOf(S.proc.pid).length, 1, `${args.join(' ')}: one other rank process`);
      let worst = 0;
      for (let i = 0; i < QS.length; i++) worst = Math.max(worst, same(answer((await S.client.chat.completions.create(ask(QS[i]))).choices[0]), ref[i], `alone ${i}`));
      const together = await Promise.all(QS.map((q) => S.client.chat.completions.create(ask(q))));
      together.forEach((r, i) => { worst = Math.max(worst, same(answer(r.choices[0]), ref[i], `together ${i}`)); });
      let text = '';
      for await (const ch of await S.client.chat.completions.create({ ...ask(QS[3]), stream: true })) text += ch.choices[0]?.delta?.content || '';
      assert.equal(text, ref[3].map(([t]) => t).join(''), 'streamed text');
      console.log(`     ${args.join(' ')}: largest log-probability difference to the unsplit model ${worst.toExponential(2)}`);
      await S.stop();
    }
    const [status, err] = L.refuse(BIN, ['serve', ...L.LOCAL, '--device', DEV, '-m', MODEL, '-pp', '3'], { env: ENV });
    assert.notEqual(status, 0);
    assert.match(err, /fewer than the stages/);
    const [s2, e2] = L.refuse(BIN, ['serve', ...L.LOCAL, '--device', DEV, '-m', MODEL, '-pp', '2', '-ts', '1,1,1'], { env: ENV });
    assert.equal(s2, 2);
    assert.match(e2, /3 shares for -pp 2/);
    for (const [flag, val] of [['--prompt-cache', path.join(ROOT, 'pc.bin')], ['--slot-save-path', ROOT], ['--kv-cache-dir', path.join(ROOT, 'kvd')]]) {
      for (const split of [['-pp', '2'], ['-tp', '2']]) {
        const [s3, e3] = L.refuse(BIN, ['serve', ...L.LOCAL, '--device', DEV, '-m', MODEL, ...split, flag, val], { env: ENV });
        assert.equal(s3, 2, `${split.join(' ')} ${flag}`);
        assert.match(e3, /not with a model split over ranks/);
      }
    }
  });

  await test('-tp 3 on a model of 4 heads is refused at start', async () => {
    const [status, err] = L.refuse(BIN, ['serve', ...L.LOCAL, '--device', DEV, '-m', MODEL, '-tp', '3'], { env: ENV });
    assert.notEqual(status, 0);
    assert.match(err, /do not split evenly/);
  });
} catch (e) {
  L.setupFailed(e);
} finally {
  L.stopAll();
}
L.finish();
