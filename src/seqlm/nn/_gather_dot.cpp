// nn/nce.py's GatherDot in compiled code: s[n, j] = W[ids[n, j]] . h[n] + b[ids[n, j]] and its gradient, a row
// of W read straight from the matrix (torch's twin gathers them into blocks of copies first). The tree softmax
// (nn/tree_softmax.py) asks for its paths this way (and, at inference, for whole word scores: tree_pairs), NCE
// for its targets and noise words. float32 only; the Python twin serves every other case and gives the same
// numbers to rounding (tests/test_nce.py, tests/test_tree_softmax.py).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../ngram/_buffers.h"

namespace {

// The dot product and the axpy a row at a time, compiled for three instruction sets. The module picks the best
// this CPU has when it loads, capped like torch's own kernels where ATEN_CPU_CAPABILITY names a lower one
// ("avx2", "default"): bench/rnn_speed.py measures an AVX2-only CPU that way.
#define KERNELS(TARGET, SUFFIX)                                                                       \
    TARGET float dot_##SUFFIX(const float *__restrict a, const float *__restrict b, int64_t n) {         \
        float acc[16] = {0}; /* 16 partial sums: one vector register's lanes */                         \
        int64_t i = 0;                                                                                  \
        for (; i + 16 <= n; i += 16)                                                                    \
            for (int k = 0; k < 16; k++) acc[k] += a[i + k] * b[i + k];                                 \
        float s = 0;                                                                                    \
        for (; i < n; i++) s += a[i] * b[i];                                                            \
        for (int k = 0; k < 16; k++) s += acc[k];                                                       \
        return s;                                                                                       \
    }                                                                                                   \
    TARGET void axpy_##SUFFIX(float *__restrict y, float a, const float *__restrict x, int64_t n) {      \
        int64_t i = 0; /* blocks of 16, as dot's: GCC vectorises these at -O2 too */                    \
        for (; i + 16 <= n; i += 16)                                                                    \
            for (int k = 0; k < 16; k++) y[i + k] += a * x[i + k];                                      \
        for (; i < n; i++) y[i] += a * x[i];                                                            \
    }

KERNELS(__attribute__((target("avx512f"))), avx512)
KERNELS(__attribute__((target("avx2"))), avx2)
KERNELS(, plain)

float (*dot)(const float *, const float *, int64_t) = dot_plain;
void (*axpy)(float *, float, const float *, int64_t) = axpy_plain;

void pick_kernels() {
    const char *cap = getenv("ATEN_CPU_CAPABILITY");
    bool avx512 = !cap || (strcmp(cap, "avx2") != 0 && strcmp(cap, "default") != 0);
    bool avx2 = !cap || strcmp(cap, "default") != 0;
    __builtin_cpu_init();
    if (avx512 && __builtin_cpu_supports("avx512f")) {
        dot = dot_avx512, axpy = axpy_avx512;
    } else if (avx2 && __builtin_cpu_supports("avx2")) {
        dot = dot_avx2, axpy = axpy_avx2;
    }
}

struct Shapes {
    int64_t N, H, M, m;
};

// The shapes the buffers agree on, or -1 with a ValueError: h (N, H), weight (M, H), bias (M,), ids (N, m) as
// flat buffers with H and m given; every id in [0, M) or, where `lengths` (N,) is given, the first lengths[n].
bool check(const Buffers &in, int h, int w, int b, int ids, int lengths, int64_t H, int64_t m, Shapes *s) {
    s->H = H, s->m = m;
    s->N = m > 0 ? in.b[ids].len / 8 / m : 0;
    s->M = H > 0 ? in.b[w].len / 4 / H : 0;
    bool ok = H > 0 && m > 0 && in.b[h].len == s->N * H * 4 && in.b[w].len == s->M * H * 4 &&
              in.b[b].len == s->M * 4 && in.b[ids].len == s->N * m * 8 &&
              (lengths < 0 || in.b[lengths].len == s->N * 8);
    const int64_t *id = static_cast<const int64_t *>(in.b[ids].buf);
    const int64_t *len = lengths < 0 ? nullptr : static_cast<const int64_t *>(in.b[lengths].buf);
    for (int64_t n = 0; ok && n < s->N; n++) {
        int64_t k = len ? len[n] : m;
        ok = k >= 0 && k <= m;
        for (int64_t j = 0; ok && j < k; j++) ok = id[n * m + j] >= 0 && id[n * m + j] < s->M;
    }
    if (!ok) PyErr_SetString(PyExc_ValueError, "gather_dot: shapes disagree or an id is out of range");
    return ok;
}

}  // namespace

