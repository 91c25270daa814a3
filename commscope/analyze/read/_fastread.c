/* A pickle reader for flight-recorder dumps that keeps the records as columns.
 *
 * read_columns(buf) reads a pickle (protocol 2-5) the way the standard unpickler
 * would, building plain objects (dict, list, tuple, str, int, float, bool, None), with
 * one difference: the records of the top-level "entries" list are never built as
 * dicts. Their fields go straight into one list per field, and each record's
 * signature (profiling_name, sizes, dtypes) into its marshal key. That skips building,
 * hashing and freeing 2 000 dicts of 20+ keys per file, which is most of the cost of
 * reading a dump.
 *
 * It returns None ("declined") whenever the input is not the common, well-formed case:
 * an opcode outside the small plain-data set, a global, a record that is not a dict,
 * a missing field, a record referenced twice, a non-text key, anything odd at all.
 * The caller then reads the file with the standard (restricted) unpickler, which
 * reports what is wrong. So this reader never has to explain a bad file, and what it
 * returns is, by construction, what the standard path would have extracted.
 *
 * Safety: every read is bounds-checked against the buffer; stack, marks and memo are
 * bounded; no import, no call of anything named in the file; objects are only built
 * from the opcodes listed below.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <string.h>

#define MAX_STACK (1 << 22)
#define MAX_MEMO (1 << 22)
#define KEY_CACHE 64
#define SIG_CACHE 8 /* recent signatures whose marshal key is reused */

/* The record fields kept, in the order of the returned columns. */
static const char *FIELDS[] = {
    "profiling_name", "record_id", "pg_id", "collective_seq_id", "p2p_seq_id",
    "time_created_ns", "process_group", "state", "retired", "is_p2p",
    "time_discovered_started_ns", "time_discovered_completed_ns",
    /* signature parts: only in the key */
    "input_sizes", "output_sizes", "input_dtypes", "output_dtypes",
    /* optional */
    "failed", "peer", "duration_ms",
    /* optional, what must agree: root and reduce_op tag the name in the key; the
     * all_to_all split sizes go into one column */
    "root", "reduce_op", "input_split_sizes", "output_split_sizes",
};
enum {
    F_NAME, F_RECORD, F_PGID, F_SEQ, F_P2PSEQ, F_CREATED, F_PG, F_STATE, F_RETIRED,
    F_ISP2P, F_TSTART, F_TDONE, F_IN, F_OUT, F_IDT, F_ODT, F_FAILED, F_PEER, F_DUR,
    F_ROOT, F_ROP, F_INSPL, F_OUTSPL, N_FIELDS
};
#define N_COLUMNS (F_TDONE + 1) /* the columns returned as lists */
#define N_REQUIRED (F_ODT + 1)  /* fields every record must have */
#define N_INTS 5                /* record_id .. time_created_ns: int64 columns */

typedef struct {
    const unsigned char *p, *end;
    PyObject **stack;
    Py_ssize_t sp, scap;
    Py_ssize_t *marks;
    Py_ssize_t mp, mcap;
    PyObject **memo;
    Py_ssize_t memo_cap, memo_len;
    PyObject *marker;       /* stands on the stack for each record being read */
    PyObject *entries;      /* the top-level entries list (kept empty), owned */
    PyObject *top;          /* the top-level dict (borrowed from the stack) */
    Py_ssize_t open_pos;    /* stack index of the open record's marker, or -1 */
    Py_ssize_t created, appended;
    PyObject *slot[N_FIELDS];
    PyObject *cols[N_COLUMNS];
    PyObject *keys, *failed, *peer, *dur, *splits;
    long long *ints[N_INTS];
    Py_ssize_t n_ints, ints_cap;
    int first_has_failed;
    PyObject *key_obj[KEY_CACHE];
    int key_idx[KEY_CACHE];
    int n_keys;
    int hint; /* where the next key is likely to be: records repeat one key order */
    PyObject *sig_parts[SIG_CACHE][5];
    PyObject *sig_key[SIG_CACHE];
    int n_sigs, next_sig;
} Reader;

#define DECLINE (-1)
#define ERROR (-2)

