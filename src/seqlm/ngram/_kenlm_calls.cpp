// kenlm.Model's calls on the compiled Scorer (_scorer.h): BaseScore on a State (_state.h) or anything with a
// `words` tuple, and whole sentences (full_scores, score) given as words or as the text itself.
#include <vector>

#include "../data/_utf8_space.h"
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
// TypeError (kenlm's BaseScore), else it is simply unknown. A str is looked up by its UTF-8 bytes.
static int64_t word_id(const Scorer *s, PyObject *word, int strict) {
    if (PyUnicode_CheckExact(word) && s->lexicon.slots) {
        Py_ssize_t n;
        const char *text = PyUnicode_AsUTF8AndSize(word, &n);
        if (text) {
            int64_t id = lexicon_find(&s->lexicon, (const unsigned char *)text, n);
            return id >= 0 ? id : s->unk;
        }
        PyErr_Clear();  // lone surrogates: stoi decides
    }
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

// The ids of a list of words; -1 with an exception set.
static int list_ids(const Scorer *s, PyObject *words, std::vector<int64_t> &ids) {
    Py_ssize_t T = PyList_GET_SIZE(words);
    ids.resize((size_t)T);
    for (Py_ssize_t t = 0; t < T; t++)
        if ((ids[t] = word_id(s, PyList_GET_ITEM(words, t), 0)) < 0 && PyErr_Occurred()) return -1;
    return 0;
}

// The UTF-8 of a str whose words the lexicon can look up; NULL, no error set, for a str without UTF-8 (lone
// surrogates) or a Scorer without a lexicon: split_ids then.
static const unsigned char *lexicon_text(const Scorer *s, PyObject *text, Py_ssize_t *n) {
    if (!s->lexicon.slots) return NULL;
    const char *p = PyUnicode_AsUTF8AndSize(text, n);
    if (!p) PyErr_Clear();
    return (const unsigned char *)p;
}

// The ids of a str's words by Python's split and stoi; -1 with an exception set.
static int split_ids(const Scorer *s, PyObject *text, std::vector<int64_t> &ids) {
    PyObject *words = PyUnicode_Split(text, NULL, -1);
    int bad = words ? list_ids(s, words, ids) : -1;
    Py_XDECREF(words);
    return bad;
}

// word(start, length) for each word of the UTF-8 text p[:n], split as str.split() splits it (_utf8_space.h).
template <typename Word>
static void for_each_word(const unsigned char *p, Py_ssize_t n, Word word) {
    for (const unsigned char *end = p + n; p < end;) {
        int skip = space(p, end);
        if (skip) { p += skip; continue; }
        const unsigned char *start = p;
        while (p < end && !space(p, end)) p++;
        word(start, p - start);
    }
}

// The ids of the words of a str, split as str.split() splits it; -1 with an exception set.
static int text_ids(const Scorer *s, PyObject *text, std::vector<int64_t> &ids) {
    Py_ssize_t n;
    const unsigned char *p = lexicon_text(s, text, &n);
    if (!p) return split_ids(s, text, ids);
    ids.clear();
    for_each_word(p, n, [&](const unsigned char *word, Py_ssize_t len) {
        int64_t id = lexicon_find(&s->lexicon, word, len);
        ids.push_back(id >= 0 ? id : s->unk);
    });
    return 0;
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

// (log10 p, length, oov) of each word id from x's context, then of `eos` when >= 0: kenlm's full_scores
// (unknown words: <unk>, oov; a literal <unk> too).
static PyObject *full_scores_from(const Scorer *self, Token *x, const std::vector<int64_t> &ids, long long eos) {
    int length;
    double logp;
    Py_ssize_t T = (Py_ssize_t)ids.size();
    PyObject *out = PyList_New(T + (eos >= 0));
    if (!out) return NULL;
    for (Py_ssize_t t = 0; t < T + (eos >= 0); t++) {
        x->word = t == T ? eos : ids[t];
        PyObject *oov = t < T && x->word == self->unk ? Py_True : Py_False;
        if (step(self, x, &logp, &length) < 0) break;
        PyObject *item = PyTuple_New(3), *p = PyFloat_FromDouble(logp), *n = PyLong_FromLong(length);
        if (!item || !p || !n) { Py_XDECREF(item); Py_XDECREF(p); Py_XDECREF(n); break; }
        Py_INCREF(oov);
        PyTuple_SET_ITEM(item, 0, p);  // built by hand: Py_BuildValue would parse its format every word
        PyTuple_SET_ITEM(item, 1, n);
        PyTuple_SET_ITEM(item, 2, oov);
        PyList_SET_ITEM(out, t, item);
    }
    if (!PyErr_Occurred()) return out;
    Py_DECREF(out);
    return NULL;
}

// log10 P of the word ids (then eos when >= 0) as kenlm.Model.score sums it: each log10 p rounded to float32
// and added in float32, one word after another.
static PyObject *sentence_score_from(const Scorer *self, Token *x, const std::vector<int64_t> &ids, long long eos) {
    int length;
    double logp;
    float total = 0.0f;
    Py_ssize_t T = (Py_ssize_t)ids.size();
    for (Py_ssize_t t = 0; t < T + (eos >= 0); t++) {
        x->word = t == T ? eos : ids[t];
        if (step(self, x, &logp, &length) < 0) return NULL;
        total += (float)logp;
    }
    return PyFloat_FromDouble(total);
}

// The arguments (context tuple, words list of str, eos id or -1) of full_scores and sentence_score: x's
// context, eos, the words' ids; -1 on error.
static int words_args(const Scorer *self, PyObject *args, Token *x, long long *eos, std::vector<int64_t> &ids) {
    PyObject *context, *words;
    if (!PyArg_ParseTuple(args, "OO!L", &context, &PyList_Type, &words, eos)) return -1;
    return read_context(context, x->ctx, &x->n, self->n) < 0 ? -1 : list_ids(self, words, ids);
}

PyObject *Scorer_full_scores(Scorer *self, PyObject *args) {
    // full_scores(context, words, eos) -> [(log10 p, length, oov)]
    Token x;
    long long eos;
    std::vector<int64_t> ids;
    return words_args(self, args, &x, &eos, ids) < 0 ? NULL : full_scores_from(self, &x, ids, eos);
}

PyObject *Scorer_sentence_score(Scorer *self, PyObject *args) {
    // sentence_score(context, words, eos) -> log10 P, summed as kenlm sums it
    Token x;
    long long eos;
    std::vector<int64_t> ids;
    return words_args(self, args, &x, &eos, ids) < 0 ? NULL : sentence_score_from(self, &x, ids, eos);
}

// kenlm.Model's arguments (sentence, bos=True, eos=True), positional or by name, without PyArg_Parse's
// format parsing (a call a sentence: it showed in the profile); 0, or -1 with a TypeError set.
static int parse_sentence(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **sentence,
                          int *bos, int *eos) {
    static const char *names[] = {"sentence", "bos", "eos"};
    PyObject *given[3] = {NULL, NULL, NULL};
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 3) { PyErr_SetString(PyExc_TypeError, "takes at most 3 arguments (sentence, bos, eos)"); return -1; }
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        int i = 0;
        while (i < 3 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, k), names[i]) != 0) i++;
        if (i == 3 || given[i]) {
            PyErr_Format(PyExc_TypeError, "%s keyword argument %R", i == 3 ? "unexpected" : "repeated",
                         PyTuple_GET_ITEM(kwnames, k));
            return -1;
        }
        given[i] = args[nargs + k];
    }
    if (!given[0]) { PyErr_SetString(PyExc_TypeError, "missing argument 'sentence'"); return -1; }
    *sentence = given[0];
    *bos = given[1] ? PyObject_IsTrue(given[1]) : 1;
    *eos = given[2] ? PyObject_IsTrue(given[2]) : 1;
    return *bos < 0 || *eos < 0 ? -1 : 0;
}

