/* The device poll (included from _nativeqp.c, after the armed responder's receive and before its
 * method table): a read's source check, the shared socket loop `poll_core` that the device poll
 * `poll_armed` and the native wait (_nativeloop.c) both run, and `poll_armed` itself. */

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
 * packet (Armed.rx), is executed here (Armed.rx) with no Python call, its QP put in `active` (the
 * port's transmit then sends the held ACK) and its receive flow marked as ours (rxflow.ours
 * = strikes, unless a kernel sender's). The first datagram that is anything else stops the
 * poll and is handed back as recv_raw's answer, in buf, untouched (raw); None: the
 * socket is empty or max_reads were taken. taken: the datagrams executed (or taken).
 * With reqs ({qpn: ArmedReq}, _nativereq.c), an ACK from the source its QP's native
 * completer was bound to, that it takes (ArmedReq.rx at `now`), is taken too; its QP
 * goes in `active` and, once per poll, in the list `touched`, whose QPs' logs the caller
 * hands to the engine (QueuePair.acks_taken) before anything else.
 */
/* poll_armed's loop: up to max_reads reads into buf (len bytes); *raw gets the answer handed back
 * (a new reference: None or recv_raw's tuple). With woke (room for 2), the armed responders this
 * poll woke are written there (the first two, new references) and counted in *nwoke. -1 with an
 * exception set. */
static Py_ssize_t poll_core(int fd, void *buf, Py_ssize_t len, PyObject *armed, PyObject *active, PyObject *strikes,
                            Py_ssize_t max_reads, PyObject *reqs, double now, PyObject *touched, ArmedObject **woke,
                            int *nwoke, PyObject **raw) {
    unsigned long long mark = ++poll_marks;
    Py_ssize_t taken = 0;
    *raw = NULL;
    while (taken < max_reads) {
        struct sockaddr_storage from;
        socklen_t from_len = 0;
        Py_ssize_t seg;
        int ecn;
        ssize_t r = read_gro(fd, buf, (size_t)len, &from, &from_len, &seg, &ecn);
        if (r < 0) {
            int err = errno;
            if (err == EAGAIN || err == EWOULDBLOCK)
                *raw = Py_NewRef(Py_None);
            else
                *raw = Py_BuildValue("nn(si)ii", (Py_ssize_t)0, (Py_ssize_t)0, "", 0, err, 0);
            break;
        }
        const unsigned char *p = buf;
        Py_ssize_t n = r;
        ArmedObject *a = NULL;
        if (!seg && ecn != 3 && n >= BTH_LEN + ICRC_LEN && (armed_position(p[0]) >= 0 || rd_takes(p[0]))) {
            PyObject *key = PyLong_FromUnsignedLong(get_be32(p + 4) & PSN_MASK);
            if (key == NULL)
                return -1;
            PyObject *v = PyDict_GetItemWithError(armed, key); /* borrowed */
            Py_DECREF(key);
            if (v == NULL && PyErr_Occurred())
                return -1;
            if (v != NULL && Py_TYPE(v) == &ArmedType)
                a = (ArmedObject *)v;
        }
        int done = 0;
        if (a != NULL && a->live && same_source(a, &from, from_len)) {
            Py_INCREF(a);
            done = armed_poll_rx(a, p, n);
            if (done > 0 && a->mark != mark) {
                a->mark = mark;
                if (woke != NULL && (*nwoke)++ < 2)
                    woke[*nwoke - 1] = (ArmedObject *)Py_NewRef(a); /* the caller's reference */
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
            return -1;
        if (!done) {
            char host[INET6_ADDRSTRLEN];
            int port;
            format_addr(&from, host, &port);
            *raw = Py_BuildValue("nn(si)ii", n, seg ? seg : (n > 0 ? n : 1), host, port, 0, ecn);
            if (*raw == NULL)
                return -1;
            break;
        }
        taken++;
    }
    if (*raw == NULL)
        *raw = Py_NewRef(Py_None);
    return taken;
}

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
    PyObject *raw;
    Py_ssize_t taken = poll_core(fd, b.buf, b.len, armed, active, strikes, max_reads, reqs, now, touched, NULL, NULL,
                                 &raw);
    PyBuffer_Release(&b);
    if (taken < 0)
        return NULL;
    return Py_BuildValue("nN", taken, raw);
}