static int push(Reader *r, PyObject *o) /* steals o */
{
    if (o == NULL)
        return ERROR;
    if (r->sp == r->scap) {
        Py_ssize_t cap = r->scap ? r->scap * 2 : 256;
        if (cap > MAX_STACK) {
            Py_DECREF(o);
            return DECLINE;
        }
        PyObject **s = PyMem_Realloc(r->stack, cap * sizeof(PyObject *));
        if (s == NULL) {
            Py_DECREF(o);
            PyErr_NoMemory();
            return ERROR;
        }
        r->stack = s;
        r->scap = cap;
    }
    r->stack[r->sp++] = o;
    return 0;
}

static int push_mark(Reader *r)
{
    if (r->mp == r->mcap) {
        Py_ssize_t cap = r->mcap ? r->mcap * 2 : 64;
        if (cap > MAX_STACK)
            return DECLINE;
        Py_ssize_t *m = PyMem_Realloc(r->marks, cap * sizeof(Py_ssize_t));
        if (m == NULL) {
            PyErr_NoMemory();
            return ERROR;
        }
        r->marks = m;
        r->mcap = cap;
    }
    r->marks[r->mp++] = r->sp;
    return 0;
}

/* The unpickler's fence: nothing below the newest mark may be taken or touched
 * except by the opcodes that consume that mark (else "unexpected MARK found"). */
static Py_ssize_t fence(Reader *r)
{
    return r->mp ? r->marks[r->mp - 1] : 0;
}

/* Pop the newest mark for APPENDS/SETITEMS/TUPLE: -1 when there is none, or when its
 * target would sit below the mark before it (the unpickler's checks). */
static Py_ssize_t pop_mark(Reader *r, int needs_target)
{
    if (r->mp == 0)
        return -1;
    Py_ssize_t m = r->marks[--r->mp];
    if (m > r->sp || (needs_target && m <= fence(r)))
        return -1;
    return m;
}

static Py_ssize_t top_mark(Reader *r)
{
    return r->mp ? r->marks[r->mp - 1] : -1;
}

static int need(Reader *r, Py_ssize_t n)
{
    return (r->end - r->p) >= n;
}

static unsigned long long read_le(const unsigned char *p, int n)
{
    unsigned long long v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int memo_put(Reader *r, Py_ssize_t idx, PyObject *o)
{
    if (idx < 0 || idx >= MAX_MEMO)
        return DECLINE;
    if (idx >= r->memo_cap) {
        Py_ssize_t cap = r->memo_cap ? r->memo_cap : 256;
        while (cap <= idx)
            cap *= 2;
        PyObject **m = PyMem_Realloc(r->memo, cap * sizeof(PyObject *));
        if (m == NULL) {
            PyErr_NoMemory();
            return ERROR;
        }
        memset(m + r->memo_cap, 0, (cap - r->memo_cap) * sizeof(PyObject *));
        r->memo = m;
        r->memo_cap = cap;
    }
    if (r->memo[idx] == NULL)
        r->memo_len++;
    else
        Py_DECREF(r->memo[idx]);
    Py_INCREF(o);
    r->memo[idx] = o;
    return 0;
}

/* Which kept field a record key names (-1: none). Keys repeat (memoized strings), so
 * the objects seen are cached; the cache holds a reference, so an address is never
 * reused for another string while it is cached. */
static int field_of(Reader *r, PyObject *key)
{
    if (r->hint < r->n_keys && r->key_obj[r->hint] == key)
        return r->key_idx[r->hint++];
    for (int i = 0; i < r->n_keys; i++)
        if (r->key_obj[i] == key) {
            r->hint = i + 1;
            return r->key_idx[i];
        }
    int found = -1;
    for (int f = 0; f < N_FIELDS; f++) {
        if (PyUnicode_CompareWithASCIIString(key, FIELDS[f]) == 0) {
            found = f;
            break;
        }
    }
    if (r->n_keys < KEY_CACHE) {
        Py_INCREF(key);
        r->key_obj[r->n_keys] = key;
        r->key_idx[r->n_keys] = found;
        r->n_keys++;
        r->hint = r->n_keys;
    }
    return found;
}

static void clear_slots(Reader *r)
{
    for (int f = 0; f < N_FIELDS; f++)
        Py_CLEAR(r->slot[f]);
}

/* An int that fits in 64 bits (exactly int: not bool). */
static int as_i64(PyObject *o, long long *out)
{
    if (!PyLong_CheckExact(o))
        return DECLINE;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow)
        return DECLINE;
    if (v == -1 && PyErr_Occurred())
        return ERROR;
    *out = v;
    return 0;
}

