/* Tool-call formats: detection from the chat template, the scanning driver (content before and
 * between calls, what may be streamed), and the JSON-argument formats (hermes, llama3, mistral,
 * deepseek, harmony). See toolcall.h. Hand-written: no Debian library knows these model output
 * formats, and unfinished text (streaming) needs a scanner that cJSON's whole-document parser
 * is not. */
#include "server/toolcall_int.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const sm_toolfmt FORMATS[SM_TF_COUNT] = {
  [SM_TF_GENERIC] = {SM_TF_GENERIC, "generic", false},
  [SM_TF_HERMES] = {SM_TF_HERMES, "hermes", false},
  [SM_TF_QWEN3_CODER] = {SM_TF_QWEN3_CODER, "qwen3_coder", false},
  [SM_TF_LLAMA3] = {SM_TF_LLAMA3, "llama3", true},
  [SM_TF_MISTRAL] = {SM_TF_MISTRAL, "mistral", true},
  [SM_TF_HARMONY] = {SM_TF_HARMONY, "harmony", true},
  [SM_TF_DEEPSEEK] = {SM_TF_DEEPSEEK, "deepseek", true},
  [SM_TF_GLM45] = {SM_TF_GLM45, "glm45", false},
  [SM_TF_GEMMA] = {SM_TF_GEMMA, "gemma", false},
};

const sm_toolfmt *sm_toolfmt_detect(const char *t) {
  if (!t) return &FORMATS[SM_TF_GENERIC];
  if (strstr(t, "<|channel|>") && strstr(t, "functions.")) return &FORMATS[SM_TF_HARMONY];
  if (strstr(t, "tool\xE2\x96\x81"
                "calls\xE2\x96\x81"
                "begin"))
    return &FORMATS[SM_TF_DEEPSEEK];
  if (strstr(t, "<function=") && strstr(t, "<parameter=")) return &FORMATS[SM_TF_QWEN3_CODER];
  if (strstr(t, "<arg_key>")) return &FORMATS[SM_TF_GLM45];
  if (strstr(t, "[TOOL_CALLS]")) return &FORMATS[SM_TF_MISTRAL];
  if (strstr(t, "<tool_call>")) return &FORMATS[SM_TF_HERMES];
  if (strstr(t, "<|python_tag|>") || (strstr(t, "ipython") && strstr(t, "parameters"))) return &FORMATS[SM_TF_LLAMA3];
  if (strstr(t, "tool_code")) return &FORMATS[SM_TF_GEMMA];
  return &FORMATS[SM_TF_GENERIC];
}

const sm_toolfmt *sm_toolfmt_by_name(const char *name) {
  for (int i = 0; i < SM_TF_COUNT; i++)
    if (name && !strcmp(name, FORMATS[i].name)) return &FORMATS[i];
  return NULL;
}

const char *sm_toolfmt_names(void) {
  return "generic, hermes, qwen3_coder, llama3, mistral, harmony, deepseek, glm45, gemma";
}

/* ---------------------------------------------------------------- helpers */

sm_tc_call *sm_tc_add(sm_tc_scan *out) {
  if (out->n == out->cap) {
    out->cap = out->cap ? out->cap * 2 : 4;
    out->calls = sm_xrealloc(out->calls, sizeof(sm_tc_call) * (size_t)out->cap);
  }
  sm_tc_call *c = &out->calls[out->n++];
  memset(c, 0, sizeof *c);
  return c;
}

static void drop_calls(sm_tc_scan *s) {
  for (int i = 0; i < s->n; i++) {
    free(s->calls[i].name);
    sm_buf_free(&s->calls[i].args);
  }
  s->n = 0;
}

void sm_tc_scan_free(sm_tc_scan *s) {
  drop_calls(s);
  free(s->calls);
  sm_buf_free(&s->content);
  sm_buf_free(&s->reasoning);
  memset(s, 0, sizeof *s);
}

size_t sm_skip_ws(const char *s, size_t n, size_t i) {
  while (i < n && isspace((unsigned char)s[i])) i++;
  return i;
}

bool sm_starts(const char *s, size_t n, const char *lit) {
  size_t l = strlen(lit);
  return !memcmp(s, lit, SM_MIN(n, l));
}

