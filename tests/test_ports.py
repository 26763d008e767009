"""kill_port_holders and port_status against real listeners on 127.0.0.1 and ::1.

Every listener, client and torchrun job here is spawned by the test and cleaned up through its
psutil handle. No socket leaves loopback: listeners bind 127.0.0.1/::1, clients connect there, and
port_status's test bind never calls listen().
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.models import Verdict
from remote_gpu_trainer.processes import netlink, sockets
from remote_gpu_trainer.processes.netlink import port_ranges
from remote_gpu_trainer.processes.ports import bind_test, parse_port_specs
from remote_gpu_trainer.processes.sockets import decode_address, parse_proc_net, read_sockets
from remote_gpu_trainer.processes.tool import SPECS

from .conftest import ROOT, call_error, call_ok
from .test_safekill import Spawner, gone

KILL = next(s for s in SPECS if s.name == "kill_port_holders")
STATUS = next(s for s in SPECS if s.name == "port_status")
MARKER = "--rgt-test-listener"

LISTENER = """
import os, signal, socket, subprocess, sys, time
host, port, forks, spawns, ignore = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind((host, port))
sock.listen()
if ignore == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
words = [f"port={sock.getsockname()[1]}"]
for _ in range(forks):  # forked children inherit the listening socket: several holders of one socket
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    words.append(f"pid={pid}")
for _ in range(spawns):  # a subprocess child does not hold the socket but belongs to the tree
    words.append(f"pid={subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']).pid}")
print("ready", *words, flush=True)
time.sleep(600)
"""

CLIENT = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
time.sleep(600)
"""


class Listener:
    def __init__(self, proc: subprocess.Popen, words: list[str]):
        self.proc = proc
        self.pid = proc.pid
        self.port = next(int(w[5:]) for w in words if w.startswith("port="))
        self.children = [int(w[4:]) for w in words if w.startswith("pid=")]


class Net(Spawner):
    def listen(self, host: str = "127.0.0.1", port: int = 0, *, forks: int = 0, spawns: int = 0,
               ignore_term: bool = False, executable: str = sys.executable, user: int | None = None) -> Listener:
        proc, words = self.python(LISTENER, host, str(port), str(forks), str(spawns), "1" if ignore_term else "0",
                                  MARKER, executable=executable, user=user)
        return Listener(proc, words)

    def connect(self, host: str, port: int) -> subprocess.Popen:
        return self.python(CLIENT, host, str(port))[0]


@pytest.fixture
def net():
    spawner = Net()
    yield spawner
    spawner.cleanup()


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def kill(**arguments):
    return KILL.call(arguments)


def confirm(ports, **arguments):
    """Dry run, then the real run with its token (what an agent does after the user agrees)."""
    dry = kill(ports=ports, **arguments)
    assert dry.confirm_token, dry.summary
    return kill(ports=ports, dry_run=False, confirm_token=dry.confirm_token, **arguments)


def free_port_below_ephemeral() -> int:
    """A free port below the usual ephemeral range; a random start keeps concurrent runs apart."""
    start = random.randrange(20000, 28000)
    for port in range(start, start + 500):
        status = STATUS.call({"port": port})
        if status.free and not status.in_ephemeral_range:
            return port
    pytest.skip(f"no free port in {start}-{start + 499}")


# ------------------------------------------------------------------ parsing (pure)

PROC_NET_TCP = b"""  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:733C 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000 100 0 0 10 0
   1: 0100007F:C350 0100007F:733C 01 00000000:00000000 00:00000000 00000000  1001        0 4343 1 0000 20 4 30 10 -1
   2: 0100007F:733C 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 0 1 0000 20 4 30 10 -1
   3: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000 100 0 0 10 0
"""
PROC_NET_TCP6 = (b"  sl  local_address                         remote_address                        st tx_queue "
                 b"rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
                 b"   0: 00000000000000000000000001000000:733C 00000000000000000000000000000000:0000 0A "
                 b"00000000:00000000 00:00000000 00000000     0        0 5151 1 0000 100 0 0 10 0\n")


