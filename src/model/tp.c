/* The tensor-parallel group (tp.h): rank 0 forks the other ranks of its host (those of other hosts connect
 * to it over TCP: run_node), each loads its shard on its own backend, and rank 0 drives them with messages
 * over a socket each: the forward steps' batches and the KV caches and copies to mirror. The collectives between the ranks' backends carry the activations; the sockets
 * carry only the host-side batch, so a rank never waits on rank 0's host beyond receiving it.
 *
 * A rank that fails ends the group: its process writes why and exits, and rank 0's watchdog thread
 * (which sees the socket close) prints that and ends the process, since rank 0 may be waiting in a
 * collective the dead rank will never join. The other ranks die with rank 0 (PR_SET_PDEATHSIG).
 *
 * A forked rank goes on in the copy of rank 0's process, unless rank 0 has used CUDA already, whose state a
 * fork does not carry: then the rank re-executes the program (/proc/self/exe), which hands its arguments to
 * smelt_tp_rank_main. The group's shared memory is a memfd either way, so an exec'd rank maps it too. */
#include "model/tp.h"
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MSG_ID = 2, MSG_FORWARD, MSG_KV_ALLOC, MSG_KV_FREE, MSG_QUIT, MSG_STATUS, MSG_KV_COPY };
typedef struct {
  uint32_t type, len;
} msg_head;
#define MSG_MAX ((uint32_t)1 << 30)
#define SHARED_BYTES ((size_t)4 << 20)

static bool write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= (size_t)k;
  }
  return true;
}
static bool read_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t k = read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= (size_t)k;
  }
  return true;
}
static bool send_msg(int fd, uint32_t type, const void *p, size_t len) {
  msg_head h = {type, (uint32_t)len};
  return write_all(fd, &h, sizeof h) && (!len || write_all(fd, p, len));
}
/* a message into *buf (grown as needed); false on end of stream or a malformed head */
static bool recv_msg(int fd, uint32_t *type, void **buf, size_t *cap, size_t *len) {
  msg_head h;
  if (!read_all(fd, &h, sizeof h) || h.len > MSG_MAX) return false;
  if (h.len > *cap) {
    *buf = sm_xrealloc(*buf, h.len);
    *cap = h.len;
  }
  *type = h.type;
  *len = h.len;
  return !h.len || read_all(fd, *buf, h.len);
}
/* a status: int32 code, then the message text */
static bool send_status(int fd, smelt_status st, const char *text) {
  char b[1024];
  int32_t code = st;
  memcpy(b, &code, 4);
  const size_t n = strlen(text) < sizeof b - 5 ? strlen(text) : sizeof b - 5;
  memcpy(b + 4, text, n);
  return send_msg(fd, MSG_STATUS, b, 4 + n);
}
/* how messages name a rank of the group */
static const char *kind(const sm_tp *tp) { return tp->pp ? "pipeline" : "tensor-parallel"; }

/* the answer of rank r to what was just sent: OK or its error, as an sm_err naming the rank */
static smelt_status recv_status(sm_tp *tp, int r, uint32_t want) {
  uint32_t type = 0;
  size_t len = 0;
  if (!recv_msg(tp->fd[r], &type, &tp->buf, &tp->cap, &len) || (type != want && type != MSG_STATUS) || len < 4)
    return sm_err(SMELT_ERR_BACKEND, "%s rank %d ended without an answer", kind(tp), r);
  tp->last_len = len;
  int32_t code;
  memcpy(&code, tp->buf, 4);
  if (!code) return SMELT_OK;
  return sm_err((smelt_status)code, "%s rank %d: %.*s", kind(tp), r, (int)(len - 4), (char *)tp->buf + 4);
}

/* rank 0: one message to every other rank; an error names the first that has ended (the others still get it,
 * so that every live rank answers what asks for an answer) */
static smelt_status send_all(sm_tp *tp, uint32_t type, const void *p, size_t len) {
  smelt_status st = SMELT_OK;
  for (int r = 1; r < tp->n; r++)
    if (!send_msg(tp->fd[r], type, p, len) && !st) st = sm_err(SMELT_ERR_BACKEND, "%s rank %d ended", kind(tp), r);
  return st;
}

/* a rank's backend: device `local` of its host; a CPU rank takes its share of the cores unless told */
static sm_backend *rank_backend(const smelt_model_params *p, int n_ranks, int local) {
  sm_cpu_opts cpu = {.n_threads = p->n_threads, .numa = p->numa, .poll = p->cpu_poll};
  if (!cpu.n_threads) {
    const long nc = sysconf(_SC_NPROCESSORS_ONLN);
    cpu.n_threads = nc >= n_ranks ? (int)(nc / n_ranks) : 1;
  }
  const sm_backend_opts bo = {.batch_invariant = p->deterministic};
  return sm_backend_create_opts(p->device, local, &cpu, &bo);
}

