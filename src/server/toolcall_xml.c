/* Tool-call formats whose arguments are not JSON in the text: Qwen3-Coder's XML parameters,
 * GLM-4.5's arg_key/arg_value pairs and Gemma's Python call syntax. Their arguments are turned
 * into JSON as they are read, one finished parameter at a time, so the JSON text only grows
 * while streaming. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include "server/toolcall_int.h"

/* the JSON Schema type of parameter key of tool name, or NULL */
static const char *param_type(const cJSON *tools, const char *name, const char *key) {
  const cJSON *t;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(fn)) fn = t;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsString(nm) || !name || strcmp(nm->valuestring, name)) continue;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(fn, "parameters"),
                                                       "properties");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pr, key), "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
  }
  return NULL;
}

void sm_tc_xml_value(const cJSON *tools, const char *name, const char *key, const char *v, size_t n, sm_buf *out) {
  /* the templates put one newline around a value */
  if (n && v[0] == '\n') v++, n--;
  if (n && v[n - 1] == '\n') n--;
  const char *ty = param_type(tools, name, key);
  cJSON *j = NULL;
  if (!ty || strcmp(ty, "string")) {
    j = cJSON_ParseWithLength(v, n);
    if (j && cJSON_IsString(j) && ty) {
      cJSON_Delete(j);
      j = NULL;
    } /* keep the text as written */
  }
  if (!j) {
    char *t = sm_xmalloc(n + 1);
    memcpy(t, v, n);
    t[n] = 0;
    j = cJSON_CreateString(t);
    free(t);
  }
  char *p = cJSON_PrintUnformatted(j);
  sm_buf_puts(out, p);
  free(p);
  cJSON_Delete(j);
}

static void add_param(sm_tc_call *c, const cJSON *tools, const char *k, size_t kn, const char *v, size_t vn) {
  char *key = sm_xmalloc(kn + 1);
  memcpy(key, k, kn);
  key[kn] = 0;
  sm_buf_puts(&c->args, c->args.n ? ", " : "{");
  cJSON *ks = cJSON_CreateString(key);
  char *kj = cJSON_PrintUnformatted(ks);
  sm_buf_puts(&c->args, kj);
  sm_buf_puts(&c->args, ": ");
  free(kj);
  cJSON_Delete(ks);
  sm_tc_xml_value(tools, c->name, key, v, vn, &c->args);
  free(key);
}

static void close_args(sm_tc_call *c) {
  sm_buf_puts(&c->args, c->args.n ? "}" : "{}");
  c->done = true;
}

/* expects lit at s[i]; returns its end, TC_INCOMPLETE or TC_BAD */
static long expect(const char *s, size_t n, size_t i, const char *lit) {
  if (sm_has(s + i, n - i, lit)) return (long)(i + strlen(lit));
  return sm_starts(s + i, n - i, lit) ? TC_INCOMPLETE : TC_BAD;
}

/* <tool_call>\n<function=NAME>\n(<parameter=K>\nV\n</parameter>\n)*</function>\n</tool_call> */
long sm_tc_sec_qwen3_coder(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out) {
  size_t i = sm_skip_ws(s, n, strlen("<tool_call>"));
  long r = expect(s, n, i, "<function=");
  if (r < 0) return r;
  i = (size_t)r;
  const char *gt = memchr(s + i, '>', n - i);
  sm_tc_call *c = sm_tc_add(out);
  if (!gt) return TC_INCOMPLETE;
  size_t ne = (size_t)(gt - s);
  c->name = sm_xmalloc(ne - i + 1);
  memcpy(c->name, s + i, ne - i);
  c->name[ne - i] = 0;
  i = ne + 1;
  for (;;) {
    i = sm_skip_ws(s, n, i);
    if (i >= n) return TC_INCOMPLETE;
    if (sm_has(s + i, n - i, "</function>")) {
      close_args(c);
      i = sm_skip_ws(s, n, i + strlen("</function>"));
      r = expect(s, n, i, "</tool_call>");
      return r;
    }
    r = expect(s, n, i, "<parameter=");
    if (r < 0) return sm_starts(s + i, n - i, "</function>") ? TC_INCOMPLETE : r;
    i = (size_t)r;
    const char *kg = memchr(s + i, '>', n - i);
    if (!kg) return TC_INCOMPLETE;
    size_t ke = (size_t)(kg - s);
    const char *ve = memmem(kg + 1, n - ke - 1, "</parameter>", 12);
    if (!ve) return TC_INCOMPLETE;
    add_param(c, tools, s + i, ke - i, kg + 1, (size_t)(ve - kg - 1));
    i = (size_t)(ve - s) + 12;
  }
}