@pytest.mark.skipif(sys.byteorder != "little", reason="sample rows were captured on a little-endian host")
def test_proc_net_rows_are_decoded_and_filtered_by_local_listening_port():
    rows = parse_proc_net(PROC_NET_TCP, "tcp", "ipv4", frozenset({29500}))
    assert [(r.local, r.state, r.uid, r.inode) for r in rows] == [("127.0.0.1:29500", "LISTEN", 1000, 4242)]
    # Clients whose *remote* port is 29500 only with match_remote; accepted sockets by local port.
    everything = parse_proc_net(PROC_NET_TCP, "tcp", "ipv4", frozenset({29500}), listening_only=False,
                                match_remote=True)
    assert [(r.local, r.remote, r.state) for r in everything] == [
        ("127.0.0.1:29500", None, "LISTEN"),
        ("127.0.0.1:50000", "127.0.0.1:29500", "ESTABLISHED"),
        ("127.0.0.1:29500", "127.0.0.1:50000", "ESTABLISHED"),
    ]
    [v6] = parse_proc_net(PROC_NET_TCP6, "tcp", "ipv6", frozenset({29500}))
    assert (v6.local, v6.family, v6.inode) == ("[::1]:29500", "ipv6", 5151)
    assert parse_proc_net(PROC_NET_TCP, "tcp", "ipv4", frozenset({29501})) == []


def test_port_ranges_and_oversized_filters():
    assert port_ranges([7, 1, 2, 3, 3]) == [(1, 3), (7, 7)]
    program = netlink.bytecode([(1, 3), (7, 7)], source=True, dest=True)
    assert len(program) == 4 * 20 - 4  # four tests, three jumps
    assert netlink.bytecode([]) is None
    assert netlink.bytecode([(p, p) for p in range(1, 20000, 2)]) is None  # beyond 16-bit jumps: filter in Python


def netlink_works() -> bool:
    try:
        netlink.dump(socket.AF_INET, socket.IPPROTO_TCP, netlink.TCPF_LISTEN, None)
        return True
    except netlink.NetlinkUnavailable:
        return False


