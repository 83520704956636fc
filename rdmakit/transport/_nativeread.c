/*
 * The armed responder's RDMA READs and atomics (_nativeqp.c #includes this; part of _fastpath.c's
 * translation unit).
 *
 * Once allowed (allow_reads(new_read, new_atomic): the engine's RdAtomicResources.new_read and new_atomic,
 * given when the QP has responder resources, IBTA §9.5 max_dest_rd_atomic), the armed responder also
 * executes the in-order COMPARE SWAP and FETCH ADD (armed_atomic_rx: its original value recorded, the u64
 * updated, the ATOMIC ACKNOWLEDGE held, as Responder._atomic and atomic_executed do) and RDMA
 * READ request between messages (IBTA Vol. 1 §9.7.5, rxe rxe_resp.c), checked in rxe's order: the header as
 * decode() takes it, P_Key, QPN, PSN, ICRC, check_op_seq, check_op_valid (REMOTE_READ), check_resource
 * (resources exist), check_length (at most MAX_MSG_SIZE, and here at most RD_MAX_PKTS responses) and
 * check_rkey over the whole range (the PD's live R_Key table). It then does what Responder.read_executed
 * does: the responder resource recorded through the engine's own new_read (for a duplicate, which the
 * engine replays), the MSN counted (C9-148), the expected PSN past the responses, and the responses held
 * here, behind the ACK already held if any, until the transport takes them:
 *
 *   take_reply() -> [Packet, ...]       the READ RESPONSE ONLY, or FIRST, MIDDLE..., LAST (or the ATOMIC
 *                                       ACKNOWLEDGE), counted as sent
 *   send_reply(fd, addr, v6, states, flow) -> (errno, sent)
 *                                       the held ACK and the responses, built, ICRC'd and sent here;
 *                                       EAGAIN leaves the rest held (sent: how many left)
 *   replying                            a READ's responses are held
 *   handback() -> (reads, ack_psn | None, reply | None)
 *                                       after disarm(): READs executed, the ACK PSN base the WRITEs left
 *                                       and atomics left (Responder.ack_psn; None: none executed), and the
 *                                       responses still held as (view, off, resid, psn, new, msn) for a
 *                                       ReadReply, or the ATOMIC ACKNOWLEDGE as a Packet
 *
 * While responses are held the armed responder declines every request (the engine would queue them behind
 * the responses), so the output order is the engine's: the held ACK, then the responses. Payloads are read
 * from the registered memory when the responses are built, as ResponseOutput.transmit reads them.
 */

static PyObject *armed_send_ack(ArmedObject *self, PyObject *args); /* _nativeqp_ack.c */
static int rd_ops[5] = {-1, -1, -1, -1, -1}; /* READ request; READ RESPONSE FIRST, MIDDLE, LAST, ONLY */
enum { RD_MAX_PKTS = 8 }; /* longer READs take the engine's path (GSO trains of MIDDLE responses) */

static PyObject *armed_init_read(PyObject *Py_UNUSED(cls), PyObject *args) {
    int v[5];
    if (!PyArg_ParseTuple(args, "iiiii:init_read", &v[0], &v[1], &v[2], &v[3], &v[4]))
        return NULL;
    for (int i = 0; i < 5; i++)
        if (v[i] < 0 || v[i] > 255) {
            PyErr_SetString(PyExc_ValueError, "Armed.init_read: an opcode is not a u8");
            return NULL;
        }
    memcpy(rd_ops, v, sizeof v);
    Py_RETURN_NONE;
}

static PyObject *armed_allow_reads(ArmedObject *self, PyObject *args) {
    PyObject *new_read, *new_atomic;
    if (!PyArg_ParseTuple(args, "OO:allow_reads", &new_read, &new_atomic))
        return NULL;
    if (!PyCallable_Check(new_read) || !PyCallable_Check(new_atomic)) {
        PyErr_SetString(PyExc_TypeError, "allow_reads: new_read and new_atomic must be callable");
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, new_read, new_atomic);
    if (pair == NULL)
        return NULL;
    Py_XSETREF(self->rd_res, pair);
    Py_RETURN_NONE;
}

