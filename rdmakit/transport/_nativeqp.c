/*
 * The armed responder: a queue pair's responder state, owned here while armed. Part of _fastpath.c's
 * translation unit (#included after the codec and small_request, whose helpers it shares). See
 * docs/architecture.md, "Who owns a QP's state".
 *
 * Armed(qpn, dqpn, psn, msn, mtu, access, rtable, syndrome, pd, stats, held, msg) takes over, from the
 * engine's Responder (QueuePair.arm_ticket), the expected PSN and the MSN of a responder with no output
 * queued but the ACK `held` (psn, syndrome, msn) that a later ACK would replace, between messages (msg None)
 * or within an RDMA WRITE (msg: its R_Key, VA, DMA length, bytes placed, bytes to come and PD generation),
 * and from then on executes the common case itself, with no Python call per packet: in-order RDMA WRITE
 * FIRST, MIDDLE, LAST and ONLY without immediate data (IBTA Vol. 1 §9.7.5, rxe rxe_resp.c: check_psn,
 * check_op_seq, check_op_valid, check_length, check_rkey, then write_data_in and the ACK if AckReq), checked
 * in rxe's order against the QP's access bits and the PD's live R_Key table (every packet resolves the
 * message's whole range again: an entry changes only with the PD's generation, and then the engine resolves
 * it again too), and READs (_nativeread.c). Its ACK is held here, coalesced as Responder.queue_ack coalesces,
 * until the transport takes it (take_ack: the Packet; send_ack: built, ICRC'd and sent in one call).
 *
 *   rx(seg, idx, states, flow) -> bool   True: executed (state here, memory written)
 *   take_ack() -> Packet | None          the pending ACK, counted as sent
 *   send_ack(fd, addr, v6, states, flow) -> errno | -1 (none pending); EAGAIN: still held
 *   disarm() -> (psn, msn, in_msg, w_rkey, w_va, w_len, w_off, w_resid, w_gen, w_view, executed, ack)
 *   pending                              an ACK (or READ responses) is held
 *   Armed.init(write_first, write_middle, write_last)   the opcodes (once, at import)
 *
 * rx declines (False, nothing changed) everything else; the transport then calls the engine, whose every
 * entry point that reads or writes the responder first disarms (QueuePair.disarm): the state comes back
 * exactly as the engine would have left it (the pending ACK back in Responder.out). After disarm() the
 * object refuses everything. The QP's packets_in / packets_out counters are kept current.
 */
#include <time.h>

typedef struct {
    PyObject_HEAD
    uint32_t qpn, dqpn, psn, msn, syndrome;
    Py_ssize_t mtu;
    unsigned long access;
    PyObject *rtable; /* the PD's remote_table (dict, mutated in place by the engine) */
    PyObject *pd;     /* for its generation at each WRITE (Responder.w_gen) */
    PyObject *stats;  /* QpStats: packets_in, packets_out */
    int live, ack;
    uint32_t ack_psn, ack_msn, ack_syn;
    int in_msg; /* a WRITE is under way: FIRST executed, LAST not yet (Responder.in_msg) */
    uint32_t w_rkey;
    uint64_t w_va, w_len, w_off, w_resid; /* w_off + w_resid == w_len */
    PyObject *w_gen; /* None until a WRITE executed (or the ticket's, within a WRITE) */
    PyObject *w_mem; /* the last executed packet's region (its view), the range at w_at of it */
    Py_ssize_t w_at, rd_at;
    unsigned long long executed;
    /* bind(): the source its requests come from, for poll_armed (NULL: not bound) */
    PyObject *states, *flow, *rxflow, *qp;
    PyObject *ids, *counters; /* a kernel sender's IdentWindow and the port's counters (or NULL) */
    struct sockaddr_storage src;
    socklen_t src_len;
    unsigned long long mark; /* the poll_armed call that last woke its QP */
    uint32_t ack_base, rd_psn, rd_msn; /* Responder.ack_psn after the last WRITE; _nativeread.c's below */
    PyObject *rd_res, *rd_mem;         /* READs allowed (RdAtomicResources.new_read, or NULL), held responses */
    int rd_live, rd_new, rd_acked, rd_atomic; /* rd_acked: an atomic or WRITE moved ack_base */
    uint64_t rd_off, rd_resid, rd_orig;
    unsigned long long rd_executed;
} ArmedObject;

static PyObject *s_packets_in, *s_packets_out, *s_generation, *s_icrc_solved, *one_obj;
static PyTypeObject ArmedType;
#define ack_op resp_ops[0] /* ACKNOWLEDGE (init_small_response) */

