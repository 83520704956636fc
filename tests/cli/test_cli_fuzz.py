"""Argument vectors a careless user could type, for every subcommand: never a traceback.

Hypothesis builds argument vectors from each subcommand's flags with hostile
values (negative, huge and malformed numbers, empty strings, missing files,
FIFOs, directories, devices, garbage JSON) and runs the program in-process
through ``main(argv)`` with short timeouts; a smaller sample runs as separate
processes. Every run must end with a documented exit status (0 ok, 1 error,
2 usage, 3 timeout) and print no Python traceback; an error (1, 3) ends with
one line naming the program.

Not generated: a FIFO for ``capture -r``/``-w`` (opening a named FIFO waits
for its other end, as ``cat`` does: the user asked for it), and paths outside
the test's directory for files a program writes.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmakit.cli.main import main
from rdmakit.cli.samples import SAMPLES

DOCUMENTED = {0, 1, 2, 3}

NUMBERS = st.one_of(
    st.integers(-(1 << 70), 1 << 70).map(str),
    st.sampled_from(
        [
            "",
            "-1",
            "0",
            "1",
            "nan",
            "inf",
            "-inf",
            "1e999",
            "0x",
            "0xffffffffffffffff",
            str(1 << 64),
            "-0",
            " 3",
            "1_0",
            "٣",
            "0b102",
            "--",
        ]
    ),
    st.text(max_size=6),
)
PCAP_MAGIC = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
TIMEOUTS = st.sampled_from(["0.05", "0.2", "-1", "0", "nan", "inf", "1e999", "", "x", "-0", "1e-300"])
TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=24)
LEVELS = st.sampled_from(["10", "20", "40", "60", "70", "99", "-1", "x", ""])


@dataclass
class Place:
    """A directory of hostile files, and fresh names in it."""

    root: Path
    count: int = 0

    def fresh(self) -> str:
        self.count += 1
        return str(self.root / f"new{self.count}.json")

    def path(self, kind: str, readable_only: bool) -> str:
        if kind == "fresh":
            return self.fresh()
        if kind == "/dev/zero" and not readable_only:
            return self.fresh()
        return {
            "missing": str(self.root / "missing.json"),
            "fifo": str(self.root / "fifo"),
            "dir": str(self.root / "dir"),
            "/dev/zero": "/dev/zero",
            "empty-path": "",
            "missing-dir": str(self.root / "nowhere" / "x.json"),
            "garbage": str(self.root / "garbage.json"),
            "empty": str(self.root / "empty.json"),
            "huge": str(self.root / "huge.json"),
            "json-list": str(self.root / "list.json"),
            "json-bad-values": str(self.root / "bad-values.json"),
        }[kind]


PATH_KINDS = st.sampled_from(
    [
        "fresh",
        "missing",
        "fifo",
        "dir",
        "/dev/zero",
        "empty-path",
        "missing-dir",
        "garbage",
        "empty",
        "huge",
        "json-list",
        "json-bad-values",
    ]
)


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    root = tmp_path_factory.mktemp("fuzz")
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    (root / "garbage.json").write_bytes(b"\xff\xfe{not json")
    (root / "empty.json").write_bytes(b"")
    with (root / "huge.json").open("wb") as f:
        f.truncate(1 << 30)
    (root / "list.json").write_text("[1, 2]")
    (root / "bad-values.json").write_text(
        json.dumps({"timeout": "-1", "device": 5, "log-level": 99, "interactive": "yes", "op": "x"})
    )
    return Place(root)


Option = tuple[str, Callable[[Place], st.SearchStrategy[list[str]]]]


def flag(name: str) -> Option:
    return name, lambda _p: st.just([name])


def valued(name: str, values: st.SearchStrategy[str]) -> Option:
    return name, lambda _p: values.map(lambda v: [name, v])


def path_opt(name: str, *, writes: bool = False) -> Option:
    return name, lambda p: PATH_KINDS.map(lambda k: [name, p.path(k, readable_only=not writes)])


def devices(ips: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(ips),
        st.sampled_from(ips).map(lambda ip: "tcp:" + ip),
        st.sampled_from(
            ["", "nowhere", "rxe0", "mlx5_9", "tcp:", "udp:", "::1", "256.1.1.1", "tcp:x:1", "10.250.1.1"]
        ),
    )


def sample_options(name: str, ips: list[str]) -> list[Option]:
    extras = SAMPLES[name][2]
    opts = [
        valued("-d", devices(ips)), path_opt("-ld", writes=True), path_opt("-re"),
        path_opt("-m", writes=True), valued("-g", NUMBERS), valued("-s", TEXT), valued("-r", TEXT),
        valued("-w", TEXT), flag("--interactive"), flag("--allow-foreign-descriptors"),
        valued("-l", LEVELS), path_opt("--json"),
    ]  # fmt: skip
    if "imm" in extras:
        opts.append(valued("--immediate", NUMBERS))
    if "atomic" in extras:
        opts += [valued("--op", st.sampled_from(["cas", "faa", "", "add"])), valued("--compare", NUMBERS),
                 valued("--swap", NUMBERS), valued("--add", NUMBERS)]  # fmt: skip
    if "initial" in extras:
        opts.append(valued("--initial", NUMBERS))
    return opts


def command_table(ips: list[str]) -> dict[str, tuple[list[Option], list[str]]]:
    """Per subcommand: its options, and arguments always given (short waits, safe places)."""
    table: dict[str, tuple[list[Option], list[str]]] = {
        name: (sample_options(name, ips), []) for name in SAMPLES
    }
    table["devices"] = (
        [
            flag("--json"),
            flag("--verbose"),
            valued("-l", LEVELS),
            ("name", lambda _p: TEXT.map(lambda t: [t])),
        ],
        [],
    )
    table["capture"] = (
        [path_opt("-w", writes=True), valued("-c", NUMBERS), valued("--duration", NUMBERS),
         valued("--port", NUMBERS), flag("-q"), valued("-l", LEVELS),
         ("-r", lambda p: st.sampled_from(["missing", "dir", "/dev/zero", "garbage", "empty", "huge",
                                           "empty-path"]).map(lambda k: ["-r", p.path(k, True)]))],
        ["--duration", "0.2"],
    )  # fmt: skip
    # Both refuse bad values before running; they are never run in full here (that takes seconds).
    table["demo"] = (
        [valued("--max-size", NUMBERS), valued("--timeout", TIMEOUTS), valued("--seed", NUMBERS),
         valued("--transport", st.sampled_from(["udp", "tcp", "rdma"])), valued("-l", LEVELS)],
        ["--max-size", "0"],
    )  # fmt: skip
    table["bench"] = (
        [valued("--runs", NUMBERS), valued("--total", NUMBERS), valued("--pings", NUMBERS),
         valued("--window", NUMBERS), valued("--spin-us", NUMBERS), valued("--ip-a", TEXT),
         valued("--ip-b", TEXT)],
        ["--runs", "0"],
    )  # fmt: skip
    dma_common = [valued("-p", TEXT), valued("-l", LEVELS), valued("-t", TEXT)]
    table["dma-local-copy"] = (
        [*dma_common, valued("--num-src-buf", NUMBERS), valued("--num-dst-buf", NUMBERS)],
        [],
    )
    return table


def vectors(place: Place, ips: list[str]) -> st.SearchStrategy[tuple[str, list[str]]]:
    table = command_table(ips)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, list[str]]:
        name = draw(st.sampled_from(sorted(table)))
        options, always = table[name]
        chosen = draw(st.lists(st.sampled_from(options), max_size=6, unique_by=lambda o: o[0]))
        argv = [name]
        for _flag, values in chosen:
            argv += draw(values(place))
        if name in SAMPLES:
            argv += ["--timeout", draw(TIMEOUTS)]
        return name, argv + always

    return st.one_of(
        build(),
        st.lists(TEXT, max_size=4).map(lambda a: ("", a)),  # anything at all on the top level
    )


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    stdin = sys.stdin
    sys.stdin = io.StringIO("")  # as < /dev/null
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        sys.stdin = stdin


def check(name: str, argv: list[str], status: int, err: str) -> None:
    assert status in DOCUMENTED, (argv, status, err)
    assert "Traceback" not in err, (argv, err)
    if status in (1, 3):
        last = err.rstrip("\n").splitlines()[-1] if err.strip() else ""
        assert last.startswith(f"rdmakit {name}:" if name else "rdmakit"), (argv, err)


@pytest.fixture(scope="module")
def ips(ip_source: Callable[[], str]) -> list[str]:
    return [ip_source() for _ in range(3)]


@pytest.mark.timeout(900)
def test_no_argument_vector_gives_a_traceback(place: Place, ips: list[str]) -> None:
    @settings(
        max_examples=250, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )  # fmt: skip
    @given(vectors(place, ips))
    def run(case: tuple[str, list[str]]) -> None:
        name, argv = case
        with captured() as (_out, err):
            status = main(argv)
        check(name, argv, status, err.getvalue())
        leftovers = {p.name for p in place.root.iterdir()} - {
            "fifo", "dir", "garbage.json", "empty.json", "huge.json", "list.json", "bad-values.json"
        }  # fmt: skip
        if name == "capture" and status == 0 and "-w" in argv and "-r" not in argv:
            product = Path(argv[argv.index("-w") + 1])  # a live capture's pcap is its output
            assert product.name in leftovers, argv
            assert product.read_bytes()[:4] in PCAP_MAGIC, argv
            leftovers.discard(product.name)
            product.unlink()
        for left in leftovers:  # so that shrinking blames the vector that left it, not the next
            (place.root / left).unlink()
        assert not leftovers, (argv, leftovers)

    run()


@pytest.mark.timeout(900)
def test_no_argument_vector_gives_a_traceback_as_a_process(place: Place, ips: list[str]) -> None:
    @settings(
        max_examples=12, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )  # fmt: skip
    @given(vectors(place, ips))
    def run(case: tuple[str, list[str]]) -> None:
        name, argv = case
        p = subprocess.run(
            [sys.executable, "-m", "rdmakit", *argv], stdin=subprocess.DEVNULL, capture_output=True,
            text=True, errors="replace", timeout=120, check=False,
        )  # fmt: skip
        check(name, argv, p.returncode, p.stderr)

    run()
