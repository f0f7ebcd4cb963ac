/* `smelt serve` lifecycle: load the model, start the scheduler (sched.c) and the HTTP front end
 * (http.c), serve until a signal, drain, shut down. */
#include "server/server.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base/mapguard.h"
#include "server/http.h"
#include "server/models.h"

void sm_server_params_default(sm_server_params *p) {
  memset(p, 0, sizeof *p);
  p->host = "127.0.0.1";
  p->port = 8080;
  p->parallel = 4;
  p->max_queue = 64;
  p->grammar_cache = 128ull << 20;
  p->max_body = 0; /* sm_server_run: 1 MiB, or SM_SERVER_IMAGE_BODY for a model that takes images */
  p->max_conns = 1024;
  p->max_conns_per_ip = 256;
  p->http_threads = 4;
  p->cpu_poll = 50;
  p->header_timeout = 20;
  p->body_timeout = 60;
  p->timeout = 600;
  p->max_buffered_body = (size_t)64 << 20;
  p->shutdown_timeout = 20;
  p->models_max = 4;
  p->models_load_timeout = 300;
  p->draft_max = 16;
  p->draft_p_min = 0.75f;
  p->spec_ngram_n = 3;
}

/* the log: stderr, or --log-file (appended; reopened on SIGHUP for log rotation) */
static bool open_log(const char *path) {
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "smelt serve: cannot open the log file %s: %s\n", path, strerror(errno));
    return false;
  }
  fflush(stderr);
  bool ok = dup2(fd, 2) == 2;
  close(fd);
  return ok;
}

/* Wait for signals; drain on SIGTERM/SIGINT or after a fatal error. Returns the exit code. */
static int serve(const sm_server_params *p, sm_models *models, sm_http *http) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  int rc = SM_SERVER_EXIT_OK;
  bool draining = false, failed_all = false;
  double deadline = 0, grace_end = 0;
  for (;;) {
    struct timespec ts = {0, 100 * 1000000L};
    int sig = sigtimedwait(&set, NULL, &ts);
    double now = sm_now();
    if (sig == SIGHUP) {
      if (p->log_file && open_log(p->log_file)) fprintf(stderr, "smelt serve: SIGHUP: log file reopened\n");
      else if (!p->log_file) fprintf(stderr, "smelt serve: SIGHUP ignored (no --log-file)\n");
    } else if (sig == SIGTERM || sig == SIGINT) {
      if (!draining) {
        fprintf(stderr, "smelt serve: %s: no new requests; in-flight ones get up to %g s\n",
                sig == SIGTERM ? "SIGTERM" : "SIGINT", p->shutdown_timeout);
        draining = true;
        deadline = now + p->shutdown_timeout;
        sm_http_drain(http);
      } else {
        fprintf(stderr, "smelt serve: second signal: ending in-flight requests now\n");
        deadline = now;
      }
    }
    char fmsg[256];
    bool fatal = sm_models_fatal(models, fmsg, sizeof fmsg), idle = sm_models_idle(models);
    if (draining && !failed_all && !idle && now >= deadline) {
      sm_models_fail_all(models, 503, "the server is shutting down");
      failed_all = true;
    }
    if (fatal && rc == SM_SERVER_EXIT_OK) {
      fprintf(stderr, "smelt serve: fatal: %s\n", fmsg);
      rc = SM_SERVER_EXIT_FATAL;
      if (!draining) {
        draining = true;
        sm_http_drain(http);
      }
      deadline = now;
    }
    if (!draining || !idle) continue;
    /* nothing runs: let the last answers reach their clients, briefly */
    if (grace_end == 0) grace_end = now + 2;
    if (sm_http_active(http) == 0 || now >= grace_end) break;
  }
  return rc;
}

int sm_server_run(const sm_server_params *pp) {
  sm_server_params p = *pp;
  if (p.parallel < 1) p.parallel = 1;
  if (p.max_queue < 0) p.max_queue = 0;
  /* signals are taken synchronously by the main thread (serve); threads inherit the mask */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (p.log_file && !open_log(p.log_file)) return SM_SERVER_EXIT_START;
  /* a weights file truncated under the map fails the requests instead of killing the process */
  if (!p.no_mmap) sm_mapguard_install();
  sm_metrics *metrics = sm_metrics_new(); /* HTTP requests; each model counts its tokens */
  sm_http *http = NULL;
  int rc = SM_SERVER_EXIT_START;
  if (p.tool_format && !sm_toolfmt_by_name(p.tool_format)) {
    fprintf(stderr, "smelt serve: unknown --tool-format '%s' (%s)\n", p.tool_format, sm_toolfmt_names());
    sm_metrics_free(metrics);
    return SM_SERVER_EXIT_START;
  }
  sm_models *models = sm_models_new(&p);
  if (!models || !sm_models_start(models)) goto out;
  if (!p.max_body) { /* images come base64 in the JSON: a 1024x768 PNG is about 2.5 MB of it */
    const sm_served *one = sm_models_single(models);
    p.max_body = one && one->model->vision ? SM_SERVER_IMAGE_BODY : (size_t)1 << 20;
  }
  if (p.max_buffered_body < p.max_body) p.max_buffered_body = p.max_body; /* one body always fits */
  sm_http_cfg hc = {.p = &p, .models = models, .metrics = metrics};
  http = sm_http_start(&hc);
  if (!http) {
    sm_models_stop(models);
    goto out;
  }
  fprintf(stderr, "smelt serve: listening on http://%s:%d\n", p.host, sm_http_port(http));
  fflush(stderr);
  rc = serve(&p, models, http);
  sm_models_stop(models); /* engine threads end, prompt cache files are written */
  sm_http_stop(http);
  fprintf(stderr, "smelt serve: stopped\n");
out:
  sm_models_free(models);
  sm_metrics_free(metrics);
  return rc;
}
