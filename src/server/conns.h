/* Connection guard of `smelt serve` (private to src/server): what the HTTP library does not
 * bound by itself.
 *  - Every TCP connection is tracked with its phase: IDLE (accepted or between keep-alive
 *    requests), HEADERS (request line seen), BODY (headers done, body arriving), BUSY (being
 *    answered). A watchdog thread closes a connection whose request headers are not complete
 *    `header_timeout` seconds after it opened or after its previous response, or whose body is
 *    not complete `body_timeout` seconds after its headers (408 with a JSON body when a request
 *    had started; silently when it was idle).
 *  - Request bodies held in memory by all connections together are capped (reserve/release).
 *  - A request waiting for its job (a non-streaming answer, or a stream waiting for the next
 *    tokens) or for its model to be loaded is parked: its connection is suspended in the HTTP
 *    library (no thread, no timeout) and resumed by the job's notify hook, by the model
 *    registry, or at the park's deadline. The watchdog polls parked sockets and resumes the
 *    connection of a client that went away (`hup`), whose handler then cancels its job.
 * The guard knows no scheduler: it takes only its own mutex, which comes last in every lock
 * order (a scheduler's or the model registry's mutex, then the guard's). */
#ifndef SM_SERVER_CONNS_H
#define SM_SERVER_CONNS_H
#include <microhttpd.h>
#include "server/sched.h"

enum { SM_PH_IDLE = 0, SM_PH_HEADERS, SM_PH_BODY, SM_PH_BUSY };

typedef struct sm_conns sm_conns;
typedef struct sm_sock sm_sock;
struct sm_sock {
  sm_sock *prev, *next;
  sm_conns *g;
  uint64_t serial;
  int fd;
  struct MHD_Connection *c;
  int phase;      /* SM_PH_*, under the guard's mutex */
  double t_phase; /* when the phase began */
  bool reaped;    /* closed by the watchdog */
  /* under the guard's mutex; the connection's handler reads hup and timed_out after it was
   * resumed (nothing writes them then) */
  bool parked;     /* suspended, waiting for `job` (or, job NULL, for a model to load) */
  bool until_done; /* resume only when the job is done (not at every token) */
  bool hup;        /* the client went away while parked */
  bool timed_out;  /* resumed at the park's deadline */
  double deadline; /* 0: none */
  sm_job *job;
};

sm_conns *sm_conns_new(double header_timeout, double body_timeout, size_t max_buffered);
bool sm_conns_start(sm_conns *g); /* the watchdog thread */
void sm_conns_free(sm_conns *g);  /* stops the watchdog */

sm_sock *sm_conns_open(sm_conns *g, struct MHD_Connection *c, int fd);
void sm_conns_close(sm_conns *g, sm_sock *k);
void sm_conns_phase(sm_conns *g, sm_sock *k, int phase);
int sm_conns_active(sm_conns *g); /* connections in HEADERS, BODY or BUSY */

/* Request body memory: false when n more bytes would pass the cap. */
bool sm_conns_reserve(sm_conns *g, size_t n);
void sm_conns_release(sm_conns *g, size_t n);

/* park suspends the connection until unpark resumes it; call it only from the connection's own
 * callbacks. With a job: under the job's scheduler mutex; the job's notify hook resumes it.
 * Without (park_wait): under the mutex of whoever will call unpark, which resumes it, or the
 * watchdog does at `deadline` (timed_out) or when the client goes away (hup). */
void sm_conns_park(sm_conns *g, sm_sock *k, sm_job *j, bool until_done);
void sm_conns_park_wait(sm_conns *g, sm_sock *k, double deadline);
void sm_conns_unpark(sm_conns *g, sm_sock *k); /* nothing when it is not parked */
void sm_conns_unpark_all(sm_conns *g);         /* before the HTTP daemon stops */
void sm_conns_notify(void *sock);              /* a job's notify hook: arg is the parked sm_sock */

#endif