/* ---- rank 0's watchdog ---- */

static void *watch(void *arg) {
  sm_tp *tp = arg;
  struct pollfd pf[SM_TP_MAX];
  pf[0] = (struct pollfd){.fd = tp->wake[0], .events = POLLIN};
  for (int r = 1; r < tp->n; r++) pf[r] = (struct pollfd){.fd = tp->fd[r], .events = 0}; /* hang-ups only */
  for (;;) {
    if (poll(pf, (nfds_t)tp->n, -1) < 0) {
      if (errno == EINTR) continue;
      return NULL;
    }
    if (pf[0].revents) return NULL; /* sm_tp_free */
    for (int r = 1; r < tp->n; r++) {
      if (!(pf[r].revents & (POLLHUP | POLLERR | POLLNVAL))) continue;
      char why[768] = "";
      msg_head h;
      if (recv(tp->fd[r], &h, sizeof h, MSG_DONTWAIT) == (ssize_t)sizeof h && h.type == MSG_STATUS && h.len > 4 &&
          h.len < sizeof why) {
        char b[sizeof why];
        ssize_t k = recv(tp->fd[r], b, h.len, MSG_DONTWAIT);
        if (k == (ssize_t)h.len) snprintf(why, sizeof why, ": %.*s", (int)(h.len - 4), b + 4);
      }
      int ws = 0;
      char how[64] = "";
      pid_t w = 0; /* its socket closes as it exits: give the exit a moment to be seen */
      for (int k = 0; k < 200 && (w = waitpid(tp->pid[r], &ws, WNOHANG)) == 0; k++) usleep(5000);
      if (w == tp->pid[r]) {
        if (WIFSIGNALED(ws)) snprintf(how, sizeof how, " (signal %d)", WTERMSIG(ws));
        else if (WIFEXITED(ws)) snprintf(how, sizeof how, " (exit status %d)", WEXITSTATUS(ws));
      }
      fprintf(stderr, "smelt: %s rank %d ended%s%s; stopping all ranks\n", kind(tp), r, how, why);
      for (int j = 1; j < tp->n; j++) kill(tp->pid[j], SIGKILL);
      _exit(1);
    }
  }
}

/* ---- the other ranks ---- */

typedef struct {
  sm_kv_cache kv;
  bool live;
} kv_slot;

/* the batch of a MSG_FORWARD, pointing into p; false if it is malformed */
static bool parse_batch(const void *p, size_t len, int32_t *kv_id, bool *bcast, sm_batch *b) {
  const int32_t *v = p;
  if (len < 6 * 4) return false;
  int32_t n = v[1], ns = v[2], mb = v[3], no = v[4], fl = v[5];
  if (n < 0 || ns < 0 || mb < 0 || no < 0 || (int64_t)ns * mb > INT32_MAX) return false;
  size_t need = 6 + 3 * (size_t)n + (size_t)ns * mb + (size_t)no + (fl & 2 ? (size_t)ns : 0) +
                (fl & 4 ? 2 * (size_t)n : 0) + (fl & 8 ? 3 * (size_t)n : 0);
  if (need * 4 != len) return false;
  memset(b, 0, sizeof *b);
  *kv_id = v[0];
  *bcast = fl & 1;
  const int32_t *q = v + 6;
  b->n_tokens = n;
  b->tokens = q, q += n;
  b->pos = q, q += n;
  b->seq = q, q += n;
  b->n_seqs = ns;
  b->max_blocks = mb;
  b->block_table = q, q += (size_t)ns * mb;
  b->n_out = no;
  b->out_rows = q, q += no;
  if (fl & 2) b->state_slot = q, q += ns;
  if (fl & 4) b->attn_span = q, q += 2 * (size_t)n;
  if (fl & 8) b->rope_pos = q;
  return true;
}

/* the model files as a rank sees them: config.json and every tensor's name, type, shape and size (ranks on
 * several hosts must load the same checkpoint) */
static uint64_t fingerprint(const smelt_model *m) {
  uint64_t h = 0xcbf29ce484222325ULL;
#define MIX(p, n) \
  do { \
    const unsigned char *b_ = (const unsigned char *)(p); \
    for (size_t i_ = 0; i_ < (size_t)(n); i_++) h = (h ^ b_[i_]) * 0x100000001b3ULL; \
  } while (0)
  char *path = sm_path_join(m->dir, "config.json"), *text = NULL;
  size_t len = 0;
  if (!sm_read_file(path, &text, &len)) MIX(text, len);
  free(text);
  free(path);
  for (size_t i = 0; i < sm_st_count(m->st); i++) {
    const sm_tensor *t = sm_st_at(m->st, i);
    MIX(t->name, strlen(t->name) + 1);
    MIX(&t->dtype, sizeof t->dtype);
    MIX(t->shape, sizeof(t->shape[0]) * (size_t)t->ndim);
    MIX(&t->nbytes, sizeof t->nbytes);
  }
#undef MIX
  return h;
}

