/*
 * The armed responder: a queue pair's responder state, owned here while armed.
 *
 * Part of _fastpath.c's translation unit (it is #included there, after the codec and
 * small_request, whose helpers it shares). See docs/architecture.md, "Who owns a QP's
 * state".
 *
 * Armed(qpn, dqpn, psn, msn, mtu, access, rtable, syndrome, pd, stats, held) takes over,
 * from the engine's Responder (QueuePair.arm_ticket), the expected PSN and the MSN of a
 * responder between messages with no output queued but the ACK `held` (psn, syndrome,
 * msn) that a later ACK would replace, and from then on executes the
 * common case itself, with no Python call per packet: an in-order RDMA WRITE ONLY
 * without immediate data (IBTA Vol. 1 §9.7.5, rxe rxe_resp.c: check_psn, check_op_valid,
 * check_length, check_rkey, then write_data_in and the ACK if AckReq), checked in rxe's
 * order against the QP's access bits and the PD's R_Key table (the engine's live dict,
 * read per packet). Its ACK is held here, coalesced as Responder.queue_ack coalesces
 * (a later ACK of the same kind replaces it), until the transport takes it (take_ack:
 * the Packet; send_ack: built, ICRC'd and sent in one call).
 *
 *   rx(seg, idx, states, flow) -> bool   True: executed (state here, memory written)
 *   take_ack() -> Packet | None          the pending ACK, counted as sent
 *   send_ack(fd, addr, v6, states, flow) -> errno | -1 (none pending); EAGAIN: still held
 *   disarm() -> (psn, msn, w_rkey, w_va, w_len, w_gen, executed, ack)
 *   pending                              an ACK is held
 *
 * rx declines (False, nothing changed) everything else; the transport then calls the
 * engine, whose every entry point that reads or writes the responder first disarms
 * (QueuePair.disarm): the state comes back exactly as Responder.write_only_executed
 * and queue_ack would have left it (the pending ACK back in Responder.out). After
 * disarm() the object refuses everything. The QP's packets_in / packets_out counters
 * are kept current (the stats object's attributes), so nothing is stale while armed.
 */

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
    uint32_t w_rkey;
    uint64_t w_va, w_len;
    PyObject *w_gen; /* None until a WRITE executed */
    unsigned long long executed;
    /* bind(): the source its requests come from, for poll_armed (NULL: not bound) */
    PyObject *states, *flow, *rxflow, *qp;
    struct sockaddr_storage src;
    socklen_t src_len;
    unsigned long long mark; /* the poll_armed call that last woke its QP */
} ArmedObject;

static PyObject *s_packets_in, *s_packets_out, *s_generation, *one_obj;
static PyTypeObject ArmedType;
#define ack_op resp_ops[0] /* ACKNOWLEDGE (init_small_response) */

static int armed_init(ArmedObject *self, PyObject *args, PyObject *kwds) {
    unsigned long qpn, dqpn, psn, msn, access, syndrome;
    Py_ssize_t mtu;
    PyObject *rtable, *pd, *stats, *held;
    unsigned long hpsn = 0, hsyn = 0, hmsn = 0;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Armed: positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "kkkknkO!kOOO:Armed", &qpn, &dqpn, &psn, &msn, &mtu, &access, &PyDict_Type, &rtable,
                          &syndrome, &pd, &stats, &held))
        return -1;
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
    Py_INCREF(Py_None);
    Py_XSETREF(self->w_gen, Py_None);
    self->live = 1;
    self->ack = held != Py_None;
    self->ack_psn = (uint32_t)hpsn;
    self->ack_syn = (uint32_t)hsyn;
    self->ack_msn = (uint32_t)hmsn;
    self->executed = 0;
    self->w_rkey = 0;
    self->w_va = self->w_len = 0;
    return 0;
}