/* A packet's place in its WRITE (IBTA Vol. 1 §9.8.3.2); ONLY's opcode is small_ops[0]. */
enum { W_FIRST, W_MIDDLE, W_LAST, W_ONLY };
static int armed_ops[3] = {-1, -1, -1}; /* RDMA WRITE FIRST, MIDDLE, LAST (Armed.init) */

/* The position of opcode op in a WRITE without immediate, or -1: not one the armed responder takes. */
static int armed_position(int op) {
    if (op == small_ops[0])
        return W_ONLY;
    for (int i = 0; i < 3; i++)
        if (op == armed_ops[i])
            return i;
    return -1;
}

static PyObject *armed_init_ops(PyObject *Py_UNUSED(cls), PyObject *args) {
    int f, m, l;
    if (!PyArg_ParseTuple(args, "iii:init", &f, &m, &l))
        return NULL;
    if (f < 0 || f > 255 || m < 0 || m > 255 || l < 0 || l > 255) {
        PyErr_SetString(PyExc_ValueError, "Armed.init: an opcode is not a u8");
        return NULL;
    }
    armed_ops[0] = f;
    armed_ops[1] = m;
    armed_ops[2] = l;
    Py_RETURN_NONE;
}

static int armed_init(ArmedObject *self, PyObject *args, PyObject *kwds) {
    unsigned long qpn, dqpn, psn, msn, access, syndrome;
    Py_ssize_t mtu;
    PyObject *rtable, *pd, *stats, *held, *msg;
    unsigned long hpsn = 0, hsyn = 0, hmsn = 0, mrkey = 0;
    unsigned long long mva = 0, mlen = 0, moff = 0, mresid = 0;
    PyObject *mgen = Py_None;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Armed: positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "kkkknkO!kOOOO:Armed", &qpn, &dqpn, &psn, &msn, &mtu, &access, &PyDict_Type, &rtable,
                          &syndrome, &pd, &stats, &held, &msg))
        return -1;
    if (msg != Py_None) {
        if (!PyTuple_Check(msg)) {
            PyErr_SetString(PyExc_TypeError, "Armed: the WRITE under way is (rkey, va, len, off, resid, gen) or None");
            return -1;
        }
        if (!PyArg_ParseTuple(msg, "kKKKKO:Armed WRITE under way", &mrkey, &mva, &mlen, &moff, &mresid, &mgen))
            return -1;
        /* Responder._send_write's invariants within a WRITE: some bytes placed, some to come */
        if (mrkey > 0xFFFFFFFFul || mlen > small_max_msg || moff == 0 || mresid == 0 || moff > mlen ||
            mresid != mlen - moff) {
            PyErr_SetString(PyExc_ValueError, "Armed: the WRITE under way is inconsistent");
            return -1;
        }
    }
    if (held != Py_None) {
        if (!PyTuple_Check(held)) {
            PyErr_SetString(PyExc_TypeError, "Armed: the held ACK is (psn, syndrome, msn) or None");
            return -1;
        }
        if (!PyArg_ParseTuple(held, "kkk:Armed held ACK", &hpsn, &hsyn, &hmsn))
            return -1;
    }
    if (qpn > PSN_MASK || dqpn > PSN_MASK || psn > PSN_MASK || msn > PSN_MASK || syndrome > 0xFF || mtu <= 0 ||
        mtu > UDP_MAX_PAYLOAD || hpsn > PSN_MASK || hsyn > 0xFF || hmsn > PSN_MASK) {
        PyErr_SetString(PyExc_ValueError, "Armed: a field is out of range");
        return -1;
    }
    self->qpn = (uint32_t)qpn;
    self->dqpn = (uint32_t)dqpn;
    self->psn = (uint32_t)psn;
    self->msn = (uint32_t)msn;
    self->mtu = mtu;
    self->access = access;
    self->syndrome = (uint32_t)syndrome;
    Py_INCREF(rtable);
    Py_XSETREF(self->rtable, rtable);
    Py_INCREF(pd);
    Py_XSETREF(self->pd, pd);
    Py_INCREF(stats);
    Py_XSETREF(self->stats, stats);
    Py_INCREF(mgen);
    Py_XSETREF(self->w_gen, mgen);
    self->live = 1;
    self->ack = held != Py_None;
    self->ack_psn = (uint32_t)hpsn;
    self->ack_syn = (uint32_t)hsyn;
    self->ack_msn = (uint32_t)hmsn;
    self->executed = 0;
    self->rd_live = 0, self->rd_executed = 0, self->rd_acked = 0;
    self->in_msg = msg != Py_None;
    self->w_rkey = (uint32_t)mrkey;
    self->w_va = mva;
    self->w_len = mlen;
    self->w_off = moff;
    self->w_resid = mresid;
    return 0;
}

