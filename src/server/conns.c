/* Connection guard of `smelt serve` (see conns.h). */
#include "server/conns.h"
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define WATCH_MS 100 /* watchdog period: deadlines are kept to about this */

struct sm_conns {
  double header_timeout, body_timeout;
  size_t max_buffered, buffered;
  pthread_mutex_t mu;
  sm_sock *head;
  uint64_t next_serial;
  int n_active;
  pthread_t thread;
  bool started;
  atomic_bool stop;
  int wake_fd;
};

sm_conns *sm_conns_new(double header_timeout, double body_timeout, size_t max_buffered) {
  sm_conns *g = sm_xcalloc(1, sizeof *g);
  g->header_timeout = header_timeout;
  g->body_timeout = body_timeout;
  g->max_buffered = max_buffered;
  pthread_mutex_init(&g->mu, NULL);
  g->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return g;
}

/* ------------------------------------------------------------------ tracking */

sm_sock *sm_conns_open(sm_conns *g, struct MHD_Connection *c, int fd) {
  sm_sock *k = sm_xcalloc(1, sizeof *k);
  k->g = g;
  k->c = c;
  k->fd = fd;
  k->phase = SM_PH_IDLE;
  k->t_phase = sm_now();
  pthread_mutex_lock(&g->mu);
  k->serial = ++g->next_serial;
  k->next = g->head;
  if (g->head) g->head->prev = k;
  g->head = k;
  pthread_mutex_unlock(&g->mu);
  return k;
}

void sm_conns_close(sm_conns *g, sm_sock *k) {
  pthread_mutex_lock(&g->mu);
  if (k->prev) k->prev->next = k->next;
  else g->head = k->next;
  if (k->next) k->next->prev = k->prev;
  if (k->phase != SM_PH_IDLE) g->n_active--;
  pthread_mutex_unlock(&g->mu);
  free(k);
}

void sm_conns_phase(sm_conns *g, sm_sock *k, int phase) {
  pthread_mutex_lock(&g->mu);
  if ((k->phase != SM_PH_IDLE) != (phase != SM_PH_IDLE)) g->n_active += phase != SM_PH_IDLE ? 1 : -1;
  k->phase = phase;
  k->t_phase = sm_now();
  pthread_mutex_unlock(&g->mu);
}

int sm_conns_active(sm_conns *g) {
  pthread_mutex_lock(&g->mu);
  int n = g->n_active;
  pthread_mutex_unlock(&g->mu);
  return n;
}

bool sm_conns_reserve(sm_conns *g, size_t n) {
  pthread_mutex_lock(&g->mu);
  bool ok = g->buffered + n <= g->max_buffered;
  if (ok) g->buffered += n;
  pthread_mutex_unlock(&g->mu);
  return ok;
}

