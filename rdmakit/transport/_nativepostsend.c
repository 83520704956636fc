/*
 * Native post_send: a work request checked, queued, built and sent in one call.
 *
 * Part of _fastpath.c's translation unit (it is #included there, after _nativepost.c, whose
 * helpers and names it shares). See docs/architecture.md, "Who owns a QP's state".
 *
 *   post_send(qp, wr, ctx) -> None | True | int | bytes
 *
 * QueuePair.post_send (rdmakit/engine/qp.py) calls it first when its transport set
 * qp.poster. When wr passes every check the engine's post_send makes (the QP in RTS; a
 * SEND or RDMA WRITE, with or without immediate; at most max_send_sge SGEs of non-negative
 * lengths; imm_data a u32 where the opcode carries it; remote_addr a u64, rkey a u32; room
 * in the send queue; every SGE inside a region of its L_Key) and the request it makes is
 * the requester's whole work of the kind native posting takes (QueuePair.tx_post: one
 * packet of at most an MTU from at most one region, the requester steady, the window, its
 * pacer, the DCQCN rate and the end-to-end credits not limiting), it does in this one call
 * what post_send, its doorbell and tx_post do: the SendWqe (send_wqe.py's fields), its
 * place in the send queue, the requester's changes in tx_small's order (the credits'
 * counters, the retransmit timer as Requester.arm_timer sets it, the DCQCN byte counter as
 * Dcqcn.sent counts it), the packet and its ICRC, the sendmsg, and the transport's
 * bookkeeping: the QP joins the port's visited list (the deadline heap sees its timer) and
 * the device's and link's counters count the datagram.
 *
 * Anything else returns None having changed nothing: the engine's post_send then runs as
 * it always does (and raises what it raises). Otherwise: True (sent and counted), or
 * sendmsg's errno, or the datagram itself when the context's fd < 0 (a simulated wire) or
 * the socket would block; the caller's ctx[POST_AFTER] handles those.
 *
 * ctx is the transport's list: fd, v6, clock (None: decline), overhead, active (dict by
 * QPN: a QP in it has other work), backlog (list: non-empty, decline), visited (list),
 * flows (dict id(qp.remote) -> (qp.remote, address, the flow's states, IcrcFlow)), device
 * counters, link counters (both None: not counted), after (callable), and the engine's table
 * (small_tx.POST_TABLE). Its interned names, attr_double, set_double and post_send_setup are
 * at the end of _nativepost.c.
 */

enum { PC_FD, PC_V6, PC_CLOCK, PC_OVERHEAD, PC_ACTIVE, PC_BACKLOG, PC_VISITED, PC_FLOWS, PC_COUNTERS, PC_LINK,
       PC_AFTER, PC_TABLE, PC_LEN };
enum { PT_WQE, PT_RTS, PT_SUCCESS, PT_POSTED, PT_PENDING, PT_ROWS, PT_SGE, PT_MAX_MSG, PT_SAMPLE, PT_TIMER, PT_LEN };
enum { PR_WC, PR_KIND, PR_OPS, PR_WRITE, PR_IMM, PR_TAKES, PR_LEN };
enum { TK_GRAN, TK_RTO_VAR, TK_RTO_SRTTS, TK_MAX_RTO, TK_MIN_RTO, TK_PTO_RTTS, TK_MIN_PTO, TK_LEN };


/* Requester.arm_timer(now) for a requester whose timeout is set (rexmit_timeout, then the
 * tail-loss probe's timer, congestion.probe_timeout), in the same floating-point steps; -1
 * with an exception set. */