/* a failed step: why, to rank 0 (its watchdog prints it), and the end of this process at once (rank 0 may
 * be waiting for this rank in a collective; a clean-up could wait for it too) */
_Noreturn static void fail(int fd, smelt_status st, const char *why) {
  send_status(fd, st, why);
  _exit(1);
}

static int worker(const char *dir, const smelt_model_params *p, sm_tp *tp, int fd) {
  sm_backend *be = rank_backend(p, tp->n, tp->local);
  smelt_model *m = NULL;
  smelt_status st = be ? sm_model_load_rank(dir, p, be, tp, &m) : SMELT_ERR_BACKEND;
  char ready[96] = "";
  if (!st) snprintf(ready, sizeof ready, "%s %016llx", be->name, (unsigned long long)fingerprint(m));
  send_status(fd, st, st ? sm_errmsg() : ready); /* loaded: the backend's name and the files' fingerprint */
  if (st) return 1;
  void *buf = NULL;
  size_t cap = 0, len = 0;
  uint32_t type = 0;
  sm_comm_init ci = {.n_ranks = tp->n,
                     .rank = tp->rank,
                     .shared = tp->shared,
                     .shared_bytes = tp->shared_bytes,
                     .fds = tp->shared ? NULL : &fd};
  if (!recv_msg(fd, &type, &buf, &cap, &len) || type != MSG_ID || len != SM_COMM_ID_BYTES) return 1;
  memcpy(ci.id, buf, SM_COMM_ID_BYTES);
  if ((st = m->be->comm_init(m->be, &ci))) {
    send_status(fd, st, sm_errmsg());
    return 1;
  }
  kv_slot *kvs = NULL;
  int n_kv = 0;
  while (recv_msg(fd, &type, &buf, &cap, &len) && type != MSG_QUIT) {
    if (type == MSG_FORWARD) {
      sm_batch b;
      int32_t id;
      bool bcast;
      if (!parse_batch(buf, len, &id, &bcast, &b) || id <= 0 || id >= n_kv || !kvs[id].live)
        fail(fd, SMELT_ERR_INVALID, "malformed forward step");
      tp->bcast_x = bcast;
      if ((st = sm_model_forward(m, &kvs[id].kv, &b, NULL))) fail(fd, st, sm_errmsg());
      if (m->be->submit) m->be->submit(m->be);
    } else if (type == MSG_KV_ALLOC && len == 16) {
      int32_t a[4];
      memcpy(a, buf, sizeof a);
      if (a[0] <= 0 || a[0] > (1 << 20)) break;
      if (a[0] >= n_kv) {
        kvs = sm_xrealloc(kvs, sizeof *kvs * (size_t)(a[0] + 1));
        memset(kvs + n_kv, 0, sizeof *kvs * (size_t)(a[0] + 1 - n_kv));
        n_kv = a[0] + 1;
      }
      st = sm_kv_alloc(m, a[1], a[2], a[3], &kvs[a[0]].kv);
      kvs[a[0]].live = !st;
      send_status(fd, st, st ? sm_errmsg() : "");
    } else if (type == MSG_KV_COPY && len == 16) {
      int32_t a[4];
      memcpy(a, buf, sizeof a);
      if (a[0] <= 0 || a[0] >= n_kv || !kvs[a[0]].live) fail(fd, SMELT_ERR_INVALID, "copy in an unknown KV cache");
      if (a[1]) sm_kv_copy_block(m, &kvs[a[0]].kv, a[2], a[3]);
      else sm_kv_copy_state(m, &kvs[a[0]].kv, a[2], a[3]);
    } else if (type == MSG_KV_FREE && len == 4) {
      int32_t id;
      memcpy(&id, buf, 4);
      if (id > 0 && id < n_kv && kvs[id].live) {
        sm_kv_free(m, &kvs[id].kv);
        kvs[id].live = false;
      }
    } else {
      fail(fd, SMELT_ERR_INVALID, "unknown message");
    }
  }
  for (int i = 0; i < n_kv; i++)
    if (kvs[i].live) sm_kv_free(m, &kvs[i].kv);
  free(kvs);
  free(buf);
  smelt_model_free(m);
  return 0;
}

/* ---- a rank started by exec ---- */

#define RANK_ARG "__smelt-tp-rank"

