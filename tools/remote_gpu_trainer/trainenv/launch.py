"""The environment a launch on this node gets, and the checks of it against the node.

Where a launch's settings come from, in the order they win:

1. the launch script's own ``export NAME=value`` lines (when a script is given);
2. the login shell (``bash -l -i``: ``~/.profile``, ``~/.bashrc`` and what they source), which includes
3. the ssh session's environment (sshd ``SetEnv``, ``/etc/environment``): what even ``ssh box cmd`` gets;
4. for ``NCCL_*`` only, NCCL's own files, read by NCCL at init and never overriding the environment:
   ``$NCCL_CONF_FILE`` when set and not empty, else ``~/.nccl.conf`` of the passwd entry's home (not
   ``$HOME``), then ``/etc/nccl.conf`` (NCCL's ``src/misc/param.cc``: ``setenv(name, value, 0)``, first wins).

A value set only by the start-up files is marked ``interactive_only``: a launch through ``ssh node cmd``, cron
or ``run_start`` does not get it, a terminal's launch does.

``NCCL_SOCKET_IFNAME`` is matched as NCCL matches it: comma-separated prefixes, ``^`` in front excludes the
list, ``=`` in front of an entry asks for that exact name. ``GLOO_SOCKET_IFNAME`` names interfaces exactly.
``CUDA_VISIBLE_DEVICES`` is read as CUDA reads it: indices or ``GPU-``/``MIG-`` UUIDs (a unique prefix is
enough), and the list ends at the first entry that names no device.
"""

from __future__ import annotations

import os
import pwd
import re
import socket

from pydantic import Field

from ..health.checks import Check
from ..models import EntryRef, StrictModel, Verdict
from .login import ShellRead
from .script import LaunchScript

PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "PET_")
NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MASTER_ADDR", "MASTER_PORT"})
E_IFACE = EntryRef(file="references/multinode.md", id="NODE-01")
E_MASTER = EntryRef(file="references/multinode.md", id="NODE-02")
E_ORDINAL = EntryRef(file="references/training/distributed-launch.md", id="DIST-05")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")


def relevant(name: str) -> bool:
    """A variable that changes how a distributed launch finds GPUs, peers or the network."""
    return name in NAMES or name.startswith(PREFIXES)


class Setting(StrictModel):
    name: str
    value: str
    source: str = Field(description="launch script line N, login shell, ssh session, NCCL_CONF_FILE …, "
                        "~/.nccl.conf …, /etc/nccl.conf")
    interactive_only: bool = Field(False, description="Set only by the shell's start-up files: a launch through "
                                   "`ssh node cmd`, cron or run_start does not get it")


class ConfFile(StrictModel):
    path: str
    role: str = Field(description="NCCL_CONF_FILE, ~/.nccl.conf or /etc/nccl.conf")
    present: bool
    values: dict[str, str] = Field(default_factory=dict)
    error: str | None = None


class LaunchEnv(StrictModel):
    """The NCCL_*, GLOO_*, TORCH_NCCL_*, PET_*, CUDA_VISIBLE_DEVICES, MASTER_* settings a launch here gets."""

    read_by: str = Field(description="How the login environment was read (fixed script, shell mode, seconds)")
    error: str | None = Field(None, description="Why the login shell could not be read: the values are then "
                              "the ssh session's only")
    settings: list[Setting]
    nccl_conf_files: list[ConfFile]
    script: LaunchScript | None = None

    def get(self, name: str) -> Setting | None:
        return next((s for s in self.settings if s.name == name), None)

    def value(self, name: str) -> str | None:
        setting = self.get(name)
        return setting.value if setting else None


