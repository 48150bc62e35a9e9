/*
 * sn_platform.h -- the few operating-system services the port layer needs
 * beyond the backends: a mutex, a monotonic clock, a short sleep, atomics,
 * and fork detection. Implemented in sn_platform_posix.c and
 * sn_platform_win.c. cffi never sees this file.
 */
#ifndef SN_PLATFORM_H
#define SN_PLATFORM_H

#include <stdint.h>

/* `static inline` in every dialect the core is compiled in (MSVC's C mode
   spells it __inline). */
#if defined(_MSC_VER) && !defined(__clang__)
#  define SN_INLINE static __inline
#else
#  define SN_INLINE static inline
#endif

#ifdef _WIN32
#  ifndef WIN32_LEAN_AND_MEAN
#    define WIN32_LEAN_AND_MEAN
#  endif
#  include <winsock2.h>
#  include <windows.h>
typedef SRWLOCK sn_mutex_t;
#  define SN_ERROR_NOT_SUPPORTED   ERROR_NOT_SUPPORTED
#  define SN_ERROR_NOT_REGISTERED  ERROR_NOT_FOUND
#  define SN_ERROR_INVALID         ERROR_INVALID_PARAMETER
#  define SN_ERROR_NO_MEMORY       ERROR_NOT_ENOUGH_MEMORY
#  define SN_ERROR_CLOSED          ERROR_INVALID_HANDLE
#  define SN_ERROR_BUSY            ERROR_BUSY
#  define SN_ERROR_INTERRUPTED     ERROR_OPERATION_ABORTED  /* never produced */
#else
#  include <errno.h>
#  include <pthread.h>
typedef pthread_mutex_t sn_mutex_t;
#  define SN_ERROR_NOT_SUPPORTED   ENOSYS
#  define SN_ERROR_NOT_REGISTERED  ENOENT
#  define SN_ERROR_INVALID         EINVAL
#  define SN_ERROR_NO_MEMORY       ENOMEM
#  define SN_ERROR_CLOSED          EBADF
#  define SN_ERROR_BUSY            EBUSY
#  define SN_ERROR_INTERRUPTED     EINTR
#endif

void sn_mutex_init(sn_mutex_t *m);
void sn_mutex_lock(sn_mutex_t *m);
void sn_mutex_unlock(sn_mutex_t *m);
void sn_mutex_destroy(sn_mutex_t *m);

/* Monotonic milliseconds, for recomputing the remaining timeout. */
int64_t sn_now_ms(void);

/* "Wait again for the time left", the arithmetic: the deadline of a wait
   of timeout_ms (> 0) milliseconds starting now, and the milliseconds left
   before it (0 once it has passed). Every wait of the core that is
   resumed counts with these, on the same clock, and nothing else reads
   the clock for it: the port's retry (sn_run.c), the AFD polyfill's
   (sn_afd.c) and its drain at close (sn_afd_port.c), the strict model's
   (sn_model.c). */
SN_INLINE int64_t sn_deadline(int64_t timeout_ms) {
    return sn_now_ms() + timeout_ms;
}
SN_INLINE int64_t sn_time_left(int64_t deadline) {
    int64_t left = deadline - sn_now_ms();
    return left > 0 ? left : 0;
}

/* Sleep about `ms` milliseconds (close() waiting for waiters to leave). */
void sn_sleep_ms(unsigned ms);

/* A number that changes in the child of every fork() (always 0 where
   there is no fork). A port remembers the value it was opened under; a
   different value means the port was inherited, and belongs to the
   parent. sn_fork_watch() arms the detection; call it before comparing. */
void sn_fork_watch(void);
unsigned long sn_fork_generation(void);

/* Sequentially consistent atomics on longs (the life-cycle fields of a
   port) and a relaxed 64-bit add (counters). */
#if defined(_MSC_VER) && !defined(__clang__)
#  include <intrin.h>
static __inline long sn_atomic_inc(volatile long *p) { return _InterlockedIncrement(p); }
static __inline long sn_atomic_dec(volatile long *p) { return _InterlockedDecrement(p); }
static __inline long sn_atomic_load(volatile long *p) { return _InterlockedOr(p, 0); }
static __inline int sn_atomic_cas(volatile long *p, long expected, long desired) {
    return _InterlockedCompareExchange(p, desired, expected) == expected;
}
static __inline void sn_atomic_store(volatile long *p, long v) { _InterlockedExchange(p, v); }
static __inline void sn_atomic_add64(volatile uint64_t *p, uint64_t v) {
    _InterlockedExchangeAdd64((volatile __int64 *)p, (__int64)v);
}
static __inline uint64_t sn_atomic_load64(volatile uint64_t *p) {
    return (uint64_t)_InterlockedOr64((volatile __int64 *)p, 0);
}
#else
static inline long sn_atomic_inc(volatile long *p) {
    return __atomic_add_fetch(p, 1, __ATOMIC_SEQ_CST);
}
static inline long sn_atomic_dec(volatile long *p) {
    return __atomic_sub_fetch(p, 1, __ATOMIC_SEQ_CST);
}
static inline long sn_atomic_load(volatile long *p) {
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
static inline int sn_atomic_cas(volatile long *p, long expected, long desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline void sn_atomic_store(volatile long *p, long v) {
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
static inline void sn_atomic_add64(volatile uint64_t *p, uint64_t v) {
    __atomic_add_fetch(p, v, __ATOMIC_RELAXED);
}
static inline uint64_t sn_atomic_load64(volatile uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
#endif

#endif /* SN_PLATFORM_H */
