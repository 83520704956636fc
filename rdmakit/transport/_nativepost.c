/*
 * Native posting: a fresh one-packet SEND or RDMA WRITE sent in the call that rings its doorbell.
 *
 * Part of _fastpath.c's translation unit (it is #included there, after the codec and the
 * armed requester's completer, whose helpers and names it shares). See docs/architecture.md,
 * "Who owns a QP's state".
 *
 *   post_small(fd, addr, v6, states, flow, qp, now, overhead) -> None | int | bytes
 *
 * qp is an engine QueuePair whose post_send has just queued a work request. When that
 * request is the whole of the requester's work and the common case -- exactly the case
 * QueuePair.tx_small (rdmakit/engine/small_tx.py) takes, narrowed to a SEND or RDMA WRITE
 * (with or without immediate) of at most one MTU from one registered region -- it does, in
 * one call, what tx_small and send_packet do: the checks, the WQE's and the requester's
 * changes (started, first/last PSN, PENDING, noack, sent_hwm, the retransmit count, the
 * RTT sample's PSN and time, next_idx, req_psn, the statistics), the BTH, RETH and ImmDt
 * and the ICRC (Annex A17.3.3), and the sendmsg. What the congestion rules own is asked of
 * the engine's own objects, as tx_small asks them: the window's size (cc.packets()), the
 * end-to-end credits (credits.may_start), the retransmit timer (req.arm_timer, only when
 * it is not running) and the DCQCN byte counter (rate.sent).
 *
 * The engine owns every field it writes before and after the call; nothing is held here
 * between calls (no shadow state, no hand-back). Returns None having changed nothing (the
 * request is not that case; the caller rings the doorbell its usual way), or, having done
 * all of the above, sendmsg's errno (0: sent), or the datagram itself (BTH .. ICRC) when
 * fd < 0 (a simulated wire sends it) or the socket would block (the caller queues it, as
 * it queues what send_packet could not send).
 */

static PyObject *s_tx_on_, *s_fast_on_, *s_resp, *s_out, *s_native, *s_pending, *s_req, *s_need_retry,
    *s_draining, *s_req_off, *s_rnr_deadline, *s_pace_deadline, *s_req_psn, *s_window, *s_cc_on, *s_rate,
    *s_pacer, *s_armed, *s_cc, *s_packets, *s_mtu, *s_seg0, *s_ops, *s_is_write, *s_remote_addr, *s_rkey,
    *s_imm, *s_solicited, *s_dest_qpn, *s_credits, *s_may_start, *s_takes_receive, *s_first_psn, *s_noack,
    *s_stats, *s_retransmits, *s_rtt_psn, *s_rtt_sent, *s_rexmit_deadline, *s_timeout, *s_progress_at,
    *s_arm_timer, *s_sent, *s_packets_out, *s_qp_, *s_value2member;

#define POST_POSTED 0 /* WqeState.POSTED */

/* o.name is None: 1, 0, or -1 with an exception set. */
static int attr_none(PyObject *o, PyObject *name) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (x == NULL)
        return -1;
    int t = x == Py_None;
    Py_DECREF(x);
    return t;
}

/* o.name = v (a new reference, stolen); -1 with an exception set. */
static int set_steal(PyObject *o, PyObject *name, PyObject *v) {
    if (v == NULL)
        return -1;
    int r = PyObject_SetAttr(o, name, v);
    Py_DECREF(v);
    return r;
}

/* o.name += by; -1 with an exception set. */
static int attr_add(PyObject *o, PyObject *name, long by) {
    long v;
    if (attr_long(o, name, &v) < 0)
        return -1;
    return set_steal(o, name, PyLong_FromLong(v + by));
}

/* o.name as an unsigned value in [0, max]: 1 done, 0 not one (no exception), -1 exception set. */
static int attr_uint(PyObject *o, PyObject *name, uint64_t max, uint64_t *v) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (x == NULL)
        return -1;
    int r = get_uint(x, max, v);
    Py_DECREF(x);
    return r;
}

/* The ICRC of h[:hlen] + pl[:plen] + pad zero bytes, from the flow's state for a size-byte
 * datagram, into tail[pad:pad+4]; -1 with an exception set. */