static int is_text(PyObject *o, const char *a, const char *b, const char *c)
{
    return PyUnicode_CheckExact(o) && (PyUnicode_CompareWithASCIIString(o, a) == 0 ||
                                       PyUnicode_CompareWithASCIIString(o, b) == 0 ||
                                       PyUnicode_CompareWithASCIIString(o, c) == 0);
}

/* The checks the standard path makes of every record before it trusts the columns
 * (records.py, _checked_columns), made here one record at a time; the five integer
 * fields go into int64 columns. Stricter is fine (it declines), laxer is not. */
static int check_record(Reader *r)
{
    PyObject **s = r->slot;
    long long v[N_INTS];
    int rc;
    for (int i = 0; i < N_INTS; i++)
        if ((rc = as_i64(s[F_RECORD + i], &v[i])) != 0)
            return rc;
    if (v[F_SEQ - F_RECORD] < 0)
        return DECLINE;
    for (int f = F_TSTART; f <= F_TDONE; f++) {
        long long t;
        if (s[f] != Py_None && (rc = as_i64(s[f], &t)) != 0)
            return rc;
    }
    if (!PyUnicode_CheckExact(s[F_NAME]) || !PyBool_Check(s[F_RETIRED]) ||
        !PyBool_Check(s[F_ISP2P]) || !is_text(s[F_STATE], "scheduled", "started", "completed"))
        return DECLINE;
    PyObject *pg = s[F_PG];
    if (!PyTuple_CheckExact(pg) || PyTuple_GET_SIZE(pg) != 2 ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(pg, 0)) ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(pg, 1)))
        return DECLINE;
    if (r->n_ints == r->ints_cap) {
        Py_ssize_t cap = r->ints_cap ? r->ints_cap * 2 : 1024;
        for (int i = 0; i < N_INTS; i++) {
            long long *p = PyMem_Realloc(r->ints[i], cap * sizeof(long long));
            if (p == NULL) {
                PyErr_NoMemory();
                return ERROR;
            }
            r->ints[i] = p;
        }
        r->ints_cap = cap;
    }
    for (int i = 0; i < N_INTS; i++)
        r->ints[i][r->n_ints] = v[i];
    r->n_ints++;
    return 0;
}

/* Equal value and the same exact types all the way down (str, int, list, tuple, and
 * the None/True/False singletons): marshal writes both to the same bytes. */
static int same_value(PyObject *a, PyObject *b, int depth)
{
    if (a == b)
        return 1;
    if (Py_TYPE(a) != Py_TYPE(b) || depth > 4)
        return 0;
    if (PyUnicode_CheckExact(a))
        return PyUnicode_Compare(a, b) == 0;
    if (PyLong_CheckExact(a)) {
        int oa = 0, ob = 0;
        long long va = PyLong_AsLongLongAndOverflow(a, &oa);
        long long vb = PyLong_AsLongLongAndOverflow(b, &ob);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return !oa && !ob && va == vb;
    }
    if (PyList_CheckExact(a) || PyTuple_CheckExact(a)) {
        Py_ssize_t n = Py_SIZE(a);
        if (Py_SIZE(b) != n)
            return 0;
        PyObject **ia = PyList_CheckExact(a) ? ((PyListObject *)a)->ob_item
                                             : ((PyTupleObject *)a)->ob_item;
        PyObject **ib = PyList_CheckExact(b) ? ((PyListObject *)b)->ob_item
                                             : ((PyTupleObject *)b)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!same_value(ia[i], ib[i], depth + 1))
                return 0;
        return 1;
    }
    return 0;
}

/* The marshal key of a record's signature: a recent one's when the parts are the same
 * values (most records repeat a few signatures), else marshal's. New reference. */
