"""``rdmakit capture``: capture and decode RoCEv2 (UDP 4791) with rdmakit's own codec.

Live from an interface (root), or from a pcap file (``-r``, e.g. from tcpdump).
One line per packet: time, addresses, the BTH and extension headers (a UD
SEND's DETH and the CM MAD it carries to QP1, with its fields), and
whether the ICRC is right (``icrc ok``, ``icrc BAD``). ``-w FILE`` saves the
RoCEv2 frames as pcap for Wireshark, which dissects UDP 4791 as InfiniBand.
The exit status is 1 if any packet had a bad ICRC or did not decode. The
summary line comes at the end however the capture stops (``-c``,
``--duration``, the end of the file, Ctrl-C, SIGTERM).
"""

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import BinaryIO

from rdmakit.cli.errors import CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.options import add_general_flags, float_in, int_in, log
from rdmakit.cli.publishing import open_output
from rdmakit.transport.capture import CaptureError, PacketSocket, PcapWriter, read_pcap
from rdmakit.wire import ROCE_UDP_PORT
from rdmakit.wire.frames import RoceDatagram, describe, describe_ud, parse_frame


def _line(ts: float, d: RoceDatagram) -> str:
    when = datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")
    ident = f" id={d.ip_id}{' DF' if d.df else ''}" if d.ip_id is not None else ""
    icrc = {True: "icrc ok", False: "icrc BAD", None: "icrc n/a"}[d.icrc_ok]
    if d.packet is not None:
        what = describe(d.packet)
    elif d.ud is not None:
        what = describe_ud(d.ud, d.mad, d.mad_error)
    else:
        what = f"MALFORMED ({d.error})"
    return f"{when} {d.src}:{d.sport} > {d.dst}:{d.dport}{ident} {what} [{icrc}]"


def _capture(args: argparse.Namespace) -> int:
    frames: Iterator[tuple[float, bytes]]
    with contextlib.ExitStack() as stack:
        try:
            if args.read:
                linktype, frames = read_pcap(args.read)
            else:
                sock = PacketSocket(args.interface)
                stack.callback(sock.close)
                linktype = sock.linktype
                until = time.monotonic() + args.duration if args.duration else None
                frames = sock.frames(until)
        except CaptureError as e:
            raise CliError(str(e)) from e
        except OSError as e:
            raise CliError(f"cannot read {args.read}: {e.strerror}") from e
        writer = None
        if args.write:
            writer_file: BinaryIO = stack.enter_context(open_output(args.write, "the capture"))
            writer = PcapWriter(writer_file, linktype)
        seen = bad = 0
        try:
            log.info("capturing on %s", args.read or args.interface)
            for ts, frame in frames:
                d = parse_frame(linktype, frame, args.port)
                if d is None:
                    continue
                seen += 1
                bad += d.icrc_ok is False or not d.decoded
                if writer is not None:
                    writer.write(ts, frame)
                if not args.quiet:
                    print(_line(ts, d), flush=sys.stdout.isatty())
                if args.count and seen >= args.count:
                    break
        finally:  # however it stops: the end, -c, --duration, an error, Ctrl-C, SIGTERM
            print(f"{seen} RoCEv2 packets, {bad} with a bad ICRC or undecodable", file=sys.stderr, flush=True)
    return 1 if bad else 0


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("capture", help="capture and decode RoCEv2 packets (live or from pcap)")
    add_general_flags(p)
    p.add_argument("-i", "--interface", default="lo", help="interface to capture on (lo; 'any' for all)")
    p.add_argument("-r", "--read", metavar="PCAP", help="decode a pcap file instead of capturing")
    p.add_argument("-w", "--write", metavar="PCAP", help="also save the RoCEv2 frames to a pcap file")
    p.add_argument(
        "-c", "--count", type=int_in(0, 1 << 62), default=0, help="stop after this many RoCEv2 packets"
    )
    p.add_argument(
        "--duration", type=float_in(0.0, 1e9), default=0.0, help="stop capturing after this many seconds"
    )
    p.add_argument("--port", type=int_in(1, 65535), default=ROCE_UDP_PORT, help="UDP destination port (4791)")
    p.add_argument("-q", "--quiet", action="store_true", help="only the summary")
    p.set_defaults(handler=run(p, _capture))
