"""The DOCA RDMA samples' command lines.

Their flags, the checks made before anything is published, and the runner
that turns a failure into one line.
"""

import argparse
import ipaddress
import os
import stat
from collections.abc import Callable
from pathlib import Path

from rdmakit.cli.errors import EXIT_USAGE, CliError
from rdmakit.cli.lifecycle import Terminated, run
from rdmakit.cli.options import TIMEOUT, U32, U64, add_foreign_flag, add_general_flags, int_in
from rdmakit.cli.samples import (
    _EXPORTERS,
    _TWO_SIDED,
    DEFAULT_IMMEDIATE,
    DEFAULT_LOCAL,
    DEFAULT_REMOTE,
    DEFAULT_RESOURCE,
    DEFAULT_STRING,
    SAMPLES,
    Files,
    Sample,
    _device,
    _string_bytes,
)
from rdmakit.cli.session import ConnectionBroke
from rdmakit.doca import DocaError


def _check_paths(args: argparse.Namespace, fn: Callable[[argparse.Namespace, Files], int]) -> None:
    """Before anything is published: the paths this side writes can be written, and none is another."""
    named = [("-ld", args.local_descriptor_path), ("-re", args.remote_descriptor_path)]
    if fn not in _TWO_SIDED:
        named.append(("-m", args.remote_resource_descriptor_path))
    seen: dict[str, str] = {}
    for flag, path in named:
        if not path:
            raise CliError(f"{flag}: an empty path", EXIT_USAGE)
        where = os.path.abspath(path)
        if where in seen:
            raise CliError(f"{seen[where]} and {flag} name the same file {path}", EXIT_USAGE)
        seen[where] = flag
    writes = named[:1] + (named[2:] if fn in _EXPORTERS else [])
    for flag, path in writes:
        parent = Path(os.path.abspath(path)).parent
        if not parent.is_dir():
            raise CliError(f"{flag} {path}: the directory {parent} does not exist", EXIT_USAGE)
        if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
            raise CliError(f"{flag} {path}: something other than a file is there", EXIT_USAGE)


def _check(args: argparse.Namespace, fn: Callable[[argparse.Namespace, Files], int]) -> None:
    """Everything that can be refused before publishing is refused here (exit status 2)."""
    _device(args)
    for name in ("send_string", "read_string", "write_string"):
        _string_bytes(getattr(args, name))
    if args.timeout is None or not (0 < args.timeout <= 365 * 86400):
        raise CliError(f"--timeout {args.timeout}: not a number of seconds > 0", EXIT_USAGE)
    _check_paths(args, fn)


def _runner(fn: Sample, task_fn: Sample | None = None) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        _check(args, fn)
        files = Files(args)
        chosen = task_fn if task_fn is not None and getattr(args, "api", "job") == "task" else fn
        try:
            return chosen(args, files)
        except CliError as e:
            message = files.failed(str(e), isinstance(e, ConnectionBroke))
            if message == str(e):
                raise
            raise CliError(message, e.status) from e
        except DocaError as e:
            message = files.failed(str(e))
            if message == str(e):
                raise
            raise CliError(message) from e
        except KeyboardInterrupt:
            files.failed("interrupted (Ctrl-C)")
            raise
        except Terminated as t:
            files.failed(f"stopped by {t}")
            raise

    return handler


#: The port ``-cm`` listens on and connects to unless ``--port`` says otherwise.
DEFAULT_CM_PORT = 18515


def add_cm_flags(p: argparse.ArgumentParser) -> None:
    """DOCA 2.9 samples' connection-manager flags."""
    p.add_argument(
        "-cm", "--use-rdma-cm", action="store_true",
        help="connect by address through the RDMA CM instead of descriptor files (DOCA 2.9)",
    )  # fmt: skip
    p.add_argument(
        "-sa", "--server-addr", type=_ip_text, metavar="ADDR",
        help="with -cm: the server to connect to (without it, this side listens on its -d address)",
    )  # fmt: skip
    p.add_argument(
        "-sat", "--server-addr-type", choices=("ipv4", "ipv6"), default=None,
        help="with -cm: the type of -sa (checked against it)",
    )  # fmt: skip
    p.add_argument(
        "--port", "-lp", "--listen-port", dest="port", type=int_in(1, 65535), default=DEFAULT_CM_PORT,
        metavar="PORT", help=f"with -cm: the port to listen on or connect to ({DEFAULT_CM_PORT})",
    )  # fmt: skip


def _ip_text(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


def register(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]", task_api: dict[Sample, Sample] | None = None
) -> None:
    """The sample subcommands; `task_api` maps a sample to its task-API version (``--api task``)."""
    for name, (summary, fn, extras) in SAMPLES.items():
        p = sub.add_parser(name, help=summary, description=f"DOCA RDMA sample: {summary}.")
        add_general_flags(p)
        p.add_argument(
            "-d",
            "--device",
            help="device: a soft device by address (127.0.0.2), tcp:ADDR for the TCP transport, "
            "or a verbs device by name (rxe0)",
        )
        p.add_argument(
            "-ld",
            "--local-descriptor-path",
            default=DEFAULT_LOCAL,
            help=f"where to write this side's connection descriptor ({DEFAULT_LOCAL})",
        )
        p.add_argument(
            "-re",
            "--remote-descriptor-path",
            default=DEFAULT_REMOTE,
            help=f"where to read the peer's connection descriptor ({DEFAULT_REMOTE})",
        )
        p.add_argument(
            "-m",
            "--remote-resource-descriptor-path",
            default=DEFAULT_RESOURCE,
            help=f"the exported memory descriptor ({DEFAULT_RESOURCE})",
        )
        p.add_argument("-g", "--gid-index", type=int_in(0, 255), default=0, help="GID index (0)")
        p.add_argument("-s", "--send-string", default=DEFAULT_STRING, help="string to send")
        p.add_argument("-r", "--read-string", default=DEFAULT_STRING, help="string the responder offers")
        p.add_argument("-w", "--write-string", default=DEFAULT_STRING, help="string to write")
        p.add_argument("--timeout", type=TIMEOUT, default=30.0, help="seconds to wait for the peer (30)")
        add_cm_flags(p)
        add_foreign_flag(p)
        p.add_argument(
            "--interactive", action="store_true", help="ask for Enter before reading the peer's file"
        )
        if "imm" in extras:
            p.add_argument(
                "--immediate", type=U32, default=DEFAULT_IMMEDIATE, help="32-bit immediate (0xABCD)"
            )
        if "atomic" in extras:
            p.add_argument(
                "--op", choices=("cas", "faa"), default="faa", help="compare-and-swap or fetch-and-add"
            )
            p.add_argument("--compare", type=U64, default=0, help="value to compare with (cas)")
            p.add_argument("--swap", type=U64, default=1, help="value to swap in (cas)")
            p.add_argument("--add", type=U64, default=1, help="value to add, modulo 2^64 (faa)")
        if "initial" in extras:
            p.add_argument("--initial", type=U64, default=0, help="the word's initial value (0)")
        task_fn = None if task_api is None else task_api.get(fn)
        if task_fn is not None:
            p.add_argument(
                "--api",
                choices=("job", "task"),
                default="job",
                help="DOCA API: job (doca_workq, DOCA 2.0) or task (doca_pe and tasks, DOCA 2.5+)",
            )
        p.set_defaults(handler=run(p, _runner(fn, task_fn)))