@pytest.mark.skipif(not netlink_works(), reason="netlink sock_diag refused here")
def test_netlink_and_proc_net_see_the_same_sockets(net):
    a = net.listen("127.0.0.1")
    b = net.listen("127.0.0.1")
    ports = [a.port, b.port, b.port + 1]
    if has_ipv6_loopback():
        net.listen("::1", a.port)
    net.connect("127.0.0.1", b.port)
    with socket.socket(type=socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        ports.append(udp.getsockname()[1])

        def seen(backend, **kw):
            rows = read_sockets(ports, ("tcp", "udp"), backend=backend, **kw)
            return sorted((r.proto, r.family, r.local, r.remote or "", r.state, r.uid, r.inode) for r in rows)

        for kw in ({}, {"listening_only": False, "match_remote": True}):
            assert seen("netlink", **kw) == seen("proc", **kw)
        assert {r[4] for r in seen("netlink")} == {"LISTEN", "UNCONN"}
        assert "ESTABLISHED" in {r[4] for r in seen("netlink", listening_only=False, match_remote=True)}


def test_proc_net_is_the_fallback_when_netlink_is_refused(net, monkeypatch):
    holder = net.listen("127.0.0.1")

    def refuse(*_args):
        raise netlink.NetlinkUnavailable("refused by a test")

    monkeypatch.setattr(netlink, "dump", refuse)
    [row] = read_sockets([holder.port])
    assert row.local == f"127.0.0.1:{holder.port}"
    with pytest.raises(netlink.NetlinkUnavailable):
        read_sockets([holder.port], backend="netlink")


def test_unreadable_socket_tables_are_unknown_never_free(monkeypatch, tmp_path):
    def refuse(*_args):
        raise netlink.NetlinkUnavailable("refused by a test")

    monkeypatch.setattr(netlink, "dump", refuse)
    monkeypatch.setattr(sockets, "PROC_NET", tmp_path / "no-such-dir")
    result = kill(ports=[29500])
    assert result.verdict is Verdict.UNKNOWN and not result.executed and "Could not inspect" in result.summary
    status = STATUS.call({"port": 29500})
    assert status.verdict is Verdict.UNKNOWN and status.free is False


def test_address_decoding_matches_the_kernel_layout():
    packed = socket.inet_pton(socket.AF_INET6, "fe80::1:2")
    kernel_text = b"".join(b"%08X" % int.from_bytes(packed[i:i + 4], sys.byteorder) for i in range(0, 16, 4))
    assert decode_address(kernel_text) == "fe80::1:2"
    assert decode_address(b"%08X" % int.from_bytes(bytes([10, 1, 2, 3]), sys.byteorder)) == "10.1.2.3"


@pytest.mark.parametrize(("items", "ports"), [
    ([29500], [29500]),
    (["29500-29502", 29500, "29510,29511"], [29500, 29501, 29502, 29510, 29511]),
    (["1", "65535"], [1, 65535]),
])
def test_port_specs(items, ports):
    assert parse_port_specs(items) == ports


@pytest.mark.parametrize(("items", "message"), [
    ([0], "out of range"), ([70000], "out of range"), (["abc"], "not a port"), (["29510-29500"], "reversed"),
    (["1-2000"], "at most 1024"), ([], "at least one"), (["-5"], "not a port"), ([" , "], "empty"),
    (["1-1024", "2000-3023", "4000-5023", "6000-7023", "8000-8001"], "at most 4096"),
])
def test_bad_port_specs(items, message):
    with pytest.raises(ValueError, match=message):
        parse_port_specs(items)


@pytest.mark.anyio
@pytest.mark.parametrize(("arguments", "expected"), [
    ({"ports": [0]}, "port 0 is out of range"),
    ({"ports": [70000]}, "port 70000 is out of range"),
    ({"ports": ["abc"]}, "'abc' is not a port or range"),
    ({"ports": ["29510-29500"]}, "reversed: write 29500-29510"),
    ({"ports": []}, "ports"),
    ({"ports": [True]}, "true/false is not a port"),
    ({"ports": [29500], "grace_s": 1000}, "grace_s"),
    ({"ports": [29500], "signal": "HUP"}, "'TERM' or 'KILL'"),
    ({"ports": [29500], "name_pattern": "("}, "not a valid regular expression"),
    ({"ports": [29500], "min_pid": 1}, "min_pid"),
    ({"ports": [29500], "confirm_token": "nonsense", "dry_run": False}, "confirm_token"),
])
async def test_bad_input_is_a_tool_error_naming_the_field(client, arguments, expected):
    text = await call_error(client, "kill_port_holders", arguments)
    assert expected in text
    assert "Traceback" not in text


@pytest.mark.anyio
@pytest.mark.parametrize("port", [0, 70000, "abc"])
async def test_port_status_rejects_bad_port(client, port):
    assert "port" in await call_error(client, "port_status", {"port": port})


# ------------------------------------------------------------------ real listeners


def test_dry_run_lists_ipv4_and_ipv6_listeners_and_kills_nothing(net):
    v4 = net.listen("127.0.0.1")
    holders = {v4.pid}
    families = {"ipv4"}
    if has_ipv6_loopback():
        holders.add(net.listen("::1", v4.port).pid)
        families.add("ipv6")
    result = kill(ports=[v4.port])
    assert result.dry_run and not result.executed
    assert result.verdict is Verdict.WARN and result.ports_held == [v4.port]
    assert {s.family for s in result.sockets} == families
    assert {pid for s in result.sockets for pid in s.pids} == holders
    assert all(s.state == "LISTEN" and s.owner == "visible" for s in result.sockets)
    targets = {t.pid: t for t in result.targets}
    assert set(targets) == holders
    for target in targets.values():
        assert target.action == "would_signal" and target.user and target.ppid == os.getpid()
        assert f":{v4.port} LISTEN" in target.why and MARKER in target.command
    assert result.confirm_token and "--confirm-token" in result.next_step
    time.sleep(0.2)
    assert all(psutil.pid_exists(pid) and not gone(pid, 0) for pid in holders)


def test_confirmed_kill_frees_the_port(net):
    first = net.listen("127.0.0.1")
    holders = [first.pid] + ([net.listen("::1", first.port).pid] if has_ipv6_loopback() else [])
    result = confirm([first.port])
    assert result.executed and result.verdict is Verdict.PASS
    assert {t.outcome for t in result.targets} == {"exited_after_term"}
    assert [(a.port, a.free) for a in result.after] == [(first.port, True)]
    assert all(gone(pid) for pid in holders)
    assert bind_test(first.port)[0]


def test_stale_token_is_refused_after_the_holder_restarted(net):
    old = net.listen("127.0.0.1")
    token = kill(ports=[old.port]).confirm_token
    old.proc.terminate()
    old.proc.wait(timeout=5)
    new = net.listen("127.0.0.1", old.port)  # "the job restarted" on the same port
    result = kill(ports=[old.port], dry_run=False, confirm_token=token)
    assert not result.executed and result.verdict is Verdict.FAIL
    assert any(f"pid {new.pid}" in problem for problem in result.token_problems)
    assert result.confirm_token != token
    time.sleep(0.2)
    assert new.proc.poll() is None


def test_parent_and_children_are_all_stopped_children_first(net):
    parent = net.listen("127.0.0.1", forks=2, spawns=1)
    forked, spawned = parent.children[:2], parent.children[2]
    result = kill(ports=[parent.port])
    [row] = result.sockets
    assert set(row.pids) == {parent.pid, *forked}  # one socket, three holders
    order = [t.pid for t in result.targets]
    assert set(order) == {parent.pid, *forked, spawned}
    assert order[-1] == parent.pid  # the parent goes last
    assert next(t for t in result.targets if t.pid == spawned).why == f"child of holder {parent.pid}"
    done = kill(ports=[parent.port], dry_run=False, confirm_token=result.confirm_token)
    assert done.verdict is Verdict.PASS
    assert all(gone(pid) for pid in order)


def test_sigterm_ignoring_holder_needs_the_kill_escalation(net):
    stubborn = net.listen("127.0.0.1", ignore_term=True)
    term = confirm([stubborn.port], grace_s=0.5)
    assert term.verdict is Verdict.FAIL
    assert term.targets[0].outcome == "survived_term"
    assert term.after[0].free is False and term.after[0].holders == [stubborn.pid]
    assert "signal=KILL" in term.next_step
    assert stubborn.proc.poll() is None

    killed = confirm([stubborn.port], grace_s=0.5, signal="KILL")
    assert killed.verdict is Verdict.PASS
    assert killed.targets[0].outcome == "exited_after_kill"
    assert stubborn.proc.wait(timeout=5) == -signal.SIGKILL


@pytest.mark.anyio
async def test_the_calling_process_is_never_touched_even_when_it_holds_the_port(client):
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        port = mine.getsockname()[1]
        dry = await call_ok(client, "kill_port_holders", {"ports": [port]})
        [target] = dry["targets"]
        assert (target["pid"], target["refusal"]) == (os.getpid(), "self")
        assert dry["confirm_token"] is None and dry["verdict"] == "FAIL"
        real = await call_ok(client, "kill_port_holders", {"ports": [port], "dry_run": False, "signal": "KILL"})
        assert not real["executed"]
        assert mine.getsockname()[1] == port  # still ours, still listening
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


def test_the_parent_of_the_cli_is_never_touched():
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        port = mine.getsockname()[1]
        for extra in ([], ["--no-dry-run", "--signal", "KILL"]):
            out = subprocess.run([sys.executable, "-m", "remote_gpu_trainer", "ports", str(port), *extra, "--json"],
                                 capture_output=True, text=True, timeout=120, cwd=ROOT)
            assert out.returncode == 1, out.stderr
            data = json.loads(out.stdout)
            assert [(t["pid"], t["refusal"]) for t in data["targets"]] == [(os.getpid(), "ancestor")]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


def test_min_pid_and_name_filters_narrow_the_holders(net):
    holder = net.listen("127.0.0.1")
    skipped = kill(ports=[holder.port], min_pid=holder.pid + 1)
    assert skipped.targets == [] and skipped.confirm_token is None
    assert [(s.pid, s.reason) for s in skipped.skipped] == [(holder.pid, f"pid below min_pid {holder.pid + 1}")]
    assert skipped.verdict is Verdict.FAIL  # the port stays held
    assert [t.pid for t in kill(ports=[holder.port], min_pid=holder.pid).targets] == [holder.pid]

    assert kill(ports=[holder.port], name_pattern="no-such-job").targets == []
    assert [t.pid for t in kill(ports=[holder.port], name_pattern="rgt-test-listen").targets] == [holder.pid]
    assert [t.pid for t in kill(ports=[holder.port], only_current_user=True).targets] == [holder.pid]


@pytest.mark.parametrize("name", ["sshd", "docker-proxy", "kubelet"])
def test_protected_process_names_are_refused(net, tmp_path, name):
    fake = tmp_path / name
    fake.symlink_to(Path(sys.executable).resolve())  # comm becomes the link's name
    holder = net.listen("127.0.0.1", executable=str(fake))
    assert psutil.Process(holder.pid).name() == name
    result = kill(ports=[holder.port])
    [target] = result.targets
    assert (target.action, target.refusal) == ("refused", "protected")
    assert name in target.detail and result.confirm_token is None
    real = kill(ports=[holder.port], dry_run=False)
    assert not real.executed and holder.proc.poll() is None


def test_clients_are_left_alone_unless_include_connected(net):
    server = net.listen("127.0.0.1")
    client = net.connect("127.0.0.1", server.port)
    listeners_only = kill(ports=[server.port])
    assert [t.pid for t in listeners_only.targets] == [server.pid]
    assert {s.state for s in listeners_only.sockets} == {"LISTEN"}
    with_clients = kill(ports=[server.port], include_connected=True)
    targets = {t.pid: t for t in with_clients.targets}
    assert set(targets) == {server.pid, client.pid}
    assert "connected to the port" in targets[client.pid].why
    # The server's not-yet-accepted end of the connection has no file: the kernel holds it.
    assert any(s.owner == "kernel" for s in with_clients.sockets)


def test_port_status_free_then_held_with_a_suggestion_and_launch_flags(net):
    port = free_port_below_ephemeral()
    free = STATUS.call({"port": port})
    assert free.verdict is Verdict.PASS and free.bind_ok and free.suggested_port == port
    assert any(a.use == "--standalone" for a in free.advice)

    holder = net.listen("127.0.0.1", port)
    held = STATUS.call({"port": port})
    assert held.verdict is Verdict.FAIL and not held.free and not held.bind_ok
    assert [h.pid for h in held.holders] == [holder.pid]
    assert held.suggested_port and held.suggested_port > port and bind_test(held.suggested_port)[0]
    assert any(a.use == f"--master-port={held.suggested_port}" for a in held.advice)
    assert f"rgt ports {port}" in held.next_step


def test_ephemeral_port_is_flagged(net):
    holder = net.listen("127.0.0.1")  # port 0: the kernel picks from the ephemeral range
    holder.proc.terminate()
    holder.proc.wait(timeout=5)
    status = STATUS.call({"port": holder.port})
    if status.free:
        assert status.in_ephemeral_range and status.verdict is Verdict.WARN
        assert status.suggested_port != holder.port


def test_cli_ports_and_port_status(net, capsys):
    holder = net.listen("127.0.0.1")
    assert cli.main(["ports", str(holder.port)]) == 0  # WARN: holders found, nothing done
    out = capsys.readouterr().out
    assert "DRY RUN" in out and str(holder.pid) in out and "confirm_token: rgt1." in out
    assert cli.main(["port-status", str(holder.port)]) == 1
    assert "is held" in capsys.readouterr().out
    assert cli.main(["ports", "70000"]) == 2
    assert "port 70000 is out of range" in capsys.readouterr().err
    assert holder.proc.poll() is None


def test_the_suggested_confirm_command_runs_as_is(net, capsys):
    holder = net.listen("127.0.0.1")
    dry = kill(ports=[str(holder.port)], name_pattern="rgt-test-listen", grace_s=5, min_pid=2)
    command = dry.next_step.split("`")[1]
    argv = shlex.split(command)
    assert argv[:2] == ["rgt", "ports"] and "--confirm-token" in argv
    assert cli.main(argv[1:]) == 0
    assert "exited_after_term" in capsys.readouterr().out
    assert gone(holder.pid)


# ------------------------------------------------------------------ other users (needs root to set up)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
NOBODY = 65534


def python_for_nobody() -> str:
    """A Python 3.11 interpreter the unprivileged user may execute (ours may live under /root)."""
    for candidate in (str(Path(sys.executable).resolve()), "/usr/bin/python3.11", "/usr/local/bin/python3.11"):
        try:
            ok = subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 11)"],
                                user=NOBODY, cwd="/", capture_output=True, timeout=30).returncode == 0
        except OSError:
            ok = False
        if ok:
            return candidate
    pytest.skip("no Python 3.11 interpreter executable by an unprivileged user")


