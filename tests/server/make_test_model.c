/* Writes a tiny random-weight llama checkpoint with a byte-level BPE tokenizer (256 byte
 * tokens + ChatML specials; <|endoftext|> prepended by the post-processor) and a ChatML chat
 * template: a fast, self-contained model for the server tests.  usage: make_test_model DIR [LAYERS [FAMILY]]
 * (LAYERS, default 2: another count makes another model, for tests that need two; FAMILY, default llama:
 * another registered family's layout, e.g. a hybrid one, whose test pattern has 2 layers) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#include "model/model.h"

static int byte_to_unicode(int b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
  int n = 0;
  for (int x = 0; x < b; x++)
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
  return 256 + n;
}

static void utf8(int cp, char *out) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    out[1] = 0;
  } else if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 63));
    out[2] = 0;
  } else {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 63));
    out[2] = (char)(0x80 | (cp & 63));
    out[3] = 0;
  }
}

static int write_json(const char *dir, const char *name, cJSON *j) {
  char *p = sm_path_join(dir, name), *s = cJSON_Print(j);
  FILE *f = fopen(p, "w");
  if (!f) {
    fprintf(stderr, "cannot write %s\n", p);
    return 1;
  }
  fputs(s, f);
  fclose(f);
  free(p);
  free(s);
  cJSON_Delete(j);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR [LAYERS [FAMILY]]\n", argv[0]);
    return 2;
  }
  const char *dir = argv[1];
  const int layers = argc > 2 ? atoi(argv[2]) : 2;
  if (layers < 1 || layers > 16) {
    fprintf(stderr, "LAYERS must be 1 to 16\n");
    return 2;
  }
  static const char *specials[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>"};
  int vocab = 256 + 4;
  sm_synth_shape sh = {"srvtest", 64, layers, 4, 2, 160, vocab, true, argc > 3 ? argv[3] : NULL, 0, NULL};
  mkdir(dir, 0755);
  if (sm_make_synthetic(&sh, 0, 0, dir, false) != SMELT_OK) {
    fprintf(stderr, "%s\n", smelt_last_error());
    return 1;
  }
  cJSON *t = cJSON_CreateObject();
  cJSON_AddStringToObject(t, "version", "1.0");
  cJSON *added = cJSON_AddArrayToObject(t, "added_tokens");
  for (int i = 0; i < 4; i++) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", 256 + i);
    cJSON_AddStringToObject(a, "content", specials[i]);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", i < 3);
    cJSON_AddItemToArray(added, a);
  }
  cJSON_AddNullToObject(t, "normalizer");
  cJSON *pre = cJSON_AddObjectToObject(t, "pre_tokenizer");
  cJSON_AddStringToObject(pre, "type", "ByteLevel");
  cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
  cJSON_AddBoolToObject(pre, "trim_offsets", 1);
  cJSON_AddBoolToObject(pre, "use_regex", 1);
  /* the post-processor adds <|endoftext|> in front (as Llama's adds BOS); the chat template does
   * not write it, so a rendered chat prompt must be encoded without special tokens */
  cJSON *post = cJSON_AddObjectToObject(t, "post_processor");
  cJSON_AddStringToObject(post, "type", "TemplateProcessing");
  cJSON *single = cJSON_AddArrayToObject(post, "single");
  cJSON *it = cJSON_CreateObject(), *stok = cJSON_AddObjectToObject(it, "SpecialToken");
  cJSON_AddStringToObject(stok, "id", "<|endoftext|>");
  cJSON_AddNumberToObject(stok, "type_id", 0);
  cJSON_AddItemToArray(single, it);
  it = cJSON_CreateObject();
  cJSON *seq = cJSON_AddObjectToObject(it, "Sequence");
  cJSON_AddStringToObject(seq, "id", "A");
  cJSON_AddNumberToObject(seq, "type_id", 0);
  cJSON_AddItemToArray(single, it);
  cJSON *sp = cJSON_AddObjectToObject(post, "special_tokens"), *eot = cJSON_AddObjectToObject(sp, "<|endoftext|>");
  cJSON_AddStringToObject(eot, "id", "<|endoftext|>");
  cJSON *ids = cJSON_AddArrayToObject(eot, "ids");
  cJSON_AddItemToArray(ids, cJSON_CreateNumber(258));
  cJSON *toks = cJSON_AddArrayToObject(eot, "tokens");
  cJSON_AddItemToArray(toks, cJSON_CreateString("<|endoftext|>"));
  cJSON *dec = cJSON_AddObjectToObject(t, "decoder");
  cJSON_AddStringToObject(dec, "type", "ByteLevel");
  cJSON_AddBoolToObject(dec, "add_prefix_space", 1);
  cJSON_AddBoolToObject(dec, "trim_offsets", 1);
  cJSON_AddBoolToObject(dec, "use_regex", 1);
  cJSON *m = cJSON_AddObjectToObject(t, "model");
  cJSON_AddStringToObject(m, "type", "BPE");
  cJSON_AddNullToObject(m, "dropout");
  cJSON_AddNullToObject(m, "unk_token");
  cJSON_AddBoolToObject(m, "fuse_unk", 0);
  cJSON_AddBoolToObject(m, "byte_fallback", 0);
  cJSON *v = cJSON_AddObjectToObject(m, "vocab");
  for (int b = 0; b < 256; b++) {
    char s[8];
    utf8(byte_to_unicode(b), s);
    cJSON_AddNumberToObject(v, s, b);
  }
  cJSON_AddArrayToObject(m, "merges");
  if (write_json(dir, "tokenizer.json", t)) return 1;
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "eos_token", "<|im_end|>");
  cJSON_AddNullToObject(c, "bos_token");
  cJSON_AddStringToObject(
    c, "chat_template",
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}{{ t | tojson }}{{ '\\n' }}{%- endfor %}"
    "{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}");
  return write_json(dir, "tokenizer_config.json", c);
}