bool sm_has(const char *s, size_t n, const char *lit) {
  size_t l = strlen(lit);
  return n >= l && !memcmp(s, lit, l);
}

long sm_json_value_end(const char *s, size_t n, size_t i) {
  if (i >= n) return TC_INCOMPLETE;
  char c = s[i];
  if (c == '"') {
    for (size_t k = i + 1; k < n; k++) {
      if (s[k] == '\\') {
        k++;
        continue;
      }
      if (s[k] == '"') return (long)k + 1;
      if ((unsigned char)s[k] < 0x20) return TC_BAD;
    }
    return TC_INCOMPLETE;
  }
  if (c == '{' || c == '[') {
    int depth = 0;
    bool str = false, esc = false;
    for (size_t k = i; k < n; k++) {
      char d = s[k];
      if (str) {
        if (esc) esc = false;
        else if (d == '\\') esc = true;
        else if (d == '"') str = false;
        continue;
      }
      if (d == '"') str = true;
      else if (d == '{' || d == '[') depth++;
      else if (d == '}' || d == ']') {
        if (--depth == 0) return (long)k + 1;
      }
    }
    return TC_INCOMPLETE;
  }
  /* number, true, false, null: ends at a delimiter */
  size_t k = i;
  while (k < n && (isalnum((unsigned char)s[k]) || s[k] == '-' || s[k] == '+' || s[k] == '.')) k++;
  if (k == i) return TC_BAD;
  return k < n ? (long)k : TC_INCOMPLETE;
}

/* decoded JSON string at s[0] (complete), malloc'd, or NULL */
static char *json_string(const char *s, size_t n) {
  cJSON *j = cJSON_ParseWithLength(s, n);
  char *r = cJSON_IsString(j) ? sm_xstrdup(j->valuestring) : NULL;
  cJSON_Delete(j);
  return r;
}

long sm_tc_json_call(const char *s, size_t n, sm_tc_scan *out) {
  if (!n) return TC_INCOMPLETE;
  if (s[0] != '{') return TC_BAD;
  sm_tc_call *c = sm_tc_add(out);
  bool have_args = false;
  size_t i = sm_skip_ws(s, n, 1);
  for (;;) {
    if (i >= n) return TC_INCOMPLETE;
    if (s[i] == '}') break;
    if (s[i] != '"') return TC_BAD;
    long ke = sm_json_value_end(s, n, i);
    if (ke < 0) return ke;
    char *key = json_string(s + i, (size_t)ke - i);
    if (!key) return TC_BAD;
    i = sm_skip_ws(s, n, (size_t)ke);
    if (i >= n) {
      free(key);
      return TC_INCOMPLETE;
    }
    if (s[i] != ':') {
      free(key);
      return TC_BAD;
    }
    i = sm_skip_ws(s, n, i + 1);
    if (i >= n) {
      free(key);
      return TC_INCOMPLETE;
    }
    long ve = sm_json_value_end(s, n, i);
    if (!strcmp(key, "function") && s[i] == '{') {
      /* {"function": {"name":..., "arguments":...}}: the inner object is the call */
      free(key);
      out->n--;
      long r = sm_tc_json_call(s + i, n - i, out);
      if (r < 0) return r;
      i = sm_skip_ws(s, n, i + (size_t)r);
      if (i >= n) return TC_INCOMPLETE;
      if (s[i] == ',') {
        i = sm_skip_ws(s, n, i + 1);
        c = &out->calls[out->n - 1];
        have_args = true;
        continue;
      }
      if (s[i] != '}') return TC_BAD;
      return (long)i + 1;
    }
    if (!strcmp(key, "name")) {
      free(key);
      if (s[i] != '"') return TC_BAD;
      if (ve < 0) return ve;
      free(c->name);
      c->name = json_string(s + i, (size_t)ve - i);
      if (!c->name || !c->name[0]) return TC_BAD;
    } else if (!strcmp(key, "arguments") || !strcmp(key, "parameters")) {
      free(key);
      have_args = true;
      sm_buf_clear(&c->args);
      if (s[i] == '"') { /* arguments as a JSON string: decoded once complete */
        if (ve < 0) return ve;
        char *a = json_string(s + i, (size_t)ve - i);
        if (!a) return TC_BAD;
        sm_buf_puts(&c->args, a);
        free(a);
      } else {
        if (ve == TC_BAD) return TC_BAD;
        size_t end = ve < 0 ? n : (size_t)ve;
        sm_buf_put(&c->args, s + i, end - i);
        if (ve < 0) return ve;
      }
    } else {
      free(key);
      if (ve < 0) return ve;
    }
    i = sm_skip_ws(s, n, (size_t)ve);
    if (i >= n) return TC_INCOMPLETE;
    if (s[i] == ',') {
      i = sm_skip_ws(s, n, i + 1);
      continue;
    }
    if (s[i] != '}') return TC_BAD;
    break;
  }
  if (!c->name) return TC_BAD;
  if (!have_args) sm_buf_puts(&c->args, "{}");
  c->done = true;
  return (long)i + 1;
}