static int icrc_seal(PyObject *states, PyObject *flow, Py_ssize_t size, unsigned char *h, int hlen,
                     const void *pl, Py_ssize_t plen, unsigned char *tail, Py_ssize_t pad) {
    int64_t st = icrc_state(states, flow, size, 0);
    if (st < 0)
        return -1;
    unsigned char b4 = h[4];
    h[4] = 0xFF; /* FECN, BECN, resv6 count as ones (Annex A17.3.3) */
    uint32_t c = crc32_update((uint32_t)st, h, (size_t)hlen);
    h[4] = b4;
    c = crc32_update(c, pl, (size_t)plen);
    memset(tail, 0, 8);
    c = crc32_update(c, tail, (size_t)pad);
    put_le32(tail + pad, c);
    return 0;
}

/* The member of the WqeState enum of wqe's state (send_wqe.WqeState) whose value is v, as the
 * engine stores it; a new reference, or NULL with an exception set. */
static PyObject *wqe_state(PyObject *wqe, long v) {
    PyObject *st = PyObject_GetAttr(wqe, s_state), *key = PyLong_FromLong(v);
    PyObject *map = st == NULL ? NULL : PyObject_GetAttr((PyObject *)Py_TYPE(st), s_value2member);
    PyObject *m = map == NULL || key == NULL || !PyDict_Check(map) ? NULL : PyDict_GetItemWithError(map, key);
    if (m == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "a WQE's state is a WqeState");
    Py_XINCREF(m);
    Py_XDECREF(map);
    Py_XDECREF(key);
    Py_XDECREF(st);
    return m;
}

/* 1: qp's requester is steady, as tx_small and tx_post check before a fresh WQE leaves (the fast
 * paths on, no response or armed ACK pending, between messages, no retry, drain, RNR wait or
 * pacing); *idx is its next WQE's index. 0: not; -1: error. */
static int requester_steady(PyObject *qp, PyObject *req, long *idx) {
    int t;
    if ((t = attr_true(qp, s_tx_on_)) <= 0 || (t = attr_true(qp, s_fast_on_)) <= 0)
        return t;
    PyObject *resp = PyObject_GetAttr(qp, s_resp);
    if (resp == NULL)
        return -1;
    t = attr_true(resp, s_out);
    Py_DECREF(resp);
    if (t != 0)
        return t < 0 ? -1 : 0;
    PyObject *nat = PyObject_GetAttr(qp, s_native);
    if (nat == NULL)
        return -1;
    t = nat == Py_None ? 0 : attr_true(nat, s_pending);
    Py_DECREF(nat);
    if (t != 0)
        return t < 0 ? -1 : 0;
    long off;
    if (attr_long(req, s_next_idx, idx) < 0 || attr_long(req, s_req_off, &off) < 0)
        return -1;
    if (off || (t = attr_true(req, s_need_retry)) != 0 || (t = attr_true(req, s_draining)) != 0 ||
        (t = attr_none(req, s_rnr_deadline)) != 1 || (t = attr_none(req, s_pace_deadline)) != 1)
        return t < 0 ? -1 : 0;
    return 1;
}

/* 1: qp's requester may send its one fresh SEND/WRITE now (tx_small's checks); 0: not; -1: error.
 * On 1, *wqe is a new reference. */
static int post_eligible(PyObject *qp, PyObject *req, PyObject **wqe) {
    long idx;
    int t = requester_steady(qp, req, &idx);
    if (t <= 0)
        return t;
    PyObject *sq = PyObject_GetAttr(req, s_sq);
    if (sq == NULL)
        return -1;
    Py_ssize_t n = PyObject_Length(sq);
    if (n < 0 || idx != (long)n - 1) {
        Py_DECREF(sq);
        return n < 0 ? -1 : 0;
    }
    PyObject *w = PySequence_GetItem(sq, idx);
    Py_DECREF(sq);
    if (w == NULL)
        return -1;
    long kind, state;
    if ((t = attr_true(w, s_started)) != 0 || (t = attr_true(w, s_status)) != 0 || attr_long(w, s_kind, &kind) < 0 ||
        attr_long(w, s_state, &state) < 0 || kind != REQ_SEND_WRITE || state != POST_POSTED) {
        Py_DECREF(w);
        return t < 0 || PyErr_Occurred() ? -1 : 0;
    }
    *wqe = w;
    return 1;
}

