/*
 * sn_afd_nt.h -- the AFD polyfill's view of the kernel below Winsock: the
 * IOCTL_AFD_POLL request, its AFD_POLL_* conditions, the NT types it
 * travels in, and the ntdll calls that issue, cancel and explain it
 * (sn_afd_nt.c). Internal to the polyfill's files (sn_afd*.c); cffi never
 * sees it.
 *
 * None of this is in a public SDK header (the ioctl is undocumented; see
 * the essay in sn_afd.c), so the polyfill spells it out once, here, with
 * the x64 layouts checked by static assertions.
 */
#ifndef SN_AFD_NT_H
#define SN_AFD_NT_H

#ifdef _WIN32

#include "sn_win.h"

#define IOCTL_AFD_POLL 0x00012024

#define AFD_POLL_RECEIVE           0x0001
#define AFD_POLL_RECEIVE_EXPEDITED 0x0002
#define AFD_POLL_SEND              0x0004
#define AFD_POLL_DISCONNECT        0x0008
#define AFD_POLL_ABORT             0x0010
#define AFD_POLL_LOCAL_CLOSE       0x0020
#define AFD_POLL_CONNECT           0x0040
#define AFD_POLL_ACCEPT            0x0080
#define AFD_POLL_CONNECT_FAIL      0x0100

/* Conditions every poll asks for, whatever the filter: errors are
   delivered regardless of the filter (as PSN does), and LOCAL_CLOSE is
   how we learn that the socket was closed under us. */
#define AFD_POLL_ALWAYS (AFD_POLL_ABORT | AFD_POLL_CONNECT_FAIL | AFD_POLL_LOCAL_CLOSE)

/* Our own names for the NT types and codes we need, so the polyfill does
   not depend on which of winternl.h / ntstatus.h / ddk headers a toolchain
   has. */
typedef LONG afd_ntstatus_t;
#define AFD_STATUS_SUCCESS        ((afd_ntstatus_t)0x00000000L)
#define AFD_STATUS_PENDING        ((afd_ntstatus_t)0x00000103L)
#define AFD_STATUS_INVALID_HANDLE ((afd_ntstatus_t)0xC0000008L)
#define AFD_STATUS_CANCELLED      ((afd_ntstatus_t)0xC0000120L)
#define AFD_STATUS_NOT_FOUND      ((afd_ntstatus_t)0xC0000225L)
#define AFD_NT_SUCCESS(status)    ((status) >= 0)

typedef struct afd_iosb {
    union {
        afd_ntstatus_t Status;
        PVOID Pointer;
    } u;
    ULONG_PTR Information;
} afd_iosb_t;

typedef struct afd_poll_handle_info {
    HANDLE Handle;
    ULONG Events;
    afd_ntstatus_t Status;
} afd_poll_handle_info_t;

typedef struct afd_poll_info {
    LARGE_INTEGER Timeout;
    ULONG NumberOfHandles;
    ULONG Exclusive;
    afd_poll_handle_info_t Handles[1];
} afd_poll_info_t;

/* 64-bit layouts (sn_win.h refuses 32-bit Windows, so always checked). */
_Static_assert(sizeof(afd_iosb_t) == 16, "IO_STATUS_BLOCK layout");
_Static_assert(sizeof(afd_poll_handle_info_t) == 16, "AFD_POLL_HANDLE_INFO layout");
_Static_assert(sizeof(afd_poll_info_t) == 32, "AFD_POLL_INFO layout");

/* Look up the ntdll functions (once per process). 0, or the error that
   makes the polyfill unusable here. Every other function below requires
   a successful call first. */
DWORD sn_afd_nt_init(void);

/* Issue IOCTL_AFD_POLL for `info` on the helper handle `helper`. The
   address of `iosb` is both its IO_STATUS_BLOCK and its ApcContext, so it
   comes back as the packet's lpOverlapped. `info` is input and output
   buffer at once. On PENDING or success a completion packet will be
   queued, and the kernel owns `iosb` and `info` until it is dequeued. */
afd_ntstatus_t sn_afd_nt_poll(HANDLE helper, afd_iosb_t *iosb, afd_poll_info_t *info);

/* Ask for the poll whose IO_STATUS_BLOCK is `iosb` back. Only asks:
   whatever the answer, the poll's completion is still ahead, and the
   kernel owns its memory until that packet is dequeued. */
void sn_afd_nt_cancel(HANDLE helper, afd_iosb_t *iosb);

/* The Win32 error code for an NTSTATUS (ERROR_GEN_FAILURE if none). */
DWORD sn_afd_nt_error(afd_ntstatus_t status);

#endif /* _WIN32 */
#endif /* SN_AFD_NT_H */