/* ---------------------------------------------------------------- JSON formats */

/* <tool_call> {json} </tool_call> */
static long sec_hermes(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out) {
  (void)tools;
  size_t i = sm_skip_ws(s, n, strlen("<tool_call>"));
  if (i >= n) return TC_INCOMPLETE;
  long r = sm_tc_json_call(s + i, n - i, out);
  if (r < 0) return r;
  i = sm_skip_ws(s, n, i + (size_t)r);
  if (i >= n || !sm_has(s + i, n - i, "</tool_call>")) {
    if (sm_starts(s + i, n - i, "</tool_call>")) return TC_INCOMPLETE;
    return i >= n ? TC_INCOMPLETE : TC_BAD;
  }
  return (long)(i + strlen("</tool_call>"));
}

/* [<|python_tag|>] {json} (; {json})*  or  [ {json}, ... ] */
static long sec_llama3(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out) {
  (void)tools;
  size_t i = 0;
  if (sm_has(s, n, "<|python_tag|>")) i = strlen("<|python_tag|>");
  i = sm_skip_ws(s, n, i);
  if (i >= n) return TC_INCOMPLETE;
  bool arr = s[i] == '[';
  if (arr) i = sm_skip_ws(s, n, i + 1);
  for (;;) {
    if (i >= n) return TC_INCOMPLETE;
    long r = sm_tc_json_call(s + i, n - i, out);
    if (r < 0) return r;
    i += (size_t)r;
    size_t k = sm_skip_ws(s, n, i);
    if (k < n && (s[k] == ';' || (arr && s[k] == ','))) {
      i = sm_skip_ws(s, n, k + 1);
      continue;
    }
    if (arr) {
      if (k >= n) return TC_INCOMPLETE;
      if (s[k] != ']') return TC_BAD;
      return (long)k + 1;
    }
    return (long)i;
  }
}

/* [TOOL_CALLS] [ {json}, ... ]   or   [TOOL_CALLS]NAME[ARGS]{json} (Mistral v11+) */
static long sec_mistral(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out) {
  size_t i = sm_skip_ws(s, n, strlen("[TOOL_CALLS]"));
  if (i >= n) return TC_INCOMPLETE;
  if (s[i] == '[' || s[i] == '{') {
    long r = sec_llama3(s + i, n - i, tools, out);
    return r < 0 ? r : (long)i + r;
  }
  const char *a = memmem(s + i, n - i, "[ARGS]", 6);
  sm_tc_call *c = sm_tc_add(out);
  if (!a) {
    for (size_t k = i; k < n; k++)
      if (!(isalnum((unsigned char)s[k]) || s[k] == '_' || s[k] == '-' || s[k] == '.' || s[k] == '[')) return TC_BAD;
    return TC_INCOMPLETE;
  }
  size_t ne = (size_t)(a - s);
  c->name = sm_xmalloc(ne - i + 1);
  memcpy(c->name, s + i, ne - i);
  c->name[ne - i] = 0;
  size_t j = ne + 6;
  if (j >= n) return TC_INCOMPLETE;
  long ve = sm_json_value_end(s, n, j);
  if (ve == TC_BAD || s[j] != '{') return TC_BAD;
  sm_buf_put(&c->args, s + j, (ve < 0 ? n : (size_t)ve) - j);
  if (ve < 0) return ve;
  c->done = true;
  return ve;
}

