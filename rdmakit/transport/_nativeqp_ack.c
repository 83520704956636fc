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
