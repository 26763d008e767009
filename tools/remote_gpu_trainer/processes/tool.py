"""The ``kill_port_holders`` and ``port_status`` tools (``rgt ports``, ``rgt port-status``).

Glue only: discovery lives in sockets.py/ports.py, the kill rules in safekill.py and its modules.
What this module adds is the port-specific policy:

* targets are the processes holding a *listening* socket on the ports (clients that merely
  connect are left alone unless ``include_connected``), narrowed by the caller's filters;
* a holder inside a launcher tree (torchrun & co.) brings its launcher and all the launcher's
  descendants along, and any holder brings its own descendants (DataLoader workers hold the GPU);
  refused holders are never expanded, so a protected process cannot drag its children in;
* after a real run, each port is scanned again and reported free or still held, by whom, and
  whether the new holder appeared after the kill (a supervisor restarting the job).
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from ..errors import InputError
from ..models import EntryRef, StrictModel, Verdict
from ..tables import format_table
from ..toolspec import Progress, ToolSpec, cli_host_args, exit_1_on_fail
from .fingerprint import parse_token
from .launchers import find_launcher, launcher_kind
from .ports import (
    PORT_SPEC_HELP,
    PortScan,
    bind_test,
    ephemeral_range,
    in_ephemeral_range,
    invisible_note,
    parse_port_specs,
    reserved_ports,
    scan_ports,
    suggest_free_port,
)
from .safekill import KillTarget, ProcessRow, Signal, age_text, process_row, safe_kill, target_table
from .safety import Caller, Policy, refusal
from .snapshot import ProcessTable, ProcInfo, read_cmdline, snapshot
from .sockets import Proto, SocketEntry, SocketTablesUnavailable

REF_EADDRINUSE = EntryRef(file="references/training/distributed-launch.md", id="DIST-02")
REF_PARALLEL_PORTS = EntryRef(file="references/parallel_ablation.md", id="PAR-02")
REF_PKILL = EntryRef(file="references/gotchas_universal.md", id="GOT-08")
REF_ORPHANS = EntryRef(file="references/gotchas_universal.md", id="GOT-06")
MAX_PID = 4_194_304  # PID_MAX_LIMIT on 64-bit Linux


def _custom(reason: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", "{reason}", {"reason": reason})


def _no_booleans(value: object) -> object:
    """Lax validation would read JSON ``true`` as port 1."""
    if isinstance(value, list) and any(isinstance(item, bool) for item in value):
        raise _custom(f"true/false is not a port: {PORT_SPEC_HELP}")
    return value


def _valid_port_specs(value: list[int | str]) -> list[int | str]:
    try:
        parse_port_specs(value)
    except ValueError as err:
        raise _custom(str(err)) from None
    return value


# Validators ride in the annotation's metadata, so the MCP layer (which rebuilds parameters from
# annotation + metadata) applies them too, not only ToolSpec.validate.
PortSpecs = Annotated[list[int | str], BeforeValidator(_no_booleans), AfterValidator(_valid_port_specs)]


class KillPortHoldersInput(StrictModel):
    ports: PortSpecs = Field(
        min_length=1, max_length=64,
        description=f"Ports and/or ranges to free, e.g. [29500, \"29510-29520\"]: {PORT_SPEC_HELP}.",
        examples=[[29500], [29500, "29510-29520"]])
    protocol: Literal["tcp", "udp", "both"] = Field(
        "tcp", description="Socket protocol; torchrun, NCCL bootstrap and TCPStore use tcp.")
    include_connected: bool = Field(
        False, description="Also target processes with connected sockets on these ports (accepted connections "
        "and clients connected to them). Default: only listeners, never mere clients.")
    min_pid: int | None = Field(
        None, ge=2, le=MAX_PID, description="Only consider holders with pid >= min_pid.")
    name_pattern: str | None = Field(
        None, min_length=1, max_length=200, description="Only consider holders whose process name or command "
        "line matches this Python regular expression (like `pgrep -f`), e.g. 'train\\.py'.")
    only_current_user: bool = Field(
        False, description="Only consider holders owned by the user running this tool.")
    allow_other_users: bool = Field(
        False, description="Allow signalling other users' processes. Has effect only when running as root.")
    dry_run: bool = Field(
        True, description="Only report who holds the ports and what would be signalled; returns a confirm_token.")
    signal: Signal = Field(
        "TERM", description="TERM: SIGTERM, wait grace_s, report survivors. KILL: SIGTERM, wait grace_s, then "
        "SIGKILL whatever is still alive.")
    grace_s: float = Field(10.0, ge=0, le=120, description="Seconds to wait after SIGTERM.")
    confirm_token: str | None = Field(
        None, min_length=1, max_length=8192, description="The confirm_token from the dry run; required when "
        "dry_run is false. Binds pid, start time, uid and command line of each process, so a restarted or "
        "reused pid is refused.")

    @field_validator("name_pattern")
    @classmethod
    def _check_pattern(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise _custom(f"not a valid regular expression: {err}") from None
        return value

    @field_validator("confirm_token")
    @classmethod
    def _check_token(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_token(value)
            except InputError as err:
                raise _custom(err.message + (f" (allowed: {', '.join(err.allowed)})" if err.allowed else "")) from None
        return value

    def protocols(self) -> tuple[Proto, ...]:
        return ("tcp", "udp") if self.protocol == "both" else (self.protocol,)


class SocketRow(StrictModel):
    port: int
    proto: Literal["tcp", "udp"]
    family: Literal["ipv4", "ipv6"]
    local: str = Field(description="Local address:port")
    remote: str | None = Field(None, description="Peer address:port of a connected socket")
    state: str = Field(description="LISTEN, UNCONN (bound UDP), ESTABLISHED, TIME_WAIT, ...")
    socket_uid: int = Field(description="Uid that owns the socket (from /proc/net), even when its process is hidden")
    inode: int
    pids: list[int] = Field(description="Processes holding it; empty when the owner is invisible or the kernel")
    owner: Literal["visible", "invisible", "kernel"]
    note: str = ""


class SkippedHolder(ProcessRow):
    reason: str = Field(description="Which filter left it out")


class PortState(StrictModel):
    port: int
    free: bool
    holders: list[int] = Field(default_factory=list)
    detail: str = ""


class KillPortHoldersResult(StrictModel):
    verdict: Verdict = Field(description="PASS: ports free. WARN: dry run found holders it could signal. FAIL: a "
                             "port stays held (refused, invisible or surviving holders, or the kill did not run)")
    summary: str
    dry_run: bool
    signal: Signal
    grace_s: float
    ports_checked: int
    ports_held: list[int] = Field(description="Requested ports that had a matching socket before any action")
    sockets: list[SocketRow]
    targets: list[KillTarget] = Field(description="Holders and their trees, children first, with the action each "
                                      "got or would get and why")
    skipped: list[SkippedHolder] = Field(default_factory=list)
    confirm_token: str | None = None
    token_problems: list[str] = Field(default_factory=list)
    executed: bool = False
    after: list[PortState] = Field(default_factory=list, description="Re-scan after a real run")
    next_step: str
    references: list[EntryRef]


def _socket_rows(scan: PortScan, ports: set[int]) -> list[SocketRow]:
    rows = []
    for entry in scan.sockets:
        kind = scan.owner_kind(entry)
        note = ""
        if kind == "invisible":
            note = invisible_note(entry, scan.owners.unreadable)
        elif kind == "kernel":
            note = ("no process holds it (TIME_WAIT after close, or queued for the listener's accept); it goes "
                    "away by itself or with its listener: nothing to kill")
        port = entry.local_port if entry.local_port in ports else entry.remote_port
        rows.append(SocketRow(port=port, proto=entry.proto, family=entry.family, local=entry.local,
                              remote=entry.remote, state=entry.state, socket_uid=entry.uid, inode=entry.inode,
                              pids=scan.pids_of(entry), owner=kind, note=note))
    return sorted(rows, key=lambda r: (r.port, r.proto, r.family, r.local))


def _holding(entry: SocketEntry, ports: set[int]) -> str:
    if entry.listening:
        return f"holds {entry.proto} {entry.local} {entry.state}"
    side = "to" if entry.remote_port in ports and entry.local_port not in ports else "on"
    return f"{entry.proto} {entry.local} -> {entry.remote} {entry.state} (connected {side} the port)"


def _filter_reason(info: ProcInfo, args: KillPortHoldersInput, caller: Caller) -> str | None:
    if args.min_pid is not None and info.pid < args.min_pid:
        return f"pid below min_pid {args.min_pid}"
    if args.only_current_user and info.uid != caller.uid:
        return "not owned by the current user (only_current_user)"
    if args.name_pattern and not (re.search(args.name_pattern, info.name) or re.search(args.name_pattern,
                                                                                        info.command)):
        return f"name and command line do not match {args.name_pattern!r}"
    return None


def _candidates(scan: PortScan, args: KillPortHoldersInput, ports: set[int], caller: Caller, policy: Policy,
                table: ProcessTable) -> tuple[dict[int, str], list[SkippedHolder]]:
    """Holders that pass the filters, plus their trees, each with the reason it is a candidate."""
    holds: dict[int, list[str]] = {}
    for entry in scan.sockets:
        for pid in scan.pids_of(entry):
            holds.setdefault(pid, []).append(_holding(entry, ports))
    candidates: dict[int, str] = {}
    skipped: list[SkippedHolder] = []
    expand_from: list[int] = []
    for pid, reasons in sorted(holds.items()):
        info = snapshot(pid)
        if info is None:
            continue
        reason = _filter_reason(info, args, caller)
        if reason:
            skipped.append(SkippedHolder(**process_row(info, table), reason=reason))
            continue
        shown = sorted(set(reasons))
        candidates[pid] = "; ".join(shown[:3]) + (f" (+{len(shown) - 3} more)" if len(shown) > 3 else "")
        if refusal(info, caller, policy) is None:
            expand_from.append(pid)
    for holder in expand_from:
        # The tree to stop: the launcher's whole tree when the holder runs under one (and the launcher
        # itself may be signalled), else the holder's own descendants.
        root = find_launcher(holder, table)
        if root is not None and root != holder and refusal(snapshot(root), caller, policy) is not None:
            root = None
        if root is not None and root != holder:
            candidates.setdefault(root, f"launcher of holder {holder}: stopping only the holder would orphan "
                                        "or respawn its workers")
        if root is not None:
            kind = launcher_kind(read_cmdline(root)) or "launcher"
            for pid in table.descendants(root):
                candidates.setdefault(pid, f"worker in the {kind} tree of pid {root}")
        else:
            for pid in table.descendants(holder):
                candidates.setdefault(pid, f"child of holder {holder}")
    return candidates, skipped


def _after(ports_held: list[int], args: KillPortHoldersInput, started: float) -> list[PortState]:
    """Scan the ports that were held again; name holders that started after the kill."""
    rescan = scan_ports(ports_held, args.protocols(), include_connected=args.include_connected)
    states = []
    for port in ports_held:
        entries = [e for e in rescan.sockets if port in (e.local_port, e.remote_port) and e.inode != 0]
        pids = sorted({pid for e in entries for pid in rescan.pids_of(e)})
        if not entries:
            states.append(PortState(port=port, free=True, detail="no socket left on this port"))
            continue
        notes = []
        for pid in pids:
            info = snapshot(pid)
            if info and info.create_time and info.create_time >= started - 0.5:
                parent = snapshot(info.ppid)
                by = f"pid {info.ppid}" + (f" ({parent.name})" if parent else "")
                notes.append(f"pid {pid} started after the kill: relaunched by {by}? stop the supervisor or "
                             "loop that restarts it")
        if any(rescan.owner_kind(e) == "invisible" for e in entries):
            notes.append("a socket's owner is invisible to this user")
        states.append(PortState(port=port, free=False, holders=pids, detail="; ".join(notes) or "still held"))
    return states


def _cli_command(args: KillPortHoldersInput, token: str) -> str:
    parts = ["rgt", "ports", *(str(p) for p in args.ports), *cli_host_args()]
    if args.protocol != "tcp":
        parts += ["--protocol", args.protocol]
    for flag, on in (("--include-connected", args.include_connected), ("--only-current-user", args.only_current_user),
                     ("--allow-other-users", args.allow_other_users)):
        if on:
            parts.append(flag)
    if args.min_pid is not None:
        parts += ["--min-pid", str(args.min_pid)]
    if args.name_pattern:
        parts += ["--name-pattern", args.name_pattern]
    parts += ["--no-dry-run", "--signal", args.signal, "--grace-s", f"{args.grace_s:g}", "--confirm-token", token]
    return shlex.join(parts)


def kill_port_holders(args: KillPortHoldersInput, progress: Progress) -> KillPortHoldersResult:
    ports = parse_port_specs(args.ports)
    port_set = set(ports)
    caller = Caller.current()
    policy = Policy(allow_other_users=args.allow_other_users)
    try:
        scan = scan_ports(ports, args.protocols(), include_connected=args.include_connected)
    except SocketTablesUnavailable as err:
        return KillPortHoldersResult(
            verdict=Verdict.UNKNOWN, summary=f"Could not inspect sockets, nothing was signalled: {err}",
            dry_run=args.dry_run, signal=args.signal, grace_s=args.grace_s, ports_checked=len(ports), ports_held=[],
            sockets=[], targets=[], next_step="Run on the Linux machine that runs the job.",
            references=[REF_EADDRINUSE, REF_PKILL])
    table = ProcessTable.read()
    candidates, skipped = _candidates(scan, args, port_set, caller, policy, table)
    sockets = _socket_rows(scan, port_set)
    ports_held = sorted({row.port for row in sockets if row.owner != "kernel"})
    started = time.time()
    report = safe_kill(candidates, dry_run=args.dry_run, confirm_token=args.confirm_token, signal=args.signal,
                       grace_s=args.grace_s, policy=policy, caller=caller, table=table, progress=progress)
    after = _after(ports_held, args, started) if report.executed else []
    refs = [REF_EADDRINUSE, REF_PKILL] + ([REF_ORPHANS] if any(t.torchrun_group for t in report.targets) else [])

    base = dict(dry_run=args.dry_run, signal=args.signal, grace_s=args.grace_s, ports_checked=len(ports),
                ports_held=ports_held, sockets=sockets, targets=report.targets, skipped=skipped,
                confirm_token=report.confirm_token, token_problems=report.token_problems,
                executed=report.executed, after=after, references=refs)
    would = [t for t in report.targets if t.action == "would_signal"]
    if not ports_held:
        free = f"{len(ports)} port(s) checked" if len(ports) > 1 else f"port {ports[0]}"
        return KillPortHoldersResult(**base, verdict=Verdict.PASS, summary=f"{free}: nothing holds it; nothing to do",
                                     next_step="Nothing to do. Before a launch, `port_status` suggests flags.")
    if report.token_problems:
        return KillPortHoldersResult(
            **base, verdict=Verdict.FAIL,
            summary="Nothing was signalled: processes changed since the dry run. " + " ".join(report.token_problems),
            next_step="Review the targets (a fresh confirm_token is included) and confirm again if they are right.")
    if report.executed:
        still = [s for s in after if not s.free]
        freed = [s.port for s in after if s.free]
        verdict = Verdict.PASS if not still else Verdict.FAIL
        summary = (f"Freed {len(freed)} of {len(after)} held port(s)"
                   + (f"; still held: {', '.join(str(s.port) for s in still)}" if still else ""))
        survivors = [t for t in report.targets if t.outcome in ("survived_term", "unkillable")]
        if any(t.outcome == "survived_term" for t in survivors):
            step = "Some processes ignored SIGTERM: run the dry run again and confirm with signal=KILL."
        elif still:
            step = "See 'after' for who still holds each port; refused or invisible holders need their owner or root."
        else:
            step = "Ports are free; relaunch (port_status suggests flags that avoid fixed-port clashes)."
        return KillPortHoldersResult(**base, verdict=verdict, summary=summary, next_step=step)

    # Dry run (or a real run with nothing it may signal).
    approved = {t.pid for t in would}
    blocked = sorted({row.port for row in sockets
                      if row.owner == "invisible" or (row.owner == "visible" and not set(row.pids) <= approved)})
    verdict = Verdict.FAIL if blocked else Verdict.WARN
    held_text = ", ".join(str(p) for p in ports_held[:10]) + (" ..." if len(ports_held) > 10 else "")
    if args.dry_run:
        how = "SIGTERM" if args.signal == "TERM" else "SIGTERM, then SIGKILL"
        summary = f"Held: {held_text}. Would signal {len(would)} process(es) with {how}"
        if blocked:
            summary += f"; port(s) {', '.join(map(str, blocked))} would stay held (refused, skipped or invisible)"
        step = ("Show the targets to the user. To proceed: call again with dry_run=false and this confirm_token, or "
                f"`{_cli_command(args, report.confirm_token)}`" if report.confirm_token else
                "Nothing here may be signalled by this tool; see each target's detail. To launch anyway, pick another "
                "port with port_status.")
    else:
        summary = f"Held: {held_text}. Nothing may be signalled (see each target's refusal)"
        step = "Pick another port with port_status, or ask the owner/admin of the refused holders."
    return KillPortHoldersResult(**base, verdict=verdict, summary=summary, next_step=step)


def _render_kill(result: KillPortHoldersResult) -> str:
    head = f"{result.verdict.value}  {result.summary}"
    if result.dry_run:
        head = f"DRY RUN (nothing signalled)\n{head}"
    parts = [head]
    if result.sockets:
        parts.append(format_table(["port", "proto", "local", "state", "pids", "owner"],
                                  [[s.port, f"{s.proto}/{s.family}", s.local + (f" -> {s.remote}" if s.remote else ""),
                                    s.state, s.pids or "-", s.owner] for s in result.sockets]))
        parts += [f"  {s.local}: {s.note}" for s in result.sockets if s.note]
    if result.targets:
        parts.append(target_table(result.targets))
    if result.skipped:
        parts.append(format_table(["pid", "user", "age", "skipped because", "command"],
                                  [[s.pid, s.user, age_text(s.age_s), s.reason, s.command] for s in result.skipped],
                                  wrap=["skipped because", "command"]))
    if result.after:
        parts.append(format_table(["port", "free", "holders", "detail"],
                                  [[a.port, "yes" if a.free else "NO", a.holders or "-", a.detail]
                                   for a in result.after]))
    parts += [f"problem: {p}" for p in result.token_problems]
    if result.confirm_token and not result.executed:
        parts.append(f"confirm_token: {result.confirm_token}")
    parts.append(f"next: {result.next_step}")
    return "\n\n".join(parts)


# ---------------------------------------------------------------- port_status


class PortStatusInput(StrictModel):
    port: int = Field(ge=1, le=65535, description="TCP port to check, e.g. 29500 (torchrun's default master port).")
    search_span: int = Field(200, ge=1, le=5000, description="How many ports above `port` to search for a free "
                             "one to suggest.")


class LaunchAdvice(StrictModel):
    launcher: str
    use: str = Field(description="Flags or environment to pass")
    note: str


class PortStatusResult(StrictModel):
    verdict: Verdict = Field(description="PASS: free. WARN: free but in the ephemeral range (may be taken by an "
                             "outgoing connection any time). FAIL: held")
    port: int
    free: bool
    summary: str
    bind_ok: bool = Field(description="A test bind like TCPStore's (wildcard, dual-stack, SO_REUSEADDR) succeeded")
    bind_error: str | None = None
    sockets: list[SocketRow] = Field(description="TCP sockets whose local port is this port, any state")
    holders: list[ProcessRow]
    in_ephemeral_range: bool
    suggested_port: int | None = Field(description="Nearest free port above, outside the ephemeral range")
    advice: list[LaunchAdvice]
    next_step: str
    references: list[EntryRef]


def launch_advice(port: int) -> list[LaunchAdvice]:
    """Flags per launcher, checked against torch 2.13's run.py, accelerate and deepspeed docs."""
    return [
        LaunchAdvice(launcher="torchrun, single node", use="--standalone",
                     note="c10d rendezvous on localhost:0: the agent picks a free port itself, so concurrent jobs "
                     "never collide (same as --rdzv-backend=c10d --rdzv-endpoint=localhost:0). torch builds "
                     "with pytorch#175699 (2.13 has it) do this by default when no port is given; a clash on 29500 "
                     "then means a port was set explicitly (flag, PET_MASTER_PORT, a launcher config) or "
                     "--nnodes > 1."),
        LaunchAdvice(launcher="torchrun, fixed port", use=f"--master-port={port}",
                     note="static rendezvous: rank 0's node listens on it; every node passes the same value."),
        LaunchAdvice(launcher="torchrun, multi-node c10d",
                     use=f"--rdzv-backend=c10d --rdzv-endpoint=<head-node>:{port}",
                     note="the head node hosts the store on this port: free there, reachable from all nodes, "
                     "identical in every node's command."),
        LaunchAdvice(launcher="python + init_process_group(init_method='env://')", use=f"MASTER_PORT={port}",
                     note="set in the environment of every rank (rank 0 listens)."),
        LaunchAdvice(launcher="accelerate launch", use=f"--main_process_port {port}",
                     note="or main_process_port in the accelerate config; on a single node --main_process_port 0 "
                     "lets accelerate pick a free port."),
        LaunchAdvice(launcher="deepspeed", use=f"--master_port {port}", note="deepspeed's launcher defaults to 29500."),
    ]


