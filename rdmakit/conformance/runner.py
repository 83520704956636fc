"""Running cases: selection, per-DUT known deviations, results, and the ``--self`` setup.

Results are PASS, FAIL, KNOWN-DEVIATION (a failure the DUT's deviations file
lists, with its reason and public source) and SKIPPED (with the reason).
Each case draws its PSNs, QPN and payloads from a random source seeded with
``--seed`` and the case id: a new seed changes the numbers, never the result.
"""

import contextlib
import fnmatch
import json
import os
import random
import secrets
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from rdmakit.transport.comm import connect, parse_service
from rdmakit.transport.probe import ProbeLink
from rdmakit.transport.user_files import UserFileError, read_user_file

from . import control
from .control import ControlError, TargetClient, TargetError
from .harness import CASES, Case, CaseFail, Ctx, Skip

PASS, FAIL, DEVIATION, SKIPPED = "PASS", "FAIL", "KNOWN-DEVIATION", "SKIPPED"
MAX_DEVIATIONS_FILE = 1 << 20


@dataclass(slots=True)
class Result:
    case: Case
    status: str
    detail: str = ""
    seconds: float = 0.0
    icrc: str = ""
    log: list[str] = field(default_factory=list)


def load_cases() -> list[Case]:
    from . import (  # noqa: F401
        dut_cm,
        dut_ip,
        dut_ip6,
        dut_requester,
        dut_requester_errors,
        dut_requester_flow,
        dut_requester_format,
        dut_requester_retry,
        dut_responder,
        dut_responder_bounds,
        dut_responder_errors,
        dut_responder_recovery,
    )

    return list(CASES)


def select(cases: list[Case], patterns: list[str]) -> list[Case]:
    """Cases whose id contains any pattern (or matches it as a glob); all when none given."""
    if not patterns:
        return cases
    return [c for c in cases if any(p in c.id or fnmatch.fnmatch(c.id, p) for p in patterns)]


def load_deviations(path: str | None) -> dict[str, dict[str, str]]:
    """case id -> {reason, source}, from ``{"dut": ..., "deviations": [{case, reason, source}]}``.

    The file is read by the rule of ``rdmakit.transport.user_files`` (it decides which failures count).
    """
    if path is None:
        return {}
    try:
        data = read_user_file(path, "the file", MAX_DEVIATIONS_FILE).data
    except UserFileError as e:
        raise ValueError(e.message) from None
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path}: not JSON ({type(e).__name__})") from None
    entries = doc.get("deviations") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f'{path}: expected {{"dut": ..., "deviations": [...]}}')
    out = {}
    for d in entries:
        if not (isinstance(d, dict) and all(isinstance(d.get(k), str) and d[k] for k in _DEVIATION_KEYS)):
            raise ValueError(f"{path}: every deviation needs a case, a reason and a public source")
        out[d["case"]] = {"reason": d["reason"][:500], "source": d["source"][:500]}
    return out


_DEVIATION_KEYS = ("case", "reason", "source")


def run_cases(
    client: TargetClient,
    link: ProbeLink,
    dut_ip: str,
    cases: list[Case],
    *,
    seed: int,
    deviations: dict[str, dict[str, str]] | None = None,
    progress: Any = None,
) -> list[Result]:
    info = client.call("info")
    deviations = deviations or {}
    results = []
    for c in cases:
        rng = random.Random(f"{seed}:{c.id}")
        ctx = Ctx(client, link, dut_ip, info, rng)
        ctx.drain()
        start = time.monotonic()
        try:
            c.fn(ctx)
            res = Result(c, PASS)
        except Skip as e:
            res = Result(c, SKIPPED, str(e))
        except CaseFail as e:
            res = Result(c, FAIL, str(e))
        except TargetError as e:
            res = Result(c, FAIL, f"the target agent refused a step: {e}")
        except (ControlError, OSError):
            raise
        except Exception as e:  # a bug in the case itself: report it, go on
            res = Result(c, FAIL, f"case error: {e!r}: {traceback.format_exc(limit=3)}")
        res.seconds = time.monotonic() - start
        res.icrc = ",".join(sorted(ctx.icrc_methods))
        res.log = ctx.log[-20:]
        if res.status == FAIL and c.id in deviations:
            d = deviations[c.id]
            res = Result(c, DEVIATION, f"{d['reason']} ({d['source']}); observed: {res.detail}", res.seconds,
                         res.icrc, res.log)  # fmt: skip
        results.append(res)
        client.call("cleanup")
        if progress is not None:
            progress(res)
    return results


# -- --self: a target agent on a soft device, as a separate process ---------------------


def _loopback_pair() -> tuple[str, str]:
    a, b, c = secrets.randbelow(250) + 2, secrets.randbelow(250) + 2, secrets.randbelow(120) * 2 + 2
    return f"127.{a}.{b}.{c}", f"127.{a}.{b}.{c + 1}"


class SelfTarget:
    """``rdmakit conformance-target`` on a soft device, in a child process.

    At a 127.x address with the tester at the next, unless both addresses are
    given: two distinct local addresses of one family (IPv6: RoCEv2 Annex
    A17.4), each with its own UDP port 4791.
    """

    def __init__(self, tester_ip: str | None = None, dut_ip: str | None = None) -> None:
        if tester_ip is None or dut_ip is None:
            tester_ip, dut_ip = _loopback_pair()
        self.tester_ip, self.dut_ip = tester_ip, dut_ip
        secret = secrets.token_bytes(32)
        env = dict(os.environ, RDMAKIT_COMCH_SECRET=secret.hex())
        cmd = [sys.executable, "-m", "rdmakit", "conformance-target", "-d", f"soft-udp:{self.dut_ip}",
               "--listen", "tcp:127.0.0.1:0", "--once"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise ControlError(f"the target agent exited with status {self.proc.returncode}")
        ready = json.loads(line)
        sock = connect(parse_service(ready["control"]), max_msg_size=control.MAX_MSG, timeout=10)
        control.client_handshake(sock, secret)
        self.client = TargetClient(sock)

    def close(self) -> None:
        with contextlib.suppress(ControlError, TargetError, OSError):
            self.client.call("bye", timeout=5)
        self.client.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
