/*
 * A stand-in for Windows' bcryptprimitives.dll, for running claude.exe under
 * Wine 8, which has no such DLL. claude.exe imports one function from it,
 * ProcessPrng; this one fills the buffer from BCryptGenRandom, which Wine has.
 * Built by .ci/wine-setup with mingw-w64 and placed beside claude.exe.
 */
#include <windows.h>
#include <bcrypt.h>

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