def port_status(args: PortStatusInput, progress: Progress) -> PortStatusResult:
    port = args.port
    try:
        scan = scan_ports([port], ("tcp",), include_connected=True)
    except SocketTablesUnavailable as err:
        bind_ok, bind_error = bind_test(port)
        return PortStatusResult(
            verdict=Verdict.UNKNOWN, port=port, free=False, bind_ok=bind_ok, bind_error=bind_error, sockets=[],
            holders=[], in_ephemeral_range=False, suggested_port=None, advice=launch_advice(port),
            summary=f"Could not inspect sockets ({err}); a test bind {'succeeded' if bind_ok else 'failed'}",
            next_step="Run on the Linux machine that runs the job; --standalone avoids fixed ports.",
            references=[REF_EADDRINUSE, REF_PARALLEL_PORTS])
    # Only sockets *on* this port block it; clients connected *to* it use other local ports.
    sockets = [row for row in _socket_rows(scan, {port}) if row.local.endswith(f":{port}")]
    listeners = [s for s in sockets if s.state == "LISTEN"]
    bind_ok, bind_error = bind_test(port)
    free = bind_ok and not listeners
    table = ProcessTable.read()
    holder_pids = sorted({pid for s in sockets for pid in s.pids})
    holders = [ProcessRow(**process_row(info, table)) for pid in holder_pids if (info := snapshot(pid))]
    ephemeral = in_ephemeral_range(port, ephemeral_range(), reserved_ports())
    progress(1, 2, "searching for a free port")
    suggested = port if free and not ephemeral else suggest_free_port(port, args.search_span)
    advice = launch_advice(suggested if suggested is not None else port)
    refs = [REF_EADDRINUSE, REF_PARALLEL_PORTS]
    if free:
        verdict = Verdict.WARN if ephemeral else Verdict.PASS
        summary = f"Port {port} is free"
        if ephemeral:
            summary += (" but inside the ephemeral range: an outgoing connection can take it any time; prefer "
                        "--standalone or a port below the range")
        step = "Launch with the advice below; --standalone avoids fixed ports on a single node."
    else:
        who = []
        for s in listeners or sockets:
            who.append(f"{s.local} {s.state} " + (f"pid {', '.join(map(str, s.pids))}" if s.pids else s.owner))
        names = ", ".join(f"{h.pid} {h.name}" + (f" (torchrun group {h.torchrun_group})" if h.torchrun_group else "")
                          for h in holders)
        summary = f"Port {port} is held: {'; '.join(who[:4]) or bind_error}" + (f" — {names}" if names else "")
        if not listeners and not bind_ok:
            summary += f" ({bind_error})"
        verdict = Verdict.FAIL
        alt = f"use port {suggested}" if suggested else "use --standalone"
        step = (f"Either {alt} (advice below), or free it: kill_port_holders(ports=[{port}]) dry run first "
                f"(`{shlex.join(['rgt', 'ports', str(port), *cli_host_args()])}`).")
    return PortStatusResult(verdict=verdict, port=port, free=free, summary=summary,
                            bind_ok=bind_ok, bind_error=bind_error, sockets=sockets, holders=holders,
                            in_ephemeral_range=ephemeral, suggested_port=suggested, advice=advice, next_step=step,
                            references=refs)


