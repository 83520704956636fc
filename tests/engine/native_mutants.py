"""Deliberate bugs in the one-packet paths, for the equivalence proofs' own test: each must be caught.

Two kinds, each a source edit ``(old, new)`` that must apply exactly once:

- ``PY_MUTANTS``: the requester's send path, ``rdmakit/engine/small_tx.py``;
  ``planted_py(name)`` compiles the edited module and puts its ``tx_small`` on
  ``QueuePair`` for the block's duration (this process only).
- ``C_MUTANTS``: the native data plane, ``rdmakit/transport/_fastpath.c`` and the
  armed responder, requester and posting it includes, ``_nativeqp.c`` (with
  ``_nativeread.c``), ``_nativereq.c`` and ``_nativepost.c``;
  ``build_c(name, dest)`` copies the package and its tests into ``dest``,
  builds the edited module there and returns the directory to put first on
  ``PYTHONPATH``; the tests named beside the mutant must then fail in a
  process that imports it (``python -m tests.engine.native_mutants NAME``
  runs one and says whether it was caught).

Each bug is a plausible slip: a check left out, an off-by-one, a field not
updated. None is equivalent: the test fails if one survives.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rdmakit.engine import small_tx
from rdmakit.engine.qp import QueuePair

ROOT = Path(__file__).resolve().parents[2]

#: name -> (old, new) in rdmakit/engine/small_tx.py
PY_MUTANTS: dict[str, tuple[str, str]] = {
    "tx-ignores-window": ("        if window <= d < _HALF:\n            return None\n", ""),
    "tx-ignores-rate": ("            if req.rate.rate is not None:\n", "            if False:\n"),
    "tx-ignores-pacer": ("            if req.pacer.armed:\n", "            if False:\n"),
    "tx-ignores-credits": (
        "        if not req.credits.may_start(wqe.takes_receive, idle):\n",
        "        if False:\n",
    ),
    "tx-no-se": ("ops[3], dqpn, psn, True, wqe.solicited, False,", "ops[3], dqpn, psn, True, False, False,"),
    "tx-long-write": ("            if length > mtu:\n                return None\n", ""),
    "tx-with-responses-queued": ("            or self.resp.out\n", ""),
    "tx-no-read-slot": ("            req.rd_out += 1\n", ""),
    "tx-read-last-psn": ("wqe.last_psn = (psn + step - 1) & _MASK", "wqe.last_psn = psn"),
    "tx-no-ackreq": ("ops[3], dqpn, psn, True,", "ops[3], dqpn, psn, False,"),
    "tx-no-rtt-sample": ("req.rtt_psn, req.rtt_sent = psn, now", "pass"),
    "tx-no-timer": ("req.arm_timer(now)", "pass"),
    "tx-no-rate-accounting": ("req.rate.sent(mtu + PACKET_OVERHEAD, now)", "pass"),
    "tx-hwm-not-moved": ("            req.sent_hwm = nxt\n", "            pass\n"),
}

_SMALL = "tests/engine/test_engine_small_native.py"
_WRITES = "tests/engine/test_engine_armed_writes.py"
_REQ = "tests/engine/test_engine_armed_req.py"
_READS = "tests/engine/test_engine_armed_reads.py"
_ACKS = "tests/transport/test_ack_batch.py"
_POST = "tests/engine/test_engine_native_post.py"
_ONE_PASS = "tests/transport/test_icrc_one_pass.py"
_TAIL = "tests/transport/test_train_tail.py"
_IDS = "tests/transport/test_segment_ids.py"
_WAIT = "tests/transport/test_native_wait.py"
#: name -> ((old, new) in rdmakit/transport/_fastpath.c, the test files that must catch it)
C_MUTANTS: dict[str, tuple[tuple[str, str], tuple[str, ...]]] = {
    "c-request-any-psn": (
        ("(w1 & PSN_MASK) != qpn || (w2 & PSN_MASK) != epsn) {", "(w1 & PSN_MASK) != qpn) {"),
        (_SMALL,),
    ),
    "c-request-no-access-check": (
        ("if (!(access & small_access[which < 2 ? which : 2]) ||", "if ("),
        (_SMALL,),
    ),
    "c-fetch-add-off-by-one": (("orig + swap_add : swap_add", "orig + swap_add + 1 : swap_add"), (_SMALL,)),
    "c-response-any-psn": (("(get_be32(p + 8) & PSN_MASK) != want_psn ||", ""), (_SMALL,)),
    "c-response-nak-as-ack": (("p[BTH_LEN] >> 5 != 0 ||", ""), (_SMALL,)),
    "c-send-drops-ackreq": (
        ("put_be32(h + 8, (flags[0] ? 0x80000000u : 0) | (uint32_t)psn);", "put_be32(h + 8, (uint32_t)psn);"),
        ("tests/transport/test_codec.py",),
    ),
    # The armed responder (_nativeqp.c, part of the same module).
    "c-armed-any-psn": (
        ("(w1 & PSN_MASK) != self->qpn || (w2 & PSN_MASK) != self->psn)", "(w1 & PSN_MASK) != self->qpn)"),
        (_SMALL,),
    ),
    "c-armed-no-access-check": (
        ("    if (!(self->access & small_access[0]))\n        return 0;\n", ""),
        (_SMALL,),
    ),
    "c-armed-region-any-access": (
        (
            "small_region(self->rtable, rkey, va, len, small_access[0], &entry)",
            "small_region(self->rtable, rkey, va, len, ~0ul, &entry)",
        ),
        (_SMALL,),
    ),
    "c-armed-msn-not-moved": (
        ("        self->msn = (self->msn + 1) & PSN_MASK;\n", "        ;\n"),
        (_SMALL,),
    ),
    "c-armed-ack-ignores-ackreq": (
        ("    if (w2 >> 31) {\n        self->ack = 1;", "    if (1) {\n        self->ack = 1;"),
        (_SMALL,),
    ),
    "c-armed-ack-old-msn": (("        self->ack_msn = self->msn;\n", ""), (_SMALL,)),
    "c-armed-drops-held-ack": (("    self->ack = held != Py_None;", "    self->ack = 0;"), (_SMALL,)),
    "c-armed-sent-ack-bad-syndrome": (
        (
            "put_be32(h + BTH_LEN, self->ack_syn << 24 | self->ack_msn);",
            "put_be32(h + BTH_LEN, self->ack_msn);",
        ),
        ("tests/transport/test_armed.py",),
    ),
    # Its WRITEs of many packets (FIRST, MIDDLE, LAST), each caught by the crafted sequences.
    "c-armed-no-op-seq": (("    if (starts == self->in_msg)\n        return 0;\n", ""), (_WRITES,)),
    "c-armed-first-any-length": (
        ("fits = plen == self->mtu && len <= small_max_msg &&", "fits = len <= small_max_msg &&"),
        (_WRITES,),
    ),
    "c-armed-middle-any-length": (
        ("fits = plen == self->mtu && (uint64_t)plen < resid;", "fits = (uint64_t)plen < resid;"),
        (_WRITES,),
    ),
    "c-armed-middle-fills-the-message": (
        (
            "fits = plen == self->mtu && (uint64_t)plen < resid;",
            "fits = plen == self->mtu && (uint64_t)plen <= resid;",
        ),
        (_WRITES,),
    ),
    "c-armed-last-short": (
        (
            "fits = plen > 0 && plen <= self->mtu && (uint64_t)plen == resid;",
            "fits = plen > 0 && plen <= self->mtu;",
        ),
        (_WRITES,),
    ),
    "c-armed-only-any-dma-length": (
        ("fits = plen <= self->mtu && (uint64_t)plen == resid;", "fits = plen <= self->mtu;"),
        (_WRITES,),
    ),
    "c-armed-places-at-the-start": (("t.buf + at + done, p + off", "t.buf + at, p + off"), (_WRITES,)),
    "c-armed-msn-moved-mid-message": (
        ("    if (!self->in_msg)\n        self->msn", "    self->msn"),
        (_WRITES,),
    ),
    "c-armed-last-keeps-the-message": (
        ("self->in_msg = pos == W_FIRST || pos == W_MIDDLE;", "self->in_msg = pos != W_ONLY;"),
        (_WRITES,),
    ),
    "c-armed-disarm-loses-the-view": (("self->in_msg && self->w_mem != NULL", "0"), (_WRITES,)),
    # The armed responder's READs (_nativeread.c).
    "c-read-any-psn": (("dqp != self->qpn || psn != self->psn)", "dqp != self->qpn)"), (_READS,)),
    "c-read-no-access-check": (
        ("if (self->in_msg || !(self->access & small_access[1]))", "if (self->in_msg)"),
        (_READS,),
    ),
    "c-read-region-any-access": (
        (
            "small_region(self->rtable, rkey, va, len, small_access[1], &entry)",
            "small_region(self->rtable, rkey, va, len, small_access[0] | small_access[1], &entry)",
        ),
        (_READS,),
    ),
    "c-read-msn-not-moved": (
        (
            "    self->msn = (self->msn + 1) & PSN_MASK;\n    self->psn = (uint32_t)(psn + npkts)",
            "    self->psn = (uint32_t)(psn + npkts)",
        ),
        (_READS,),
    ),
    "c-read-psn-one-step": (
        ("self->psn = (uint32_t)(psn + npkts) & PSN_MASK;", "self->psn = (psn + 1) & PSN_MASK;"),
        (_READS,),
    ),
    "c-read-resource-one-psn": (
        ("uint32_t last = (uint32_t)(psn + npkts - 1) & PSN_MASK;", "uint32_t last = psn;"),
        (_READS,),
    ),
    "c-read-middle-with-aeth": (("    *aeth = op != rd_ops[2];", "    *aeth = 1;"), (_READS,)),
    "c-read-sent-without-pad": (("        h[1] = (unsigned char)(pad << 4);\n", ""), (_READS,)),
    "c-read-sent-icrc-skips-payload": (
        ("        if (size)\n            c = crc32_update(c, pl, (size_t)size);\n", ""),
        (_READS,),
    ),
    "c-read-overtakes-held-responses": (
        ("!codec_ready || self->rd_live)", "!codec_ready)"),
        (_READS,),
    ),
    "c-read-handback-drops-responses": (
        ("} else if (self->rd_live) {\n        PyObject *view", "} else if (0) {\n        PyObject *view"),
        (_READS,),
    ),
    "c-armed-write-ack-psn-not-kept": (
        ("    self->ack_base = self->psn, self->rd_acked = 1;\n", ""),
        (_READS,),
    ),
    "c-atomic-ack-psn-not-kept": (
        ("self->rd_acked = 1, self->ack_base = self->psn;", "self->rd_acked = 1;"),
        (_READS,),
    ),
    "c-atomic-no-align-check": (
        ("(uint64_t)t.len < (uint64_t)at + 8 || (va & 7))", "(uint64_t)t.len < (uint64_t)at + 8)"),
        (_SMALL,),
    ),
    "c-atomic-swap-ignores-compare": (
        ("if (p[0] == small_ops[3] || orig == compare) {", "if (1) {"),
        (_READS,),
    ),
    "c-atomic-fetch-add-off-by-one": (
        ("swap_add + (p[0] == small_ops[3] ? orig : 0)", "swap_add + (p[0] == small_ops[3] ? orig + 1 : 0)"),
        (_READS,),
    ),
    "c-atomic-ack-wrong-orig": (
        ("    self->rd_orig = orig;\n", "    self->rd_orig = orig + 1;\n"),
        (_READS,),
    ),
    "c-atomic-handback-as-read": (
        ("    if (self->rd_live && self->rd_atomic) {\n        Py_SETREF", "    if (0) {\n        Py_SETREF"),
        (_READS,),
    ),
    "c-atomic-no-access-check": (
        ("if (self->in_msg || !(self->access & small_access[2]))", "if (self->in_msg)"),
        (_SMALL,),
    ),
    # The device poll for a kernel sender's source (its own IPv4 IDs, followed).
    "c-poll-kernel-id-not-followed": (
        (
            'PyObject *r = PyObject_CallMethod(a->ids, "accept", "Od", nxt,',
            "PyObject *r = Py_NewRef(Py_None); (void)(nxt,",
        ),
        ("tests/transport/test_faults.py",),
    ),
    "c-poll-kernel-with-our-id": (
        (
            "done = armed_rx_core(a, p, n, ident, a->states, a->flow);",
            "done = armed_rx_core(a, p, n, 0, a->states, a->flow);",
        ),
        ("tests/transport/test_faults.py",),
    ),
    "c-poll-no-wake": (
        ("int bad = key == NULL || PyDict_SetItem(active, key, a->qp) < 0;", "int bad = key == NULL;"),
        ("tests/transport/test_armed.py",),
    ),
    # The device poll loop (_nativeloop.c, part of the same module).
    "c-loop-ack-kept": (
        (": armed_send_ack_to(a, lp->fd, &ss, sl, states, flow);", ": 0;"),
        (_WAIT,),
    ),
    "c-loop-ack-uncounted": (("        if (r >= 0)\n            lp->sent++;\n", ""), (_WAIT,)),
    "c-loop-completer-log-kept": (
        ("raw != Py_None || PyList_GET_SIZE(p->touched) ||", "raw != Py_None ||"),
        (_WAIT,),
    ),
    "c-loop-raw-dropped": (("if (raw != Py_None || PyList_GET_SIZE", "if (0 || PyList_GET_SIZE"), (_WAIT,)),
    # (Not a mutant: dropping the wait's own ``now >= deadline`` check is equivalent while the
    # driver's timerfd, in the same epoll set, is armed for that deadline, as progress() arms it.)
    # The armed requester's completer (_nativereq.c, part of the same module).
    "c-req-nak-as-ack": (
        ("(w1 & PSN_MASK) != self->qpn || p[BTH_LEN] >> 5 != 0)", "(w1 & PSN_MASK) != self->qpn)"),
        (_REQ,),
    ),
    "c-req-any-qpn": (("(w1 & PSN_MASK) != self->qpn || p[BTH_LEN]", "p[BTH_LEN]"), (_REQ,)),
    "c-req-inside-a-wqe": (("        if (last == psn)\n            break;", "        break;"), (_REQ,)),
    "c-req-no-icrc": (
        (
            "    int icrc = icrc_matches(p, n, idx, states, flow);\n    if (icrc <= 0) {\n"
            "        Py_DECREF(entries);",
            "    int icrc = 1;\n    if (icrc <= 0) {\n        Py_DECREF(entries);",
        ),
        (_REQ,),
    ),
    "c-req-cq-overrun": (("    if (held + signaled > depth) {", "    if (0) {"), (_REQ,)),
    "c-req-next-idx-kept": (("PyLong_FromLong(next_idx - (long)k)", "PyLong_FromLong(next_idx)"), (_REQ,)),
    "c-req-comp-off-by-one": (
        ("PyLong_FromUnsignedLong((lasts[i] + 1) & PSN_MASK)", "PyLong_FromUnsignedLong(lasts[i])"),
        (_REQ,),
    ),
    "c-req-unsignaled-completes": (("        if (sig[i]) {", "        if (1) {"), (_REQ,)),
    "c-req-wrong-byte-len": (
        (
            "PyObject *argv[5] = {wr_id, self->success, wc_op, length, qpn};",
            "PyObject *argv[5] = {wr_id, self->success, wc_op, qpn, qpn};",
        ),
        (_REQ,),
    ),
    "c-req-local-error-behind": (
        ("        if (status) {\n            result = 0;", "        if (0) {\n            result = 0;"),
        (_REQ,),
    ),
    "c-req-poll-no-handover": (
        (
            "PyDict_SetItem(active, key, r->qp) < 0 || PyList_Append(touched, r->qp) < 0;",
            "PyDict_SetItem(active, key, r->qp) < 0;",
        ),
        ("tests/transport/test_armed.py",),
    ),
    # send_acks (_nativeqp_ack.c): an ACK sent stays held; the first owner of a batch is left out.
    "c-acks-stay-held": (
        ("            batch[k]->ack = 0;\n        }\n        sent += n;", "        }\n        sent += n;"),
        (_ACKS,),
    ),
    "c-acks-skip-first": (
        ("            batch[n++] = a;", "            batch[n > 0 ? n++ : 0] = a;"),
        (_ACKS,),
    ),
    "c-acks-id-zero": (
        (
            "int64_t st = icrc_state(states, flow, SIZE, n);",
            "int64_t st = icrc_state(states, flow, SIZE, 0);",
        ),
        (_ACKS,),
    ),
    "c-post-no-ackreq": (
        (
            "put_bth(h, (int)op, (uint32_t)dqpn, (uint32_t)psn, 1, 0);",
            "put_bth(h, (int)op, (uint32_t)dqpn, (uint32_t)psn, 0, 0);",
        ),
        (_POST,),
    ),
    "c-post-no-se": (
        ("h[1] = (unsigned char)((se ? 0x80 : 0) | padcnt[plen & 3]);", "h[1] = padcnt[plen & 3];"),
        (_POST,),
    ),
    "c-post-imm-lost": (("        put_be32(p, (uint32_t)immv);", "        put_be32(p, 0);"), (_POST,)),
    "c-post-no-rtt-sample": (
        ("if (none < 0 || (none && (set_steal", "if (none < 0 || (0 && (set_steal"),
        (_POST,),
    ),
    "c-post-no-timer": (("    if (no_timer && !no_timeout) {", "    if (0) {"), (_POST,)),
    "c-post-hwm-not-moved": (
        ("< REQ_HALF && set_steal(req, s_sent_hwm,", "> PSN_MASK && set_steal(req, s_sent_hwm,"),
        (_POST,),
    ),
    "c-post-no-rate-accounting": (("    if (!bad && cc_on) {", "    if (!bad && 0) {"), (_POST,)),
    "c-post-psn-not-advanced": (
        (
            "set_steal(req, s_req_psn, PyLong_FromUnsignedLong(nxt)) < 0",
            "set_steal(req, s_req_psn, PyLong_FromUnsignedLong(psn)) < 0",
        ),
        (_POST,),
    ),
    # place_run's one-pass ICRC check: anything with resv8a 0 taken; the resv8a mask forgotten.
    "c-place-one-pass-takes-any": (
        (
            "    return !s[4] && (~crc32_update(state, s, (size_t)size) ^ fix) == crc_residue;",
            "    return !s[4];",
        ),
        (_ONE_PASS, _IDS),
    ),
    # send_train's tail: counted but not sent; sent in the first batch, not the last.
    "c-train-tail-not-sent": (("            msg.msg_iovlen++;\n", ""), (_TAIL,)),
    "c-train-tail-first-batch": (
        ("        if (tail && sent + n == count) {", "        if (tail && sent == 0) {"),
        (_TAIL,),
    ),
    "c-place-one-pass-no-mask": (
        (
            "(~crc32_update(state, s, (size_t)size) ^ fix) == crc_residue",
            "~crc32_update(state, s, (size_t)size) == crc_residue",
        ),
        (_ONE_PASS,),
    ),
    "c-postsend-past-the-region": (
        (
            "if (!(mra <= addr && (unsigned __int128)addr + len",
            "if (0 && !(mra <= addr && (unsigned __int128)addr + len",
        ),
        (_POST,),
    ),
    "c-postsend-queue-overfull": (
        ("if (have < 0 || have >= max_wr)", "if (have < 0 || have > max_wr)"),
        (_POST,),
    ),
    "c-postsend-imm-unchecked": (
        ("t = get_uint(imm, 0xFFFFFFFFu, &u);", "t = get_uint(imm, UINT64_MAX, &u);"),
        (_POST,),
    ),
    "c-postsend-ignores-credits": (
        ("    if (limited && takes && d != 0) {", "    if (0 && limited && takes && d != 0) {"),
        (_POST,),
    ),
    "c-postsend-credit-not-counted": (
        ("if (set_steal(credits, s_ssn, PyLong_FromUnsignedLong(nssn)) < 0 ||", "if ("),
        (_POST,),
    ),
    "c-postsend-no-probe": (("            probe = pto < timer;", "            probe = 0;"), (_POST,)),
    "c-postsend-rto-no-floor": (
        ("double early = (k[TK_MIN_RTO] > rto ? k[TK_MIN_RTO] : rto) * mult;", "double early = rto * mult;"),
        (_POST,),
    ),
    "c-postsend-solicited-kept": (
        ("!st ? sol : takes ? Py_True : Py_False)", "!st ? sol : Py_True)"),
        (_POST,),
    ),
    "c-postsend-no-sample-bytes": (
        ("bad = set_steal(rate, s_sample_bytes, PyLong_FromLong(sb)) < 0;", "bad = 0;"),
        (_POST,),
    ),
    "c-postsend-wrong-view": (
        ("(Py_ssize_t)(addr - mra), (Py_ssize_t)(addr - mra + len));", "0, (Py_ssize_t)len);"),
        (_POST,),
    ),
}
#: The C sources a mutant may edit (its text must occur exactly once in them all).
C_SOURCES = (
    "rdmakit/transport/_fastpath.c",
    "rdmakit/transport/_nativeqp.c",
    "rdmakit/transport/_nativeqp_ack.c",
    "rdmakit/transport/_nativereq.c",
    "rdmakit/transport/_nativeread.c",
    "rdmakit/transport/_nativepost.c",
    "rdmakit/transport/_nativeloop.c",
    "rdmakit/transport/_nativepostsend.c",
    "rdmakit/transport/_nativepoll.c",
)


def _edit(text: str, old: str, new: str, what: str) -> str:
    n = text.count(old)
    if n != 1:
        raise AssertionError(f"{what}: the mutant's text occurs {n} times, not once: {old!r}")
    return text.replace(old, new)


@contextmanager
def planted_py(name: str) -> Iterator[None]:
    """``QueuePair.tx_small`` is mutant ``name``'s while the block runs."""
    old, new = PY_MUTANTS[name]
    path = Path(small_tx.__file__)
    src = _edit(path.read_text(), old, new, name)
    mod = types.ModuleType(f"rdmakit.engine._mutant_{name.replace('-', '_')}")
    mod.__package__ = "rdmakit.engine"
    exec(compile(src, f"{path} ({name})", "exec"), mod.__dict__)
    orig = QueuePair.tx_small
    QueuePair.tx_small = mod.SmallTransmit.tx_small  # type: ignore[method-assign]
    try:
        yield
    finally:
        QueuePair.tx_small = orig  # type: ignore[method-assign]


