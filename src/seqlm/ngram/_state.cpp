// seqlm.kenlm.State (see _state.h): query.State's behaviour (a `words` attribute, equality and hash by it,
// copies, pickling) with the ids of an n-gram context held in the object, not in a tuple of Python ints.
#include "_state.h"

#include <string.h>

// words = value: a tuple of at most STATE_IDS ints goes inline; anything else is kept as the object.
static int set_words(StateObject *self, PyObject *value) {
    if (!value) { PyErr_SetString(PyExc_TypeError, "a State's words cannot be deleted"); return -1; }
    Py_CLEAR(self->other);
    if (PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) <= STATE_IDS) {
        int n = (int)PyTuple_GET_SIZE(value), i = 0;
        for (; i < n; i++) {
            PyObject *v = PyTuple_GET_ITEM(value, i);
            if (!PyLong_CheckExact(v)) break;
            int overflow;
            self->ids[i] = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow) break;
        }
        if (i == n) { self->n = n; return 0; }
    }
    Py_INCREF(value);
    self->other = value;
    self->n = -1;
    return 0;
}

static PyObject *get_words(StateObject *self, void *) {
    if (self->n < 0) { Py_INCREF(self->other); return self->other; }
    PyObject *t = PyTuple_New(self->n);
    for (int i = 0; t && i < self->n; i++) {
        PyObject *v = PyLong_FromLongLong(self->ids[i]);
        if (!v) { Py_CLEAR(t); break; }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static int State_setter(StateObject *self, PyObject *value, void *) { return set_words(self, value); }

static int State_init(StateObject *self, PyObject *args, PyObject *kw) {
    static const char *names[] = {"words", NULL};
    PyObject *words = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:State", (char **)names, &words)) return -1;
    if (words) return set_words(self, words);
    Py_CLEAR(self->other);
    self->n = 0;  // kenlm's fresh State: no context
    return 0;
}

static PyObject *State_new(PyTypeObject *type, PyObject *, PyObject *) {
    StateObject *self = (StateObject *)type->tp_alloc(type, 0);  // zeroed: no context, no object
    return (PyObject *)self;
}

static int State_traverse(StateObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->other);
    return 0;
}

static int State_clear(StateObject *self) {
    Py_CLEAR(self->other);
    return 0;
}

static void State_dealloc(StateObject *self) {
    PyObject_GC_UnTrack(self);
    State_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *State_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, &StateType)) Py_RETURN_NOTIMPLEMENTED;
    StateObject *x = (StateObject *)a, *y = (StateObject *)b;
    if (x->n >= 0 && y->n >= 0) {
        int eq = x->n == y->n && memcmp(x->ids, y->ids, sizeof(int64_t) * (size_t)x->n) == 0;
        return PyBool_FromLong(op == Py_EQ ? eq : !eq);
    }
    PyObject *u = get_words(x, NULL), *v = u ? get_words(y, NULL) : NULL;
    PyObject *out = v ? PyObject_RichCompare(u, v, op) : NULL;
    Py_XDECREF(u);
    Py_XDECREF(v);
    return out;
}

static Py_hash_t State_hash(StateObject *self) {
    PyObject *w = get_words(self, NULL);  // the tuple's hash, as query.State: equal words, equal hashes
    if (!w) return -1;
    Py_hash_t h = PyObject_Hash(w);
    Py_DECREF(w);
    return h;
}

static PyObject *State_repr(StateObject *self) {
    PyObject *w = get_words(self, NULL);
    if (!w) return NULL;
    PyObject *out = PyUnicode_FromFormat("State(words=%R)", w);
    Py_DECREF(w);
    return out;
}

static PyObject *State_copy(StateObject *self, PyObject *) {
    StateObject *c = (StateObject *)Py_TYPE(self)->tp_alloc(Py_TYPE(self), 0);
    if (!c) return NULL;
    c->n = self->n;
    memcpy(c->ids, self->ids, sizeof c->ids);
    Py_XINCREF(self->other);  // immutable contents (a tuple, or a node shared by design): shared
    c->other = self->other;
    return (PyObject *)c;
}

static PyObject *State_deepcopy(StateObject *self, PyObject *) { return State_copy(self, NULL); }

static PyObject *State_reduce(StateObject *self, PyObject *) {
    PyObject *w = get_words(self, NULL);
    return w ? Py_BuildValue("(O(N))", (PyObject *)Py_TYPE(self), w) : NULL;
}

static PyGetSetDef State_getset[] = {
    {"words", (getter)get_words, (setter)State_setter, "the context: n-gram ids per order, or a scorer's object",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef State_methods[] = {
    {"__copy__", (PyCFunction)State_copy, METH_NOARGS, NULL},
    {"__deepcopy__", (PyCFunction)State_deepcopy, METH_O, NULL},
    {"__reduce__", (PyCFunction)State_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject StateType = {PyVarObject_HEAD_INIT(NULL, 0) "seqlm.kenlm.State", sizeof(StateObject), 0};

int add_state_type(PyObject *module) {
    StateType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
    StateType.tp_doc = "kenlm's State: what a decoder keeps between BaseScore calls (seqlm.ngram.query.State)";
    StateType.tp_new = State_new;
    StateType.tp_init = (initproc)State_init;
    StateType.tp_dealloc = (destructor)State_dealloc;
    StateType.tp_traverse = (traverseproc)State_traverse;
    StateType.tp_clear = (inquiry)State_clear;
    StateType.tp_richcompare = State_richcompare;
    StateType.tp_hash = (hashfunc)State_hash;
    StateType.tp_repr = (reprfunc)State_repr;
    StateType.tp_getset = State_getset;
    StateType.tp_methods = State_methods;
    if (PyType_Ready(&StateType) < 0) return -1;
    Py_INCREF(&StateType);
    return PyModule_AddObject(module, "State", (PyObject *)&StateType);
}