@needs_root
def test_other_users_holder_is_refused_unless_root_allows_it(net):
    theirs = net.listen("127.0.0.1", executable=python_for_nobody(), user=NOBODY)
    refused = kill(ports=[theirs.port])
    assert [(t.pid, t.refusal) for t in refused.targets] == [(theirs.pid, "other_user")]
    assert "allow_other_users" in refused.targets[0].detail
    mine_only = kill(ports=[theirs.port], only_current_user=True)
    assert mine_only.targets == [] and [s.pid for s in mine_only.skipped] == [theirs.pid]
    done = confirm([theirs.port], allow_other_users=True)
    assert done.verdict is Verdict.PASS and gone(theirs.pid)


@needs_root
def test_invisible_owner_means_the_port_is_not_free(tmp_path):
    # root holds the port; an unprivileged user looks at it and cannot see the owner.
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        port = mine.getsockname()[1]
        code = ("import json, sys; sys.path.insert(0, sys.argv[2]); "
                "from remote_gpu_trainer.processes.tool import SPECS; "
                "kill, status = SPECS; port = int(sys.argv[1]); "
                "print(json.dumps([status.call({'port': port}).model_dump(mode='json'), "
                "kill.call({'ports': [port]}).model_dump(mode='json')]))")
        out = subprocess.run([python_for_nobody(), "-c", code, str(port), str(ROOT / "tools")],
                             capture_output=True, text=True, timeout=120, user=NOBODY, cwd="/",
                             env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path[1:])})
        if out.returncode != 0 and "ModuleNotFoundError" in out.stderr:
            pytest.skip(f"the unprivileged user cannot import the environment: {out.stderr[-200:]}")
        assert out.returncode == 0, out.stderr
        status, killed = json.loads(out.stdout)
    assert status["free"] is False and status["verdict"] == "FAIL"
    [row] = [s for s in status["sockets"] if s["state"] == "LISTEN"]
    assert row["owner"] == "invisible" and row["pids"] == [] and "NOT free" in row["note"]
    assert "uid 0" in row["note"]
    assert killed["verdict"] == "FAIL" and killed["targets"] == [] and killed["sockets"][0]["owner"] == "invisible"


