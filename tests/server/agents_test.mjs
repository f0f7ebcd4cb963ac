// Agent-facing API of `smelt serve` with the official clients: the Anthropic SDK against
// /v1/messages (text, streaming, tool use, count_tokens, errors), reasoning split for a template
// that opens <think>, llama-server's utility endpoints, GET /v1/models/{id}, and llama-server
// flags accepted with a notice. The model is the tiny random-weight test model
// (make_test_model), so checks compare independent paths, not fixed strings.
// Env: SMELT_BIN, MAKE_TEST_MODEL, SMELT_TEST_MODEL_DIR, NODE_PATH.
import { execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import * as L from './lib.mjs';
import { test, post } from './lib.mjs';

const { OpenAI, Anthropic } = L.requirePackages({ OpenAI: 'openai', Anthropic: '@anthropic-ai/sdk' });
const [BIN] = L.needEnv('SMELT_BIN');
const MODEL = (process.env.SMELT_TEST_MODEL_DIR || '/tmp/smelt-agents-model');
execFileSync(process.env.MAKE_TEST_MODEL, [MODEL]);
// the same model with a template whose generation prompt opens a <think> block (as Qwen3's does)
const THINK = MODEL + '-think';
fs.rmSync(THINK, { recursive: true, force: true });
fs.mkdirSync(THINK);
for (const f of fs.readdirSync(MODEL)) fs.copyFileSync(path.join(MODEL, f), path.join(THINK, f));
const tc = JSON.parse(fs.readFileSync(path.join(THINK, 'tokenizer_config.json'), 'utf8'));
tc.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";
fs.writeFileSync(path.join(THINK, 'tokenizer_config.json'), JSON.stringify(tc));

const startServer = (model, args) => L.startServer(BIN, ['serve', '-m', model, ...L.LOCAL, ...args], { timeout: 20000 });

const tools = [{ name: 'get_weather', description: 'Weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'], additionalProperties: false } }];
try {
  // llama-server flags that mean nothing here are accepted, each with a notice
  const A = await startServer(MODEL, ['-np', '4', '-ngl', '99', '-fa', 'on', '--jinja', '-cb', '--metrics']);
  const anth = new Anthropic({ baseURL: A.url, apiKey: 'x', maxRetries: 0 });
  const oai = new OpenAI({ baseURL: A.url + '/v1', apiKey: 'x', maxRetries: 0 });

  await test('llama-server flags are accepted with a notice', async () => {
    for (const f of ['-ngl 99', '-fa', '--jinja', '-cb', '--metrics']) assert.match(A.log(), new RegExp('note: ' + f.split(' ')[0] + '.*no effect'));
  });

  await test('anthropic SDK: messages.create, stream == non-stream, stop sequences, usage', async () => {
    const req = { model: 'm', max_tokens: 24, temperature: 0, system: 'Be brief.', messages: [{ role: 'user', content: 'Hello there' }] };
    const r = await anth.messages.create(req);
    assert.equal(r.type, 'message');
    assert.equal(r.role, 'assistant');
    assert.match(r.id, /^msg_/);
    assert.equal(r.content[0].type, 'text');
    assert.ok(['end_turn', 'max_tokens'].includes(r.stop_reason));
    assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
    const s = anth.messages.stream(req);
    let text = '';
    s.on('text', (t) => { text += t; });
    const fin = await s.finalMessage();
    assert.equal(text, r.content[0].text);
    assert.equal(fin.content[0].text, r.content[0].text);
    assert.equal(fin.stop_reason, r.stop_reason);
    // the same as chat completions with the same prompt
    const c = await oai.chat.completions.create({ model: 'm', max_tokens: 24, temperature: 0,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }] });
    assert.equal(r.content[0].text, c.choices[0].message.content);
    // a stop sequence taken from the answer ends it there
    const word = r.content[0].text.trim().split(/\s+/)[1];
    if (word) {
      const st = await anth.messages.create({ ...req, stop_sequences: [word] });
      assert.equal(st.stop_reason, 'stop_sequence');
      assert.equal(st.stop_sequence, word);
      assert.ok(!st.content[0].text.includes(word));
    }
    const n = await anth.messages.countTokens({ model: 'm', system: 'Be brief.', messages: [{ role: 'user', content: 'Hello there' }] });
    assert.equal(n.input_tokens, c.usage.prompt_tokens);
  });

  await test('anthropic SDK: tool_choice any/tool gives tool_use blocks; streamed input_json adds up', async () => {
    for (let i = 0; i < 3; i++) {
      const req = { model: 'm', max_tokens: 100, temperature: 1, seed: 30 + i, tools, tool_choice: i ? { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true } : { type: 'any', disable_parallel_tool_use: true },
        messages: [{ role: 'user', content: 'Weather in Oslo?' }] };
      const r = await anth.messages.create(req);
      assert.equal(r.stop_reason, 'tool_use', JSON.stringify(r));
      const tu = r.content.find((b) => b.type === 'tool_use');
      assert.equal(tu.name, 'get_weather');
      assert.match(tu.id, /^toolu_/);
      assert.equal(typeof tu.input.city, 'string');
      const s = anth.messages.stream(req);
      let json = '';
      s.on('inputJson', (delta) => { json += delta; });
      const fin = await s.finalMessage();
      const ftu = fin.content.find((b) => b.type === 'tool_use');
      assert.deepEqual(ftu.input, tu.input);
      assert.deepEqual(JSON.parse(json), tu.input);
      // the conversation goes on with the result
      const next = await anth.messages.create({ model: 'm', max_tokens: 8, temperature: 0, tools, messages: [
        { role: 'user', content: 'Weather in Oslo?' }, { role: 'assistant', content: r.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: 'Sunny, 20 C' }] }] });
      assert.equal(next.type, 'message');
    }
  });

  await test('anthropic errors: shape and status', async () => {
    const r = await post(A.url + '/v1/messages', { model: 'm', messages: [{ role: 'user', content: 'x' }] });
    assert.equal(r.status, 400);
    const e = await r.json();
    assert.equal(e.type, 'error');
    assert.equal(e.error.type, 'invalid_request_error');
    assert.match(e.error.message, /max_tokens/);
    await assert.rejects(anth.messages.create({ model: 'm', max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }),
      (err) => err.status === 400);
  });

  await test('llama-server endpoints: tokenize, detokenize, apply-template, props, slots; models/{id}', async () => {
    const t = await (await post(A.url + '/tokenize', { content: 'Hello, world' })).json();
    assert.ok(t.tokens.length > 0);
    const d = await (await post(A.url + '/detokenize', { tokens: t.tokens })).json();
    assert.equal(d.content, 'Hello, world');
    const wp = await (await post(A.url + '/tokenize', { content: 'Hi', with_pieces: true })).json();
    assert.equal(wp.tokens.map((x) => x.piece).join(''), 'Hi');
    const at = await (await post(A.url + '/apply-template', { messages: [{ role: 'user', content: 'Q?' }] })).json();
    const c = await oai.chat.completions.create({ model: 'm', max_tokens: 1, messages: [{ role: 'user', content: 'Q?' }] });
    const tt = await (await post(A.url + '/tokenize', { content: at.prompt })).json();
    assert.equal(tt.tokens.length, c.usage.prompt_tokens);
    const props = await (await fetch(A.url + '/props')).json();
    assert.equal(props.total_slots, 4);
    assert.ok(props.default_generation_settings.n_ctx > 0);
    const slots = await (await fetch(A.url + '/slots')).json();
    assert.equal(slots.length, 4);
    const list = await oai.models.list();
    const id = list.data[0].id;
    assert.ok(list.data[0].created > 1.6e9);
    const m = await oai.models.retrieve(id);
    assert.equal(m.id, id);
    await assert.rejects(oai.models.retrieve('no-such-model'), (e) => e.status === 404);
    const bad = await post(A.url + '/detokenize', { tokens: [1e9] });
    assert.equal(bad.status, 400);
  });

  await test('logit_bias bans and forces tokens; ignore_eos; n_probs gives top logprobs', async () => {
    const req = { model: 'm', prompt: 'The', max_tokens: 4, temperature: 0 };
    const a = await oai.completions.create({ ...req, logprobs: 1 });
    const first = (await (await post(A.url + '/tokenize', { content: a.choices[0].logprobs.tokens[0] })).json()).tokens;
    assert.equal(first.length, 1);
    const banned = await oai.completions.create({ ...req, logprobs: 1, logit_bias: { [first[0]]: -100 } });
    assert.notEqual(banned.choices[0].logprobs.tokens[0], a.choices[0].logprobs.tokens[0]);
    const forced = await oai.completions.create({ ...req, logit_bias: { [first[0] === 65 ? 66 : 65]: 100 } });
    assert.equal(forced.choices[0].text, String.fromCharCode(first[0] === 65 ? 66 : 65).repeat(4));
    const np = await (await post(A.url + '/v1/chat/completions', { model: 'm', max_tokens: 2, messages: [{ role: 'user', content: 'x' }], n_probs: 3 })).json();
    assert.equal(np.choices[0].logprobs.content[0].top_logprobs.length, 3);
    // <|im_end|> (257, the end-of-sequence token) forced: it ends the answer unless ignore_eos
    const eos = await oai.completions.create({ ...req, logit_bias: { 257: 100 } });
    assert.equal(eos.choices[0].finish_reason, 'stop');
    assert.equal(eos.usage.completion_tokens, 1);
    const on = await oai.completions.create({ ...req, logit_bias: { 257: 100 }, ignore_eos: true });
    assert.equal(on.choices[0].finish_reason, 'length');
    assert.equal(on.usage.completion_tokens, 4);
    const badEos = await post(A.url + '/v1/completions', { ...req, ignore_eos: 'yes' });
    assert.equal(badEos.status, 400);
    const bad = await post(A.url + '/v1/completions', { ...req, logit_bias: { abc: 1 } });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, 'logit_bias');
  });

  await test('completions with an array of prompts: prompt-major choices equal single requests', async () => {
    const one = async (p) => oai.completions.create({ model: 'm', prompt: p, max_tokens: 6, temperature: 0 });
    const [a, b] = [await one('Alpha beta'), await one([5, 6, 7, 8])];
    const r = await oai.completions.create({ model: 'm', prompt: ['Alpha beta', [5, 6, 7, 8]], max_tokens: 6, temperature: 0, n: 2 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
    assert.equal(r.choices[0].text, a.choices[0].text);
    assert.equal(r.choices[1].text, a.choices[0].text);
    assert.equal(r.choices[2].text, b.choices[0].text);
    assert.equal(r.usage.prompt_tokens, a.usage.prompt_tokens + b.usage.prompt_tokens);
    const e = await oai.completions.create({ model: 'm', prompt: ['x', 'y'], max_tokens: 2, echo: true, temperature: 0 });
    assert.ok(e.choices[0].text.startsWith('x') && e.choices[1].text.startsWith('y'));
    const big = await post(A.url + '/v1/completions', { prompt: ['a', 'b', 'c', 'd', 'e'], max_tokens: 2 });
    assert.equal(big.status, 400);
  });

  await test('embeddings: float and base64 agree, unit length, batch == alone, errors', async () => {
    const a = await oai.embeddings.create({ model: 'm', input: ['first text', 'second one'], encoding_format: 'float' });
    assert.equal(a.data.length, 2);
    assert.deepEqual(a.data.map((d) => d.index), [0, 1]);
    const v = a.data[0].embedding;
    assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-4);
    const alone = await oai.embeddings.create({ model: 'm', input: 'second one', encoding_format: 'float' });
    assert.deepEqual(alone.data[0].embedding, a.data[1].embedding);
    const raw = await (await post(A.url + '/v1/embeddings', { input: 'first text', encoding_format: 'base64' })).json();
    const buf = Buffer.from(raw.data[0].embedding, 'base64');
    const f = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
    assert.equal(f.length, v.length);
    for (let i = 0; i < f.length; i++) assert.ok(Math.abs(f[i] - v[i]) < 1e-6);
    const ids = (await (await post(A.url + '/tokenize', { content: 'first text', add_special: true })).json()).tokens;
    const byIds = await oai.embeddings.create({ model: 'm', input: ids, encoding_format: 'float' });
    assert.deepEqual(byIds.data[0].embedding, v);
    assert.equal(a.usage.prompt_tokens, ids.length + (await (await post(A.url + '/tokenize', { content: 'second one', add_special: true })).json()).tokens.length);
    for (const bad of [{}, { input: [] }, { input: [[]] }, { input: 'x', encoding_format: 'hex' }]) {
      const r = await post(A.url + '/v1/embeddings', bad);
      assert.equal(r.status, 400, JSON.stringify(bad));
    }
  });

  await test('reasoning: a <think> template splits reasoning_content; reasoning_tokens; enable_thinking false', async () => {
    const T = await startServer(THINK, ['-np', '2']);
    const o = new OpenAI({ baseURL: T.url + '/v1', apiKey: 'x', maxRetries: 0 });
    const req = { model: 'm', max_tokens: 20, temperature: 1, seed: 11, messages: [{ role: 'user', content: 'Think.' }] };
    const r = await o.chat.completions.create(req);
    const m = r.choices[0].message;
    // the random model never closes </think>: everything is reasoning
    assert.ok(m.reasoning_content && m.reasoning_content.length > 0, JSON.stringify(m));
    assert.equal(m.content, '');
    assert.equal(r.usage.completion_tokens_details.reasoning_tokens, r.usage.completion_tokens);
    let rs = '', content = '';
    for await (const ch of await o.chat.completions.create({ ...req, stream: true })) {
      const d = ch.choices[0]?.delta ?? {};
      if (d.reasoning_content) rs += d.reasoning_content;
      if (d.content) content += d.content;
    }
    assert.equal(rs.trim(), m.reasoning_content);
    assert.equal(content, '');
    // enable_thinking false: the template closes the block, the output is content
    const nr = await o.chat.completions.create({ ...req, chat_template_kwargs: { enable_thinking: false } });
    assert.ok(!nr.choices[0].message.reasoning_content);
    assert.equal(nr.usage.completion_tokens_details.reasoning_tokens, 0);
    // responses API: a reasoning item before the message
    const rr = await o.responses.create({ model: 'm', input: 'Think.', max_output_tokens: 20, temperature: 1, seed: 11 });
    assert.equal(rr.output[0].type, 'reasoning');
    assert.equal(rr.output[0].content[0].text, m.reasoning_content);
    assert.equal(rr.usage.output_tokens_details.reasoning_tokens, rr.usage.output_tokens);
    // --reasoning-format none keeps it in the content
    const N = await startServer(THINK, ['-np', '1', '--reasoning-format', 'none']);
    const on = new OpenAI({ baseURL: N.url + '/v1', apiKey: 'x', maxRetries: 0 });
    const nn = await on.chat.completions.create(req);
    assert.ok(!nn.choices[0].message.reasoning_content);
    assert.equal(nn.choices[0].message.content.trim(), m.reasoning_content);
  });
} catch (e) {
  L.setupFailed(e);
} finally {
  L.stopAll('SIGTERM');
}
L.finish();
