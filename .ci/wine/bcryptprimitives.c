/*
 * A stand-in for Windows' bcryptprimitives.dll, for running Bun programs
 * (claude.exe, opencode.exe) under Wine 8, which has no such DLL. Both import
 * or load it for one function, ProcessPrng; this one fills the buffer from
 * BCryptGenRandom, which Wine has. Built by .ci/wine-setup with mingw-w64 and
 * placed beside each program.
 *
 * It also stands in for one kernel32 function. opencode.exe imports
 * DiscardVirtualMemory, which Wine 8's kernel32 exports only as a stub that
 * aborts the process when called (a few seconds into the TUI, when memory is
 * first given back). Loading this DLL is the first thing of ours to run in
 * that process, early enough: so on load it points the program's import of
 * DiscardVirtualMemory at discard_virtual_memory below. Programs that do not
 * import it (claude.exe) are left as they are.
 */
#include <windows.h>
#include <bcrypt.h>
#include <string.h>

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T size)
{
    /* BCryptGenRandom takes a ULONG length: larger requests go in pieces. */
    while (size > 0) {
        ULONG piece = size > 0x40000000 ? 0x40000000 : (ULONG)size;
        if (!BCRYPT_SUCCESS(BCryptGenRandom(NULL, data, piece,
                                            BCRYPT_USE_SYSTEM_PREFERRED_RNG)))
            return FALSE;
        data += piece;
        size -= piece;
    }
    return TRUE;
}

/* Windows' DiscardVirtualMemory keeps the pages committed and lets their
 * contents go, which is what MEM_RESET asks of Wine's VirtualAlloc. */
static DWORD WINAPI discard_virtual_memory(PVOID address, SIZE_T size)
{
    if (VirtualAlloc(address, size, MEM_RESET, PAGE_READWRITE) == NULL)
        return GetLastError();
    return ERROR_SUCCESS;
}

/* The slot in the program's import table that the loader filled for
 * KERNEL32.dll!DiscardVirtualMemory, or NULL when the program has none. */
static ULONG_PTR *discard_import_slot(void)
{
    BYTE *base = (BYTE *)GetModuleHandleW(NULL);
    IMAGE_NT_HEADERS *nt = (IMAGE_NT_HEADERS *)(base + ((IMAGE_DOS_HEADER *)base)->e_lfanew);
    IMAGE_DATA_DIRECTORY imports = nt->OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_IMPORT];
    IMAGE_IMPORT_DESCRIPTOR *dll;

    if (imports.Size == 0)
        return NULL;
    for (dll = (IMAGE_IMPORT_DESCRIPTOR *)(base + imports.VirtualAddress); dll->Name; dll++) {
        IMAGE_THUNK_DATA *name, *slot;
        if (lstrcmpiA((const char *)(base + dll->Name), "kernel32.dll") != 0)
            continue;
        /* The names stay in OriginalFirstThunk; FirstThunk holds the addresses. */
        name = (IMAGE_THUNK_DATA *)(base + (dll->OriginalFirstThunk ? dll->OriginalFirstThunk
                                                                    : dll->FirstThunk));
        slot = (IMAGE_THUNK_DATA *)(base + dll->FirstThunk);
        for (; name->u1.AddressOfData; name++, slot++) {
            if (IMAGE_SNAP_BY_ORDINAL(name->u1.Ordinal))
                continue;
            if (strcmp((const char *)((IMAGE_IMPORT_BY_NAME *)(base + name->u1.AddressOfData))->Name,
                       "DiscardVirtualMemory") == 0)
                return &slot->u1.Function;
        }
    }
    return NULL;
}

BOOL WINAPI DllMain(HINSTANCE instance, DWORD reason, LPVOID reserved)
{
    ULONG_PTR *slot;
    DWORD protection;

    (void)instance;
    (void)reserved;
    if (reason != DLL_PROCESS_ATTACH)
        return TRUE;
    slot = discard_import_slot();
    if (slot == NULL)
        return TRUE;
    /* The import table is read-only once the loader has filled it. */
    if (!VirtualProtect(slot, sizeof *slot, PAGE_READWRITE, &protection))
        return FALSE;
    *slot = (ULONG_PTR)discard_virtual_memory;
    VirtualProtect(slot, sizeof *slot, protection, &protection);
    return TRUE;
}