static long sec_deepseek(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out) {
  (void)tools;
  size_t i = strlen(DS_CALLS_BEGIN_);
  for (;;) {
    i = sm_skip_ws(s, n, i);
    if (i >= n) return TC_INCOMPLETE;
    if (sm_has(s + i, n - i, DS_CALLS_END_)) return (long)(i + strlen(DS_CALLS_END_));
    if (!sm_has(s + i, n - i, DS_CALL_BEGIN_))
      return sm_starts(s + i, n - i, DS_CALL_BEGIN_) || sm_starts(s + i, n - i, DS_CALLS_END_) ? TC_INCOMPLETE : TC_BAD;
    i += strlen(DS_CALL_BEGIN_);
    const char *sep = memmem(s + i, n - i, DS_SEP_, strlen(DS_SEP_));
    sm_tc_call *c = sm_tc_add(out);
    if (!sep) return TC_INCOMPLETE;
    size_t se = (size_t)(sep - s), j = se + strlen(DS_SEP_);
    bool v3 = se - i == 8 && !memcmp(s + i, "function", 8); /* V3/R1: function<sep>NAME\n```json\n{..}\n``` */
    if (v3) {
      const char *nl = memchr(s + j, '\n', n - j);
      if (!nl) return TC_INCOMPLETE;
      size_t ne = (size_t)(nl - s);
      c->name = sm_xmalloc(ne - j + 1);
      memcpy(c->name, s + j, ne - j);
      c->name[ne - j] = 0;
      j = ne + 1;
      if (!sm_has(s + j, n - j, "```json")) return sm_starts(s + j, n - j, "```json") ? TC_INCOMPLETE : TC_BAD;
      j = sm_skip_ws(s, n, j + 7);
    } else {
      c->name = sm_xmalloc(se - i + 1);
      memcpy(c->name, s + i, se - i);
      c->name[se - i] = 0;
    }
    if (j >= n) return TC_INCOMPLETE;
    long ve = sm_json_value_end(s, n, j);
    if (ve == TC_BAD || s[j] != '{') return TC_BAD;
    sm_buf_put(&c->args, s + j, (ve < 0 ? n : (size_t)ve) - j);
    if (ve < 0) return ve;
    size_t k = sm_skip_ws(s, n, (size_t)ve);
    if (v3) {
      if (!sm_has(s + k, n - k, "```")) return sm_starts(s + k, n - k, "```") ? TC_INCOMPLETE : TC_BAD;
      k = sm_skip_ws(s, n, k + 3);
    }
    if (!sm_has(s + k, n - k, DS_CALL_END_)) return sm_starts(s + k, n - k, DS_CALL_END_) ? TC_INCOMPLETE : TC_BAD;
    c->done = true;
    i = k + strlen(DS_CALL_END_);
  }
}

/* ---------------------------------------------------------------- harmony (gpt-oss) */

/* The generated text is a run of messages: [<|start|>assistant][ to=R]<|channel|>C[ to=R]
 * [<|constrain|>json]<|message|>BODY(<|end|>|<|call|>|<|return|>). Channel analysis ->
 * reasoning, final -> content, a recipient functions.NAME -> a call. */
