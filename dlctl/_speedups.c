/*
 * dlctl._speedups: the per-record loops of the bootstrap copy and of replication streams, in C.
 *
 * dlctl.spark.transform holds the reference implementation in Python and the meaning of the
 * copy's functions; this module does exactly the same work with no Python object per record. It
 * is optional: transform.py uses it when it imports and falls back to the Python loops otherwise
 * (a node without a compiler, executors of a real Spark cluster that receive dlctl as a zip).
 * tests/unit/test_speedups.py checks the two give the same bytes, numbers and errors.
 * stream_local is a stream worker's loop for entries of local records (dlctl.replication.fastpath);
 * without it the worker takes its general per-record path, whose bytes
 * tests/unit/test_stream_fastpath.py compares it with.
 *
 * Input is untrusted as far as structure goes (the entry CRC passed, but a hostile or buggy
 * writer can still put any bytes in a payload): every offset is checked against the end of
 * the payload before it is read, and errors name the byte where the records break, in the
 * same words as the Python code.
 *
 * Record layout (dlctl/log/records.py), big-endian:
 *   u32 size | u8 flags | i64 txid | u16 key length, key | u16 header count, headers | payload
 *   header: u16 name length, name, u32 value length, value
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FLAG_CONTROL 0x01
#define FIXED_SIZE 15       /* size, flags, txid, key length */
#define MIN_RECORD 17       /* FIXED_SIZE + header count */
#define TOTALS_SIZE 37      /* the size field of the writer's per-entry totals record, less the key */
#define TOTALS_SIZE_UNTIMED 29 /* the same, written before entries carried their append time */

/* -- CRC-32C (Castagnoli), chained like the crc32c package: crc32c(b, crc32c(a)) == crc32c(a + b) -- */

static uint32_t crc_table[8][256];
static int crc_hw;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n) {
    /* slicing by 8 */
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24]
            ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/*
 * The crc32 instruction takes 3 cycles and issues one per cycle: one chain of it runs at a third
 * of the unit's speed. Long buffers are cut into three lanes computed at once, and the lanes
 * joined with "shift by n zero bytes" operators: CRC is linear, so the state after A then B is
 * shift_|B|(state after A) xor (state of B from zero). The operators are 32x32 matrices over
 * GF(2), built at import by squaring the one-zero-bit operator, and applied a byte at a time
 * through four 256-entry tables.
 */
#define LANE_LONG 8192
#define LANE_SHORT 256

static uint32_t shift_long[4][256], shift_short[4][256];

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (int i = 0; vec; i++, vec >>= 1)
        if (vec & 1)
            sum ^= mat[i];
    return sum;
}

static void gf2_square(uint32_t *out, const uint32_t *mat) {
    for (int i = 0; i < 32; i++)
        out[i] = gf2_times(mat, mat[i]);
}

