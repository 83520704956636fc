"""``rdmakit conformance``, the RoCEv2 RC conformance suite, and ``rdmakit conformance-target``, its agent."""

import argparse
import contextlib
import ipaddress
import json
import sys
from typing import Any

from rdmakit.cli.errors import EXIT_ERROR, EXIT_USAGE, CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.options import add_general_flags, float_in, int_in
from rdmakit.cli.publishing import open_output

EXIT_FAIL = 1


def _need_suite() -> None:
    from rdmakit.conformance import need_scapy

    try:
        need_scapy()
    except ImportError as e:
        raise CliError(str(e)) from None


def _write(path: str, data: str | bytes) -> None:
    raw = data.encode() if isinstance(data, str) else data
    if path == "-":
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
    else:
        with open_output(path, "the report") as f:
            f.write(raw)


def _conformance(args: argparse.Namespace) -> int:
    from rdmakit.conformance import report, runner
    from rdmakit.conformance.control import ControlError, TargetClient, client_handshake
    from rdmakit.transport.comm import connect, parse_service
    from rdmakit.transport.comm_auth import SecretError, load_secret
    from rdmakit.transport.probe import ProbeLink

    cases = runner.select(runner.load_cases(), args.k or [])
    if args.list:
        if args.json_out:
            _write(args.json_out, report.dumps([report.case_json(c) for c in cases]))
        else:
            for c in cases:
                print(f"{c.id:<34} {c.role:<9} {c.purpose}  [{c.follows}]")
        return 0
    _need_suite()  # running cases needs scapy; listing them does not
    try:
        deviations = runner.load_deviations(args.deviations)
    except (OSError, ValueError) as e:
        raise CliError(f"deviations file: {e}") from None
    quiet_table = "-" in (args.json_out, args.junit)
    target: runner.SelfTarget | None = None
    try:
        if args.self:
            target = runner.SelfTarget(*_self_addresses(args))
            client, dut_ip, tester_ip = target.client, target.dut_ip, target.tester_ip
        else:
            if not (args.target and args.dut_ip and args.tester_ip):
                raise CliError("give --self, or --target, --dut-ip and --tester-ip", EXIT_USAGE)
            try:
                secret = load_secret(secret_file=args.secret_file)
            except SecretError as e:
                raise CliError(str(e)) from None
            sock = connect(parse_service(args.target), max_msg_size=65536, timeout=args.connect_timeout)
            client_handshake(sock, secret, args.connect_timeout)
            client = TargetClient(sock)
            dut_ip, tester_ip = args.dut_ip, args.tester_ip
        with ProbeLink(tester_ip, raw=not args.no_raw) as link:
            method = link.header_source
            if not quiet_table:
                print(f"tester {tester_ip} -> DUT {dut_ip}; ICRC check: {method}; seed {args.seed}")
            results = runner.run_cases(client, link, dut_ip, cases, seed=args.seed, deviations=deviations)
        if target is None:
            client.close()
    except ControlError as e:
        raise CliError(f"control channel: {e}") from None
    finally:
        if target is not None:
            target.close()
    meta = {"seed": args.seed, "dut_ip": dut_ip, "tester_ip": tester_ip, "icrc_check": method}
    if args.json_out:
        _write(args.json_out, report.dumps(report.to_json(results, meta)))
    if args.junit:
        _write(args.junit, report.to_junit(results))
    if not quiet_table:
        print(report.table(results))
    return EXIT_FAIL if any(r.status == runner.FAIL for r in results) else 0