def build_c(name: str, dest: Path, cc: str = "gcc") -> Path:
    """A copy of the package and tests in ``dest`` with mutant ``name``'s native module built in."""
    (old, new), _ = C_MUTANTS[name]
    for part in ("rdmakit", "tests"):
        skip = shutil.ignore_patterns("__pycache__", "_fastpath*.so")
        shutil.copytree(ROOT / part, dest / part, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    hits = [dest / src for src in C_SOURCES if old in (dest / src).read_text()]
    if len(hits) != 1:
        raise AssertionError(f"{name}: the mutant's text is in {len(hits)} sources, not one: {old!r}")
    hits[0].write_text(_edit(hits[0].read_text(), old, new, name))
    c = dest / "rdmakit/transport/_fastpath.c"
    include = sysconfig.get_paths()["include"]
    out = dest / f"rdmakit/transport/_fastpath{sysconfig.get_config_var('EXT_SUFFIX')}"
    flags = ["-shared", "-fPIC", "-O2", "-std=gnu11", "-fno-strict-aliasing", f"-I{include}"]
    subprocess.run([cc, *flags, str(c), "-o", str(out)], check=True)
    return dest


def caught_c(name: str, dest: Path) -> bool:
    """Build mutant ``name`` in ``dest`` and run its tests there: True if they fail."""
    root = build_c(name, dest)
    tests = C_MUTANTS[name][1]
    env = {k: v for k, v in os.environ.items() if k != "RDMAKIT_PURE_PYTHON"}
    env["PYTHONPATH"] = str(root)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *tests],
        check=False,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode not in (0, 1):
        raise AssertionError(f"{name}: pytest exited {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.returncode == 1


def main(argv: list[str]) -> int:
    names = argv or list(C_MUTANTS)
    survived = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="rdmakit-mutant-") as tmp:
            ok = caught_c(name, Path(tmp))
        print(f"{name}: {'caught' if ok else 'SURVIVED'}", flush=True)
        if not ok:
            survived.append(name)
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
