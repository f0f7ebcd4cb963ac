/* JSON Schema -> GBNF (see grammar_schema.h). Hand-written: no Debian library converts JSON
 * Schema to a grammar; the shapes of the shared rules follow llama.cpp's
 * json-schema-to-grammar (bounded digits and whitespace). */
#include "engine/grammar_schema.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  P_SPACE,
  P_BOOLEAN,
  P_NULL,
  P_INTEGER,
  P_NUMBER,
  P_STRING,
  P_CHAR,
  P_VALUE,
  P_OBJECT,
  P_ARRAY,
  P_INTEGRAL,
  P_DECIMAL,
  P_DATE,
  P_TIME,
  P_DATETIME,
  P_UUID,
  P_COUNT
};

static const struct {
  const char *name, *body;
  int deps[4];
} PRIM[P_COUNT] = {
  [P_SPACE] = {"space", "| \" \" | \"\\n\" [ \\t]{0,20}", {-1}},
  [P_BOOLEAN] = {"boolean", "(\"true\" | \"false\") space", {P_SPACE, -1}},
  [P_NULL] = {"null", "\"null\" space", {P_SPACE, -1}},
  [P_INTEGRAL] = {"integral-part", "[0] | [1-9] [0-9]{0,15}", {-1}},
  [P_DECIMAL] = {"decimal-part", "[0-9]{1,16}", {-1}},
  [P_INTEGER] = {"integer", "(\"-\"? integral-part) space", {P_INTEGRAL, P_SPACE, -1}},
  [P_NUMBER] = {"number",
                "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space",
                {P_INTEGRAL, P_DECIMAL, P_SPACE, -1}},
  [P_CHAR] = {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})", {-1}},
  [P_STRING] = {"string", "\"\\\"\" char* \"\\\"\" space", {P_CHAR, P_SPACE, -1}},
  [P_VALUE] = {"value", "object | array | string | number | boolean | null", {P_OBJECT, P_ARRAY, P_STRING, P_NUMBER}},
  [P_OBJECT] = {"object",
                "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space",
                {P_STRING, P_VALUE, P_SPACE, -1}},
  [P_ARRAY] = {"array", "\"[\" space ( value (\",\" space value)* )? \"]\" space", {P_VALUE, P_SPACE, -1}},
  [P_DATE] = {"date",
              "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )",
              {-1}},
  [P_TIME] = {"time",
              "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{3} )? ( \"Z\" | ( \"+\" "
              "| \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
              {-1}},
  [P_DATETIME] = {"date-time", "date \"T\" time", {P_DATE, P_TIME, -1}},
  [P_UUID] = {"uuid",
              "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}",
              {-1}},
};

typedef struct {
  char *ref, *rule;
} refent;

struct sm_gbnf {
  sm_buf rules; /* the caller's and the schemas' rules */
  sm_buf text;  /* rules + primitives, made by sm_gbnf_text */
  bool used[P_COUNT];
  int counter;
  char **names;
  int n_names; /* rule names handed out */
  refent *refs;
  int n_refs;
  const cJSON *doc; /* document of the schema being converted */
  bool strict;
  char err[300];
};

sm_gbnf *sm_gbnf_new(void) { return sm_xcalloc(1, sizeof(sm_gbnf)); }

void sm_gbnf_free(sm_gbnf *b) {
  if (!b) return;
  sm_buf_free(&b->rules);
  sm_buf_free(&b->text);
  for (int i = 0; i < b->n_names; i++) free(b->names[i]);
  free(b->names);
  for (int i = 0; i < b->n_refs; i++) {
    free(b->refs[i].ref);
    free(b->refs[i].rule);
  }
  free(b->refs);
  free(b);
}

static void use(sm_gbnf *b, int p) {
  if (b->used[p]) return;
  b->used[p] = true;
  if (p == P_VALUE) {
    use(b, P_OBJECT);
    use(b, P_ARRAY);
    use(b, P_STRING);
    use(b, P_NUMBER);
    use(b, P_BOOLEAN);
    use(b, P_NULL);
  }
  for (int i = 0; i < 4 && PRIM[p].deps[i] >= 0; i++) use(b, PRIM[p].deps[i]);
}

static const char *keep_name(sm_gbnf *b, char *nm) {
  b->names = sm_xrealloc(b->names, sizeof(char *) * (size_t)(b->n_names + 1));
  b->names[b->n_names++] = nm;
  return nm;
}

