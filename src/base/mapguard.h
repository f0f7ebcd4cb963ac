/* Map guard: protection against files that change under a read-only memory map.
 *
 * Reading a page of a mapped file past its (new) end after the file was truncated raises
 * SIGBUS, which kills the process; a file overwritten in place changes the mapped data under
 * the reader. Every sm_mmap_open mapping is registered here. Once sm_mapguard_install() has
 * run (a long-running process that can fail its work cleanly, e.g. `smelt serve`), a SIGBUS
 * inside a registered mapping replaces the faulting page by a page of zeros, so the faulting
 * computation completes with wrong numbers instead of killing the process, and records the
 * fault. The owner calls sm_mapguard_check() after each unit of work that read mapped data
 * and discards that work when it reports a problem. Faults outside registered mappings keep
 * their default action. Without install() nothing changes. */
#ifndef SM_MAPGUARD_H
#define SM_MAPGUARD_H
#include <stdbool.h>
#include <stddef.h>

void sm_mapguard_install(void);
/* Register / forget a mapping (fd stays open while registered: it is fstat'ed by check). */
void sm_mapguard_add(const void *addr, size_t size, int fd, const char *path);
void sm_mapguard_remove(const void *addr);
/* True when a registered file faulted or changed (size or modification time) since it was
 * mapped; msg then names the file and what happened. Cheap: one fstat per mapped file. */
bool sm_mapguard_check(char *msg, size_t msg_size);

#endif
