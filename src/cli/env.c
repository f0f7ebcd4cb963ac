/* The environment the library's settings come from. The library reads no environment (only the
 * backends' tuning tables do, src/backend/tuning.h); the command line reads these variables once
 * at startup into the settings structs of the store and the engine (docs/store.md,
 * docs/architecture.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "engine/engine.h"
#include "store/store.h"

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

int sm_cli_configure_store(void) {
  sm_store_settings s;
  sm_store_settings_default(&s);
  s.home = env("HOME");
  s.cache_dir = env("SMELT_CACHE_DIR");
  s.hf_home = env("HF_HOME");
  s.hf_hub_cache = env("HF_HUB_CACHE");
  s.default_org = env("SMELT_DEFAULT_ORG");
  s.default_model = env("SMELT_DEFAULT_MODEL");
  s.hf_endpoint = env("HF_ENDPOINT");
  s.hf_token = env("HF_TOKEN") ? env("HF_TOKEN") : env("HUGGING_FACE_HUB_TOKEN");
  s.available_memory = env("SMELT_AVAILABLE_MEMORY");
  const char *r = env("SMELT_PULL_RETRIES");
  if (r) {
    char *end = NULL;
    errno = 0;
    long v = strtol(r, &end, 10);
    if (errno || end == r || *end || v < 0 || v > 1000) {
      fprintf(stderr, "smelt: SMELT_PULL_RETRIES=%s: expected an integer in [0, 1000]\n", r);
      return 2;
    }
    s.pull_retries = (int)v;
  }
  sm_store_configure(&s);
  return 0;
}

void sm_cli_engine_env(sm_engine_params *p) {
  const char *v = env("SMELT_HOST_SAMPLE");
  p->host_sample = v && strcmp(v, "0") != 0;
  v = env("SMELT_PIPELINE");
  p->pipeline = !(v && v[0] == '0');
  p->pipeline_always = v && !strcmp(v, "always");
}
