/*
 * sn_platform_win.c -- sn_platform.h on Windows: slim reader/writer locks
 * (nothing to destroy), GetTickCount64 (monotonic; its 10-16 ms ticks are
 * the resolution of the waits it recomputes anyway), Sleep, and no fork.
 */
#ifdef _WIN32
#include "sn_platform.h"

void sn_mutex_init(sn_mutex_t *m) { InitializeSRWLock(m); }
void sn_mutex_lock(sn_mutex_t *m) { AcquireSRWLockExclusive(m); }
void sn_mutex_unlock(sn_mutex_t *m) { ReleaseSRWLockExclusive(m); }
void sn_mutex_destroy(sn_mutex_t *m) { (void)m; /* SRW locks own nothing */ }

int64_t sn_now_ms(void) { return (int64_t)GetTickCount64(); }

void sn_sleep_ms(unsigned ms) { Sleep(ms); }

void sn_fork_watch(void) {}
unsigned long sn_fork_generation(void) { return 0; }

#endif /* _WIN32 */