static PyObject *signature_key(Reader *r, PyObject *name)
{
    PyObject *parts[5] = {name, r->slot[F_IN], r->slot[F_OUT], r->slot[F_IDT],
                          r->slot[F_ODT]};
    for (int c = 0; c < r->n_sigs; c++) {
        int j = 0;
        while (j < 5 && same_value(parts[j], r->sig_parts[c][j], 0))
            j++;
        if (j == 5) {
            Py_INCREF(r->sig_key[c]);
            return r->sig_key[c];
        }
    }
    PyObject *sig = PyTuple_Pack(5, parts[0], parts[1], parts[2], parts[3], parts[4]);
    if (sig == NULL)
        return NULL;
    PyObject *key = PyMarshal_WriteObjectToString(sig, 2);
    Py_DECREF(sig);
    if (key == NULL)
        return NULL;
    int c = r->next_sig;
    r->next_sig = (c + 1) % SIG_CACHE;
    if (c < r->n_sigs) {
        for (int j = 0; j < 5; j++)
            Py_DECREF(r->sig_parts[c][j]);
        Py_DECREF(r->sig_key[c]);
    } else {
        r->n_sigs++;
    }
    for (int j = 0; j < 5; j++) {
        Py_INCREF(parts[j]);
        r->sig_parts[c][j] = parts[j];
    }
    Py_INCREF(key);
    r->sig_key[c] = key;
    return key;
}

/* The profiling name as the signature key holds it: tagged with the root and the
 * reduce op when the record has them (signature.py, tag_name, says the same):
 * "name\x1froot\x1fop", an absent or unusable part empty. New reference. */
static PyObject *tagged_name(Reader *r)
{
    PyObject *name = r->slot[F_NAME], *root = r->slot[F_ROOT], *op = r->slot[F_ROP];
    if (root != NULL) {
        int overflow = 0;
        long long v = PyLong_CheckExact(root) ? PyLong_AsLongLongAndOverflow(root, &overflow)
                                              : -1;
        if (v == -1 && PyErr_Occurred())
            PyErr_Clear();
        if (overflow || v < 0 || v >= 2147483648LL)
            root = NULL;
    }
    if (op != NULL && (!PyUnicode_CheckExact(op) || PyUnicode_GET_LENGTH(op) < 1 ||
                       PyUnicode_GET_LENGTH(op) > 32))
        op = NULL;
    if (root == NULL && op == NULL) {
        Py_INCREF(name);
        return name;
    }
    PyObject *empty = PyUnicode_New(0, 0);
    if (empty == NULL)
        return NULL;
    PyObject *out = PyUnicode_FromFormat("%U\x1f%S\x1f%S", name, root ? root : empty,
                                         op ? op : empty);
    Py_DECREF(empty);
    return out;
}

/* The open record is complete: move its fields into the columns. */
static int finish_record(Reader *r)
{
    if (r->open_pos < 0)
        return 0;
    r->open_pos = -1;
    for (int f = 0; f < N_REQUIRED; f++)
        if (r->slot[f] == NULL)
            return DECLINE; /* the standard path reports or repairs it */
    int rc = check_record(r);
    if (rc)
        return rc;
    for (int f = F_PG; f < N_COLUMNS; f++) /* the others are in the int64 columns */
        if (PyList_Append(r->cols[f], r->slot[f]) < 0)
            return ERROR;
    PyObject *name = tagged_name(r);
    if (name == NULL)
        return ERROR;
    PyObject *key = signature_key(r, name);
    Py_DECREF(name);
    if (key == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            return DECLINE; /* not marshal-able: the standard path says why */
        }
        return ERROR;
    }
    rc = PyList_Append(r->keys, key);
    Py_DECREF(key);
    if (rc < 0)
        return ERROR;
    if (r->created == 1)
        r->first_has_failed = r->slot[F_FAILED] != NULL;
    PyObject *opt[3] = {r->slot[F_FAILED], r->slot[F_PEER], r->slot[F_DUR]};
    PyObject *lists[3] = {r->failed, r->peer, r->dur};
    for (int i = 0; i < 3; i++)
        if (PyList_Append(lists[i], opt[i] ? opt[i] : Py_None) < 0)
            return ERROR;
    if (r->slot[F_INSPL] || r->slot[F_OUTSPL]) {
        PyObject *pair = PyTuple_Pack(2, r->slot[F_INSPL] ? r->slot[F_INSPL] : Py_None,
                                      r->slot[F_OUTSPL] ? r->slot[F_OUTSPL] : Py_None);
        if (pair == NULL)
            return ERROR;
        rc = PyList_Append(r->splits, pair);
        Py_DECREF(pair);
    } else {
        rc = PyList_Append(r->splits, Py_None);
    }
    if (rc < 0)
        return ERROR;
    clear_slots(r);
    return 0;
}

