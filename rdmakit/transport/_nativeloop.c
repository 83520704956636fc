/*
 * The device poll loop: Driver.run_until's idle wait (spin, then block) in one native call. Part of
 * _fastpath.c's translation unit (#included after _nativeqp.c and _nativepoll.c, whose poll_core and
 * armed_send_ack_to it uses). See docs/architecture.md, "The native wait".
 *
 * wait_loop(epfd, ports, done, spin_end, end, deadline, max_reads) -> (reason, index, counts, raw, err)
 *
 * ports: one tuple per UDP device, (fd, buf, armed, active, strikes, reqs, touched, routes, visited): its
 * socket and receive buffer, its armed responders and requesters' completers by QPN, its active set, the
 * receive flows' strikes, an empty list for the QPs whose completers take ACKs, the routes of its armed
 * responders' ACKs ({qpn: ((ip, port), v6, states, flow)}) and its visited list. The caller hands the wait
 * over only when its Python pass found nothing to do: every active set and send backlog empty.
 *
 * Each turn is one device poll per port (poll_core: the reads UdpPort.receive's armed poll makes, at most
 * max_reads), then what the port's transmit pass would do with what it took, when that is only the one
 * ACK an armed responder holds for a WRITE: sent in one native call to its route, the QP out of the active
 * set and into `visited` (transmit's `del active[qpn]; visited.append(qp)`: an armed responder has nothing
 * else to send, or its QP would have been active when the wait began). Nothing else is done here; the
 * call returns, with the port's state as its Python pass would find it mid-way, when:
 *
 *   reason 1 (index: the port): a datagram the armed paths do not take (raw: recv_raw's answer, the
 *            datagram still in buf), a completer took ACKs (touched), more than one armed responder woke
 *            in one poll (the transmit pass batches their ACKs), one that replies (READ responses), an
 *            ACK without a route, a full socket, or a send error (err: its errno; the ACK counted sent);
 *   reason 2: the epoll set reported a descriptor that is not a port's (the deadline timer);
 *   reason 3: done() returned true (called after a turn that took something, and each idle turn);
 *   reason 4: 64 QPs are waiting in a visited list (their deadlines must be noted);
 *   reason 0: `deadline` or `end` (monotonic seconds) has come.
 *
 * Until spin_end the idle turns repeat at once (each lets a thread waiting for the GIL have it); after it, the call blocks in epoll_wait(epfd) with the GIL
 * released, for at most the time to min(deadline, end), then spins again for the same spin length. A
 * pending signal (PyErr_CheckSignals: SIGINT raises KeyboardInterrupt) ends the call with its exception.
 * counts: [taken, acks sent] per port, what the caller adds to its counters.
 */
#include <math.h>
#include <sys/epoll.h>

enum { LOOP_TIME, LOOP_PORT, LOOP_WAKE, LOOP_DONE, LOOP_FLUSH };
#define LOOP_VISITED_MAX 64
#define LOOP_PORTS_MAX 64

typedef struct {
    PyObject *tuple; /* held for the call: done() may drop the caller's list */
    int fd;
    Py_buffer buf;
    PyObject *armed, *active, *strikes, *reqs, *touched, *routes, *visited;
    Py_ssize_t taken, sent;
} LoopPort;

