/* Grammars that force tool calls in each format (tool_choice "required" or a named function):
 * the call syntax of the format around arguments that follow each tool's parameters schema
 * (engine/grammar_schema.h, non-strict: unsupported keywords are not enforced). Markers that are
 * special tokens of the model are matched as those tokens (<[id]>). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_schema.h"
#include "server/toolcall_int.h"

/* marker text as a grammar item: the special token when the vocabulary has it as one */
static void marker(sm_buf *o, const smelt_tokenizer *tok, const char *m) {
  int32_t id = tok ? sm_tok_token_id(tok, m) : -1;
  if (id >= 0 && sm_tok_is_special(tok, id)) sm_buf_printf(o, " <[%d]> ", id);
  else {
    sm_buf_putc(o, ' ');
    sm_gbnf_literal(o, m, strlen(m));
    sm_buf_putc(o, ' ');
  }
}

static void lit(sm_buf *o, const char *s) {
  sm_buf_putc(o, ' ');
  sm_gbnf_literal(o, s, strlen(s));
  sm_buf_putc(o, ' ');
}

static void json_str_lit(sm_buf *o, const char *s) {
  cJSON *j = cJSON_CreateString(s);
  char *p = cJSON_PrintUnformatted(j);
  lit(o, p);
  free(p);
  cJSON_Delete(j);
}

/* XML-style parameters: each property in order, required ones mandatory; string values are
 * text without '<', others the property's JSON rule */
static smelt_status xml_params(sm_gbnf *b, const cJSON *params, bool glm, sm_buf *o) {
  const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
  const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required");
  const cJSON *p;
  cJSON_ArrayForEach(p, props) {
    bool required = false;
    const cJSON *r;
    cJSON_ArrayForEach(r, req) required |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
    sm_buf item = SM_BUF_INIT;
    sm_buf_puts(&item, "(");
    sm_buf open = SM_BUF_INIT;
    if (glm) sm_buf_printf(&open, "<arg_key>%s</arg_key>\n<arg_value>", p->string);
    else sm_buf_printf(&open, "<parameter=%s>\n", p->string);
    lit(&item, sm_buf_str(&open));
    sm_buf_free(&open);
    if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "string")) {
      sm_buf_puts(&item, " [^<]* ");
    } else {
      const char *rule;
      smelt_status st = sm_gbnf_add_schema(b, p, false, &rule);
      if (st) {
        sm_buf_free(&item);
        return st;
      }
      sm_buf_printf(&item, " %s ", rule);
    }
    lit(&item, glm ? "</arg_value>\n" : "\n</parameter>\n");
    sm_buf_puts(&item, required ? ")" : ")?");
    sm_buf_put(o, item.p, item.n);
    sm_buf_free(&item);
  }
  return SMELT_OK;
}

static smelt_status one_call(sm_gbnf *b, const sm_toolfmt *f, const smelt_tokenizer *tok, const char *name,
                             const cJSON *params, sm_buf *o) {
  const char *args = NULL;
  cJSON *empty = NULL;
  if (!params) params = empty = cJSON_Parse("{\"type\":\"object\"}");
  smelt_status st = SMELT_OK;
  if (f->kind != SM_TF_QWEN3_CODER && f->kind != SM_TF_GLM45) {
    st = sm_gbnf_add_schema(b, params, false, &args);
    if (st) {
      cJSON_Delete(empty);
      return st;
    }
  }
  sm_buf nb = SM_BUF_INIT;
  switch (f->kind) {
    case SM_TF_GENERIC:
    case SM_TF_HERMES:
      lit(o, "<tool_call>\n{\"name\": ");
      json_str_lit(o, name);
      lit(o, ", \"arguments\": ");
      sm_buf_printf(o, " %s ", args);
      lit(o, "}\n</tool_call>");
      break;
    case SM_TF_LLAMA3:
      lit(o, "{\"name\": ");
      json_str_lit(o, name);
      lit(o, ", \"parameters\": ");
      sm_buf_printf(o, " %s ", args);
      lit(o, "}");
      break;
    case SM_TF_MISTRAL:
      lit(o, "{\"name\": ");
      json_str_lit(o, name);
      lit(o, ", \"arguments\": ");
      sm_buf_printf(o, " %s ", args);
      lit(o, "}");
      break;
    case SM_TF_HARMONY:
      marker(o, tok, "<|channel|>");
      sm_buf_printf(&nb, "commentary to=functions.%s ", name);
      lit(o, sm_buf_str(&nb));
      marker(o, tok, "<|constrain|>");
      lit(o, "json");
      marker(o, tok, "<|message|>");
      sm_buf_printf(o, " %s ", args);
      break;
    case SM_TF_DEEPSEEK:
      marker(o, tok, DS_CALL_BEGIN_);
      lit(o, name);
      marker(o, tok, DS_SEP_);
      sm_buf_printf(o, " %s ", args);
      marker(o, tok, DS_CALL_END_);
      break;
    case SM_TF_QWEN3_CODER:
      sm_buf_printf(&nb, "<tool_call>\n<function=%s>\n", name);
      lit(o, sm_buf_str(&nb));
      st = xml_params(b, params, false, o);
      lit(o, "</function>\n</tool_call>");
      break;
    case SM_TF_GLM45:
      sm_buf_printf(&nb, "<tool_call>%s\n", name);
      lit(o, sm_buf_str(&nb));
      st = xml_params(b, params, true, o);
      lit(o, "</tool_call>");
      break;
    default:
      st = sm_err(SMELT_ERR_UNSUPPORTED,
                  "tool_choice 'required' or a named function is not supported for the '%s' "
                  "tool-call format",
                  f->name);
  }
  sm_buf_free(&nb);
  cJSON_Delete(empty);
  return st;
}