static const char *fresh(sm_gbnf *b) {
  char nm[32];
  snprintf(nm, sizeof nm, "s%d", b->counter++);
  return keep_name(b, sm_xstrdup(nm));
}

void sm_gbnf_add_rule(sm_gbnf *b, const char *name, const char *body) {
  sm_buf_printf(&b->rules, "%s ::= %s\n", name, body);
}

void sm_gbnf_literal(sm_buf *o, const char *s, size_t n) {
  sm_buf_putc(o, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"') sm_buf_puts(o, "\\\"");
    else if (c == '\\') sm_buf_puts(o, "\\\\");
    else if (c == '\n') sm_buf_puts(o, "\\n");
    else if (c == '\r') sm_buf_puts(o, "\\r");
    else if (c == '\t') sm_buf_puts(o, "\\t");
    else if (c < 0x20 || c == 0x7F) sm_buf_printf(o, "\\x%02X", c);
    else sm_buf_putc(o, (char)c);
  }
  sm_buf_putc(o, '"');
}

/* JSON text of v as a literal followed by space */
static void json_literal(sm_gbnf *b, sm_buf *o, const cJSON *v) {
  char *t = cJSON_PrintUnformatted(v);
  sm_gbnf_literal(o, t, strlen(t));
  free(t);
  sm_buf_puts(o, " space");
  use(b, P_SPACE);
}