static void armed_dealloc(ArmedObject *self) {
    Py_XDECREF(self->states);
    Py_XDECREF(self->flow);
    Py_XDECREF(self->rxflow);
    Py_XDECREF(self->qp);
    Py_XDECREF(self->rtable);
    Py_XDECREF(self->pd);
    Py_XDECREF(self->stats);
    Py_XDECREF(self->w_gen);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* stats.<name> += 1; -1 with an exception set. */
static int armed_count(ArmedObject *self, PyObject *name) {
    PyObject *v = PyObject_GetAttr(self->stats, name);
    if (v == NULL)
        return -1;
    PyObject *w = PyNumber_Add(v, one_obj);
    Py_DECREF(v);
    if (w == NULL)
        return -1;
    int r = PyObject_SetAttr(self->stats, name, w);
    Py_DECREF(w);
    return r;
}

/* Execute the n-byte segment p (index idx) if it is the in-order WRITE ONLY this responder
 * takes: 1 done, 0 declined (nothing changed), -1 with an exception set. */
static int armed_rx_core(ArmedObject *self, const unsigned char *p, Py_ssize_t n, Py_ssize_t idx, PyObject *states,
                         PyObject *flow) {
    int result = -1;
    PyObject *entry = NULL;
    Py_ssize_t off, end;
    if (!self->live || n > UDP_MAX_PAYLOAD || n < BTH_LEN + ICRC_LEN || !codec_ready || p[0] != small_ops[0])
        return 0;
    uint32_t w1 = get_be32(p + 4), w2 = get_be32(p + 8);
    /* decode()'s header checks, then receive()'s P_Key and QPN and on_request()'s PSN */
    if (header_layout(p, n - ICRC_LEN, &off, &end) < 0 || (get_be16(p + 2) & 0x7FFF) != 0x7FFF ||
        (w1 & PSN_MASK) != self->qpn || (w2 & PSN_MASK) != self->psn)
        return 0;
    int icrc = icrc_matches(p, n, idx, states, flow);
    if (icrc <= 0)
        return icrc;
    const unsigned char *x = p + BTH_LEN;
    uint64_t va = get_be64(x), len = get_be32(x + 12);
    uint32_t rkey = get_be32(x + 8);
    Py_ssize_t plen = end - off;
    /* check_op_valid, check_length, check_rkey (rxe's order) */
    if (!(self->access & small_access[0]) || (uint64_t)plen != len || plen == 0 || plen > self->mtu)
        return 0;
    Py_ssize_t at = small_region(self->rtable, rkey, va, len, small_access[0], &entry);
    if (at < 0)
        return at == -2 ? -1 : 0;
    PyObject *gen = PyObject_GetAttr(self->pd, s_generation);
    if (gen == NULL)
        goto out;
    Py_buffer t;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(entry, 3), &t, PyBUF_WRITABLE) < 0) {
        Py_DECREF(gen);
        goto out;
    }
    if ((uint64_t)t.len < (uint64_t)at + len) {
        PyBuffer_Release(&t);
        Py_DECREF(gen);
        result = 0;
        goto out;
    }
    if (armed_count(self, s_packets_in) < 0) {
        PyBuffer_Release(&t);
        Py_DECREF(gen);
        goto out;
    }
    memcpy((unsigned char *)t.buf + at, x + 16, (size_t)plen);
    PyBuffer_Release(&t);
    /* Responder.write_only_executed, then queue_ack if AckReq (coalesced: it replaces a held ACK) */
    Py_XSETREF(self->w_gen, gen);
    self->w_rkey = rkey;
    self->w_va = va;
    self->w_len = len;
    self->msn = (self->msn + 1) & PSN_MASK;
    self->psn = (self->psn + 1) & PSN_MASK;
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
    PyObject *addr, *states, *flow, *rxflow, *qp;
    int v6;
    if (!PyArg_ParseTuple(args, "OpO!OOO:bind", &addr, &v6, &PyDict_Type, &states, &flow, &rxflow, &qp))
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
    Py_RETURN_NONE;
}