static int post_arm_timer(PyObject *req, int cc_on, double now, double timeout, const double *k) {
    double timer = timeout;
    PyObject *rtt = NULL;
    double s = 0.0;
    int none = 1;
    if (cc_on) {
        rtt = PyObject_GetAttr(req, s_rtt);
        if (rtt == NULL || attr_double(rtt, s_smoothed, &s, &none) < 0)
            goto fail;
        if (!none) {
            double var;
            int vnone;
            long backoff;
            if (attr_double(rtt, s_variation, &var, &vnone) < 0 || attr_long(req, s_rto_backoff, &backoff) < 0)
                goto fail;
            double g = k[TK_RTO_VAR] * var;
            double a = s + (g > k[TK_GRAN] ? g : k[TK_GRAN]), b = k[TK_RTO_SRTTS] * s;
            double rto = b > a ? b : a;
            double mult = (double)(1L << (backoff < 16 ? backoff : 16));
            if (rto > timeout) {
                double r = rto * mult;
                timer = k[TK_MAX_RTO] < r ? k[TK_MAX_RTO] : r;
            } else {
                double early = (k[TK_MIN_RTO] > rto ? k[TK_MIN_RTO] : rto) * mult;
                timer = early < timeout ? early : timeout;
            }
            if (timer == 0.0)
                timer = timeout; /* rexmit_timeout() or self.timeout */
        }
    }
    if (set_double(req, s_rexmit_deadline, now + timer) < 0)
        goto fail;
    int probe = 0;
    double pto = 0.0;
    if (cc_on && !none) {
        int probed = attr_true(req, s_probed);
        if (probed < 0)
            goto fail;
        if (!probed) {
            double a = k[TK_PTO_RTTS] * s;
            pto = k[TK_MIN_PTO] > a ? k[TK_MIN_PTO] : a;
            probe = pto < timer;
        }
    }
    Py_XDECREF(rtt);
    return probe ? set_double(req, s_probe_deadline, now + pto) : PyObject_SetAttr(req, s_probe_deadline, Py_None);
fail:
    Py_XDECREF(rtt);
    return -1;
}

/* The engine's checks of post_send for wr on qp, narrowed to what native posting takes: 1 it
 * passes (*row, *view and *length set; *view a new reference or NULL for no payload), 0 not
 * (nothing changed), -1 an exception is set. */