static bool fail(sm_gbnf *b, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(sm_gbnf *b, const char *path, const char *fmt, ...) {
  if (b->err[0]) return false;
  char m[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  snprintf(b->err, sizeof b->err, "JSON schema at '%.80s': %s", path[0] ? path : "#", m);
  return false;
}

static const char *const ANNOTATIONS[] = {"title",          "description", "default",   "examples",
                                          "$schema",        "$id",         "$comment",  "strict",
                                          "deprecated",     "readOnly",    "writeOnly", "$defs",
                                          "definitions",    "name",        "nullable",  "contentMediaType",
                                          "contentEncoding"};
static const char *const HANDLED[] = {"type",     "properties", "required",  "additionalProperties",
                                      "enum",     "const",      "anyOf",     "oneOf",
                                      "allOf",    "$ref",       "items",     "prefixItems",
                                      "minItems", "maxItems",   "minLength", "maxLength",
                                      "format"};

static bool in_list(const char *k, const char *const *l, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(k, l[i])) return true;
  return false;
}

static bool gen(sm_gbnf *b, const cJSON *s, const char *path, sm_buf *out);

/* a sub-schema as a rule reference appended to out */
static bool gen_ref(sm_gbnf *b, const cJSON *s, const char *path, sm_buf *out) {
  sm_buf body = SM_BUF_INIT;
  if (!gen(b, s, path, &body)) {
    sm_buf_free(&body);
    return false;
  }
  const char *nm = fresh(b);
  sm_gbnf_add_rule(b, nm, sm_buf_str(&body));
  sm_buf_free(&body);
  sm_buf_puts(out, nm);
  return true;
}

static const cJSON *resolve(sm_gbnf *b, const char *ref, const char *path) {
  if (!strcmp(ref, "#")) return b->doc;
  if (strncmp(ref, "#/", 2)) {
    fail(b, path, "$ref '%.60s' is not supported (only local '#/...' references)", ref);
    return NULL;
  }
  const cJSON *cur = b->doc;
  const char *p = ref + 2;
  while (*p && cur) {
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    char key[256];
    size_t k = 0;
    for (size_t i = 0; i < n && k < sizeof key - 1; i++) {
      if (p[i] == '~' && i + 1 < n && (p[i + 1] == '0' || p[i + 1] == '1')) {
        key[k++] = p[i + 1] == '0' ? '~' : '/';
        i++;
      } else key[k++] = p[i];
    }
    key[k] = 0;
    cur = cJSON_IsArray(cur) ? cJSON_GetArrayItem(cur, atoi(key)) : cJSON_GetObjectItemCaseSensitive(cur, key);
    p = e ? e + 1 : p + n;
  }
  if (!cur) fail(b, path, "$ref '%.60s' points at nothing", ref);
  return cur;
}

static bool gen_object(sm_gbnf *b, const cJSON *s, const char *path, sm_buf *out) {
  const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
  const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
  const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
  if (props && !cJSON_IsObject(props)) return fail(b, path, "'properties' must be an object");
  if (req && !cJSON_IsArray(req)) return fail(b, path, "'required' must be an array");
  int np = props ? cJSON_GetArraySize(props) : 0;
  use(b, P_SPACE);
  /* required names that are not properties cannot be generated */
  const cJSON *r;
  cJSON_ArrayForEach(r, req) {
    if (!cJSON_IsString(r)) return fail(b, path, "'required' entries must be strings");
    if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
      return fail(b, path, "required property '%.60s' is not in 'properties'", r->valuestring);
  }
  if (np == 0) {
    if (cJSON_IsFalse(addl)) {
      sm_buf_puts(out, "\"{\" space \"}\" space");
      return true;
    }
    if (cJSON_IsObject(addl)) {
      /* any keys, values of the given schema */
      char sub[300];
      snprintf(sub, sizeof sub, "%s/additionalProperties", path);
      sm_buf v = SM_BUF_INIT;
      if (!gen_ref(b, addl, sub, &v)) {
        sm_buf_free(&v);
        return false;
      }
      use(b, P_STRING);
      sm_buf_printf(out, "\"{\" space ( string \":\" space %s (\",\" space string \":\" space %s)* )? \"}\" space", v.p,
                    v.p);
      sm_buf_free(&v);
      return true;
    }
    use(b, P_OBJECT);
    sm_buf_puts(out, "object");
    return true;
  }
  /* one rule per property: key, colon, value */
  const char **kv = sm_xcalloc((size_t)np, sizeof(char *));
  bool *required = sm_xcalloc((size_t)np, 1);
  int i = 0;
  const cJSON *p;
  cJSON_ArrayForEach(p, props) {
    cJSON_ArrayForEach(r, req) if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string)) required[i] = true;
    char sub[300];
    snprintf(sub, sizeof sub, "%s/properties/%.60s", path, p->string);
    sm_buf body = SM_BUF_INIT;
    cJSON *ks = cJSON_CreateString(p->string);
    char *key = cJSON_PrintUnformatted(ks);
    cJSON_Delete(ks);
    sm_gbnf_literal(&body, key, strlen(key));
    free(key);
    sm_buf_puts(&body, " space \":\" space ");
    if (!gen_ref(b, p, sub, &body)) {
      sm_buf_free(&body);
      free(kv);
      free(required);
      return false;
    }
    kv[i] = fresh(b);
    sm_gbnf_add_rule(b, kv[i], sm_buf_str(&body));
    sm_buf_free(&body);
    i++;
  }
  /* after_i: the rest from property i when something was written before (each with a comma);
   * first_i: the rest from property i when nothing was written yet */
  const char **after = sm_xcalloc((size_t)np + 1, sizeof(char *)), **first = sm_xcalloc((size_t)np + 1, sizeof(char *));
  for (i = np; i >= 0; i--) {
    after[i] = fresh(b);
    first[i] = fresh(b);
    sm_buf a = SM_BUF_INIT, f = SM_BUF_INIT;
    if (i == np) {
      sm_buf_puts(&a, "\"\"");
      sm_buf_puts(&f, "\"\"");
    } else if (required[i]) {
      sm_buf_printf(&a, "\",\" space %s %s", kv[i], after[i + 1]);
      sm_buf_printf(&f, "%s %s", kv[i], after[i + 1]);
    } else {
      sm_buf_printf(&a, "(\",\" space %s)? %s", kv[i], after[i + 1]);
      sm_buf_printf(&f, "%s %s | %s", kv[i], after[i + 1], first[i + 1]);
    }
    sm_gbnf_add_rule(b, after[i], sm_buf_str(&a));
    sm_gbnf_add_rule(b, first[i], sm_buf_str(&f));
    sm_buf_free(&a);
    sm_buf_free(&f);
  }
  sm_buf_printf(out, "\"{\" space %s \"}\" space", first[0]);
  free(after);
  free(first);
  free(kv);
  free(required);
  return true;
}

