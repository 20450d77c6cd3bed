"""Read an installed kvring.service the way systemd does, for tests/service/test_service.sh.

    unit.py get UNIT KEY            every value of KEY in [Service] (or [Unit]/[Install]), one a line
    unit.py shell UNIT KEY...       unit_KEY='its last value' per KEY, for sh's eval ('' when absent)
    unit.py execstart UNIT DESTDIR  ExecStart= as argv, one argument a line: Environment= then
                                    EnvironmentFile= (read under DESTDIR) expanded as systemd.service(5)
                                    says, the executable under DESTDIR
    unit.py config SRC DST SOCKDIR ACTORDIR PORT
                                    DST: the JSON config SRC with instance.socket moved into SOCKDIR
                                    (the RuntimeDirectory relocated), instance.actor_dir ACTORDIR,
                                    metrics.listen 127.0.0.1:PORT and l1.prefault "off"

Exit 1 with a reason on stderr when the unit uses what this reader does not model
(%-specifiers, quoting, exec prefixes other than "-"), so the test cannot run something
other than what systemd would.
"""

from __future__ import annotations

import json
import os
import re
import sys


def fail(why: str) -> None:
    print(f"unit.py: {why}", file=sys.stderr)
    sys.exit(1)


def parse_unit(path: str) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order; continuation lines joined."""
    out, section, pending = [], "", ""
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = pending + raw.rstrip("\n")
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            s = line.strip()
            if not s or s[0] in "#;":
                continue
            if s.startswith("[") and s.endswith("]"):
                section = s[1:-1]
                continue
            if "=" not in s:
                fail(f"{path}: not a key=value line: {s!r}")
            k, v = s.split("=", 1)
            out.append((section, k.strip(), v.strip()))
    return out


def values(unit: list[tuple[str, str, str]], key: str) -> list[str]:
    return [v for _, k, v in unit if k == key]


def env_file(path: str) -> dict[str, str]:
    env = {}
    with open(path, encoding="utf-8") as f:
        for raw in f:
            s = raw.strip()
            if not s or s[0] in "#;":
                continue
            if "=" not in s:
                fail(f"{path}: not KEY=VALUE: {s!r}")
            k, v = s.split("=", 1)
            v = v.strip()
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
                v = v[1:-1]
            env[k.strip()] = v
    return env


def environment(unit: list[tuple[str, str, str]], destdir: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for v in values(unit, "Environment"):
        for assignment in v.split():
            if '"' in assignment or "'" in assignment:
                fail(f"Environment={v}: quoting is not modelled")
            k, _, val = assignment.partition("=")
            env[k] = val
    # EnvironmentFile= overrides Environment=; a leading "-" makes a missing file fine
    for v in values(unit, "EnvironmentFile"):
        optional = v.startswith("-")
        p = destdir + v.lstrip("-")
        if os.path.exists(p):
            env.update(env_file(p))
        elif not optional:
            fail(f"EnvironmentFile={v}: {p} does not exist")
    return env


def execstart(unit: list[tuple[str, str, str]], destdir: str) -> list[str]:
    lines = values(unit, "ExecStart")
    if len(lines) != 1:
        fail(f"want one ExecStart=, found {len(lines)}")
    cmd = lines[0]
    if "%" in cmd:
        fail(f"ExecStart={cmd}: %-specifiers are not modelled")
    if '"' in cmd or "'" in cmd:
        fail(f"ExecStart={cmd}: quoting is not modelled")
    if cmd[:1] in "@:+!":
        fail(f"ExecStart={cmd}: the prefix {cmd[0]!r} is not modelled")
    cmd = cmd.lstrip("-")
    env = environment(unit, destdir)
    argv: list[str] = []
    for word in cmd.split():
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:  # "$FOO" as a word of its own: split at whitespace, zero or more arguments
            argv += env.get(m.group(1), "").split()
        else:  # "${FOO}": the exact value, inside the one word
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda x: env.get(x.group(1), ""), word))
    if not argv or not argv[0].startswith("/"):
        fail(f"ExecStart={cmd}: the executable is not an absolute path")
    argv[0] = destdir + argv[0]
    return argv


def main() -> None:
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "get":
        for v in values(parse_unit(a[1]), a[2]):
            print(v)
    elif len(a) >= 3 and a[0] == "shell":
        unit = parse_unit(a[1])
        for k in a[2:]:
            if not re.fullmatch(r"[A-Za-z]+", k):
                fail(f"{k!r} is not a unit key")
            v = (values(unit, k) or [""])[-1]
            print(f"unit_{k}='" + v.replace("'", "'\\''") + "'")
    elif len(a) == 3 and a[0] == "execstart":
        for w in execstart(parse_unit(a[1]), a[2]):
            if "\n" in w:
                fail(f"argument {w!r} holds a newline")
            print(w)
    elif len(a) == 6 and a[0] == "config":
        with open(a[1], encoding="utf-8") as f:
            cfg = json.load(f)
        inst = cfg.setdefault("instance", {})
        inst["socket"] = os.path.join(a[3], os.path.basename(inst["socket"]))
        inst["actor_dir"] = a[4]
        cfg.setdefault("metrics", {})["listen"] = f"127.0.0.1:{a[5]}"
        cfg.setdefault("l1", {})["prefault"] = "off"
        with open(a[2], "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
    else:
        fail("usage: see the module docstring")


if __name__ == "__main__":
    main()
