// seqlm.data's compiled loop: a block of text lines to word ids, the twin of corpus.py's Python path
// (str.split() of every line, a dict lookup per word), tested against it on text with every kind of
// white space str.split() knows. Plain CPython API, no torch headers (built by data/native.py).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "_utf8_space.h"

namespace {

// The id of one word: table[word]; a new word gets id len(table) when `grow` (setdefault), else unk.
long word_id(PyObject *table, const char *a, Py_ssize_t n, int grow, long unk) {
    PyObject *w = PyUnicode_DecodeUTF8(a, n, "strict");
    if (!w) return -2;
    long id = unk;
    PyObject *v = PyDict_GetItemWithError(table, w);  // borrowed
    if (v) {
        id = PyLong_AsLong(v);
    } else if (PyErr_Occurred()) {
        id = -2;
    } else if (grow) {
        id = static_cast<long>(PyDict_Size(table));
        PyObject *num = PyLong_FromLong(id);
        if (!num || PyDict_SetItem(table, w, num) < 0) id = -2;
        Py_XDECREF(num);
    }
    Py_DECREF(w);
    return id;
}

// The ids of the words seen in this block, keyed by their bytes in it: the Python dict (and a str object)
// is consulted once per distinct word a block, not once per word (open addressing, FNV-1a).
class Seen {
    struct Slot {
        const unsigned char *word;
        Py_ssize_t length;
        long id;
    };
    std::vector<Slot> slots_ = std::vector<Slot>(1 << 16);
    size_t used_ = 0;

    static uint64_t hash(const unsigned char *a, Py_ssize_t n) {
        uint64_t h = 14695981039346656037ull;
        for (Py_ssize_t i = 0; i < n; i++) h = (h ^ a[i]) * 1099511628211ull;
        return h;
    }
    Slot &find(const unsigned char *a, Py_ssize_t n) {
        size_t mask = slots_.size() - 1, i = hash(a, n) & mask;
        while (slots_[i].word && (slots_[i].length != n || memcmp(slots_[i].word, a, n))) i = (i + 1) & mask;
        return slots_[i];
    }

  public:
    long id(PyObject *table, const unsigned char *a, Py_ssize_t n, int grow, long unk) {
        Slot &slot = find(a, n);
        if (slot.word) return slot.id;
        long id = word_id(table, reinterpret_cast<const char *>(a), n, grow, unk);
        if (id == -2) return id;
        slot = {a, n, id};
        if (2 * ++used_ > slots_.size()) {  // half full: twice the slots
            std::vector<Slot> old(slots_.size() * 2);
            old.swap(slots_);
            for (const Slot &s : old)
                if (s.word) find(s.word, s.length) = s;
        }
        return id;
    }
};

}  // namespace

static PyObject *encode_lines(PyObject *, PyObject *args) {
    // encode_lines(data, table, grow, unk, eos) -> (ids int32 bytes, ends int64 bytes): the words of every
    // non-blank line ('\n'-separated) of UTF-8 `data`, `eos` after each line's words; ends[i] is the offset
    // just past sentence i's eos.
    Py_buffer buf;
    PyObject *table;
    int grow;
    long unk, eos;
    if (!PyArg_ParseTuple(args, "y*O!pll", &buf, &PyDict_Type, &table, &grow, &unk, &eos)) return NULL;
    const unsigned char *p = static_cast<const unsigned char *>(buf.buf), *end = p + buf.len;
    std::vector<int32_t> ids;
    std::vector<int64_t> ends;
    ids.reserve(static_cast<size_t>(buf.len / 4));
    size_t sentence_start = 0;
    bool failed = false;
    Seen seen;
    while (p < end && !failed) {
        int s = space(p, end);
        if (s) {
            if (*p == '\n' && ids.size() > sentence_start) {
                ids.push_back(static_cast<int32_t>(eos));
                ends.push_back(static_cast<int64_t>(ids.size()));
                sentence_start = ids.size();
            }
            p += s;
            continue;
        }
        const unsigned char *a = p;
        while (p < end && !space(p, end)) p++;
        long id = seen.id(table, a, p - a, grow, unk);
        failed = id == -2;
        ids.push_back(static_cast<int32_t>(id));
    }
    if (!failed && ids.size() > sentence_start) {  // the last line, without its newline
        ids.push_back(static_cast<int32_t>(eos));
        ends.push_back(static_cast<int64_t>(ids.size()));
    }
    PyBuffer_Release(&buf);
    if (failed) return NULL;
    static const char none[1] = {0};  // y# turns a NULL pointer (an empty vector's data) into None
    auto bytes = [](const void *p, size_t n) { return n ? static_cast<const char *>(p) : none; };
    return Py_BuildValue("(y#y#)", bytes(ids.data(), ids.size()), static_cast<Py_ssize_t>(ids.size() * 4),
                         bytes(ends.data(), ends.size()), static_cast<Py_ssize_t>(ends.size() * 8));
}

static PyMethodDef methods[] = {
    {"encode_lines", encode_lines, METH_VARARGS, "encode_lines(data, table, grow, unk, eos) -> (ids, ends)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_seqlm_tokens", NULL, -1, methods};

PyMODINIT_FUNC PyInit__seqlm_tokens(void) { return PyModule_Create(&module); }