/* a pipeline's stage shares from the parameters (tp->shares all 0 when none were given) */
static void set_shares(sm_tp *tp, const smelt_model_params *p) {
  for (int s = 0; s < SM_TP_MAX; s++) tp->shares[s] = p->pp_shares && s < tp->n ? p->pp_shares[s] : 0.f;
}

/* argv of an exec'd rank: RANK_ARG rank ranks socket-fd shared-fd (-1: ranks on several hosts) model-dir params
 * (ten integers, then a pipeline's stage shares as s0:s1:..., or none) */
static void exec_rank(int r, int n, int fd, int shm_fd, const char *dir, const smelt_model_params *p) {
  char a[5][24], prm[512];
  snprintf(a[0], sizeof a[0], "%d", r);
  snprintf(a[1], sizeof a[1], "%d", n);
  snprintf(a[2], sizeof a[2], "%d", fd);
  snprintf(a[3], sizeof a[3], "%d", shm_fd);
  snprintf(prm, sizeof prm, "%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", (int)p->device, p->n_threads, (int)p->numa, p->cpu_poll,
           p->max_context, p->max_seqs, (int)p->no_mmap, (int)p->kv_type, (int)p->deterministic,
           p->pipeline_parallel > 1);
  for (int s = 0; p->pp_shares && p->pipeline_parallel > 1 && s < n; s++)
    snprintf(prm + strlen(prm), sizeof prm - strlen(prm), "%s%.9g", s ? ":" : ",", (double)p->pp_shares[s]);
  fcntl(fd, F_SETFD, 0); /* both survive the exec */
  if (shm_fd >= 0) fcntl(shm_fd, F_SETFD, 0);
  char *argv[] = {"smelt", RANK_ARG, a[0], a[1], a[2], a[3], (char *)dir, prm, NULL};
  execv("/proc/self/exe", argv);
  char why[256];
  snprintf(why, sizeof why, "cannot re-execute this program as a rank (CUDA is in use here): %s", strerror(errno));
  send_status(fd, SMELT_ERR_BACKEND, why);
}

int smelt_tp_rank_main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], RANK_ARG)) return -1;
  int r, n, fd, shm_fd, v[10];
  if (argc != 8 || sscanf(argv[2], "%d", &r) != 1 || sscanf(argv[3], "%d", &n) != 1 ||
      sscanf(argv[4], "%d", &fd) != 1 || sscanf(argv[5], "%d", &shm_fd) != 1 || shm_fd < -1 ||
      sscanf(argv[7], "%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8],
             &v[9]) != 10 ||
      n < 2 || n > SM_TP_MAX || r < 1 || r >= n) {
    fprintf(stderr, "smelt: malformed tensor-parallel rank arguments\n");
    return 2;
  }
  smelt_model_params p;
  smelt_model_params_default(&p);
  p.device = (smelt_device)v[0], p.n_threads = v[1], p.numa = (smelt_numa)v[2], p.cpu_poll = v[3];
  p.max_context = v[4], p.max_seqs = v[5], p.no_mmap = v[6], p.kv_type = (smelt_kv_type)v[7];
  p.deterministic = v[8];
  if (v[9]) p.pipeline_parallel = n;
  else p.tensor_parallel = n;
  sm_tp *tp = sm_xcalloc(1, sizeof *tp);
  tp->pp = v[9] != 0;
  tp->n = n;
  const char *sh = argv[7]; /* the shares after the ten integers */
  for (int k = 0; k < 10 && sh; k++) sh = strchr(sh, ','), sh = sh ? sh + 1 : NULL;
  for (int s = 0; sh && *sh && s < n; s++) {
    tp->shares[s] = strtof(sh, (char **)&sh);
    if (*sh == ':') sh++;
  }
  tp->rank = r;
  tp->local = r;
  tp->shared_bytes = SHARED_BYTES;
  tp->shared = shm_fd < 0 ? NULL : mmap(NULL, SHARED_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
  if (shm_fd >= 0) close(shm_fd);
  for (int j = 0; j < SM_TP_MAX; j++) tp->fd[j] = -1;
  if (tp->shared == MAP_FAILED) {
    send_status(fd, SMELT_ERR_IO, "cannot map the group's shared memory");
    return 1;
  }
  return worker(argv[6], &p, tp, fd);
}

/* ---- ranks on several hosts ---- */

#define HELLO_MAGIC 0x534d5450u /* "SMTP" */
typedef struct {
  uint32_t magic;
  int32_t rank, n;
} hello;