static int post_check(PyObject *qp, PyObject *wr, PyObject *table, PyObject **row, PyObject **view,
                      uint64_t *length, uint64_t *sqlen) {
    PyObject *x = PyObject_GetAttr(qp, s_state_);
    if (x == NULL)
        return -1;
    int t = x == PyTuple_GET_ITEM(table, PT_RTS);
    Py_DECREF(x);
    if (!t)
        return 0;
    PyObject *op = PyObject_GetAttr(wr, s_opcode);
    if (op == NULL)
        return -1;
    PyObject *r = PyDict_GetItemWithError(PyTuple_GET_ITEM(table, PT_ROWS), op);
    Py_DECREF(op);
    if (r == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != PR_LEN)
        return 0;
    PyObject *caps = PyObject_GetAttr(qp, s_caps);
    if (caps == NULL)
        return -1;
    long max_sge, max_wr;
    t = attr_long(caps, s_max_send_sge, &max_sge) < 0 || attr_long(caps, s_max_send_wr, &max_wr) < 0;
    Py_DECREF(caps);
    if (t)
        return -1;
    PyObject *sges = PyObject_GetAttr(wr, s_sg_list);
    if (sges == NULL)
        return -1;
    int ok = 0;
    PyObject *sge_type = PyTuple_GET_ITEM(table, PT_SGE), *pd = NULL, *by_lkey = NULL, *v = NULL;
    uint64_t total = 0, max_msg;
    Py_ssize_t n = PyTuple_Check(sges) ? PyTuple_GET_SIZE(sges) : -1;
    if (n < 0 || n > max_sge || get_uint(PyTuple_GET_ITEM(table, PT_MAX_MSG), UINT32_MAX, &max_msg) <= 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sge = PyTuple_GET_ITEM(sges, i);
        uint64_t len;
        if ((PyObject *)Py_TYPE(sge) != sge_type || PyTuple_GET_SIZE(sge) != 3 ||
            get_uint(PyTuple_GET_ITEM(sge, 1), UINT32_MAX, &len) <= 0)
            goto done;
        total += len;
    }
    if (total > max_msg)
        goto done;
    uint64_t u;
    if (PyTuple_GET_ITEM(r, PR_IMM) == Py_True) {
        PyObject *imm = PyObject_GetAttr(wr, s_imm_data);
        if (imm == NULL)
            goto done;
        t = get_uint(imm, 0xFFFFFFFFu, &u);
        Py_DECREF(imm);
        if (t <= 0)
            goto done;
    }
    if ((t = attr_uint(wr, s_remote_addr, UINT64_MAX, &u)) <= 0 || (t = attr_uint(wr, s_rkey, 0xFFFFFFFFu, &u)) <= 0)
        goto done;
    PyObject *req = PyObject_GetAttr(qp, s_req);
    if (req == NULL)
        goto done;
    PyObject *sq = PyObject_GetAttr(req, s_sq);
    Py_DECREF(req);
    Py_ssize_t have = sq == NULL ? -1 : PyObject_Length(sq);
    Py_XDECREF(sq);
    if (have < 0 || have >= max_wr)
        goto done;
    /* pd.local_slice(sge, False) for each SGE: the one non-empty view is the payload. */
    if (total) {
        if ((pd = PyObject_GetAttr(qp, s_pd)) == NULL || (by_lkey = PyObject_GetAttr(pd, s_by_lkey)) == NULL ||
            !PyDict_Check(by_lkey))
            goto done;
    }
    for (Py_ssize_t i = 0; i < n && total; i++) {
        PyObject *sge = PyTuple_GET_ITEM(sges, i);
        uint64_t addr, len, mra, mrlen;
        get_uint(PyTuple_GET_ITEM(sge, 1), UINT32_MAX, &len);
        if (!len)
            continue;
        if (v != NULL || get_uint(PyTuple_GET_ITEM(sge, 0), UINT64_MAX, &addr) <= 0)
            goto done; /* a second region (the generic path gathers), or the engine's error */
        PyObject *mr = PyDict_GetItemWithError(by_lkey, PyTuple_GET_ITEM(sge, 2));
        if (mr == NULL) {
            PyErr_Clear();
            goto done;
        }
        if ((t = attr_uint(mr, s_addr, UINT64_MAX, &mra)) <= 0 || (t = attr_uint(mr, s_length, UINT64_MAX, &mrlen)) <= 0)
            goto done;
        /* MemoryRegion.contains: mr.addr <= addr and addr + length <= mr.addr + mr.length */
        if (!(mra <= addr && (unsigned __int128)addr + len <= (unsigned __int128)mra + mrlen))
            goto done;
        PyObject *mv = PyObject_GetAttr(mr, s_view);
        if (mv == NULL)
            goto done;
        if (!PyMemoryView_Check(mv) || addr - mra > (uint64_t)PY_SSIZE_T_MAX / 2) {
            Py_DECREF(mv);
            goto done;
        }
        v = PySequence_GetSlice(mv, (Py_ssize_t)(addr - mra), (Py_ssize_t)(addr - mra + len));
        Py_DECREF(mv);
        if (v == NULL)
            goto done;
    }
    ok = 1;
    *row = r;
    *view = v;
    v = NULL;
    *length = total;
    *sqlen = (uint64_t)have;
done:
    Py_XDECREF(v);
    Py_XDECREF(by_lkey);
    Py_XDECREF(pd);
    Py_DECREF(sges);
    if (!ok)
        PyErr_Clear(); /* the engine's own post_send finds and reports it */
    return ok;
}

/* The SendWqe send_wqe.SendWqe.__init__ makes for wr (SUCCESS; segs [view] or []); a new
 * reference, or NULL with an exception set. */