smelt_status sm_toolfmt_grammar(const sm_toolfmt *f, const smelt_tokenizer *tok, const cJSON *tools, const char *name,
                                bool parallel, char **gbnf) {
  *gbnf = NULL;
  sm_gbnf *b = sm_gbnf_new();
  sm_buf alts = SM_BUF_INIT;
  int k = 0;
  smelt_status st = SMELT_OK;
  const cJSON *t;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(fn)) fn = t;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsString(nm) || (name && strcmp(nm->valuestring, name))) continue;
    sm_buf body = SM_BUF_INIT;
    st = one_call(b, f, tok, nm->valuestring, cJSON_GetObjectItemCaseSensitive(fn, "parameters"), &body);
    if (st) {
      sm_buf_free(&body);
      break;
    }
    char rn[32];
    snprintf(rn, sizeof rn, "call%d", k);
    sm_gbnf_add_rule(b, rn, sm_buf_str(&body));
    sm_buf_free(&body);
    sm_buf_printf(&alts, "%s%s", k ? " | " : "", rn);
    k++;
  }
  if (!st && !k) st = sm_err(SMELT_ERR_INVALID, "no tool to call");
  if (!st) {
    sm_buf g = SM_BUF_INIT;
    sm_buf_printf(&g, "call ::= %s\n", sm_buf_str(&alts));
    bool multi = parallel && f->kind != SM_TF_HARMONY;
    const char *sep = f->kind == SM_TF_LLAMA3 ? "\"; \"" : f->kind == SM_TF_MISTRAL ? "\", \"" : "\"\\n\"";
    if (f->kind == SM_TF_MISTRAL) {
      sm_buf_puts(&g, "root ::= ");
      marker(&g, tok, "[TOOL_CALLS]");
      sm_buf_printf(&g, " \" \"? \"[\" call%s \"]\"\n", multi ? " (\", \" call)*" : "");
    } else if (f->kind == SM_TF_DEEPSEEK) {
      sm_buf_puts(&g, "root ::= ");
      marker(&g, tok, DS_CALLS_BEGIN_);
      sm_buf_printf(&g, " call%s ", multi ? "+" : "");
      marker(&g, tok, DS_CALLS_END_);
      sm_buf_puts(&g, "\n");
    } else {
      sm_buf_puts(&g, "root ::= ");
      if (f->kind == SM_TF_LLAMA3) { /* optionally after <|python_tag|> */
        sm_buf_puts(&g, "(");
        marker(&g, tok, "<|python_tag|>");
        sm_buf_puts(&g, ")? ");
      }
      sm_buf_printf(&g, "call%s%s%s\n", multi ? " (" : "", multi ? sep : "", multi ? " call)*" : "");
    }
    sm_buf_puts(&g, sm_gbnf_text(b));
    *gbnf = sm_buf_take(&g);
  }
  sm_buf_free(&alts);
  sm_gbnf_free(b);
  return st;
}