/* Set items stack[lo:sp] (key, value pairs) on the object at stack[lo - 1]. */
static int set_items(Reader *r, Py_ssize_t lo)
{
    if (lo < 1 || lo > r->sp || (r->sp - lo) % 2)
        return DECLINE;
    PyObject *target = r->stack[lo - 1];
    int rc = 0;
    if (target == r->marker) {
        if (lo - 1 != r->open_pos)
            return DECLINE;
        for (Py_ssize_t i = lo; i < r->sp; i += 2) {
            PyObject *k = r->stack[i], *v = r->stack[i + 1];
            if (!PyUnicode_CheckExact(k) || v == r->marker || v == r->entries)
                return DECLINE;
            int f = field_of(r, k);
            if (f >= 0) { /* the last value of a repeated key wins, as in a dict */
                Py_INCREF(v);
                Py_XSETREF(r->slot[f], v);
            }
        }
    } else if (PyDict_CheckExact(target)) {
        for (Py_ssize_t i = lo; i < r->sp && rc == 0; i += 2) {
            PyObject *k = r->stack[i], *v = r->stack[i + 1];
            if (k == r->marker || v == r->marker) {
                rc = DECLINE;
                break;
            }
            if (PyDict_SetItem(target, k, v) < 0) {
                if (PyErr_ExceptionMatches(PyExc_TypeError)) { /* unhashable key */
                    PyErr_Clear();
                    rc = DECLINE;
                } else {
                    rc = ERROR;
                }
            }
        }
    } else {
        return DECLINE;
    }
    while (r->sp > lo)
        Py_DECREF(r->stack[--r->sp]);
    return rc;
}

/* Append stack[lo:sp] to the list at stack[lo - 1]. */
static int append_items(Reader *r, Py_ssize_t lo)
{
    if (lo < 1 || lo > r->sp)
        return DECLINE;
    PyObject *target = r->stack[lo - 1];
    int rc = 0;
    if (target == r->entries) {
        rc = finish_record(r);
        for (Py_ssize_t i = lo; i < r->sp && rc == 0; i++)
            if (r->stack[i] != r->marker)
                rc = DECLINE; /* a record that is not a dict: the standard path */
        if (rc == 0)
            r->appended += r->sp - lo;
    } else if (PyList_CheckExact(target)) {
        for (Py_ssize_t i = lo; i < r->sp && rc == 0; i++) {
            if (r->stack[i] == r->marker || r->stack[i] == r->entries)
                rc = DECLINE;
            else if (PyList_Append(target, r->stack[i]) < 0)
                rc = ERROR;
        }
    } else {
        rc = DECLINE;
    }
    while (r->sp > lo)
        Py_DECREF(r->stack[--r->sp]);
    return rc;
}

static int make_tuple(Reader *r, Py_ssize_t lo)
{
    if (lo < 0 || lo > r->sp)
        return DECLINE;
    Py_ssize_t n = r->sp - lo;
    for (Py_ssize_t i = lo; i < r->sp; i++)
        if (r->stack[i] == r->marker || r->stack[i] == r->entries)
            return DECLINE;
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return ERROR;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, r->stack[lo + i]); /* steals */
    r->sp = lo;
    return push(r, t);
}

/* BINUNICODE and its short/long forms: a little-endian length of `width` bytes, then
 * UTF-8 (surrogates allowed, as the unpickler decodes). Bad text declines. */
static int push_text(Reader *r, int width)
{
    if (!need(r, width))
        return DECLINE;
    unsigned long long n = read_le(r->p, width);
    r->p += width;
    if (n > (unsigned long long)(r->end - r->p))
        return DECLINE;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->p, (Py_ssize_t)n, "surrogatepass");
    r->p += n;
    if (s == NULL) {
        PyErr_Clear();
        return DECLINE;
    }
    return push(r, s);
}