/* The held ACK as a Packet (Responder._ack's fields); NULL with an exception set. */
static PyObject *armed_ack_packet(ArmedObject *self) {
    PyObject *aeth_args = Py_BuildValue("(kk)", (unsigned long)self->ack_syn, (unsigned long)self->ack_msn);
    if (aeth_args == NULL)
        return NULL;
    PyObject *aeth = PyObject_Call(t_aeth, aeth_args, NULL);
    Py_DECREF(aeth_args);
    if (aeth == NULL)
        return NULL;
    PyObject *pkt = PyObject_CallFunction(t_packet, "OkkOOOiOOOOO", op_member[ack_op], (unsigned long)self->dqpn,
                                          (unsigned long)self->ack_psn, Py_False, Py_False, Py_False, 0xFFFF, Py_False,
                                          Py_False, Py_None, aeth, Py_None);
    Py_DECREF(aeth);
    return pkt;
}

static PyObject *armed_take_ack(ArmedObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->live || !self->ack || ack_op < 0)
        Py_RETURN_NONE;
    PyObject *pkt = armed_ack_packet(self);
    if (pkt == NULL)
        return NULL;
    if (armed_count(self, s_packets_out) < 0) {
        Py_DECREF(pkt);
        return NULL;
    }
    self->ack = 0;
    return pkt;
}

static PyObject *armed_send_ack(ArmedObject *self, PyObject *args) {
    int fd, v6;
    PyObject *addr, *states, *flow;
    if (!PyArg_ParseTuple(args, "iOpO!O:send_ack", &fd, &addr, &v6, &PyDict_Type, &states, &flow))
        return NULL;
    if (!self->live || !self->ack || ack_op < 0)
        return PyLong_FromLong(-1);
    struct sockaddr_storage ss;
    socklen_t sl;
    if (parse_addr(addr, v6, &ss, &sl) < 0)
        return NULL;
    unsigned char h[BTH_LEN + 4 + ICRC_LEN];
    put_bth(h, ack_op, self->dqpn, self->ack_psn, 0, 0);
    put_be32(h + BTH_LEN, self->ack_syn << 24 | self->ack_msn);
    int64_t st = icrc_state(states, flow, (Py_ssize_t)sizeof h, 0);
    if (st < 0)
        return NULL;
    h[4] = 0xFF; /* FECN, BECN, resv6 count as ones (Annex A17.3.3) */
    uint32_t c = crc32_update((uint32_t)st, h, BTH_LEN + 4);
    h[4] = 0;
    put_le32(h + BTH_LEN + 4, c);
    ssize_t r;
    do {
        r = sendto(fd, h, sizeof h, 0, (struct sockaddr *)&ss, sl);
    } while (r < 0 && errno == EINTR);
    int err = r < 0 ? errno : 0;
    if (err == EAGAIN || err == EWOULDBLOCK)
        return PyLong_FromLong(err); /* a full socket: still held (the caller queues it its way) */
    if (armed_count(self, s_packets_out) < 0)
        return NULL;
    self->ack = 0; /* sent, or lost to a send error as any datagram is */
    return PyLong_FromLong(err);
}

static PyObject *armed_disarm(ArmedObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->live) {
        PyErr_SetString(PyExc_RuntimeError, "disarm: not armed");
        return NULL;
    }
    PyObject *ack = Py_None;
    Py_INCREF(ack);
    if (self->ack) {
        Py_DECREF(ack);
        ack = armed_ack_packet(self);
        if (ack == NULL)
            return NULL;
    }
    self->live = 0;
    self->ack = 0;
    return Py_BuildValue("kkkKKOKN", (unsigned long)self->psn, (unsigned long)self->msn, (unsigned long)self->w_rkey,
                         (unsigned long long)self->w_va, (unsigned long long)self->w_len, self->w_gen,
                         self->executed, ack);
}

