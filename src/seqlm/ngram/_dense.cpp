// advance.py's NGramTensors.advance on the CPU in one call: each row's context ids, then its whole-vocabulary
// distribution written straight into the output. The tensor version pays some thirty tensor operations a
// call whatever B is, which a decoder asking for a few rows a frame feels; the rule and the order of every
// addition are the tensor version's (tests/test_advance.py holds them equal).
#include "_buffers.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace {

const int MAX_ORDER = 64;

struct Order {  // one order's tables (advance.py's NGramTensors), as buffers
    const int64_t *words = nullptr, *first = nullptr;  // first: runs of the next order (none at the top)
    const void *logp = nullptr, *backoff = nullptr;
    int64_t size = 0, backoffs = 0;
};

// The id at order j + 1 of (the order-j n-gram `context`, word): binary search in the context's run.
int64_t child(const Order *o, int j, int64_t context, int64_t word) {
    if (context < 0 || word < 0) return -1;
    const int64_t *lo = o[j].words + o[j - 1].first[context], *hi = o[j].words + o[j - 1].first[context + 1];
    const int64_t *at = std::lower_bound(lo, hi, word);
    return at != hi && *at == word ? at - o[j].words : -1;
}

// The whole-vocabulary pass is most of the work: GCC vectorizes it only when asked, at -O2
template <typename F>
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("tree-vectorize")))
#endif
void fill(F *out, const F *uni, F base, int64_t V) {
    for (int64_t v = 0; v < V; v++) out[v] = base + uni[v];
}

// A row's context: ctx[k] the id at order k + 1 of its last k + 1 words (-1: none), and tail[k] the back-offs
// of the contexts of order > k (cumsum in double, as torch)
template <typename F>
void context(const Order *o, const int64_t *w, int64_t L, int64_t *ctx, F *tail) {
    for (int64_t k = 0; k < L; k++) {
        int64_t id = w[L - 1 - k];  // a word is its own id at order 1
        for (int64_t j = 1; j <= k; j++) id = child(o, static_cast<int>(j), id, w[L - 1 - k + j]);
        ctx[k] = id;
    }
    double sum = 0.0;
    tail[L] = 0;
    for (int64_t k = L - 1; k >= 0; k--) {
        if (ctx[k] >= 0 && o[k].backoffs) sum += static_cast<const F *>(o[k].backoff)[ctx[k]];
        tail[k] = static_cast<F>(sum);
    }
}

template <typename F>
void rows(const Order *o, const int64_t *window, int64_t B, int64_t L, int64_t V, int64_t bos, F *out) {
    for (int64_t b = 0; b < B; b++, out += V) {
        int64_t ctx[MAX_ORDER];
        F tail[MAX_ORDER + 1];
        context(o, window + b * L, L, ctx, tail);
        const F *uni = static_cast<const F *>(o[0].logp);
        fill(out, uni, tail[0], V);
        for (int64_t k = 1; k <= L; k++) {  // the n-grams of order k + 1 continuing the order-k context
            int64_t c = ctx[k - 1];
            if (c < 0) continue;
            const F *p = static_cast<const F *>(o[k].logp);
            for (int64_t e = o[k - 1].first[c]; e < o[k - 1].first[c + 1]; e++) out[o[k].words[e]] = p[e] + tail[k];
        }
        out[bos] = -std::numeric_limits<F>::infinity();
    }
}

// rows' entry of one word per row: the longest listed n-gram (context, word), which is the one that writes
// it last in `rows`, so the same sum
template <typename F>
void pairs(const Order *o, const int64_t *window, const int64_t *word, int64_t B, int64_t L, int64_t bos, F *out) {
    for (int64_t b = 0; b < B; b++) {
        int64_t ctx[MAX_ORDER], w = word[b];
        F tail[MAX_ORDER + 1];
        context(o, window + b * L, L, ctx, tail);
        out[b] = tail[0] + static_cast<const F *>(o[0].logp)[w];
        for (int64_t k = L; k >= 1; k--) {
            int64_t e = child(o, static_cast<int>(k), ctx[k - 1], w);
            if (e >= 0) { out[b] = static_cast<const F *>(o[k].logp)[e] + tail[k]; break; }
        }
        if (w == bos) out[b] = -std::numeric_limits<F>::infinity();
    }
}

}  // namespace

namespace {

// The orders' tables (a tuple of (words, logp, backoff, first) per order, logp and backoff `item` bytes a
// number) into o, their buffers held in `keep` (released by the caller); false with an exception set.
bool read_orders(PyObject *orders, int64_t item, Order *o, Py_buffer *keep, int &held) {
    Py_ssize_t N = PyTuple_GET_SIZE(orders);
    if (N < 1 || N > MAX_ORDER) { PyErr_SetString(PyExc_ValueError, "dense: 1 to 64 orders"); return false; }
    for (Py_ssize_t k = 0; k < N; k++) {
        PyObject *t = PyTuple_GET_ITEM(orders, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
            PyErr_SetString(PyExc_TypeError, "dense: an order is a tuple (words, logp, backoff, first)");
            return false;
        }
        for (int i = 0; i < 4; i++)
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, i), &keep[held], PyBUF_C_CONTIGUOUS) != 0) return false;
            else held++;
        Py_buffer *a = keep + held - 4;
        o[k].words = static_cast<const int64_t *>(a[0].buf), o[k].size = a[0].len / 8;
        o[k].logp = a[1].buf, o[k].backoff = a[2].buf, o[k].backoffs = a[2].len / item;
        o[k].first = static_cast<const int64_t *>(a[3].buf);
        if (a[1].itemsize != item || a[1].len / item != o[k].size || (a[3].len != 0 && k + 1 == N)) {
            PyErr_SetString(PyExc_ValueError, "dense: an order's tables do not match");
            return false;
        }
    }
    return true;
}