static void scan_harmony(const char *s, size_t n, bool final, sm_tc_scan *out) {
  size_t i = 0;
  bool calls_started = false;
  while (i < n) {
    const char *ch = memmem(s + i, n - i, "<|channel|>", 11);
    if (!ch) { /* text without a channel header: content (models that skip the header) */
      if (!out->n && !out->reasoning.n) {
        size_t k = sm_skip_ws(s, n, i);
        if (k == n || sm_starts(s + k, n - k, "<|channel|>") || sm_starts(s + k, n - k, "<|start|>")) break;
        sm_buf_put(&out->content, s + i, n - i);
        if (!calls_started) out->safe = out->content.n;
      }
      break;
    }
    const char *msg = memmem(ch, n - (size_t)(ch - s), "<|message|>", 11);
    if (!msg) break; /* header still coming */
    /* header: from after the previous message to <|message|> */
    size_t hs = i, he = (size_t)(msg - s);
    const char *to = memmem(s + hs, he - hs, "to=functions.", 13);
    size_t cs = (size_t)(ch - s) + 11, ce = cs;
    while (ce < he && !isspace((unsigned char)s[ce]) && s[ce] != '<') ce++;
    size_t b = he + 11, be = b;
    const char *endm = NULL;
    const char *ends[3] = {"<|end|>", "<|call|>", "<|return|>"};
    for (size_t k = b; k < n && !endm; k++)
      if (s[k] == '<')
        for (int e = 0; e < 3; e++)
          if (sm_has(s + k, n - k, ends[e])) {
            endm = s + k;
            be = k;
            i = k + strlen(ends[e]);
            break;
          }
    bool complete = endm != NULL;
    if (!complete) { /* a marker may be arriving: hold back its beginning */
      be = n;
      i = n;
      for (int e = 0; e < 3 && !final; e++) {
        size_t ml = strlen(ends[e]);
        for (size_t l = SM_MIN(ml - 1, be - b); l > 0; l--)
          if (!memcmp(s + be - l, ends[e], l)) {
            be -= l;
            break;
          }
      }
    }
    if (to) {
      size_t ns = (size_t)(to - s) + 13, ne = ns;
      while (ne < he && !isspace((unsigned char)s[ne]) && s[ne] != '<') ne++;
      sm_tc_call *c = sm_tc_add(out);
      c->name = sm_xmalloc(ne - ns + 1);
      memcpy(c->name, s + ns, ne - ns);
      c->name[ne - ns] = 0;
      sm_buf_put(&c->args, s + b, be - b);
      c->done = complete || final;
      calls_started = true;
    } else if (ce - cs == 8 && !memcmp(s + cs, "analysis", 8)) {
      sm_buf_put(&out->reasoning, s + b, be - b);
    } else {
      sm_buf_put(&out->content, s + b, be - b);
      if (!calls_started) out->safe = out->content.n;
    }
    if (!complete) break;
  }
}

/* ---------------------------------------------------------------- driver */

typedef struct {
  const char *marker; /* NULL: JSON at the start of the text */
  sm_tc_section sec;
} marker_t;

static int markers_of(const sm_toolfmt *f, marker_t *m) {
  int k = 0;
  switch (f->kind) {
    case SM_TF_GENERIC:
      m[k++] = (marker_t){"<tool_call>", sec_hermes};
      m[k++] = (marker_t){"<|python_tag|>", sec_llama3};
      m[k++] = (marker_t){NULL, sec_llama3};
      break;
    case SM_TF_HERMES: m[k++] = (marker_t){"<tool_call>", sec_hermes}; break;
    case SM_TF_QWEN3_CODER: m[k++] = (marker_t){"<tool_call>", sm_tc_sec_qwen3_coder}; break;
    case SM_TF_GLM45: m[k++] = (marker_t){"<tool_call>", sm_tc_sec_glm45}; break;
    case SM_TF_LLAMA3:
      m[k++] = (marker_t){"<|python_tag|>", sec_llama3};
      m[k++] = (marker_t){NULL, sec_llama3};
      break;
    case SM_TF_MISTRAL: m[k++] = (marker_t){"[TOOL_CALLS]", sec_mistral}; break;
    case SM_TF_DEEPSEEK: m[k++] = (marker_t){DS_CALLS_BEGIN_, sec_deepseek}; break;
    case SM_TF_GEMMA: m[k++] = (marker_t){"```tool_code", sm_tc_sec_gemma}; break;
    default: break;
  }
  return k;
}