/* The armed responder takes requests with opcode op here: a READ request, COMPARE SWAP or FETCH ADD. */
static int rd_takes(int op) { return op == rd_ops[0] || op == small_ops[2] || op == small_ops[3]; }

/* Execute the READ request p (n bytes, index idx): 1 done, 0 declined (nothing changed), -1 with an
 * exception set. */
static int armed_read_rx(ArmedObject *self, const unsigned char *p, Py_ssize_t n, Py_ssize_t idx, PyObject *states,
                         PyObject *flow) {
    Py_ssize_t off, end;
    uint32_t dqp = get_be32(p + 4) & PSN_MASK, psn = get_be32(p + 8) & PSN_MASK;
    if (header_layout(p, n - ICRC_LEN, &off, &end) < 0 || end != off || (get_be16(p + 2) & 0x7FFF) != 0x7FFF ||
        dqp != self->qpn || psn != self->psn)
        return 0;
    int icrc = icrc_matches(p, n, idx, states, flow);
    if (icrc <= 0)
        return icrc;
    /* check_op_seq, check_op_valid, check_length: anything wrong is the engine's error to answer */
    if (self->in_msg || !(self->access & small_access[1]))
        return 0;
    const unsigned char *x = p + BTH_LEN;
    uint64_t va = get_be64(x), len = get_be32(x + 12);
    uint32_t rkey = get_be32(x + 8);
    if (len > small_max_msg)
        return 0;
    uint64_t npkts = len ? (len - 1) / (uint64_t)self->mtu + 1 : 1;
    if (npkts > RD_MAX_PKTS)
        return 0;
    PyObject *entry = NULL;
    Py_ssize_t at = 0;
    if (len) { /* check_rkey over the whole range, and the region's bytes really there */
        at = small_region(self->rtable, rkey, va, len, small_access[1], &entry);
        if (at < 0)
            return at == -2 ? -1 : 0;
        Py_buffer t;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(entry, 3), &t, PyBUF_SIMPLE) < 0) {
            Py_DECREF(entry);
            return -1;
        }
        int short_ = (uint64_t)t.len < (uint64_t)at + len;
        PyBuffer_Release(&t);
        if (short_) {
            Py_DECREF(entry);
            return 0;
        }
    }
    uint32_t last = (uint32_t)(psn + npkts - 1) & PSN_MASK;
    /* Responder.read_executed: the resource first (RdAtomicResources.new_read) */
    PyObject *r = PyObject_CallFunction(PyTuple_GET_ITEM(self->rd_res, 0), "kkkKK", (unsigned long)psn, (unsigned long)last,
                                        (unsigned long)rkey, (unsigned long long)va, (unsigned long long)len);
    if (r == NULL || armed_count(self, s_packets_in) < 0) {
        Py_XDECREF(r);
        Py_XDECREF(entry);
        return -1;
    }
    Py_DECREF(r);
    Py_XSETREF(self->rd_mem, entry != NULL ? Py_NewRef(PyTuple_GET_ITEM(entry, 3)) : NULL);
    Py_XDECREF(entry);
    self->msn = (self->msn + 1) & PSN_MASK;
    self->psn = (uint32_t)(psn + npkts) & PSN_MASK;
    self->rd_live = 1;
    self->rd_atomic = 0;
    self->rd_new = 1;
    self->rd_at = at;
    self->rd_off = 0;
    self->rd_resid = len;
    self->rd_psn = psn;
    self->rd_msn = self->msn;
    self->rd_executed++;
    return 1;
}

/* Execute the COMPARE SWAP or FETCH ADD p (IBTA §9.4.5; Responder._atomic, rxe atomic_reply): in rxe's order
 * (header, P_Key, QPN, PSN, ICRC, check_op_seq, check_op_valid, check_resource, check_rkey, the alignment),
 * its original value recorded first (RdAtomicResources.new_atomic, for a duplicate, which the engine
 * answers from it), then the u64 (this host's byte order) updated; the ATOMIC ACKNOWLEDGE held. 1 done,
 * 0 declined (nothing changed), -1 with an exception set. */
