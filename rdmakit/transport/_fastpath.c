/*
 * rdmakit.transport._fastpath: the native data plane of the UDP soft device.
 *
 * Optional (loaded by rdmakit/transport/fastpath.py): what every function here
 * does, the pure-Python path of rdmakit/transport/device.py and rdmakit.wire
 * does too, and is the reference; the tests run both and compare. What is
 * here is only what costs per packet: moving a message in MTU-sized MIDDLE
 * packets, and the codec, ICRC and system call of the single packets of a
 * small operation's round trip:
 *
 *   crc32(data, value=0)       zlib's CRC-32 (PCLMULQDQ folding on x86-64);
 *   send_train(...)            build the BTH and ICRC of a run of MIDDLE
 *                              packets and send them with UDP GSO (sendmsg with
 *                              an iovec per header, payload and ICRC: the payload
 *                              is never copied in user space);
 *   place_run(...)             check a run of received MIDDLE segments (opcode,
 *                              P_Key, TVer, pad, QPN, PSN, length, ICRC) and copy
 *                              their payloads into the target memory, stopping at
 *                              the first segment that needs the general path;
 *   send_packet(...)           encode one packet (any RC opcode), add its ICRC
 *                              and send it: one call for what a small
 *                              operation's round trip sends;
 *   check_decode(...)          check one received segment's ICRC and decode it
 *                              into a Packet, or say why the Python path must;
 *   recv_raw(...)              one non-blocking read of the socket (GRO segment
 *                              size and source included), None when empty;
 *   small_request(...)         check and execute an in-order one-packet WRITE,
 *                              READ or atomic request for the responder, or
 *                              hand it back to the generic path;
 *   small_response(...)        check the ACK, READ RESPONSE ONLY or ATOMIC ACK
 *                              that completes the head of the send queue and
 *                              place its data, or hand it back.
 *
 * The ICRC (IBTA Annex A17.3.3) of a segment is continued from a CRC state the
 * caller computed over the masked pseudo IP/UDP headers of that segment (which
 * depend on the segment's length and its IPv4 ID, i.e. its index in a GSO
 * batch), then over the BTH with byte 4 set to 0xFF, then over the payload.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

#define BTH_LEN 12
#define ICRC_LEN 4
#define GSO_MAX_SEGMENTS 64
#define GSO_MAX_BYTES 65507
#define PSN_MASK 0xFFFFFFu
/* The most a UDP datagram carries over IPv4 (65535 - 20 - 8); segment and
 * MTU sizes beyond it are refused, which also keeps every size sum below
 * bounded by a few times 64 KiB. */
#define UDP_MAX_PAYLOAD 65507

/* -- CRC-32 (reflected 0xEDB88320, zlib's convention) ----------------------------------- */

static uint32_t crc_table[8][256];

static void crc_init_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][n] = c;
        }
    }
}

/* The raw (pre-inverted) state over len bytes, slicing by 8, then by 4 (unaligned loads:
 * the per-segment BTH's 12 bytes are one step of each, whatever their alignment). */
static uint32_t crc_raw_table(uint32_t c, const unsigned char *p, size_t len) {
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;  /* little-endian hosts only: see crc_usable */
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    if (len >= 4) {
        uint32_t lo;
        memcpy(&lo, p, 4);
        lo ^= c;
        c = crc_table[3][lo & 0xFF] ^ crc_table[2][(lo >> 8) & 0xFF] ^ crc_table[1][(lo >> 16) & 0xFF] ^
            crc_table[0][lo >> 24];
        p += 4;
        len -= 4;
    }
    while (len--)
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
static int have_clmul;

/*
 * The end of both foldings: fold the remaining 16-byte blocks into x1 (len a
 * multiple of 16), then reduce 128 -> 64 -> 32 bits (Barrett).
 */
__attribute__((target("pclmul,sse4.1"))) static inline uint32_t crc_fold_tail(__m128i x1, const unsigned char *buf,
                                                                               size_t len) {
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    __m128i x2, x3, x5;
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, k5k0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/*
 * Folding with carry-less multiplication ("Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction", Intel, 2009), with the constants
 * for the bit-reflected CRC-32 polynomial. len >= 64 and a multiple of 16; c is
 * the raw state.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_raw_clmul(uint32_t c, const unsigned char *buf,
                                                                        size_t len) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)c));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }
    /* Fold the four lanes into one. */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    return crc_fold_tail(x1, buf, len);
}

static int have_vclmul;

/*
 * The same folding, 256 bits at a time (VPCLMULQDQ on AVX2 registers): four
 * registers hold eight 128-bit lanes, each folded 1024 bits forward per
 * 128-byte block (constants x^(1024+32) and x^(1024-32) mod P, reflected as
 * k1..k5 above); the lanes are then folded into one and finished as above.
 * len >= 256 and a multiple of 16; c is the raw state.
 */
__attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1"))) static uint32_t crc_raw_vclmul(uint32_t c,
                                                                                       const unsigned char *buf,
                                                                                       size_t len) {
    const __m256i k = _mm256_set_epi64x(0x014a7fe880LL, 0x01e88ef372LL, 0x014a7fe880LL, 0x01e88ef372LL);
    __m256i y0 = _mm256_loadu_si256((const __m256i *)(buf + 0x00));
    __m256i y1 = _mm256_loadu_si256((const __m256i *)(buf + 0x20));
    __m256i y2 = _mm256_loadu_si256((const __m256i *)(buf + 0x40));
    __m256i y3 = _mm256_loadu_si256((const __m256i *)(buf + 0x60));
    y0 = _mm256_xor_si256(y0, _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, (int)c));
    buf += 128;
    len -= 128;
    while (len >= 128) {
        __m256i t0 = _mm256_clmulepi64_epi128(y0, k, 0x00);
        __m256i t1 = _mm256_clmulepi64_epi128(y1, k, 0x00);
        __m256i t2 = _mm256_clmulepi64_epi128(y2, k, 0x00);
        __m256i t3 = _mm256_clmulepi64_epi128(y3, k, 0x00);
        y0 = _mm256_clmulepi64_epi128(y0, k, 0x11);
        y1 = _mm256_clmulepi64_epi128(y1, k, 0x11);
        y2 = _mm256_clmulepi64_epi128(y2, k, 0x11);
        y3 = _mm256_clmulepi64_epi128(y3, k, 0x11);
        y0 = _mm256_xor_si256(_mm256_xor_si256(y0, t0), _mm256_loadu_si256((const __m256i *)(buf + 0x00)));
        y1 = _mm256_xor_si256(_mm256_xor_si256(y1, t1), _mm256_loadu_si256((const __m256i *)(buf + 0x20)));
        y2 = _mm256_xor_si256(_mm256_xor_si256(y2, t2), _mm256_loadu_si256((const __m256i *)(buf + 0x40)));
        y3 = _mm256_xor_si256(_mm256_xor_si256(y3, t3), _mm256_loadu_si256((const __m256i *)(buf + 0x60)));
        buf += 128;
        len -= 128;
    }
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    __m128i lanes[8] = {
        _mm256_castsi256_si128(y0), _mm256_extracti128_si256(y0, 1), _mm256_castsi256_si128(y1),
        _mm256_extracti128_si256(y1, 1), _mm256_castsi256_si128(y2), _mm256_extracti128_si256(y2, 1),
        _mm256_castsi256_si128(y3), _mm256_extracti128_si256(y3, 1),
    };
    __m128i x1 = lanes[0], x5;
    for (int i = 1; i < 8; i++) {
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, lanes[i]), x5);
    }
    return crc_fold_tail(x1, buf, len);
}
#endif

/* zlib's crc32(): value is the CRC so far (0 to start). */
static uint32_t crc32_update(uint32_t value, const unsigned char *p, size_t len) {
    uint32_t c = ~value;
#if defined(__x86_64__)
    if (have_vclmul && len >= 256) {
        size_t chunk = len & ~(size_t)15;
        c = crc_raw_vclmul(c, p, chunk);
        p += chunk;
        len -= chunk;
    } else if (have_clmul && len >= 64) {
        size_t chunk = len & ~(size_t)15;
        c = crc_raw_clmul(c, p, chunk);
        p += chunk;
        len -= chunk;
    }
#endif
    c = crc_raw_table(c, p, len);
    return ~c;
}

/* -- helpers ---------------------------------------------------------------------------- */

static int parse_addr(PyObject *addr, int v6, struct sockaddr_storage *ss, socklen_t *sl) {
    const char *host;
    int port;
    if (!PyTuple_Check(addr)) {
        PyErr_SetString(PyExc_TypeError, "an address is a (host, port) tuple");
        return -1;
    }
    if (!PyArg_ParseTuple(addr, "si", &host, &port))
        return -1;
    if (port < 0 || port > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "port %d is not a u16", port);
        return -1;
    }
    memset(ss, 0, sizeof *ss);
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1) {
            PyErr_Format(PyExc_ValueError, "not an IPv6 address: %s", host);
            return -1;
        }
        *sl = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1) {
            PyErr_Format(PyExc_ValueError, "not an IPv4 address: %s", host);
            return -1;
        }
        *sl = sizeof *a;
    }
    return 0;
}