// Every id of `ids` (n,) below V, and bos a word of the vocabulary (the unigrams); false with an exception set.
bool check_ids(const Order *o, const int64_t *ids, int64_t n, int64_t V, long long bos) {
    if (o[0].size != V || bos < 0 || bos >= V) {
        PyErr_SetString(PyExc_ValueError, "dense: the unigrams are not the vocabulary");
        return false;
    }
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= V) { PyErr_SetString(PyExc_IndexError, "dense: a word id past the vocabulary"); return false; }
    return true;
}

struct Held {  // the orders' buffers, released on every way out
    Py_buffer b[MAX_ORDER * 4];
    int n = 0;
    ~Held() {
        while (n-- > 0) PyBuffer_Release(&b[n]);
    }
};

}  // namespace

// dense_rows(window (B, L) int64, out (B, V) float32/64, orders: tuple of (words, logp, backoff, first) per
// order, first empty at the top, logp and backoff in out's dtype; bos)
PyObject *seqlm_dense_rows(PyObject *, PyObject *args) {
    PyObject *window, *out, *orders;
    long long bos;
    if (!PyArg_ParseTuple(args, "OOO!L", &window, &out, &PyTuple_Type, &orders, &bos)) return NULL;
    Buffers io;
    if (!io.get(window) || !io.get(out, true)) return NULL;
    int64_t item = io.b[1].itemsize, B = io.b[0].ndim == 2 ? io.b[0].shape[0] : 0, L = B ? io.b[0].shape[1] : 0;
    bool shapes = io.b[0].itemsize == 8 && io.b[1].ndim == 2 && io.b[1].shape[0] == B && L < PyTuple_GET_SIZE(orders);
    if (!shapes || (item != 4 && item != 8)) {
        PyErr_SetString(PyExc_ValueError, "dense_rows: window (B, L <= N - 1) int64, out (B, V) float32 or float64");
        return NULL;
    }
    Order o[MAX_ORDER];
    Held held;
    int64_t V = io.b[1].shape[1];
    if (!read_orders(orders, item, o, held.b, held.n) || !check_ids(o, io.i8(0), B * L, V, bos)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    // a large output is fresh memory: its 4 kB page faults took most of a call at B = 1024 (advance.json's
    // -thp rows, PyTorch's THP_MEM_ALLOC_ENABLE)
    advise_huge_pages(io.b[1].buf, static_cast<size_t>(io.b[1].len));
    if (item == 4) rows(o, io.i8(0), B, L, V, bos, static_cast<float *>(io.b[1].buf));
    else rows(o, io.i8(0), B, L, V, bos, static_cast<double *>(io.b[1].buf));
    Py_END_ALLOW_THREADS
    return Py_BuildValue("");
}

// dense_pairs(window (B, L) int64, words (B,) int64, out (B,) float32/64, orders, bos): dense_rows' entry
// out[b] = rows[b, words[b]], without the rest of the row (a decoder scoring the word a beam ends)
PyObject *seqlm_dense_pairs(PyObject *, PyObject *args) {
    PyObject *window, *words, *out, *orders;
    long long bos;
    if (!PyArg_ParseTuple(args, "OOOO!L", &window, &words, &out, &PyTuple_Type, &orders, &bos)) return NULL;
    Buffers io;
    if (!io.get(window) || !io.get(words) || !io.get(out, true)) return NULL;
    int64_t item = io.b[2].itemsize, B = io.b[0].ndim == 2 ? io.b[0].shape[0] : 0, L = B ? io.b[0].shape[1] : 0;
    bool shapes = io.b[0].itemsize == 8 && io.b[1].itemsize == 8 && io.len_i8(1) == B && io.b[2].len == B * item &&
                  L < PyTuple_GET_SIZE(orders);
    if (!shapes || (item != 4 && item != 8)) {
        PyErr_SetString(PyExc_ValueError, "dense_pairs: window (B, L <= N - 1) int64, words (B,) int64, out (B,) "
                        "float32 or float64");
        return NULL;
    }
    Order o[MAX_ORDER];
    Held held;
    if (!read_orders(orders, item, o, held.b, held.n)) return NULL;
    int64_t V = o[0].size;
    if (!check_ids(o, io.i8(0), B * L, V, bos) || !check_ids(o, io.i8(1), B, V, bos)) return NULL;
    for (int64_t b = 0; b < B; b++)
        if (io.i8(1)[b] < 0) { PyErr_SetString(PyExc_IndexError, "dense_pairs: a negative word id"); return NULL; }
    if (item == 4) pairs(o, io.i8(0), io.i8(1), B, L, bos, static_cast<float *>(io.b[2].buf));
    else pairs(o, io.i8(0), io.i8(1), B, L, bos, static_cast<double *>(io.b[2].buf));
    return Py_BuildValue("");
}