static bool gen_array(sm_gbnf *b, const cJSON *s, const char *path, sm_buf *out) {
  const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
  const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
  const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minItems"),
              *mx = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
  int lo = cJSON_IsNumber(mn) ? (int)mn->valuedouble : 0, hi = cJSON_IsNumber(mx) ? (int)mx->valuedouble : -1;
  if (lo < 0 || (hi >= 0 && hi < lo)) return fail(b, path, "minItems/maxItems are inconsistent");
  if (lo > 1000 || hi > 1000) return fail(b, path, "minItems/maxItems above 1000 are not supported");
  use(b, P_SPACE);
  char sub[300];
  if (cJSON_IsArray(prefix)) {
    sm_buf_puts(out, "\"[\" space");
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, prefix) {
      snprintf(sub, sizeof sub, "%s/prefixItems/%d", path, k);
      sm_buf_puts(out, k ? " \",\" space " : " ");
      if (!gen_ref(b, it, sub, out)) return false;
      k++;
    }
    sm_buf_puts(out, " \"]\" space");
    return true;
  }
  sm_buf item = SM_BUF_INIT;
  snprintf(sub, sizeof sub, "%s/items", path);
  if (items && !cJSON_IsBool(items)) {
    if (!gen_ref(b, items, sub, &item)) {
      sm_buf_free(&item);
      return false;
    }
  } else {
    use(b, P_VALUE);
    sm_buf_puts(&item, "value");
  }
  const char *it = sm_buf_str(&item);
  if (hi == 0) sm_buf_puts(out, "\"[\" space \"]\" space");
  else if (lo == 0 && hi < 0) sm_buf_printf(out, "\"[\" space ( %s (\",\" space %s)* )? \"]\" space", it, it);
  else {
    sm_buf_printf(out, "\"[\" space %s%s (\",\" space %s)", lo == 0 ? "( " : "", it, it);
    int rlo = lo > 0 ? lo - 1 : 0;
    if (hi < 0) sm_buf_printf(out, "{%d,}", rlo);
    else sm_buf_printf(out, "{%d,%d}", rlo, hi - 1);
    sm_buf_printf(out, "%s \"]\" space", lo == 0 ? " )?" : "");
  }
  sm_buf_free(&item);
  return true;
}

static bool gen_string(sm_gbnf *b, const cJSON *s, const char *path, sm_buf *out) {
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
  const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minLength"),
              *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
  use(b, P_SPACE);
  if (cJSON_IsString(fmt)) {
    int p = !strcmp(fmt->valuestring, "date")      ? P_DATE
          : !strcmp(fmt->valuestring, "time")      ? P_TIME
          : !strcmp(fmt->valuestring, "date-time") ? P_DATETIME
          : !strcmp(fmt->valuestring, "uuid")      ? P_UUID
                                                   : -1;
    if (p >= 0) {
      use(b, p);
      sm_buf_printf(out, "\"\\\"\" %s \"\\\"\" space", PRIM[p].name);
      return true;
    }
    if (b->strict) return fail(b, path, "format '%.40s' is not supported", fmt->valuestring);
  }
  if (!mn && !mx) {
    use(b, P_STRING);
    sm_buf_puts(out, "string");
    return true;
  }
  int lo = cJSON_IsNumber(mn) ? (int)mn->valuedouble : 0, hi = cJSON_IsNumber(mx) ? (int)mx->valuedouble : -1;
  if (lo < 0 || (hi >= 0 && hi < lo)) return fail(b, path, "minLength/maxLength are inconsistent");
  if (lo > 10000 || hi > 10000) return fail(b, path, "minLength/maxLength above 10000 are not supported");
  use(b, P_CHAR);
  if (hi < 0) sm_buf_printf(out, "\"\\\"\" char{%d,} \"\\\"\" space", lo);
  else sm_buf_printf(out, "\"\\\"\" char{%d,%d} \"\\\"\" space", lo, hi);
  return true;
}

static bool gen_type(sm_gbnf *b, const cJSON *s, const char *t, const char *path, sm_buf *out) {
  if (!strcmp(t, "object")) return gen_object(b, s, path, out);
  if (!strcmp(t, "array")) return gen_array(b, s, path, out);
  if (!strcmp(t, "string")) return gen_string(b, s, path, out);
  int p = !strcmp(t, "integer") ? P_INTEGER
        : !strcmp(t, "number")  ? P_NUMBER
        : !strcmp(t, "boolean") ? P_BOOLEAN
        : !strcmp(t, "null")    ? P_NULL
                                : -1;
  if (p < 0) return fail(b, path, "unknown type '%.40s'", t);
  use(b, p);
  sm_buf_puts(out, PRIM[p].name);
  return true;
}