static void put_bth(unsigned char *h, int op, uint32_t dqpn, uint32_t psn, int ackreq, int byte4) {
    h[0] = (unsigned char)op;
    h[1] = 0;  /* SE 0, M 0, pad 0, TVer 0 */
    h[2] = 0xFF;
    h[3] = 0xFF;  /* default P_Key */
    h[4] = (unsigned char)byte4;
    h[5] = (unsigned char)(dqpn >> 16);
    h[6] = (unsigned char)(dqpn >> 8);
    h[7] = (unsigned char)dqpn;
    h[8] = ackreq ? 0x80 : 0;
    h[9] = (unsigned char)(psn >> 16);
    h[10] = (unsigned char)(psn >> 8);
    h[11] = (unsigned char)psn;
}

static void put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* A uint32 in native order at any alignment (the states buffers come from Python). */
static uint32_t get_ne32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint32_t get_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* -- crc32 ------------------------------------------------------------------------------ */

static PyObject *fp_crc32(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer b;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k:crc32", &b, &value))
        return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS
    c = crc32_update((uint32_t)value, b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* -- send_train ------------------------------------------------------------------------- */

/*
 * send_train(fd, addr, v6, gso, op, dqpn, psn, count, payload, mtu, ack_first, ack_every,
 *            states[, tail]) -> (sent, errno)
 *
 * Packet i (0 <= i < count) is opcode op to dqpn with PSN psn + i, AckReq when
 * i >= ack_first >= 0 and (i - ack_first) % ack_every == 0, and the payload
 * bytes [i*mtu, (i+1)*mtu). They leave in GSO batches of up to
 * min(64, 65507 // size) segments (one per sendmsg without GSO); segment k of a
 * batch takes the ICRC state states[k] (uint32, native order). Returns how many
 * packets the kernel took and the errno that stopped it (0 if none).
 *
 * tail: one more datagram of the same size (the message's LAST, ICRC included,
 * computed by the caller for segment count % per), sent as the last segment of
 * the last batch and counted in sent; GSO only, and only where that batch has
 * room (count % per != 0). It saves the LAST its own send and its own read.
 */
static PyObject *fp_send_train(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd, v6, gso, op, ack_first, ack_every;
    Py_ssize_t dqpn, psn;
    Py_ssize_t count, mtu;
    PyObject *addr;
    Py_buffer pl, st, tl = {0};
    if (!PyArg_ParseTuple(args, "iOppinnny*niiy*|y*:send_train", &fd, &addr, &v6, &gso, &op, &dqpn, &psn,
                          &count, &pl, &mtu, &ack_first, &ack_every, &st, &tl))
        return NULL;
    PyObject *result = NULL;
    struct sockaddr_storage ss;
    socklen_t sl;
    if (parse_addr(addr, v6, &ss, &sl) < 0)
        goto out;
    if (op < 0 || op > 0xFF || dqpn < 0 || dqpn > (Py_ssize_t)PSN_MASK || psn < 0 || psn > (Py_ssize_t)PSN_MASK) {
        PyErr_SetString(PyExc_ValueError, "send_train: opcode, QPN or PSN out of range");
        goto out;
    }
    /* count <= pl.len / mtu is count * mtu <= pl.len without the product (which could overflow). */
    if (mtu <= 0 || (mtu & 3) || mtu > UDP_MAX_PAYLOAD - BTH_LEN - ICRC_LEN || count < 0 || count > pl.len / mtu ||
        ack_every <= 0) {
        PyErr_SetString(PyExc_ValueError, "send_train: bad sizes");
        goto out;
    }
    Py_ssize_t size = BTH_LEN + mtu + ICRC_LEN;
    Py_ssize_t per = 1;
    if (gso) {
        per = GSO_MAX_BYTES / size;
        if (per > GSO_MAX_SEGMENTS)
            per = GSO_MAX_SEGMENTS;
        if (per < 1)
            per = 1;
    }
    Py_ssize_t nstates = st.len / 4;
    if (nstates < (count < per ? count : per)) {
        PyErr_SetString(PyExc_ValueError, "send_train: too few ICRC states");
        goto out;
    }
    int tail = tl.obj != NULL;
    if (tail && (!gso || tl.len != size || count % per == 0)) {
        PyErr_SetString(PyExc_ValueError, "send_train: the tail does not fit the last batch");
        goto out;
    }
    const unsigned char *states = st.buf;
    const unsigned char *src = pl.buf;
    unsigned char hdrs[GSO_MAX_SEGMENTS][BTH_LEN];
    unsigned char icrcs[GSO_MAX_SEGMENTS][ICRC_LEN];
    struct iovec iov[GSO_MAX_SEGMENTS * 3 + 1];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } ctrl;
    Py_ssize_t sent = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (sent < count) {
        Py_ssize_t n = count - sent < per ? count - sent : per;
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t i = sent + k;
            uint32_t p = (uint32_t)((psn + (unsigned long)i) & PSN_MASK);
            int ackreq = ack_first >= 0 && i >= ack_first && (i - ack_first) % ack_every == 0;
            const unsigned char *body = src + i * mtu;
            put_bth(hdrs[k], op, (uint32_t)dqpn, p, ackreq, 0xFF);  /* masked for the ICRC */
            uint32_t c = crc32_update(get_ne32(states + 4 * k), hdrs[k], BTH_LEN);
            c = crc32_update(c, body, (size_t)mtu);
            hdrs[k][4] = 0;
            put_le32(icrcs[k], c);
            iov[3 * k].iov_base = hdrs[k];
            iov[3 * k].iov_len = BTH_LEN;
            iov[3 * k + 1].iov_base = (void *)body;
            iov[3 * k + 1].iov_len = (size_t)mtu;
            iov[3 * k + 2].iov_base = icrcs[k];
            iov[3 * k + 2].iov_len = ICRC_LEN;
        }
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_name = &ss;
        msg.msg_namelen = sl;
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)(3 * n);
        Py_ssize_t took = n;
        if (tail && sent + n == count) {
            iov[3 * n].iov_base = tl.buf;
            iov[3 * n].iov_len = (size_t)size;
            msg.msg_iovlen++;
            took++;
        }
        if (gso && took > 1) {
            memset(&ctrl, 0, sizeof ctrl);
            msg.msg_control = ctrl.buf;
            msg.msg_controllen = sizeof ctrl.buf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            cm->cmsg_level = SOL_UDP;
            cm->cmsg_type = UDP_SEGMENT;
            cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t segsz = (uint16_t)size;
            memcpy(CMSG_DATA(cm), &segsz, sizeof segsz);
        }
        ssize_t r;
        do {
            r = sendmsg(fd, &msg, 0);
        } while (r < 0 && errno == EINTR);
        if (r < 0) {
            err = errno;
            break;
        }
        sent += took;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("ni", sent, err);
out:
    PyBuffer_Release(&pl);
    PyBuffer_Release(&st);
    if (tl.obj != NULL)
        PyBuffer_Release(&tl);
    return result;
}

/* -- place_run -------------------------------------------------------------------------- */

/*
 * place_run(buf, nbytes, seg, k0, states, op, qpn, psn, mtu, dst, dst_off, max_count[, shifts])
 *     -> (count, last_ackreq)
 *
 * buf[:nbytes] holds received segments of seg bytes each (a GRO batch; the last
 * may be shorter); segment k starts at k * seg. Starting at segment k0, accept
 * segments while each is a MIDDLE of opcode op with TVer 0, no pad, a valid
 * P_Key, destination qpn, PSN psn + i, exactly BTH + mtu + ICRC bytes, and an
 * ICRC that matches when continued from states[k] (k: the index in the batch) or
 * differs from that by one of shifts[1:] (optional: IcrcFlow.id_shifts); copy each payload to dst[dst_off + i*mtu]. At most max_count. Returns how many
 * were accepted and the index of the last accepted one that asked for an ACK
 * (-1 if none). Nothing is written for a segment that is not accepted.
 */
/* 1 if diff is one of shifts[1:] (IcrcFlow.id_shifts: the segment carried another IPv4 ID
 * below SEGMENT_IDS, its batch split or merged on the way); a nonzero diff is checked. */
static int other_ident(const unsigned char *shifts, Py_ssize_t nshifts, uint32_t diff) {
    for (Py_ssize_t d = 1; d < nshifts; d++)
        if (get_ne32(shifts + 4 * d) == diff)
            return 1;
    return 0;
}

/*
 * One pass over a whole segment instead of the BTH's 12 bytes by table and the payload by
 * folding: the raw CRC register is linear in (state, data), so over the segment as received
 * (resv8a 0), ICRC included, it is the register over the masked segment (resv8a 0xFF, Annex
 * A17.3.3) XOR mask_fix(size), the register of 0xFF at byte 4 and zeros after. A segment's
 * ICRC checks exactly when the register over it and its ICRC (little-endian) is CRC_RESIDUE,
 * the register of four 0xFF bytes from zero, whatever the state before: appending a register
 * clears it, and the ICRC is the register inverted. BTH + MTU + ICRC is a multiple of 16 for
 * every IBTA MTU, so the folding takes all of it.
 */
