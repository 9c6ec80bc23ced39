// The Python buffers one call of a compiled function reads or writes, released together when it returns
// (_arpa_text.cpp, _sort.cpp), and the advice for transparent huge pages the tables and rows share.
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

// Ask Linux for transparent huge pages on the 2 MB-aligned interior of [p, p + bytes): memory probed at random
// (_scorer.h's tables) or filled fresh (_dense.cpp's rows) otherwise costs a TLB miss or a page fault every
// 4 kB. Advice only: where it is refused (THP off, another system) the pages stay small and nothing changes.
inline void advise_huge_pages(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = uintptr_t(1) << 21;
    uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
    uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(huge - 1);
    if (hi > lo) madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

struct Buffers {
    Py_buffer b[8];
    int got = 0;
    bool get(PyObject *o, bool writable = false) {
        int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
        return PyObject_GetBuffer(o, &b[got], flags) == 0 && ++got;
    }
    int64_t *i8(int i) const { return static_cast<int64_t *>(b[i].buf); }
    Py_ssize_t len_i8(int i) const { return b[i].len / 8; }
    ~Buffers() {
        while (got-- > 0) PyBuffer_Release(&b[got]);
    }
};