/* "host:port" */
static smelt_status addr_of(const char *a, struct addrinfo **out, bool passive) {
  char host[256];
  const char *c = a ? strrchr(a, ':') : NULL;
  if (!c || c == a || (size_t)(c - a) >= sizeof host || !c[1])
    return sm_err(SMELT_ERR_INVALID, "--master-addr '%s': expected HOST:PORT", a ? a : "");
  memcpy(host, a, (size_t)(c - a));
  host[c - a] = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
  const int e = getaddrinfo(host, c + 1, &hints, out);
  return e ? sm_err(SMELT_ERR_IO, "--master-addr %s: %s", a, gai_strerror(e)) : SMELT_OK;
}

static int listen_master(const char *a) {
  struct addrinfo *ai;
  if (addr_of(a, &ai, true)) return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, SM_TP_MAX)) {
    sm_err(SMELT_ERR_IO, "tensor parallelism: cannot listen on %s: %s", a, strerror(errno));
    if (fd >= 0) close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  return fd;
}

/* another host's rank: to rank 0 (retrying while it starts, 120 s), then its hello */
static int connect_master(const char *a, int rank, int n) {
  struct addrinfo *ai;
  if (addr_of(a, &ai, false)) return -1;
  int fd = -1;
  for (int k = 0; k < 1200 && fd < 0; k++) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
      close(fd);
      fd = -1;
      usleep(100000);
    }
  }
  freeaddrinfo(ai);
  const hello h = {HELLO_MAGIC, rank, n};
  if (fd < 0 || !write_all(fd, &h, sizeof h)) {
    sm_err(SMELT_ERR_IO, "tensor-parallel rank %d: cannot reach rank 0 at %s", rank, a);
    if (fd >= 0) close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* another host's rank: when rank 0's side of the socket closes, rank 0 is gone or has sent its last message;
 * a rank still running 10 s later is stuck in a collective that will not complete (rank 0's death does not
 * reach another host's processes as a signal), so it ends */
static void *remote_watch(void *arg) {
  struct pollfd pf = {.fd = *(const int *)arg, .events = POLLRDHUP};
  while (poll(&pf, 1, -1) < 0 && errno == EINTR) {}
  sleep(10);
  fprintf(stderr, "smelt: tensor-parallel rank: rank 0 is gone; stopping\n");
  _exit(1);
  return NULL;
}

/* node_rank > 0: this host's ranks, until rank 0 ends them; then the process ends with their status */
static void run_node(const char *dir, const smelt_model_params *p, int n, int first, int per) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid[SM_TP_MAX];
  for (int i = 0; i < per; i++) {
    pid[i] = fork();
    if (pid[i] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      static int fd;
      fd = connect_master(p->master_addr, first + i, n);
      if (fd < 0) {
        fprintf(stderr, "smelt: %s\n", sm_errmsg());
        _exit(1);
      }
      pthread_t w;
      if (pthread_create(&w, NULL, remote_watch, &fd) == 0) pthread_detach(w);
      sm_tp *mine = sm_xcalloc(1, sizeof *mine);
      mine->n = n;
      mine->pp = p->pipeline_parallel > 1;
      set_shares(mine, p);
      mine->rank = first + i;
      mine->local = i;
      for (int j = 0; j < SM_TP_MAX; j++) mine->fd[j] = -1;
      _exit(worker(dir, p, mine, fd));
    }
  }
  int worst = 0;
  for (int i = 0; i < per; i++) {
    int ws = 0;
    if (pid[i] > 0 && waitpid(pid[i], &ws, 0) == pid[i] && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)) worst = 1;
    if (pid[i] < 0) worst = 1;
  }
  fprintf(stderr, "smelt: tensor-parallel node %d: its ranks %d..%d ended%s\n", p->node_rank, first, first + per - 1,
          worst ? " (one of them failed)" : "");
  exit(worst);
}

