/*
 * The armed requester's completer: cumulative ACKs of sent SEND/WRITE WQEs, retired natively.
 *
 * Part of _fastpath.c's translation unit (it is #included there, after the codec and
 * small_response, whose helpers it shares). See docs/architecture.md, "Who owns a QP's
 * state".
 *
 * ArmedReq(qp, req, cq, completion, success, qpn) is made once per QP
 * (QueuePair.arm_req_ticket) and takes, from then on, the requester's common
 * response itself: an ACKNOWLEDGE with an ACK syndrome that acknowledges one or more
 * whole SEND or RDMA WRITE WQEs at the head of the send queue, in order (IBTA Vol. 1
 * §9.7.5.1.1; rxe rxe_comp.c check_psn, check_ack, do_complete). It checks the packet as
 * decode(), QueuePair.receive() and on_response() check it (the header, P_Key, QPN,
 * the PSN against what was sent and against comp_psn, the ICRC of segment idx, the
 * syndrome, no payload), then completes each WQE the ACK covers: pops it from the
 * send queue, lowers next_idx and appends its Completion (SUCCESS, when signaled) to
 * the send CQ's entries, as QueuePair.complete_send_head does, with no Python call.
 *
 *   rx(seg, idx, states, flow, now) -> bool   True: taken (WQEs completed, log grown)
 *   take() -> list                            the log since the last take, emptied
 *
 * The requester's bookkeeping that the congestion rules own (comp_psn, the retry
 * counters, the retransmit timer, the window and the RTT estimator) is logged, one
 * entry per ACK: (syndrome, MSN, now, (comp_psn after each WQE, ...)), and the engine
 * takes the log with QueuePair.acks_taken before any other call reaches the QP (the
 * caller of rx does it at once). Until then comp_psn is this object's (shadow); the
 * engine's copy is stale.
 *
 * rx declines (False, nothing changed) everything else: a NAK, an RNR NAK, an ACK of a
 * READ or atomic, a duplicate, an ACK inside a WQE, a local error behind the covered
 * WQEs, a CQ without room for the completions, a QP not in RTS/SQD, and so on. The
 * engine then takes the packet its generic way.
 */

typedef struct {
    PyObject_HEAD
    PyObject *qp, *req, *cq, *completion, *success;
    uint32_t qpn;
    PyObject *log; /* list of (syndrome, msn, now, (comp_psn, ...)) since the last take() */
    uint32_t shadow; /* comp_psn as of the last logged ACK (valid while log is not empty) */
    /* bind(): the source its ACKs come from, for poll_armed (states NULL: not bound) */
    PyObject *states, *flow, *rxflow;
    struct sockaddr_storage src;
    socklen_t src_len;
} ArmedReqObject;

static PyObject *s_sq, *s_next_idx, *s_comp_psn, *s_comp_opcode, *s_sent_hwm, *s_entries, *s_depth, *s_rx_on,
    *s_tx_on, *s_fast_on, *s_kind, *s_state, *s_started, *s_status, *s_last_psn, *s_signaled, *s_wc_opcode,
    *s_length, *s_wr, *s_wr_id, *s_has_rd, *s_popleft, *s_append;
static PyObject *req_kw_names; /* ("wr_id", "status", "opcode", "byte_len", "qp_num") */
static PyTypeObject ArmedReqType;
#define REQ_PENDING 2 /* WqeState.PENDING */
#define REQ_SEND_WRITE 0 /* WqeKind.SEND_WRITE */
#define REQ_MAX_COVER 64 /* WQEs one ACK may complete here (more: the engine's) */
#define REQ_HALF 0x800000u /* half the PSN space (rdmakit.wire.PSN_HALF) */