static uint32_t crc_residue;

/* The register over 0xFF at byte 4 of size zero bytes (size > 4), from zero. */
static uint32_t mask_fix(Py_ssize_t size) {
    static const unsigned char zeros[256];
    static const unsigned char head[5] = {0, 0, 0, 0, 0xFF};
    uint32_t c = crc_raw_table(0, head, sizeof head);
    for (Py_ssize_t rest = size - (Py_ssize_t)sizeof head; rest > 0; rest -= (Py_ssize_t)sizeof zeros)
        c = crc_raw_table(c, zeros, rest < (Py_ssize_t)sizeof zeros ? (size_t)rest : sizeof zeros);
    return c;
}

/* 1 if segment s (size bytes, ICRC last) checks continued from state in one pass, resv8a 0. */
static inline int icrc_one_pass(uint32_t state, const unsigned char *s, Py_ssize_t size, uint32_t fix) {
    return !s[4] && (~crc32_update(state, s, (size_t)size) ^ fix) == crc_residue;
}

/*
 * icrc_one_pass(state, segment) -> bool
 *
 * Whether place_run's one-pass check takes segment (BTH first, ICRC last) as checking when
 * continued from state (an IcrcFlow state, the zlib CRC so far); False says nothing more:
 * place_run then checks it the long way.
 */
static PyObject *fp_icrc_one_pass(PyObject *Py_UNUSED(self), PyObject *args) {
    unsigned long state;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "ky*:icrc_one_pass", &state, &b))
        return NULL;
    int ok = b.len > BTH_LEN + ICRC_LEN && state <= 0xFFFFFFFFUL &&
             icrc_one_pass((uint32_t)state, b.buf, b.len, mask_fix(b.len));
    PyBuffer_Release(&b);
    return PyBool_FromLong(ok);
}

/* The checks and copies of place_run; no Python objects (runs without the GIL). fix is
 * mask_fix(BTH + mtu + ICRC). */
static Py_ssize_t place_core(const unsigned char *base, Py_ssize_t nbytes, Py_ssize_t seg, Py_ssize_t k0,
                             const unsigned char *states, Py_ssize_t nstates, const unsigned char *shifts,
                             Py_ssize_t nshifts, int op, unsigned long qpn,
                             unsigned long psn, Py_ssize_t mtu, unsigned char *out, Py_ssize_t out_len,
                             Py_ssize_t dst_off, Py_ssize_t max_count, uint32_t fix, Py_ssize_t *last_ack) {
    Py_ssize_t size = BTH_LEN + mtu + ICRC_LEN;
    Py_ssize_t count = 0;
    for (Py_ssize_t k = k0; count < max_count; k++, count++) {
        /* k * seg < nbytes, tested without the product (which could overflow) */
        if (nbytes <= 0 || k > (nbytes - 1) / seg || k >= nstates)
            break;
        Py_ssize_t off = k * seg;
        Py_ssize_t len = nbytes - off < seg ? nbytes - off : seg;
        if (len != size)
            break;
        const unsigned char *s = base + off;
        uint32_t p = (uint32_t)((psn + (unsigned long)count) & PSN_MASK);
        if (s[0] != op || (s[1] & 0x3F) || (s[3] != 0xFF) || (s[2] & 0x7F) != 0x7F)
            break;
        if (((uint32_t)s[5] << 16 | (uint32_t)s[6] << 8 | s[7]) != qpn)
            break;
        if (((uint32_t)s[9] << 16 | (uint32_t)s[10] << 8 | s[11]) != p)
            break;
        Py_ssize_t at = dst_off + count * mtu;
        if (at + mtu > out_len)
            break;
        if (!icrc_one_pass(get_ne32(states + 4 * k), s, size, fix)) {
            /* resv8a set, or not the ICRC of IPv4 ID k: which ID it was, if any */
            unsigned char masked[BTH_LEN];
            memcpy(masked, s, BTH_LEN);
            masked[4] = 0xFF;
            uint32_t c = crc32_update(get_ne32(states + 4 * k), masked, BTH_LEN);
            c = crc32_update(c, s + BTH_LEN, (size_t)mtu) ^ get_le32(s + BTH_LEN + mtu);
            if (c && !other_ident(shifts, nshifts, c))
                break;
        }
        memmove(out + at, s + BTH_LEN, (size_t)mtu); /* out may be the buffer itself */
        if (s[8] & 0x80)
            *last_ack = count;
    }
    return count;
}

/* The sizes place_core relies on: every sum and product it forms stays below a few times dst_len. */
static int check_place_args(Py_ssize_t nbytes, Py_ssize_t blen, Py_ssize_t seg, Py_ssize_t k0, Py_ssize_t mtu,
                            Py_ssize_t dst_off, Py_ssize_t dst_len, Py_ssize_t max_count, Py_ssize_t qpn,
                            Py_ssize_t psn, int op) {
    if (op < 0 || op > 0xFF || qpn < 0 || qpn > (Py_ssize_t)PSN_MASK || psn < 0 || psn > (Py_ssize_t)PSN_MASK) {
        PyErr_SetString(PyExc_ValueError, "place_run: opcode, QPN or PSN out of range");
        return -1;
    }
    if (nbytes < 0 || nbytes > blen || seg <= 0 || k0 < 0 || mtu <= 0 || mtu > UDP_MAX_PAYLOAD - BTH_LEN - ICRC_LEN ||
        dst_off < 0 || dst_off > dst_len || max_count < 0) {
        PyErr_SetString(PyExc_ValueError, "place_run: bad sizes");
        return -1;
    }
    return 0;
}

static PyObject *fp_place_run(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer b, st, dst, sh = {0};
    Py_ssize_t nbytes, seg, k0, mtu, dst_off, max_count;
    int op;
    Py_ssize_t qpn, psn;
    if (!PyArg_ParseTuple(args, "y*nnny*innnw*nn|y*:place_run", &b, &nbytes, &seg, &k0, &st, &op, &qpn, &psn,
                          &mtu, &dst, &dst_off, &max_count, &sh))
        return NULL;
    PyObject *result = NULL;
    if (check_place_args(nbytes, b.len, seg, k0, mtu, dst_off, dst.len, max_count, qpn, psn, op) < 0)
        goto out;
    Py_ssize_t count, last_ack = -1;
    uint32_t fix = mask_fix(BTH_LEN + mtu + ICRC_LEN);
    Py_BEGIN_ALLOW_THREADS
    count = place_core(b.buf, nbytes, seg, k0, st.buf, st.len / 4, sh.buf, sh.len / 4, op, (unsigned long)qpn,
                       (unsigned long)psn, mtu, dst.buf, dst.len, dst_off, max_count, fix, &last_ack);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nn", count, last_ack);
out:
    PyBuffer_Release(&b);
    PyBuffer_Release(&st);
    PyBuffer_Release(&dst);
    if (sh.obj != NULL)
        PyBuffer_Release(&sh);
    return result;
}

/* -- recv_runs -------------------------------------------------------------------------- */

/*
 * recv_runs(fd, buf, v6, src, states, op, qpn, psn, mtu, dst, dst_off, max_count, max_reads[, shifts])
 *     -> (placed, last_ackreq, reads, datagrams, gro_batches, errno, pending, ce_reads)
 *
 * Read the socket (non-blocking, up to max_reads reads into buf) while what
 * arrives continues the run: datagrams from src (the (ip, port) the ICRC
 * states belong to) whose every segment place_run takes, placed as one run
 * from psn. Stops at EAGAIN, at max_count placed, or at the first read that
 * the run does not take whole; that read stays in buf and pending is
 * (nbytes, seg, k, (ip, port)): segments before k were placed, the rest are
 * the caller's. pending is None otherwise. datagrams counts every datagram
 * read, pending ones included; last_ackreq is relative to psn (-1: none);
 * errno is that of a failed read other than EAGAIN (0: none); ce_reads counts the
 * reads whose IP header carried CE (RFC 3168; RoCEv2 Annex A17.9), pending one included.
 */
/* One non-blocking recvmsg into buf[:len] (EINTR retried): the bytes read, or -1 with errno
 * set; *seg is the GRO segment size (the whole read without GRO), *from the source, *ecn the
 * ECN field of its IP header (IP_RECVTOS / IPV6_RECVTCLASS; 0 when the socket does not ask:
 * GRO merges only datagrams whose TOS agrees, so one value holds for the whole read). */
