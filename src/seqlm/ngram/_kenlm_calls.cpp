// kenlm.Model's calls on the compiled Scorer (_scorer.h): BaseScore on a State (_state.h) or anything with a
// `words` tuple, and whole sentences (full_scores, score) given as words or as the text itself.
#include "_scorer.h"
#include "_state.h"

// The context of a State (its ids held inline) or of anything with a `words` tuple, into ctx[:*n].
static int read_state(PyObject *st, int64_t *ctx, int *n, int limit) {
    if (PyObject_TypeCheck(st, &StateType) && ((StateObject *)st)->n >= 0) {
        const StateObject *o = (const StateObject *)st;
        *n = o->n < limit ? o->n : limit;
        memcpy(ctx, o->ids, sizeof(int64_t) * (size_t)*n);
        return 0;
    }
    PyObject *words = PyObject_GetAttr(st, WORDS);
    if (!words) return -1;
    int bad = read_context(words, ctx, n, limit);
    Py_DECREF(words);
    return bad;
}

// st.words = ids[:n]: in place in a State, else as a tuple.
static int write_state(PyObject *st, const int64_t *ids, int n) {
    if (PyObject_TypeCheck(st, &StateType) && n <= STATE_IDS) {
        StateObject *o = (StateObject *)st;
        Py_CLEAR(o->other);
        o->n = n;
        memcpy(o->ids, ids, sizeof(int64_t) * (size_t)n);
        return 0;
    }
    PyObject *out = make_context(ids, n);
    if (!out) return -1;
    int bad = PyObject_SetAttr(st, WORDS, out);
    Py_DECREF(out);
    return bad;
}

// The id of a word as kenlm maps it (unknown: <unk>); -1 with an exception set. `strict`: a non-str word is a
// TypeError (kenlm's BaseScore), else it is simply unknown.
static int64_t word_id(const Scorer *s, PyObject *word, int strict) {
    PyObject *id = PyDict_GetItemWithError(s->stoi, word);
    if (id) return PyLong_AsLongLong(id);
    if (PyErr_Occurred()) return -1;
    if (strict && !PyUnicode_Check(word)) {
        PyErr_Format(PyExc_TypeError, "Argument 'word' has incorrect type (expected str, got %s)",
                     Py_TYPE(word)->tp_name);
        return -1;
    }
    return s->unk;
}

PyObject *Scorer_base_score(Scorer *self, PyObject *const *args, Py_ssize_t nargs) {
    // kenlm's BaseScore(in_state, word, out_state) entire: the word looked up, out_state's context set
    Token x;
    int length;
    double logp;
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "BaseScore takes in_state, word, out_state"); return NULL; }
    if ((x.word = word_id(self, args[1], 1)) < 0 && PyErr_Occurred()) return NULL;
    if (read_state(args[0], x.ctx, &x.n, self->n) < 0 || step(self, &x, &logp, &length) < 0) return NULL;
    return write_state(args[2], x.ctx, x.n) < 0 ? NULL : PyFloat_FromDouble(logp);
}

// (log10 p, length, oov) of each word of the list `words` from x's context, then of `eos` when >= 0: kenlm's
// full_scores on a split sentence (unknown words: <unk>, oov; a literal <unk> too).
static PyObject *full_scores_from(const Scorer *self, Token *x, PyObject *words, long long eos) {
    int length;
    double logp;
    Py_ssize_t T = PyList_GET_SIZE(words);
    PyObject *out = PyList_New(T + (eos >= 0));
    if (!out) return NULL;
    for (Py_ssize_t t = 0; t < T + (eos >= 0); t++) {
        if ((x->word = t == T ? eos : word_id(self, PyList_GET_ITEM(words, t), 0)) < 0 && PyErr_Occurred()) break;
        PyObject *oov = t < T && x->word == self->unk ? Py_True : Py_False;
        if (step(self, x, &logp, &length) < 0) break;
        PyObject *item = Py_BuildValue("(diO)", logp, length, oov);
        if (!item) break;
        PyList_SET_ITEM(out, t, item);
    }
    if (!PyErr_Occurred()) return out;
    Py_DECREF(out);
    return NULL;
}