static int armedreq_init(ArmedReqObject *self, PyObject *args, PyObject *kwds) {
    PyObject *qp, *req, *cq, *completion, *success;
    unsigned long qpn;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "ArmedReq: positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOk:ArmedReq", &qp, &req, &cq, &completion, &success, &qpn))
        return -1;
    if (qpn > PSN_MASK) {
        PyErr_SetString(PyExc_ValueError, "ArmedReq: the QPN is not a u24");
        return -1;
    }
    PyObject *log = PyList_New(0);
    if (log == NULL)
        return -1;
    Py_XSETREF(self->log, log);
    Py_XSETREF(self->qp, Py_NewRef(qp));
    Py_XSETREF(self->req, Py_NewRef(req));
    Py_XSETREF(self->cq, Py_NewRef(cq));
    Py_XSETREF(self->completion, Py_NewRef(completion));
    Py_XSETREF(self->success, Py_NewRef(success));
    self->qpn = (uint32_t)qpn;
    return 0;
}

/* It holds its QP, which holds it: a cycle the collector breaks. */
static int armedreq_traverse(ArmedReqObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->qp);
    Py_VISIT(self->req);
    Py_VISIT(self->cq);
    Py_VISIT(self->completion);
    Py_VISIT(self->success);
    Py_VISIT(self->log);
    Py_VISIT(self->states);
    Py_VISIT(self->flow);
    Py_VISIT(self->rxflow);
    return 0;
}

static int armedreq_clear(ArmedReqObject *self) {
    Py_CLEAR(self->qp);
    Py_CLEAR(self->req);
    Py_CLEAR(self->cq);
    Py_CLEAR(self->completion);
    Py_CLEAR(self->success);
    Py_CLEAR(self->log);
    Py_CLEAR(self->states);
    Py_CLEAR(self->flow);
    Py_CLEAR(self->rxflow);
    return 0;
}

static void armedreq_dealloc(ArmedReqObject *self) {
    PyObject_GC_UnTrack(self);
    armedreq_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* o.name as a C long in *v: 0 done, -1 with an exception set. */
static int attr_long(PyObject *o, PyObject *name, long *v) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (x == NULL)
        return -1;
    *v = PyLong_AsLong(x);
    Py_DECREF(x);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

/* o.name's truth: 1, 0, or -1 with an exception set. */
static int attr_true(PyObject *o, PyObject *name) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (x == NULL)
        return -1;
    int t = PyObject_IsTrue(x);
    Py_DECREF(x);
    return t;
}

/* 1: wqe is a sent, pending SEND/WRITE without a local error or a READ slot, its last PSN in
 * *last; 0: it is not; -1: an exception is set. */
static int pending_send_write(PyObject *wqe, uint32_t *last) {
    long kind, state, status, lastv;
    if (attr_long(wqe, s_kind, &kind) < 0 || attr_long(wqe, s_state, &state) < 0 ||
        attr_long(wqe, s_status, &status) < 0 || attr_long(wqe, s_last_psn, &lastv) < 0)
        return -1;
    int started = attr_true(wqe, s_started), has_rd = started < 0 ? -1 : attr_true(wqe, s_has_rd);
    if (has_rd < 0)
        return -1;
    *last = (uint32_t)lastv & PSN_MASK;
    return kind == REQ_SEND_WRITE && state == REQ_PENDING && !status && started && !has_rd;
}

/* Take the n-byte ACK p (segment idx) arriving at `now`: 1 done, 0 declined (nothing
 * changed), -1 with an exception set. */