/* <tool_call>NAME\n(<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n)*</tool_call> */
long sm_tc_sec_glm45(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out) {
  size_t i = strlen("<tool_call>");
  size_t ne = i;
  while (ne < n && s[ne] != '\n' && s[ne] != '<') ne++;
  sm_tc_call *c = sm_tc_add(out);
  if (ne >= n) return TC_INCOMPLETE;
  size_t a = i, b = ne;
  while (a < b && isspace((unsigned char)s[a])) a++;
  while (b > a && isspace((unsigned char)s[b - 1])) b--;
  if (a == b) return TC_BAD;
  c->name = sm_xmalloc(b - a + 1);
  memcpy(c->name, s + a, b - a);
  c->name[b - a] = 0;
  i = ne;
  for (;;) {
    i = sm_skip_ws(s, n, i);
    if (i >= n) return TC_INCOMPLETE;
    if (sm_has(s + i, n - i, "</tool_call>")) {
      close_args(c);
      return (long)(i + 12);
    }
    long r = expect(s, n, i, "<arg_key>");
    if (r < 0) return sm_starts(s + i, n - i, "</tool_call>") ? TC_INCOMPLETE : r;
    i = (size_t)r;
    const char *ke = memmem(s + i, n - i, "</arg_key>", 10);
    if (!ke) return TC_INCOMPLETE;
    size_t k0 = i, k1 = (size_t)(ke - s);
    i = sm_skip_ws(s, n, k1 + 10);
    r = expect(s, n, i, "<arg_value>");
    if (r < 0) return r;
    i = (size_t)r;
    const char *vend = memmem(s + i, n - i, "</arg_value>", 12);
    if (!vend) return TC_INCOMPLETE;
    add_param(c, tools, s + k0, k1 - k0, s + i, (size_t)(vend - s) - i);
    i = (size_t)(vend - s) + 12;
  }
}

/* ---- Python call syntax: NAME(k=v, ...) with literals ---- */

/* a Python literal at s[i] -> JSON appended to out; returns its end or TC_* */
static long py_literal(const char *s, size_t n, size_t i, sm_buf *out, int depth) {
  if (depth > 32) return TC_BAD;
  i = sm_skip_ws(s, n, i);
  if (i >= n) return TC_INCOMPLETE;
  char c = s[i];
  if (c == '"' || c == '\'') {
    sm_buf raw = SM_BUF_INIT;
    size_t k = i + 1;
    for (; k < n && s[k] != c; k++) {
      if (s[k] == '\\' && k + 1 < n) {
        k++;
        char e = s[k];
        sm_buf_putc(&raw, e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e);
      } else {
        sm_buf_putc(&raw, s[k]);
      }
    }
    if (k >= n) {
      sm_buf_free(&raw);
      return TC_INCOMPLETE;
    }
    cJSON *j = cJSON_CreateString(sm_buf_str(&raw));
    char *p = cJSON_PrintUnformatted(j);
    sm_buf_puts(out, p);
    free(p);
    cJSON_Delete(j);
    sm_buf_free(&raw);
    return (long)k + 1;
  }
  if (c == '[' || c == '{') {
    char close = c == '[' ? ']' : '}';
    sm_buf_putc(out, c);
    size_t k = sm_skip_ws(s, n, i + 1);
    bool first = true;
    for (;;) {
      if (k >= n) return TC_INCOMPLETE;
      if (s[k] == close) {
        sm_buf_putc(out, close);
        return (long)k + 1;
      }
      if (!first) sm_buf_puts(out, ", ");
      first = false;
      long r = py_literal(s, n, k, out, depth + 1);
      if (r < 0) return r;
      k = sm_skip_ws(s, n, (size_t)r);
      if (c == '{') {
        if (k >= n) return TC_INCOMPLETE;
        if (s[k] != ':') return TC_BAD;
        sm_buf_puts(out, ": ");
        r = py_literal(s, n, k + 1, out, depth + 1);
        if (r < 0) return r;
        k = sm_skip_ws(s, n, (size_t)r);
      }
      if (k >= n) return TC_INCOMPLETE;
      if (s[k] == ',') k = sm_skip_ws(s, n, k + 1);
      else if (s[k] != close) return TC_BAD;
    }
  }
  size_t k = i;
  while (k < n && (isalnum((unsigned char)s[k]) || s[k] == '.' || s[k] == '-' || s[k] == '+' || s[k] == '_')) k++;
  if (k == i) return TC_BAD;
  if (k >= n) return TC_INCOMPLETE;
  size_t l = k - i;
  if (l == 4 && !memcmp(s + i, "True", 4)) sm_buf_puts(out, "true");
  else if (l == 5 && !memcmp(s + i, "False", 5)) sm_buf_puts(out, "false");
  else if (l == 4 && !memcmp(s + i, "None", 4)) sm_buf_puts(out, "null");
  else {
    cJSON *j = cJSON_ParseWithLength(s + i, l);
    if (!cJSON_IsNumber(j)) {
      cJSON_Delete(j);
      return TC_BAD;
    }
    cJSON_Delete(j);
    sm_buf_put(out, s + i, l);
  }
  return (long)k;
}