static PyObject *post_wqe(PyObject *table, PyObject *wr, PyObject *row, PyObject *view, uint64_t length) {
    PyTypeObject *tp = (PyTypeObject *)PyTuple_GET_ITEM(table, PT_WQE);
    PyObject *w = tp->tp_alloc(tp, 0);
    if (w == NULL)
        return NULL;
    PyObject *segs = view == NULL ? PyList_New(0) : PyList_New(1);
    if (segs != NULL && view != NULL)
        PyList_SET_ITEM(segs, 0, Py_NewRef(view));
    int takes = PyTuple_GET_ITEM(row, PR_TAKES) == Py_True;
    PyObject *sol = PyObject_GetAttr(wr, s_solicited_wr), *sig = PyObject_GetAttr(wr, s_signaled_);
    PyObject *imm = PyTuple_GET_ITEM(row, PR_IMM) == Py_True ? PyObject_GetAttr(wr, s_imm_data) : Py_NewRef(Py_None);
    int st = sol == NULL ? -1 : PyObject_IsTrue(sol);
    if (segs == NULL || sig == NULL || imm == NULL || st < 0 || set_steal(w, s_wr, Py_NewRef(wr)) < 0 ||
        set_steal(w, s_length, PyLong_FromUnsignedLongLong(length)) < 0 || PyObject_SetAttr(w, s_segs, segs) < 0 ||
        PyObject_SetAttr(w, s_seg0, view == NULL ? Py_None : view) < 0 ||
        PyObject_SetAttr(w, s_status, PyTuple_GET_ITEM(table, PT_SUCCESS)) < 0 ||
        PyObject_SetAttr(w, s_signaled_, sig) < 0 || PyObject_SetAttr(w, s_wc_opcode_, PyTuple_GET_ITEM(row, PR_WC)) < 0 ||
        PyObject_SetAttr(w, s_kind, PyTuple_GET_ITEM(row, PR_KIND)) < 0 ||
        PyObject_SetAttr(w, s_ops, PyTuple_GET_ITEM(row, PR_OPS)) < 0 ||
        PyObject_SetAttr(w, s_is_write, PyTuple_GET_ITEM(row, PR_WRITE)) < 0 || PyObject_SetAttr(w, s_imm, imm) < 0 ||
        PyObject_SetAttr(w, s_takes_receive, PyTuple_GET_ITEM(row, PR_TAKES)) < 0 ||
        /* wr.solicited and takes_receive */
        PyObject_SetAttr(w, s_solicited, !st ? sol : takes ? Py_True : Py_False) < 0 ||
        PyObject_SetAttr(w, s_state, PyTuple_GET_ITEM(table, PT_POSTED)) < 0 ||
        PyObject_SetAttr(w, s_started, Py_False) < 0 || set_steal(w, s_first_psn, PyLong_FromLong(0)) < 0 ||
        set_steal(w, s_last_psn, PyLong_FromLong(0)) < 0 || PyObject_SetAttr(w, s_has_rd_, Py_False) < 0 ||
        set_steal(w, s_read_done, PyLong_FromLong(0)) < 0)
        Py_CLEAR(w);
    Py_XDECREF(segs);
    Py_XDECREF(sol);
    Py_XDECREF(sig);
    Py_XDECREF(imm);
    return w;
}

/* The requester takes a fresh WQE now as tx_post would (requester_steady, before the WQE is
 * queued: sqlen WQEs, all started): 1, 0, or -1 with an exception set. */
static int post_ready(PyObject *qp, PyObject *req, uint64_t sqlen) {
    long idx;
    int t = requester_steady(qp, req, &idx);
    if (t <= 0)
        return t;
    return idx >= 0 && (uint64_t)idx == sqlen;
}