def _render_status(result: PortStatusResult) -> str:
    parts = [f"{result.verdict.value}  {result.summary}"]
    if result.sockets:
        parts.append(format_table(["local", "remote", "state", "pids", "owner"],
                                  [[s.local, s.remote, s.state, s.pids or "-", s.owner] for s in result.sockets]))
        parts += [f"  {s.local}: {s.note}" for s in result.sockets if s.note]
    if result.holders:
        parts.append(format_table(["pid", "user", "group", "age", "command"],
                                  [[h.pid, h.user, h.torchrun_group, age_text(h.age_s), h.command]
                                   for h in result.holders], wrap=["command"]))
    parts.append(f"suggested port: {result.suggested_port if result.suggested_port is not None else 'none found'}")
    parts.append(format_table(["launcher", "use"], [[a.launcher, a.use] for a in result.advice]))
    parts.append(f"next: {result.next_step}")
    return "\n\n".join(parts)



SPECS = [
    ToolSpec(
        name="kill_port_holders",
        remote=True,
        cli="ports",
        title="Free ports held by stale processes (safe kill)",
        description=(
            "Find and (after confirmation) stop the processes listening on TCP/UDP ports, e.g. a crashed torchrun "
            "job still holding 29500 ('errno: 98 - Address already in use'). Dry run by default: lists every "
            "socket (IPv4 and IPv6) with its holder, user, parent and torchrun group, and returns a confirm_token "
            "bound to pid + start time + uid + command line. Call again with dry_run=false and that token to "
            "signal: children before parents, SIGTERM, wait grace_s, SIGKILL only with signal=KILL; then the "
            "ports are re-scanned. Never signals pid 1, itself or its ancestors (your agent, shell, SSH session), "
            "other users' processes (unless root and allow_other_users), sshd/systemd/docker/containerd/kubelet/"
            "tmux/Jupyter/IDE servers or login shells; zombies and D-state processes are reported, not signalled. "
            "Sockets whose owner is invisible are reported as held. Use instead of `lsof | xargs kill -9`."),
        input_model=KillPortHoldersInput,
        output_model=KillPortHoldersResult,
        run=kill_port_holders,
        read_only=False,
        destructive=True,
        idempotent=True,
        render_text=_render_kill,
        exit_code=exit_1_on_fail,
        cli_positional="ports",
    ),
    ToolSpec(
        name="port_status",
        remote=True,
        cli="port-status",
        title="Is this port free? What should torchrun use instead?",
        description=(
            "Read-only. Check whether a TCP port is free the way torchrun's TCPStore would bind it, list who holds "
            "it (including owners this user cannot see), suggest the nearest free port outside the ephemeral range, "
            "and give the launch flags to use instead (torchrun --standalone / --master-port / --rdzv-endpoint, "
            "MASTER_PORT, accelerate --main_process_port, deepspeed --master_port). Call it before a launch or on "
            "'Address already in use'."),
        input_model=PortStatusInput,
        output_model=PortStatusResult,
        run=port_status,
        read_only=True,
        render_text=_render_status,
        exit_code=exit_1_on_fail,
        cli_positional="port",
    ),
]
