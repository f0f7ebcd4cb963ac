// What the node tests of `smelt serve` share: the npm packages (from NODE_PATH, skipped when absent),
// starting a server on a free local port and stopping it, a server that must refuse to start, the
// /metrics values, the test runner with its closing line, and comparing two answers' log-probabilities.
import { spawn, spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import path from 'node:path';

const nodePath = process.env.NODE_PATH || path.resolve(path.dirname(new URL(import.meta.url).pathname), '../node/node_modules');
const require = createRequire(path.join(nodePath, 'noop.js'));

// {Name: 'npm-package'} -> {Name: its export}; exit 77 (skipped) when one is not installed
export function requirePackages(pkgs) {
  const out = {};
  try {
    for (const [name, pkg] of Object.entries(pkgs)) {
      const m = require(pkg);
      out[name] = m[name] || m.default || m;
    }
  } catch (e) {
    console.log(`${Object.values(pkgs).join(' / ')} npm package(s) not installed: skipping`, e.message);
    process.exit(77);
  }
  return out;
}

// the values of environment variables that the test needs; exit 77 (skipped) when one is not set
export function needEnv(...names) {
  const missing = names.filter((n) => !process.env[n]);
  if (missing.length) { console.log(`${missing.join(' / ')} not set: skipping`); process.exit(77); }
  return names.map((n) => process.env[n]);
}

// a server on 127.0.0.1 with a port the system chooses
export const LOCAL = ['--host', '127.0.0.1', '--port', '0'];

export const servers = [];
// Starts `bin argv...` and resolves once it listens: {url, proc, log(), client (an OpenAI client on url
// when OpenAI is given), stop()}; stop() sends SIGTERM and resolves with the log once the server exited
// with status 0 (it fails otherwise). Rejects when the server exits first or does not listen in time.
export function startServer(bin, argv, { env, timeout = 30000, OpenAI } = {}) {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, argv, { stdio: ['ignore', 'ignore', 'pipe'], env: env || process.env });
    servers.push(p);
    let log = '';
    p.smeltLog = () => log;
    const t = setTimeout(() => reject(new Error('server did not start:\n' + log)), timeout);
    const exited = new Promise((res) => p.on('exit', (code, sig) => res([code, sig])));
    p.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/[^\s]+)/.exec(log);
      if (m) {
        clearTimeout(t);
        const client = OpenAI ? new OpenAI({ baseURL: m[1] + '/v1', apiKey: 'x', maxRetries: 0 }) : undefined;
        const stop = async () => {
          p.kill('SIGTERM');
          const [code, sig] = await exited;
          assert.equal(code, 0, `server exited with ${code} (${sig}):\n${log}`);
          return log;
        };
        resolve({ url: m[1], proc: p, log: () => log, client, stop });
      }
    });
    exited.then(([code]) => { clearTimeout(t); reject(new Error(`server exited (${code}):\n${log}`)); });
  });
}

// a server that must not start: [exit status, stderr]
export function refuse(bin, argv, { env } = {}) {
  const r = spawnSync(bin, argv, { encoding: 'utf8', timeout: 30000, env: env || process.env });
  return [r.status, r.stderr];
}

// ends every server still running (the tests' last step, whatever happened)
export function stopAll(signal = 'SIGKILL') {
  for (const p of servers) if (p.exitCode === null && p.signalCode === null) p.kill(signal);
}

export const post = (url, body) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

// /metrics: the text, one sample's value (NaN when absent; name may carry labels), every unlabelled
// smelt_* sample
export async function metricsText(url) { return (await fetch(url + '/metrics')).text(); }
export function metricValue(text, name) {
  const m = new RegExp('^' + name.replace(/[{}"=\/.\\^$*+?()[\]|]/g, (c) => '\\' + c) + ' (\\S+)$', 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}
export async function metric(url, name) { return metricValue(await metricsText(url), name); }
export async function metricMap(url) {
  const out = {};
  for (const m of (await metricsText(url)).matchAll(/^(smelt_\w+) (\S+)$/gm)) out[m[1]] = Number(m[2]);
  return out;
}

// the test runner: test() runs one case, setupFailed() records a failure outside any case, finish()
// prints the closing line "N passed, N failed" and exits (1 when any failed)
export const results = [];
export async function test(name, fn) {
  const t0 = Date.now();
  try { await fn(); results.push([name, true]); console.log(`ok   ${name} (${Date.now() - t0} ms)`); }
  catch (e) { results.push([name, false]); console.log(`FAIL ${name}: ${e.stack || e}`); }
}
export function setupFailed(e) {
  console.log('FAIL setup:', e.stack || e);
  results.push(['setup', false]);
}
export function finish() {
  const failed = results.filter(([, ok]) => !ok).length;
  console.log(`${results.length - failed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

// The largest log-probability difference of two answers ([token, logprob] lists; Infinity when their
// tokens differ). With SMELT_CPU_EXACT=1, batched and one-token kernels may round apart (about 1e-6 on
// the tiny random models), while another prompt or state moves the log-probabilities of such a flat
// model by 1e-4 and more: same() holds them to TOL.
export const TOL = 2e-5;
export function dist(a, b) {
  if (a.length !== b.length) return Infinity;
  let d = 0;
  for (let i = 0; i < a.length; i++) {
    if (a[i][0] !== b[i][0]) return Infinity;
    d = Math.max(d, Math.abs(a[i][1] - b[i][1]));
  }
  return d;
}
export function same(a, b, what) {
  const d = dist(a, b);
  assert.ok(d <= TOL, `${what}: differs by ${d}\n${JSON.stringify(a)}\n${JSON.stringify(b)}`);
  return d;
}