static int armed_atomic_rx(ArmedObject *self, const unsigned char *p, Py_ssize_t n, Py_ssize_t idx,
                           PyObject *states, PyObject *flow) {
    Py_ssize_t off, end;
    uint32_t dqp = get_be32(p + 4) & PSN_MASK, apsn = get_be32(p + 8) & PSN_MASK;
    if (header_layout(p, n - ICRC_LEN, &off, &end) < 0 || end != off || (get_be16(p + 2) & 0x7FFF) != 0x7FFF ||
        dqp != self->qpn || apsn != self->psn)
        return 0;
    int icrc = icrc_matches(p, n, idx, states, flow);
    if (icrc <= 0)
        return icrc;
    if (self->in_msg || !(self->access & small_access[2]))
        return 0;
    const unsigned char *x = p + BTH_LEN;
    uint64_t va = get_be64(x), swap_add = get_be64(x + 12), compare = get_be64(x + 20);
    PyObject *entry = NULL;
    Py_ssize_t at = small_region(self->rtable, get_be32(x + 8), va, 8, small_access[2], &entry);
    if (at < 0)
        return at == -2 ? -1 : 0;
    Py_buffer t;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(entry, 3), &t, PyBUF_WRITABLE) < 0) {
        Py_DECREF(entry);
        return -1;
    }
    Py_DECREF(entry); /* the buffer holds the region */
    if ((uint64_t)t.len < (uint64_t)at + 8 || (va & 7)) {
        PyBuffer_Release(&t);
        return 0;
    }
    unsigned char *dst = (unsigned char *)t.buf + at;
    uint64_t orig;
    memcpy(&orig, dst, 8);
    PyObject *r = PyObject_CallFunction(PyTuple_GET_ITEM(self->rd_res, 1), "kK", (unsigned long)apsn,
                                        (unsigned long long)orig);
    if (r == NULL || armed_count(self, s_packets_in) < 0) {
        Py_XDECREF(r);
        PyBuffer_Release(&t);
        return -1;
    }
    Py_DECREF(r);
    if (p[0] == small_ops[3] || orig == compare) { /* a COMPARE SWAP that misses stores nothing */
        uint64_t v = swap_add + (p[0] == small_ops[3] ? orig : 0);
        memcpy(dst, &v, 8);
    }
    PyBuffer_Release(&t);
    /* Responder.atomic_executed */
    self->msn = (self->msn + 1) & PSN_MASK;
    self->psn = (apsn + 1) & PSN_MASK;
    self->rd_acked = 1, self->ack_base = self->psn; /* atomic_executed's ack_psn */
    self->rd_live = 1;
    self->rd_atomic = 1;
    self->rd_psn = apsn;
    self->rd_msn = self->msn;
    self->rd_orig = orig;
    self->rd_resid = 0;
    self->rd_executed++;
    return 1;
}

static int armed_rdatomic_rx(ArmedObject *self, const unsigned char *p, Py_ssize_t n, Py_ssize_t idx,
                             PyObject *states, PyObject *flow) {
    if (self->rd_res == NULL)
        return 0; /* no responder resources: the engine's error */
    return p[0] == rd_ops[0] ? armed_read_rx(self, p, n, idx, states, flow)
                             : armed_atomic_rx(self, p, n, idx, states, flow);
}

/* The held ATOMIC ACKNOWLEDGE as the engine's Packet (Responder._ack's fields); NULL with an exception. */
static PyObject *rd_atomic_packet(const ArmedObject *self) {
    PyObject *a = PyObject_CallFunction(t_aeth, "kk", (unsigned long)self->syndrome, (unsigned long)self->rd_msn);
    if (a == NULL)
        return NULL;
    PyObject *pkt = PyObject_CallFunction(t_packet, "OkkOOOiOOOONK", op_member[resp_ops[2]],
                                          (unsigned long)self->dqpn, (unsigned long)self->rd_psn, Py_False, Py_False,
                                          Py_False, 0xFFFF, Py_False, Py_False, Py_None, a, Py_None,
                                          (unsigned long long)self->rd_orig);
    return pkt;
}