static bool gen(sm_gbnf *b, const cJSON *s, const char *path, sm_buf *out) {
  if (b->err[0]) return false;
  if (cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
    use(b, P_VALUE);
    sm_buf_puts(out, "value");
    return true;
  }
  if (!cJSON_IsObject(s)) return fail(b, path, "a schema must be an object or true");
  for (const cJSON *k = s->child; k; k = k->next) {
    if (in_list(k->string, HANDLED, SM_ARRAY_LEN(HANDLED)) ||
        in_list(k->string, ANNOTATIONS, SM_ARRAY_LEN(ANNOTATIONS)))
      continue;
    if (b->strict) return fail(b, path, "keyword '%.40s' is not supported", k->string);
  }
  const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
  if (cJSON_IsString(ref)) {
    for (int i = 0; i < b->n_refs; i++)
      if (!strcmp(b->refs[i].ref, ref->valuestring)) {
        sm_buf_puts(out, b->refs[i].rule);
        return true;
      }
    const cJSON *target = resolve(b, ref->valuestring, path);
    if (!target) return false;
    const char *nm = fresh(b);
    b->refs = sm_xrealloc(b->refs, sizeof(refent) * (size_t)(b->n_refs + 1));
    b->refs[b->n_refs].ref = sm_xstrdup(ref->valuestring);
    b->refs[b->n_refs].rule = sm_xstrdup(nm);
    b->n_refs++;
    sm_buf body = SM_BUF_INIT;
    if (!gen(b, target, ref->valuestring, &body)) {
      sm_buf_free(&body);
      return false;
    }
    sm_gbnf_add_rule(b, nm, sm_buf_str(&body));
    sm_buf_free(&body);
    sm_buf_puts(out, nm);
    return true;
  }
  char sub[300];
  const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
  if (cst) {
    json_literal(b, out, cst);
    return true;
  }
  const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
  if (en) {
    if (!cJSON_IsArray(en) || !en->child) return fail(b, path, "'enum' must be a non-empty array");
    sm_buf_puts(out, "(");
    for (const cJSON *v = en->child; v; v = v->next) {
      if (v != en->child) sm_buf_puts(out, " | ");
      json_literal(b, out, v);
    }
    sm_buf_puts(out, ")");
    return true;
  }
  const char *alt_kw = cJSON_GetObjectItemCaseSensitive(s, "anyOf") ? "anyOf"
                     : cJSON_GetObjectItemCaseSensitive(s, "oneOf") ? "oneOf"
                                                                    : NULL;
  if (alt_kw) {
    const cJSON *alts = cJSON_GetObjectItemCaseSensitive(s, alt_kw);
    if (!cJSON_IsArray(alts) || !alts->child) return fail(b, path, "'%s' must be a non-empty array", alt_kw);
    sm_buf_puts(out, "(");
    int k = 0;
    for (const cJSON *a = alts->child; a; a = a->next, k++) {
      if (k) sm_buf_puts(out, " | ");
      snprintf(sub, sizeof sub, "%s/%s/%d", path, alt_kw, k);
      if (!gen_ref(b, a, sub, out)) return false;
    }
    sm_buf_puts(out, ")");
    return true;
  }
  const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
  if (all) {
    if (!cJSON_IsArray(all) || !all->child) return fail(b, path, "'allOf' must be a non-empty array");
    /* merge object schemas: properties in order, required together */
    cJSON *m = cJSON_CreateObject(), *mp = cJSON_AddObjectToObject(m, "properties"),
          *mr = cJSON_AddArrayToObject(m, "required");
    cJSON_AddStringToObject(m, "type", "object");
    cJSON_AddFalseToObject(m, "additionalProperties");
    int k = 0;
    for (const cJSON *a = all->child; a; a = a->next, k++) {
      const cJSON *x = a;
      const cJSON *xr = cJSON_GetObjectItemCaseSensitive(x, "$ref");
      if (cJSON_IsString(xr)) x = resolve(b, xr->valuestring, path);
      const cJSON *xt = x ? cJSON_GetObjectItemCaseSensitive(x, "type") : NULL;
      const cJSON *xp = x ? cJSON_GetObjectItemCaseSensitive(x, "properties") : NULL;
      if (!x || (xt && !(cJSON_IsString(xt) && !strcmp(xt->valuestring, "object"))) || (!xt && !xp)) {
        cJSON_Delete(m);
        return b->err[0] ? false : fail(b, path, "'allOf' is supported for object schemas only");
      }
      const cJSON *q;
      cJSON_ArrayForEach(q, xp) if (!cJSON_GetObjectItemCaseSensitive(mp, q->string))
        cJSON_AddItemToObject(mp, q->string, cJSON_Duplicate(q, 1));
      cJSON_ArrayForEach(q, cJSON_GetObjectItemCaseSensitive(x, "required"))
        cJSON_AddItemToArray(mr, cJSON_Duplicate(q, 1));
    }
    bool ok = gen_object(b, m, path, out);
    cJSON_Delete(m);
    return ok;
  }
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
  if (cJSON_IsString(ty)) return gen_type(b, s, ty->valuestring, path, out);
  if (cJSON_IsArray(ty)) {
    if (!ty->child) return fail(b, path, "'type' must not be an empty array");
    sm_buf_puts(out, "(");
    for (const cJSON *t = ty->child; t; t = t->next) {
      if (!cJSON_IsString(t)) return fail(b, path, "'type' entries must be strings");
      if (t != ty->child) sm_buf_puts(out, " | ");
      if (!gen_type(b, s, t->valuestring, path, out)) return false;
    }
    sm_buf_puts(out, ")");
    return true;
  }
  if (ty) return fail(b, path, "'type' must be a string or an array");
  /* no type: infer from the keywords */
  if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
    return gen_object(b, s, path, out);
  if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems"))
    return gen_array(b, s, path, out);
  use(b, P_VALUE);
  sm_buf_puts(out, "value");
  return true;
}

