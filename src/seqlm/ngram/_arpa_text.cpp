// ARPA text in compiled code, twins of arpa_write.py's numpy assembly (tested byte for byte against it):
// - assemble: the gather of byte pieces into ARPA lines (the numpy path's last step);
// - arpa_lines: a chunk of lines straight from word ids and float32 log10 values, every number written
//   as numpy 2's str of a float32 (floattext.numpy2_str) from std::to_chars' shortest round-trip digits;
// - float32_texts: those numbers alone, one per line (to test them against numpy).
// Linked into _seqlm_native with _native.cpp, which registers these functions.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "_buffers.h"

namespace {

constexpr int TEXT = 48;  // room for one number's text

// numpy2_str: nan, inf, -inf; 0 and 1e-4 <= |v| < 1e6 positional, at least one fraction digit ("-1.0");
// the rest scientific with a two-digit exponent at least ("1e-05", "-1.06175423e+15"), as numpy 2 prints.
char *float_text(float v, char *at) {
    if (std::isnan(v)) return static_cast<char *>(memcpy(at, "nan", 3)) + 3;
    if (std::isinf(v)) {
        if (v < 0) *at++ = '-';
        return static_cast<char *>(memcpy(at, "inf", 3)) + 3;
    }
    double a = std::fabs(static_cast<double>(v));
    if (v == 0 || (a >= 1e-4 && a < 1e6)) {
        char *end = std::to_chars(at, at + TEXT, v, std::chars_format::fixed).ptr;
        if (!memchr(at, '.', end - at)) {
            *end++ = '.';
            *end++ = '0';
        }
        return end;
    }
    return std::to_chars(at, at + TEXT, v, std::chars_format::scientific).ptr;
}

// Log10 values repeat (back-offs above all): the text of a recent value is copied, not formatted again.
struct Cached {
    uint32_t bits;
    uint8_t length;  // 0: empty
    char text[27];
};
Cached cache[1 << 13];

char *cached_text(float v, char *at) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    Cached &c = cache[(bits * 2654435761u) >> 19];  // (Knuth's multiplicative hash, 13 bits)
    if (c.length && c.bits == bits) return static_cast<char *>(memcpy(at, c.text, c.length)) + c.length;
    char *end = float_text(v, at);
    if (end - at <= static_cast<long>(sizeof c.text)) {
        c.bits = bits;
        c.length = static_cast<uint8_t>(end - at);
        memcpy(c.text, at, c.length);
    }
    return end;
}

}  // namespace

PyObject *seqlm_assemble(PyObject *, PyObject *args) {
    // assemble(buf u1 (B,), start i8 (P,), length i8 (P,)) -> bytes: buf[start[i] : start[i] + length[i]] joined
    PyObject *a[3];
    Buffers in;
    if (!PyArg_ParseTuple(args, "OOO", &a[0], &a[1], &a[2])) return NULL;
    for (PyObject *o : a)
        if (!in.get(o)) return NULL;
    const char *buf = static_cast<const char *>(in.b[0].buf);
    const int64_t *start = static_cast<const int64_t *>(in.b[1].buf), *length = static_cast<const int64_t *>(in.b[2].buf);
    Py_ssize_t P = in.b[1].len / 8, total = 0;
    for (Py_ssize_t i = 0; i < P; i++) {
        if (in.b[2].len != in.b[1].len || start[i] < 0 || length[i] < 0 || start[i] + length[i] > in.b[0].len) {
            PyErr_SetString(PyExc_ValueError, "assemble: a piece lies outside the buffer");
            return NULL;
        }
        total += length[i];
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) return NULL;
    char *at = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < P; i++) {
        memcpy(at, buf + start[i], static_cast<size_t>(length[i]));
        at += length[i];
    }
    return out;
}

PyObject *seqlm_arpa_lines(PyObject *, PyObject *args) {
    // arpa_lines(words i8 (m, k), prob f4 (m,), backoff f4 (m,) or None, text u1, start i8 (W,), length i8 (W,))
    // -> bytes: "prob\tw1 w2 .. wk[\tbackoff]\n" per row; word w's text is text[start[w] : start[w] + length[w]]
    // with a leading space (arpa_write.ArpaWriter's word pieces), dropped before the first word.
    PyObject *o[6];
    int k;
    Buffers in;
    if (!PyArg_ParseTuple(args, "OiOOOOO", &o[0], &k, &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    bool has_backoff = o[2] != Py_None;
    for (PyObject *x : o)
        if (x != Py_None && !in.get(x)) return NULL;
    int at = 0;
    const int64_t *words = static_cast<const int64_t *>(in.b[at++].buf);
    const float *prob = static_cast<const float *>(in.b[at++].buf);
    const float *backoff = has_backoff ? static_cast<const float *>(in.b[at++].buf) : NULL;
    const char *text = static_cast<const char *>(in.b[at].buf);
    Py_ssize_t text_len = in.b[at++].len;
    const int64_t *wstart = static_cast<const int64_t *>(in.b[at].buf), *wlen = static_cast<const int64_t *>(in.b[at + 1].buf);
    Py_ssize_t W = in.b[at].len / 8, m = in.b[1].len / 4;
    if (k < 1 || in.b[0].len != m * k * 8 || (has_backoff && in.b[2].len != in.b[1].len) || in.b[at + 1].len != in.b[at].len) {
        PyErr_SetString(PyExc_ValueError, "arpa_lines: array sizes disagree");
        return NULL;
    }
    // one pass to check the ids and size the text exactly but for the numbers (at most TEXT bytes each), then
    // the lines written straight into the bytes object: no intermediate string, no copy
    Py_ssize_t bound = m * (2 * TEXT + 3);
    for (Py_ssize_t i = 0; i < m * k; i++) {
        int64_t w = words[i];
        if (w < 0 || w >= W || wstart[w] < 0 || wlen[w] < 1 || wstart[w] + wlen[w] > text_len) {
            PyErr_SetString(PyExc_ValueError, "arpa_lines: a word id without text");
            return NULL;
        }
        bound += wlen[w];
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, bound);
    if (!out) return NULL;
    char *put = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < m; i++) {
        put = cached_text(prob[i], put);
        *put++ = '\t';
        for (int j = 0; j < k; j++) {
            int64_t w = words[i * k + j];
            size_t n = static_cast<size_t>(wlen[w] - (j == 0));
            memcpy(put, text + wstart[w] + (j == 0), n);
            put += n;
        }
        if (backoff) {
            *put++ = '\t';
            put = cached_text(backoff[i], put);
        }
        *put++ = '\n';
    }
    if (_PyBytes_Resize(&out, put - PyBytes_AS_STRING(out)) < 0) return NULL;
    return out;
}

PyObject *seqlm_float32_texts(PyObject *, PyObject *args) {
    // float32_texts(values f4 (n,)) -> bytes: each value's text followed by "\n"
    PyObject *o;
    Buffers in;
    if (!PyArg_ParseTuple(args, "O", &o) || !in.get(o)) return NULL;
    const float *v = static_cast<const float *>(in.b[0].buf);
    std::string out;
    char num[TEXT];
    for (Py_ssize_t i = 0; i < in.b[0].len / 4; i++) {
        out.append(num, cached_text(v[i], num) - num);
        out.push_back('\n');
    }
    return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}
