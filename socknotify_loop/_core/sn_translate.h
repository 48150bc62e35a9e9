/*
 * sn_translate.h -- a call's changes on their way in and their verdicts on
 * their way back (sn_translate.c). Internal to the port's files; cffi
 * never sees it. Called with the port's lock held.
 */
#ifndef SN_TRANSLATE_H
#define SN_TRANSLATE_H

#include "sn_call.h"

/* Translate the caller's registrations into kernel ones;
   returns how many ENABLEs were refused before reaching the kernel. */
uint32_t sn__prepare(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                     sn_registration_t *kregs, sn_memo_t *memos, uint32_t count);

/* Read the kernel's verdicts back into the table. The
   first `callers` kernel registrations are the caller's; the rest are the
   port's own re-arms and deferred ENABLEs. `call_error` is the call's
   error, for the registrations of a call that failed as a whole. */
void sn__settle(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                sn_registration_t *kregs, sn_memo_t *memos,
                uint32_t callers, uint32_t count, int call_error);

#endif /* SN_TRANSLATE_H */
