// The Python buffers one call of a compiled function reads or writes, released together when it returns
// (_arpa_text.cpp, _sort.cpp).
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

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
