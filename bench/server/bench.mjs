#!/usr/bin/env node
// Load benchmark for a running `smelt serve` (or any OpenAI-compatible server).
// For each concurrency level it keeps N streaming /v1/completions requests in flight and reports
// generated tokens/s, request latency, time to first token and inter-token latency.
//   node bench/server/bench.mjs --url http://127.0.0.1:8080 [--concurrency 1,4,16,64]
//        [--requests-per-level N] [--max-tokens 64] [--prompt-words 64] [--api-key KEY] [--json]
const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
  return acc;
}, []));
const url = (args.url || 'http://127.0.0.1:8080').replace(/\/$/, '');
const levels = (args.concurrency || '1,4,16,64').split(',').map(Number);
const maxTokens = Number(args['max-tokens'] || 64);
const promptWords = Number(args['prompt-words'] || 64);
const headers = { 'Content-Type': 'application/json' };
if (args['api-key']) headers.Authorization = 'Bearer ' + args['api-key'];
const words = 'time person year way day thing man world life hand part child eye woman place work week case point government company number group problem fact'.split(' ');

function prompt(i) {
  let s = `Request ${i}:`;
  for (let k = 0; k < promptWords; k++) s += ' ' + words[(i * 7 + k * 13) % words.length];
  return s;
}
const pct = (a, p) => (a.length ? a.slice().sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(p * a.length))] : NaN);
const mean = (a) => a.reduce((x, y) => x + y, 0) / (a.length || 1);

async function one(i) {
  const t0 = performance.now();
  const res = await fetch(url + '/v1/completions', { method: 'POST', headers, body: JSON.stringify({
    prompt: prompt(i), max_tokens: maxTokens, temperature: 0.7, seed: i + 1, stream: true, stream_options: { include_usage: true } }) });
  if (!res.ok) return { status: res.status };
  const dec = new TextDecoder();
  let buf = '', first = NaN, last = t0, itl = [], tokens = 0;
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      const now = performance.now();
      if (j.usage) tokens = j.usage.completion_tokens;
      if (j.choices?.[0]?.text) {
        if (Number.isNaN(first)) first = now - t0; else itl.push(now - last);
        last = now;
      }
    }
  }
  return { status: 200, latency: performance.now() - t0, ttft: first, itl, tokens };
}

const rows = [];
for (const c of levels) {
  const total = Number(args['requests-per-level'] || Math.max(8, 2 * c));
  let next = 0;
  const out = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: c }, async () => {
    while (next < total) out.push(await one(next++));
  }));
  const wall = (performance.now() - t0) / 1000;
  const ok = out.filter((r) => r.status === 200);
  const toks = ok.reduce((a, r) => a + r.tokens, 0);
  const itl = ok.flatMap((r) => r.itl);
  rows.push({ concurrency: c, requests: total, ok: ok.length, errors: total - ok.length, gen_tokens: toks, wall_s: +wall.toFixed(2),
    tok_per_s: +(toks / wall).toFixed(1), req_per_s: +(ok.length / wall).toFixed(2),
    latency_mean_ms: +mean(ok.map((r) => r.latency)).toFixed(0), latency_p99_ms: +pct(ok.map((r) => r.latency), 0.99).toFixed(0),
    ttft_p50_ms: +pct(ok.map((r) => r.ttft), 0.5).toFixed(1), ttft_p99_ms: +pct(ok.map((r) => r.ttft), 0.99).toFixed(1),
    itl_p50_ms: +pct(itl, 0.5).toFixed(2), itl_p99_ms: +pct(itl, 0.99).toFixed(2) });
  if (!args.json) console.error(`concurrency ${c}: ${rows.at(-1).tok_per_s} tok/s`);
}
if (args.json) console.log(JSON.stringify(rows, null, 1));
else console.table(rows);