static PyObject *fp_post_send(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *qp, *wr, *ctx;
    if (!PyArg_ParseTuple(args, "OOO!:post_send", &qp, &wr, &PyList_Type, &ctx))
        return NULL;
    if (!codec_ready || PyList_GET_SIZE(ctx) != PC_LEN)
        Py_RETURN_NONE;
    PyObject *table = PyList_GET_ITEM(ctx, PC_TABLE), *clock = PyList_GET_ITEM(ctx, PC_CLOCK);
    PyObject *flows = PyList_GET_ITEM(ctx, PC_FLOWS), *active = PyList_GET_ITEM(ctx, PC_ACTIVE);
    PyObject *backlog = PyList_GET_ITEM(ctx, PC_BACKLOG), *visited = PyList_GET_ITEM(ctx, PC_VISITED);
    PyObject *counters = PyList_GET_ITEM(ctx, PC_COUNTERS), *lcounters = PyList_GET_ITEM(ctx, PC_LINK);
    long fd = PyLong_AsLong(PyList_GET_ITEM(ctx, PC_FD)), overhead = PyLong_AsLong(PyList_GET_ITEM(ctx, PC_OVERHEAD));
    int v6 = PyObject_IsTrue(PyList_GET_ITEM(ctx, PC_V6));
    if (PyErr_Occurred() || v6 < 0)
        return NULL;
    if (clock == Py_None || !PyTuple_Check(table) || PyTuple_GET_SIZE(table) != PT_LEN || !PyDict_Check(flows) ||
        (active != Py_None && !PyDict_Check(active)) || (backlog != Py_None && !PyList_Check(backlog)) ||
        (visited != Py_None && !PyList_Check(visited)) || fd > INT_MAX || overhead < 0 || overhead > 0xFFFF)
        Py_RETURN_NONE;
    if (backlog != Py_None && PyList_GET_SIZE(backlog))
        Py_RETURN_NONE; /* a queued datagram goes first */
    PyObject *row = NULL, *view = NULL, *req = NULL, *rate = NULL, *wqe = NULL, *result = NULL, *dest = NULL;
    uint64_t length = 0, sqlen = 0;
    int t = post_check(qp, wr, table, &row, &view, &length, &sqlen);
    if (t <= 0) {
        PyErr_Clear(); /* the engine's own post_send finds and reports it */
        t = 0;
        goto declined;
    }
    if (active != Py_None) {
        PyObject *qpn = PyObject_GetAttr(qp, s_qpn);
        if (qpn == NULL)
            goto out;
        t = PyDict_Contains(active, qpn);
        Py_DECREF(qpn);
        if (t != 0)
            goto declined; /* other work of this QP: transmit keeps the order */
    }
    PyObject *remote = PyObject_GetAttr(qp, s_remote);
    if (remote == NULL)
        goto out;
    /* By the peer object's identity: no __hash__ of a Python class runs. */
    PyObject *key = PyLong_FromVoidPtr(remote);
    dest = key == NULL ? NULL : PyDict_GetItemWithError(flows, key);
    Py_XDECREF(key);
    if (dest == NULL) {
        Py_DECREF(remote);
        PyErr_Clear();
        t = 0;
        goto declined; /* the first post to this peer: the doorbell's path caches its flow */
    }
    Py_INCREF(dest);
    t = PyTuple_Check(dest) && PyTuple_GET_SIZE(dest) == 4 && PyTuple_GET_ITEM(dest, 0) == remote &&
        PyDict_Check(PyTuple_GET_ITEM(dest, 2));
    Py_DECREF(remote);
    if (!t)
        goto declined;
    PyObject *addr = PyTuple_GET_ITEM(dest, 1), *states = PyTuple_GET_ITEM(dest, 2), *flow = PyTuple_GET_ITEM(dest, 3);
    req = PyObject_GetAttr(qp, s_req);
    if (req == NULL)
        goto out;
    if ((t = post_ready(qp, req, sqlen)) <= 0)
        goto declined;
    uint64_t psn, comp, window, mtu, dqpn, va = 0, rkey = 0, immv = 0;
    if ((t = attr_uint(req, s_req_psn, PSN_MASK, &psn)) <= 0 || (t = attr_uint(req, s_comp_psn, PSN_MASK, &comp)) <= 0 ||
        (t = attr_uint(req, s_window, PSN_MASK, &window)) <= 0 || (t = attr_uint(req, s_mtu, 4096, &mtu)) <= 0 ||
        length > mtu)
        goto declined;
    int cc_is_on = attr_true(req, s_cc_on);
    if (cc_is_on < 0 || (rate = PyObject_GetAttr(req, s_rate)) == NULL)
        goto out;
    if (cc_is_on) {
        /* DCQCN pacing, or the window's pacer armed: the generic path spends the tokens. */
        if ((t = attr_none(rate, s_rate)) != 1)
            goto declined;
        PyObject *pacer = PyObject_GetAttr(req, s_pacer);
        if (pacer == NULL)
            goto out;
        t = attr_true(pacer, s_armed);
        Py_DECREF(pacer);
        if (t != 0)
            goto declined;
        /* cc.packets(): max(int(cwnd), 1) */
        PyObject *cc = PyObject_GetAttr(req, s_cc);
        if (cc == NULL)
            goto out;
        double cwnd;
        int none;
        t = attr_double(cc, s_cwnd, &cwnd, &none);
        Py_DECREF(cc);
        if (t < 0)
            goto out;
        if (none || !(cwnd < 9.0e15) || cwnd != cwnd) {
            t = 0;
            goto declined;
        }
        uint64_t packets = cwnd < 1.0 ? 1 : (uint64_t)cwnd;
        if (packets < window)
            window = packets;
    }
    uint32_t d = (uint32_t)(psn - comp) & PSN_MASK;
    if (window <= d && d < REQ_HALF)
        goto declined;
    /* The end-to-end credits (Credits.may_start(takes_receive, idle)): the last check. */
    int takes = PyTuple_GET_ITEM(row, PR_TAKES) == Py_True;
    PyObject *credits = PyObject_GetAttr(req, s_credits);
    if (credits == NULL)
        goto out;
    uint64_t ssn, lsn = 0;
    PyObject *lsno = PyObject_GetAttr(credits, s_lsn);
    int unlimited = attr_true(credits, s_unlimited);
    t = lsno == NULL || unlimited < 0 ? -1 : attr_uint(credits, s_ssn, PSN_MASK, &ssn);
    if (t > 0 && lsno != Py_None)
        t = get_uint(lsno, PSN_MASK, &lsn);
    int limited = lsno != NULL && lsno != Py_None && !unlimited;
    Py_XDECREF(lsno);
    if (t <= 0) {
        Py_DECREF(credits);
        goto declined;
    }
    uint32_t nssn = (uint32_t)(ssn + 1) & PSN_MASK;
    if (limited && takes && d != 0) {
        uint32_t past = (nssn - (uint32_t)lsn - 1) & PSN_MASK;
        if (0 < past && past < REQ_HALF) {
            Py_DECREF(credits);
            goto declined; /* past the limit and past the one probe */
        }
    }
    /* The packet's fields, and the timer's inputs: read before anything changes. */
    PyObject *rq = PyObject_GetAttr(req, s_qp_);
    t = rq == NULL ? -1 : attr_uint(rq, s_dest_qpn, PSN_MASK, &dqpn);
    Py_XDECREF(rq);
    uint64_t op = 256, hwm;
    PyObject *ops = PyTuple_GET_ITEM(row, PR_OPS);
    int is_write = PyTuple_GET_ITEM(row, PR_WRITE) == Py_True, has_imm = PyTuple_GET_ITEM(row, PR_IMM) == Py_True;
    if (t > 0 && PyTuple_Check(ops) && PyTuple_GET_SIZE(ops) == 4)
        t = get_uint(PyTuple_GET_ITEM(ops, 3), 255, &op);
    if (t > 0)
        t = attr_uint(req, s_sent_hwm, PSN_MASK, &hwm);
    if (t > 0 && is_write && (t = attr_uint(wr, s_remote_addr, UINT64_MAX, &va)) > 0)
        t = attr_uint(wr, s_rkey, 0xFFFFFFFFu, &rkey);
    if (t > 0 && has_imm) {
        PyObject *imm = PyObject_GetAttr(wr, s_imm_data);
        t = imm == NULL ? -1 : get_uint(imm, UINT64_MAX, &immv); /* a u32: post_check */
        Py_XDECREF(imm);
    }
    int se = 0;
    if (t > 0 && takes) {
        se = attr_true(wr, s_solicited_wr);
        t = se < 0 ? -1 : 1;
    }
    int hlen = BTH_LEN + (is_write ? 16 : 0) + (has_imm ? 4 : 0);
    if (t <= 0 || op > 255 || op_layout[op] < 0 || hlen != op_hlen[op]) {
        Py_DECREF(credits);
        goto declined;
    }
    double timeout = 0.0, kt[TK_LEN];
    int no_timer = attr_none(req, s_rexmit_deadline), no_timeout = 1;
    PyObject *kto = PyTuple_GET_ITEM(table, PT_TIMER);
    if (no_timer < 0 || attr_double(req, s_timeout, &timeout, &no_timeout) < 0 || !PyTuple_Check(kto) ||
        PyTuple_GET_SIZE(kto) != TK_LEN) {
        Py_DECREF(credits);
        goto out_or_declined;
    }
    for (int i = 0; i < TK_LEN; i++)
        kt[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(kto, i));
    double sample_period = PyFloat_AsDouble(PyTuple_GET_ITEM(table, PT_SAMPLE));
    PyObject *nowo = PyErr_Occurred() ? NULL : PyObject_CallNoArgs(clock);
    double now = nowo == NULL ? -1.0 : PyFloat_AsDouble(nowo);
    Py_XDECREF(nowo);
    if (now == -1.0 && PyErr_Occurred()) {
        Py_DECREF(credits);
        goto out;
    }
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    if (fd >= 0 && parse_addr(addr, v6, &ss, &sl) < 0) {
        Py_DECREF(credits);
        goto out;
    }
    /* The packet: ONLY opcode, BTH (+ RETH) (+ ImmDt) and the ICRC (IBTA Vol. 1 §9.2-§9.3). */
    static const unsigned char padcnt[4] = {0x00, 0x30, 0x20, 0x10};
    unsigned char hdr[48], tail[8];
    Py_buffer pl = {0};
    if (view != NULL && PyObject_GetBuffer(view, &pl, PyBUF_SIMPLE) < 0) {
        Py_DECREF(credits);
        goto out;
    }
    Py_ssize_t plen = (Py_ssize_t)length, pad = -plen & 3;
    put_bth(hdr, (int)op, (uint32_t)dqpn, (uint32_t)psn, 1, 0);
    hdr[1] = (unsigned char)((se ? 0x80 : 0) | padcnt[plen & 3]);
    unsigned char *at = hdr + BTH_LEN;
    if (is_write) {
        put_be64(at, va);
        put_be32(at + 8, (uint32_t)rkey);
        put_be32(at + 12, (uint32_t)length);
        at += 16;
    }
    if (has_imm)
        put_be32(at, (uint32_t)immv);
    Py_ssize_t size = hlen + plen + pad + ICRC_LEN;
    if (icrc_seal(states, flow, size, hdr, hlen, pl.buf, plen, tail, pad) < 0)
        goto unwind;
    /* Committed: post_send's queueing, then tx_small's effect, in its order. */
    wqe = post_wqe(table, wr, row, view, length);
    PyObject *sq = wqe == NULL ? NULL : PyObject_GetAttr(req, s_sq);
    PyObject *r = sq == NULL ? NULL : PyObject_CallMethodOneArg(sq, s_append, wqe);
    Py_XDECREF(sq);
    if (r == NULL)
        goto unwind;
    Py_DECREF(r);
    if (set_steal(credits, s_ssn, PyLong_FromUnsignedLong(nssn)) < 0 ||
        (limited && !takes && set_steal(credits, s_lsn, PyLong_FromUnsignedLong(((uint32_t)lsn + 1) & PSN_MASK)) < 0) ||
        PyObject_SetAttr(wqe, s_started, Py_True) < 0 ||
        set_steal(wqe, s_first_psn, PyLong_FromUnsignedLong((unsigned long)psn)) < 0 ||
        set_steal(wqe, s_last_psn, PyLong_FromUnsignedLong((unsigned long)psn)) < 0 ||
        PyObject_SetAttr(wqe, s_state, PyTuple_GET_ITEM(table, PT_PENDING)) < 0 || set_steal(req, s_noack, PyLong_FromLong(0)) < 0)
        goto unwind;
    PyObject *stats = PyObject_GetAttr(qp, s_stats);
    if (stats == NULL)
        goto unwind;
    uint32_t next_psn = (uint32_t)(psn + 1) & PSN_MASK;
    int bad = (((uint32_t)psn - (uint32_t)hwm) & PSN_MASK) >= REQ_HALF && attr_add(stats, s_retransmits, 1) < 0;
    if (!bad && ((next_psn - (uint32_t)hwm) & PSN_MASK) < REQ_HALF)
        bad = set_steal(req, s_sent_hwm, PyLong_FromUnsignedLong(next_psn)) < 0;
    int none = bad ? -1 : attr_none(req, s_rtt_psn);
    bad = none < 0 || (none && (set_steal(req, s_rtt_psn, PyLong_FromUnsignedLong((unsigned long)psn)) < 0 ||
                                set_double(req, s_rtt_sent, now) < 0));
    bad = bad || set_steal(req, s_next_idx, PyLong_FromUnsignedLongLong(sqlen + 1)) < 0 ||
          set_steal(req, s_req_psn, PyLong_FromUnsignedLong(next_psn)) < 0;
    if (!bad && no_timer && !no_timeout) {
        if (d == 0)
            bad = set_double(req, s_progress_at, now) < 0;
        bad = bad || post_arm_timer(req, cc_is_on, now, timeout, kt) < 0;
    }
    if (!bad && cc_is_on) {
        /* Dcqcn.sent(mtu + overhead, now) with its rate None: the byte counter only. */
        double since;
        int at_none;
        long nbytes = (long)mtu + overhead, sb;
        bad = attr_double(rate, s_sample_at, &since, &at_none) < 0;
        if (!bad && at_none)
            bad = set_double(rate, s_sample_at, now) < 0 || set_steal(rate, s_sample_bytes, PyLong_FromLong(nbytes)) < 0;
        else if (!bad) {
            bad = attr_long(rate, s_sample_bytes, &sb) < 0;
            sb += nbytes;
            if (!bad && now - since >= sample_period)
                bad = set_double(rate, s_sample_rate, (double)sb / (now - since)) < 0 || set_double(rate, s_sample_at, now) < 0 ||
                      set_steal(rate, s_sample_bytes, PyLong_FromLong(0)) < 0;
            else if (!bad)
                bad = set_steal(rate, s_sample_bytes, PyLong_FromLong(sb)) < 0;
        }
    }
    bad = bad || attr_add(stats, s_packets_out, 1) < 0;
    Py_DECREF(stats);
    if (bad || (visited != Py_None && PyList_Append(visited, qp) < 0))
        goto unwind;
    /* The wire. */
    struct iovec iov[3] = {{hdr, (size_t)hlen}, {pl.buf, (size_t)plen}, {tail, (size_t)(pad + ICRC_LEN)}};
    if (!plen)
        iov[1] = iov[2];
    if (fd >= 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_name = &ss;
        msg.msg_namelen = sl;
        msg.msg_iov = iov;
        msg.msg_iovlen = plen ? 3 : 2;
        ssize_t n;
        do {
            n = sendmsg((int)fd, &msg, 0);
        } while (n < 0 && errno == EINTR);
        if (n >= 0 && counters != Py_None) {
            /* as UdpPort._post_now: the device's packet, the link's datagram and send */
            if (attr_add(counters, s_packets_out_, 1) < 0 || attr_add(lcounters, s_datagrams_out, 1) < 0 ||
                attr_add(lcounters, s_sends, 1) < 0)
                goto unwind;
            result = Py_NewRef(Py_True);
            goto unwind;
        }
        if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            result = PyLong_FromLong(n < 0 ? errno : 0);
            goto unwind;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result != NULL) {
        char *b = PyBytes_AS_STRING(result);
        memcpy(b, hdr, (size_t)hlen);
        if (plen)
            memcpy(b + hlen, pl.buf, (size_t)plen);
        memcpy(b + hlen + plen, tail, (size_t)(pad + ICRC_LEN));
    }
unwind:
    if (pl.obj != NULL)
        PyBuffer_Release(&pl);
    Py_DECREF(credits);
    goto out;
out_or_declined:
    if (PyErr_Occurred())
        goto out;
declined:
    if (t >= 0 && !PyErr_Occurred())
        result = Py_NewRef(Py_None);
out:
    Py_XDECREF(view);
    Py_XDECREF(req);
    Py_XDECREF(rate);
    Py_XDECREF(wqe);
    Py_XDECREF(dest);
    return result;
}