// kenlm.Model's (sentence, bos=True, eos=True): the ids of the sentence's words (str, or bytes in UTF-8, split
// as str.split() does), x's context <s> when bos (else none), the id of </s> when eos (else -1); -1 on error.
static int sentence_args(const Scorer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Token *x,
                         long long *eos, std::vector<int64_t> &ids) {
    PyObject *sentence;
    int bos, with_eos, bad;
    if (parse_sentence(args, nargs, kwnames, &sentence, &bos, &with_eos) < 0) return -1;
    if (self->bos < 0 || self->eos < 0) { PyErr_SetString(PyExc_RuntimeError, "no <s>/</s> ids given"); return -1; }
    if (PyUnicode_Check(sentence)) {
        bad = text_ids(self, sentence, ids);
    } else if (PyBytes_Check(sentence)) {
        PyObject *text = PyUnicode_FromEncodedObject(sentence, "utf-8", "strict");
        bad = text ? text_ids(self, text, ids) : -1;
        Py_XDECREF(text);
    } else {
        PyErr_Format(PyExc_TypeError, "Cannot convert %R to string", (PyObject *)Py_TYPE(sentence));
        return -1;
    }
    x->n = bos && self->n > 0;
    x->ctx[0] = self->bos;
    *eos = with_eos ? self->eos : -1;
    return bad;
}

// A walk over a sentence's ids from x's context: full_scores_from or sentence_score_from.
typedef PyObject *(*SentenceWalk)(const Scorer *, Token *, const std::vector<int64_t> &, long long);