static int armedreq_rx_core(ArmedReqObject *self, const unsigned char *p, Py_ssize_t n, Py_ssize_t idx,
                            PyObject *states, PyObject *flow, double now) {
    Py_ssize_t off, end;
    if (self->log == NULL || self->qp == NULL || self->req == NULL || self->cq == NULL)
        return 0; /* not initialised, or cleared */
    if (n > UDP_MAX_PAYLOAD || n < BTH_LEN + 4 + ICRC_LEN || !codec_ready || ack_op < 0 || p[0] != ack_op)
        return 0;
    uint32_t w1 = get_be32(p + 4), w2 = get_be32(p + 8), psn = w2 & PSN_MASK;
    if (header_layout(p, n - ICRC_LEN, &off, &end) < 0 || end != off || (get_be16(p + 2) & 0x7FFF) != 0x7FFF ||
        (w1 & PSN_MASK) != self->qpn || p[BTH_LEN] >> 5 != 0)
        return 0;
    /* QueuePair.receive: receiving; the completer: sending, the fast paths on */
    int on = attr_true(self->qp, s_rx_on);
    if (on > 0)
        on = attr_true(self->qp, s_tx_on);
    if (on > 0)
        on = attr_true(self->qp, s_fast_on);
    if (on <= 0)
        return on;
    PyObject *req = self->req;
    long comp_l, hwm_l, next_idx;
    if (attr_long(req, s_sent_hwm, &hwm_l) < 0 || attr_long(req, s_next_idx, &next_idx) < 0)
        return -1;
    uint32_t comp = self->shadow;
    if (PyList_GET_SIZE(self->log) == 0) {
        PyObject *op = PyObject_GetAttr(req, s_comp_opcode);
        if (op == NULL)
            return -1;
        int none = op == Py_None;
        Py_DECREF(op);
        if (!none)
            return 0; /* a READ's responses under way */
        if (attr_long(req, s_comp_psn, &comp_l) < 0)
            return -1;
        comp = (uint32_t)comp_l & PSN_MASK;
    }
    uint32_t hwm = (uint32_t)hwm_l & PSN_MASK;
    /* on_response: not past what was sent; not before comp_psn (a duplicate) */
    if (((psn - hwm) & PSN_MASK) < REQ_HALF || ((psn - comp) & PSN_MASK) >= REQ_HALF)
        return 0;
    PyObject *sq = PyObject_GetAttr(req, s_sq);
    if (sq == NULL)
        return -1;
    int result = -1;
    Py_ssize_t len = PySequence_Length(sq), k = 0, signaled = 0;
    uint32_t lasts[REQ_MAX_COVER];
    int sig[REQ_MAX_COVER];
    if (len < 0)
        goto out;
    /* check_psn: the WQEs the ACK covers, each wholly (the last one ends at psn) */
    uint32_t c = comp;
    for (;;) {
        if (k >= len || k >= REQ_MAX_COVER || k >= next_idx) {
            result = 0;
            goto out;
        }
        PyObject *wqe = PySequence_GetItem(sq, k);
        if (wqe == NULL)
            goto out;
        uint32_t last = 0;
        int ok = pending_send_write(wqe, &last);
        int s = ok > 0 ? attr_true(wqe, s_signaled) : 0;
        Py_DECREF(wqe);
        if (ok < 0 || s < 0)
            goto out;
        if (!ok || ((last - c) & PSN_MASK) >= REQ_HALF || ((psn - last) & PSN_MASK) >= REQ_HALF) {
            result = 0;
            goto out;
        }
        lasts[k] = last;
        sig[k] = s;
        signaled += s;
        c = (last + 1) & PSN_MASK;
        k++;
        if (last == psn)
            break;
    }
    /* complete_send_head: a local error behind them fails at once (the engine's) */
    if (k < len) {
        PyObject *wqe = PySequence_GetItem(sq, k);
        if (wqe == NULL)
            goto out;
        long status;
        int bad = attr_long(wqe, s_status, &status);
        Py_DECREF(wqe);
        if (bad < 0)
            goto out;
        if (status) {
            result = 0;
            goto out;
        }
    }
    /* the CQ has room for every completion (an overrun is the engine's) */
    PyObject *entries = PyObject_GetAttr(self->cq, s_entries);
    if (entries == NULL)
        goto out;
    long depth;
    Py_ssize_t held = PySequence_Length(entries);
    if (held < 0 || attr_long(self->cq, s_depth, &depth) < 0) {
        Py_DECREF(entries);
        goto out;
    }
    if (held + signaled > depth) {
        Py_DECREF(entries);
        result = 0;
        goto out;
    }
    /* The ICRC last: the costliest check, and the one that must not be skipped. */
    int icrc = icrc_matches(p, n, idx, states, flow);
    if (icrc <= 0) {
        Py_DECREF(entries);
        result = icrc;
        goto out;
    }
    PyObject *comps = PyTuple_New(k);
    if (comps == NULL) {
        Py_DECREF(entries);
        goto out;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *v = PyLong_FromUnsignedLong((lasts[i] + 1) & PSN_MASK);
        if (v == NULL) {
            Py_DECREF(comps);
            Py_DECREF(entries);
            goto out;
        }
        PyTuple_SET_ITEM(comps, i, v);
    }
    PyObject *entry = Py_BuildValue("kkdN", (unsigned long)p[BTH_LEN], (unsigned long)(get_be32(p + BTH_LEN) & PSN_MASK),
                                    now, comps);
    if (entry == NULL || PyList_Append(self->log, entry) < 0) {
        Py_XDECREF(entry);
        Py_DECREF(entries);
        goto out;
    }
    Py_DECREF(entry);
    /* Committed: complete each covered WQE (QueuePair.complete_send_head). */
    PyObject *nidx = PyLong_FromLong(next_idx - (long)k);
    int bad = nidx == NULL || PyObject_SetAttr(req, s_next_idx, nidx) < 0;
    Py_XDECREF(nidx);
    for (Py_ssize_t i = 0; i < k && !bad; i++) {
        PyObject *wqe = PyObject_CallMethodNoArgs(sq, s_popleft);
        if (wqe == NULL) {
            bad = 1;
            break;
        }
        if (sig[i]) {
            PyObject *wr = PyObject_GetAttr(wqe, s_wr);
            PyObject *wr_id = wr == NULL ? NULL : PyObject_GetAttr(wr, s_wr_id);
            PyObject *wc_op = wr_id == NULL ? NULL : PyObject_GetAttr(wqe, s_wc_opcode);
            PyObject *length = wc_op == NULL ? NULL : PyObject_GetAttr(wqe, s_length);
            PyObject *qpn = length == NULL ? NULL : PyLong_FromUnsignedLong(self->qpn);
            PyObject *wc = NULL;
            if (qpn != NULL) {
                PyObject *argv[5] = {wr_id, self->success, wc_op, length, qpn};
                wc = PyObject_Vectorcall(self->completion, argv, 0, req_kw_names);
            }
            PyObject *r = wc == NULL ? NULL : PyObject_CallMethodOneArg(entries, s_append, wc);
            bad = r == NULL;
            Py_XDECREF(r);
            Py_XDECREF(wc);
            Py_XDECREF(qpn);
            Py_XDECREF(length);
            Py_XDECREF(wc_op);
            Py_XDECREF(wr_id);
            Py_XDECREF(wr);
        }
        Py_DECREF(wqe);
    }
    Py_DECREF(entries);
    if (bad)
        goto out;
    self->shadow = c;
    result = 1;
out:
    Py_DECREF(sq);
    return result;
}

