// End-to-end tests of `smelt serve` with the official openai npm client.
// Env: SMELT_BIN, MAKE_TEST_MODEL, SMELT_TEST_MODEL_DIR, NODE_PATH (tests/node/node_modules).
// The model is a tiny random-weight llama with a byte-level tokenizer (tests/server/make_test_model.c),
// so the checks are consistency checks against independent paths (stream vs non-stream, batched vs
// alone, with vs without stop strings, chat vs responses), not fixed expected strings.
import { spawnSync, execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import net from 'node:net';
import * as L from './lib.mjs';
import { test, metric } from './lib.mjs';

const { OpenAI } = L.requirePackages({ OpenAI: 'openai' });
const [BIN] = L.needEnv('SMELT_BIN');
const MODEL = process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-srvtest-model';
execFileSync(process.env.MAKE_TEST_MODEL, [MODEL]); // always: the model's files change with the generator

const startServer = (args, env = {}) =>
  L.startServer(BIN, ['serve', '-m', MODEL, ...L.LOCAL, ...args], { env: { ...process.env, ...env }, timeout: 20000 });

// Sends raw bytes, returns the first response {status, headers, body} (or null when the server
// closes without one); gives up after ms.
function rawRequest(url, bytes, ms = 5000) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const sock = net.connect(Number(u.port), u.hostname);
    let buf = Buffer.alloc(0), done = false;
    const finish = (v) => { if (!done) { done = true; clearTimeout(t); sock.destroy(); resolve(v); } };
    const t = setTimeout(() => { done = true; sock.destroy(); reject(new Error('no response within ' + ms + ' ms')); }, ms);
    const parse = () => {
      const i = buf.indexOf('\r\n\r\n');
      if (i < 0) return null;
      const head = buf.subarray(0, i).toString('latin1').split('\r\n');
      const headers = {};
      for (const l of head.slice(1)) { const k = l.indexOf(':'); headers[l.slice(0, k).trim().toLowerCase()] = l.slice(k + 1).trim(); }
      const len = Number(headers['content-length'] ?? -1);
      if (len < 0 || buf.length < i + 4 + len) return null;
      return { status: Number(head[0].split(' ')[1]), headers, body: buf.subarray(i + 4, i + 4 + len).toString() };
    };
    sock.on('data', (d) => { buf = Buffer.concat([buf, d]); const r = parse(); if (r) finish(r); });
    sock.on('error', () => finish(parse()));
    sock.on('close', () => finish(parse()));
    sock.write(bytes);
  });
}

const LONG = 'The quick brown fox jumps over the lazy dog while the cat watches from the old wooden fence. '.repeat(3);