static int step(Reader *r, int *stop)
{
    if (!need(r, 1))
        return DECLINE;
    unsigned char op = *r->p++;
    switch (op) {
    case 0x80: /* PROTO */
        if (!need(r, 1) || r->p[0] < 2 || r->p[0] > 5)
            return DECLINE;
        r->p++;
        return 0;
    case 0x95: /* FRAME: the next n bytes must all be there, as the unpickler checks */
        if (!need(r, 8))
            return DECLINE;
        {
            unsigned long long n = read_le(r->p, 8);
            r->p += 8;
            if (n > (unsigned long long)(r->end - r->p))
                return DECLINE;
        }
        return 0;
    case '.': /* STOP */
        if (r->sp <= fence(r))
            return DECLINE;
        *stop = 1;
        return 0;
    case '(': /* MARK */
        return push_mark(r);
    case '}': { /* EMPTY_DICT */
        Py_ssize_t m = top_mark(r);
        /* a record: in a batch of the entries list (APPENDS), or alone (APPEND) */
        if (r->entries != NULL && ((m >= 1 && r->stack[m - 1] == r->entries) ||
                                   (r->sp >= 1 && r->stack[r->sp - 1] == r->entries))) {
            int rc = finish_record(r); /* the previous record is complete */
            if (rc)
                return rc;
            r->open_pos = r->sp;
            r->created++;
            Py_INCREF(r->marker);
            return push(r, r->marker);
        }
        PyObject *d = PyDict_New();
        if (d != NULL && r->sp == 0 && r->top == NULL)
            r->top = d;
        return push(r, d);
    }
    case ']': { /* EMPTY_LIST */
        PyObject *l = PyList_New(0);
        if (l == NULL)
            return ERROR;
        Py_ssize_t m = top_mark(r);
        /* the value of the key 'entries' in the top-level dict's items */
        if (r->top != NULL && m == 1 && r->stack[0] == r->top && r->sp > m &&
            (r->sp - 1 - m) % 2 == 0 &&
            PyUnicode_CheckExact(r->stack[r->sp - 1]) &&
            PyUnicode_CompareWithASCIIString(r->stack[r->sp - 1], "entries") == 0) {
            if (r->entries != NULL) { /* a second entries list: let the standard path decide */
                Py_DECREF(l);
                return DECLINE;
            }
            Py_INCREF(l);
            r->entries = l;
        }
        return push(r, l);
    }
    case ')': /* EMPTY_TUPLE */
        return push(r, PyTuple_New(0));
    case 't': /* TUPLE */
        return make_tuple(r, pop_mark(r, 0));
    case 0x85: /* TUPLE1 */
    case 0x86: /* TUPLE2 */
    case 0x87: /* TUPLE3 */
        if (r->sp - (op - 0x84) < fence(r))
            return DECLINE;
        return make_tuple(r, r->sp - (op - 0x84));
    case 'a': /* APPEND */
        if (r->sp - 1 <= fence(r))
            return DECLINE;
        return append_items(r, r->sp - 1);
    case 'e': /* APPENDS */
        return append_items(r, pop_mark(r, 1));
    case 's': /* SETITEM */
        if (r->sp - 2 <= fence(r))
            return DECLINE;
        return set_items(r, r->sp - 2);
    case 'u': /* SETITEMS */
        return set_items(r, pop_mark(r, 1));
    case 'X': /* BINUNICODE */
        return push_text(r, 4);
    case 0x8c: /* SHORT_BINUNICODE */
        return push_text(r, 1);
    case 0x8d: /* BINUNICODE8 */
        return push_text(r, 8);
    case 'J': /* BININT: 4 bytes, signed */
        if (!need(r, 4))
            return DECLINE;
        {
            long v = (long)(int32_t)(uint32_t)read_le(r->p, 4);
            r->p += 4;
            return push(r, PyLong_FromLong(v));
        }
    case 'K': /* BININT1 */
        if (!need(r, 1))
            return DECLINE;
        return push(r, PyLong_FromLong(*r->p++));
    case 'M': /* BININT2 */
        if (!need(r, 2))
            return DECLINE;
        {
            long v = (long)read_le(r->p, 2);
            r->p += 2;
            return push(r, PyLong_FromLong(v));
        }
    case 0x8a: { /* LONG1: up to 8 bytes, or 9 for an unsigned 64-bit value (a
                  * fingerprint: 8 bytes and a zero sign byte); beyond: the standard path */
        if (!need(r, 1))
            return DECLINE;
        int n = r->p[0];
        if (n == 9 && need(r, 10) && r->p[9] == 0 && (r->p[8] & 0x80)) {
            unsigned long long big = read_le(r->p + 1, 8);
            r->p += 10;
            return push(r, PyLong_FromUnsignedLongLong(big));
        }
        if (n > 8 || !need(r, 1 + n))
            return DECLINE;
        unsigned long long u = read_le(r->p + 1, n);
        r->p += 1 + n;
        long long v;
        if (n == 0)
            v = 0;
        else if (n == 8)
            v = (long long)u;
        else if (u & (1ULL << (8 * n - 1))) /* negative: sign-extend */
            v = (long long)(u | (~0ULL << (8 * n)));
        else
            v = (long long)u;
        return push(r, PyLong_FromLongLong(v));
    }
    case 'N': /* NONE */
        Py_INCREF(Py_None);
        return push(r, Py_None);
    case 0x88: /* NEWTRUE */
        Py_INCREF(Py_True);
        return push(r, Py_True);
    case 0x89: /* NEWFALSE */
        Py_INCREF(Py_False);
        return push(r, Py_False);
    case 'G': /* BINFLOAT: 8 bytes, big-endian */
        if (!need(r, 8))
            return DECLINE;
        {
#if PY_VERSION_HEX >= 0x030B0000
            double d = PyFloat_Unpack8((const char *)r->p, 0);
#else
            double d = _PyFloat_Unpack8(r->p, 0);
#endif
            r->p += 8;
            if (d == -1.0 && PyErr_Occurred())
                return ERROR;
            return push(r, PyFloat_FromDouble(d));
        }
    case 'q': /* BINPUT */
    case 'r': /* LONG_BINPUT */
    case 0x94: { /* MEMOIZE */
        Py_ssize_t idx;
        if (op == 'q') {
            if (!need(r, 1))
                return DECLINE;
            idx = *r->p++;
        } else if (op == 'r') {
            if (!need(r, 4))
                return DECLINE;
            idx = (Py_ssize_t)read_le(r->p, 4);
            r->p += 4;
        } else {
            idx = r->memo_len;
        }
        if (r->sp <= fence(r))
            return DECLINE;
        /* A record is never memoized as itself: fetching it again declines. */
        return memo_put(r, idx, r->stack[r->sp - 1]);
    }
    case 'h': /* BINGET */
    case 'j': { /* LONG_BINGET */
        Py_ssize_t idx;
        if (op == 'h') {
            if (!need(r, 1))
                return DECLINE;
            idx = *r->p++;
        } else {
            if (!need(r, 4))
                return DECLINE;
            idx = (Py_ssize_t)read_le(r->p, 4);
            r->p += 4;
        }
        if (idx >= r->memo_cap || r->memo[idx] == NULL)
            return DECLINE;
        PyObject *o = r->memo[idx];
        if (o == r->marker || o == r->entries || o == r->top)
            return DECLINE; /* a record, the records list or the top level used twice */
        Py_INCREF(o);
        return push(r, o);
    }
    default:
        return DECLINE; /* anything else (globals, bytes, ...): the standard path */
    }
}