static double loop_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What the port's transmit pass does for the one armed responder `a` a poll woke: 0 done, 1 the
 * Python pass must take it (*err: a send error's errno), -1 with an exception set. */
static int loop_send_ack(LoopPort *lp, ArmedObject *a, int *err) {
    if (a->rd_live || a->qp == NULL)
        return 1; /* READ responses: paced by the engine (UdpPort._send_ack) */
    PyObject *key = PyLong_FromUnsignedLong(a->qpn);
    if (key == NULL)
        return -1;
    if (a->ack) {
        PyObject *route = PyDict_GetItemWithError(lp->routes, key), *addr, *states, *flow;
        int v6;
        if (route == NULL || !PyTuple_Check(route) ||
            !PyArg_ParseTuple(route, "OpO!O", &addr, &v6, &PyDict_Type, &states, &flow)) {
            Py_DECREF(key);
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError))
                return -1;
            PyErr_Clear();
            return 1; /* no route (or not one): the transmit pass sends it its way */
        }
        Py_INCREF(route); /* its items are used below, where Python code may run */
        struct sockaddr_storage ss;
        socklen_t sl;
        int r = parse_addr(addr, v6, &ss, &sl) < 0 ? -2 : armed_send_ack_to(a, lp->fd, &ss, sl, states, flow);
        Py_DECREF(route);
        if (r == -2) {
            Py_DECREF(key);
            return -1;
        }
        if (r == EAGAIN || r == EWOULDBLOCK) {
            Py_DECREF(key);
            return 1; /* still held: the transmit pass queues it behind the backlog */
        }
        if (r >= 0)
            lp->sent++;
        if (r > 0) {
            *err = r;
            Py_DECREF(key);
            return 1;
        }
    }
    /* transmit: `del active[qpn]; visited.append(qp)` (once per QP in a row) */
    PyObject *cur = PyDict_GetItemWithError(lp->active, key); /* borrowed */
    int bad = cur == NULL ? PyErr_Occurred() != NULL : cur == a->qp && PyDict_DelItem(lp->active, key) < 0;
    Py_DECREF(key);
    if (bad)
        return -1;
    Py_ssize_t nv = PyList_GET_SIZE(lp->visited);
    if ((nv == 0 || PyList_GET_ITEM(lp->visited, nv - 1) != a->qp) && PyList_Append(lp->visited, a->qp) < 0)
        return -1;
    return 0;
}