static ssize_t read_gro(int fd, void *buf, size_t len, struct sockaddr_storage *from, socklen_t *from_len,
                        Py_ssize_t *seg, int *ecn) {
    union {
        char buf[CMSG_SPACE(sizeof(int)) * 2];
        struct cmsghdr align;
    } ctrl;
    struct iovec iov = {buf, len};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_name = from;
    msg.msg_namelen = sizeof *from;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.buf;
    msg.msg_controllen = sizeof ctrl.buf;
    ssize_t r;
    do {
        r = recvmsg(fd, &msg, MSG_DONTWAIT);
    } while (r < 0 && errno == EINTR);
    if (r < 0)
        return r;
    *from_len = msg.msg_namelen;
    Py_ssize_t n = r, s = 0;
    *ecn = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO && cm->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int v;
            memcpy(&v, CMSG_DATA(cm), sizeof v);
            s = v;
        } else if (cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_TOS && cm->cmsg_len >= CMSG_LEN(1)) {
            *ecn = *(unsigned char *)CMSG_DATA(cm) & 3;
        } else if (cm->cmsg_level == IPPROTO_IPV6 && cm->cmsg_type == IPV6_TCLASS &&
                   cm->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int v;
            memcpy(&v, CMSG_DATA(cm), sizeof v);
            *ecn = v & 3;
        }
    }
    *seg = s > 0 && s < n ? s : 0;
    return r;
}

/* The text form and port of an IPv4 or IPv6 source ("" and 0 for anything else). */
static void format_addr(const struct sockaddr_storage *from, char host[INET6_ADDRSTRLEN], int *port) {
    host[0] = '\0';
    *port = 0;
    if (from->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)from;
        inet_ntop(AF_INET6, &a->sin6_addr, host, INET6_ADDRSTRLEN);
        *port = ntohs(a->sin6_port);
    } else if (from->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)from;
        inet_ntop(AF_INET, &a->sin_addr, host, INET6_ADDRSTRLEN);
        *port = ntohs(a->sin_port);
    }
}

static PyObject *fp_recv_runs(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd, v6, op;
    PyObject *src;
    Py_buffer b, st, dst, sh = {0};
    Py_ssize_t qpn, psn;
    Py_ssize_t mtu, dst_off, max_count, max_reads;
    if (!PyArg_ParseTuple(args, "iw*pOy*innnw*nnn|y*:recv_runs", &fd, &b, &v6, &src, &st, &op, &qpn, &psn, &mtu,
                          &dst, &dst_off, &max_count, &max_reads, &sh))
        return NULL;
    PyObject *result = NULL;
    struct sockaddr_storage want;
    socklen_t want_len;
    if (parse_addr(src, v6, &want, &want_len) < 0)
        goto out;
    if (check_place_args(0, b.len, 1, 0, mtu, dst_off, dst.len, max_count, qpn, psn, op) < 0)
        goto out;
    Py_ssize_t placed = 0, last_ack = -1, reads = 0, datagrams = 0, gro = 0, ce = 0;
    Py_ssize_t p_nbytes = 0, p_seg = 0, p_k = 0;
    int pending = 0, err = 0;
    struct sockaddr_storage from;
    socklen_t from_len = 0;
    uint32_t fix = mask_fix(BTH_LEN + mtu + ICRC_LEN);
    Py_BEGIN_ALLOW_THREADS
    while (reads < max_reads && placed < max_count) {
        Py_ssize_t seg;
        int ecn;
        ssize_t r = read_gro(fd, b.buf, (size_t)b.len, &from, &from_len, &seg, &ecn);
        if (r < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                err = errno;
            break;
        }
        reads++;
        if (ecn == 3)
            ce++;
        Py_ssize_t n = r;
        if (seg) {
            gro++;
            datagrams += (n + seg - 1) / seg;
        } else {
            seg = n > 0 ? n : 1;
            datagrams++;
        }
        Py_ssize_t k = 0;
        int same = from_len == want_len;
        if (same && !v6) {
            struct sockaddr_in *a = (struct sockaddr_in *)&from, *w = (struct sockaddr_in *)&want;
            same = a->sin_addr.s_addr == w->sin_addr.s_addr && a->sin_port == w->sin_port;
        } else if (same) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&from, *w = (struct sockaddr_in6 *)&want;
            same = memcmp(&a->sin6_addr, &w->sin6_addr, sizeof a->sin6_addr) == 0 && a->sin6_port == w->sin6_port;
        }
        if (same && n > 0) {
            Py_ssize_t last = -1;
            k = place_core(b.buf, n, seg, 0, st.buf, st.len / 4, sh.buf, sh.len / 4, op, (unsigned long)qpn,
                           ((unsigned long)psn + (unsigned long)placed) & PSN_MASK, mtu, dst.buf, dst.len,
                           dst_off + placed * mtu, max_count - placed, fix, &last);
            if (last >= 0)
                last_ack = placed + last;
            placed += k;
        }
        if (!same || n == 0 || k * seg < n) {
            pending = 1;
            p_nbytes = n;
            p_seg = seg;
            p_k = k;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (!pending) {
        result = Py_BuildValue("nnnnniOn", placed, last_ack, reads, datagrams, gro, err, Py_None, ce);
        goto out;
    }
    char host[INET6_ADDRSTRLEN];
    int port;
    format_addr(&from, host, &port);
    result = Py_BuildValue("nnnnni(nnn(si))n", placed, last_ack, reads, datagrams, gro, err, p_nbytes, p_seg, p_k,
                           host, port, ce);
out:
    PyBuffer_Release(&b);
    PyBuffer_Release(&st);
    PyBuffer_Release(&dst);
    if (sh.obj != NULL)
        PyBuffer_Release(&sh);
    return result;
}

/*
 * recv_raw(fd, buf) -> (nbytes, seg, (ip, port), errno, ecn) | None
 *
 * One non-blocking read into buf, as UdpLink.recv_raw: the datagrams are
 * buf[k*seg : min((k+1)*seg, nbytes)] (one of nbytes without GRO). None: the
 * socket is empty (no readiness check first, and no exception for an empty
 * read). After a socket error (an ICMP error surfacing) nbytes and seg are 0
 * and errno says which.
 */
static PyObject *fp_recv_raw(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "iw*:recv_raw", &fd, &b))
        return NULL;
    struct sockaddr_storage from;
    socklen_t from_len;
    Py_ssize_t seg;
    int ecn;
    ssize_t r = read_gro(fd, b.buf, (size_t)b.len, &from, &from_len, &seg, &ecn);
    int err = r < 0 ? errno : 0;
    PyBuffer_Release(&b);
    if (r < 0) {
        if (err == EAGAIN || err == EWOULDBLOCK)
            Py_RETURN_NONE;
        return Py_BuildValue("nn(si)ii", (Py_ssize_t)0, (Py_ssize_t)0, "", 0, err, 0);
    }
    Py_ssize_t n = r;
    if (!seg)
        seg = n > 0 ? n : 1;
    char host[INET6_ADDRSTRLEN];
    int port;
    format_addr(&from, host, &port);
    return Py_BuildValue("nn(si)ii", n, seg, host, port, 0, ecn);
}

/* -- single packets: codec, ICRC and send/check in one call ------------------------------ */

/*
 * For the packets that do not come in runs (requests, ACKs, atomics: the
 * round trip of a small operation), what costs is Python's per-packet
 * bookkeeping around the codec, the ICRC and the system call. These two
 * functions do each side in one call, with rdmakit.wire.packet's tables
 * (handed over once by init_codec), and hand anything unusual back to the
 * Python path, which is the reference and says what is wrong:
 *
 *   send_packet(fd, addr, v6, pkt, states, flow) -> int
 *       encode_headers(pkt) + payload + pad + ICRC, sent with one sendmsg.
 *       0: sent; > 0: the errno of sendmsg; -1: not sent, take the Python path
 *       (a field out of range, a header the opcode does not carry, ...).
 *   check_decode(seg, idx, states, flow) -> Packet | int
 *       The header checked as decode() checks it, then the ICRC of GSO
 *       segment idx (IPv4 ID idx, 0 <= idx <= 0xFFFF), then decode(seg[:-4]).
 *       1: the header fails (the ICRC is not computed), decode it in Python
 *       to say why; 0: the header is good but the ICRC does not match.
 *
 * The ICRC state of an n-byte segment with index idx (BTH .. ICRC) is
 * states[n | idx << 16], or flow.state(n, idx) where it is missing.
 */

enum { L_BARE, L_AETH, L_AETH_ONLY, L_RETH, L_RETH_ONLY, L_IMM, L_RETH_IMM, L_IETH, L_ATOMIC, L_ATOMIC_ACK };

static PyObject *t_packet, *t_reth, *t_aeth, *t_atomic_eth;
static PyObject *op_member[256];
static signed char op_layout[256];
static unsigned char op_hlen[256];
static int codec_ready;