void sm_toolfmt_scan(const sm_toolfmt *f, const char *text, size_t len, bool final, const cJSON *tools,
                     sm_tc_scan *out) {
  drop_calls(out);
  sm_buf_clear(&out->content);
  sm_buf_clear(&out->reasoning);
  out->safe = 0;
  if (!f) f = &FORMATS[SM_TF_GENERIC];
  if (f->kind == SM_TF_HARMONY) {
    scan_harmony(text, len, final, out);
    if (final) {
      bool bad = false;
      for (int i = 0; i < out->n; i++) {
        cJSON *a = cJSON_ParseWithLength(out->calls[i].args.p ? out->calls[i].args.p : "", out->calls[i].args.n);
        bad |= !cJSON_IsObject(a);
        cJSON_Delete(a);
      }
      if (bad) drop_calls(out);
      out->safe = out->content.n;
    }
    return;
  }
  marker_t mk[4];
  int nm = markers_of(f, mk);
  size_t pos = 0;
  bool bad = false;
  for (;;) {
    const char *rest = text + pos;
    size_t rn = len - pos;
    /* earliest full marker, and the earliest place a marker might still begin */
    long best = -1, hold = (long)rn;
    int which = -1;
    for (int k = 0; k < nm; k++) {
      if (!mk[k].marker) { /* JSON call at the start of the text only */
        if (pos == 0 && out->n == 0) {
          size_t w = sm_skip_ws(rest, rn, 0);
          if (w == rn) {
            if (hold > 0) hold = 0;
          } else if (rest[w] == '{' || rest[w] == '[') {
            if (best < 0 || (long)w < best) {
              best = (long)w;
              which = k;
            }
          }
        }
        continue;
      }
      const char *m = mk[k].marker;
      const char *p = memmem(rest, rn, m, strlen(m));
      if (p && (best < 0 || p - rest < best)) {
        best = p - rest;
        which = k;
      }
      /* a proper prefix of the marker at the end */
      size_t ml = strlen(m);
      for (size_t l = SM_MIN(ml - 1, rn); l > 0; l--)
        if (!memcmp(rest + rn - l, m, l)) {
          if ((long)(rn - l) < hold) hold = (long)(rn - l);
          break;
        }
    }
    if (best < 0) {
      sm_buf_put(&out->content, rest, rn);
      if (out->n == 0) out->safe = out->content.n - (rn - (size_t)hold);
      break;
    }
    sm_buf_put(&out->content, rest, (size_t)best);
    if (out->n == 0) out->safe = out->content.n;
    int before = out->n;
    long r = mk[which].sec(rest + best, rn - (size_t)best, tools, out);
    if (r == TC_INCOMPLETE && final && before > 0) {
      /* cut off (max_tokens) after complete calls: keep those, drop the unfinished one */
      for (int i = before; i < out->n; i++) {
        free(out->calls[i].name);
        sm_buf_free(&out->calls[i].args);
      }
      out->n = before;
      break;
    }
    if (r < 0) {
      bad = r == TC_BAD || final;
      break;
    }
    if (!mk[which].marker) { /* a bare JSON call is the whole text */
      size_t after = (size_t)best + (size_t)r;
      if (sm_skip_ws(rest, rn, after) < rn) {
        bad = true;
        break;
      }
    }
    pos += (size_t)best + (size_t)r;
    if (pos >= len) break;
  }
  if (final) {
    if (bad || out->n == 0) {
      drop_calls(out);
      sm_buf_clear(&out->content);
      sm_buf_put(&out->content, text, len);
    }
    out->safe = out->content.n;
  } else if (bad) {
    /* malformed while streaming: the text will be content; what is before it is safe */
    drop_calls(out);
  }
}

void sm_tc_call_id(uint64_t id_seed, int i, char *out, size_t n) {
  snprintf(out, n, "call_%016llx%d", (unsigned long long)id_seed, i);
}

cJSON *sm_tc_calls_json(const sm_tc_scan *s, uint64_t id_seed) {
  if (!s->n) return NULL;
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; i < s->n; i++) {
    const sm_tc_call *c = &s->calls[i];
    cJSON *o = cJSON_CreateObject();
    char id[48];
    sm_tc_call_id(id_seed, i, id, sizeof id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(o, "function");
    cJSON_AddStringToObject(fn, "name", c->name ? c->name : "");
    cJSON_AddStringToObject(fn, "arguments", c->args.n ? c->args.p : "{}");
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

static char *trim_dup(const char *s, size_t len) {
  while (len && isspace((unsigned char)*s)) s++, len--;
  while (len && isspace((unsigned char)s[len - 1])) len--;
  if (!len) return NULL;
  char *o = sm_xmalloc(len + 1);
  memcpy(o, s, len);
  o[len] = 0;
  return o;
}

int sm_toolcall_parse(const char *text, uint64_t id_seed, cJSON **calls, char **content) {
  *calls = NULL;
  *content = NULL;
  if (!text) return 0;
  sm_tc_scan sc = {0};
  sm_toolfmt_scan(&FORMATS[SM_TF_GENERIC], text, strlen(text), true, NULL, &sc);
  int n = sc.n;
  if (n) {
    *calls = sm_tc_calls_json(&sc, id_seed);
    *content = trim_dup(sc.content.p ? sc.content.p : "", sc.content.n);
  }
  sm_tc_scan_free(&sc);
  return n;
}