static void reader_free(Reader *r)
{
    while (r->sp > 0)
        Py_DECREF(r->stack[--r->sp]);
    PyMem_Free(r->stack);
    PyMem_Free(r->marks);
    for (Py_ssize_t i = 0; i < r->memo_cap; i++)
        Py_XDECREF(r->memo[i]);
    PyMem_Free(r->memo);
    clear_slots(r);
    for (int f = 0; f < N_COLUMNS; f++)
        Py_XDECREF(r->cols[f]);
    Py_XDECREF(r->keys);
    Py_XDECREF(r->failed);
    Py_XDECREF(r->peer);
    Py_XDECREF(r->dur);
    Py_XDECREF(r->splits);
    Py_XDECREF(r->entries);
    Py_XDECREF(r->marker);
    for (int i = 0; i < N_INTS; i++)
        PyMem_Free(r->ints[i]);
    for (int c = 0; c < r->n_sigs; c++) {
        for (int j = 0; j < 5; j++)
            Py_DECREF(r->sig_parts[c][j]);
        Py_DECREF(r->sig_key[c]);
    }
    for (int i = 0; i < r->n_keys; i++)
        Py_DECREF(r->key_obj[i]);
}

PyDoc_STRVAR(read_columns_doc,
"read_columns(buf) -> (top, columns, keys, failed, peer, duration, splits, first_has_failed)\n"
"or None\n"
"\n"
"Read a flight-recorder dump pickle; the records of its 'entries' list come back as\n"
"columns (profiling_name, record_id, pg_id, collective_seq_id, p2p_seq_id,\n"
"time_created_ns, process_group, state, retired, is_p2p, time_discovered_started_ns,\n"
"time_discovered_completed_ns), one marshal key per record, and the optional fields\n"
"failed, peer and duration_ms (None when absent), the split sizes as (input, output) or\n"
"None; the key's name is tagged with root and reduce_op where present; 'top' is the\n"
"top-level dict with an\n"
"empty 'entries'. None: not the common well-formed case, read it the standard way.");