static void armed_dealloc(ArmedObject *self) {
    Py_XDECREF(self->states);
    Py_XDECREF(self->flow);
    Py_XDECREF(self->rxflow);
    Py_XDECREF(self->qp);
    Py_XDECREF(self->ids);
    Py_XDECREF(self->counters);
    Py_XDECREF(self->rtable);
    Py_XDECREF(self->pd);
    Py_XDECREF(self->stats);
    Py_XDECREF(self->w_gen);
    Py_XDECREF(self->w_mem);
    Py_XDECREF(self->rd_res);
    Py_XDECREF(self->rd_mem);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* obj.<name> += 1; -1 with an exception set. */
static int armed_count_on(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    PyObject *w = PyNumber_Add(v, one_obj);
    Py_DECREF(v);
    if (w == NULL)
        return -1;
    int r = PyObject_SetAttr(obj, name, w);
    Py_DECREF(w);
    return r;
}
#define armed_count(self, name) armed_count_on((self)->stats, (name))

#include "_nativeread.c"

/* Execute the n-byte segment p (index idx) if it is the in-order WRITE FIRST, MIDDLE, LAST
 * or ONLY this responder takes: 1 done, 0 declined (nothing changed), -1 with an exception set. */
static int armed_rx_core(ArmedObject *self, const unsigned char *p, Py_ssize_t n, Py_ssize_t idx, PyObject *states,
                         PyObject *flow) {
    int result = -1;
    PyObject *entry = NULL;
    Py_ssize_t off, end;
    if (!self->live || n > UDP_MAX_PAYLOAD || n < BTH_LEN + ICRC_LEN || !codec_ready || self->rd_live)
        return 0; /* behind held READ responses, the engine queues what follows */
    if (rd_takes(p[0]))
        return armed_rdatomic_rx(self, p, n, idx, states, flow);
    int pos = armed_position(p[0]);
    if (pos < 0)
        return 0;
    uint32_t w1 = get_be32(p + 4), w2 = get_be32(p + 8);
    /* decode()'s header checks, then receive()'s P_Key and QPN and on_request()'s PSN */
    if (header_layout(p, n - ICRC_LEN, &off, &end) < 0 || (get_be16(p + 2) & 0x7FFF) != 0x7FFF ||
        (w1 & PSN_MASK) != self->qpn || (w2 & PSN_MASK) != self->psn)
        return 0;
    int icrc = icrc_matches(p, n, idx, states, flow);
    if (icrc <= 0)
        return icrc;
    /* check_op_seq: FIRST and ONLY between messages, MIDDLE and LAST within a WRITE */
    int starts = pos == W_FIRST || pos == W_ONLY;
    if (starts == self->in_msg)
        return 0;
    uint64_t va = self->w_va, len = self->w_len, done = self->w_off, resid = self->w_resid;
    uint32_t rkey = self->w_rkey;
    if (starts) {
        const unsigned char *x = p + BTH_LEN;
        va = get_be64(x);
        rkey = get_be32(x + 8);
        len = resid = get_be32(x + 12);
        done = 0;
    }
    Py_ssize_t plen = end - off;
    /* check_op_valid, check_length (C9-92..C9-94, and the RETH's DMA length against what is
     * left of the message), check_rkey: rxe's order */
    if (!(self->access & small_access[0]))
        return 0;
    int fits;
    switch (pos) {
    case W_FIRST:
        fits = plen == self->mtu && len <= small_max_msg && (uint64_t)plen < resid;
        break;
    case W_MIDDLE:
        fits = plen == self->mtu && (uint64_t)plen < resid;
        break;
    case W_LAST: /* the rest of the message, 1 byte to an MTU */
        fits = plen > 0 && plen <= self->mtu && (uint64_t)plen == resid;
        break;
    default: /* ONLY: the whole message, 0 bytes to an MTU (none: no R_Key to check, rxe check_rkey) */
        fits = plen <= self->mtu && (uint64_t)plen == resid;
    }
    if (!fits)
        return 0;
    Py_ssize_t at = 0;
    if (len) {
        at = small_region(self->rtable, rkey, va, len, small_access[0], &entry);
        if (at < 0)
            return at == -2 ? -1 : 0;
    }
    PyObject *gen = PyObject_GetAttr(self->pd, s_generation);
    if (gen == NULL)
        goto out;
    Py_buffer t;
    if (entry != NULL) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(entry, 3), &t, PyBUF_WRITABLE) < 0) {
            Py_DECREF(gen);
            goto out;
        }
        if ((uint64_t)t.len < (uint64_t)at + len || done > len || (uint64_t)plen > len - done) {
            PyBuffer_Release(&t);
            Py_DECREF(gen);
            result = 0;
            goto out;
        }
    }
    if (armed_count(self, s_packets_in) < 0) {
        if (entry != NULL)
            PyBuffer_Release(&t);
        Py_DECREF(gen);
        goto out;
    }
    if (entry != NULL) {
        memcpy((unsigned char *)t.buf + at + done, p + off, (size_t)plen);
        PyBuffer_Release(&t);
    }
    Py_XSETREF(self->w_mem, entry != NULL ? Py_NewRef(PyTuple_GET_ITEM(entry, 3)) : NULL);
    /* Responder._send_write's state after the packet, then queue_ack if AckReq (coalesced:
     * it replaces a held ACK) */
    Py_XSETREF(self->w_gen, gen);
    self->w_at = at;
    self->w_rkey = rkey;
    self->w_va = va;
    self->w_len = len;
    self->w_off = done + (uint64_t)plen;
    self->w_resid = len - self->w_off;
    self->in_msg = pos == W_FIRST || pos == W_MIDDLE;
    if (!self->in_msg)
        self->msn = (self->msn + 1) & PSN_MASK;
    self->psn = (self->psn + 1) & PSN_MASK;
    self->ack_base = self->psn, self->rd_acked = 1;
    self->executed++;
    if (w2 >> 31) {
        self->ack = 1;
        self->ack_psn = w2 & PSN_MASK;
        self->ack_msn = self->msn;
        self->ack_syn = self->syndrome;
    }
    result = 1;
