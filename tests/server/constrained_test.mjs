// Constrained decoding end to end, with the official openai client and the ajv JSON Schema
// validator, on the built-in model (models/smelt-tiny: trained on plain text, so its
// unconstrained output is practically never valid JSON — checked below, so that the
// constrained results mean something).
// Env: SMELT_BIN, SMELT_MODEL (model dir), NODE_PATH (tests/node/node_modules), PAIRS (default 200).
import assert from 'node:assert/strict';
import * as L from './lib.mjs';
import { test } from './lib.mjs';

const { OpenAI, Ajv } = L.requirePackages({ OpenAI: 'openai', Ajv: 'ajv' });
const [BIN, MODEL] = L.needEnv('SMELT_BIN', 'SMELT_MODEL');
const PAIRS = Number(process.env.PAIRS || 200);

const startServer = (args) => L.startServer(BIN, ['serve', '-m', MODEL, ...L.LOCAL, ...args]);

// ---- seeded generator of schemas ----
function rng(seed) {
  let s = seed >>> 0 || 1;
  return () => { s ^= s << 13; s >>>= 0; s ^= s >> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; };
}
const WORDS = ['name', 'age', 'city', 'id', 'tags', 'ok', 'score', 'kind', 'items', 'note', 'when', 'level', 'x', 'y'];
function genSchema(r, depth = 0) {
  const pick = (a) => a[Math.floor(r() * a.length)];
  const kind = depth > 1 ? pick(['integer', 'number', 'boolean', 'string', 'enum', 'null']) :
    pick(['object', 'object', 'integer', 'number', 'boolean', 'string', 'enum', 'array', 'anyOf', 'const', 'null', 'nullable']);
  switch (kind) {
    case 'integer': return { type: 'integer' };
    case 'number': return { type: 'number' };
    case 'boolean': return { type: 'boolean' };
    case 'null': return { type: 'null' };
    case 'string': return { type: 'string', maxLength: 1 + Math.floor(r() * 8), ...(r() < 0.3 ? { minLength: 1 } : {}) };
    case 'enum': return { enum: r() < 0.5 ? ['red', 'green', 'blue'].slice(0, 2 + Math.floor(r() * 2)) : [1, 2.5, 'x', null, true] };
    case 'const': return { const: pick(['v1', 42, false, [1, 2], { a: 'b' }]) };
    case 'nullable': return { type: ['integer', 'null'] };
    case 'anyOf': return { anyOf: [genSchema(r, depth + 1), genSchema(r, depth + 1)] };
    case 'array': {
      const mn = Math.floor(r() * 2), mx = mn + 1 + Math.floor(r() * 3);
      return { type: 'array', items: genSchema(r, depth + 1), minItems: mn, maxItems: mx };
    }
    default: {
      const n = 1 + Math.floor(r() * 3), props = {}, required = [];
      const names = [...WORDS].sort(() => r() - 0.5).slice(0, n);
      for (const k of names) {
        props[k] = genSchema(r, depth + 1);
        if (r() < 0.7) required.push(k);
      }
      return { type: 'object', properties: props, required, additionalProperties: false };
    }
  }
}
function topSchema(i) {
  const r = rng(1000 + i);
  const s = genSchema(r, 0);
  if (i % 10 === 3) { // a $ref through $defs
    return { $defs: { item: s }, type: 'object', properties: { item: { $ref: '#/$defs/item' } }, required: ['item'], additionalProperties: false };
  }
  return s.type === 'object' ? s : { type: 'object', properties: { value: s }, required: ['value'], additionalProperties: false };
}
const PROMPTS = ['Describe a person as JSON.', 'Give me the data.', 'List the items.', 'What is the weather?', 'Answer in JSON.',
  'In the beginning', 'Summarize the chapter.', 'Return the result object.'];

async function pool(n, k, fn) {
  const out = new Array(n);
  let next = 0;
  await Promise.all(Array.from({ length: k }, async () => { while (next < n) { const i = next++; out[i] = await fn(i); } }));
  return out;
}