static PyObject *fp_init_codec(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *packet, *reth, *aeth, *atomic, *table;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!:init_codec", &PyType_Type, &packet, &PyType_Type, &reth, &PyType_Type,
                          &aeth, &PyType_Type, &atomic, &PyDict_Type, &table))
        return NULL;
    PyObject *types[4] = {packet, reth, aeth, atomic};
    for (int i = 0; i < 4; i++) {
        if (!PyType_IsSubtype((PyTypeObject *)types[i], &PyTuple_Type)) {
            PyErr_SetString(PyExc_TypeError, "init_codec: the header types must be tuples");
            return NULL;
        }
    }
    PyObject *member[256] = {NULL};
    signed char layout[256];
    unsigned char hlen[256];
    memset(layout, -1, sizeof layout);
    memset(hlen, 0, sizeof hlen);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(table, &pos, &key, &value)) {
        long op = PyLong_AsLong(key);
        PyObject *m;
        int lay, off;
        if (op == -1 && PyErr_Occurred())
            return NULL;
        if (!PyTuple_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "init_codec: a table entry is a (member, layout, length) tuple");
            return NULL;
        }
        if (!PyArg_ParseTuple(value, "Oii:init_codec", &m, &lay, &off))
            return NULL;
        /* BTH + extension headers of each layout: the decoder reads exactly these bytes. */
        static const int size[] = {
            [L_BARE] = 12, [L_AETH] = 16, [L_AETH_ONLY] = 16, [L_RETH] = 28, [L_RETH_ONLY] = 28,
            [L_IMM] = 16, [L_RETH_IMM] = 32, [L_IETH] = 16, [L_ATOMIC] = 40, [L_ATOMIC_ACK] = 24,
        };
        if (op < 0 || op > 255 || lay < L_BARE || lay > L_ATOMIC_ACK || off != size[lay]) {
            PyErr_SetString(PyExc_ValueError, "init_codec: bad table entry");
            return NULL;
        }
        member[op] = m;
        layout[op] = (signed char)lay;
        hlen[op] = (unsigned char)off;
    }
    for (int i = 0; i < 256; i++) {
        Py_XINCREF(member[i]);
        Py_XSETREF(op_member[i], member[i]);
    }
    memcpy(op_layout, layout, sizeof layout);
    memcpy(op_hlen, hlen, sizeof hlen);
    Py_INCREF(packet);
    Py_XSETREF(t_packet, packet);
    Py_INCREF(reth);
    Py_XSETREF(t_reth, reth);
    Py_INCREF(aeth);
    Py_XSETREF(t_aeth, aeth);
    Py_INCREF(atomic);
    Py_XSETREF(t_atomic_eth, atomic);
    codec_ready = 1;
    Py_RETURN_NONE;
}

static void put_be16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static uint32_t get_be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }

static uint32_t get_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get_be64(const unsigned char *p) { return (uint64_t)get_be32(p) << 32 | get_be32(p + 4); }

/* The ICRC state of an n-byte segment with index idx; -1 with an exception set. */
static int64_t icrc_state(PyObject *states, PyObject *flow, Py_ssize_t n, Py_ssize_t idx) {
    PyObject *key = PyLong_FromSsize_t(n | idx << 16);
    if (key == NULL)
        return -1;
    PyObject *v = PyDict_GetItemWithError(states, key);  /* borrowed */
    Py_DECREF(key);
    if (v != NULL) {
        Py_INCREF(v);
    } else {
        if (PyErr_Occurred())
            return -1;
        v = PyObject_CallMethod(flow, "state", "nn", n, idx);
        if (v == NULL)
            return -1;
    }
    unsigned long s = PyLong_AsUnsignedLong(v);
    Py_DECREF(v);
    if (s == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (s > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "ICRC state is not a u32");
        return -1;
    }
    return (int64_t)s;
}

/* An int item in [0, max]; 0 if it is not one (no exception left set). */
static int get_uint(PyObject *o, uint64_t max, uint64_t *out) {
    if (!PyLong_Check(o))
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (v > max)
        return 0;
    *out = v;
    return 1;
}

/* A truth value; -1 with an exception set. */
static int truth(PyObject *o) {
    if (o == Py_True)
        return 1;
    if (o == Py_False)
        return 0;
    return PyObject_IsTrue(o);
}

/* BTH and extension headers of pkt (a 16-tuple) into h; their length, 0 to take the Python path,
 * -1 with an exception set. */
static int encode_into(PyObject *pkt, unsigned char *h, Py_ssize_t plen) {
    PyObject **it = ((PyTupleObject *)pkt)->ob_item;
    uint64_t op, qp, psn, pkey;
    if (!get_uint(it[0], 255, &op) || op_layout[op] < 0 || !get_uint(it[1], PSN_MASK, &qp) ||
        !get_uint(it[2], PSN_MASK, &psn) || !get_uint(it[6], 0xFFFF, &pkey))
        return 0;
    int flags[5];
    const int fi[5] = {3, 4, 5, 7, 8}; /* ackreq, se, migreq, fecn, becn */
    for (int i = 0; i < 5; i++) {
        flags[i] = truth(it[fi[i]]);
        if (flags[i] < 0)
            return -1;
    }
    PyObject *reth = it[9], *aeth = it[10], *atomic = it[11], *aack = it[12], *imm = it[13], *ieth = it[14];
    int has = (reth != Py_None) | (aeth != Py_None) << 1 | (atomic != Py_None) << 2 | (aack != Py_None) << 3 |
              (imm != Py_None) << 4 | (ieth != Py_None) << 5;
    int lay = op_layout[op];
    static const int want[] = {
        [L_BARE] = 0, [L_AETH] = 2, [L_AETH_ONLY] = 2, [L_RETH] = 1, [L_RETH_ONLY] = 1,
        [L_IMM] = 16, [L_RETH_IMM] = 17, [L_IETH] = 32, [L_ATOMIC] = 4, [L_ATOMIC_ACK] = 10,
    };
    if (has != want[lay])
        return 0;
    if (plen && (lay == L_AETH_ONLY || lay == L_RETH_ONLY || lay == L_ATOMIC || lay == L_ATOMIC_ACK))
        return 0;
    static const unsigned char padcnt[4] = {0x00, 0x30, 0x20, 0x10};
    h[0] = (unsigned char)op;
    h[1] = (unsigned char)((flags[1] ? 0x80 : 0) | (flags[2] ? 0x40 : 0) | padcnt[plen & 3]);
    put_be16(h + 2, (uint32_t)pkey);
    put_be32(h + 4, (flags[3] ? 0x80000000u : 0) | (flags[4] ? 0x40000000u : 0) | (uint32_t)qp);
    put_be32(h + 8, (flags[0] ? 0x80000000u : 0) | (uint32_t)psn);
    unsigned char *p = h + BTH_LEN;
    uint64_t a, b, c, d;
    if (reth != Py_None) {
        if (!PyTuple_Check(reth) || PyTuple_GET_SIZE(reth) != 3 || !get_uint(PyTuple_GET_ITEM(reth, 0), UINT64_MAX, &a) ||
            !get_uint(PyTuple_GET_ITEM(reth, 1), 0xFFFFFFFFu, &b) || !get_uint(PyTuple_GET_ITEM(reth, 2), 0xFFFFFFFFu, &c))
            return 0;
        put_be64(p, a);
        put_be32(p + 8, (uint32_t)b);
        put_be32(p + 12, (uint32_t)c);
        p += 16;
    }
    if (aeth != Py_None) {
        if (!PyTuple_Check(aeth) || PyTuple_GET_SIZE(aeth) != 2 || !get_uint(PyTuple_GET_ITEM(aeth, 0), 0xFF, &a) ||
            !get_uint(PyTuple_GET_ITEM(aeth, 1), PSN_MASK, &b))
            return 0;
        put_be32(p, (uint32_t)(a << 24 | b));
        p += 4;
    }
    if (atomic != Py_None) {
        if (!PyTuple_Check(atomic) || PyTuple_GET_SIZE(atomic) != 4 ||
            !get_uint(PyTuple_GET_ITEM(atomic, 0), UINT64_MAX, &a) ||
            !get_uint(PyTuple_GET_ITEM(atomic, 1), 0xFFFFFFFFu, &b) ||
            !get_uint(PyTuple_GET_ITEM(atomic, 2), UINT64_MAX, &c) || !get_uint(PyTuple_GET_ITEM(atomic, 3), UINT64_MAX, &d))
            return 0;
        put_be64(p, a);
        put_be32(p + 8, (uint32_t)b);
        put_be64(p + 12, c);
        put_be64(p + 20, d);
        p += 28;
    }
    if (aack != Py_None) {
        if (!get_uint(aack, UINT64_MAX, &a))
            return 0;
        put_be64(p, a);
        p += 8;
    }
    if (imm != Py_None || ieth != Py_None) {
        if (!get_uint(imm != Py_None ? imm : ieth, 0xFFFFFFFFu, &a))
            return 0;
        put_be32(p, (uint32_t)a);
        p += 4;
    }
    int n = (int)(p - h);
    return n == op_hlen[op] ? n : 0;
}