out:
    Py_XDECREF(entry);
    return result;
}

static PyObject *armed_rx(ArmedObject *self, PyObject *args) {
    PyObject *seg, *states, *flow;
    Py_ssize_t idx;
    if (!PyArg_ParseTuple(args, "OnO!O:rx", &seg, &idx, &PyDict_Type, &states, &flow))
        return NULL;
    Py_buffer b;
    if (segment_view(seg, idx, "rx", &b) < 0)
        return NULL;
    int r = armed_rx_core(self, b.buf, b.len, idx, states, flow);
    PyBuffer_Release(&b);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *armed_bind(ArmedObject *self, PyObject *args) {
    PyObject *addr, *states, *flow, *rxflow, *qp, *ids = Py_None, *counters = Py_None;
    int v6;
    if (!PyArg_ParseTuple(args, "OpO!OOO|OO:bind", &addr, &v6, &PyDict_Type, &states, &flow, &rxflow, &qp, &ids,
                          &counters))
        return NULL;
    if (parse_addr(addr, v6, &self->src, &self->src_len) < 0)
        return NULL;
    Py_INCREF(states);
    Py_XSETREF(self->states, states);
    Py_INCREF(flow);
    Py_XSETREF(self->flow, flow);
    Py_INCREF(rxflow);
    Py_XSETREF(self->rxflow, rxflow);
    Py_INCREF(qp);
    Py_XSETREF(self->qp, qp);
    Py_XSETREF(self->ids, ids == Py_None ? NULL : Py_NewRef(ids));
    Py_XSETREF(self->counters, counters == Py_None ? NULL : Py_NewRef(counters));
    Py_RETURN_NONE;
}

/* Armed.rx for the device poll: the ICRC with our IPv4 ID (0), or, bound to a kernel sender
 * (rxe numbers its own), with the ID it most likely used next, taken as RxSources.other_ident
 * takes it (IdentWindow.accept at CLOCK_MONOTONIC's now, time.monotonic's clock; counted
 * icrc_solved). 1 done, 0 declined, -1 with an exception set. */
static int armed_poll_rx(ArmedObject *a, const unsigned char *p, Py_ssize_t n) {
    if (a->ids == NULL)
        return armed_rx_core(a, p, n, 0, a->states, a->flow);
    PyObject *nxt = PyObject_CallMethod(a->ids, "next", NULL);
    if (nxt == NULL)
        return -1;
    Py_ssize_t ident = nxt == Py_None ? -1 : PyLong_AsSsize_t(nxt);
    int done = PyErr_Occurred() ? -1 : 0;
    if (!done && ident >= 0 && ident <= 0xFFFF)
        done = armed_rx_core(a, p, n, ident, a->states, a->flow);
    if (done > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        PyObject *r = PyObject_CallMethod(a->ids, "accept", "Od", nxt, (double)ts.tv_sec + ts.tv_nsec * 1e-9);
        if (r == NULL || (a->counters != NULL && armed_count_on(a->counters, s_icrc_solved) < 0))
            done = -1;
        Py_XDECREF(r);
    }
    Py_DECREF(nxt);
    return done;
}

#include "_nativeqp_ack.c"

static PyObject *armed_disarm(ArmedObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->live) {
        PyErr_SetString(PyExc_RuntimeError, "disarm: not armed");
        return NULL;
    }
    /* Within a WRITE that a packet here continued: the view of its range (_send_write's w_view) */
    PyObject *view = self->in_msg && self->w_mem != NULL
                         ? PySequence_GetSlice(self->w_mem, self->w_at, self->w_at + (Py_ssize_t)self->w_len)
                         : Py_NewRef(Py_None);
    if (view == NULL)
        return NULL;
    PyObject *ack = Py_None;
    Py_INCREF(ack);
    if (self->ack) {
        Py_DECREF(ack);
        ack = armed_ack_packet(self);
        if (ack == NULL) {
            Py_DECREF(view);
            return NULL;
        }
    }
    self->live = 0;
    self->ack = 0;
    return Py_BuildValue("kkOkKKKKONKN", (unsigned long)self->psn, (unsigned long)self->msn,
                         self->in_msg ? Py_True : Py_False, (unsigned long)self->w_rkey,
                         (unsigned long long)self->w_va, (unsigned long long)self->w_len,
                         (unsigned long long)self->w_off, (unsigned long long)self->w_resid, self->w_gen, view,
                         self->executed, ack);
}