# ------------------------------------------------------------------ a real torchrun job

WORKER = "import time\nprint('worker up', flush=True)\ntime.sleep(600)\n"


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not installed")
def test_real_torchrun_agent_and_workers_are_one_group(net, tmp_path):
    port = free_port_below_ephemeral()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    agent = subprocess.Popen([shutil.which("torchrun"), "--nproc-per-node=2", f"--master-port={port}", str(script)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    net.popens.append(agent)
    net.handles.append(psutil.Process(agent.pid))
    deadline = time.monotonic() + 90
    result = kill(ports=[port])
    while time.monotonic() < deadline and len(result.targets) < 3:
        assert agent.poll() is None, "torchrun exited early"
        time.sleep(0.3)
        result = kill(ports=[port])
    net.handles += [psutil.Process(t.pid) for t in result.targets if t.pid != agent.pid]
    by_pid = {t.pid: t for t in result.targets}
    assert by_pid[agent.pid].launcher == "torchrun"
    workers = [pid for pid in by_pid if pid != agent.pid]
    assert len(workers) == 2
    assert all(by_pid[pid].torchrun_group == agent.pid for pid in by_pid)
    assert [t.pid for t in result.targets][-1] == agent.pid  # workers first
    assert all(by_pid[pid].why == f"worker in the torchrun tree of pid {agent.pid}" for pid in workers)
    done = kill(ports=[port], dry_run=False, confirm_token=result.confirm_token, grace_s=30)
    assert done.verdict is Verdict.PASS, done.summary
    assert {t.torchrun_group for t in done.targets} == {agent.pid}  # described before the kill
    assert all(gone(pid) for pid in by_pid)
    agent.wait(timeout=30)


def test_catalog_references_exist():
    from remote_gpu_trainer.processes import tool

    refs = [value for name, value in vars(tool).items() if name.startswith("REF_")]
    assert len(refs) == 4
    for ref in refs:
        text = (ROOT / ref.file).read_text()
        assert f"### {ref.id} " in text, f"{ref.file} has no entry {ref.id}"