void sm_conns_release(sm_conns *g, size_t n) {
  pthread_mutex_lock(&g->mu);
  g->buffered -= SM_MIN(n, g->buffered);
  pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------------------ parking */

/* Suspend first, then mark parked: nothing can resume the connection before it is suspended
 * (the job's notify needs the scheduler mutex that the caller holds; the watchdog and
 * unpark_all look at `parked`). */
static void park(sm_conns *g, sm_sock *k, sm_job *j, bool until_done, double deadline) {
  MHD_suspend_connection(k->c);
  pthread_mutex_lock(&g->mu);
  k->parked = true;
  k->until_done = until_done;
  k->job = j;
  k->deadline = deadline;
  k->timed_out = false;
  pthread_mutex_unlock(&g->mu);
}

void sm_conns_park(sm_conns *g, sm_sock *k, sm_job *j, bool until_done) {
  j->notify = sm_conns_notify;
  j->notify_arg = k;
  park(g, k, j, until_done, 0);
}

void sm_conns_park_wait(sm_conns *g, sm_sock *k, double deadline) { park(g, k, NULL, false, deadline); }

/* under g->mu: resume once */
static void resume_locked(sm_sock *k) {
  k->parked = false;
  k->job = NULL;
  MHD_resume_connection(k->c);
}

void sm_conns_unpark(sm_conns *g, sm_sock *k) {
  pthread_mutex_lock(&g->mu);
  if (k->parked) resume_locked(k);
  pthread_mutex_unlock(&g->mu);
}

/* under the job's scheduler mutex (job state is read) */
void sm_conns_notify(void *arg) {
  sm_sock *k = arg;
  sm_conns *g = k->g;
  pthread_mutex_lock(&g->mu);
  if (k->parked && !(k->until_done && k->job && !k->job->done)) resume_locked(k);
  pthread_mutex_unlock(&g->mu);
}

void sm_conns_unpark_all(sm_conns *g) {
  pthread_mutex_lock(&g->mu);
  for (sm_sock *k = g->head; k; k = k->next)
    if (k->parked) {
      k->hup = true; /* nothing more will come: the request ends */
      resume_locked(k);
    }
  pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------------------ watchdog */

/* under g->mu: end a connection that missed its deadline. MHD never writes while a request's
 * headers or body are being read, so the 408 cannot interleave with its output; the socket
 * stays valid until the close notification, which takes g->mu. */
static void reap(sm_sock *k, const char *what, double limit) {
  if (what) {
    char body[256], msg[512];
    int bl = snprintf(body, sizeof body,
                      "{\"error\":{\"message\":\"the request %s did not arrive within %g s\",\"type\":"
                      "\"invalid_request_error\",\"param\":null,\"code\":\"request_timeout\"}}",
                      what, limit);
    int ml = snprintf(msg, sizeof msg,
                      "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
                      "Content-Length: %d\r\n\r\n%s",
                      bl, body);
    if (send(k->fd, msg, (size_t)ml, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) { /* the client is gone: just close */
    }
  }
  shutdown(k->fd, SHUT_RDWR); /* the library sees end of input and closes the connection */
  k->reaped = true;
}

typedef struct {
  int fd;
  uint64_t serial;
} watch_ent;

static void *watchdog(void *arg) {
  sm_conns *g = arg;
  watch_ent *ents = NULL;
  struct pollfd *pfd = NULL;
  size_t cap = 0;
  uint64_t *gone = NULL;
  while (!atomic_load(&g->stop)) {
    size_t n = 0;
    pthread_mutex_lock(&g->mu);
    double now = sm_now();
    for (sm_sock *k = g->head; k; k = k->next) {
      if (!k->reaped) {
        if ((k->phase == SM_PH_IDLE || k->phase == SM_PH_HEADERS) && now - k->t_phase > g->header_timeout)
          reap(k, k->phase == SM_PH_HEADERS ? "headers" : NULL, g->header_timeout);
        else if (k->phase == SM_PH_BODY && now - k->t_phase > g->body_timeout) reap(k, "body", g->body_timeout);
      }
      if (k->parked && k->deadline > 0 && now >= k->deadline) {
        k->timed_out = true;
        resume_locked(k);
      }
      if (k->parked && !k->hup) {
        if (n + 1 >= cap) {
          cap = cap ? cap * 2 : 64;
          ents = sm_xrealloc(ents, cap * sizeof *ents);
          pfd = sm_xrealloc(pfd, cap * sizeof *pfd);
          gone = sm_xrealloc(gone, cap * sizeof *gone);
        }
        ents[n].fd = k->fd;
        ents[n].serial = k->serial;
        n++;
      }
    }
    pthread_mutex_unlock(&g->mu);
    if (n + 1 >= cap) {
      cap = n + 2;
      ents = sm_xrealloc(ents, cap * sizeof *ents);
      pfd = sm_xrealloc(pfd, cap * sizeof *pfd);
      gone = sm_xrealloc(gone, cap * sizeof *gone);
    }
    for (size_t i = 0; i < n; i++) pfd[i] = (struct pollfd){.fd = ents[i].fd, .events = POLLRDHUP};
    pfd[n] = (struct pollfd){.fd = g->wake_fd, .events = POLLIN};
    int r = poll(pfd, (nfds_t)(n + 1), WATCH_MS);
    if (r <= 0) continue;
    if (pfd[n].revents & POLLIN) {
      uint64_t v;
      if (read(g->wake_fd, &v, sizeof v) < 0) { /* nothing pending */
      }
    }
    size_t ng = 0;
    for (size_t i = 0; i < n; i++)
      if (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) gone[ng++] = ents[i].serial;
    if (!ng) continue;
    /* the client of a parked request went away: resume its connection; the handler sees hup,
     * cancels the job and closes */
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < ng; i++)
      for (sm_sock *k = g->head; k; k = k->next)
        if (k->serial == gone[i]) {
          if (k->parked && !k->hup) {
            k->hup = true;
            resume_locked(k);
          }
          break;
        }
    pthread_mutex_unlock(&g->mu);
  }
  free(ents);
  free(pfd);
  free(gone);
  return NULL;
}

bool sm_conns_start(sm_conns *g) {
  if (g->wake_fd < 0) return false;
  g->started = pthread_create(&g->thread, NULL, watchdog, g) == 0;
  return g->started;
}

void sm_conns_free(sm_conns *g) {
  if (!g) return;
  if (g->started) {
    atomic_store(&g->stop, true);
    uint64_t one = 1;
    if (write(g->wake_fd, &one, sizeof one) < 0) { /* it wakes within WATCH_MS anyway */
    }
    pthread_join(g->thread, NULL);
  }
  if (g->wake_fd >= 0) close(g->wake_fd);
  pthread_mutex_destroy(&g->mu);
  free(g);
}