/* The next held response's opcode, payload size and whether it carries an AETH. */
static int rd_next(const ArmedObject *self, Py_ssize_t *size, int *aeth) {
    int last = self->rd_resid <= (uint64_t)self->mtu;
    *size = last ? (Py_ssize_t)self->rd_resid : self->mtu;
    int op = self->rd_new ? (last ? rd_ops[4] : rd_ops[1]) : (last ? rd_ops[3] : rd_ops[2]);
    *aeth = op != rd_ops[2];
    return op;
}

/* The next held response has left: step past it. */
static void rd_step(ArmedObject *self, Py_ssize_t size) {
    self->rd_new = 0;
    self->rd_off += (uint64_t)size;
    self->rd_resid -= (uint64_t)size;
    self->rd_psn = (self->rd_psn + 1) & PSN_MASK;
}

/* The next held response is the LAST or ONLY (of `size`, the rest of the READ). */
static int rd_done_after(const ArmedObject *self, Py_ssize_t size) { return (uint64_t)size >= self->rd_resid; }

/* The payload of the next response as the engine slices it (b"" when empty); NULL with an exception. */
static PyObject *rd_payload(const ArmedObject *self, Py_ssize_t size) {
    if (!size || self->rd_mem == NULL)
        return PyBytes_FromStringAndSize(NULL, 0);
    Py_ssize_t a = self->rd_at + (Py_ssize_t)self->rd_off;
    return PySequence_GetSlice(self->rd_mem, a, a + size);
}