/* NAME(k=v, ...) at s[i] */
static long py_call(const char *s, size_t n, size_t i, sm_tc_scan *out) {
  size_t ne = i;
  while (ne < n && (isalnum((unsigned char)s[ne]) || s[ne] == '_' || s[ne] == '.' || s[ne] == '-')) ne++;
  sm_tc_call *c = sm_tc_add(out);
  if (ne >= n) return TC_INCOMPLETE;
  if (ne == i || s[ne] != '(') return TC_BAD;
  c->name = sm_xmalloc(ne - i + 1);
  memcpy(c->name, s + i, ne - i);
  c->name[ne - i] = 0;
  size_t k = sm_skip_ws(s, n, ne + 1);
  for (;;) {
    if (k >= n) return TC_INCOMPLETE;
    if (s[k] == ')') {
      close_args(c);
      return (long)k + 1;
    }
    size_t a = k;
    while (k < n && (isalnum((unsigned char)s[k]) || s[k] == '_')) k++;
    if (k >= n) return TC_INCOMPLETE;
    if (k == a || s[k] != '=') return TC_BAD;
    sm_buf val = SM_BUF_INIT;
    long r = py_literal(s, n, k + 1, &val, 0);
    if (r < 0) {
      sm_buf_free(&val);
      return r;
    }
    sm_buf_puts(&c->args, c->args.n ? ", " : "{");
    sm_buf_putc(&c->args, '"');
    sm_buf_put(&c->args, s + a, k - a);
    sm_buf_puts(&c->args, "\": ");
    sm_buf_put(&c->args, val.p, val.n);
    sm_buf_free(&val);
    k = sm_skip_ws(s, n, (size_t)r);
    if (k >= n) return TC_INCOMPLETE;
    if (s[k] == ',') k = sm_skip_ws(s, n, k + 1);
    else if (s[k] != ')') return TC_BAD;
  }
}

/* ```tool_code\nNAME(...)\n``` or [NAME(...), ...] inside */
long sm_tc_sec_gemma(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out) {
  (void)tools;
  size_t i = sm_skip_ws(s, n, strlen("```tool_code"));
  if (i >= n) return TC_INCOMPLETE;
  bool list = s[i] == '[';
  if (list) i = sm_skip_ws(s, n, i + 1);
  for (;;) {
    long r = py_call(s, n, i, out);
    if (r < 0) return r;
    i = sm_skip_ws(s, n, (size_t)r);
    if (i >= n) return TC_INCOMPLETE;
    if (s[i] == ',' || (!list && s[i] != '`')) {
      i = sm_skip_ws(s, n, s[i] == ',' ? i + 1 : i);
      continue;
    }
    if (list) {
      if (s[i] != ']') return TC_BAD;
      i = sm_skip_ws(s, n, i + 1);
    }
    long e = expect(s, n, i, "```");
    return e;
  }
}