async function main() {
  const A = await startServer(['-c', '4096', '-np', '4', '--alias', 'tiny-test', '--allowed-origins', 'http://a.example']);
  const client = new OpenAI({ baseURL: A.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something.' }];

  await test('models', async () => {
    const list = await client.models.list();
    assert.equal(list.data.length, 1);
    assert.equal(list.data[0].id, 'tiny-test');
    const h = await (await fetch(A.url + '/health')).json();
    assert.equal(h.status, 'ok');
  });

  let greedyChat;
  await test('chat non-streaming + streaming agree', async () => {
    const r = await client.chat.completions.create({ model: 'tiny-test', messages: msgs, max_tokens: 24, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 24);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    greedyChat = r.choices[0].message.content;
    const stream = await client.chat.completions.create({ model: 'tiny-test', messages: msgs, max_tokens: 24, temperature: 0,
      stream: true, stream_options: { include_usage: true } });
    let text = '', finish = null, usage = null, role = null, chunks = 0;
    for await (const ch of stream) {
      chunks++;
      if (ch.usage) usage = ch.usage;
      for (const c of ch.choices) {
        if (c.delta.role) role = c.delta.role;
        if (c.delta.content) text += c.delta.content;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(role, 'assistant');
    assert.equal(text, greedyChat);
    assert.equal(finish, r.choices[0].finish_reason);
    assert.ok(usage, 'include_usage chunk');
    assert.equal(usage.completion_tokens, r.usage.completion_tokens);
    assert.equal(usage.prompt_tokens, r.usage.prompt_tokens);
    assert.ok(chunks >= 3);
  });

  await test('chat prompt encoded like the CLI: rendered template without added special tokens', async () => {
    // the test tokenizer's post-processor prepends <|endoftext|> to raw text (completions) ...
    const c = await client.completions.create({ model: 'x', prompt: 'abc', max_tokens: 1, temperature: 0 });
    assert.equal(c.usage.prompt_tokens, 1 + 3);
    // ... but a rendered chat template is encoded as it is: one token per ChatML special, one per byte
    const rendered = msgs.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join('') + '<|im_start|>assistant\n';
    const specials = rendered.match(/<\|im_(start|end)\|>/g).length;
    const bytes = Buffer.byteLength(rendered.replace(/<\|im_(start|end)\|>/g, ''));
    const r = await client.chat.completions.create({ model: 'x', messages: msgs, max_tokens: 1, temperature: 0 });
    assert.equal(r.usage.prompt_tokens, specials + bytes);
    // and `smelt run` encodes the same conversation to the same number of tokens
    const cli = spawnSync(BIN, ['run', '-m', MODEL, '-sys', msgs[0].content, '-p', msgs[1].content, '-n', '1', '--temp', '0', '--device', 'cpu'],
      { encoding: 'utf8', timeout: 30000 });
    const m = /\[prompt (\d+) tokens/.exec(cli.stderr);
    assert.ok(m, 'smelt run stats: ' + cli.stderr);
    assert.equal(Number(m[1]), r.usage.prompt_tokens);
  });

  await test('completions non-streaming + streaming agree; logprobs', async () => {
    const r = await client.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 20, temperature: 0, logprobs: 3 });
    assert.equal(r.object, 'text_completion');
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, r.usage.completion_tokens - (r.choices[0].finish_reason === 'stop' ? 1 : 0));
    for (let i = 0; i < lp.tokens.length; i++) {
      const tops = Object.values(lp.top_logprobs[i]);
      assert.ok(tops.length >= 1 && tops.length <= 3);
      // greedy: the chosen token has the highest logprob
      assert.ok(Math.abs(Math.max(...tops) - lp.token_logprobs[i]) < 1e-5, 'greedy token is the top-1');
      assert.ok(lp.token_logprobs[i] <= 0);
    }
    const s = await client.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 20, temperature: 0, stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices[0]?.text ?? '';
    assert.equal(text, r.choices[0].text);
  });

  await test('chat logprobs format', async () => {
    const r = await client.chat.completions.create({ messages: msgs, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2, model: 'x' });
    const c = r.choices[0].logprobs.content;
    assert.ok(c.length >= 1);
    for (const e of c) {
      assert.equal(typeof e.token, 'string');
      assert.ok(Array.isArray(e.bytes));
      assert.equal(e.top_logprobs.length, 2);
      assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
      assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5);
    }
  });

  await test('stop strings cut the text (non-streaming and streaming)', async () => {
    const base = await client.completions.create({ model: 'x', prompt: 'abc', max_tokens: 40, temperature: 1, seed: 11 });
    const full = base.choices[0].text;
    assert.ok(full.length >= 6, 'need some text: ' + JSON.stringify(full));
    // a stop string from the middle of the seeded output (ASCII-safe slice)
    const cps = [...full];
    const mid = Math.floor(cps.length / 2);
    const stop = cps.slice(mid, mid + 2).join('');
    const expect = full.slice(0, full.indexOf(stop));
    const r = await client.completions.create({ model: 'x', prompt: 'abc', max_tokens: 40, temperature: 1, seed: 11, stop: [stop] });
    assert.equal(r.choices[0].text, expect);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const s = await client.completions.create({ model: 'x', prompt: 'abc', max_tokens: 40, temperature: 1, seed: 11, stop, stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices[0]?.text ?? '';
    assert.equal(text, expect);
  });

  await test('seeded sampling is reproducible; n choices', async () => {
    const a = await client.chat.completions.create({ model: 'x', messages: msgs, max_tokens: 16, temperature: 1, seed: 5 });
    const b = await client.chat.completions.create({ model: 'x', messages: msgs, max_tokens: 16, temperature: 1, seed: 5 });
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    const g = await client.chat.completions.create({ model: 'x', messages: msgs, max_tokens: 24, temperature: 0, n: 3 });
    assert.equal(g.choices.length, 3);
    for (const c of g.choices) assert.equal(c.message.content, greedyChat); // forked prompt == single greedy
    assert.deepEqual(g.choices.map((c) => c.index), [0, 1, 2]);
    const n = await client.chat.completions.create({ model: 'x', messages: msgs, max_tokens: 16, temperature: 1.5, n: 3, seed: 9 });
    assert.equal(new Set(n.choices.map((c) => c.message.content)).size > 1, true, 'different seeds per choice');
  });

  await test('tools: held-back streaming equals non-streaming; json_object mode', async () => {
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
    const base = { model: 'x', messages: msgs, max_tokens: 24, temperature: 0.9, seed: 3, tools };
    const r = await client.chat.completions.create(base);
    const s = await client.chat.completions.create({ ...base, stream: true });
    let text = '', finish = null;
    for await (const ch of s) for (const c of ch.choices) { if (c.delta.content) text += c.delta.content; if (c.finish_reason) finish = c.finish_reason; }
    assert.equal(text, r.choices[0].message.content ?? '');
    assert.equal(finish, r.choices[0].finish_reason);
    // tools change the prompt (they are rendered by the chat template)
    const plain = await client.chat.completions.create({ ...base, tools: undefined });
    assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens);
    const j = await client.chat.completions.create({ model: 'x', messages: msgs, max_tokens: 40, temperature: 1, seed: 4, response_format: { type: 'json_object' } });
    const c = j.choices[0].message.content;
    assert.ok(c === '' || c.startsWith('{'), JSON.stringify(c));
  });

  await test('concurrent clients get the same outputs as alone', async () => {
    const prompts = Array.from({ length: 8 }, (_, i) => `Prompt number ${i}: ` + 'x'.repeat(i * 7));
    const req = (p, i) => client.completions.create({ model: 'x', prompt: p, max_tokens: 32, temperature: i % 2 ? 0 : 0.9, seed: 100 + i });
    const alone = [];
    for (let i = 0; i < prompts.length; i++) alone.push((await req(prompts[i], i)).choices[0].text);
    const together = await Promise.all(prompts.map((p, i) => req(p, i)));
    for (let i = 0; i < prompts.length; i++) assert.equal(together[i].choices[0].text, alone[i], `prompt ${i}`);
  });

  await test('prefix cache: repeated long prompt reports cached_tokens', async () => {
    const before = await metric(A.url, 'smelt_prefix_cache_hit_tokens_total');
    const r1 = await client.completions.create({ model: 'x', prompt: LONG + 'one', max_tokens: 4, temperature: 0 });
    const r2 = await client.completions.create({ model: 'x', prompt: LONG + 'two', max_tokens: 4, temperature: 0 });
    assert.ok(r1.usage.prompt_tokens > 200);
    const c2 = r2.usage.prompt_tokens_details.cached_tokens;
    assert.ok(c2 >= 200, `cached_tokens ${c2}`);
    assert.ok(c2 < r2.usage.prompt_tokens);
    const after = await metric(A.url, 'smelt_prefix_cache_hit_tokens_total');
    assert.ok(after - before >= c2);
    // chat too
    const m = [{ role: 'user', content: LONG }];
    await client.chat.completions.create({ model: 'x', messages: m, max_tokens: 2 });
    const c = await client.chat.completions.create({ model: 'x', messages: m, max_tokens: 2 });
    assert.ok(c.usage.prompt_tokens_details.cached_tokens > 0);
  });

  await test('responses API (non-streaming + streaming) matches chat', async () => {
    const r = await client.responses.create({ model: 'x', instructions: 'You are terse.', input: 'Say something.', max_output_tokens: 24, temperature: 0 });
    assert.equal(r.object, 'response');
    assert.equal(r.output_text, greedyChat);
    assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
    const s = await client.responses.create({ model: 'x', instructions: 'You are terse.', input: 'Say something.', max_output_tokens: 24, temperature: 0, stream: true });
    let text = '', types = [];
    let completed = null;
    for await (const ev of s) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') completed = ev.response;
    }
    assert.equal(types[0], 'response.created');
    // a truncated answer is incomplete outside, inside and in the stream's last event
    assert.equal(types.at(-1), r.status === 'incomplete' ? 'response.incomplete' : 'response.completed');
    assert.equal(completed.status, r.status);
    assert.equal(r.output[0].status, r.status === 'incomplete' ? 'incomplete' : 'completed');
    assert.equal(text, greedyChat);
    assert.equal(completed.output[0].content[0].text, greedyChat);
  });

  await test('client disconnect cancels and frees KV blocks', async () => {
    const base = await metric(A.url, 'smelt_kv_cache_blocks_used');
    const cancelled0 = await metric(A.url, 'smelt_requests_cancelled_total');
    const ac = new AbortController();
    const s = await client.completions.create({ model: 'x', prompt: LONG, max_tokens: 3800, temperature: 0, stream: true },
      { signal: ac.signal });
    let got = 0, during = NaN;
    try {
      for await (const ch of s) {
        got++;
        if (got === 3) { during = await metric(A.url, 'smelt_kv_cache_blocks_used'); ac.abort(); }
      }
    } catch (e) { /* aborted */ }
    assert.ok(during > base, `blocks in use while streaming (${during} vs ${base})`);
    let now = NaN;
    for (let i = 0; i < 50; i++) {
      now = await metric(A.url, 'smelt_kv_cache_blocks_used');
      if (now === base) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(now, base, 'KV blocks back to baseline');
    assert.equal(await metric(A.url, 'smelt_requests_cancelled_total'), cancelled0 + 1);
    assert.equal(await metric(A.url, 'smelt_sequences_running'), 0);
  });

  await test('bad input -> OpenAI error bodies', async () => {
    const post = (p, body, headers = {}) => fetch(A.url + p, { method: 'POST', body, headers: { 'Content-Type': 'application/json', ...headers } });
    const check = async (res, status, param) => {
      assert.equal(res.status, status);
      const j = await res.json();
      assert.equal(typeof j.error.message, 'string');
      assert.equal(typeof j.error.type, 'string');
      assert.ok('param' in j.error && 'code' in j.error);
      if (param !== undefined) assert.equal(j.error.param, param);
      return j;
    };
    await check(await post('/v1/chat/completions', '{"messages": [ {"role":'), 400, null);
    await check(await post('/v1/chat/completions', '{"messages": "hi"}'), 400, 'messages');
    await check(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, temperature: 'hot' })), 400, 'temperature');
    await check(await post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: -1 })), 400, 'max_tokens');
    const big = await check(await post('/v1/completions', JSON.stringify({ prompt: 'x'.repeat(5000) })), 400, 'prompt');
    assert.equal(big.error.code, 'context_length_exceeded');
    const over = await check(await post('/v1/completions', JSON.stringify({ prompt: 'hello', max_tokens: 4095 })), 400);
    assert.equal(over.error.code, 'context_length_exceeded');
    // too large a declared body: 413 at once, before any body byte is sent (raw socket: a client
    // library would fail on the upload that the server refuses to read)
    const early = await rawRequest(A.url, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
      `Content-Length: ${2 << 20}\r\n\r\n`);
    assert.equal(early.status, 413);
    assert.equal(JSON.parse(early.body).error.code, 'request_too_large');
    await check(await fetch(A.url + '/v1/nope'), 404);
    await check(await fetch(A.url + '/v1/chat/completions'), 405);
    // the openai client surfaces the error
    await assert.rejects(client.chat.completions.create({ model: 'x', messages: [] }), (e) => e.status === 400);
    // CORS preflight
    const pre = await fetch(A.url + '/v1/chat/completions', { method: 'OPTIONS', headers: { Origin: 'http://a.example', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization,content-type' } });
    assert.ok(pre.status === 204 || pre.status === 200);
    assert.equal(pre.headers.get('access-control-allow-origin'), 'http://a.example');
    assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
    const other = await fetch(A.url + '/v1/models', { headers: { Origin: 'http://evil.example' } });
    assert.equal(other.headers.get('access-control-allow-origin'), null);
    // preflight: requested headers are answered from an allow-list, not echoed; other origins get nothing
    const pre2 = await fetch(A.url + '/v1/chat/completions', { method: 'OPTIONS', headers: { Origin: 'http://a.example',
      'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'x-stainless-os, x-evil, authorization' } });
    const allowed = pre2.headers.get('access-control-allow-headers').toLowerCase();
    assert.ok(allowed.includes('x-stainless-os') && allowed.includes('authorization') && !allowed.includes('x-evil'), allowed);
    const pre3 = await fetch(A.url + '/v1/chat/completions', { method: 'OPTIONS', headers: { Origin: 'http://evil.example',
      'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization' } });
    assert.equal(pre3.headers.get('access-control-allow-origin'), null);
    assert.equal(pre3.headers.get('access-control-allow-headers'), null);
    // duplicate keys are refused; chat_template_kwargs cannot replace the messages
    await check(await post('/v1/completions', '{"prompt":"a","max_tokens":1,"max_tokens":2}'), 400);
    await check(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, chat_template_kwargs: { messages: [] } })),
      400, 'chat_template_kwargs');
    // the server is still alive
    assert.equal((await client.models.list()).data[0].id, 'tiny-test');
  });

  await test('metrics', async () => {
    const t = await (await fetch(A.url + '/metrics')).text();
    for (const n of ['smelt_requests_total{endpoint="/v1/chat/completions",status="200"}', 'smelt_requests_total{endpoint="/v1/chat/completions",status="400"}',
      'smelt_prompt_tokens_total', 'smelt_generation_tokens_total', 'smelt_requests_queued', 'smelt_sequences_running',
      'smelt_time_to_first_token_seconds_count', 'smelt_inter_token_latency_seconds_count', 'smelt_kv_cache_blocks_total',
      'smelt_prefix_cache_hit_tokens_total']) assert.ok(t.includes(n + ' '), n);
    assert.ok((await metric(A.url, 'smelt_time_to_first_token_seconds_count')) > 10);
    assert.ok((await metric(A.url, 'smelt_kv_cache_blocks_total')) > 0);
  });

  // second server: auth, env vars (flags override env), tight queue
  const B = await startServer(['-np', '1', '--max-queue', '1', '--api-key', 'sekret'],
    { LLAMA_ARG_CTX_SIZE: '4096', LLAMA_ARG_N_PARALLEL: '3', LLAMA_ARG_ALIAS: 'from-env' });
  await test('api key auth (401) and LLAMA_ARG_* env', async () => {
    const bad = new OpenAI({ baseURL: B.url + '/v1', apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    const none = await fetch(B.url + '/v1/models');
    assert.equal(none.status, 401);
    assert.equal((await none.json()).error.type, 'authentication_error');
    assert.equal((await fetch(B.url + '/health')).status, 200);
    const good = new OpenAI({ baseURL: B.url + '/v1', apiKey: 'sekret', maxRetries: 0 });
    const m = await good.models.list();
    assert.equal(m.data[0].id, 'from-env');
    assert.equal(m.data[0].meta.n_ctx, 4096);
  });
  await test('queue full -> 429', async () => {
    const good = new OpenAI({ baseURL: B.url + '/v1', apiKey: 'sekret', maxRetries: 0 });
    const retryAfter = [];
    const reqs = Array.from({ length: 6 }, () => good.completions.create({ model: 'x', prompt: LONG, max_tokens: 600, temperature: 0 })
      .then(() => 200, (e) => {
        if (e.status === 429) retryAfter.push(typeof e.headers?.get === 'function' ? e.headers.get('retry-after') : e.headers?.['retry-after']);
        return e.status;
      }));
    const st = await Promise.all(reqs);
    assert.ok(retryAfter.length > 0 && retryAfter.every((v) => Number(v) >= 1), 'Retry-After on 429: ' + retryAfter);
    assert.ok(st.filter((s) => s === 429).length >= 3, 'statuses ' + st);
    assert.ok(st.filter((s) => s === 200).length >= 1, 'statuses ' + st);
    assert.ok(st.every((s) => s === 200 || s === 429), 'statuses ' + st);
  });

  // third server: a KV cache too small for all requests at once -> preemption (requeue), same outputs
  const C = await startServer(['-c', '256', '-np', '4', '--kv-blocks', '16']);
  await test('KV exhaustion preempts and requeues; outputs unchanged', async () => {
    const cc = new OpenAI({ baseURL: C.url + '/v1', apiKey: 'x', maxRetries: 0 });
    const req = (i) => cc.completions.create({ model: 'x', prompt: `prompt ${i} abc`, max_tokens: 200, temperature: 0.8, seed: i })
      .then((r) => r.choices[0].text);
    const alone = [];
    for (let i = 0; i < 4; i++) alone.push(await req(i));
    /* whether the four overlap enough to exhaust the cache depends on arrival timing (the
     * model generates fast): repeat the concurrent round (outputs checked every time) until
     * a preemption has happened, at most 5 times */
    for (let round = 0; round < 5; round++) {
      const together = await Promise.all([0, 1, 2, 3].map(req));
      assert.deepEqual(together, alone);
      if ((await metric(C.url, 'smelt_preemptions_total')) > 0) break;
    }
    assert.ok((await metric(C.url, 'smelt_preemptions_total')) > 0, 'preemption happened');
    assert.equal(await metric(C.url, 'smelt_kv_cache_blocks_used'), 0);
  });

  /* SIGTERM ends each server with status 0 (under ASan+UBSan a report at exit, a leak, fails here) */
  await test('servers exit cleanly on SIGTERM', async () => {
    for (const s of L.servers) {
      const done = s.exitCode !== null || s.signalCode !== null ? Promise.resolve([s.exitCode, s.signalCode])
        : new Promise((res) => s.on('exit', (code, sig) => res([code, sig])));
      s.kill('SIGTERM');
      const [code, sig] = await done;
      assert.equal(code, 0, `server exited with ${code} (signal ${sig}):\n${s.smeltLog().slice(-4000)}`);
    }
  });
  L.finish();
}

main().catch((e) => { console.error(e); L.stopAll(); process.exit(1); });
