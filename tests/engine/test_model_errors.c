/* Bad checkpoints give clear errors, never crashes. */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "model/model.h"
#include "../test_util.h"

static char base[512];

static void write_file(const char *dir, const char *name, const char *text) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  fputs(text, f);
  fclose(f);
}

static smelt_status try_load(const char *dir) {
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  smelt_model *m = NULL;
  smelt_status st = smelt_model_load(dir, &mp, &m);
  if (m) smelt_model_free(m);
  return st;
}

/* copy the good model into a new dir, then let the caller damage it */
static void clone(const char *good, const char *dst) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, good, dst);
  if (system(cmd)) exit(1);
}

int main(int argc, char **argv) {
  snprintf(base, sizeof base, "%s", argc > 1 ? argv[1] : "/tmp/smelt-test-errors");
  mkdir(base, 0755);
  char good[600], d[600];
  snprintf(good, sizeof good, "%s/good", base);
  snprintf(d, sizeof d, "%s/bad", base);
  if (sm_make_synthetic(sm_synth_find("test"), 4, 64, good, false)) return 1;
  CHECK(try_load(good) == SMELT_OK, "good model loads: %s", smelt_last_error());

  CHECK(try_load("/nonexistent/model") == SMELT_ERR_IO, "missing dir");
  CHECK(strstr(smelt_last_error(), "not found") != NULL, "message: %s", smelt_last_error());

  clone(good, d);
  write_file(d, "config.json",
             "{\"model_type\": \"transformer-xl\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 4, \"intermediate_size\": 256, \"vocab_size\": 512}");
  CHECK(try_load(d) == SMELT_ERR_UNSUPPORTED, "unknown family");
  CHECK(strstr(smelt_last_error(), "transformer-xl") && strstr(smelt_last_error(), "llama"), "message: %s",
        smelt_last_error());

  clone(good, d);
  write_file(d, "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 64,");
  CHECK(try_load(d) != SMELT_OK, "truncated config.json");

  clone(good, d);
  write_file(d, "config.json",
             "{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 256,"
             " \"vocab_size\": 512, \"quantization\": {\"bits\": 4, \"group_size\": 64}}");
  CHECK(try_load(d) == SMELT_ERR_FORMAT, "hidden size mismatch with tensors");
  CHECK(strstr(smelt_last_error(), "shape") || strstr(smelt_last_error(), "expected"), "message: %s",
        smelt_last_error());

  clone(good, d);
  write_file(d, "config.json",
             "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 3,"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 256,"
             " \"vocab_size\": 512, \"quantization\": {\"bits\": 4, \"group_size\": 64}}");
  CHECK(try_load(d) == SMELT_ERR_FORMAT, "missing layer tensors");
  CHECK(strstr(smelt_last_error(), "model.layers.2"), "message names the tensor: %s", smelt_last_error());

  clone(good, d);
  write_file(d, "config.json",
             "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 256,"
             " \"vocab_size\": 512, \"quantization\": {\"bits\": 8, \"group_size\": 64}}");
  CHECK(try_load(d) == SMELT_ERR_FORMAT, "config bits disagree with packed shapes");

  /* truncated safetensors */
  clone(good, d);
  char p[1024];
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  struct stat sb;
  stat(p, &sb);
  CHECK(truncate(p, sb.st_size / 2) == 0, "truncate");
  CHECK(try_load(d) == SMELT_ERR_FORMAT, "truncated safetensors: %s", smelt_last_error());
  TEST_END();
}
