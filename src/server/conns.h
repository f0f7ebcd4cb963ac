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
 *    tokens) is parked: its connection is suspended in the HTTP library (no thread, no
 *    timeout) and resumed by the job's notify hook. The watchdog polls parked sockets and
 *    cancels the job of a client that went away.
 * Lock order: the scheduler's mutex, then the guard's. */
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
  /* written under both mutexes; readable under either */
  bool parked; /* suspended, waiting for `job` */
  bool until_done; /* resume only when the job is done (not at every token) */
  bool hup;    /* the client went away while parked */
  sm_job *job;
};

sm_conns *sm_conns_new(sm_sched *sched, double header_timeout, double body_timeout, size_t max_buffered);
bool sm_conns_start(sm_conns *g); /* the watchdog thread */
void sm_conns_free(sm_conns *g);  /* stops the watchdog */

sm_sock *sm_conns_open(sm_conns *g, struct MHD_Connection *c, int fd);
void sm_conns_close(sm_conns *g, sm_sock *k);
void sm_conns_phase(sm_conns *g, sm_sock *k, int phase);
int sm_conns_active(sm_conns *g); /* connections in HEADERS, BODY or BUSY */

/* Request body memory: false when n more bytes would pass the cap. */
bool sm_conns_reserve(sm_conns *g, size_t n);
void sm_conns_release(sm_conns *g, size_t n);

/* Under the scheduler's mutex. park suspends the connection until unpark (which the job's
 * notify hook calls) resumes it; call park only from the connection's own callbacks. */
void sm_conns_park(sm_conns *g, sm_sock *k, sm_job *j, bool until_done);
void sm_conns_unpark(sm_conns *g, sm_sock *k);
void sm_conns_unpark_all(sm_conns *g); /* before the HTTP daemon stops */
void sm_conns_notify(void *sock);      /* a job's notify hook: arg is the parked sm_sock */

#endif
