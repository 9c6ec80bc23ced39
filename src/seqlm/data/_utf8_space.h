// White space as Python's str.split() sees it, on UTF-8 bytes: shared by data/_tokens.cpp (text lines to ids)
// and ngram/_kenlm_calls.cpp (kenlm's sentence calls), so that both split exactly as str.split() does.
#pragma once

// Bytes of the white space character at p (0: none), as str.split() sees white space in UTF-8: ASCII
// \t \n \v \f \r, \x1c-\x1f and space; U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F,
// U+205F, U+3000 (valid UTF-8 is assumed: the caller decoded the block first).
static inline int space(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
    if (c == 0xc2 && end - p >= 2) return (p[1] == 0x85 || p[1] == 0xa0) ? 2 : 0;
    if (end - p < 3) return 0;
    if (c == 0xe1) return (p[1] == 0x9a && p[2] == 0x80) ? 3 : 0;
    if (c == 0xe2 && p[1] == 0x80) return (p[2] <= 0x8a || p[2] == 0xa8 || p[2] == 0xa9 || p[2] == 0xaf) ? 3 : 0;
    if (c == 0xe2 && p[1] == 0x81) return p[2] == 0x9f ? 3 : 0;
    if (c == 0xe3) return (p[1] == 0x80 && p[2] == 0x80) ? 3 : 0;
    return 0;
}
