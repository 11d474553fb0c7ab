// Forced-include header for the "_ucrt" build flavour only (see build.sh).
// tokenizers/tokenize_util.cpp:880,885,901,905 call the C library's isspace(int) on
// Unicode code points. Outside -1..255 that is undefined behaviour; the results differ
// by C library:
//   * glibc (the Linux engine build; the default flavour of this driver) indexes its
//     384-entry C-locale class table out of bounds and returns whatever bits lie there;
//   * the Windows UCRT (the MSVC engine build) range-checks and returns 0 for c > 255
//     (__acrt_locale_get_ctype_array_value in ucrt ctype.h); in its "C" locale
//     bytes 0x80..0xFF are not spaces either.
// This header reproduces the UCRT answer so the Windows behaviour can be inspected.
// It does not touch the engine file; it only replaces the ::isspace the file calls.
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <locale>
#include <string>
#include <vector>
static inline int ggk_isspace_ucrt(long c) {
    return (c == ' ' || (c >= '\t' && c <= '\r')) ? 8 /*_SPACE*/ : 0;
}
#define isspace(c) ggk_isspace_ucrt(static_cast<long>(c))