static PyObject *fp_send_packet(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd, v6;
    PyObject *addr, *pkt, *states, *flow;
    if (!PyArg_ParseTuple(args, "iOpOO!O:send_packet", &fd, &addr, &v6, &pkt, &PyDict_Type, &states, &flow))
        return NULL;
    if (!codec_ready || !PyTuple_Check(pkt) || PyTuple_GET_SIZE(pkt) != 16)
        return PyLong_FromLong(-1);
    PyObject *payload = PyTuple_GET_ITEM(pkt, 15);
    if (PyMemoryView_Check(payload) && PyMemoryView_GET_BUFFER(payload)->itemsize != 1)
        return PyLong_FromLong(-1);
    Py_buffer pl;
    if (PyObject_GetBuffer(payload, &pl, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(-1);
    }
    PyObject *result = NULL;
    unsigned char h[48], tail[8] = {0};
    if (pl.len > UDP_MAX_PAYLOAD) {
        result = PyLong_FromLong(-1); /* too long for a datagram: the Python encoder says so */
        goto out;
    }
    int hlen = encode_into(pkt, h, pl.len);
    if (hlen <= 0) {
        if (hlen == 0)
            result = PyLong_FromLong(-1);
        goto out;
    }
    Py_ssize_t pad = -pl.len & 3;
    Py_ssize_t size = hlen + pl.len + pad + ICRC_LEN;
    if (size > UDP_MAX_PAYLOAD) {
        result = PyLong_FromLong(-1);
        goto out;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    if (parse_addr(addr, v6, &ss, &sl) < 0)
        goto out;
    int64_t st = icrc_state(states, flow, size, 0);
    if (st < 0)
        goto out;
    unsigned char b4 = h[4];
    h[4] = 0xFF; /* FECN, BECN, resv6 count as ones (Annex A17.3.3) */
    uint32_t c = crc32_update((uint32_t)st, h, (size_t)hlen);
    h[4] = b4;
    c = crc32_update(c, pl.buf, (size_t)pl.len);
    c = crc32_update(c, tail, (size_t)pad);
    put_le32(tail + pad, c);
    struct iovec iov[3] = {{h, (size_t)hlen}, {pl.buf, (size_t)pl.len}, {tail, (size_t)(pad + ICRC_LEN)}};
    if (!pl.len) {
        iov[1] = iov[2];
    }
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_name = &ss;
    msg.msg_namelen = sl;
    msg.msg_iov = iov;
    msg.msg_iovlen = pl.len ? 3 : 2;
    ssize_t r;
    do {
        r = sendmsg(fd, &msg, 0);
    } while (r < 0 && errno == EINTR);
    result = PyLong_FromLong(r < 0 ? errno : 0);
out:
    PyBuffer_Release(&pl);
    return result;
}

static PyObject *new_tuple(PyObject *type, Py_ssize_t n) {
    PyTypeObject *t = (PyTypeObject *)type;
    return t->tp_alloc(t, n);
}

/* A header tuple of `type` holding the n ints v; NULL with an exception set. */
static PyObject *int_tuple(PyObject *type, Py_ssize_t n, const uint64_t *v) {
    PyObject *t = new_tuple(type, n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyLong_FromUnsignedLongLong(v[i]);
        if (o == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, o);
    }
    return t;
}

/* The bytes of segment `seg` (index idx of a GSO batch: a u16), for fn; -1 with an exception set. */
static int segment_view(PyObject *seg, Py_ssize_t idx, const char *fn, Py_buffer *b) {
    if (idx < 0 || idx > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "%s: segment index is not a u16", fn);
        return -1;
    }
    return PyObject_GetBuffer(seg, b, PyBUF_SIMPLE);
}

/* decode()'s header checks of the BTH .. pad of a segment (m bytes before the ICRC): its
 * layout, with the end of its headers in *off and of its payload in *end; -1: refused. */
static int header_layout(const unsigned char *p, Py_ssize_t m, Py_ssize_t *off, Py_ssize_t *end) {
    int op = p[0], b1 = p[1], lay = codec_ready ? op_layout[op] : -1;
    *off = op_hlen[op];
    *end = m - ((b1 >> 4) & 3);
    if (lay < 0 || (b1 & 0x0F) || (m & 3) || *end < *off ||
        (*end != *off && (lay == L_AETH_ONLY || lay == L_RETH_ONLY || lay == L_ATOMIC || lay == L_ATOMIC_ACK)))
        return -1;
    return lay;
}

/* 1: the ICRC of the n-byte segment idx matches (with its IPv4 ID or another below
 * SEGMENT_IDS); 0: it does not; -1: an exception is set. */
static int icrc_matches(const unsigned char *p, Py_ssize_t n, Py_ssize_t idx, PyObject *states, PyObject *flow) {
    int64_t st = icrc_state(states, flow, n, idx);
    if (st < 0)
        return -1;
    Py_ssize_t m = n - ICRC_LEN;
    unsigned char h[BTH_LEN];
    memcpy(h, p, BTH_LEN);
    h[4] = 0xFF;
    uint32_t c = crc32_update((uint32_t)st, h, BTH_LEN);
    c = crc32_update(c, p + BTH_LEN, (size_t)(m - BTH_LEN)) ^ get_le32(p + m);
    if (!c)
        return 1;
    /* Another IPv4 ID below SEGMENT_IDS (its batch split or merged on the way): flow.id_shift. */
    PyObject *d = PyObject_CallMethod(flow, "id_shift", "nk", n, (unsigned long)c);
    if (d == NULL)
        return -1;
    int ok = d != Py_None;
    Py_DECREF(d);
    return ok;
}

static PyObject *fp_check_decode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *seg, *states, *flow;
    Py_ssize_t idx;
    if (!PyArg_ParseTuple(args, "OnO!O:check_decode", &seg, &idx, &PyDict_Type, &states, &flow))
        return NULL;
    Py_buffer b;
    if (segment_view(seg, idx, "check_decode", &b) < 0)
        return NULL;
    PyObject *result = NULL;
    const unsigned char *p = b.buf;
    Py_ssize_t n = b.len;
    if (n > UDP_MAX_PAYLOAD) {
        PyErr_SetString(PyExc_ValueError, "check_decode: longer than a UDP datagram holds");
        goto out;
    }
    if (n < BTH_LEN + ICRC_LEN) {
        result = PyLong_FromLong(1);
        goto out;
    }
    /* The header checks first, as rxe_rcv() runs hdr_check() before the ICRC:
     * what decode() refuses costs no CRC. */
    Py_ssize_t m = n - ICRC_LEN, off, end;
    int op = p[0], b1 = p[1], lay = header_layout(p, m, &off, &end);
    if (lay < 0) {
        result = PyLong_FromLong(1);
        goto out;
    }
    int icrc = icrc_matches(p, n, idx, states, flow);
    if (icrc <= 0) {
        result = icrc < 0 ? NULL : PyLong_FromLong(0);
        goto out;
    }
    uint32_t w1 = get_be32(p + 4), w2 = get_be32(p + 8);
    const unsigned char *x = p + BTH_LEN;
    PyObject *reth = NULL, *aeth = NULL, *atomic = NULL, *aack = NULL, *imm = NULL;
    int ok = 1;
    switch (lay) {
    case L_AETH:
    case L_AETH_ONLY:
    case L_ATOMIC_ACK: {
        uint32_t w = get_be32(x);
        const uint64_t v[2] = {w >> 24, w & PSN_MASK};
        ok = (aeth = int_tuple(t_aeth, 2, v)) != NULL;
        if (ok && lay == L_ATOMIC_ACK)
            ok = (aack = PyLong_FromUnsignedLongLong(get_be64(x + 4))) != NULL;
        break;
    }
    case L_RETH:
    case L_RETH_ONLY:
    case L_RETH_IMM: {
        const uint64_t v[3] = {get_be64(x), get_be32(x + 8), get_be32(x + 12)};
        ok = (reth = int_tuple(t_reth, 3, v)) != NULL;
        if (ok && lay == L_RETH_IMM)
            ok = (imm = PyLong_FromUnsignedLong(get_be32(x + 16))) != NULL;
        break;
    }
    case L_IMM:
    case L_IETH:
        ok = (imm = PyLong_FromUnsignedLong(get_be32(x))) != NULL;
        break;
    case L_ATOMIC: {
        const uint64_t v[4] = {get_be64(x), get_be32(x + 8), get_be64(x + 12), get_be64(x + 20)};
        ok = (atomic = int_tuple(t_atomic_eth, 4, v)) != NULL;
        break;
    }
    default:
        break;
    }
    PyObject *pkt = NULL, *payload = NULL;
    if (ok)
        payload = PySequence_GetSlice(seg, off, end);
    if (payload != NULL)
        pkt = new_tuple(t_packet, 16);
    if (pkt == NULL) {
        Py_XDECREF(payload);
        Py_XDECREF(reth);
        Py_XDECREF(aeth);
        Py_XDECREF(atomic);
        Py_XDECREF(aack);
        Py_XDECREF(imm);
        goto out;
    }
    PyObject *qp = PyLong_FromUnsignedLong(w1 & PSN_MASK), *psn = PyLong_FromUnsignedLong(w2 & PSN_MASK);
    PyObject *pkey = PyLong_FromUnsignedLong(get_be16(p + 2));
    Py_INCREF(op_member[op]);
    PyTuple_SET_ITEM(pkt, 0, op_member[op]);
    PyTuple_SET_ITEM(pkt, 1, qp);
    PyTuple_SET_ITEM(pkt, 2, psn);
    PyTuple_SET_ITEM(pkt, 3, Py_NewRef(w2 & 0x80000000u ? Py_True : Py_False));
    PyTuple_SET_ITEM(pkt, 4, Py_NewRef(b1 & 0x80 ? Py_True : Py_False));
    PyTuple_SET_ITEM(pkt, 5, Py_NewRef(b1 & 0x40 ? Py_True : Py_False));
    PyTuple_SET_ITEM(pkt, 6, pkey);
    PyTuple_SET_ITEM(pkt, 7, Py_NewRef(w1 & 0x80000000u ? Py_True : Py_False));
    PyTuple_SET_ITEM(pkt, 8, Py_NewRef(w1 & 0x40000000u ? Py_True : Py_False));
    PyTuple_SET_ITEM(pkt, 9, reth != NULL ? reth : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(pkt, 10, aeth != NULL ? aeth : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(pkt, 11, atomic != NULL ? atomic : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(pkt, 12, aack != NULL ? aack : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(pkt, 13, imm != NULL && lay != L_IETH ? imm : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(pkt, 14, imm != NULL && lay == L_IETH ? imm : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(pkt, 15, payload);
    if (qp == NULL || psn == NULL || pkey == NULL) {
        Py_DECREF(pkt);
        goto out;
    }
    result = pkt;
out:
    PyBuffer_Release(&b);
    return result;
}

/* -- the responder's small operations ---------------------------------------------------- */

/*
 * small_request(seg, idx, states, flow, qpn, ticket) -> (op, psn, ackreq, rkey, va, length, orig) | int
 *
 * The common case of a request that is one packet: an in-order RDMA WRITE
 * ONLY (no immediate), RDMA READ request, COMPARE SWAP or FETCH ADD for a
 * responder between messages. ticket is the engine's QueuePair.rx_small():
 * (expected PSN, MTU, the QP's access bits, responder resources (bool), the
 * PD's R_Key table {rkey: (addr, length, access bits, memoryview)}).
 *
 * In rxe's order: the header as decode() takes it (then P_Key, QPN, PSN), the
 * ICRC of segment idx, then check_op_valid, check_resource, check_length and
 * check_rkey (rxe_resp.c). A WRITE's payload is copied to its target and an
 * atomic is executed on it (the u64 in this host's byte order) here; a READ
 * is only checked. The answer says what was done, for
 * QueuePair.rx_small_done to take the effect (responder state, responder
 * resources, the ACK / READ response / atomic ACK queued). Anything else
 * answers -1 having done nothing, and the packet takes the generic path,
 * which is the reference and says what is wrong.
 */
static int small_ops[4] = {-1, -1, -1, -1}; /* WRITE ONLY, READ request, CMP SWAP, FETCH ADD */
static unsigned long small_access[3];       /* REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC */
static unsigned long long small_max_msg;

static PyObject *fp_init_small(PyObject *Py_UNUSED(self), PyObject *args) {
    int w, r, c, f;
    unsigned long aw, ar, aa;
    unsigned long long mm;
    if (!PyArg_ParseTuple(args, "iiiikkkK:init_small", &w, &r, &c, &f, &aw, &ar, &aa, &mm))
        return NULL;
    if (w < 0 || w > 255 || r < 0 || r > 255 || c < 0 || c > 255 || f < 0 || f > 255) {
        PyErr_SetString(PyExc_ValueError, "init_small: an opcode is not a u8");
        return NULL;
    }
    small_ops[0] = w;
    small_ops[1] = r;
    small_ops[2] = c;
    small_ops[3] = f;
    small_access[0] = aw;
    small_access[1] = ar;
    small_access[2] = aa;
    small_max_msg = mm;
    Py_RETURN_NONE;
}

/* The region of rtable that grants `access` over [va, va+len): its first byte's offset,
 * with its entry (a new reference) in *entry; -1 if none (or an error is set: -2). */
static Py_ssize_t small_region(PyObject *rtable, uint32_t rkey, uint64_t va, uint64_t len, unsigned long access,
                               PyObject **entry) {
    PyObject *key = PyLong_FromUnsignedLong(rkey);
    if (key == NULL)
        return -2;
    PyObject *e = PyDict_GetItemWithError(rtable, key);
    Py_DECREF(key);
    if (e == NULL)
        return PyErr_Occurred() ? -2 : -1;
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4) {
        PyErr_SetString(PyExc_TypeError, "small_request: an R_Key entry is (addr, length, bits, view)");
        return -2;
    }
    uint64_t addr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(e, 0));
    uint64_t rlen = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(e, 1));
    unsigned long bits = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(e, 2));
    if (PyErr_Occurred())
        return -2;
    /* MemoryRegion.contains(): addr <= va and va + len <= addr + rlen, without overflow */
    if (!(bits & access) || va < addr || va - addr > rlen || len > rlen - (va - addr) || rlen > PY_SSIZE_T_MAX)
        return -1;
    Py_INCREF(e);
    *entry = e;
    return (Py_ssize_t)(va - addr);
}

static PyObject *fp_small_request(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *seg, *states, *flow, *ticket;
    Py_ssize_t idx;
    unsigned long qpn;
    if (!PyArg_ParseTuple(args, "OnO!OkO!:small_request", &seg, &idx, &PyDict_Type, &states, &flow, &qpn,
                          &PyTuple_Type, &ticket))
        return NULL;
    unsigned long epsn, access;
    Py_ssize_t mtu;
    int rd_ok;
    PyObject *rtable;
    if (!PyArg_ParseTuple(ticket, "knkpO!:small_request ticket", &epsn, &mtu, &access, &rd_ok, &PyDict_Type,
                          &rtable))
        return NULL;
    Py_buffer b;
    if (segment_view(seg, idx, "small_request", &b) < 0)
        return NULL;
    PyObject *result = NULL, *entry = NULL;
    const unsigned char *p = b.buf;
    Py_ssize_t n = b.len;
    if (n > UDP_MAX_PAYLOAD || n < BTH_LEN + ICRC_LEN || !codec_ready) {
        result = PyLong_FromLong(-1);
        goto out;
    }
    int op = p[0], which;
    for (which = 0; which < 4 && small_ops[which] != op; which++)
        ;
    Py_ssize_t off, end;
    uint32_t w1 = get_be32(p + 4), w2 = get_be32(p + 8);
    /* decode()'s header checks, then qp.receive()'s P_Key and QPN and on_request()'s
     * PSN, then the ICRC: anything else is the generic path's. */
    if (which == 4 || header_layout(p, n - ICRC_LEN, &off, &end) < 0 || (which && end != off) ||
        (get_be16(p + 2) & 0x7FFF) != 0x7FFF || (w1 & PSN_MASK) != qpn || (w2 & PSN_MASK) != epsn) {
        result = PyLong_FromLong(-1);
        goto out;
    }
    int icrc = icrc_matches(p, n, idx, states, flow);
    if (icrc <= 0) {
        result = icrc < 0 ? NULL : PyLong_FromLong(-1);
        goto out;
    }
    const unsigned char *x = p + BTH_LEN;
    uint64_t va = get_be64(x), orig = 0;
    uint32_t rkey = get_be32(x + 8);
    uint64_t len = which >= 2 ? 8 : get_be32(x + 12);
    Py_ssize_t plen = end - off, at;
    int ackreq = (w2 >> 31) & 1;
    /* check_op_valid (the QP's access), check_resource (READ and atomics need
     * responder resources), check_length, then check_rkey */
    if (!(access & small_access[which < 2 ? which : 2]) || (which && !rd_ok) ||
        (which == 0 && ((uint64_t)plen != len || plen == 0 || plen > mtu)) || (which == 1 && len > small_max_msg)) {
        result = PyLong_FromLong(-1);
        goto out;
    }
    if (which == 1 && len == 0) {
        result = Py_BuildValue("iknkKKK", op, (unsigned long)(w2 & PSN_MASK), ackreq, (unsigned long)rkey,
                               (unsigned long long)va, (unsigned long long)len, (unsigned long long)0);
        goto out;
    }
    at = small_region(rtable, rkey, va, len, small_access[which < 2 ? which : 2], &entry);
    if (at == -2)
        goto out;
    if (at < 0 || (which >= 2 && (va & 7))) {
        result = PyLong_FromLong(-1);
        goto out;
    }
    if (which != 1) {
        Py_buffer t;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(entry, 3), &t, PyBUF_WRITABLE) < 0)
            goto out;
        if ((uint64_t)t.len < (uint64_t)at + len) {
            PyBuffer_Release(&t);
            result = PyLong_FromLong(-1);
            goto out;
        }
        unsigned char *dst = (unsigned char *)t.buf + at;
        if (which == 0) {
            memcpy(dst, x + 16, (size_t)plen);
        } else {
            uint64_t swap_add = get_be64(x + 12), compare = get_be64(x + 20);
            memcpy(&orig, dst, 8);
            if (which == 3 || orig == compare) { /* a COMPARE SWAP that misses stores nothing */
                uint64_t v = which == 3 ? orig + swap_add : swap_add;
                memcpy(dst, &v, 8);
            }
        }
        PyBuffer_Release(&t);
    }
    result = Py_BuildValue("iknkKKK", op, (unsigned long)(w2 & PSN_MASK), ackreq, (unsigned long)rkey,
                           (unsigned long long)va, (unsigned long long)len, (unsigned long long)orig);
out:
    Py_XDECREF(entry);
    PyBuffer_Release(&b);
    return result;
}

