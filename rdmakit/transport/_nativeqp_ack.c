/*
 * The armed responder's held ACK (_nativeqp.c, which #includes this where its methods need it):
 * as a Packet (take_ack, disarm) and built, ICRC'd and sent in one call (send_ack).
 */

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

/* Send the held ACK to ss: errno (0 sent, or lost to a send error as any datagram is; EAGAIN: still
 * held), -1 none held, -2 with an exception set. */
static int armed_send_ack_to(ArmedObject *self, int fd, const struct sockaddr_storage *ss, socklen_t sl,
                             PyObject *states, PyObject *flow) {
    if (!self->live || !self->ack || ack_op < 0)
        return -1;
    unsigned char h[BTH_LEN + 4 + ICRC_LEN];
    put_bth(h, ack_op, self->dqpn, self->ack_psn, 0, 0);
    put_be32(h + BTH_LEN, self->ack_syn << 24 | self->ack_msn);
    int64_t st = icrc_state(states, flow, (Py_ssize_t)sizeof h, 0);
    if (st < 0)
        return -2;
    h[4] = 0xFF; /* FECN, BECN, resv6 count as ones (Annex A17.3.3) */
    uint32_t c = crc32_update((uint32_t)st, h, BTH_LEN + 4);
    h[4] = 0;
    put_le32(h + BTH_LEN + 4, c);
    ssize_t r;
    do {
        r = sendto(fd, h, sizeof h, 0, (const struct sockaddr *)ss, sl);
    } while (r < 0 && errno == EINTR);
    int err = r < 0 ? errno : 0;
    if (err == EAGAIN || err == EWOULDBLOCK)
        return err; /* a full socket: still held (the caller queues it its way) */
    if (armed_count(self, s_packets_out) < 0)
        return -2;
    self->ack = 0; /* sent, or lost to a send error as any datagram is */
    return err;
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
    int err = armed_send_ack_to(self, fd, &ss, sl, states, flow);
    return err == -2 ? NULL : PyLong_FromLong(err);
}

/*
 * send_acks(fd, (ip, port), v6, gso, states, flow, owners) -> (sent, sends, err)
 *
 * The ACKs the armed responders in the list `owners` hold, all to one peer, in order: as
 * GSO batches of ACK-sized segments (segment k's ICRC with IPv4 ID k, as send_train), or
 * one datagram each without gso. An owner that holds none is skipped. sent: the ACKs that
 * left (or were lost to a send error, as any datagram is) in `sends` system calls; err: the
 * errno that stopped the sends, 0 if none. On a full socket (EAGAIN), or a path that refuses
 * GSO (EIO, EINVAL, EOPNOTSUPP, as send_train), the rest are still held.
 */
static PyObject *fp_send_acks(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd, v6, gso;
    PyObject *addr, *states, *flow, *owners;
    if (!PyArg_ParseTuple(args, "iOppO!OO!:send_acks", &fd, &addr, &v6, &gso, &PyDict_Type, &states, &flow,
                          &PyList_Type, &owners))
        return NULL;
    struct sockaddr_storage ss;
    socklen_t sl;
    if (parse_addr(addr, v6, &ss, &sl) < 0)
        return NULL;
    enum { SIZE = BTH_LEN + 4 + ICRC_LEN };
    unsigned char h[GSO_MAX_SEGMENTS][SIZE];
    ArmedObject *batch[GSO_MAX_SEGMENTS];
    Py_ssize_t per = gso ? GSO_MAX_SEGMENTS : 1, sent = 0, sends = 0, i = 0;
    int err = 0;
    while (i < PyList_GET_SIZE(owners) && !err) {
        Py_ssize_t n = 0;
        for (; i < PyList_GET_SIZE(owners) && n < per; i++) {
            PyObject *o = PyList_GET_ITEM(owners, i); /* borrowed: the list holds it */
            if (Py_TYPE(o) != &ArmedType) {
                PyErr_SetString(PyExc_TypeError, "send_acks: owners are Armed");
                return NULL;
            }
            ArmedObject *a = (ArmedObject *)o;
            if (!a->live || !a->ack || ack_op < 0)
                continue;
            unsigned char *p = h[n];
            put_bth(p, ack_op, a->dqpn, a->ack_psn, 0, 0);
            put_be32(p + BTH_LEN, a->ack_syn << 24 | a->ack_msn);
            int64_t st = icrc_state(states, flow, SIZE, n);
            if (st < 0)
                return NULL;
            p[4] = 0xFF; /* FECN, BECN, resv6 count as ones (Annex A17.3.3) */
            put_le32(p + BTH_LEN + 4, crc32_update((uint32_t)st, p, BTH_LEN + 4));
            p[4] = 0;
            batch[n++] = a;
        }
        if (!n)
            break;
        struct iovec iov = {h, (size_t)n * SIZE};
        union {
            char buf[CMSG_SPACE(sizeof(uint16_t))];
            struct cmsghdr align;
        } ctrl;
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_name = &ss;
        msg.msg_namelen = sl;
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (n > 1) {
            memset(&ctrl, 0, sizeof ctrl);
            msg.msg_control = ctrl.buf;
            msg.msg_controllen = sizeof ctrl.buf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            cm->cmsg_level = SOL_UDP;
            cm->cmsg_type = UDP_SEGMENT;
            cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t segsz = SIZE;
            memcpy(CMSG_DATA(cm), &segsz, sizeof segsz);
        }
        ssize_t r;
        do {
            r = sendmsg(fd, &msg, 0);
        } while (r < 0 && errno == EINTR);
        err = r < 0 ? errno : 0;
        if (err == EAGAIN || err == EWOULDBLOCK || (n > 1 && (err == EIO || err == EINVAL || err == EOPNOTSUPP)))
            break; /* still held: the caller queues them its way */
        sends++;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (armed_count(batch[k], s_packets_out) < 0)
                return NULL;
            batch[k]->ack = 0;
        }
        sent += n;
    }
    return Py_BuildValue("nni", sent, sends, err);
}