static PyObject *armedreq_rx(ArmedReqObject *self, PyObject *args) {
    PyObject *seg, *states, *flow;
    Py_ssize_t idx;
    double now;
    if (!PyArg_ParseTuple(args, "OnO!Od:rx", &seg, &idx, &PyDict_Type, &states, &flow, &now))
        return NULL;
    Py_buffer b;
    if (segment_view(seg, idx, "rx", &b) < 0)
        return NULL;
    int r = armedreq_rx_core(self, b.buf, b.len, idx, states, flow, now);
    PyBuffer_Release(&b);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *armedreq_take(ArmedReqObject *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *log = self->log;
    self->log = fresh;
    if (log == NULL)
        return PyList_New(0);
    return log;
}

static PyObject *armedreq_bind(ArmedReqObject *self, PyObject *args) {
    PyObject *addr, *states, *flow, *rxflow;
    int v6;
    if (!PyArg_ParseTuple(args, "OpO!OO:bind", &addr, &v6, &PyDict_Type, &states, &flow, &rxflow))
        return NULL;
    if (parse_addr(addr, v6, &self->src, &self->src_len) < 0)
        return NULL;
    Py_XSETREF(self->states, Py_NewRef(states));
    Py_XSETREF(self->flow, Py_NewRef(flow));
    Py_XSETREF(self->rxflow, Py_NewRef(rxflow));
    Py_RETURN_NONE;
}

static int armedreq_poll_one(PyObject *reqs, const unsigned char *p, Py_ssize_t n,
                             const struct sockaddr_storage *from, socklen_t from_len, double now, PyObject *active,
                             PyObject *strikes, PyObject *touched) {
    PyObject *key = PyLong_FromUnsignedLong(get_be32(p + 4) & PSN_MASK);
    if (key == NULL)
        return -1;
    PyObject *v = PyDict_GetItemWithError(reqs, key); /* borrowed */
    if (v == NULL || Py_TYPE(v) != &ArmedReqType) {
        Py_DECREF(key);
        return PyErr_Occurred() ? -1 : 0;
    }
    ArmedReqObject *r = (ArmedReqObject *)Py_NewRef(v);
    int done = 0;
    if (r->states != NULL && r->qp != NULL && addr_matches(&r->src, from, from_len)) {
        done = armedreq_rx_core(r, p, n, 0, r->states, r->flow, now);
        if (done > 0 && PyList_GET_SIZE(r->log) == 1) {
            /* the first ACK it took in this poll: its QP wakes, its log is handed over */
            int bad = PyDict_SetItem(active, key, r->qp) < 0 || PyList_Append(touched, r->qp) < 0;
            if (!bad) {
                PyObject *kernel = PyObject_GetAttr(r->rxflow, s_kernel);
                int k = kernel == NULL ? -1 : PyObject_IsTrue(kernel);
                Py_XDECREF(kernel);
                bad = k < 0 || (!k && PyObject_SetAttr(r->rxflow, s_ours, strikes) < 0);
            }
            if (bad)
                done = -1;
        }
    }
    Py_DECREF(r);
    Py_DECREF(key);
    return done;
}

static PyMethodDef armedreq_methods[] = {
    {"bind", (PyCFunction)armedreq_bind, METH_VARARGS,
     "bind((ip, port), v6, states, flow, rxflow): its ACKs' source, for poll_armed."},
    {"rx", (PyCFunction)armedreq_rx, METH_VARARGS,
     "rx(seg, idx, states, flow, now) -> bool: retire the SEND/WRITE WQEs an in-order ACK covers."},
    {"take", (PyCFunction)armedreq_take, METH_NOARGS,
     "The log since the last take: [(syndrome, msn, now, (comp_psn after each WQE, ...)), ...]."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ArmedReqType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rdmakit.transport._fastpath.ArmedReq",
    .tp_basicsize = sizeof(ArmedReqObject),
    .tp_dealloc = (destructor)armedreq_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)armedreq_traverse,
    .tp_clear = (inquiry)armedreq_clear,
    .tp_doc = "A requester's in-order ACKs of SEND/WRITE WQEs, retired natively (see the source).",
    .tp_methods = armedreq_methods,
    .tp_init = (initproc)armedreq_init,
    .tp_new = PyType_GenericNew,
};

/* Called from PyInit__fastpath: the type and its interned names; -1 with an exception set. */
static int armedreq_setup(PyObject *m) {
    struct {
        PyObject **p;
        const char *s;
    } names[] = {
        {&s_sq, "sq"}, {&s_next_idx, "next_idx"}, {&s_comp_psn, "comp_psn"}, {&s_comp_opcode, "comp_opcode"},
        {&s_sent_hwm, "sent_hwm"}, {&s_entries, "_entries"}, {&s_depth, "depth"}, {&s_rx_on, "_rx"},
        {&s_tx_on, "_tx"}, {&s_fast_on, "_fast"}, {&s_kind, "kind"}, {&s_state, "state"},
        {&s_started, "started"}, {&s_status, "status"}, {&s_last_psn, "last_psn"}, {&s_signaled, "signaled"},
        {&s_wc_opcode, "wc_opcode"}, {&s_length, "length"}, {&s_wr, "wr"}, {&s_wr_id, "wr_id"},
        {&s_has_rd, "has_rd"}, {&s_popleft, "popleft"}, {&s_append, "append"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].p = PyUnicode_InternFromString(names[i].s)) == NULL)
            return -1;
    req_kw_names = Py_BuildValue("(sssss)", "wr_id", "status", "opcode", "byte_len", "qp_num");
    if (req_kw_names == NULL)
        return -1;
    if (PyType_Ready(&ArmedReqType) < 0)
        return -1;
    Py_INCREF(&ArmedReqType);
    if (PyModule_AddObject(m, "ArmedReq", (PyObject *)&ArmedReqType) < 0) {
        Py_DECREF(&ArmedReqType);
        return -1;
    }
    return 0;
}