static PyObject *read_columns(PyObject *Py_UNUSED(self), PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r;
    memset(&r, 0, sizeof r);
    r.p = view.buf;
    r.end = r.p + view.len;
    if (view.len < 2 || r.p[0] != 0x80 || r.p[1] < 2 || r.p[1] > 5) {
        PyBuffer_Release(&view); /* not a protocol 2-5 pickle: the standard path says so */
        Py_RETURN_NONE;
    }
    r.open_pos = -1;
    int rc = 0, stop = 0;
    r.marker = PyBaseObject_Type.tp_alloc(&PyBaseObject_Type, 0);
    r.keys = PyList_New(0);
    r.failed = PyList_New(0);
    r.peer = PyList_New(0);
    r.dur = PyList_New(0);
    r.splits = PyList_New(0);
    if (!r.marker || !r.keys || !r.failed || !r.peer || !r.dur || !r.splits)
        rc = ERROR;
    for (int f = F_PG; f < N_COLUMNS && rc == 0; f++) /* the others: int64 columns */
        if ((r.cols[f] = PyList_New(0)) == NULL)
            rc = ERROR;
    while (rc == 0 && !stop)
        rc = step(&r, &stop);
    PyObject *result = NULL;
    if (rc == 0) {
        rc = finish_record(&r);
    }
    if (rc == 0) {
        /* The whole file was the top-level dict, whose 'entries' is our list, held
         * nowhere else (ours, the dict's, the memo's at most), and every record read
         * was appended to it. */
        PyObject *got = r.top ? PyDict_GetItemString(r.top, "entries") : NULL;
        Py_ssize_t memo_refs = 0;
        for (Py_ssize_t i = 0; r.entries && i < r.memo_cap; i++)
            memo_refs += r.memo[i] == r.entries;
        if (r.sp != 1 || r.stack[0] != r.top || r.top == NULL || got != r.entries ||
            r.entries == NULL || Py_REFCNT(r.entries) != 2 + memo_refs ||
            r.created != r.appended || r.created == 0) {
            rc = DECLINE;
        }
    }
    if (rc == 0) {
        /* (top, record_id, pg_id, collective_seq_id, p2p_seq_id, time_created_ns as
         * int64 bytes, process_group, state, retired, is_p2p, started, completed,
         * keys, failed, peer, duration_ms, splits, first record has 'failed') */
        result = PyTuple_New(18);
        PyObject *items[18] = {NULL};
        items[0] = r.top;
        Py_INCREF(r.top);
        for (int i = 0; i < N_INTS; i++)
            items[1 + i] = PyBytes_FromStringAndSize((const char *)r.ints[i],
                                                     r.n_ints * (Py_ssize_t)sizeof(long long));
        for (int f = F_PG; f < N_COLUMNS; f++) {
            items[6 + f - F_PG] = r.cols[f];
            r.cols[f] = NULL;
        }
        PyObject *rest[5] = {r.keys, r.failed, r.peer, r.dur, r.splits};
        for (int i = 0; i < 5; i++) {
            items[12 + i] = rest[i];
            Py_INCREF(rest[i]);
        }
        items[17] = r.first_has_failed ? Py_True : Py_False;
        Py_INCREF(items[17]);
        for (int i = 0; i < 18; i++) {
            if (items[i] == NULL || result == NULL) {
                for (int j = 0; j < 18; j++)
                    Py_XDECREF(items[j]);
                Py_CLEAR(result);
                break;
            }
        }
        for (int i = 0; result != NULL && i < 18; i++)
            PyTuple_SET_ITEM(result, i, items[i]);
    } else if (rc == DECLINE) {
        PyErr_Clear();
        Py_INCREF(Py_None);
        result = Py_None;
    }
    reader_free(&r);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"read_columns", read_columns, METH_O, read_columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastread",
    "Columnar reading of flight-recorder dump pickles (see read_columns).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastread(void)
{
    return PyModule_Create(&module);
}
