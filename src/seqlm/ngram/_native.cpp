// seqlm.ngram's compiled loops, each the twin of a Python or numpy version it is tested against:
// - Scorer: scalar.py's per-token walk (ScalarScorer.score: the same probes and back-offs; _scorer.h), one
//   token per call (score), a sentence (walk) or a whole stream of them (stream); kenlm.Model's calls on it
//   (base_score, full_scores, sentence_score, kenlm_score, kenlm_full_scores) in _kenlm_calls.cpp, with
//   the State they read and write (_state.cpp);
// - ARPA text (assemble, arpa_lines, float32_texts): in _arpa_text.cpp, registered here.
// - radix_sort of n-gram keys and sorted_runs (the runs of equal keys after it): in _sort.cpp, registered here.
// - bounded counting's chunk_keys and merge_runs: in _count.cpp, registered here.
// Built on first use by torch.utils.cpp_extension (native.py); plain CPython API, no torch headers.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_scorer.h"
#include "_state.h"

// Insert key index h into o->ent by linear probing kept in home order (Robin Hood: an entry whose home lies
// past the one being placed gives up its slot and is placed further on), so that probe_entry can stop early.
// 0 when placed; -1 when a run reached the table's last slot (which must stay empty: probes do not wrap).
static int place_entry(Order *o, Py_ssize_t h) {
    Entry in = {o->keys[h], (uint32_t)h, o->probs[h]};
    uint64_t home = entry_home(o, in.key);
    for (uint64_t pos = home; pos + 1 < (uint64_t)o->nent; pos++) {
        Entry *e = &o->ent[pos];
        if (e->row == EMPTY) { *e = in; return 0; }
        uint64_t theirs = entry_home(o, e->key);
        if (theirs > home) {
            Entry out = *e;
            *e = in;
            in = out;
            home = theirs;
        }
    }
    return -1;
}

// Fill o->ent from keys/probs, when `wanted` (place_entry: a tail past the home slots, grown until the last
// run fits), and copy the back-offs beside it; an order without an entry table probes `slots` and reads the
// back-offs where the model has them (mapped from its file: shared between processes).
static int build_entries(Order *o, int wanted) {
    table_free(o->ent);
    table_free(o->own);  // (init has pointed `backoff` at the model's array again)
    o->ent = NULL;
    o->own = NULL;
    o->nent = o->nhome = 0;
    if (!wanted || o->nkeys >= (Py_ssize_t)EMPTY) return 0;
    o->nhome = o->nkeys + o->nkeys / 2 + 1;
    for (Py_ssize_t tail = 64;; tail *= 4) {
        o->nent = o->nhome + tail;
        if (!(o->ent = (Entry *)table_alloc(sizeof(Entry) * (size_t)o->nent))) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = 0; i < o->nent; i++) o->ent[i].row = EMPTY;
        Py_ssize_t h = 0;
        while (h < o->nkeys && place_entry(o, h) == 0) h++;
        if (h == o->nkeys) break;
        table_free(o->ent);
    }
    // the back-offs are read at random too: into table_alloc's pages with the entries (a sixth of their size)
    if (!(o->own = (float *)table_alloc(sizeof(float) * (size_t)o->nbackoff))) { PyErr_NoMemory(); return -1; }
    memcpy(o->own, o->backoff, sizeof(float) * (size_t)o->nbackoff);
    o->backoff = o->own;
    return 0;
}

PyObject *WORDS;

