// seqlm.ngram's compiled loops, each the twin of a Python or numpy version it is tested against:
// - Scorer: scalar.py's per-token walk (ScalarScorer.score: the same probes and back-offs), one token per
//   call (score, base_score), a sentence (walk) or a whole stream of them (stream);
// - ARPA text (assemble, arpa_lines, float32_texts): in _arpa_text.cpp, registered here.
// - radix_sort of n-gram keys: in _sort.cpp, registered here.
// Built on first use by torch.utils.cpp_extension (native.py); plain CPython API, no torch headers.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_ORDERS 63  // orders above the unigrams (NGramModel allows N <= 64)
#define LANES 16       // sentences `stream` walks side by side, so that their cache misses overlap

typedef struct {
    const int64_t *keys;  // (M,) sorted trie keys of this order
    const float *probs;   // (M,) log10 p
    const float *backoff; // back-off of the order below (the context's)
    const void *slots;    // hash slots (index.py), int32 or int64
    Py_ssize_t nkeys, nbackoff, nslots;
    int slot64, shift;
    uint64_t mask;
} Order;

typedef struct {
    PyObject_HEAD
    int64_t V;
    int n, cut;            // orders above the unigrams (N-1); a state keeps at most `cut` ids
    const float *unigram;  // (V,)
    PyObject *stoi;        // word -> id (BaseScore)
    long unk;
    PyObject *owners;      // the arrays the pointers point into, kept alive
    Order ord[MAX_ORDERS];
} Scorer;

static PyObject *WORDS;  // interned "words": the State attribute

static const void *buffer_of(PyObject *a, Py_ssize_t itemsize, Py_ssize_t *count) {
    Py_buffer view;
    if (PyObject_GetBuffer(a, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    const void *p = view.buf;
    *count = view.len / itemsize;
    PyBuffer_Release(&view);  // `owners` keeps the array (and so its memory) alive
    return p;
}

static int Scorer_init(Scorer *self, PyObject *args, PyObject *kw) {
    // Scorer(V, cut, unigram f4, orders [(keys i8, probs f4, backoff f4, slots, slot itemsize, bits)], stoi, unk)
    long long V;
    PyObject *unigram, *orders, *stoi;
    if (!PyArg_ParseTuple(args, "LiOO!O!l", &V, &self->cut, &unigram, &PyList_Type, &orders, &PyDict_Type, &stoi,
                          &self->unk))
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(orders), count;
    if (n > MAX_ORDERS) { PyErr_SetString(PyExc_ValueError, "too many orders"); return -1; }
    self->V = V;
    self->n = 0;  // set once every order is in place; unigram NULL marks a scorer not (fully) initialised
    self->unigram = NULL;
    Py_INCREF(stoi);
    Py_XSETREF(self->stoi, stoi);
    Py_XSETREF(self->owners, PyList_New(0));
    if (!self->owners || PyList_Append(self->owners, unigram) < 0) return -1;
    const float *uni = (const float *)buffer_of(unigram, 4, &count);
    if (!uni) return -1;
    if (count != V) { PyErr_SetString(PyExc_ValueError, "unigram size"); return -1; }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *keys, *probs, *backoff, *slots;
        int itemsize, bits;
        Order *o = &self->ord[k];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(orders, k), "OOOOii", &keys, &probs, &backoff, &slots, &itemsize,
                              &bits))
            return -1;
        Py_ssize_t nprobs;
        if (!(o->keys = (const int64_t *)buffer_of(keys, 8, &o->nkeys))) return -1;
        if (!(o->probs = (const float *)buffer_of(probs, 4, &nprobs))) return -1;
        if (!(o->backoff = (const float *)buffer_of(backoff, 4, &o->nbackoff))) return -1;
        if (!(o->slots = buffer_of(slots, itemsize, &o->nslots))) return -1;
        if (nprobs != o->nkeys || (itemsize != 4 && itemsize != 8) || bits < 1 || bits > 63) {
            PyErr_SetString(PyExc_ValueError, "inconsistent n-gram tables");
            return -1;
        }
        o->slot64 = itemsize == 8;
        o->shift = 64 - bits;
        o->mask = ((uint64_t)1 << bits) - 1;
        PyObject *four = PyTuple_Pack(4, keys, probs, backoff, slots);
        if (!four || PyList_Append(self->owners, four) < 0) { Py_XDECREF(four); return -1; }
        Py_DECREF(four);
    }
    self->n = (int)n;
    self->unigram = uni;
    return 0;
}