// log10 P of the words (then eos when >= 0) as kenlm.Model.score sums it: each log10 p rounded to float32 and
// added in float32, one word after another.
static PyObject *sentence_score_from(const Scorer *self, Token *x, PyObject *words, long long eos) {
    int length;
    double logp;
    float total = 0.0f;
    Py_ssize_t T = PyList_GET_SIZE(words);
    for (Py_ssize_t t = 0; t < T + (eos >= 0); t++) {
        if ((x->word = t == T ? eos : word_id(self, PyList_GET_ITEM(words, t), 0)) < 0 && PyErr_Occurred())
            return NULL;
        if (step(self, x, &logp, &length) < 0) return NULL;
        total += (float)logp;
    }
    return PyFloat_FromDouble(total);
}

PyObject *Scorer_full_scores(Scorer *self, PyObject *args) {
    // full_scores(context, words list of str, eos id or -1) -> [(log10 p, length, oov)]
    PyObject *context, *words;
    long long eos;
    Token x;
    if (!PyArg_ParseTuple(args, "OO!L", &context, &PyList_Type, &words, &eos) ||
        read_context(context, x.ctx, &x.n, self->n) < 0)
        return NULL;
    return full_scores_from(self, &x, words, eos);
}

PyObject *Scorer_sentence_score(Scorer *self, PyObject *args) {
    // sentence_score(context, words list of str, eos id or -1) -> log10 P, summed as kenlm sums it
    PyObject *context, *words;
    long long eos;
    Token x;
    if (!PyArg_ParseTuple(args, "OO!L", &context, &PyList_Type, &words, &eos) ||
        read_context(context, x.ctx, &x.n, self->n) < 0)
        return NULL;
    return sentence_score_from(self, &x, words, eos);
}

// kenlm.Model's (sentence, bos=True, eos=True): the words of the sentence (str, or bytes in UTF-8) split as
// str.split() does, x's context <s> when bos (else none), and the id of </s> when eos (else -1).
static PyObject *sentence_args(const Scorer *self, PyObject *args, PyObject *kw, Token *x, long long *eos) {
    static const char *names[] = {"sentence", "bos", "eos", NULL};
    PyObject *sentence, *text, *words;
    int bos = 1, with_eos = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|pp", (char **)names, &sentence, &bos, &with_eos)) return NULL;
    if (self->bos < 0 || self->eos < 0) { PyErr_SetString(PyExc_RuntimeError, "no <s>/</s> ids given"); return NULL; }
    if (PyUnicode_Check(sentence)) {
        words = PyUnicode_Split(sentence, NULL, -1);
    } else if (PyBytes_Check(sentence)) {
        if (!(text = PyUnicode_FromEncodedObject(sentence, "utf-8", "strict"))) return NULL;
        words = PyUnicode_Split(text, NULL, -1);
        Py_DECREF(text);
    } else {
        PyErr_Format(PyExc_TypeError, "Cannot convert %R to string", (PyObject *)Py_TYPE(sentence));
        return NULL;
    }
    x->n = bos && self->n > 0;
    x->ctx[0] = self->bos;
    *eos = with_eos ? self->eos : -1;
    return words;
}

PyObject *Scorer_kenlm_full_scores(Scorer *self, PyObject *args, PyObject *kw) {
    // kenlm.Model.full_scores(sentence, bos=True, eos=True): an iterator over (log10 p, length, oov)
    Token x;
    long long eos;
    PyObject *words = sentence_args(self, args, kw, &x, &eos);
    if (!words) return NULL;
    PyObject *out = full_scores_from(self, &x, words, eos), *it = out ? PyObject_GetIter(out) : NULL;
    Py_DECREF(words);
    Py_XDECREF(out);
    return it;
}

PyObject *Scorer_kenlm_score(Scorer *self, PyObject *args, PyObject *kw) {
    // kenlm.Model.score(sentence, bos=True, eos=True): log10 P summed in float32, as kenlm
    Token x;
    long long eos;
    PyObject *words = sentence_args(self, args, kw, &x, &eos);
    if (!words) return NULL;
    PyObject *out = sentence_score_from(self, &x, words, eos);
    Py_DECREF(words);
    return out;
}