static const void *buffer_of(PyObject *a, Py_ssize_t itemsize, Py_ssize_t *count) {
    Py_buffer view;
    if (PyObject_GetBuffer(a, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    const void *p = view.buf;
    *count = view.len / itemsize;
    PyBuffer_Release(&view);  // `owners` keeps the array (and so its memory) alive
    return p;
}

static int Scorer_init(Scorer *self, PyObject *args, PyObject *kw) {
    // Scorer(V, cut, unigram f4, orders [(keys i8, probs f4, backoff f4, slots, slot itemsize, bits)], stoi, unk
    //        [, bos, eos, closed, entries])
    long long V;
    PyObject *unigram, *orders, *stoi;
    int entries = 1;
    self->bos = self->eos = -1;
    self->closed = 0;
    if (!PyArg_ParseTuple(args, "LiOO!O!l|llpp", &V, &self->cut, &unigram, &PyList_Type, &orders, &PyDict_Type,
                          &stoi, &self->unk, &self->bos, &self->eos, &self->closed, &entries))
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(orders), count;
    if (n > MAX_ORDERS) { PyErr_SetString(PyExc_ValueError, "too many orders"); return -1; }
    self->V = V;
    self->n = 0;  // set once every order is in place; unigram NULL marks a scorer not (fully) initialised
    self->unigram = NULL;
    Py_INCREF(stoi);
    Py_XSETREF(self->stoi, stoi);
    if (lexicon_build(&self->lexicon, stoi) < 0) return -1;
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
        if (build_entries(o, entries) < 0) return -1;
        PyObject *four = PyTuple_Pack(4, keys, probs, backoff, slots);
        if (!four || PyList_Append(self->owners, four) < 0) { Py_XDECREF(four); return -1; }
        Py_DECREF(four);
    }
    self->n = (int)n;
    self->unigram = uni;
    return 0;
}

static void Scorer_dealloc(Scorer *self) {
    for (int k = 0; k < MAX_ORDERS; k++) {
        table_free(self->ord[k].ent);
        table_free(self->ord[k].own);
    }
    lexicon_free(&self->lexicon);
    Py_XDECREF(self->stoi);
    Py_XDECREF(self->owners);
    Py_TYPE(self)->tp_free((PyObject *)self);
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

// The sentences of a stream walked LANES at a time (lane g takes those starting in [g T, (g + 1) T) / LANES).
// A lane begins its next token (the probes' prefetches) as soon as it finishes one, so that every prefetch
// has a whole round of the other lanes' work to arrive in: begin all and then finish all left the first
// lanes' loads waiting (the profile put 70% of the walk on the entry load).
static int begin_next(const Scorer *s, Token *x, const int64_t *ids, const uint8_t *starts, Py_ssize_t t, int64_t bos) {
    if (starts[t]) { x->ctx[0] = bos; x->n = 1; }
    x->word = ids[t];
    return begin(s, x);
}

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
    for (int g = 0; g < LANES; g++)
        if (at[g] < end[g] && begin_next(s, &lane[g], ids, starts, at[g], bos) < 0) return -1;
    for (int busy = 1; busy;) {
        busy = 0;
        for (int g = 0; g < LANES; g++)
            if (at[g] < end[g]) gather(s, &lane[g]);
        for (int g = 0; g < LANES; g++) {
            if (at[g] >= end[g]) continue;
            int length;
            finish(s, &lane[g], &logp[at[g]], &length);
            lengths[at[g]++] = length;
            busy = 1;
            if (at[g] < end[g] && begin_next(s, &lane[g], ids, starts, at[g], bos) < 0) return -1;
        }
    }
    return 0;
}

// The first token of each non-empty sentence of `starts` (S + 1,) set in `mask` (T,); -1 if they are not
// non-decreasing within [0, T].
static int start_mask(const int64_t *starts, Py_ssize_t S1, Py_ssize_t T, uint8_t *mask) {
    memset(mask, 0, (size_t)T);
    for (Py_ssize_t i = 0; i < S1; i++) {
        if (starts[i] < 0 || starts[i] > T || (i > 0 && starts[i] < starts[i - 1])) return -1;
        if (i > 0 && starts[i] > starts[i - 1]) mask[starts[i - 1]] = 1;
    }
    return 0;
}

static PyObject *Scorer_stream(Scorer *self, PyObject *args) {
    // stream(ids i8 (N,), starts i8 (S + 1,), bos, logp f8 (N,) out, length i8 (N,) out): sentences laid end
    // to end (sentence i is ids[starts[i] : starts[i + 1]]), the context reset to <s> where one begins; the
    // whole walk without a Python step per token
    PyObject *a[4];
    long long bos;
    Py_buffer b[4];
    int got = 0, bad = 1;
    if (!PyArg_ParseTuple(args, "OOLOO", &a[0], &a[1], &bos, &a[2], &a[3])) return NULL;
    for (; got < 4; got++)
        if (PyObject_GetBuffer(a[got], &b[got], PyBUF_C_CONTIGUOUS | (got < 2 ? 0 : PyBUF_WRITABLE)) < 0) break;
    if (got == 4) {
        Py_ssize_t T = b[0].len / 8;
        uint8_t *mask = (uint8_t *)malloc(T ? (size_t)T : 1);
        if (b[1].len % 8 || b[2].len != T * 8 || b[3].len != T * 8)
            PyErr_SetString(PyExc_ValueError, "stream: arrays of different lengths");
        else if (!mask)
            PyErr_NoMemory();
        else if (start_mask((const int64_t *)b[1].buf, b[1].len / 8, T, mask) < 0)
            PyErr_SetString(PyExc_ValueError, "stream: sentence starts out of order or range");
        else
            bad = walk_lanes(self, (const int64_t *)b[0].buf, mask, T, bos, (double *)b[2].buf, (int64_t *)b[3].buf);
        free(mask);
    }
    while (got-- > 0) PyBuffer_Release(&b[got]);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Scorer_entry_bytes(Scorer *self, PyObject *) {
    // the memory the entry tables and their back-off copies hold (build_entries), 0 without them
    long long total = 0;
    for (int k = 0; k < self->n; k++) {
        const Order *o = &self->ord[k];
        total += (long long)o->nent * (long long)sizeof(Entry) + (o->own ? 4LL * o->nbackoff : 0);
    }
    return PyLong_FromLongLong(total);
}

static PyMethodDef Scorer_methods[] = {
    {"score", (PyCFunction)Scorer_score, METH_VARARGS, "score(context, word) -> (log10 p, length, context after)"},
    {"walk", (PyCFunction)Scorer_walk, METH_VARARGS, "walk(context, ids) -> (log10 p list, lengths, context after)"},
    {"full_scores", (PyCFunction)Scorer_full_scores, METH_VARARGS, "full_scores(context, words, eos)"},
    {"sentence_score", (PyCFunction)Scorer_sentence_score, METH_VARARGS, "sentence_score(context, words, eos)"},
    {"stream", (PyCFunction)Scorer_stream, METH_VARARGS, "stream(ids, starts, bos, logp out, length out)"},
    {"base_score", (PyCFunction)(void (*)(void))Scorer_base_score, METH_FASTCALL, "kenlm's BaseScore"},
    {"entry_bytes", (PyCFunction)Scorer_entry_bytes, METH_NOARGS, "bytes held by the entry tables"},
    {"encode", (PyCFunction)Scorer_encode, METH_O, "encode(sentences) -> (ids, starts) as int64 bytes"},
    {"kenlm_score", (PyCFunction)(void (*)(void))Scorer_kenlm_score, METH_FASTCALL | METH_KEYWORDS,
     "kenlm.Model.score(sentence, bos=True, eos=True)"},
    {"kenlm_full_scores", (PyCFunction)(void (*)(void))Scorer_kenlm_full_scores, METH_FASTCALL | METH_KEYWORDS,
     "kenlm.Model.full_scores(sentence, bos=True, eos=True)"},
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
PyObject *seqlm_sorted_runs(PyObject *, PyObject *);
// _count.cpp
PyObject *seqlm_chunk_keys(PyObject *, PyObject *);
PyObject *seqlm_merge_runs(PyObject *, PyObject *);
// _dense.cpp
PyObject *seqlm_dense_rows(PyObject *, PyObject *);
PyObject *seqlm_dense_pairs(PyObject *, PyObject *);

static PyMethodDef module_methods[] = {
    {"assemble", seqlm_assemble, METH_VARARGS, "assemble(buf, start, length) -> the pieces joined, as bytes"},
    {"arpa_lines", seqlm_arpa_lines, METH_VARARGS, "arpa_lines(words, k, prob, backoff, text, start, length)"},
    {"float32_texts", seqlm_float32_texts, METH_VARARGS, "float32_texts(values) -> each text and a newline"},
    {"radix_sort", seqlm_radix_sort, METH_VARARGS, "radix_sort(key, scratch, perm or None, perm scratch)"},
    {"sorted_runs", seqlm_sorted_runs, METH_VARARGS, "sorted_runs(work, bits, perm, uniq, first, count, inverse) -> M"},
    {"chunk_keys", seqlm_chunk_keys, METH_VARARGS, "chunk_keys(ids, starts, bos, k, V, rank, key, at) -> P"},
    {"merge_runs", seqlm_merge_runs, METH_VARARGS, "merge_runs(parts, keys, counts, suffix, maps, base, fields) -> M"},
    {"dense_rows", seqlm_dense_rows, METH_VARARGS, "dense_rows(window, out, orders, bos): advance.py's rows"},
    {"dense_pairs", seqlm_dense_pairs, METH_VARARGS, "dense_pairs(window, words, out, orders, bos): their entries"},
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
    if (add_state_type(m) < 0) return NULL;
    return m;
}