static void Scorer_dealloc(Scorer *self) {
    Py_XDECREF(self->stoi);
    Py_XDECREF(self->owners);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline int64_t slot_at(const Order *o, uint64_t pos) {
    return o->slot64 ? ((const int64_t *)o->slots)[pos] : ((const int32_t *)o->slots)[pos];
}

// The id of key q among o's keys, its probe begun at `pos` holding `hit`; -1 if absent (or the table is corrupt).
static inline int64_t probe(const Order *o, int64_t q, uint64_t pos, int64_t hit) {
    for (;;) {
        if (hit < 0 || hit >= o->nkeys) return -1;
        if (o->keys[hit] == q) return hit;
        if ((Py_ssize_t)++pos >= o->nslots) return -1;
        hit = slot_at(o, pos);
    }
}

// One token in flight: the word, its context (ids at orders 1..n) and its probes. The orders' probes do
// not depend on each other (each needs only its own context id), so a token's memory reads are issued in
// rounds (begin: home slots; gather: keys, values, back-offs; finish: the walk), and `stream` runs the
// rounds over several sentences at once, so that their cache misses overlap.
typedef struct {
    int64_t word, ctx[MAX_ORDERS + 1];
    int n;
    uint64_t pos[MAX_ORDERS];
    int64_t hit[MAX_ORDERS];
} Token;

static int begin(const Scorer *s, Token *x) {
    if (!s->unigram) { PyErr_SetString(PyExc_RuntimeError, "Scorer is not initialised"); return -1; }
    if (x->word < 0 || x->word >= s->V) { PyErr_SetString(PyExc_IndexError, "word id out of range"); return -1; }
    if (x->n > s->n) x->n = s->n;
    __builtin_prefetch(s->unigram + x->word);
    for (int k = 0; k < x->n; k++) {
        const Order *o = &s->ord[k];
        int64_t c = x->ctx[k];
        if (c < 0) continue;
        if (c >= o->nbackoff) { PyErr_SetString(PyExc_IndexError, "context id out of range"); return -1; }
        x->pos[k] = (((uint64_t)(c * s->V + x->word) * 0x9E3779B97F4A7C15ULL) >> o->shift) & o->mask;
        __builtin_prefetch(o->slot64 ? (const void *)((const int64_t *)o->slots + x->pos[k])
                                     : (const void *)((const int32_t *)o->slots + x->pos[k]));
    }
    return 0;
}

static void gather(const Scorer *s, Token *x) {
    for (int k = 0; k < x->n; k++) {
        const Order *o = &s->ord[k];
        if (x->ctx[k] < 0) continue;
        int64_t h = x->hit[k] = x->pos[k] < (uint64_t)o->nslots ? slot_at(o, x->pos[k]) : -1;
        if (h >= 0 && h < o->nkeys) {
            __builtin_prefetch(o->keys + h);
            __builtin_prefetch(o->probs + h);
        } else {
            __builtin_prefetch(o->backoff + x->ctx[k]);  // an empty home slot: a miss, its back-off counts
        }
    }
}

// log10 p and the matched length; x->ctx becomes the context after the word (cut to the matched length).
static void finish(const Scorer *s, Token *x, double *logp, int *length) {
    int64_t after[MAX_ORDERS + 1];
    int len = 1;
    after[0] = x->word;
    for (int k = 0; k < x->n; k++) {
        int64_t c = x->ctx[k];
        after[k + 1] = c >= 0 ? probe(&s->ord[k], c * s->V + x->word, x->pos[k], x->hit[k]) : -1;
        if (after[k + 1] >= 0) len = k + 2;
    }
    // the longest match's log10 p plus the back-offs of the contexts above it, added in the same order as
    // score_word (which also adds those below and then overwrites them): the same double, fewer reads
    double lp = len > 1 ? (double)s->ord[len - 2].probs[after[len - 1]] : (double)s->unigram[x->word];
    for (int k = len - 1; k < x->n; k++)
        if (x->ctx[k] >= 0) lp += s->ord[k].backoff[x->ctx[k]];
    *logp = lp;
    *length = len;
    x->n = len < s->cut ? len : s->cut;
    for (int i = 0; i < x->n; i++) x->ctx[i] = after[i];
}

static int step(const Scorer *s, Token *x, double *logp, int *length) {
    if (begin(s, x) < 0) return -1;
    gather(s, x);
    finish(s, x, logp, length);
    return 0;
}

static int read_context(PyObject *t, int64_t *ctx, int *n, int limit) {
    if (!PyTuple_Check(t)) { PyErr_SetString(PyExc_TypeError, "a state's words must be a tuple"); return -1; }
    Py_ssize_t len = PyTuple_GET_SIZE(t);
    *n = (int)(len < limit ? len : limit);
    for (int i = 0; i < *n; i++) {
        ctx[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (ctx[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static PyObject *make_context(const int64_t *after, int m) {
    PyObject *t = PyTuple_New(m);
    for (int i = 0; t && i < m; i++) {
        PyObject *v = PyLong_FromLongLong(after[i]);
        if (!v) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}


static PyObject *Scorer_score(Scorer *self, PyObject *args) {
    PyObject *context;
    long long word;
    Token x;
    int length;
    double logp;
    if (!PyArg_ParseTuple(args, "OL", &context, &word) || read_context(context, x.ctx, &x.n, self->n) < 0) return NULL;
    x.word = word;
    if (step(self, &x, &logp, &length) < 0) return NULL;
    PyObject *out = make_context(x.ctx, x.n);
    return out ? Py_BuildValue("(diN)", logp, length, out) : NULL;
}

static PyObject *Scorer_walk(Scorer *self, PyObject *args) {
    // walk(context, ids list) -> (log10 p list, length list, context after the last id)
    PyObject *context, *ids, *out;
    Token x;
    int length;
    double logp;
    if (!PyArg_ParseTuple(args, "OO!", &context, &PyList_Type, &ids) || read_context(context, x.ctx, &x.n, self->n) < 0)
        return NULL;
    Py_ssize_t T = PyList_GET_SIZE(ids);
    PyObject *probs = PyList_New(T), *lengths = PyList_New(T);
    if (!probs || !lengths) goto fail;
    for (Py_ssize_t t = 0; t < T; t++) {
        x.word = PyLong_AsLongLong(PyList_GET_ITEM(ids, t));
        if (x.word == -1 && PyErr_Occurred()) goto fail;
        if (step(self, &x, &logp, &length) < 0) goto fail;
        PyList_SET_ITEM(probs, t, PyFloat_FromDouble(logp));
        PyList_SET_ITEM(lengths, t, PyLong_FromLong(length));
    }
    out = make_context(x.ctx, x.n);
    if (!out) goto fail;
    return Py_BuildValue("(NNN)", probs, lengths, out);
fail:
    Py_XDECREF(probs);
    Py_XDECREF(lengths);
    return NULL;
}

static PyObject *Scorer_base_score(Scorer *self, PyObject *const *args, Py_ssize_t nargs) {
    // kenlm's BaseScore(in_state, word, out_state) entire: the word looked up, out_state.words set
    Token x;
    int length;
    double logp;
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "BaseScore takes in_state, word, out_state"); return NULL; }
    PyObject *id = PyDict_GetItemWithError(self->stoi, args[1]);
    x.word = self->unk;
    if (id) {
        if ((x.word = PyLong_AsLongLong(id)) == -1 && PyErr_Occurred()) return NULL;
    } else if (PyErr_Occurred()) {
        return NULL;
    } else if (!PyUnicode_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "Argument 'word' has incorrect type (expected str, got %s)",
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    PyObject *words = PyObject_GetAttr(args[0], WORDS);
    if (!words) return NULL;
    int bad = read_context(words, x.ctx, &x.n, self->n);
    Py_DECREF(words);
    if (bad < 0 || step(self, &x, &logp, &length) < 0) return NULL;
    PyObject *out = make_context(x.ctx, x.n);
    if (!out) return NULL;
    bad = PyObject_SetAttr(args[2], WORDS, out);
    Py_DECREF(out);
    return bad < 0 ? NULL : PyFloat_FromDouble(logp);
}

static PyObject *Scorer_full_scores(Scorer *self, PyObject *args) {
    // full_scores(context, words list of str, eos id or -1) -> [(log10 p, length, oov)]: kenlm's
    // full_scores on a split sentence, each word looked up here (unknown: <unk>, oov; a literal <unk> too)
    PyObject *context, *words, *out;
    long long eos;
    Token x;
    int length;
    double logp;
    if (!PyArg_ParseTuple(args, "OO!L", &context, &PyList_Type, &words, &eos) ||
        read_context(context, x.ctx, &x.n, self->n) < 0)
        return NULL;
    Py_ssize_t T = PyList_GET_SIZE(words);
    if (!(out = PyList_New(T + (eos >= 0)))) return NULL;
    for (Py_ssize_t t = 0; t <= T; t++) {
        if (t == T && eos < 0) break;
        x.word = t == T ? eos : self->unk;
        if (t < T) {
            PyObject *id = PyDict_GetItemWithError(self->stoi, PyList_GET_ITEM(words, t));
            if (!id && PyErr_Occurred()) goto fail;
            if (id && (x.word = PyLong_AsLongLong(id)) == -1 && PyErr_Occurred()) goto fail;
        }
        PyObject *oov = t < T && x.word == self->unk ? Py_True : Py_False;
        if (step(self, &x, &logp, &length) < 0) goto fail;
        PyObject *item = PyTuple_New(3);
        if (!item) goto fail;
        PyList_SET_ITEM(out, t, item);  // `out` owns it from here, even half filled
        PyObject *p = PyFloat_FromDouble(logp), *n = PyLong_FromLong(length);
        if (!p || !n) { Py_XDECREF(p); Py_XDECREF(n); goto fail; }
        Py_INCREF(oov);
        PyTuple_SET_ITEM(item, 0, p);
        PyTuple_SET_ITEM(item, 1, n);
        PyTuple_SET_ITEM(item, 2, oov);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *Scorer_sentence_score(Scorer *self, PyObject *args) {
    // sentence_score(context, words list of str, eos id or -1) -> log10 P as kenlm.Model.score sums it:
    // each log10 p rounded to float32 and added in float32, one word after another
    PyObject *context, *words;
    long long eos;
    Token x;
    int length;
    double logp;
    float total = 0.0f;
    if (!PyArg_ParseTuple(args, "OO!L", &context, &PyList_Type, &words, &eos) ||
        read_context(context, x.ctx, &x.n, self->n) < 0)
        return NULL;
    Py_ssize_t T = PyList_GET_SIZE(words);
    for (Py_ssize_t t = 0; t < T + (eos >= 0); t++) {
        x.word = t == T ? eos : self->unk;
        if (t < T) {
            PyObject *id = PyDict_GetItemWithError(self->stoi, PyList_GET_ITEM(words, t));
            if (!id && PyErr_Occurred()) return NULL;
            if (id && (x.word = PyLong_AsLongLong(id)) == -1 && PyErr_Occurred()) return NULL;
        }
        if (step(self, &x, &logp, &length) < 0) return NULL;
        total += (float)logp;
    }
    return PyFloat_FromDouble(total);
}

// The sentences of a stream walked LANES at a time (lane g takes those starting in [g T, (g + 1) T) / LANES),
// each round advancing every lane by one token: begin all, gather all, finish all.
static int walk_lanes(const Scorer *s, const int64_t *ids, const uint8_t *starts, Py_ssize_t T, int64_t bos,
                      double *logp, int64_t *lengths) {
    Token lane[LANES];
    Py_ssize_t at[LANES], end[LANES];
    for (int g = 0; g < LANES; g++) {
        Py_ssize_t t = T * g / LANES;
        while (g > 0 && t < T && !starts[t]) t++;
        at[g] = t;
        lane[g].n = 0;
        if (g > 0) end[g - 1] = t;
    }
    end[LANES - 1] = T;
    for (int busy = 1; busy;) {
        busy = 0;
        for (int g = 0; g < LANES; g++) {
            if (at[g] >= end[g]) continue;
            Token *x = &lane[g];
            if (starts[at[g]]) { x->ctx[0] = bos; x->n = 1; }
            x->word = ids[at[g]];
            if (begin(s, x) < 0) return -1;
        }
        for (int g = 0; g < LANES; g++)
            if (at[g] < end[g]) gather(s, &lane[g]);
        for (int g = 0; g < LANES; g++) {
            if (at[g] >= end[g]) continue;
            int length;
            finish(s, &lane[g], &logp[at[g]], &length);
            lengths[at[g]++] = length;
            busy = 1;
        }
    }
    return 0;
}

static PyObject *Scorer_stream(Scorer *self, PyObject *args) {
    // stream(ids i8 (N,), starts u1 (N,), bos, logp f8 (N,) out, length i8 (N,) out): sentences laid end to
    // end, the context reset to <s> where starts is set; the whole walk without a Python step per token
    PyObject *a[4];
    long long bos;
    Py_buffer b[4];
    int got = 0, bad = 1;
    if (!PyArg_ParseTuple(args, "OOLOO", &a[0], &a[1], &bos, &a[2], &a[3])) return NULL;
    for (; got < 4; got++)
        if (PyObject_GetBuffer(a[got], &b[got], PyBUF_C_CONTIGUOUS | (got < 2 ? 0 : PyBUF_WRITABLE)) < 0) break;
    if (got == 4) {
        Py_ssize_t T = b[0].len / 8;
        if (b[1].len != T || b[2].len != T * 8 || b[3].len != T * 8)
            PyErr_SetString(PyExc_ValueError, "stream: arrays of different lengths");
        else
            bad = walk_lanes(self, (const int64_t *)b[0].buf, (const uint8_t *)b[1].buf, T, bos, (double *)b[2].buf,
                             (int64_t *)b[3].buf);
    }
    while (got-- > 0) PyBuffer_Release(&b[got]);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Scorer_methods[] = {
    {"score", (PyCFunction)Scorer_score, METH_VARARGS, "score(context, word) -> (log10 p, length, context after)"},
    {"walk", (PyCFunction)Scorer_walk, METH_VARARGS, "walk(context, ids) -> (log10 p list, lengths, context after)"},
    {"full_scores", (PyCFunction)Scorer_full_scores, METH_VARARGS, "full_scores(context, words, eos)"},
    {"sentence_score", (PyCFunction)Scorer_sentence_score, METH_VARARGS, "sentence_score(context, words, eos)"},
    {"stream", (PyCFunction)Scorer_stream, METH_VARARGS, "stream(ids, starts, bos, logp out, length out)"},
    {"base_score", (PyCFunction)(void (*)(void))Scorer_base_score, METH_FASTCALL, "kenlm's BaseScore"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScorerType = {
    PyVarObject_HEAD_INIT(NULL, 0) "_seqlm_native.Scorer", sizeof(Scorer), 0,
};

// _arpa_text.cpp
PyObject *seqlm_assemble(PyObject *, PyObject *);
PyObject *seqlm_arpa_lines(PyObject *, PyObject *);
PyObject *seqlm_float32_texts(PyObject *, PyObject *);
// _sort.cpp
PyObject *seqlm_radix_sort(PyObject *, PyObject *);

static PyMethodDef module_methods[] = {
    {"assemble", seqlm_assemble, METH_VARARGS, "assemble(buf, start, length) -> the pieces joined, as bytes"},
    {"arpa_lines", seqlm_arpa_lines, METH_VARARGS, "arpa_lines(words, k, prob, backoff, text, start, length)"},
    {"float32_texts", seqlm_float32_texts, METH_VARARGS, "float32_texts(values) -> each text and a newline"},
    {"radix_sort", seqlm_radix_sort, METH_VARARGS, "radix_sort(key, scratch, perm or None, perm scratch)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_seqlm_native", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__seqlm_native(void) {
    ScorerType.tp_flags = Py_TPFLAGS_DEFAULT;
    ScorerType.tp_new = PyType_GenericNew;
    ScorerType.tp_init = (initproc)Scorer_init;
    ScorerType.tp_dealloc = (destructor)Scorer_dealloc;
    ScorerType.tp_methods = Scorer_methods;
    if (PyType_Ready(&ScorerType) < 0) return NULL;
    WORDS = PyUnicode_InternFromString("words");
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ScorerType);
    if (PyModule_AddObject(m, "Scorer", (PyObject *)&ScorerType) < 0) return NULL;
    return m;
}