static PyObject *on_sentence(Scorer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                             SentenceWalk walk) {
    Token x;
    long long eos;
    // one buffer for every call (the GIL is held), where an allocation a sentence was a measurable part of
    // kenlm.Model.score's few microseconds; a call made while it is in use (a str subclass's __eq__ scoring a
    // sentence, say) gets its own
    static std::vector<int64_t> shared;
    static bool busy = false;
    std::vector<int64_t> own;
    bool first = !busy;
    std::vector<int64_t> &ids = first ? shared : own;
    busy = true;
    PyObject *out = sentence_args(self, args, nargs, kwnames, &x, &eos, ids) < 0 ? NULL : walk(self, &x, ids, eos);
    if (first) busy = false;
    return out;
}

PyObject *Scorer_kenlm_full_scores(Scorer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    // kenlm.Model.full_scores(sentence, bos=True, eos=True): an iterator over (log10 p, length, oov)
    PyObject *out = on_sentence(self, args, nargs, kwnames, full_scores_from);
    PyObject *it = out ? PyObject_GetIter(out) : NULL;
    Py_XDECREF(out);
    return it;
}

PyObject *Scorer_kenlm_score(Scorer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    // kenlm.Model.score(sentence, bos=True, eos=True): log10 P summed in float32, as kenlm
    return on_sentence(self, args, nargs, kwnames, sentence_score_from);
}

// A corpus's words are looked up DEPTH words after their lexicon slot is prefetched, so that the slot misses
// of several words overlap (one at a time, each waited for its slot).
namespace {
constexpr int DEPTH = 8;
struct Pending {
    const unsigned char *p;
    Py_ssize_t n;
    uint64_t h;
    size_t at;  // where its id goes
};

class Lookups {
  public:
    Lookups(const Scorer *s, std::vector<int64_t> &ids) : s(s), ids(ids) {}
    void add(const unsigned char *p, Py_ssize_t n) {
        uint64_t h = lexicon_hash(p, n);
        __builtin_prefetch(&s->lexicon.slots[h & s->lexicon.mask]);
        if (used == DEPTH) resolve(ring[next]); else used++;
        ring[next] = {p, n, h, ids.size()};
        next = (next + 1) % DEPTH;
        ids.push_back(s->unk);
    }
    void flush() {
        for (int i = 0; i < used; i++) resolve(ring[(next + DEPTH - used + i) % DEPTH]);
        used = 0;
    }
  private:
    void resolve(const Pending &w) {
        int64_t id = lexicon_find_hashed(&s->lexicon, w.p, w.n, w.h);
        if (id >= 0) ids[w.at] = id;
    }
    const Scorer *s;
    std::vector<int64_t> &ids;
    Pending ring[DEPTH];
    int used = 0, next = 0;
};
}  // namespace

// A sentence's words appended to `ids` through `lookups`, or through split_ids (into `words`) where the
// lexicon cannot read the str; -1 with an exception set.
static int append_text(const Scorer *s, PyObject *text, std::vector<int64_t> &ids, Lookups &lookups,
                       std::vector<int64_t> &words) {
    Py_ssize_t n;
    const unsigned char *p = lexicon_text(s, text, &n);
    if (!p) {
        if (split_ids(s, text, words) < 0) return -1;
        ids.insert(ids.end(), words.begin(), words.end());
        return 0;
    }
    for_each_word(p, n, [&](const unsigned char *word, Py_ssize_t len) { lookups.add(word, len); });
    return 0;
}

PyObject *Scorer_encode(Scorer *self, PyObject *sentences) {
    // encode(list of str) -> (ids int64 bytes, starts int64 bytes): each sentence's words (str.split()) then
    // </s>, as NGramQuery.score_corpus lays them end to end; starts (S + 1,) where each begins
    if (!PyList_Check(sentences)) { PyErr_SetString(PyExc_TypeError, "encode takes a list of str"); return NULL; }
    if (self->eos < 0) { PyErr_SetString(PyExc_RuntimeError, "no </s> id given"); return NULL; }
    Py_ssize_t S = PyList_GET_SIZE(sentences);
    std::vector<int64_t> ids, words, starts(1, 0);
    starts.reserve((size_t)S + 1);
    Lookups lookups(self, ids);
    for (Py_ssize_t i = 0; i < S; i++) {
        PyObject *text = PyList_GET_ITEM(sentences, i);
        if (!PyUnicode_Check(text)) { PyErr_SetString(PyExc_TypeError, "encode takes a list of str"); return NULL; }
        if (append_text(self, text, ids, lookups, words) < 0) return NULL;
        ids.push_back(self->eos);
        starts.push_back((int64_t)ids.size());
    }
    lookups.flush();
    static const char none[1] = {0};  // y# turns a NULL pointer (an empty vector's data) into None
    return Py_BuildValue("(y#y#)", ids.empty() ? none : (const char *)ids.data(), (Py_ssize_t)(ids.size() * 8),
                         (const char *)starts.data(), (Py_ssize_t)(starts.size() * 8));
}