/*
 * small_response(seg, idx, states, flow, qpn, ticket) -> (op, psn) | -1
 *
 * The completer's common case: the one-packet response that completes the
 * head of the send queue. ticket is the engine's QueuePair.rx_small_resp():
 * (opcode, PSN, payload length, target buffer or None, MTU): an ACKNOWLEDGE
 * with an ACK syndrome, an RDMA READ RESPONSE ONLY with exactly that many
 * bytes (copied to the target here) or an ATOMIC ACKNOWLEDGE (its original
 * value stored in the 8-byte target, this host's byte order). Checked as
 * decode(), qp.receive() and on_response() check it: the header, P_Key, QPN,
 * PSN, the ICRC of segment idx, the syndrome and the length. Then
 * QueuePair.rx_small_resp_done takes the effect. Anything else answers -1
 * having done nothing: the generic path takes the packet.
 */
static int resp_ops[3] = {-1, -1, -1}; /* ACKNOWLEDGE, READ RESPONSE ONLY, ATOMIC ACKNOWLEDGE */

static PyObject *fp_init_small_response(PyObject *Py_UNUSED(self), PyObject *args) {
    int a, r, t;
    if (!PyArg_ParseTuple(args, "iii:init_small_response", &a, &r, &t))
        return NULL;
    if (a < 0 || a > 255 || r < 0 || r > 255 || t < 0 || t > 255) {
        PyErr_SetString(PyExc_ValueError, "init_small_response: an opcode is not a u8");
        return NULL;
    }
    resp_ops[0] = a;
    resp_ops[1] = r;
    resp_ops[2] = t;
    Py_RETURN_NONE;
}