static PyObject *gather_dot(PyObject *, PyObject *args) {
    // gather_dot(h, weight, bias, ids, lengths or None, out, H, m): out[n, j] = weight[ids[n, j]] . h[n] +
    // bias[ids[n, j]] for j < lengths[n] (all m without lengths), 0 past it
    PyObject *o[6];
    Py_ssize_t H, m;
    if (!PyArg_ParseTuple(args, "OOOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &H, &m)) return NULL;
    Buffers in;
    bool lens = o[4] != Py_None;
    if (!in.get(o[0]) || !in.get(o[1]) || !in.get(o[2]) || !in.get(o[3]) || (lens && !in.get(o[4])) ||
        !in.get(o[5], true))
        return NULL;
    int out = lens ? 5 : 4;
    Shapes s;
    if (!check(in, 0, 1, 2, 3, lens ? 4 : -1, H, m, &s)) return NULL;
    if (in.b[out].len != s.N * m * 4) {
        PyErr_SetString(PyExc_ValueError, "gather_dot: out has the wrong size");
        return NULL;
    }
    const float *h = static_cast<const float *>(in.b[0].buf), *w = static_cast<const float *>(in.b[1].buf);
    const float *b = static_cast<const float *>(in.b[2].buf);
    const int64_t *ids = in.i8(3), *len = lens ? in.i8(4) : nullptr;
    float *s_out = static_cast<float *>(in.b[out].buf);
    Py_BEGIN_ALLOW_THREADS
    for (int64_t n = 0; n < s.N; n++) {
        int64_t k = len ? len[n] : m;
        for (int64_t j = 0; j < m; j++) {
            int64_t id = ids[n * m + j];
            s_out[n * m + j] = j < k ? dot(w + id * H, h + n * H, H) + b[id] : 0.0f;
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *gather_dot_backward(PyObject *, PyObject *args) {
    // gather_dot_backward(grad (N, m), h, weight, ids, lengths or None, grad_h out (N, H), grad_w (M, H) and
    // grad_b (M,) added to, H, m): the gradients of gather_dot's entries j < lengths[n] (zeros skipped)
    PyObject *o[8];
    Py_ssize_t H, m;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &H, &m))
        return NULL;
    Buffers in;
    bool lens = o[4] != Py_None;
    if (!in.get(o[0]) || !in.get(o[1]) || !in.get(o[2]) || !in.get(o[3]) || (lens && !in.get(o[4])) ||
        !in.get(o[5], true) || !in.get(o[6], true) || !in.get(o[7], true))
        return NULL;
    int at = lens ? 5 : 4;  // grad_h, grad_w, grad_b follow
    Shapes s;
    // grad_w and grad_b stand in for weight's and bias's shapes; weight itself is checked against grad_w
    if (!check(in, 1, at + 1, at + 2, 3, lens ? 4 : -1, H, m, &s)) return NULL;
    if (in.b[0].len != s.N * m * 4 || in.b[2].len != s.M * H * 4 || in.b[at].len != s.N * H * 4) {
        PyErr_SetString(PyExc_ValueError, "gather_dot_backward: shapes disagree");
        return NULL;
    }
    const float *g = static_cast<const float *>(in.b[0].buf), *h = static_cast<const float *>(in.b[1].buf);
    const float *w = static_cast<const float *>(in.b[2].buf);
    const int64_t *ids = in.i8(3), *len = lens ? in.i8(4) : nullptr;
    float *gh = static_cast<float *>(in.b[at].buf), *gw = static_cast<float *>(in.b[at + 1].buf);
    float *gb = static_cast<float *>(in.b[at + 2].buf);
    Py_BEGIN_ALLOW_THREADS
    for (int64_t n = 0; n < s.N; n++) {
        float *ghn = gh + n * H;
        memset(ghn, 0, H * sizeof(float));
        int64_t k = len ? len[n] : m;
        for (int64_t j = 0; j < k; j++) {
            float gj = g[n * m + j];
            if (gj == 0.0f) continue;
            int64_t id = ids[n * m + j];
            axpy(ghn, gj, w + id * H, H);
            axpy(gw + id * H, gj, h + n * H, H);
            gb[id] += gj;
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *tree_pairs(PyObject *, PyObject *args) {
    // tree_pairs(h (B, H), weight (M, H), bias (M,), path (V, D), sign (V, D) float32, rows (N,) or None,
    // targets (N,), out (N,), H, D): out[n] = sum over j of log sigmoid(sign[t, j] (weight[path[t, j]] . h[r] +
    // bias[path[t, j]])), t = targets[n], r = rows[n] (n without rows), j up to the first 0 in sign[t]:
    // nn/tree_softmax.py's word scores at inference, gather, dot and sum in one pass, no (N, D) tensor between
    PyObject *o[8];
    Py_ssize_t H, D;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &H, &D))
        return NULL;
    Buffers in;
    bool has_rows = o[5] != Py_None;
    if (!in.get(o[0]) || !in.get(o[1]) || !in.get(o[2]) || !in.get(o[3]) || !in.get(o[4]) ||
        (has_rows && !in.get(o[5])) || !in.get(o[6]) || !in.get(o[7], true))
        return NULL;
    int tg = has_rows ? 6 : 5, rw = has_rows ? 5 : -1;
    int64_t B = H > 0 ? in.b[0].len / 4 / H : 0, M = H > 0 ? in.b[1].len / 4 / H : 0;
    int64_t V = D > 0 ? in.b[3].len / 8 / D : 0, N = in.b[tg].len / 8;
    bool ok = H > 0 && D > 0 && in.b[0].len == B * H * 4 && in.b[1].len == M * H * 4 && in.b[2].len == M * 4 &&
              in.b[3].len == V * D * 8 && in.b[4].len == V * D * 4 && (!has_rows || in.b[rw].len == N * 8) &&
              in.b[tg + 1].len == N * 4;
    const int64_t *path = in.i8(3), *rows = has_rows ? in.i8(rw) : nullptr, *targets = in.i8(tg);
    const float *sign = static_cast<const float *>(in.b[4].buf);
    for (int64_t n = 0; ok && n < N; n++) {
        ok = targets[n] >= 0 && targets[n] < V && (rows ? rows[n] >= 0 && rows[n] < B : n < B);
        for (int64_t j = 0; ok && j < D && sign[targets[n] * D + j] != 0.0f; j++)
            ok = path[targets[n] * D + j] >= 0 && path[targets[n] * D + j] < M;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "tree_pairs: shapes disagree or an id is out of range");
        return NULL;
    }
    const float *h = static_cast<const float *>(in.b[0].buf), *w = static_cast<const float *>(in.b[1].buf);
    const float *b = static_cast<const float *>(in.b[2].buf);
    float *out = static_cast<float *>(in.b[tg + 1].buf);
    Py_BEGIN_ALLOW_THREADS
    for (int64_t n = 0; n < N; n++) {
        const float *hn = h + (rows ? rows[n] : n) * H, *sg = sign + targets[n] * D;
        const int64_t *pt = path + targets[n] * D;
        // log sigmoid(x) = -log(1 + e^-x): the terms multiplied in double and one log taken a word (or when the
        // product passes 1e200; a term is below e^30 = 1e13), where a log a node cost a third of the time
        double prod = 1.0, sum = 0.0;
        for (int64_t j = 0; j < D && sg[j] != 0.0f; j++) {
            if (j + 1 < D && sg[j + 1] != 0.0f) __builtin_prefetch(w + pt[j + 1] * H);
            float x = sg[j] * (dot(w + pt[j] * H, hn, H) + b[pt[j]]);
            if (x > -30.0f) {
                prod *= 1.0 + exp(-double(x));
                if (prod > 1e200) sum -= log(prod), prod = 1.0;
            } else {
                sum += x - log1p(exp(double(x)));  // e^-x would be the whole product: the stable form
            }
        }
        out[n] = float(sum - log(prod));
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *byte_mask_mul(PyObject *, PyObject *args) {
    // byte_mask_mul(x (n,) float32, bytes (n,) uint8, keep, scale, out (n,)): out[i] = x[i] * scale where
    // bytes[i] < keep, else 0: nn/dropout.py's ByteDropout forward and backward in one pass over memory (torch's
    // compare, cast, scale and multiply took five over these batches, which do not fit in the caches)
    PyObject *o[3];
    int keep;
    float scale;
    if (!PyArg_ParseTuple(args, "OOifO", &o[0], &o[1], &keep, &scale, &o[2])) return NULL;
    Buffers in;
    if (!in.get(o[0]) || !in.get(o[1]) || !in.get(o[2], true)) return NULL;
    int64_t n = in.b[1].len;
    if (in.b[0].len != n * 4 || in.b[2].len != n * 4) {
        PyErr_SetString(PyExc_ValueError, "byte_mask_mul: shapes disagree");
        return NULL;
    }
    const float *x = static_cast<const float *>(in.b[0].buf);
    const uint8_t *r = static_cast<const uint8_t *>(in.b[1].buf);
    float *out = static_cast<float *>(in.b[2].buf);
    float factor[256];  // a byte's factor, looked up: a test of a random byte is a branch no CPU predicts
    for (int b = 0; b < 256; b++) factor[b] = b < keep ? scale : 0.0f;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * factor[r[i]];
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *random_bytes(PyObject *, PyObject *args) {
    // random_bytes(seed, out uint8 (n,)): splitmix64's stream from `seed` (Steele, Lea & Flood 2014), 8 bytes a
    // draw: ByteDropout's masks, about 4 times faster than torch's random_ on int64 (mt19937)
    unsigned long long seed;
    PyObject *o;
    if (!PyArg_ParseTuple(args, "KO", &seed, &o)) return NULL;
    Buffers in;
    if (!in.get(o, true)) return NULL;
    uint8_t *out = static_cast<uint8_t *>(in.b[0].buf);
    int64_t n = in.b[0].len;
    uint64_t state = seed;
    Py_BEGIN_ALLOW_THREADS
    auto next = [&state]() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t z = next();
        memcpy(out + i, &z, 8);  // a fixed size: one store, not a call
    }
    if (i < n) {
        uint64_t z = next();
        memcpy(out + i, &z, size_t(n - i));
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"gather_dot", gather_dot, METH_VARARGS, "gather_dot(h, weight, bias, ids, lengths, out, H, m)"},
    {"gather_dot_backward", gather_dot_backward, METH_VARARGS,
     "gather_dot_backward(grad, h, weight, ids, lengths, grad_h, grad_w, grad_b, H, m)"},
    {"random_bytes", random_bytes, METH_VARARGS, "random_bytes(seed, out)"},
    {"byte_mask_mul", byte_mask_mul, METH_VARARGS, "byte_mask_mul(x, bytes, keep, scale, out)"},
    {"tree_pairs", tree_pairs, METH_VARARGS, "tree_pairs(h, weight, bias, path, sign, rows, targets, out, H, D)"},
    {"isa", [](PyObject *, PyObject *) -> PyObject * {
         return PyUnicode_FromString(dot == dot_avx512 ? "avx512f" : dot == dot_avx2 ? "avx2" : "default");
     }, METH_NOARGS, "isa() -> the instruction set the kernels run with"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_seqlm_nn", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__seqlm_nn(void) {
    pick_kernels();
    return PyModule_Create(&MODULE);
}