static PyObject *armed_pending(ArmedObject *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->live && (self->ack || self->rd_live));
}

#include "_nativepoll.c"

static PyMethodDef armed_methods[] = {
    {"bind", (PyCFunction)armed_bind, METH_VARARGS,
     "bind((ip, port), v6, states, flow, rxflow, qp[, ids, counters]): its requests' source, for poll_armed "
     "(ids: a kernel sender's IdentWindow, counters: the port's, for its IDs)."},
    {"rx", (PyCFunction)armed_rx, METH_VARARGS,
     "rx(seg, idx, states, flow) -> bool: execute an in-order WRITE FIRST, MIDDLE, LAST or ONLY."},
    {"take_ack", (PyCFunction)armed_take_ack, METH_NOARGS, "The held ACK as a Packet (counted as sent), or None."},
    {"send_ack", (PyCFunction)armed_send_ack, METH_VARARGS, "Send the held ACK: errno, or -1 if none is held."},
    {"disarm", (PyCFunction)armed_disarm, METH_NOARGS,
     "Hand the state back: (psn, msn, in_msg, w_rkey, w_va, w_len, w_off, w_resid, w_gen, w_view, executed, "
     "ACK Packet or None)."},
    ARMED_READ_METHODS
    {"init", (PyCFunction)armed_init_ops, METH_VARARGS | METH_STATIC,
     "init(write_first, write_middle, write_last): the opcodes the armed responder takes besides WRITE ONLY."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef armed_getset[] = {
    {"pending", (getter)armed_pending, NULL, "An ACK or READ responses are held.", NULL},
    ARMED_READ_GETSET
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ArmedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rdmakit.transport._fastpath.Armed",
    .tp_basicsize = sizeof(ArmedObject),
    .tp_dealloc = (destructor)armed_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A responder's expected PSN and MSN, owned natively while armed (see the source).",
    .tp_methods = armed_methods,
    .tp_getset = armed_getset,
    .tp_init = (initproc)armed_init,
    .tp_new = PyType_GenericNew,
};

/* Called from PyInit__fastpath: the type and its interned names; -1 with an exception set. */
static int armed_setup(PyObject *m) {
    s_packets_in = PyUnicode_InternFromString("packets_in");
    s_packets_out = PyUnicode_InternFromString("packets_out");
    s_generation = PyUnicode_InternFromString("generation");
    s_icrc_solved = PyUnicode_InternFromString("icrc_solved");
    s_ours = PyUnicode_InternFromString("ours");
    s_kernel = PyUnicode_InternFromString("kernel");
    one_obj = PyLong_FromLong(1);
    if (s_packets_in == NULL || s_packets_out == NULL || s_generation == NULL || s_icrc_solved == NULL ||
        s_ours == NULL || s_kernel == NULL || one_obj == NULL)
        return -1;
    if (PyType_Ready(&ArmedType) < 0)
        return -1;
    Py_INCREF(&ArmedType);
    if (PyModule_AddObject(m, "Armed", (PyObject *)&ArmedType) < 0) {
        Py_DECREF(&ArmedType);
        return -1;
    }
    return 0;
}