static PyObject *fp_post_small(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd, v6;
    PyObject *addr, *states, *flow, *qp;
    double now;
    long overhead;
    if (!PyArg_ParseTuple(args, "iOpO!OOdl:post_small", &fd, &addr, &v6, &PyDict_Type, &states, &flow, &qp, &now,
                          &overhead))
        return NULL;
    if (!codec_ready || overhead < 0 || overhead > 0xFFFF)
        Py_RETURN_NONE;
    PyObject *req = PyObject_GetAttr(qp, s_req);
    if (req == NULL)
        return NULL;
    PyObject *wqe = NULL, *wr = NULL, *rate = NULL, *result = NULL;
    Py_buffer pl = {0};
    int t = post_eligible(qp, req, &wqe);
    if (t <= 0)
        goto declined;
    uint64_t psn, comp, window, mtu, length;
    if ((t = attr_uint(req, s_req_psn, PSN_MASK, &psn)) <= 0 || (t = attr_uint(req, s_comp_psn, PSN_MASK, &comp)) <= 0 ||
        (t = attr_uint(req, s_window, PSN_MASK, &window)) <= 0 || (t = attr_uint(req, s_mtu, 4096, &mtu)) <= 0 ||
        (t = attr_uint(wqe, s_length, mtu, &length)) <= 0)
        goto declined;
    int cc_on = attr_true(req, s_cc_on);
    if (cc_on < 0)
        goto out;
    rate = PyObject_GetAttr(req, s_rate);
    if (rate == NULL)
        goto out;
    if (cc_on) {
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
        PyObject *cc = PyObject_GetAttr(req, s_cc);
        if (cc == NULL)
            goto out;
        PyObject *cw = PyObject_CallMethodNoArgs(cc, s_packets);
        Py_DECREF(cc);
        if (cw == NULL)
            goto out;
        uint64_t cwnd;
        t = get_uint(cw, UINT64_MAX, &cwnd);
        Py_DECREF(cw);
        if (t <= 0)
            goto declined;
        if (cwnd < window)
            window = cwnd;
    }
    uint32_t d = (uint32_t)(psn - comp) & PSN_MASK;
    if (window <= d && d < REQ_HALF)
        goto declined;
    /* The packet: ONLY opcode, BTH (+ RETH) (+ ImmDt) (IBTA Vol. 1 §9.2-§9.3). */
    PyObject *ops = PyObject_GetAttr(wqe, s_ops);
    if (ops == NULL)
        goto out;
    uint64_t op = 256;
    if (PyTuple_Check(ops) && PyTuple_GET_SIZE(ops) == 4)
        t = get_uint(PyTuple_GET_ITEM(ops, 3), 255, &op);
    else
        t = 0;
    Py_DECREF(ops);
    if (t <= 0 || op_layout[op] < 0)
        goto declined;
    int is_write = attr_true(wqe, s_is_write), se = attr_true(wqe, s_solicited);
    if (is_write < 0 || se < 0)
        goto out;
    PyObject *imm = PyObject_GetAttr(wqe, s_imm);
    if (imm == NULL)
        goto out;
    uint64_t immv = 0, va = 0, rkey = 0, dqpn = 0;
    t = imm == Py_None ? 1 : get_uint(imm, 0xFFFFFFFFu, &immv);
    int has_imm = imm != Py_None;
    Py_DECREF(imm);
    if (t <= 0)
        goto declined;
    wr = PyObject_GetAttr(wqe, s_wr);
    if (wr == NULL)
        goto out;
    if (is_write && ((t = attr_uint(wr, s_remote_addr, UINT64_MAX, &va)) <= 0 ||
                     (t = attr_uint(wr, s_rkey, 0xFFFFFFFFu, &rkey)) <= 0))
        goto declined;
    PyObject *rq = PyObject_GetAttr(req, s_qp_);
    if (rq == NULL)
        goto out;
    t = attr_uint(rq, s_dest_qpn, PSN_MASK, &dqpn);
    Py_DECREF(rq);
    if (t <= 0)
        goto declined;
    unsigned char h[48], tail[8];
    int hlen = BTH_LEN + (is_write ? 16 : 0) + (has_imm ? 4 : 0);
    if (hlen != op_hlen[op])
        goto declined; /* the opcode's layout is not the WQE's: the generic path */
    if (length) {
        PyObject *seg0 = PyObject_GetAttr(wqe, s_seg0);
        if (seg0 == NULL)
            goto out;
        if (seg0 == Py_None || (PyMemoryView_Check(seg0) && PyMemoryView_GET_BUFFER(seg0)->itemsize != 1) ||
            PyObject_GetBuffer(seg0, &pl, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            Py_DECREF(seg0);
            goto declined; /* scattered: the generic path gathers */
        }
        Py_DECREF(seg0);
        if (pl.len < (Py_ssize_t)length)
            goto declined;
    }
    static const unsigned char padcnt[4] = {0x00, 0x30, 0x20, 0x10};
    Py_ssize_t plen = (Py_ssize_t)length, pad = -plen & 3;
    put_bth(h, (int)op, (uint32_t)dqpn, (uint32_t)psn, 1, 0);
    h[1] = (unsigned char)((se ? 0x80 : 0) | padcnt[plen & 3]);
    unsigned char *p = h + BTH_LEN;
    if (is_write) {
        put_be64(p, va);
        put_be32(p + 8, (uint32_t)rkey);
        put_be32(p + 12, (uint32_t)length);
        p += 16;
    }
    if (has_imm)
        put_be32(p, (uint32_t)immv);
    Py_ssize_t size = hlen + plen + pad + ICRC_LEN;
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    if (fd >= 0 && parse_addr(addr, v6, &ss, &sl) < 0)
        goto out;
    if (icrc_seal(states, flow, size, h, hlen, pl.buf, plen, tail, pad) < 0)
        goto out;
    uint64_t hwm;
    if ((t = attr_uint(req, s_sent_hwm, PSN_MASK, &hwm)) <= 0)
        goto declined;
    /* The end-to-end credits: the last check, which counts the message when it passes. */
    long takes;
    if (attr_long(wqe, s_takes_receive, &takes) < 0)
        goto out;
    PyObject *credits = PyObject_GetAttr(req, s_credits);
    if (credits == NULL)
        goto out;
    PyObject *ok = PyObject_CallMethodObjArgs(credits, s_may_start, takes ? Py_True : Py_False,
                                              d == 0 ? Py_True : Py_False, NULL);
    Py_DECREF(credits);
    if (ok == NULL)
        goto out;
    t = PyObject_IsTrue(ok);
    Py_DECREF(ok);
    if (t <= 0)
        goto declined;
    /* Requester.transmit's effect for this one packet, in tx_small's order. */
    if (set_steal(wqe, s_started, Py_NewRef(Py_True)) < 0 || set_steal(wqe, s_first_psn, PyLong_FromUnsignedLong((unsigned long)psn)) < 0 ||
        set_steal(wqe, s_last_psn, PyLong_FromUnsignedLong((unsigned long)psn)) < 0 ||
        set_steal(wqe, s_state, wqe_state(wqe, REQ_PENDING)) < 0 || set_steal(req, s_noack, PyLong_FromLong(0)) < 0)
        goto out;
    PyObject *stats = PyObject_GetAttr(qp, s_stats);
    if (stats == NULL)
        goto out;
    uint32_t nxt = (uint32_t)(psn + 1) & PSN_MASK;
    if ((((uint32_t)psn - (uint32_t)hwm) & PSN_MASK) >= REQ_HALF && attr_add(stats, s_retransmits, 1) < 0) {
        Py_DECREF(stats);
        goto out;
    }
    if (((nxt - (uint32_t)hwm) & PSN_MASK) < REQ_HALF && set_steal(req, s_sent_hwm, PyLong_FromUnsignedLong(nxt)) < 0) {
        Py_DECREF(stats);
        goto out;
    }
    int none = attr_none(req, s_rtt_psn);
    if (none < 0 || (none && (set_steal(req, s_rtt_psn, PyLong_FromUnsignedLong((unsigned long)psn)) < 0 ||
                              set_steal(req, s_rtt_sent, PyFloat_FromDouble(now)) < 0))) {
        Py_DECREF(stats);
        goto out;
    }
    long idx;
    if (attr_long(req, s_next_idx, &idx) < 0 || set_steal(req, s_next_idx, PyLong_FromLong(idx + 1)) < 0 ||
        set_steal(req, s_req_psn, PyLong_FromUnsignedLong(nxt)) < 0) {
        Py_DECREF(stats);
        goto out;
    }
    int no_timer = attr_none(req, s_rexmit_deadline), no_timeout = attr_none(req, s_timeout);
    if (no_timer < 0 || no_timeout < 0) {
        Py_DECREF(stats);
        goto out;
    }
    PyObject *nowo = PyFloat_FromDouble(now);
    if (nowo == NULL) {
        Py_DECREF(stats);
        goto out;
    }
    int bad = 0;
    if (no_timer && !no_timeout) {
        if (d == 0)
            bad = PyObject_SetAttr(req, s_progress_at, nowo) < 0;
        PyObject *r = bad ? NULL : PyObject_CallMethodOneArg(req, s_arm_timer, nowo);
        bad = r == NULL;
        Py_XDECREF(r);
    }
    if (!bad && cc_on) {
        PyObject *nb = PyLong_FromLong((long)mtu + overhead);
        PyObject *r = nb == NULL ? NULL : PyObject_CallMethodObjArgs(rate, s_sent, nb, nowo, NULL);
        Py_XDECREF(nb);
        bad = r == NULL;
        Py_XDECREF(r);
    }
    Py_DECREF(nowo);
    if (bad || attr_add(stats, s_packets_out, 1) < 0) {
        Py_DECREF(stats);
        goto out;
    }
    Py_DECREF(stats);
    /* The wire. */
    struct iovec iov[3] = {{h, (size_t)hlen}, {pl.buf, (size_t)plen}, {tail, (size_t)(pad + ICRC_LEN)}};
    if (!plen)
        iov[1] = iov[2];
    if (fd >= 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_name = &ss;
        msg.msg_namelen = sl;
        msg.msg_iov = iov;
        msg.msg_iovlen = plen ? 3 : 2;
        ssize_t r;
        do {
            r = sendmsg(fd, &msg, 0);
        } while (r < 0 && errno == EINTR);
        if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            result = PyLong_FromLong(r < 0 ? errno : 0);
            goto out;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result != NULL) {
        char *b = PyBytes_AS_STRING(result);
        memcpy(b, h, (size_t)hlen);
        if (plen)
            memcpy(b + hlen, pl.buf, (size_t)plen);
        memcpy(b + hlen + plen, tail, (size_t)(pad + ICRC_LEN));
    }
    goto out;
declined:
    if (t >= 0 && !PyErr_Occurred())
        result = Py_NewRef(Py_None);
out:
    if (pl.obj != NULL)
        PyBuffer_Release(&pl);
    Py_XDECREF(wqe);
    Py_XDECREF(wr);
    Py_XDECREF(rate);
    Py_DECREF(req);
    return result;
}

static int post_setup(void) {
#define INTERN(var, name)                                                                                            \
    if ((var = PyUnicode_InternFromString(name)) == NULL)                                                         \
        return -1;
    INTERN(s_tx_on_, "_tx")
    INTERN(s_fast_on_, "_fast")
    INTERN(s_resp, "resp")
    INTERN(s_out, "out")
    INTERN(s_native, "native")
    INTERN(s_pending, "pending")
    INTERN(s_req, "req")
    INTERN(s_need_retry, "need_retry")
    INTERN(s_draining, "draining")
    INTERN(s_req_off, "req_off")
    INTERN(s_rnr_deadline, "rnr_deadline")
    INTERN(s_pace_deadline, "pace_deadline")
    INTERN(s_req_psn, "req_psn")
    INTERN(s_window, "window")
    INTERN(s_cc_on, "cc_on")
    INTERN(s_rate, "rate")
    INTERN(s_pacer, "pacer")
    INTERN(s_armed, "armed")
    INTERN(s_cc, "cc")
    INTERN(s_packets, "packets")
    INTERN(s_mtu, "mtu")
    INTERN(s_seg0, "seg0")
    INTERN(s_ops, "ops")
    INTERN(s_is_write, "is_write")
    INTERN(s_remote_addr, "remote_addr")
    INTERN(s_rkey, "rkey")
    INTERN(s_imm, "imm")
    INTERN(s_solicited, "solicited")
    INTERN(s_dest_qpn, "dest_qpn")
    INTERN(s_credits, "credits")
    INTERN(s_may_start, "may_start")
    INTERN(s_takes_receive, "takes_receive")
    INTERN(s_first_psn, "first_psn")
    INTERN(s_noack, "noack")
    INTERN(s_stats, "stats")
    INTERN(s_retransmits, "retransmits")
    INTERN(s_rtt_psn, "rtt_psn")
    INTERN(s_rtt_sent, "rtt_sent")
    INTERN(s_rexmit_deadline, "rexmit_deadline")
    INTERN(s_timeout, "timeout")
    INTERN(s_progress_at, "progress_at")
    INTERN(s_arm_timer, "arm_timer")
    INTERN(s_sent, "sent")
    INTERN(s_packets_out, "packets_out")
    INTERN(s_qp_, "qp")
    INTERN(s_value2member, "_value2member_map_")
#undef INTERN
    return 0;
}

/* -- native post_send's names and helpers (_nativepostsend.c) -- */

static PyObject *s_state_, *s_caps, *s_max_send_sge, *s_max_send_wr, *s_sg_list, *s_opcode, *s_imm_data,
    *s_signaled_, *s_solicited_wr, *s_pd, *s_by_lkey, *s_view, *s_bits, *s_addr, *s_segs, *s_wc_opcode_,
    *s_has_rd_, *s_read_done, *s_remote, *s_qpn, *s_ssn, *s_lsn, *s_unlimited, *s_cwnd, *s_sample_at,
    *s_sample_bytes, *s_sample_rate, *s_rtt, *s_smoothed, *s_variation, *s_rto_backoff, *s_probed,
    *s_probe_deadline, *s_packets_out_, *s_datagrams_out, *s_sends;

/* o.name as a double, *isnone set when it is None: 0, or -1 with an exception set (also when
 * it is neither a float, an int nor None). */
static int attr_double(PyObject *o, PyObject *name, double *v, int *isnone) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (x == NULL)
        return -1;
    *isnone = x == Py_None;
    *v = *isnone ? 0.0 : PyFloat_AsDouble(x);
    Py_DECREF(x);
    return !*isnone && *v == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int set_double(PyObject *o, PyObject *name, double v) { return set_steal(o, name, PyFloat_FromDouble(v)); }

static int post_send_setup(void) {
    static const struct {
        PyObject **var;
        const char *name;
    } names[] = {
        {&s_state_, "_state"}, {&s_caps, "caps"}, {&s_max_send_sge, "max_send_sge"}, {&s_max_send_wr, "max_send_wr"},
        {&s_sg_list, "sg_list"}, {&s_opcode, "opcode"}, {&s_imm_data, "imm_data"}, {&s_signaled_, "signaled"},
        {&s_solicited_wr, "solicited"}, {&s_pd, "pd"}, {&s_by_lkey, "_by_lkey"}, {&s_view, "view"},
        {&s_bits, "bits"}, {&s_addr, "addr"}, {&s_segs, "segs"}, {&s_wc_opcode_, "wc_opcode"},
        {&s_has_rd_, "has_rd"}, {&s_read_done, "read_done"}, {&s_remote, "remote"}, {&s_qpn, "qpn"},
        {&s_ssn, "ssn"}, {&s_lsn, "lsn"}, {&s_unlimited, "unlimited"}, {&s_cwnd, "cwnd"},
        {&s_sample_at, "sample_at"}, {&s_sample_bytes, "sample_bytes"}, {&s_sample_rate, "sample_rate"},
        {&s_rtt, "rtt"}, {&s_smoothed, "smoothed"}, {&s_variation, "variation"}, {&s_rto_backoff, "rto_backoff"},
        {&s_probed, "probed"}, {&s_probe_deadline, "probe_deadline"}, {&s_packets_out_, "packets_out"},
        {&s_datagrams_out, "datagrams_out"}, {&s_sends, "sends"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].var = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    return 0;
}