/* rank 0: the other hosts' ranks, by their hellos (120 s) */
static smelt_status accept_ranks(sm_tp *tp, int lfd, int first_remote) {
  for (int k = first_remote; k < tp->n; k++) {
    struct pollfd pf = {.fd = lfd, .events = POLLIN};
    if (poll(&pf, 1, 120000) != 1)
      return sm_err(SMELT_ERR_IO, "tensor parallelism: the other hosts' ranks did not all join");
    const int fd = accept(lfd, NULL, NULL);
    hello h;
    if (fd < 0 || !read_all(fd, &h, sizeof h) || h.magic != HELLO_MAGIC || h.n != tp->n || h.rank < first_remote ||
        h.rank >= tp->n || tp->fd[h.rank] >= 0) {
      if (fd >= 0) close(fd);
      return sm_err(SMELT_ERR_IO, "tensor parallelism: a connection that is not one of the group's ranks (%d of %d)",
                    fd >= 0 ? h.rank : -1, tp->n);
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    tp->fd[h.rank] = fd;
  }
  return SMELT_OK;
}

/* ---- rank 0 ---- */

static void end_ranks(sm_tp *tp) {
  for (int r = 1; r < tp->n; r++) {
    if (tp->fd[r] >= 0) {
      send_msg(tp->fd[r], MSG_QUIT, NULL, 0);
      close(tp->fd[r]);
      tp->fd[r] = -1;
    }
  }
  for (int r = 1; r < tp->n; r++) {
    if (tp->pid[r] <= 0) continue;
    int ws;
    double t0 = sm_now();
    while (waitpid(tp->pid[r], &ws, WNOHANG) == 0) {
      if (sm_now() - t0 > 10) { /* stuck: it cannot finish its step without rank 0 */
        kill(tp->pid[r], SIGKILL);
        waitpid(tp->pid[r], &ws, 0);
        break;
      }
      usleep(1000);
    }
    tp->pid[r] = 0;
  }
}

static void tp_destroy(sm_tp *tp) {
  if (tp->watching) {
    if (write(tp->wake[1], "x", 1) < 0) { /* the watchdog ends at its next wake-up */
    }
    pthread_join(tp->watch, NULL);
    tp->watching = false;
  }
  end_ranks(tp);
  if (tp->wake[0] >= 0) close(tp->wake[0]);
  if (tp->wake[1] >= 0) close(tp->wake[1]);
  if (tp->shared) munmap(tp->shared, tp->shared_bytes);
  if (tp->shm_fd >= 0) close(tp->shm_fd);
  if (tp->lfd >= 0) close(tp->lfd);
  free(tp->buf);
  free(tp);
}

void sm_tp_free(smelt_model *m) {
  sm_tp *tp = m->tp;
  m->tp = NULL;
  if (tp->rank == 0) tp_destroy(tp);
  else free(tp);
}

smelt_status sm_tp_load(const char *dir, const smelt_model_params *p, smelt_model **out) {
  const int n = p->pipeline_parallel > 1 ? p->pipeline_parallel : p->tensor_parallel,
            nn = p->nnodes > 1 ? p->nnodes : 1;
  if (p->cpu_mask && *p->cpu_mask)
    return sm_err(SMELT_ERR_UNSUPPORTED, "--cpu-mask with --tensor-parallel: each rank would take the same CPUs");
  if (nn > 1 && (n % nn || p->node_rank < 0 || p->node_rank >= nn || !p->master_addr))
    return sm_err(SMELT_ERR_INVALID,
                  "--nnodes %d --node-rank %d: the ranks (%d) must divide by the hosts, the host's index must be "
                  "below them, and --master-addr HOST:PORT is needed",
                  nn, p->node_rank, n);
  const int per = n / nn;                                                       /* ranks a host */
  if (nn > 1 && p->node_rank > 0) run_node(dir, p, n, p->node_rank * per, per); /* does not return */
  int lfd = nn > 1 ? listen_master(p->master_addr) : -2;
  if (lfd == -1) return sm_err(SMELT_ERR_IO, "%s", sm_errmsg());
  sm_tp *tp = sm_xcalloc(1, sizeof *tp);
  tp->n = n;
  tp->pp = p->pipeline_parallel > 1;
  set_shares(tp, p);
  tp->wake[0] = tp->wake[1] = tp->shm_fd = tp->lfd = -1;
  for (int r = 0; r < SM_TP_MAX; r++) tp->fd[r] = -1;
  tp->shared_bytes = SHARED_BYTES;
  tp->shm_fd = memfd_create("smelt-tp", MFD_CLOEXEC);
  if (tp->shm_fd >= 0 && ftruncate(tp->shm_fd, (off_t)SHARED_BYTES) == 0)
    tp->shared = mmap(NULL, SHARED_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, tp->shm_fd, 0);
  else tp->shared = MAP_FAILED;
  if (tp->shared == MAP_FAILED) {
    tp->shared = NULL;
    tp_destroy(tp);
    if (lfd >= 0) close(lfd);
    return sm_err(SMELT_ERR_OOM, "tensor parallelism: cannot map the group's shared memory");
  }
  tp->lfd = lfd;
  if (pipe(tp->wake)) {
    tp_destroy(tp);
    return sm_err(SMELT_ERR_IO, "tensor parallelism: pipe: %s", strerror(errno));
  }
  fflush(stdout);
  fflush(stderr);
  const pid_t parent = getpid();
  const bool by_exec = sm_backend_cuda_touched();
  for (int r = 1; r < per; r++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
      tp_destroy(tp);
      return sm_err(SMELT_ERR_IO, "tensor parallelism: socketpair: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
      close(sv[0]);
      close(sv[1]);
      tp_destroy(tp);
      return sm_err(SMELT_ERR_IO, "tensor parallelism: fork: %s", strerror(errno));
    }
    if (pid == 0) { /* rank r */
      close(sv[0]);
      for (int j = 1; j < r; j++) close(tp->fd[j]);
      close(tp->wake[0]);
      close(tp->wake[1]);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      if (lfd >= 0) close(lfd);
      if (by_exec) {
        exec_rank(r, n, sv[1], nn > 1 ? -1 : tp->shm_fd, dir, p);
        _exit(1);
      }
      close(tp->shm_fd);
      sm_tp *mine = sm_xcalloc(1, sizeof *mine);
      mine->n = n;
      mine->pp = tp->pp;
      memcpy(mine->shares, tp->shares, sizeof mine->shares);
      mine->rank = r;
      mine->local = r;
      mine->shared = nn > 1 ? NULL : tp->shared; /* several hosts: the CPU backend's collectives use the sockets */
      mine->shared_bytes = tp->shared_bytes;
      for (int j = 0; j < SM_TP_MAX; j++) mine->fd[j] = -1;
      _exit(worker(dir, p, mine, sv[1]));
    }
    close(sv[1]);
    tp->fd[r] = sv[0];
    tp->pid[r] = pid;
  }
  /* rank 0's shard */
  sm_backend *be = rank_backend(p, n, 0);
  smelt_model *m = NULL;
  smelt_status st = be ? sm_model_load_rank(dir, p, be, tp, &m) : SMELT_ERR_BACKEND;
  if (!st && nn > 1) st = accept_ranks(tp, lfd, per);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", st ? sm_errmsg() : "");
  char ready[96] = "";
  if (m) snprintf(ready, sizeof ready, "%s %016llx", m->be->name, (unsigned long long)fingerprint(m));
  for (int r = 1; r < n && tp->fd[r] >= 0; r++) { /* the others' loads: the first error is the answer */
    smelt_status sr = recv_status(tp, r, MSG_STATUS);
    const char *got = (const char *)tp->buf + 4;
    const size_t gl = tp->last_len - 4, nl = strcspn(ready, " ");
    if (!sr && m && (gl < nl || strncmp(got, ready, nl) || (gl > nl && got[nl] != ' ')))
      /* all on one kind of backend (AUTO could leave a rank without a GPU on the CPU) */
      sr = sm_err(SMELT_ERR_BACKEND,
                  "tensor-parallel rank %d runs on another kind of device than rank 0 (%.*s): one GPU a rank is needed",
                  r, (int)nl, ready);
    else if (!sr && m && (gl != strlen(ready) || memcmp(got, ready, gl)))
      sr = sm_err(SMELT_ERR_INVALID, "tensor-parallel rank %d loaded other model files than rank 0 (%s)", r, m->dir);
    if (sr && !st) {
      st = sr;
      snprintf(msg, sizeof msg, "%s", sm_errmsg());
    }
  }
  if (!st && (!m->be->comm_init || !m->be->all_reduce)) {
    st = sm_err(SMELT_ERR_UNSUPPORTED, "the %s backend of this build has no collectives for tensor parallelism%s",
                m->be->name, !strcmp(m->be->name, "cuda") ? " (built without NCCL)" : "");
    snprintf(msg, sizeof msg, "%s", sm_errmsg());
  }
  if (!st) { /* the group: rank 0's id to all, then everyone joins */
    sm_comm_init ci = {.n_ranks = n,
                       .rank = 0,
                       .shared = nn > 1 ? NULL : tp->shared,
                       .shared_bytes = tp->shared_bytes,
                       .fds = tp->fd};
    if (m->be->comm_make_id) st = m->be->comm_make_id(m->be, ci.id);
    if (!st) st = send_all(tp, MSG_ID, ci.id, SM_COMM_ID_BYTES);
    if (!st && pthread_create(&tp->watch, NULL, watch, tp) == 0) tp->watching = true;
    if (!st) st = m->be->comm_init(m->be, &ci);
    if (st) snprintf(msg, sizeof msg, "%s", sm_errmsg());
  }
  if (st) {
    if (m) {
      m->tp = NULL;
      smelt_model_free(m);
    }
    tp_destroy(tp);
    return sm_err(st, "%s", msg);
  }
  *out = m;
  return SMELT_OK;
}

static smelt_status send_step(smelt_model *m, const sm_kv_cache *kv, const sm_batch *b) {
  sm_tp *tp = m->tp;
  if (tp->broken)
    return sm_err(SMELT_ERR_BACKEND, "the tensor-parallel ranks are out of step after a failed step; restart smelt");
  const int n = b->n_tokens, ns = b->n_seqs, mb = b->max_blocks, no = b->n_out;
  const int fl = (tp->bcast_x ? 1 : 0) | (b->state_slot ? 2 : 0) | (b->attn_span ? 4 : 0) | (b->rope_pos ? 8 : 0);
  const size_t words = 6 + 3 * (size_t)n + (size_t)ns * mb + (size_t)no + (fl & 2 ? (size_t)ns : 0) +
                       (fl & 4 ? 2 * (size_t)n : 0) + (fl & 8 ? 3 * (size_t)n : 0);
  if (words * 4 > MSG_MAX) return sm_err(SMELT_ERR_LIMIT, "tensor parallelism: a step of %d tokens is too large", n);
  if (words * 4 > tp->cap) {
    tp->buf = sm_xrealloc(tp->buf, words * 4);
    tp->cap = words * 4;
  }
  int32_t *v = tp->buf;
  v[0] = kv->tp_id, v[1] = n, v[2] = ns, v[3] = mb, v[4] = no, v[5] = fl;
  int32_t *q = v + 6;
#define PUT(src, cnt) \
  do { \
    memcpy(q, (src), sizeof(int32_t) * (size_t)(cnt)); \
    q += (cnt); \
  } while (0)
  PUT(b->tokens, n);
  PUT(b->pos, n);
  PUT(b->seq, n);
  PUT(b->block_table, (size_t)ns * mb);
  PUT(b->out_rows, no);
  if (fl & 2) PUT(b->state_slot, ns);
  if (fl & 4) PUT(b->attn_span, 2 * (size_t)n);
  if (fl & 8) PUT(b->rope_pos, 3 * (size_t)n);
#undef PUT
  return send_all(tp, MSG_FORWARD, v, words * 4);
}

smelt_status sm_tp_kv_alloc(smelt_model *m, sm_kv_cache *kv, int n_blocks, int block_size, int n_slots) {
  sm_tp *tp = m->tp;
  kv->tp_id = ++tp->next_kv;
  const int32_t a[4] = {kv->tp_id, n_blocks, block_size, n_slots};
  smelt_status st = send_all(tp, MSG_KV_ALLOC, a, sizeof a);
  char msg[1024] = "";
  for (int r = 1; r < tp->n; r++) {
    smelt_status sr = recv_status(tp, r, MSG_STATUS);
    if (sr && !st) {
      st = sr;
      snprintf(msg, sizeof msg, "%s", sm_errmsg());
    }
  }
  if (!st) return SMELT_OK;
  sm_tp_kv_free(m, kv);
  kv->tp_id = 0;
  return sm_err(st, "%s", msg);
}

void sm_tp_kv_copy(smelt_model *m, const sm_kv_cache *kv, bool block, int dst, int src) {
  sm_tp *tp = m->tp;
  const int32_t a[4] = {kv->tp_id, block ? 1 : 0, dst, src};
  send_all(tp, MSG_KV_COPY, a, sizeof a); /* a rank that has ended: the watchdog ends the group */
}

void sm_tp_kv_free(smelt_model *m, const sm_kv_cache *kv) {
  sm_tp *tp = m->tp;
  const int32_t id = kv->tp_id;
  send_all(tp, MSG_KV_FREE, &id, sizeof id);
}

smelt_status sm_tp_step(smelt_model *m, const sm_kv_cache *kv, const sm_batch *b) {
  sm_tp *tp = m->tp;
  for (int i = 0; i < b->n_embd; i++)
    if (b->embd[i].n_deep > 0)
      return sm_err(SMELT_ERR_UNSUPPORTED, "a split model (-tp, -pp) with deepstack image features");
  if (tp->rank != 0) return SMELT_OK;
  tp->bcast_x = b->feed_token || b->n_embd > 0;
  smelt_status st = send_step(m, kv, b);
  if (st || !tp->vocab_split || b->n_out <= 1 || b->n_out == m->tp_idx_n) return st;
  const size_t k = (size_t)b->n_out * tp->n;
  if (b->n_out > m->tp_idx_n) {
    if (m->tp_idx) m->be->free(m->be, m->tp_idx);
    m->tp_idx = m->be->alloc(m->be, sizeof(int32_t) * k);
    m->tp_idx_n = 0;
    if (!m->tp_idx) return sm_err(SMELT_ERR_OOM, "out of backend memory for the logits' order");
  }
  int32_t *idx = sm_xmalloc(sizeof(int32_t) * k);
  for (int o = 0; o < b->n_out; o++)
    for (int r = 0; r < tp->n; r++) idx[(size_t)o * tp->n + r] = r * b->n_out + o;
  m->be->upload(m->be, m->tp_idx, idx, sizeof(int32_t) * k);
  free(idx);
  m->tp_idx_n = b->n_out;
  return SMELT_OK;
}