def _self_addresses(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``--self``'s (tester, DUT) addresses: both given, of one family and distinct, or neither."""
    given = (args.tester_ip, args.dut_ip)
    if given == (None, None):
        return None, None
    if None in given:
        raise CliError("--self takes both --tester-ip and --dut-ip, or neither", EXIT_USAGE)
    try:
        tester, dut = (ipaddress.ip_address(a) for a in given)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    if tester.version != dut.version or tester == dut:
        raise CliError("--tester-ip and --dut-ip must be two addresses of one IP version", EXIT_USAGE)
    return str(tester), str(dut)


def _target(args: argparse.Namespace) -> int:
    _need_suite()
    from rdmakit.conformance import target
    from rdmakit.transport.comm import Listener, parse_service
    from rdmakit.transport.comm_auth import SecretError, load_secret

    try:
        secret = load_secret(secret_file=args.secret_file)
    except SecretError as e:
        raise CliError(str(e)) from None
    spec = args.device
    listener = Listener(parse_service(args.listen), max_msg_size=65536)

    def log(m: str) -> None:
        print(f"conformance-target: {m}", file=sys.stderr, flush=True)

    try:
        with contextlib.ExitStack() as stack:
            agent: target.Target
            try:
                ipaddress.ip_address(spec.removeprefix("soft-udp:"))
            except ValueError:
                agent = _verbs_target(spec, stack, args.port, args.gid_index)
            else:
                if args.port not in (None, 1) or args.gid_index not in (None, 0):
                    raise CliError("a soft device has port 1 and GID index 0 only")
                agent = target.SoftTarget(stack.enter_context(target.open_soft_device(spec)))
            name = agent.info({})["device"]
            print(json.dumps({"control": str(listener.address), "device": name}), flush=True)
            target.serve(agent, listener, secret, once=args.once, log=log,
                         handshake_seconds=args.handshake_timeout)  # fmt: skip
    finally:
        listener.close()
    return 0


def _verbs_target(spec: str, stack: contextlib.ExitStack, port: int | None, gid_index: int | None) -> Any:
    """The agent over the verbs device `spec` (``rxe0``, ``mlx5_0`` ...), its `port` and GID `gid_index`."""
    from rdmakit.verbs import VerbsError, pyverbs_missing

    missing = pyverbs_missing()
    if missing is not None:
        raise CliError(
            f"{spec[:64]!r} is not an IP address of a soft device, and verbs devices need {missing}"
        )
    from rdmakit.conformance.target_verbs import VerbsTarget
    from rdmakit.verbs.device import VerbsDevice

    try:
        dev = stack.enter_context(VerbsDevice(spec, port=port, gid_index=gid_index))
    except VerbsError as e:
        raise CliError(f"{spec[:64]!r}: {e}") from None
    return VerbsTarget(dev)


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "conformance",
        help="RoCEv2 RC conformance suite against a device under test",
        description="Play the other end of the wire, packet by packet, against a RoCEv2 device beside "
        "an agent (conformance-target) and report which IBTA rules it keeps: PASS, FAIL, "
        "KNOWN-DEVIATION or SKIPPED per case (docs/conformance.md). Exit status 1 on any FAIL.",
    )
    add_general_flags(p)
    p.add_argument(
        "--self",
        action="store_true",
        help="test rdmakit's own soft device (spawns the agent; at 127.x addresses unless --tester-ip and "
        "--dut-ip name two local addresses, IPv4 or IPv6)",
    )
    p.add_argument("--target", help="the agent's control address, tcp:HOST:PORT")
    p.add_argument("--dut-ip", help="the DUT's RoCE address (IPv4 or IPv6)")
    p.add_argument("--tester-ip", help="this host's address the tester uses (UDP 4791), of the DUT's family")
    p.add_argument("--secret-file", help="the control channel secret (hex); default as the comm channel's")
    p.add_argument(
        "--connect-timeout", type=float_in(0.1, 600), default=10.0,
        help="seconds to reach the agent and pass its handshake (10)",
    )  # fmt: skip
    p.add_argument("--list", action="store_true", help="list the cases (as JSON with --json-out)")
    p.add_argument("-k", action="append", metavar="PATTERN", help="only cases whose id contains PATTERN")
    p.add_argument(
        "--seed", type=int, default=1, help="seed of PSNs, QPNs and payloads (results never depend)"
    )
    p.add_argument("--deviations", help="JSON file of the DUT's known deviations (case, reason, source)")
    p.add_argument("--json-out", metavar="FILE", help="results as JSON ('-': stdout)")
    p.add_argument("--junit", metavar="FILE", help="results as JUnit XML ('-': stdout)")
    p.add_argument("--no-raw", action="store_true", help="never open a raw socket (solve IPv4 IDs instead)")
    p.set_defaults(handler=run(p, _conformance))

    t = sub.add_parser(
        "conformance-target",
        help="the conformance suite's agent beside a device under test",
        description="Serve the conformance suite's tester over an authenticated control channel: set "
        "each case up on the device under test (a soft device or a verbs device). Prints its control "
        "address as one JSON line, then serves until stopped (--once: one session).",
    )
    add_general_flags(t)
    t.add_argument(
        "-d",
        "--device",
        required=True,
        help="the device: soft-udp:IP (or IP), or a verbs device name (rxe0, mlx5_0)",
    )
    t.add_argument("--listen", default="tcp:127.0.0.1:0", help="control address, tcp:HOST:PORT")
    t.add_argument("--secret-file", help="the control channel secret (hex); default as the comm channel's")
    t.add_argument("--once", action="store_true", help="exit after the first tester's session")
    t.add_argument(
        "--handshake-timeout", type=float_in(1, 600), default=5.0,
        help="seconds a connection has to pass the handshake before it is closed (5; more for a slow host)",
    )  # fmt: skip
    t.add_argument("--port", type=int_in(1, 255), help="the verbs device's port (default: its first active)")
    t.add_argument("--gid-index", type=int_in(0, 255), help="the verbs device's GID (default: a RoCEv2 one)")
    t.set_defaults(handler=run(t, _target))


__all__ = ["EXIT_ERROR", "register"]