def parse_conf_file(path: str, role: str) -> ConfFile:
    """NCCL's format: ``NAME=value`` per line, ``#`` comments, the value is the rest of the line as written."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
    except FileNotFoundError:
        return ConfFile(path=path, role=role, present=False)
    except OSError as err:
        return ConfFile(path=path, role=role, present=True, error=err.strerror or str(err))
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        values.setdefault(name, value)  # NCCL: setenv without overwrite, so the first line wins
    return ConfFile(path=path, role=role, present=True, values=values)


def passwd_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.path.expanduser("~")


def read_launch_env(login: ShellRead, script: LaunchScript | None = None) -> LaunchEnv:
    """The launch environment from a login-shell reading, the script and NCCL's files (module docstring)."""
    session = dict(os.environ)
    base = login.env if login.env is not None else session
    settings: dict[str, Setting] = {}
    for name, value in sorted(base.items()):
        if relevant(name):
            mine = session.get(name) == value
            settings[name] = Setting(name=name, value=value, interactive_only=not mine,
                                     source="ssh session" if mine else f"login shell: {login.how}")
    if script is not None:
        for name, line in script.exports.items():
            if relevant(name):
                settings[name] = Setting(name=name, value=line.text, source=f"launch script line {line.line}")
    conf = settings.get("NCCL_CONF_FILE")
    first = (conf.value, f"NCCL_CONF_FILE ({conf.source})") if conf and conf.value else (
        os.path.join(passwd_home(), ".nccl.conf"), "~/.nccl.conf (passwd home)")
    files = [parse_conf_file(*first), parse_conf_file("/etc/nccl.conf", "/etc/nccl.conf")]
    for conf_file in files:
        for name, value in conf_file.values.items():
            if name not in settings:
                settings[name] = Setting(name=name, value=value, source=f"{conf_file.role} {conf_file.path}")
    how = f"{login.how}, fixed script, {login.seconds:.2f} s"
    return LaunchEnv(read_by=how, error=login.error, settings=list(settings.values()), nccl_conf_files=files,
                     script=script)


# ---------------------------------------------------------------- checks against the node


def nccl_ifname_matches(spec: str, interfaces: list[str]) -> list[str]:
    """The interfaces NCCL would consider for ``NCCL_SOCKET_IFNAME=spec`` (module docstring)."""
    exclude = spec.startswith("^")
    entries = [e for e in (spec[1:] if exclude else spec).split(",") if e]

    def hit(name: str) -> bool:
        return any(name == e[1:] if e.startswith("=") else name.startswith(e) for e in entries)

    return [i for i in interfaces if hit(i) != exclude]


def _origin(setting: Setting) -> str:
    return f"{setting.name}={setting.value} ({setting.source})"


def ifname_checks(env: LaunchEnv, addresses: dict[str, list[str]], route_iface: str | None) -> list[Check]:
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME against the interfaces that have an address here."""
    interfaces = sorted(addresses)
    have = ", ".join(interfaces) or "none"
    checks = []
    nccl = env.get("NCCL_SOCKET_IFNAME")
    if nccl is not None:
        matches = nccl_ifname_matches(nccl.value, interfaces)
        if not matches:
            verdict, why = Verdict.FAIL, (f"no interface on this node matches it (interfaces with an address: {have}): "
                                          "NCCL fails at init with 'no socket interface found' / bootstrap errors")
        elif route_iface and route_iface not in matches:
            verdict, why = Verdict.WARN, (f"NCCL would use {', '.join(matches)}, but the head is reached over "
                                          f"{route_iface} here")
        else:
            verdict, why = Verdict.PASS, f"NCCL would use {', '.join(matches)}"
        checks.append(Check(name="nccl_socket_ifname", verdict=verdict, observed=_origin(nccl),
                            threshold="matches an interface of this node", explanation=why,
                            entry=E_IFACE if verdict is not Verdict.PASS else None))
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if gloo is not None:
        missing = [name for name in gloo.value.split(",") if name and name not in interfaces]
        verdict = Verdict.FAIL if missing else Verdict.PASS
        why = (f"{', '.join(missing)} does not exist here (interfaces with an address: {have}): gloo fails to "
               "create its device" if missing else "every interface named exists")
        checks.append(Check(name="gloo_socket_ifname", verdict=verdict, observed=_origin(gloo),
                            threshold="names interfaces of this node", explanation=why,
                            entry=E_IFACE if missing else None))
    return checks


def visible_devices(value: str, count: int, uuids: list[str | None] | None) -> tuple[list[int], str | None]:
    """(NVML indices CUDA will show, the first entry that names no device), as CUDA parses the variable.
    ``uuids`` None: not read, and a UUID entry raises LookupError (it cannot be judged)."""
    shown: list[int] = []
    for entry in (e.strip() for e in value.split(",")):
        if entry.isdecimal() and int(entry) < count:
            index = int(entry)
        elif _UUID.match(entry):
            if uuids is None:
                raise LookupError(entry)
            owners = [i for i, u in enumerate(uuids) if u and u.startswith(entry)]
            if len(owners) != 1:
                return shown, entry
            index = owners[0]
        else:
            return shown, entry or "(empty)"
        if index in shown:
            return shown, entry
        shown.append(index)
    return shown, None


def cuda_visible_check(setting: Setting | None, count: int, uuids: list[str | None] | None) -> Check | None:
    """What ``CUDA_VISIBLE_DEVICES`` leaves of the GPUs NVML sees (NVML itself ignores the variable).
    ``uuids``: each GPU's UUID, or None when they were not read (a UUID entry is then UNKNOWN)."""
    if setting is None:
        return None
    observed = _origin(setting)
    threshold = "every entry names a GPU NVML sees"
    if count == 0:
        return Check(name="cuda_visible_devices", verdict=Verdict.SKIP, observed=observed, threshold=threshold,
                     explanation="NVML sees no GPU here: nothing to compare")
    try:
        shown, bad = visible_devices(setting.value, count, uuids)
    except LookupError as err:
        return Check(name="cuda_visible_devices", verdict=Verdict.UNKNOWN, observed=observed, threshold=threshold,
                     explanation=f"names GPU {err} by UUID; gpu_health reads the UUIDs and judges it")
    where = "login env" if setting.interactive_only else setting.source
    sees = f"ranks see {len(shown)} of {count} GPUs" + (f" (NVML {', '.join(map(str, shown))})" if shown else "")
    if not shown:
        why = (f"{where} sets CUDA_VISIBLE_DEVICES={setting.value}: {sees}; '{bad}' names no GPU of this node "
               f"(NVML sees {count}), so torch.cuda.device_count() is 0 and a rank fails with 'invalid device "
               "ordinal' or 'no CUDA GPUs are available'")
        return Check(name="cuda_visible_devices", verdict=Verdict.FAIL, observed=observed, threshold=threshold,
                     explanation=why, entry=E_ORDINAL)
    if bad is not None or len(shown) < count:
        cut = f"; CUDA stops reading at '{bad}', which names no GPU here" if bad is not None else ""
        why = (f"{where} sets CUDA_VISIBLE_DEVICES={setting.value}: {sees}{cut}. A launch with one rank per GPU "
               "that NVML reports fails with 'invalid device ordinal' on the ranks past the visible ones")
        return Check(name="cuda_visible_devices", verdict=Verdict.WARN, observed=observed, threshold=threshold,
                     explanation=why, entry=E_ORDINAL)
    return Check(name="cuda_visible_devices", verdict=Verdict.PASS, observed=observed, threshold=threshold,
                 explanation=f"{sees}")