static PyObject *armed_pending(ArmedObject *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->live && self->ack);
}

/* The source of a read is src (address and port). */
static int addr_matches(const struct sockaddr_storage *src, const struct sockaddr_storage *from, socklen_t len) {
    if (from->ss_family != src->ss_family)
        return 0;
    if (from->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const struct sockaddr_in *)from, *y = (const struct sockaddr_in *)src;
        return len >= (socklen_t)sizeof *x && x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (from->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const struct sockaddr_in6 *)from, *y = (const struct sockaddr_in6 *)src;
        return len >= (socklen_t)sizeof *x && x->sin6_port == y->sin6_port &&
               !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr);
    }
    return 0;
}

/* The source of a read is the one an armed responder was bound to. */
static int same_source(const ArmedObject *a, const struct sockaddr_storage *from, socklen_t len) {
    return a->qp != NULL && addr_matches(&a->src, from, len);
}

/* _nativereq.c: an ACK for a requester's native completer bound to its source (1 taken, 0 not,
 * -1 with an exception set). */
static int armedreq_poll_one(PyObject *reqs, const unsigned char *p, Py_ssize_t n,
                             const struct sockaddr_storage *from, socklen_t from_len, double now, PyObject *active,
                             PyObject *strikes, PyObject *touched);

static unsigned long long poll_marks;
static PyObject *s_ours, *s_kernel;

/*
 * poll_armed(fd, buf, armed, active, strikes, max_reads[, reqs, now, touched]) -> (taken, raw)
 *
 * The UDP port's device poll for armed responders: up to max_reads non-blocking reads
 * into buf; each datagram that is one segment, not CE-marked, from the source its QP's
 * armed responder was bound to (armed: {qpn: Armed}), and that responder's next WRITE
 * ONLY, is executed here (Armed.rx) with no Python call, its QP put in `active` (the
 * port's transmit then sends the held ACK) and its receive flow marked as ours (rxflow.ours
 * = strikes, unless a kernel sender's). The first datagram that is anything else stops the
 * poll and is handed back as recv_raw's answer, in buf, untouched (raw); None: the
 * socket is empty or max_reads were taken. taken: the datagrams executed (or taken).
 * With reqs ({qpn: ArmedReq}, _nativereq.c), an ACK from the source its QP's native
 * completer was bound to, that it takes (ArmedReq.rx at `now`), is taken too; its QP
 * goes in `active` and, once per poll, in the list `touched`, whose QPs' logs the caller
 * hands to the engine (QueuePair.acks_taken) before anything else.
 */