// masks built on a pool of 3 threads here; the server started below without the mask cache builds
// them on its default pool (one thread on a 2-core machine): their outputs must agree
const srv = await startServer(['-np', '8', '-c', '512', '--grammar-threads', '3']);
const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'x', maxRetries: 0 });
const ajv = new Ajv({ strict: false });
try {
  await test('unconstrained output of the built-in model is rarely valid (so the next test means something)', async () => {
    const outs = await pool(24, 8, async (i) => {
      const schema = topSchema(i);
      const r = await client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }],
        max_tokens: 60, temperature: 0.8, seed: i });
      let v = null;
      try { v = JSON.parse(r.choices[0].message.content); } catch { return false; }
      return ajv.validate(schema, v);
    });
    assert.ok(outs.filter(Boolean).length <= 2, `${outs.filter(Boolean).length} of 24 unconstrained outputs valid`);
  });

  await test(`${PAIRS} generated schema/prompt pairs: every output validates (response_format json_schema strict)`, async () => {
    const bad = [];
    await pool(PAIRS, 8, async (i) => {
      const schema = topSchema(i);
      const r = await client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }],
        max_tokens: 300, temperature: 0.9, seed: 7 + i,
        response_format: { type: 'json_schema', json_schema: { name: 's' + i, schema, strict: true } } });
      const c = r.choices[0];
      let v;
      try { v = JSON.parse(c.message.content); } catch (e) { bad.push(`#${i} not JSON (${c.finish_reason}): ${JSON.stringify(c.message.content)}`); return; }
      if (!ajv.validate(schema, v)) bad.push(`#${i} ${JSON.stringify(schema)} -> ${c.message.content}: ${ajv.errorsText()}`);
      if (c.finish_reason !== 'stop') bad.push(`#${i} finish_reason ${c.finish_reason}`);
    });
    assert.equal(bad.length, 0, bad.slice(0, 5).join('\n'));
  });

  await test('streaming equals non-streaming under a schema; json_object; completions json_schema field', async () => {
    for (let i = 0; i < 6; i++) {
      const schema = topSchema(500 + i);
      const req = { model: 'x', messages: [{ role: 'user', content: 'Data?' }], max_tokens: 300, temperature: 0.9, seed: 50 + i,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } } };
      const a = await client.chat.completions.create(req);
      let text = '';
      for await (const ch of await client.chat.completions.create({ ...req, stream: true })) text += ch.choices[0]?.delta?.content ?? '';
      assert.equal(text, a.choices[0].message.content);
    }
    const j = await client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 300, temperature: 1,
      seed: 3, response_format: { type: 'json_object' } });
    // json_object has unbounded strings: a run cut by max_tokens is a prefix of an object
    const jc = j.choices[0].message.content;
    assert.ok(jc.startsWith('{'), jc);
    if (j.choices[0].finish_reason === 'stop') {
      const o = JSON.parse(jc);
      assert.ok(o !== null && typeof o === 'object' && !Array.isArray(o));
    }
    const schema = { type: 'object', properties: { n: { type: 'integer' }, s: { type: 'string', maxLength: 5 } }, required: ['n', 's'], additionalProperties: false };
    const c = await fetch(srv.url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'The answer:', max_tokens: 100, temperature: 1, seed: 5, json_schema: schema }) }).then((r) => r.json());
    assert.ok(ajv.validate(schema, JSON.parse(c.choices[0].text)), c.choices[0].text);
  });

  await test('llama-server grammar field (GBNF) and its errors', async () => {
    for (let i = 0; i < 5; i++) {
      const r = await fetch(srv.url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'Once', max_tokens: 40, temperature: 1, seed: i, grammar: 'root ::= ("yes" | "no") " " [0-9]{2,3} "!"' }) }).then((r) => r.json());
      assert.match(r.choices[0].text, /^(yes|no) [0-9]{2,3}!$/);
      assert.equal(r.choices[0].finish_reason, 'stop');
    }
    const bad = await fetch(srv.url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', grammar: 'root ::= "a" missing' }) });
    assert.equal(bad.status, 400);
    const e = await bad.json();
    assert.equal(e.error.param, 'grammar');
    assert.match(e.error.message, /missing/);
    const un = await fetch(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema', json_schema: { name: 'a', strict: true, schema: { type: 'string', pattern: '^a' } } } }) });
    assert.equal(un.status, 400);
    assert.match((await un.json()).error.message, /pattern/);
  });

  await test('tool_choice required / named: calls whose arguments validate; streamed argument deltas add up', async () => {
    const tools = [
      { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, days: { type: 'integer' } }, required: ['city'], additionalProperties: false } } },
      { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'], additionalProperties: false } } },
    ];
    const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));
    for (let i = 0; i < 6; i++) {
      const named = i % 2 === 1;
      const req = { model: 'x', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, max_tokens: 200, temperature: 1, seed: 20 + i,
        tool_choice: named ? { type: 'function', function: { name: 'add' } } : 'required', parallel_tool_calls: false };
      const r = await client.chat.completions.create(req);
      const ch = r.choices[0];
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch));
      assert.equal(ch.message.tool_calls.length, 1);
      const call = ch.message.tool_calls[0];
      if (named) assert.equal(call.function.name, 'add');
      assert.ok(ajv.validate(byName[call.function.name], JSON.parse(call.function.arguments)), call.function.arguments);
      // streaming: the name once, then argument pieces that add up to the same arguments
      let name = null, args = '', id = null, finish = null, content = '';
      for await (const c of await client.chat.completions.create({ ...req, stream: true })) {
        const d = c.choices[0]?.delta;
        if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
        if (d?.content) content += d.content;
        for (const tc of d?.tool_calls ?? []) {
          assert.equal(tc.index, 0);
          if (tc.function?.name) { assert.equal(name, null); name = tc.function.name; id = tc.id; }
          if (tc.function?.arguments) args += tc.function.arguments;
        }
      }
      assert.equal(name, call.function.name);
      assert.match(id, /^call_/);
      assert.equal(args, call.function.arguments);
      assert.equal(finish, 'tool_calls');
      assert.equal(content, ch.message.content ?? '');
    }
    const e = await fetch(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'x' }], tools, tool_choice: { type: 'function', function: { name: 'nope' } } }) });
    assert.equal(e.status, 400);
    assert.equal((await e.json()).error.param, 'tool_choice');
  });
  await test('requests with the same schema share one grammar and its masks; --grammar-cache 0 gives the same outputs', async () => {
    const metric = (t, name) => Number((new RegExp('^' + name + ' (\\S+)$', 'm').exec(t) || [])[1]);
    const schema = topSchema(900);
    const req = (i) => ({ model: 'x', messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }], max_tokens: 300, temperature: 0.9,
      seed: 900 + i, response_format: { type: 'json_schema', json_schema: { name: 'same', schema, strict: true } } });
    const m0 = await (await fetch(srv.url + '/metrics')).text();
    const outs = await pool(8, 8, async (i) => (await client.chat.completions.create(req(i))).choices[0].message.content);
    const m1 = await (await fetch(srv.url + '/metrics')).text();
    assert.equal(metric(m1, 'smelt_grammars_compiled_total') - metric(m0, 'smelt_grammars_compiled_total'), 1, 'one grammar for 8 requests');
    assert.equal(metric(m1, 'smelt_grammars_reused_total') - metric(m0, 'smelt_grammars_reused_total'), 7);
    const hits = metric(m1, 'smelt_grammar_mask_cache_hits_total') - metric(m0, 'smelt_grammar_mask_cache_hits_total');
    const misses = metric(m1, 'smelt_grammar_mask_cache_misses_total') - metric(m0, 'smelt_grammar_mask_cache_misses_total');
    assert.ok(hits > misses, `mask cache: ${hits} hits, ${misses} misses`);
    for (const o of outs) assert.ok(ajv.validate(schema, JSON.parse(o)), o);
    // the same requests one at a time on two fresh servers, with and without the cache: equal outputs. (Not
    // on this server: its prefix cache holds these prompts from the batch above, and default-mode matmuls
    // round a batched prefill differently from one alone, which sampling at 0.9 can turn into other text.)
    const on = await startServer(['-np', '8', '-c', '512']);
    const off = await startServer(['-np', '8', '-c', '512', '--grammar-cache', '0']);
    try {
      const onClient = new OpenAI({ baseURL: on.url + '/v1', apiKey: 'x', maxRetries: 0 });
      const offClient = new OpenAI({ baseURL: off.url + '/v1', apiKey: 'x', maxRetries: 0 });
      for (let i = 0; i < 4; i++) {
        const a = (await onClient.chat.completions.create(req(i))).choices[0].message.content;
        const b = (await offClient.chat.completions.create(req(i))).choices[0].message.content;
        assert.equal(a, b, `request ${i}: with and without the mask cache`);
      }
      const mn = await (await fetch(on.url + '/metrics')).text();
      assert.ok(metric(mn, 'smelt_grammar_mask_cache_hits_total') > 0, 'the cached server used its masks');
      const mo = await (await fetch(off.url + '/metrics')).text();
      assert.equal(metric(mo, 'smelt_grammar_mask_cache_hits_total') + metric(mo, 'smelt_grammar_mask_cache_misses_total'), 0);
    } finally {
      on.proc.kill('SIGTERM');
      off.proc.kill('SIGTERM');
    }
  });
} finally {
  srv.proc.kill('SIGTERM');
}
L.finish();
