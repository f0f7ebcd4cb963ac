// Images through the OpenAI API of `smelt serve`, sent with the official openai npm client (and the
// Anthropic SDK's image blocks): image_url
// parts with data: URLs (chat completions, streaming, the Responses API's input_image), http URLs with
// and without --allow-image-urls, local files with and without --allow-image-files, batching with a text request, and the 400s for bad images and for a
// model without a vision tower. The model is the tiny Qwen2.5-VL golden fixture (tests/golden/vision)
// with a chat template added; replies are checked against `smelt run --image` on the same model and
// between the paths (no fixed strings). SmolVLM's fixture checks its tiles' prompt and its processor's
// chat template.
// Env: SMELT_BIN, MAKE_TEST_MODEL, SMELT_SOURCE_DIR, SMELT_TEST_DIR, NODE_PATH.
import { execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import * as L from './lib.mjs';
import { test } from './lib.mjs';

const { OpenAI, Anthropic } = L.requirePackages({ OpenAI: 'openai', Anthropic: '@anthropic-ai/sdk' });
const [BIN, SRC, DIR] = L.needEnv('SMELT_BIN', 'SMELT_SOURCE_DIR', 'SMELT_TEST_DIR');

// the vision model: the fixture plus a chat template that renders image parts as Qwen2.5-VL's does
const VLM = path.join(DIR, 'vlm');
fs.rmSync(VLM, { recursive: true, force: true });
fs.cpSync(path.join(SRC, 'tests/golden/vision/qwen2_5_vl_vision'), VLM, { recursive: true });
const TEMPLATE = "{% for message in messages %}<{{ message['role'] }}>{% if message['content'] is string %}" +
  "{{ message['content'] }}{% else %}{% for c in message['content'] %}{% if c['type'] == 'image' or 'image_url' in c %}" +
  "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}" +
  "{% endif %}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
fs.writeFileSync(path.join(VLM, 'tokenizer_config.json'), JSON.stringify({ bos_token: null, eos_token: null, chat_template: TEMPLATE }));
fs.writeFileSync(path.join(DIR, 'template.jinja'), TEMPLATE);
const TEXT_MODEL = path.join(DIR, 'text-model');
execFileSync(process.env.MAKE_TEST_MODEL, [TEXT_MODEL]);
const IMAGE = path.join(SRC, 'tests/vision/data/images/rgb_45x30.jpg');
const PNG = path.join(SRC, 'tests/vision/data/images/rgb_61x45.png');
const dataUrl = (f, mime) => `data:${mime};base64,` + fs.readFileSync(f).toString('base64');
const JPG_URL = dataUrl(IMAGE, 'image/jpeg'), PNG_URL = dataUrl(PNG, 'image/png');
// the small PNG with a 1.5 MB text chunk after its header: a request body over 2 MB (decoders skip the chunk)
const crc32 = (b) => {
  let c = ~0;
  for (const x of b) { c ^= x; for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1)); }
  return ~c >>> 0;
};
const bigPng = (() => {
  const src = fs.readFileSync(PNG), body = Buffer.concat([Buffer.from('tEXtComment\0'), Buffer.alloc(1500000, 97)]);
  const len = Buffer.alloc(4), crc = Buffer.alloc(4);
  len.writeUInt32BE(body.length - 4);
  crc.writeUInt32BE(crc32(body));
  return Buffer.concat([src.subarray(0, 33), len, body, crc, src.subarray(33)]); /* 8 signature + 25 IHDR */
})();
const BIG_URL = 'data:image/png;base64,' + bigPng.toString('base64');

const startServer = (model, args = []) =>
  L.startServer(BIN, ['serve', '-m', model, ...L.LOCAL, '--device', 'cpu', '-t', '2', ...args], { timeout: 20000 });

async function rejects400(p, re) {
  try { await p; } catch (e) {
    assert.equal(e.status, 400, 'status ' + e.status + ': ' + e.message);
    assert.match(e.message, re);
    return;
  }
  assert.fail('the request was accepted');
}

const PROMPT = 'what is it?';
const userMsg = (url, text = PROMPT) => [{ role: 'user', content: [{ type: 'image_url', image_url: { url } }, { type: 'text', text }] }];

