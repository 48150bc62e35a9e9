/*
 * sn_afd_nt.c -- the AFD polyfill's calls into ntdll: NtDeviceIoControlFile
 * (issue an AFD poll), NtCancelIoFileEx (ask for one back) and
 * RtlNtStatusToDosError (explain a failure), looked up by name once per
 * process.
 *
 * Why a file of its own: these are the only functions the polyfill calls
 * that no Win32 header declares. Looking them up at run time means a
 * system that lacks one gets an error code from the polyfill, never a
 * module that fails to load; keeping them here keeps the function
 * pointers and their NT signatures out of the rest of the polyfill.
 */
#ifdef _WIN32

#include "sn_afd_nt.h"

typedef VOID (NTAPI *afd_apc_routine_t)(PVOID, afd_iosb_t *, ULONG);

typedef afd_ntstatus_t (NTAPI *afd_nt_device_io_control_file_t)(
    HANDLE FileHandle, HANDLE Event, afd_apc_routine_t ApcRoutine,
    PVOID ApcContext, afd_iosb_t *IoStatusBlock, ULONG IoControlCode,
    PVOID InputBuffer, ULONG InputBufferLength,
    PVOID OutputBuffer, ULONG OutputBufferLength);
typedef afd_ntstatus_t (NTAPI *afd_nt_cancel_io_file_ex_t)(
    HANDLE FileHandle, afd_iosb_t *IoRequestToCancel, afd_iosb_t *IoStatusBlock);
typedef ULONG (WINAPI *afd_rtl_nt_status_to_dos_error_t)(afd_ntstatus_t Status);

static afd_nt_device_io_control_file_t afd__NtDeviceIoControlFile;
static afd_nt_cancel_io_file_ex_t afd__NtCancelIoFileEx;
static afd_rtl_nt_status_to_dos_error_t afd__RtlNtStatusToDosError;
static DWORD afd__init_error;
static INIT_ONCE afd__init_once = INIT_ONCE_STATIC_INIT;

/* The one-time setup: the NT functions, looked up by name so that a
   missing one is an error code, never a DLL that fails to load. */
static BOOL CALLBACK afd__init(PINIT_ONCE once, PVOID param, PVOID *context) {
    HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
    (void)once;
    (void)param;
    (void)context;
    if (ntdll == NULL) {
        afd__init_error = GetLastError();
        return TRUE;
    }
    /* Through void (*)(void): FARPROC's own type is not the target's. */
    afd__NtDeviceIoControlFile = (afd_nt_device_io_control_file_t)(void (*)(void))
        GetProcAddress(ntdll, "NtDeviceIoControlFile");
    afd__NtCancelIoFileEx = (afd_nt_cancel_io_file_ex_t)(void (*)(void))
        GetProcAddress(ntdll, "NtCancelIoFileEx");
    afd__RtlNtStatusToDosError = (afd_rtl_nt_status_to_dos_error_t)(void (*)(void))
        GetProcAddress(ntdll, "RtlNtStatusToDosError");
    if (afd__NtDeviceIoControlFile == NULL || afd__NtCancelIoFileEx == NULL ||
        afd__RtlNtStatusToDosError == NULL)
        afd__init_error = ERROR_PROC_NOT_FOUND;
    return TRUE;
}

DWORD sn_afd_nt_init(void) {
    InitOnceExecuteOnce(&afd__init_once, afd__init, NULL, NULL);
    return afd__init_error;
}

afd_ntstatus_t sn_afd_nt_poll(HANDLE helper, afd_iosb_t *iosb, afd_poll_info_t *info) {
    return afd__NtDeviceIoControlFile(helper, NULL, NULL, iosb, iosb, IOCTL_AFD_POLL,
                                      info, sizeof *info, info, sizeof *info);
}

void sn_afd_nt_cancel(HANDLE helper, afd_iosb_t *iosb) {
    /* The cancel request's own status block; its answer changes nothing
       for the caller (the poll's completion comes either way). */
    afd_iosb_t cancel_iosb;
    afd__NtCancelIoFileEx(helper, iosb, &cancel_iosb);
}

DWORD sn_afd_nt_error(afd_ntstatus_t status) {
    ULONG error = afd__RtlNtStatusToDosError(status);
    return error != 0 ? (DWORD)error : ERROR_GEN_FAILURE;
}

#endif /* _WIN32 */