static PyObject *fp_wait_loop(PyObject *Py_UNUSED(self), PyObject *args) {
    int epfd;
    PyObject *ports, *done;
    double spin_end, end, deadline;
    Py_ssize_t max_reads;
    if (!PyArg_ParseTuple(args, "iO!Odddn:wait_loop", &epfd, &PyList_Type, &ports, &done, &spin_end, &end, &deadline,
                          &max_reads))
        return NULL;
    Py_ssize_t np = PyList_GET_SIZE(ports);
    if (np < 1 || np > LOOP_PORTS_MAX || max_reads < 1 || !PyCallable_Check(done) || isnan(end) || isnan(deadline) ||
        isnan(spin_end)) {
        PyErr_SetString(PyExc_ValueError, "wait_loop: 1 to 64 ports, max_reads >= 1, a callable done, times");
        return NULL;
    }
    LoopPort lp[LOOP_PORTS_MAX];
    Py_ssize_t got = 0;
    PyObject *result = NULL, *raw = NULL;
    int reason = LOOP_TIME, err = 0;
    Py_ssize_t index = -1;
    for (; got < np; got++) {
        LoopPort *p = &lp[got];
        memset(p, 0, sizeof *p);
        PyObject *t = PyList_GET_ITEM(ports, got);
        if (!PyTuple_Check(t)) {
            PyErr_SetString(PyExc_TypeError, "wait_loop: a port is a tuple");
            goto out;
        }
        if (!PyArg_ParseTuple(t, "iw*O!O!OO!O!O!O!:wait_loop port", &p->fd, &p->buf,
                              &PyDict_Type, &p->armed, &PyDict_Type, &p->active, &p->strikes, &PyDict_Type, &p->reqs,
                              &PyList_Type, &p->touched, &PyDict_Type, &p->routes, &PyList_Type, &p->visited))
            goto out;
        p->tuple = Py_NewRef(t);
    }
    double spin = spin_end - loop_clock();
    if (spin < 0)
        spin = 0;
    for (;;) {
        if (PyErr_CheckSignals() < 0)
            goto out;
        double now = loop_clock();
        int any = 0, full = 0; /* full: a poll stopped at max_reads, not at an empty socket */
        for (Py_ssize_t i = 0; i < np; i++) {
            LoopPort *p = &lp[i];
            ArmedObject *woke[2] = {NULL, NULL};
            int nwoke = 0;
            Py_ssize_t taken = poll_core(p->fd, p->buf.buf, p->buf.len, p->armed, p->active, p->strikes, max_reads,
                                         p->reqs, now, p->touched, woke, &nwoke, &raw);
            int r = 0;
            if (taken >= 0 && raw == Py_None && !PyList_GET_SIZE(p->touched) && nwoke == 1)
                r = loop_send_ack(p, woke[0], &err);
            Py_XDECREF(woke[0]);
            Py_XDECREF(woke[1]);
            if (taken < 0 || r < 0)
                goto out;
            p->taken += taken;
            any |= taken > 0;
            full |= taken >= max_reads;
            if (raw != Py_None || PyList_GET_SIZE(p->touched) || nwoke > 1) {
                reason = LOOP_PORT, index = i;
                goto done;
            }
            Py_CLEAR(raw);
            if (nwoke == 1) {
                if (r) {
                    raw = Py_NewRef(Py_None);
                    reason = LOOP_PORT, index = i;
                    goto done;
                }
                if (PyList_GET_SIZE(p->visited) >= LOOP_VISITED_MAX) {
                    reason = LOOP_FLUSH;
                    goto done;
                }
            }
        }
        now = loop_clock();
        if (any)
            spin_end = now + spin; /* Driver.run_until: a busy pass starts the spin again */
        PyObject *dr = PyObject_CallNoArgs(done);
        if (dr == NULL)
            goto out;
        int d = PyObject_IsTrue(dr);
        Py_DECREF(dr);
        if (d < 0)
            goto out;
        if (d) {
            reason = LOOP_DONE;
            goto done;
        }
        if (now >= deadline || (!full && now >= end)) {
            reason = LOOP_TIME; /* a deadline is due at every pass; the end only when idle */
            goto done;
        }
        if (full)
            continue;
        /* Every socket read to empty: the next turn is an idle one (a spin, or the block), not
         * one more read that would say EAGAIN again (the Python pass's epoll_wait(0) after work) */
        if (now < spin_end) {
            /* a thread that asked for the GIL gets it, as between a Python loop's turns */
            Py_BEGIN_ALLOW_THREADS;
            Py_END_ALLOW_THREADS;
            continue;
        }
        double left = (deadline < end ? deadline : end) - now;
        double ms = ceil(left * 1e3);
        int timeout = ms > 3600e3 ? 3600000 : (int)ms;
        struct epoll_event ev[16];
        int n;
        Py_BEGIN_ALLOW_THREADS;
        n = epoll_wait(epfd, ev, 16, timeout);
        Py_END_ALLOW_THREADS;
        if (n < 0) {
            if (errno != EINTR) {
                PyErr_SetFromErrno(PyExc_OSError);
                goto out;
            }
            n = 0;
        }
        for (int k = 0; k < n; k++) {
            int ours = 0;
            for (Py_ssize_t i = 0; i < np && !ours; i++)
                ours = ev[k].data.fd == lp[i].fd;
            if (!ours) {
                reason = LOOP_WAKE;
                goto done;
            }
        }
        spin_end = loop_clock() + spin; /* after a wait, run_until spins again before the next */
    }
done:
    if (raw == NULL)
        raw = Py_NewRef(Py_None);
    {
        PyObject *counts = PyList_New(np);
        if (counts == NULL)
            goto out;
        for (Py_ssize_t i = 0; i < np; i++) {
            PyObject *c = Py_BuildValue("(nn)", lp[i].taken, lp[i].sent);
            if (c == NULL) {
                Py_DECREF(counts);
                goto out;
            }
            PyList_SET_ITEM(counts, i, c);
        }
        result = Py_BuildValue("inNOi", reason, index, counts, raw, err);
    }
out:
    Py_XDECREF(raw);
    for (Py_ssize_t i = 0; i < got; i++) {
        PyBuffer_Release(&lp[i].buf);
        Py_DECREF(lp[i].tuple);
    }
    return result;
}