try {
  const srv = await startServer(VLM, ['-np', '2']);
  const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'x' });
  const ask = (messages, extra = {}) => client.chat.completions.create({ model: 'm', messages, max_tokens: 12, temperature: 0, ...extra });
  // the CLI on the same model, image and message: the same greedy reply
  const cli = execFileSync(BIN, ['run', VLM, '-p', PROMPT, '--image', IMAGE, '--chat-template', path.join(DIR, 'template.jinja'),
    '-n', '12', '--temp', '0', '--device', 'cpu', '-t', '2', '--no-stats'], { encoding: 'utf8' }).replace(/\n$/, '');
  let base = null, basePrompt = 0;

  await test('chat: image_url data: URL, same reply as smelt run --image', async () => {
    const r = await ask(userMsg(JPG_URL));
    base = r.choices[0].message.content;
    basePrompt = r.usage.prompt_tokens;
    assert.equal(base, cli);
    // the prompt: the template's text bytes and 12 image tokens (a 24x32 image, 14x14 -> 4x4 patches, 2x2 merge)
    assert.ok(r.usage.prompt_tokens > 12, 'prompt tokens ' + r.usage.prompt_tokens);
  });
  await test('chat: the same image again (cached) gives the same reply', async () => {
    const r = await ask(userMsg(JPG_URL));
    assert.equal(r.choices[0].message.content, base);
  });
  await test('chat: another image gives another prompt', async () => {
    const a = await ask(userMsg(PNG_URL), { logprobs: true });
    const b = await ask(userMsg(JPG_URL), { logprobs: true });
    assert.notDeepEqual(a.choices[0].logprobs.content[0].logprob, b.choices[0].logprobs.content[0].logprob);
  });
  await test('chat: streaming gives the same text', async () => {
    const s = await ask(userMsg(JPG_URL), { stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices[0]?.delta?.content || '';
    assert.equal(text, base);
  });
  await test('responses: input_image gives the same text', async () => {
    const r = await client.responses.create({ model: 'm', max_output_tokens: 12, temperature: 0,
      input: [{ role: 'user', content: [{ type: 'input_image', image_url: JPG_URL }, { type: 'input_text', text: PROMPT }] }] });
    assert.equal(r.output_text, base);
  });
  await test('batched with a text request: the image reply is unchanged', async () => {
    const [a, b] = await Promise.all([ask(userMsg(JPG_URL)), ask([{ role: 'user', content: 'hello there' }])]);
    assert.equal(a.choices[0].message.content, base);
    assert.equal(typeof b.choices[0].message.content, 'string');
  });
  await test('a 2 MB image request fits the default body limit of a model that takes images', async () => {
    assert.ok(BIG_URL.length > 2e6);
    const a = await ask(userMsg(BIG_URL), { logprobs: true });
    const b = await ask(userMsg(PNG_URL), { logprobs: true });
    assert.deepEqual(a.choices[0].logprobs.content[0].logprob, b.choices[0].logprobs.content[0].logprob);
  });
  await test('400: http image URL without --allow-image-urls', () =>
    rejects400(ask(userMsg('http://127.0.0.1:1/x.png')), /allow-image-urls/));
  await test('400: data: URL that is not base64', () => rejects400(ask(userMsg('data:image/png;base64,@@@@')), /base64/));
  await test('400: bytes that are no image', () =>
    rejects400(ask(userMsg('data:image/png;base64,' + Buffer.from('not an image at all').toString('base64'))), /image 1: .*format/));
  await test('400: a truncated PNG', () =>
    rejects400(ask(userMsg('data:image/png;base64,' + fs.readFileSync(PNG).subarray(0, 200).toString('base64'))), /image 1: corrupt PNG/));
  await test('400: an image in an assistant message', () =>
    rejects400(ask([{ role: 'user', content: 'hi' }, { role: 'assistant', content: [{ type: 'image_url', image_url: { url: JPG_URL } }] },
      { role: 'user', content: 'and?' }]), /user messages only/));
  await test('400: an image part without a URL', () =>
    rejects400(ask([{ role: 'user', content: [{ type: 'image_url', image_url: {} }] }]), /image_url\.url/));
  // the Anthropic Messages API: image blocks (base64, url) become the same image parts
  const anth = new Anthropic({ baseURL: srv.url, apiKey: 'x', maxRetries: 0 });
  const imgBlock = { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: fs.readFileSync(IMAGE).toString('base64') } };
  const anthMsg = [{ role: 'user', content: [imgBlock, { type: 'text', text: PROMPT }] }];
  await test('anthropic: an image block gives the chat completion reply; count_tokens counts the image', async () => {
    const r = await anth.messages.create({ model: 'm', max_tokens: 12, temperature: 0, messages: anthMsg });
    assert.equal(r.content[0].text, base);
    // the prompt again: Anthropic's input_tokens leave out what the prefix cache held
    assert.equal(r.usage.input_tokens + r.usage.cache_read_input_tokens, basePrompt);
    const c = await anth.messages.countTokens({ model: 'm', messages: anthMsg });
    assert.equal(c.input_tokens, basePrompt);
    const s = await anth.messages.create({ model: 'm', max_tokens: 12, temperature: 0, messages: anthMsg, stream: true });
    let text = '';
    for await (const ev of s) if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    assert.equal(text, base);
  });
  await test('anthropic: 400 for an image in an assistant turn, a file source, a url source without --allow-image-urls', async () => {
    const bad = async (messages, re) => {
      try { await anth.messages.create({ model: 'm', max_tokens: 4, messages }); } catch (e) {
        assert.equal(e.status, 400, 'status ' + e.status + ': ' + e.message);
        assert.match(e.message, re);
        return;
      }
      assert.fail('the request was accepted');
    };
    await bad([{ role: 'user', content: 'hi' }, { role: 'assistant', content: [imgBlock] }], /not supported in an assistant message/);
    await bad([{ role: 'user', content: [{ type: 'image', source: { type: 'file', file_id: 'f' } }] }], /source type 'file' is not supported/);
    await bad([{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://127.0.0.1:1/x.jpg' } }] }], /allow-image-urls/);
    await bad([{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: '@@@' } }] }], /base64/);
  });

  srv.proc.kill('SIGTERM');

  // http URLs with --allow-image-urls: served here
  const img = fs.readFileSync(IMAGE);
  const hs = http.createServer((req, res) => {
    if (req.url === '/big') { res.writeHead(200); res.end(Buffer.alloc(21 << 20)); return; }
    if (req.url !== '/i.jpg') { res.writeHead(404); res.end(); return; }
    res.writeHead(200, { 'content-type': 'image/jpeg' });
    res.end(img);
  });
  await new Promise((r) => hs.listen(0, '127.0.0.1', r));
  const base_url = `http://127.0.0.1:${hs.address().port}`;
  const srv2 = await startServer(VLM, ['--allow-image-urls']);
  const c2 = new OpenAI({ baseURL: srv2.url + '/v1', apiKey: 'x' });
  const ask2 = (messages) => c2.chat.completions.create({ model: 'm', messages, max_tokens: 12, temperature: 0 });
  await test('--allow-image-urls: an http URL gives the data: URL reply', async () => {
    const r = await ask2(userMsg(base_url + '/i.jpg'));
    assert.equal(r.choices[0].message.content, base);
  });
  await test('--allow-image-urls: 400 for a missing image', () => rejects400(ask2(userMsg(base_url + '/nope.jpg')), /download failed/));
  await test('--allow-image-urls: 400 for an image over the size limit', () => rejects400(ask2(userMsg(base_url + '/big')), /larger than/));
  await test('--allow-image-urls: other schemes refused', () => rejects400(ask2(userMsg('ftp://127.0.0.1/x.png')), /unsupported image URL/));
  await test('--allow-image-urls: local files still refused', () => rejects400(ask2(userMsg('file:///etc/passwd')), /allow-image-files/));
  srv2.proc.kill('SIGTERM');
  hs.close();

  // local files under --allow-image-files DIR only
  const IMGS = path.join(DIR, 'imgs');
  fs.rmSync(IMGS, { recursive: true, force: true });
  fs.mkdirSync(path.join(IMGS, 'sub'), { recursive: true });
  fs.copyFileSync(IMAGE, path.join(IMGS, 'a b.jpg'));
  fs.symlinkSync(path.join(VLM, 'image.jpg'), path.join(IMGS, 'out.jpg'));
  fs.symlinkSync(path.join(IMGS, 'a b.jpg'), path.join(IMGS, 'sub', 'in.jpg'));
  const srv4 = await startServer(VLM, ['--allow-image-files', IMGS]);
  const c4 = new OpenAI({ baseURL: srv4.url + '/v1', apiKey: 'x' });
  const ask4 = (messages) => c4.chat.completions.create({ model: 'm', messages, max_tokens: 12, temperature: 0 });
  await test('--allow-image-files: a file:// URL gives the data: URL reply', async () => {
    const r = await ask4(userMsg('file://' + path.join(IMGS, 'a%20b.jpg')));
    assert.equal(r.choices[0].message.content, base);
  });
  await test('--allow-image-files: an absolute path and a link inside the directory', async () => {
    assert.equal((await ask4(userMsg(path.join(IMGS, 'a b.jpg')))).choices[0].message.content, base);
    assert.equal((await ask4(userMsg(path.join(IMGS, 'sub', 'in.jpg')))).choices[0].message.content, base);
  });
  await test('--allow-image-files: 400 for ../ out of the directory', () =>
    rejects400(ask4(userMsg(path.join(IMGS, 'sub') + '/../../vlm/image.jpg')), /outside the directory/));
  await test('--allow-image-files: 400 for a link out of the directory', () =>
    rejects400(ask4(userMsg(path.join(IMGS, 'out.jpg'))), /outside the directory/));
  await test('--allow-image-files: 400 for a directory, a missing file, a host name', async () => {
    await rejects400(ask4(userMsg(path.join(IMGS, 'sub'))), /not a regular file/);
    await rejects400(ask4(userMsg(path.join(IMGS, 'nope.jpg'))), /cannot open the image file/);
    await rejects400(ask4(userMsg('file://example.com/x.jpg')), /no local absolute path/);
  });
  srv4.proc.kill('SIGTERM');
  await test('--allow-image-files: a missing directory is refused at start', () => {
    let rc = 0, err = '';
    try { execFileSync(BIN, ['serve', '-m', VLM, '--port', '0', '--allow-image-files', path.join(DIR, 'nope')], { stdio: 'pipe' }); }
    catch (e) { rc = e.status; err = e.stderr.toString(); }
    assert.equal(rc, 2);
    assert.match(err, /--allow-image-files .* is not a directory/);
  });

  // SmolVLM: its processor's chat template (chat_template.json) reads content only as a list of parts;
  // text-only turns given as strings must render as the same turns given as text parts
  const SMOL = path.join(DIR, 'smolvlm');
  fs.rmSync(SMOL, { recursive: true, force: true });
  fs.cpSync(path.join(SRC, 'tests/golden/vision/smolvlm_vision'), SMOL, { recursive: true });
  fs.writeFileSync(path.join(SMOL, 'chat_template.json'), JSON.stringify({ chat_template:
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == 'image' %}" +
    "{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}" +
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}" +
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}" }));
  const srv5 = await startServer(SMOL);
  const c5 = new OpenAI({ baseURL: srv5.url + '/v1', apiKey: 'x' });
  const ask5 = (messages) => c5.chat.completions.create({ model: 'm', messages, max_tokens: 8, temperature: 0 });
  await test('smolvlm: image_url reply equals smelt run --image (tiles + whole image)', async () => {
    const r = await ask5(userMsg(JPG_URL));
    const cli5 = execFileSync(BIN, ['run', SMOL, '-p', PROMPT, '--image', IMAGE, '-n', '8', '--temp', '0', '--device', 'cpu',
      '-t', '2', '--no-stats'], { encoding: 'utf8' }).replace(/\n$/, '');
    assert.equal(r.choices[0].message.content, cli5);
    // byte-level tokenizer: the template's bytes, 2 specials, the image's 2x3 tiles + whole image (46 tokens)
    const text = '<|im_start|>User:' + PROMPT + '\nAssistant:';
    assert.equal(r.usage.prompt_tokens, Buffer.byteLength(text) + 1 + 46);
  });
  await test('smolvlm: string turns render as text parts', async () => {
    const hist = (asParts) => [
      { role: 'user', content: asParts ? [{ type: 'text', text: 'hi there' }] : 'hi there' },
      { role: 'assistant', content: asParts ? [{ type: 'text', text: 'ok' }] : 'ok' },
      ...userMsg(JPG_URL)];
    const a = await ask5(hist(false)), b = await ask5(hist(true)), one = await ask5(userMsg(JPG_URL));
    assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    // "User: hi there<end_of_utterance>\nAssistant: ok<end_of_utterance>\n" before the image turn
    assert.equal(a.usage.prompt_tokens, one.usage.prompt_tokens + Buffer.byteLength('User: hi there\nAssistant: ok\n') + 2);
  });
  srv5.proc.kill('SIGTERM');

  // a text model: images are refused, naming the model
  const srv3 = await startServer(TEXT_MODEL, ['--alias', 'texty']);
  const c3 = new OpenAI({ baseURL: srv3.url + '/v1', apiKey: 'x' });
  await test('400: a model without a vision tower', () =>
    rejects400(c3.chat.completions.create({ model: 'texty', messages: userMsg(JPG_URL), max_tokens: 4 }), /model 'texty' does not accept images/));
  await test('413: a text model keeps the 1 MiB body limit', async () => {
    try { await c3.chat.completions.create({ model: 'texty', messages: userMsg(BIG_URL), max_tokens: 4 }); } catch (e) {
      assert.equal(e.status, 413, 'status ' + e.status + ': ' + e.message);
      return;
    }
    assert.fail('the request was accepted');
  });
  srv3.proc.kill('SIGTERM');
} catch (e) {
  L.setupFailed(e);
} finally {
  L.stopAll();
}
L.finish();
