"""A file a user names is read through rdmakit.transport.user_files, and nowhere else.

Every place in rdmakit that opens a file by path is listed here with the
reason it is not such a file (a fixed system path, an output, a file it
created itself), or that it is the rule itself. A new place fails this test
until it either calls ``rdmakit.transport.user_files`` or is added below with
its reason; a place that goes away fails it too, so the list stays true.
"""

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rdmakit"

#: Calls that open a file by path: the builtin, ``os``/``io``, pathlib, ``json.load`` of a file object.
_MODULE_CALLS = {"os.open", "os.fdopen", "io.open", "json.load"}
_PATH_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes"}

#: (module, function, call) -> why this open is not of a file a user named (the count is per site).
ALLOWED: dict[tuple[str, str, str], tuple[int, str]] = {
    ("transport/user_files.py", "opened", "os.open"): (2, "the rule itself: the directory, then the file"),
    ("cli/about.py", "notice_pure_python", "os.open"): (1, "creates a marker (O_EXCL | O_NOFOLLOW)"),
    ("cli/bench.py", "_bench", ".write_text"): (1, "writes the --json-out report (an output)"),
    ("cli/bench_peer.py", "rss_bytes", "open"): (1, "/proc/self/statm, a fixed path"),
    ("cli/dma_files.py", "Destination.__init__", "os.open"): (2, "the destination's directory and new file"),
    ("cli/lifecycle.py", "_quiet_stdout", "os.open"): (1, "os.devnull"),
    ("cli/publishing.py", "open_output", "os.open"): (1, "an output (-w, --json-out): a regular file"),
    ("cli/publishing.py", "open_output", "os.fdopen"): (1, "the descriptor opened just before"),
    ("cli/publishing.py", "write_atomic", "os.fdopen"): (1, "the temporary file it created"),
    ("cli/status_files.py", "host_id", ".read_text"): (1, "/etc/machine-id, a fixed path"),
    ("cli/status_files.py", "boot_id", ".read_text"): (1, "/proc/sys/kernel/random/boot_id"),
    ("doca/_addresses.py", "local_broadcasts", "open"): (1, "/proc/net/fib_trie, a fixed path"),
    ("doca/descriptor.py", "write_descriptor", "os.fdopen"): (1, "the temporary file it created"),
    ("doca/shm.py", "_boot_id", ".read_text"): (1, "/proc/sys/kernel/random/boot_id"),
    ("doca/shm.py", "SharedMemory.from_file", "os.open"): (1, "an API: dma-copy maps the file it opened"),
    ("doca/soft.py", "_local_addresses", "open"): (2, "/proc/net/fib_trie and /proc/net/if_inet6"),
    ("transport/capture.py", "read_pcap", "open"): (1, "capture -r: frames to decode and print"),
    ("transport/comm_auth.py", "_create_default_key", "os.open"): (
        1,
        "creates the key (O_EXCL | O_NOFOLLOW)",
    ),
    ("testing/goodput.py", "main", "open"): (1, "writes the --json-out report (an output)"),
    ("testing/netem.py", "main", "open"): (1, "writes the --json-out report (an output)"),
    ("testing/netembed.py", "NetemBed.gid_index", ".read_text"): (2, "sysfs GIDs of its own rxe device"),
    ("testing/netembed.py", "NetemBed.rxe_counters", ".read_text"): (1, "sysfs counters of its rxe device"),
    ("testing/netem_report.py", "update", ".write_text"): (1, "rewrites --update's document (an output)"),
    ("testing/rcpeer.py", "write_json", ".write_text"): (1, "its own descriptor, into --dir (an output)"),
    ("testing/rcpeer.py", "responder", ".read_text"): (1, "the peer rcpeer's descriptor in --dir"),
    ("testing/rcpeer.py", "Requester.__init__", ".read_text"): (1, "the peer rcpeer's descriptor"),
    ("testing/rcpeer.py", "Side.counters", ".read_text"): (2, "sysfs netdev counters, softnet_stat"),
    ("transport/netmtu.py", "link_mtu", "open"): (1, "/sys/class/net/<interface>/mtu of a kernel name"),
    ("transport/in_use.py", "_udp_inodes", ".read_text"): (1, "/proc/net/udp and udp6, fixed paths"),
    ("transport/in_use.py", "udp_holders", ".read_bytes"): (1, "/proc/<pid>/cmdline of a socket's holder"),
    ("verbs/sysfs.py", "_read", "os.open"): (1, "sysfs attributes of a device found by name"),
}


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return "open" if f.id == "open" else None
    if not isinstance(f, ast.Attribute):
        return None
    if isinstance(f.value, ast.Name) and f"{f.value.id}.{f.attr}" in _MODULE_CALLS:
        return f"{f.value.id}.{f.attr}"
    if f.attr in _PATH_METHODS:
        return f".{f.attr}"
    first = node.args[0] if node.args else None
    if f.attr == "open" and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return ".open"  # Path.open("rb"): a mode string, not Dev.open(spec)
    return None


def _sites() -> Counter[tuple[str, str, str]]:
    found: Counter[tuple[str, str, str]] = Counter()
    for path in sorted(ROOT.rglob("*.py")):
        module = str(path.relative_to(ROOT))

        def walk(node: ast.AST, scope: list[str], module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    walk(child, [*scope, child.name])
                    continue
                if isinstance(child, ast.Call) and (name := _call_name(child)) is not None:
                    found[(module, ".".join(scope) or "<module>", name)] += 1
                walk(child, scope)

        walk(ast.parse(path.read_text(), str(path)), [])
    return found


def test_only_the_listed_places_open_files_by_path() -> None:
    found = _sites()
    expected = Counter({site: count for site, (count, _why) in ALLOWED.items()})
    new = found - expected
    gone = expected - found
    assert not new, f"opens a file by path outside rdmakit.transport.user_files: {sorted(new)}"
    assert not gone, f"listed but no longer there (remove them from ALLOWED): {sorted(gone)}"


def test_the_detector_sees_each_kind_of_open() -> None:
    """The detector itself: each form it must catch, and forms it must leave alone."""
    code = """
def f(p, dev, mac):
    open(p)
    os.open(p, 0)
    io.open(p)
    json.load(fh)
    p.read_text()
    p.read_bytes()
    p.open("rb")
    Dev.open(dev)
    mac.open(data, tag)
"""
    calls = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)]
    names = [_call_name(c) for c in calls]
    assert [n for n in names if n] == [
        "open",
        "os.open",
        "io.open",
        "json.load",
        ".read_text",
        ".read_bytes",
        ".open",
    ]