def resolves(name: str) -> list[str]:
    try:
        return list(dict.fromkeys(str(i[4][0]) for i in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)))
    except (socket.gaierror, UnicodeError):
        return []


def endpoint_checks(env: LaunchEnv, head_addr: str | None, port: int | None) -> list[Check]:
    """MASTER_ADDR / MASTER_PORT in the environment and the launch script's endpoint, against this node and the
    head and port the pre-flight checks."""
    checks = []
    head_ips = set(resolves(head_addr)) if head_addr else set()
    wanted: list[tuple[str, str, str | None, int | None]] = []
    addr, port_setting = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if addr or port_setting:
        wanted.append(("master_env", " · ".join(_origin(s) for s in (addr, port_setting) if s),
                       addr.value if addr else None,
                       int(port_setting.value) if port_setting and port_setting.value.isdecimal() else None))
    endpoint = env.script.endpoint if env.script else None
    if endpoint and (endpoint.master_addr or endpoint.master_port):
        text = f"{endpoint.launcher} at launch script line {endpoint.line}: " + " ".join(
            f"{k}={v}" for k, v in (("addr", endpoint.master_addr), ("port", endpoint.master_port)) if v)
        wanted.append(("launch_endpoint", text, endpoint.master_addr, endpoint.master_port))
    for name, observed, target, target_port in wanted:
        problems, verdict = [], Verdict.PASS
        if target and "$" not in target:
            ips = resolves(target)
            if not ips:
                verdict = Verdict.FAIL
                problems.append(f"{target} does not resolve on this node: the launch as written cannot find its head")
            elif head_ips and not head_ips & set(ips):
                verdict = Verdict.WARN
                problems.append(f"{target} is not the head this pre-flight checks ({head_addr})")
        if target_port and port and target_port != port:
            verdict = Verdict.WARN if verdict is Verdict.PASS else verdict
            problems.append(f"port {target_port} is not the port this pre-flight checks ({port}): check that one "
                            f"with port={target_port}")
        checks.append(Check(name=name, verdict=verdict, observed=observed, threshold="resolves to the head",
                            explanation="; ".join(problems) or "points at the head and port this pre-flight checks",
                            entry=E_MASTER if problems else None))
    return checks