static bool utf8_ok(const unsigned char *p) {
  while (*p) {
    int n = *p < 0x80 ? 0 : (*p >> 5) == 6 ? 1 : (*p >> 4) == 14 ? 2 : (*p >> 3) == 30 ? 3 : -1;
    if (n < 0 || *p == 0xC0 || *p == 0xC1 || *p > 0xF4) return false;
    p++;
    for (int i = 0; i < n; i++, p++)
      if ((*p & 0xC0) != 0x80) return false;
  }
  return true;
}

smelt_status sm_gbnf_add_schema(sm_gbnf *b, const cJSON *schema, bool strict, const char **rule) {
  /* literals come from the schema's strings: they must be text the grammar can match */
  char *all = cJSON_PrintUnformatted(schema);
  bool ok8 = all && utf8_ok((const unsigned char *)all);
  free(all);
  if (!ok8) return sm_err(SMELT_ERR_INVALID, "JSON schema: the schema contains invalid UTF-8");
  b->doc = schema;
  b->strict = strict;
  b->err[0] = 0;
  sm_buf body = SM_BUF_INIT;
  bool ok = gen(b, schema, "", &body);
  if (ok) {
    const char *nm = fresh(b);
    sm_gbnf_add_rule(b, nm, sm_buf_str(&body));
    *rule = nm;
  }
  sm_buf_free(&body);
  b->doc = NULL;
  if (!ok) return sm_err(SMELT_ERR_INVALID, "%s", b->err);
  return SMELT_OK;
}

const char *sm_gbnf_text(sm_gbnf *b) {
  sm_buf_clear(&b->text);
  sm_buf_put(&b->text, b->rules.p ? b->rules.p : "", b->rules.n);
  for (int p = 0; p < P_COUNT; p++)
    if (b->used[p]) sm_buf_printf(&b->text, "%s ::= %s\n", PRIM[p].name, PRIM[p].body);
  return sm_buf_str(&b->text);
}

smelt_status sm_schema_to_gbnf(const cJSON *schema, bool strict, char **gbnf) {
  *gbnf = NULL;
  sm_gbnf *b = sm_gbnf_new();
  const char *rule;
  smelt_status st = sm_gbnf_add_schema(b, schema, strict, &rule);
  if (!st) {
    sm_buf r = SM_BUF_INIT;
    sm_buf_printf(&r, "root ::= %s\n", rule);
    sm_buf_puts(&r, sm_gbnf_text(b));
    *gbnf = sm_buf_take(&r);
  }
  sm_gbnf_free(b);
  return st;
}