/* tables[k][b]: the state b << 8k advanced over ``bytes`` zero bytes (a power of two). */
static void shift_tables(uint32_t tables[4][256], size_t bytes) {
    uint32_t op[32], sq[32];
    op[0] = 0x82F63B78u; /* one zero bit: the reflected polynomial, then each bit moves down one */
    for (int i = 1; i < 32; i++)
        op[i] = 1u << (i - 1);
    for (size_t bits = 1; bits < 8 * bytes; bits <<= 1) {
        gf2_square(sq, op);
        memcpy(op, sq, sizeof op);
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            tables[k][b] = gf2_times(op, b << (8 * k));
}

static inline uint32_t shift(uint32_t tables[4][256], uint32_t crc) {
    return tables[0][crc & 0xFF] ^ tables[1][(crc >> 8) & 0xFF] ^ tables[2][(crc >> 16) & 0xFF] ^ tables[3][crc >> 24];
}

static void crc_lanes_init(void) {
    shift_tables(shift_long, LANE_LONG);
    shift_tables(shift_short, LANE_SHORT);
}

/* Three lanes of ``lane`` bytes at a time while they last; returns the state, moves p and n on. */
__attribute__((target("sse4.2"), always_inline)) static inline uint64_t crc_lanes(uint64_t c0, const unsigned char **pp, size_t *np, size_t lane, uint32_t tables[4][256]) {
    const unsigned char *p = *pp;
    size_t n = *np;
    while (n >= 3 * lane) {
        uint64_t c1 = 0, c2 = 0, v0, v1, v2;
        for (const unsigned char *end = p + lane; p < end; p += 8) {
            memcpy(&v0, p, 8);
            memcpy(&v1, p + lane, 8);
            memcpy(&v2, p + 2 * lane, 8);
            c0 = __builtin_ia32_crc32di(c0, v0);
            c1 = __builtin_ia32_crc32di(c1, v1);
            c2 = __builtin_ia32_crc32di(c2, v2);
        }
        c0 = shift(tables, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = shift(tables, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * lane;
        n -= 3 * lane;
    }
    *pp = p;
    *np = n;
    return c0;
}

__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c0 = crc_lanes(crc, &p, &n, LANE_LONG, shift_long);
    c0 = crc_lanes(c0, &p, &n, LANE_SHORT, shift_short);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c0 = __builtin_ia32_crc32di(c0, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c0;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

/* Continue a CRC-32C value (the finished value of the bytes before) over n more bytes. */
static uint32_t crc_update(uint32_t value, const unsigned char *p, size_t n) {
    uint32_t crc = ~value;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (crc_hw)
        return ~crc_sse42(crc, p, n);
#endif
    return ~crc_sw(crc, p, n);
}

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline int64_t txid_at(const unsigned char *rec) {
    uint64_t v = 0;
    for (int i = 5; i < 13; i++)
        v = v << 8 | rec[i];
    return (int64_t)v;
}

/* The two checks every record gets; on failure sets ValueError and returns -1. */
static int check_record(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t base, Py_ssize_t *stop, Py_ssize_t *key_end) {
    if (end - pos < MIN_RECORD) {
        PyErr_Format(PyExc_ValueError, "truncated record header at byte %zd", pos - base);
        return -1;
    }
    uint32_t size = be32(buf + pos);
    Py_ssize_t key_len = be16(buf + pos + 13);
    *stop = pos + 4 + (Py_ssize_t)size;
    *key_end = pos + FIXED_SIZE + key_len;
    if (*stop > end || *key_end + 2 > *stop) {
        PyErr_Format(PyExc_ValueError, "record at byte %zd claims %u bytes, %zd remain", pos - base, size, end - pos - 4);
        return -1;
    }
    return 0;
}

static int get_range(PyObject *obj, Py_buffer *view, Py_ssize_t *start, Py_ssize_t *end) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (*end < 0 || *end > view->len)
        *end = view->len;
    if (*start < 0 || *start > *end) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_IndexError, "start lies outside the buffer");
        return -1;
    }
    return 0;
}

/* -- canonical_summary ----------------------------------------------------------------------- */

PyDoc_STRVAR(canonical_summary_doc,
             "canonical_summary(buf, start=0, end=-1) -> (records, bytes, crc32c)\n\n"
             "dlctl.spark.transform.canonical_summary; ValueError where the records break.");

static PyObject *canonical_summary(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t start = 0, end = -1;
    if (!PyArg_ParseTuple(args, "O|nn", &obj, &start, &end))
        return NULL;
    Py_buffer view;
    if (get_range(obj, &view, &start, &end) < 0)
        return NULL;
    const unsigned char *buf = view.buf;
    uint32_t crc = 0;
    unsigned long long nbytes = 0, records = 0;
    Py_ssize_t run_start = start, run_end = start, pos = start;
    unsigned char fixed[MIN_RECORD];
    while (pos < end) {
        Py_ssize_t stop, key_end;
        if (check_record(buf, pos, end, start, &stop, &key_end) < 0)
            goto fail;
        unsigned count = be16(buf + key_end);
        unsigned char flags = buf[pos + 4];
        if (flags & FLAG_CONTROL) {
            pos = stop;
            continue;
        }
        records++;
        Py_ssize_t cur = key_end + 2;
        unsigned reserved = 0, user = 0;
        for (unsigned i = 0; i < count; i++) {
            if (cur + 2 > stop)
                goto overrun;
            Py_ssize_t name_len = be16(buf + cur);
            if (cur + 6 + name_len > stop)
                goto overrun;
            Py_ssize_t h_end = cur + 6 + name_len + (Py_ssize_t)be32(buf + cur + 2 + name_len);
            if (h_end > stop)
                goto overrun;
            if (name_len > 2 && memcmp(buf + cur + 2, "dl.", 3) == 0)
                reserved++;
            else
                user++;
            cur = h_end;
        }
        if (!reserved) {
            /* the record is its own canonical encoding: extend (or start) a run of such bytes */
            if (pos != run_end) {
                if (run_end > run_start) {
                    crc = crc_update(crc, buf + run_start, (size_t)(run_end - run_start));
                    nbytes += (unsigned long long)(run_end - run_start);
                }
                run_start = pos;
            }
            run_end = stop;
        } else {
            if (run_end > run_start) {
                crc = crc_update(crc, buf + run_start, (size_t)(run_end - run_start));
                nbytes += (unsigned long long)(run_end - run_start);
            }
            run_start = run_end = stop;
            Py_ssize_t key_len = key_end - pos - FIXED_SIZE;
            Py_ssize_t size;
            memcpy(fixed + 4, buf + pos + 4, FIXED_SIZE - 4); /* flags, txid, key length as they lie */
            if (user || key_len) {
                Py_ssize_t kept = 0;
                Py_ssize_t c = key_end + 2;
                for (unsigned i = 0; i < count; i++) { /* bounds were checked above */
                    Py_ssize_t name_len = be16(buf + c);
                    Py_ssize_t h_end = c + 6 + name_len + (Py_ssize_t)be32(buf + c + 2 + name_len);
                    if (!(name_len > 2 && memcmp(buf + c + 2, "dl.", 3) == 0))
                        kept += h_end - c;
                    c = h_end;
                }
                size = (FIXED_SIZE - 4) + key_len + 2 + kept + (stop - cur);
                put32(fixed, (uint32_t)size);
                crc = crc_update(crc, fixed, FIXED_SIZE);
                crc = crc_update(crc, buf + pos + FIXED_SIZE, (size_t)key_len);
                fixed[15] = (unsigned char)(user >> 8);
                fixed[16] = (unsigned char)user;
                crc = crc_update(crc, fixed + 15, 2);
                c = key_end + 2;
                for (unsigned i = 0; i < count; i++) {
                    Py_ssize_t name_len = be16(buf + c);
                    Py_ssize_t h_end = c + 6 + name_len + (Py_ssize_t)be32(buf + c + 2 + name_len);
                    if (!(name_len > 2 && memcmp(buf + c + 2, "dl.", 3) == 0))
                        crc = crc_update(crc, buf + c, (size_t)(h_end - c));
                    c = h_end;
                }
            } else { /* only reserved headers (every record a copy wrote): one fixed part */
                size = (MIN_RECORD - 4) + (stop - cur);
                put32(fixed, (uint32_t)size);
                fixed[15] = fixed[16] = 0;
                crc = crc_update(crc, fixed, MIN_RECORD);
            }
            crc = crc_update(crc, buf + cur, (size_t)(stop - cur));
            nbytes += 4 + (unsigned long long)size;
        }
        pos = stop;
        continue;
    overrun:
        PyErr_Format(PyExc_ValueError, "record at byte %zd: header overruns the record", pos - start);
        goto fail;
    }
    if (run_end > run_start) {
        crc = crc_update(crc, buf + run_start, (size_t)(run_end - run_start));
        nbytes += (unsigned long long)(run_end - run_start);
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("KKk", records, nbytes, (unsigned long)crc);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

/* The origin headers every replicated local record gets, after the header count: ``head``
 * (dl.origin.cluster whole, then dl.origin.dlsn's name), the DLSN (``seq_prefix`` and the slot's
 * ``nd`` digits), dl.vt (``vt_name``, then ``before`` + the counter's ``ns`` digits + ``after``).
 * Returns where they end. */
static unsigned char *put_origin(unsigned char *w, const Py_buffer *head, const Py_buffer *seq_prefix, const char *digits, int nd,
                                 const Py_buffer *vt_name, const Py_buffer *before, const char *stamp_digits, int ns, const Py_buffer *after) {
    memcpy(w, head->buf, (size_t)head->len);
    w += head->len;
    put32(w, (uint32_t)(seq_prefix->len + nd));
    w += 4;
    memcpy(w, seq_prefix->buf, (size_t)seq_prefix->len);
    memcpy(w + seq_prefix->len, digits, (size_t)nd);
    w += seq_prefix->len + nd;
    memcpy(w, vt_name->buf, (size_t)vt_name->len);
    w += vt_name->len;
    put32(w, (uint32_t)(before->len + ns + after->len));
    w += 4;
    memcpy(w, before->buf, (size_t)before->len);
    memcpy(w + before->len, stamp_digits, (size_t)ns);
    memcpy(w + before->len + ns, after->buf, (size_t)after->len);
    return w + before->len + ns + after->len;
}

/* -- copy_local ---------------------------------------------------------------------------- */

static int is_totals(uint32_t size, Py_ssize_t key_len) {
    return size == (uint32_t)(TOTALS_SIZE + key_len) || size == (uint32_t)(TOTALS_SIZE_UNTIMED + key_len);
}

PyDoc_STRVAR(copy_local_doc,
             "copy_local(buf, start, end, seq_prefix, head, vt_name, src_name, src_prefix, before, after, counter, reserve)\n"
             "    -> None | (out, records, counter, first_txid, last_txid, last_slot, totals_txid, append_ms)\n\n"
             "The record loop of dlctl.spark.transform.EntryCopier.copy for an entry payload buf[start:end]\n"
             "whose data records carry no headers (written at the source). Returns None when a data record\n"
             "has headers (the caller takes the general path for the entry). ``out`` is a bytearray of\n"
             "``reserve`` bytes (left for the entry header) followed by the sink payload, without the\n"
             "writer's totals record, whose txid is ``totals_txid`` (None: the entry had none) and whose\n"
             "append time is ``append_ms`` (0: none).");

#define MAX_DIGITS 21 /* "-9223372036854775808" plus one */

static PyObject *copy_local(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t start, end, reserve;
    long long counter;
    Py_buffer seq_prefix, head, vt_name, src_name, src_prefix, before, after;
    if (!PyArg_ParseTuple(args, "Onny*y*y*y*y*y*y*Ln", &obj, &start, &end, &seq_prefix, &head, &vt_name, &src_name, &src_prefix, &before, &after, &counter, &reserve))
        return NULL;
    PyObject *result = NULL, *out = NULL;
    Py_buffer view;
    view.obj = NULL;
    if (reserve < 0) {
        PyErr_SetString(PyExc_ValueError, "reserve must be >= 0");
        goto done;
    }
    if (get_range(obj, &view, &start, &end) < 0) {
        view.obj = NULL;
        goto done;
    }
    const unsigned char *buf = view.buf;
    /* What a local record's four new headers add, less the DLSN (twice) and the timestamp. */
    Py_ssize_t added_fixed = head.len + vt_name.len + src_name.len + 12 + src_prefix.len;
    char digits[MAX_DIGITS + 1];

    /* Pass 1: check every record, find the sink payload's size (or that the entry needs the general path). */
    Py_ssize_t length = 0, pos = start, slot = 0;
    long long c = counter;
    while (pos < end) {
        Py_ssize_t stop, key_end;
        if (check_record(buf, pos, end, start, &stop, &key_end) < 0)
            goto done;
        Py_ssize_t key_len = key_end - pos - FIXED_SIZE;
        if (buf[pos + 4] & FLAG_CONTROL) {
            uint32_t size = be32(buf + pos);
            if (!(stop == end && is_totals(size, key_len) && !buf[key_end] && !buf[key_end + 1]))
                length += stop - pos;
        } else if (buf[key_end] || buf[key_end + 1]) {
            result = Py_None; /* headers: the general path */
            Py_INCREF(result);
            goto done;
        } else {
            c++;
            Py_ssize_t n = seq_prefix.len + snprintf(digits, sizeof digits, "%zd", slot);
            Py_ssize_t stamp = before.len + snprintf(digits, sizeof digits, "%lld", c) + after.len;
            length += stop - pos + added_fixed + 2 * n + stamp;
        }
        slot++;
        pos = stop;
    }

    /* Pass 2: write. */
    out = PyByteArray_FromStringAndSize(NULL, reserve + length);
    if (out == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(out) + reserve;
    memset(w - reserve, 0, (size_t)reserve);
    long long records = 0;
    int64_t first_txid = 0, last_txid = 0, totals_txid = 0;
    uint64_t append_ms = 0;
    int have_totals = 0;
    Py_ssize_t last_slot = -1;
    pos = start;
    slot = 0;
    while (pos < end) {
        uint32_t size = be32(buf + pos);
        Py_ssize_t stop = pos + 4 + (Py_ssize_t)size;
        Py_ssize_t key_end = pos + FIXED_SIZE + be16(buf + pos + 13);
        Py_ssize_t key_len = key_end - pos - FIXED_SIZE;
        if (buf[pos + 4] & FLAG_CONTROL) {
            if (stop == end && is_totals(size, key_len) && !buf[key_end] && !buf[key_end + 1]) {
                totals_txid = txid_at(buf + pos); /* the writer's totals: the caller rewrites them */
                have_totals = 1;
                if (size == (uint32_t)(TOTALS_SIZE + key_len))
                    append_ms = (uint64_t)be32(buf + stop - 8) << 32 | be32(buf + stop - 4); /* kept */
            } else {
                memcpy(w, buf + pos, (size_t)(stop - pos));
                w += stop - pos;
            }
        } else {
            counter++;
            int nd = snprintf(digits, sizeof digits, "%zd", slot);
            Py_ssize_t n = seq_prefix.len + nd;
            char stamp_digits[MAX_DIGITS + 1];
            int ns = snprintf(stamp_digits, sizeof stamp_digits, "%lld", counter);
            Py_ssize_t stamp = before.len + ns + after.len;
            put32(w, size + (uint32_t)(added_fixed + 2 * n + stamp));
            memcpy(w + 4, buf + pos + 4, (size_t)(key_end - pos - 4)); /* flags, txid, key length, key */
            w += key_end - pos;
            w[0] = 0;
            w[1] = 4; /* four headers */
            w += 2;
            unsigned char *dlsn = w + head.len + 4;
            w = put_origin(w, &head, &seq_prefix, digits, nd, &vt_name, &before, stamp_digits, ns, &after);
            memcpy(w, src_name.buf, (size_t)src_name.len);
            w += src_name.len;
            put32(w, (uint32_t)(n + src_prefix.len));
            w += 4;
            memcpy(w, src_prefix.buf, (size_t)src_prefix.len);
            w += src_prefix.len;
            memcpy(w, dlsn, (size_t)n);
            w += n;
            memcpy(w, buf + key_end + 2, (size_t)(stop - key_end - 2)); /* the payload */
            w += stop - key_end - 2;
            int64_t txid = txid_at(buf + pos);
            if (!records)
                first_txid = txid;
            last_txid = txid;
            last_slot = slot;
            records++;
        }
        slot++;
        pos = stop;
    }
    if (w != (unsigned char *)PyByteArray_AS_STRING(out) + reserve + length) {
        PyErr_SetString(PyExc_SystemError, "copy_local: sink payload size mismatch");
        goto done;
    }
    if (records)
        result = Py_BuildValue("OLLLLnOK", out, records, counter, (long long)first_txid, (long long)last_txid, last_slot, Py_None, (unsigned long long)append_ms);
    else
        result = Py_BuildValue("OLLOOnOK", out, records, counter, Py_None, Py_None, last_slot, Py_None, (unsigned long long)append_ms);
    if (result != NULL && have_totals) {
        PyObject *t = PyLong_FromLongLong(totals_txid);
        if (t == NULL) {
            Py_CLEAR(result);
        } else {
            PyObject *old = PyTuple_GET_ITEM(result, 6);
            PyTuple_SET_ITEM(result, 6, t);
            Py_DECREF(old);
        }
    }
done:
    Py_XDECREF(out);
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    PyBuffer_Release(&seq_prefix);
    PyBuffer_Release(&head);
    PyBuffer_Release(&vt_name);
    PyBuffer_Release(&src_name);
    PyBuffer_Release(&src_prefix);
    PyBuffer_Release(&before);
    PyBuffer_Release(&after);
    return result;
}

/* -- stream_local ------------------------------------------------------------------------- */

PyDoc_STRVAR(stream_local_doc,
             "stream_local(buf, start, end, slot, seq_prefix, head, vt_name, before, after, counter, txid, limit)\n"
             "    -> None | (out, records, counter, next_pos, next_slot, last_slot, payload_bytes)\n\n"
             "The record loop of a replication stream (dlctl.replication.fastpath) over the records of a\n"
             "source entry payload buf[start:end], the first of them at slot ``slot``: every data record\n"
             "written at the source itself (no headers) becomes the record the stream appends at its sink —\n"
             "the same key and payload, txid ``txid``, ``txid + 1``, ..., and the headers dl.origin.cluster\n"
             "and dl.origin.dlsn (``head``: both names and the cluster's value; the DLSN is ``seq_prefix``\n"
             "and the slot) and dl.vt (``vt_name``; ``before`` + the source's own counter, ``counter + 1``,\n"
             "... + ``after``), in that order. Control records are left out (the sink's writer writes its\n"
             "own). Stops before the record that would take ``out`` past ``limit`` bytes (never before the\n"
             "first); ``next_pos``/``next_slot``: where to go on; ``last_slot``: the last data record's (-1:\n"
             "none). None when a data record has headers (the\n"
             "caller takes the general path for what is left of the entry); ValueError on a broken layout.");

static PyObject *stream_local(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t start, end, slot, limit;
    long long counter, txid;
    Py_buffer seq_prefix, head, vt_name, before, after;
    if (!PyArg_ParseTuple(args, "Onnny*y*y*y*y*LLn", &obj, &start, &end, &slot, &seq_prefix, &head, &vt_name, &before, &after, &counter, &txid, &limit))
        return NULL;
    PyObject *result = NULL, *out = NULL;
    Py_buffer view;
    view.obj = NULL;
    if (get_range(obj, &view, &start, &end) < 0) {
        view.obj = NULL;
        goto done;
    }
    const unsigned char *buf = view.buf;
    /* What the three headers add to a record, less the slot's digits and the counter's. */
    Py_ssize_t added_fixed = head.len + 4 + seq_prefix.len + vt_name.len + 4 + before.len + after.len;
    char digits[MAX_DIGITS + 1];

    /* Pass 1: check the records, find where this call stops and the size of what it writes. */
    Py_ssize_t length = 0, pos = start, stop_at = start, s = slot;
    long long c = counter;
    while (pos < end) {
        Py_ssize_t stop, key_end;
        if (check_record(buf, pos, end, start, &stop, &key_end) < 0)
            goto done;
        if (!(buf[pos + 4] & FLAG_CONTROL)) {
            if (buf[key_end] || buf[key_end + 1]) {
                result = Py_None; /* headers: the general path */
                Py_INCREF(result);
                goto done;
            }
            Py_ssize_t grown = length + (stop - pos) + added_fixed + snprintf(digits, sizeof digits, "%zd", s) + snprintf(digits, sizeof digits, "%lld", c + 1);
            if (grown > limit && length > 0)
                break;
            length = grown;
            c++;
        }
        s++;
        pos = stop;
        stop_at = pos;
    }

    /* Pass 2: write. */
    out = PyBytes_FromStringAndSize(NULL, length);
    if (out == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    long long records = 0, payload_bytes = 0;
    Py_ssize_t last_slot = -1;
    pos = start;
    s = slot;
    while (pos < stop_at) {
        uint32_t size = be32(buf + pos);
        Py_ssize_t stop = pos + 4 + (Py_ssize_t)size;
        Py_ssize_t key_end = pos + FIXED_SIZE + be16(buf + pos + 13);
        if (!(buf[pos + 4] & FLAG_CONTROL)) {
            counter++;
            int nd = snprintf(digits, sizeof digits, "%zd", s);
            char stamp_digits[MAX_DIGITS + 1];
            int ns = snprintf(stamp_digits, sizeof stamp_digits, "%lld", counter);
            put32(w, size + (uint32_t)(added_fixed + nd + ns));
            w[4] = buf[pos + 4]; /* flags */
            uint64_t t = (uint64_t)(txid + records);
            for (int i = 0; i < 8; i++)
                w[5 + i] = (unsigned char)(t >> (56 - 8 * i));
            memcpy(w + 13, buf + pos + 13, (size_t)(key_end - pos - 13)); /* key length, key */
            w += key_end - pos;
            w[0] = 0;
            w[1] = 3; /* three headers */
            w += 2;
            w = put_origin(w, &head, &seq_prefix, digits, nd, &vt_name, &before, stamp_digits, ns, &after);
            memcpy(w, buf + key_end + 2, (size_t)(stop - key_end - 2)); /* the payload */
            w += stop - key_end - 2;
            payload_bytes += stop - key_end - 2;
            last_slot = s;
            records++;
        }
        s++;
        pos = stop;
    }
    if (w != (unsigned char *)PyBytes_AS_STRING(out) + length) {
        PyErr_SetString(PyExc_SystemError, "stream_local: sink records size mismatch");
        goto done;
    }
    result = Py_BuildValue("OLLnnnL", out, records, counter, stop_at, s, last_slot, payload_bytes);
done:
    Py_XDECREF(out);
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    PyBuffer_Release(&seq_prefix);
    PyBuffer_Release(&head);
    PyBuffer_Release(&vt_name);
    PyBuffer_Release(&before);
    PyBuffer_Release(&after);
    return result;
}

/* -- crc32c (for tests: the same values as the crc32c package) ------------------------------- */

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &data, &value))
        return NULL;
    uint32_t crc = crc_update((uint32_t)value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"canonical_summary", canonical_summary, METH_VARARGS, canonical_summary_doc},
    {"copy_local", copy_local, METH_VARARGS, copy_local_doc},
    {"stream_local", stream_local, METH_VARARGS, stream_local_doc},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, value=0): CRC-32C of data, continuing value."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dlctl._speedups", "The per-record loops of the bootstrap copy and of replication streams in C (see _speedups.c).", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    crc_init();
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    crc_lanes_init();
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "hardware_crc", crc_hw) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
