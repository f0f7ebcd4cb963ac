/* Ctrl+C in the REPL: SIGINT sets a flag (a reply in progress stops at the next token, a prefill
 * at the next step) instead of ending the process. */
#include <signal.h>
#include <string.h>
#include "cli/run.h"

static volatile sig_atomic_t g_flag;
static struct sigaction g_old;
static bool g_installed;

static void on_sigint(int sig) {
  (void)sig;
  g_flag = 1;
}

void sm_interrupt_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; /* no SA_RESTART: a blocking read returns, so the prompt can start over */
  if (sigaction(SIGINT, &sa, &g_old) == 0) g_installed = true;
}

void sm_interrupt_restore(void) {
  if (g_installed) sigaction(SIGINT, &g_old, NULL);
  g_installed = false;
}

bool sm_interrupted(void) { return g_flag != 0; }
void sm_interrupt_clear(void) { g_flag = 0; }
bool sm_interrupt_cb(void *ud) {
  (void)ud;
  return g_flag != 0;
}