static PyObject *fp_poll_armed(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd;
    Py_buffer b;
    PyObject *armed, *active, *strikes, *reqs = NULL, *touched = NULL;
    Py_ssize_t max_reads;
    double now = 0.0;
    if (!PyArg_ParseTuple(args, "iw*O!O!On|O!dO!:poll_armed", &fd, &b, &PyDict_Type, &armed, &PyDict_Type, &active,
                          &strikes, &max_reads, &PyDict_Type, &reqs, &now, &PyList_Type, &touched))
        return NULL;
    if (reqs != NULL && touched == NULL) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_TypeError, "poll_armed: reqs needs now and touched");
        return NULL;
    }
    unsigned long long mark = ++poll_marks;
    Py_ssize_t taken = 0;
    PyObject *raw = NULL;
    while (taken < max_reads) {
        struct sockaddr_storage from;
        socklen_t from_len = 0;
        Py_ssize_t seg;
        int ecn;
        ssize_t r = read_gro(fd, b.buf, (size_t)b.len, &from, &from_len, &seg, &ecn);
        if (r < 0) {
            int err = errno;
            if (err == EAGAIN || err == EWOULDBLOCK)
                raw = Py_NewRef(Py_None);
            else
                raw = Py_BuildValue("nn(si)ii", (Py_ssize_t)0, (Py_ssize_t)0, "", 0, err, 0);
            break;
        }
        const unsigned char *p = b.buf;
        Py_ssize_t n = r;
        ArmedObject *a = NULL;
        if (!seg && ecn != 3 && n >= BTH_LEN + ICRC_LEN && p[0] == small_ops[0]) {
            PyObject *key = PyLong_FromUnsignedLong(get_be32(p + 4) & PSN_MASK);
            if (key == NULL)
                goto fail;
            PyObject *v = PyDict_GetItemWithError(armed, key); /* borrowed */
            Py_DECREF(key);
            if (v == NULL && PyErr_Occurred())
                goto fail;
            if (v != NULL && Py_TYPE(v) == &ArmedType)
                a = (ArmedObject *)v;
        }
        int done = 0;
        if (a != NULL && a->live && same_source(a, &from, from_len)) {
            Py_INCREF(a);
            done = armed_rx_core(a, p, n, 0, a->states, a->flow);
            if (done > 0 && a->mark != mark) {
                a->mark = mark;
                PyObject *key = PyLong_FromUnsignedLong(a->qpn);
                int bad = key == NULL || PyDict_SetItem(active, key, a->qp) < 0;
                Py_XDECREF(key);
                if (!bad) {
                    PyObject *kernel = PyObject_GetAttr(a->rxflow, s_kernel);
                    int k = kernel == NULL ? -1 : PyObject_IsTrue(kernel);
                    Py_XDECREF(kernel);
                    bad = k < 0 || (!k && PyObject_SetAttr(a->rxflow, s_ours, strikes) < 0);
                }
                if (bad)
                    done = -1;
            }
            Py_DECREF(a);
        } else if (reqs != NULL && !seg && ecn != 3 && n >= BTH_LEN + ICRC_LEN && p[0] == ack_op) {
            done = armedreq_poll_one(reqs, p, n, &from, from_len, now, active, strikes, touched);
        }
        if (done < 0)
            goto fail;
        if (!done) {
            char host[INET6_ADDRSTRLEN];
            int port;
            format_addr(&from, host, &port);
            raw = Py_BuildValue("nn(si)ii", n, seg ? seg : (n > 0 ? n : 1), host, port, 0, ecn);
            break;
        }
        taken++;
    }
    PyBuffer_Release(&b);
    if (raw == NULL)
        raw = Py_NewRef(Py_None);
    return Py_BuildValue("nN", taken, raw);
fail:
    PyBuffer_Release(&b);
    return NULL;
}

static PyMethodDef armed_methods[] = {
    {"bind", (PyCFunction)armed_bind, METH_VARARGS,
     "bind((ip, port), v6, states, flow, rxflow, qp): its requests' source, for poll_armed."},
    {"rx", (PyCFunction)armed_rx, METH_VARARGS, "rx(seg, idx, states, flow) -> bool: execute an in-order WRITE ONLY."},
    {"take_ack", (PyCFunction)armed_take_ack, METH_NOARGS, "The held ACK as a Packet (counted as sent), or None."},
    {"send_ack", (PyCFunction)armed_send_ack, METH_VARARGS, "Send the held ACK: errno, or -1 if none is held."},
    {"disarm", (PyCFunction)armed_disarm, METH_NOARGS, "Hand the state back: (psn, msn, w_rkey, w_va, w_len, "
                                                       "w_gen, executed, ACK Packet or None)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef armed_getset[] = {
    {"pending", (getter)armed_pending, NULL, "An ACK is held.", NULL},
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
    s_ours = PyUnicode_InternFromString("ours");
    s_kernel = PyUnicode_InternFromString("kernel");
    one_obj = PyLong_FromLong(1);
    if (s_packets_in == NULL || s_packets_out == NULL || s_generation == NULL || s_ours == NULL || s_kernel == NULL ||
        one_obj == NULL)
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