static PyObject *fp_small_response(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *seg, *states, *flow, *ticket, *target;
    Py_ssize_t idx, length, mtu;
    unsigned long qpn, want_psn;
    int want_op;
    if (!PyArg_ParseTuple(args, "OnO!OkO!:small_response", &seg, &idx, &PyDict_Type, &states, &flow, &qpn,
                          &PyTuple_Type, &ticket))
        return NULL;
    if (!PyArg_ParseTuple(ticket, "iknOn:small_response ticket", &want_op, &want_psn, &length, &target, &mtu))
        return NULL;
    Py_buffer b;
    if (segment_view(seg, idx, "small_response", &b) < 0)
        return NULL;
    PyObject *result = NULL;
    const unsigned char *p = b.buf;
    Py_ssize_t n = b.len, off, end;
    int which;
    for (which = 0; which < 3 && resp_ops[which] != want_op; which++)
        ;
    if (which == 3 || n > UDP_MAX_PAYLOAD || n < BTH_LEN + ICRC_LEN || !codec_ready || p[0] != want_op ||
        header_layout(p, n - ICRC_LEN, &off, &end) < 0 || (get_be16(p + 2) & 0x7FFF) != 0x7FFF ||
        (get_be32(p + 4) & PSN_MASK) != qpn || (get_be32(p + 8) & PSN_MASK) != want_psn ||
        p[BTH_LEN] >> 5 != 0 || end - off != (which == 1 ? length : 0) || length < 0 || length > mtu) {
        result = PyLong_FromLong(-1);
        goto out;
    }
    int icrc = icrc_matches(p, n, idx, states, flow);
    if (icrc <= 0) {
        result = icrc < 0 ? NULL : PyLong_FromLong(-1);
        goto out;
    }
    Py_ssize_t size = which == 2 ? 8 : which == 1 ? length : 0;
    if (size) {
        Py_buffer t;
        if (target == Py_None) {
            result = PyLong_FromLong(-1);
            goto out;
        }
        if (PyObject_GetBuffer(target, &t, PyBUF_WRITABLE) < 0)
            goto out;
        if (t.len < size || (which == 2 && t.len != 8)) {
            PyBuffer_Release(&t);
            result = PyLong_FromLong(-1);
            goto out;
        }
        if (which == 1) {
            memcpy(t.buf, p + off, (size_t)size);
        } else {
            uint64_t orig = get_be64(p + BTH_LEN + 4);
            memcpy(t.buf, &orig, 8);
        }
        PyBuffer_Release(&t);
    }
    result = Py_BuildValue("ik", want_op, want_psn);
out:
    PyBuffer_Release(&b);
    return result;
}

/* -- the armed responder (a QP's responder state, owned natively while armed) ------------ */

#include "_nativeqp.c"

/* -- the armed requester's completer (in-order ACKs of SEND/WRITE WQEs, retired natively) -- */

#include "_nativereq.c"

/* -- native posting (a fresh one-packet SEND or WRITE sent in its doorbell's call) -------- */

#include "_nativepost.c"
#include "_nativepostsend.c"

/* -- the device poll loop (Driver.run_until's idle wait, spin then block, in one call) ------ */

#include "_nativeloop.c"

/* -- module ----------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"crc32", fp_crc32, METH_VARARGS, "crc32(data, value=0) -> int: zlib's CRC-32."},
    {"send_train", fp_send_train, METH_VARARGS, "Send a run of MIDDLE packets (see the module source)."},
    {"place_run", fp_place_run, METH_VARARGS, "Check and place a run of MIDDLE segments."},
    {"icrc_one_pass", fp_icrc_one_pass, METH_VARARGS, "place_run's one-pass ICRC check of a segment."},
    {"recv_runs", fp_recv_runs, METH_VARARGS, "Read the socket while what arrives continues a run."},
    {"recv_raw", fp_recv_raw, METH_VARARGS, "One non-blocking read: (nbytes, seg, source, errno) or None."},
    {"init_codec", fp_init_codec, METH_VARARGS, "Hand over rdmakit.wire.packet's types and opcode table."},
    {"send_packet", fp_send_packet, METH_VARARGS, "Encode one packet, add its ICRC and send it."},
    {"check_decode", fp_check_decode, METH_VARARGS, "Check one segment's ICRC and decode it."},
    {"init_small", fp_init_small, METH_VARARGS, "Hand over the opcodes and access bits small_request takes."},
    {"small_request", fp_small_request, METH_VARARGS, "Check and execute a one-packet request (see the source)."},
    {"init_small_response", fp_init_small_response, METH_VARARGS, "Hand over the opcodes small_response takes."},
    {"small_response", fp_small_response, METH_VARARGS, "Check a one-packet response, place its data."},
    {"poll_armed", fp_poll_armed, METH_VARARGS, "Read and execute armed responders' WRITEs (see _nativepoll.c)."},
    {"send_acks", fp_send_acks, METH_VARARGS, "Send the ACKs armed responders hold, in GSO batches (_nativeqp_ack.c)."},
    {"post_small", fp_post_small, METH_VARARGS, "Send a fresh one-packet SEND or WRITE (see _nativepost.c)."},
    {"wait_loop", fp_wait_loop, METH_VARARGS, "The device poll loop's idle wait (see _nativeloop.c)."},
    {"post_send", fp_post_send, METH_VARARGS, "Check, queue and send a work request (see _nativepostsend.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath", "The native data plane of the UDP soft device.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) {
        PyErr_SetString(PyExc_ImportError, "_fastpath: little-endian hosts only");
        return NULL;
    }
    crc_init_tables();
    static const unsigned char ones[ICRC_LEN] = {0xFF, 0xFF, 0xFF, 0xFF};
    crc_residue = crc_raw_table(0, ones, ICRC_LEN);
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* RDMAKIT_NO_CLMUL (any value) keeps the CRC to the tables, RDMAKIT_NO_VPCLMUL to
     * PCLMULQDQ: each implementation can be tested on a CPU that has a faster one. */
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1") &&
                 getenv("RDMAKIT_NO_CLMUL") == NULL;
    have_vclmul = have_clmul && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq") &&
                  getenv("RDMAKIT_NO_VPCLMUL") == NULL;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#if defined(__x86_64__)
    if (PyModule_AddIntConstant(m, "CLMUL", have_clmul + have_vclmul) < 0) {
#else
    if (PyModule_AddIntConstant(m, "CLMUL", 0) < 0) {
#endif
        Py_DECREF(m);
        return NULL;
    }
    if (armed_setup(m) < 0 || armedreq_setup(m) < 0 || post_setup() < 0 || post_send_setup() < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