static PyObject *armed_take_reply(ArmedObject *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    if (self->rd_live && self->rd_atomic) {
        PyObject *pkt = rd_atomic_packet(self);
        if (pkt == NULL || PyList_Append(list, pkt) < 0 || armed_count(self, s_packets_out) < 0) {
            Py_XDECREF(pkt);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(pkt);
        self->rd_live = 0;
    }
    while (self->rd_live) {
        Py_ssize_t size;
        int aeth;
        int op = rd_next(self, &size, &aeth);
        PyObject *payload = rd_payload(self, size), *a = Py_NewRef(Py_None);
        if (payload != NULL && aeth) {
            Py_DECREF(a);
            a = PyObject_CallFunction(t_aeth, "kk", (unsigned long)self->syndrome, (unsigned long)self->rd_msn);
        }
        PyObject *pkt = payload == NULL || a == NULL
                            ? NULL
                            : PyObject_CallFunction(t_packet, "OkkOOOiOOOOOOOOO", op_member[op],
                                                    (unsigned long)self->dqpn, (unsigned long)self->rd_psn, Py_False,
                                                    Py_False, Py_False, 0xFFFF, Py_False, Py_False, Py_None, a,
                                                    Py_None, Py_None, Py_None, Py_None, payload);
        Py_XDECREF(payload);
        Py_XDECREF(a);
        if (pkt == NULL || PyList_Append(list, pkt) < 0 || armed_count(self, s_packets_out) < 0) {
            Py_XDECREF(pkt);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(pkt);
        int done = rd_done_after(self, size);
        rd_step(self, size);
        if (done)
            self->rd_live = 0;
    }
    return list;
}

/* Send one datagram of iov; the errno (0: sent). */
static int rd_sendv(int fd, struct iovec *iov, int iovlen, struct sockaddr_storage *ss, socklen_t sl) {
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_name = ss;
    msg.msg_namelen = sl;
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)iovlen;
    ssize_t r;
    do {
        r = sendmsg(fd, &msg, 0);
    } while (r < 0 && errno == EINTR);
    return r < 0 ? errno : 0;
}

static PyObject *armed_send_reply(ArmedObject *self, PyObject *args) {
    int fd, v6;
    PyObject *addr, *states, *flow;
    if (!PyArg_ParseTuple(args, "iOpO!O:send_reply", &fd, &addr, &v6, &PyDict_Type, &states, &flow))
        return NULL;
    if (!self->rd_live)
        return Py_BuildValue("ii", -1, 0);
    struct sockaddr_storage ss;
    socklen_t sl;
    if (parse_addr(addr, v6, &ss, &sl) < 0)
        return NULL;
    int sent = 0, err = 0, ack_err = 0;
    if (self->live && self->ack) { /* the ACK queued before the READ leaves first */
        PyObject *e = armed_send_ack(self, args);
        if (e == NULL)
            return NULL;
        long a = PyLong_AsLong(e);
        Py_DECREF(e);
        if (a == EAGAIN || a == EWOULDBLOCK)
            return Py_BuildValue("ii", (int)a, 0);
        ack_err = (int)a; /* lost to a send error as any datagram is */
        sent++;
    }
    if (self->rd_atomic) { /* BTH, AETH, AtomicAckETH (the original value, big-endian), ICRC */
        unsigned char h[BTH_LEN + 4 + 8 + ICRC_LEN];
        put_bth(h, resp_ops[2], self->dqpn, self->rd_psn, 0, 0);
        put_be32(h + BTH_LEN, self->syndrome << 24 | self->rd_msn);
        put_be32(h + BTH_LEN + 4, (uint32_t)(self->rd_orig >> 32));
        put_be32(h + BTH_LEN + 8, (uint32_t)self->rd_orig);
        int64_t st = icrc_state(states, flow, (Py_ssize_t)sizeof h, 0);
        if (st < 0)
            return NULL;
        h[4] = 0xFF; /* FECN, BECN, resv6 count as ones (Annex A17.3.3) */
        uint32_t c = crc32_update((uint32_t)st, h, BTH_LEN + 12);
        h[4] = 0;
        put_le32(h + BTH_LEN + 12, c);
        struct iovec iov[1] = {{h, sizeof h}};
        err = rd_sendv(fd, iov, 1, &ss, sl);
        if (err == EAGAIN || err == EWOULDBLOCK)
            return Py_BuildValue("ii", err, sent);
        if (armed_count(self, s_packets_out) < 0)
            return NULL;
        self->rd_live = 0;
        return Py_BuildValue("ii", err ? err : ack_err, sent + 1);
    }
    Py_buffer t = {0};
    int have = 0;
    if (self->rd_mem != NULL) {
        if (PyObject_GetBuffer(self->rd_mem, &t, PyBUF_SIMPLE) < 0)
            return NULL;
        have = 1;
    }
    while (self->rd_live) {
        Py_ssize_t size;
        int aeth;
        int op = rd_next(self, &size, &aeth);
        if (size && (!have || (uint64_t)t.len < (uint64_t)self->rd_at + self->rd_off + (uint64_t)size)) {
            err = EFAULT; /* the region shrank: cannot happen with a registered buffer */
            break;
        }
        unsigned char h[BTH_LEN + 4], tail[3 + ICRC_LEN] = {0};
        Py_ssize_t pad = -size & 3, hlen = BTH_LEN + (aeth ? 4 : 0);
        put_bth(h, op, self->dqpn, self->rd_psn, 0, 0);
        h[1] = (unsigned char)(pad << 4);
        if (aeth)
            put_be32(h + BTH_LEN, self->syndrome << 24 | self->rd_msn);
        int64_t st = icrc_state(states, flow, hlen + size + pad + ICRC_LEN, 0);
        if (st < 0) {
            if (have)
                PyBuffer_Release(&t);
            return NULL;
        }
        const unsigned char *pl = have ? (const unsigned char *)t.buf + self->rd_at + self->rd_off : NULL;
        h[4] = 0xFF; /* FECN, BECN, resv6 count as ones (Annex A17.3.3) */
        uint32_t c = crc32_update((uint32_t)st, h, (size_t)hlen);
        h[4] = 0;
        if (size)
            c = crc32_update(c, pl, (size_t)size);
        c = crc32_update(c, tail, (size_t)pad);
        put_le32(tail + pad, c);
        struct iovec iov[3] = {{h, (size_t)hlen}, {(void *)pl, (size_t)size}, {tail, (size_t)(pad + ICRC_LEN)}};
        if (!size)
            iov[1] = iov[2];
        err = rd_sendv(fd, iov, size ? 3 : 2, &ss, sl);
        if (err == EAGAIN || err == EWOULDBLOCK)
            break; /* a full socket: the rest stays held */
        if (armed_count(self, s_packets_out) < 0) {
            if (have)
                PyBuffer_Release(&t);
            return NULL;
        }
        sent++;
        int done = rd_done_after(self, size);
        rd_step(self, size);
        if (done)
            self->rd_live = 0;
        if (err)
            break; /* lost to a send error as any datagram is; reported once */
    }
    if (have)
        PyBuffer_Release(&t);
    return Py_BuildValue("ii", err ? err : ack_err, sent);
}

static PyObject *armed_replying(ArmedObject *self, void *Py_UNUSED(closure)) { return PyBool_FromLong(self->rd_live); }

static PyObject *armed_handback(ArmedObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->live) {
        PyErr_SetString(PyExc_RuntimeError, "handback: still armed (disarm first)");
        return NULL;
    }
    PyObject *reply = Py_NewRef(Py_None);
    if (self->rd_live && self->rd_atomic) {
        Py_SETREF(reply, rd_atomic_packet(self));
        if (reply == NULL)
            return NULL;
        self->rd_live = 0;
    } else if (self->rd_live) {
        PyObject *view = self->rd_mem != NULL ? PySequence_GetSlice(self->rd_mem, self->rd_at,
                                                                    self->rd_at + (Py_ssize_t)(self->rd_off +
                                                                                               self->rd_resid))
                                              : Py_NewRef(Py_None);
        if (view == NULL) {
            Py_DECREF(reply);
            return NULL;
        }
        Py_SETREF(reply, Py_BuildValue("NKKkOk", view, (unsigned long long)self->rd_off,
                                       (unsigned long long)self->rd_resid, (unsigned long)self->rd_psn,
                                       self->rd_new ? Py_True : Py_False, (unsigned long)self->rd_msn));
        if (reply == NULL)
            return NULL;
        self->rd_live = 0;
    }
    PyObject *ack_psn = self->rd_acked ? PyLong_FromUnsignedLong(self->ack_base) : Py_NewRef(Py_None);
    if (ack_psn == NULL) {
        Py_DECREF(reply);
        return NULL;
    }
    return Py_BuildValue("KNN", self->rd_executed, ack_psn, reply);
}

#define ARMED_READ_METHODS                                                                                            \
    {"allow_reads", (PyCFunction)armed_allow_reads, METH_VARARGS,                                                     \
     "allow_reads(new_read, new_atomic): execute in-order READ and atomic requests too (see _nativeread.c)."},        \
        {"take_reply", (PyCFunction)armed_take_reply, METH_NOARGS,                                                    \
         "The held READ responses as Packets (counted as sent)."},                                                    \
        {"send_reply", (PyCFunction)armed_send_reply, METH_VARARGS,                                                   \
         "Send the held ACK and READ responses: (errno, sent); errno -1: none held."},                               \
        {"handback", (PyCFunction)armed_handback, METH_NOARGS,                                                        \
         "After disarm(): (READs executed, ACK PSN or None, responses held or None)."},                              \
        {"init_read", (PyCFunction)armed_init_read, METH_VARARGS | METH_STATIC,                                       \
         "init_read(read_request, response_first, _middle, _last, _only): the READ opcodes."},
#define ARMED_READ_GETSET {"replying", (getter)armed_replying, NULL, "READ responses are held.", NULL},
