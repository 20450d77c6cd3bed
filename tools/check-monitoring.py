#!/usr/bin/env python3
"""Check kvring's Grafana dashboard and Prometheus rules against a real /metrics exposition.

    tools/check-monitoring.py --metrics SCRAPE.txt \
        [--dashboard monitoring/grafana/kvring.json]... \
        [--rules monitoring/prometheus/kvring-alerts.yml]... \
        [--docs docs/monitoring.md] [--promtool promtool] [--list]

Checks, every problem one line on stdout, exit 1 if there is any (0: clean, 2: bad usage):
  - dashboard: every panel has a type and a gridPos (w <= 24, inside the grid, no overlap),
    ids are unique, every non-row panel has targets, each with a refId and a non-empty expr;
    every panel, target and query variable names a Prometheus datasource through a
    datasource template variable (`${datasource}`) or an __inputs entry (`${DS_PROMETHEUS}`).
  - rules: every alert has a severity label (critical, warning, info) and summary,
    description and runbook_url annotations; with --docs, the runbook_url's anchor is a
    heading of that file.
  - metric names: every name in the dashboard's exprs and query variables and in the rules'
    exprs is a sample name of the exposition (histograms: `_bucket`, `_sum`, `_count`).
    PromQL functions, aggregations, keywords, label names and values, durations, Grafana
    variables, `up` and ALERTS, and the recording rules the rules files define, are not
    metric names.
  - with --promtool: every dashboard expr parses (`promtool check rules` over a temporary
    file, Grafana's variables replaced by values).

Python 3 standard library only: the rules file is read with a small parser of the YAML
subset rule files use (block mappings and sequences, plain and quoted scalars, folded and
literal blocks, one-line flow mappings and sequences).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# ---- a YAML subset ----------------------------------------------------------------------


class YamlError(Exception):
    pass


def _strip_comment(line):
    """The line without a trailing ' # comment' (quotes respected)."""
    q, escaped = None, False
    for i, ch in enumerate(line):
        if q:
            if escaped:
                escaped = False
            elif ch == "\\" and q == '"':
                escaped = True
            elif ch == q:
                q = None
        elif ch in "'\"":
            q = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _scalar(text):
    t = text.strip()
    if not t:
        return None
    if t.startswith('"'):
        try:
            return json.loads(t)
        except ValueError as e:
            raise YamlError("bad double-quoted scalar %s: %s" % (t, e))
    if t.startswith("'"):
        if not t.endswith("'") or len(t) < 2:
            raise YamlError("bad single-quoted scalar %s" % t)
        return t[1:-1].replace("''", "'")
    if t.startswith("{") or t.startswith("["):
        return _flow(t)
    return t


def _split_flow(body):
    """Split a flow collection's body at top-level commas."""
    parts, depth, q, cur = [], 0, None, ""
    for ch in body:
        if q:
            cur += ch
            if ch == q:
                q = None
            continue
        if ch in "'\"":
            q = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def _flow(t):
    if t.startswith("["):
        if not t.endswith("]"):
            raise YamlError("unterminated flow sequence %s" % t)
        return [_scalar(p) for p in _split_flow(t[1:-1])]
    if not t.endswith("}"):
        raise YamlError("unterminated flow mapping %s" % t)
    out = {}
    for p in _split_flow(t[1:-1]):
        k, sep, v = p.partition(":")
        if not sep:
            raise YamlError("flow mapping entry without ':': %s" % p)
        out[_scalar(k)] = _scalar(v)
    return out


_KEY = re.compile(r"^([^\s'\"#][^:]*?|\"[^\"]*\"|'[^']*'):(?:\s+(.*))?$")


def yaml_load(text):
    lines = []
    for n, raw in enumerate(text.split("\n"), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlError("line %d: tab in indentation" % n)
        stripped = _strip_comment(raw)
        lines.append((n, raw, stripped))
    pos = [0]

    def skip_blank():
        while pos[0] < len(lines) and not lines[pos[0]][2].strip():
            pos[0] += 1

    def indent_of(i):
        s = lines[i][2]
        return len(s) - len(s.lstrip())

    def block_scalar(style, parent_indent):
        body = []
        ind = None
        while pos[0] < len(lines):
            n, raw, _ = lines[pos[0]]
            if raw.strip():
                this = len(raw) - len(raw.lstrip())
                if this <= parent_indent:
                    break
                if ind is None:
                    ind = this
                body.append(raw[ind:])
            else:
                body.append("")
            pos[0] += 1
        while body and not body[-1]:
            body.pop()
        if style[0] == "|":
            s = "\n".join(body)
        else:
            # folding: a line break between two normal lines becomes a space; one next to a
            # more-indented line stays a line break; blank lines are line breaks
            s, prev = "", "blank"
            for b in body:
                if not b:
                    s += "\n"
                    prev = "blank"
                    continue
                more = b[0] in " \t"
                if prev == "blank":
                    s += b
                else:
                    s += ("\n" if more or prev == "more" else " ") + b
                prev = "more" if more else "normal"
        if not style.endswith("-"):
            s += "\n"
        return s

    def value_after(rest, indent):
        """The value of a key whose text after ':' is rest (None: a nested block follows)."""
        if rest is None or not rest.strip():
            skip_blank()
            if pos[0] < len(lines) and (indent_of(pos[0]) > indent or
                                        (indent_of(pos[0]) == indent and lines[pos[0]][2].lstrip().startswith("- "))):
                return node(indent_of(pos[0]))
            return None
        r = rest.strip()
        if r[0] in "|>":
            return block_scalar(r, indent)
        return _scalar(r)

    def node(indent):
        skip_blank()
        first = lines[pos[0]][2].lstrip()
        if first.startswith("- ") or first == "-":
            seq = []
            while True:
                skip_blank()
                if pos[0] >= len(lines) or indent_of(pos[0]) != indent:
                    break
                n, raw, s = lines[pos[0]]
                body = s.lstrip()
                if not (body.startswith("- ") or body == "-"):
                    break
                item = body[2:] if body != "-" else ""
                item_indent = indent + 2
                m = _KEY.match(item) if item else None
                if m and not item.startswith(("{", "[", '"', "'")):
                    # a mapping starting on the dash line: rewrite it as an indented line
                    lines[pos[0]] = (n, raw, " " * item_indent + item)
                    seq.append(node(item_indent))
                else:
                    pos[0] += 1
                    if item.strip():
                        seq.append(value_after(item, indent))
                    else:
                        seq.append(value_after(None, indent))
            return seq
        out = {}
        while True:
            skip_blank()
            if pos[0] >= len(lines) or indent_of(pos[0]) != indent:
                break
            n, raw, s = lines[pos[0]]
            body = s.lstrip()
            if body.startswith("- "):
                break
            m = _KEY.match(body)
            if not m:
                raise YamlError("line %d: expected 'key: value': %s" % (n, raw.strip()))
            key = _scalar(m.group(1))
            pos[0] += 1
            out[key] = value_after(m.group(2), indent)
        return out

    skip_blank()
    if pos[0] >= len(lines):
        return None
    doc = node(indent_of(pos[0]))
    skip_blank()
    if pos[0] < len(lines):
        n, raw, _ = lines[pos[0]]
        raise YamlError("line %d: unexpected indentation: %s" % (n, raw.strip()))
    return doc


# ---- PromQL: the metric names an expression selects ---------------------------------------

AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile", "limitk", "limit_ratio"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
            "atan2", "inf", "nan", "start", "end"}
LABEL_LIST_BEFORE = {"by", "without", "on", "ignoring", "group_left", "group_right"}
NOT_KVRING = {"up", "ALERTS", "ALERTS_FOR_STATE"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_TOKEN = re.compile(r"\s*(?:(?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])*)"
                    r"|(?P<id>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<op>.))")


def _drop_bracketed(s, open_ch, close_ch):
    out, depth = [], 0
    for ch in s:
        if ch == open_ch:
            depth += 1
            out.append(open_ch if depth == 1 else "")
        elif ch == close_ch and depth:
            depth -= 1
            out.append(close_ch if depth == 0 else "")
        elif not depth:
            out.append(ch)
    return "".join(out)


def promql_metric_names(expr):
    """The metric names (and recording-rule names) an expression selects, in order of appearance."""
    s = _STRING.sub('""', expr)
    s = _drop_bracketed(s, "{", "}")      # label matchers: names and (already emptied) values
    s = _drop_bracketed(s, "[", "]")      # ranges and subqueries, Grafana's $__rate_interval
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " 1 ", s)  # any other Grafana variable stands for a value
    toks = [(m.lastgroup, m.group(m.lastgroup)) for m in _TOKEN.finditer(s) if m.lastgroup]
    names, i = [], 0
    while i < len(toks):
        kind, val = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "id" and val in LABEL_LIST_BEFORE and nxt == "(":
            depth, i = 0, i + 1           # skip the label list
            while i < len(toks):
                if toks[i][1] == "(":
                    depth += 1
                elif toks[i][1] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
        elif kind == "id" and val == "offset":
            i += 1                          # its duration (a num token; -5m: '-' then num)
            if i < len(toks) and toks[i][1] == "-":
                i += 1
        elif kind == "id" and (val in KEYWORDS or val in AGGREGATIONS or nxt == "("):
            pass                            # a keyword, an aggregation or a function
        elif kind == "id":
            names.append(val)
        i += 1
    return names


def grafana_query_names(query):
    """Metric names of a Prometheus query variable: label_values(q, l), query_result(q), or PromQL."""
    q = query.strip()
    m = re.match(r"^label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)$", q, re.S)
    if m:
        return promql_metric_names(m.group(1))
    if re.match(r"^label_values\(\s*[A-Za-z_][A-Za-z0-9_]*\s*\)$", q) or q.startswith("label_names(") \
            or q.startswith("metrics("):
        return []
    m = re.match(r"^query_result\((.*)\)$", q, re.S)
    return promql_metric_names(m.group(1) if m else q)


# ---- the exposition ---------------------------------------------------------------------

def exposition_names(text):
    """Sample names of a text-format exposition."""
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)", line)
        if m:
            names.add(m.group(1))
    return names


# ---- the dashboard ----------------------------------------------------------------------

NO_TARGETS = {"row", "text", "news", "dashlist", "alertlist", "annolist", "welcome"}


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, what):
        self.items.append("%s: %s" % (where, what))


def _ds_vars(dash):
    """Names a datasource ref may use: datasource template variables and __inputs."""
    ok = set()
    for v in (dash.get("templating") or {}).get("list") or []:
        if isinstance(v, dict) and v.get("type") == "datasource" and v.get("query") == "prometheus":
            ok.add(v.get("name"))
    for inp in dash.get("__inputs") or []:
        if isinstance(inp, dict) and inp.get("type") == "datasource" and inp.get("pluginId") == "prometheus":
            ok.add(inp.get("name"))
    return ok


def _check_ds(ds, ds_vars, where, probs, required):
    if ds is None:
        if required:
            probs.add(where, "no datasource")
        return
    if isinstance(ds, str):
        uid, typ = ds, "prometheus"
    elif isinstance(ds, dict):
        uid, typ = ds.get("uid"), ds.get("type")
    else:
        probs.add(where, "datasource is neither a reference nor a string")
        return
    if typ != "prometheus":
        probs.add(where, "datasource type %r, not prometheus" % typ)
    m = re.match(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$", uid or "")
    if not m or m.group(1) not in ds_vars:
        probs.add(where, "datasource uid %r is not a datasource variable (%s)" %
                  (uid, ", ".join("${%s}" % v for v in sorted(ds_vars)) or "none defined"))


def check_dashboard(path, probs, uses):
    """Structure of the dashboard at path; appends (where, expr, names) of each query to uses."""
    try:
        with open(path) as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        probs.add(path, "cannot read the dashboard: %s" % e)
        return []
    if not isinstance(dash, dict) or not isinstance(dash.get("panels"), list):
        probs.add(path, "not a dashboard: no panels list")
        return []
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        probs.add(path, "schemaVersion %r: not a current Grafana's (36 or later)" % dash.get("schemaVersion"))
    for key in ("title", "uid"):
        if not dash.get(key):
            probs.add(path, "no %s" % key)
    ds_vars = _ds_vars(dash)
    if not ds_vars:
        probs.add(path, "no Prometheus datasource template variable or __inputs entry")
    exprs = []
    var_names = set()
    for v in (dash.get("templating") or {}).get("list") or []:
        name = v.get("name")
        var_names.add(name)
        if v.get("type") != "query":
            continue
        where = "%s: variable %s" % (path, name)
        _check_ds(v.get("datasource"), ds_vars, where, probs, True)
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if not isinstance(q, str) or not q.strip():
            probs.add(where, "no query")
            continue
        uses.append((where, q, grafana_query_names(q)))
    if "instance" not in var_names:
        probs.add(path, "no instance variable")

    ids, grid = {}, []

    def walk(panels, where_prefix, top):
        for i, p in enumerate(panels):
            where = "%s: panel %s" % (path, p.get("id", "#%d%s" % (i, where_prefix)))
            if p.get("title"):
                where += " (%s)" % p["title"]
            typ = p.get("type")
            if not isinstance(typ, str) or not typ:
                probs.add(where, "no type")
            pid = p.get("id")
            if not isinstance(pid, int):
                probs.add(where, "no integer id")
            elif pid in ids:
                probs.add(where, "id %d already used by %s" % (pid, ids[pid]))
            else:
                ids[pid] = p.get("title", "")
            g = p.get("gridPos")
            if not isinstance(g, dict) or not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
                probs.add(where, "no gridPos with integer h, w, x, y")
            elif g["w"] < 1 or g["h"] < 1 or g["x"] < 0 or g["y"] < 0 or g["x"] + g["w"] > 24:
                probs.add(where, "gridPos %r outside the 24-column grid" % g)
            elif top:
                for other_where, o in grid:
                    if (g["x"] < o["x"] + o["w"] and o["x"] < g["x"] + g["w"] and
                            g["y"] < o["y"] + o["h"] and o["y"] < g["y"] + g["h"]):
                        probs.add(where, "gridPos overlaps %s" % other_where)
                grid.append((where, g))
            if typ == "row":
                walk(p.get("panels") or [], " in a row", not p.get("collapsed"))
                continue
            if typ in NO_TARGETS:
                continue
            _check_ds(p.get("datasource"), ds_vars, where, probs, False)
            targets = p.get("targets")
            if not isinstance(targets, list) or not targets:
                probs.add(where, "no targets")
                continue
            refs = set()
            for t in targets:
                tw = "%s target %s" % (where, t.get("refId"))
                if not t.get("refId"):
                    probs.add(tw, "no refId")
                elif t["refId"] in refs:
                    probs.add(tw, "refId used twice")
                refs.add(t.get("refId"))
                _check_ds(t.get("datasource"), ds_vars, tw, probs, p.get("datasource") is None)
                e = t.get("expr")
                if not isinstance(e, str) or not e.strip():
                    probs.add(tw, "no expr")
                    continue
                exprs.append((tw, e))
                uses.append((tw, e, promql_metric_names(e)))

    walk(dash["panels"], "", True)
    return exprs


# ---- the rules --------------------------------------------------------------------------

def _slug(heading):
    """GitHub's anchor of a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def doc_anchors(path):
    anchors = set()
    with open(path) as f:
        in_code = False
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m and not in_code:
                anchors.add(_slug(m.group(1)))
            for a in re.findall(r'<a\s+(?:name|id)="([^"]+)"', line):
                anchors.add(a)
    return anchors


def check_rules(path, probs, uses, records, anchors, docs_path):
    try:
        with open(path) as f:
            doc = yaml_load(f.read())
    except (OSError, YamlError) as e:
        probs.add(path, "cannot read the rules: %s" % e)
        return
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not isinstance(groups, list) or not groups:
        probs.add(path, "no groups")
        return
    for g in groups:
        for r in (g or {}).get("rules") or []:
            if not isinstance(r, dict):
                probs.add(path, "a rule that is not a mapping in group %s" % g.get("name"))
                continue
            if r.get("record"):
                records.add(r["record"])
    for g in groups:
        for r in (g or {}).get("rules") or []:
            if not isinstance(r, dict):
                continue
            name = r.get("alert") or r.get("record")
            where = "%s: %s %s" % (path, "alert" if r.get("alert") else "record", name)
            expr = r.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                probs.add(where, "no expr")
                continue
            uses.append((where, expr, promql_metric_names(expr)))
            if not r.get("alert"):
                continue
            labels = r.get("labels") or {}
            ann = r.get("annotations") or {}
            if labels.get("severity") not in ("critical", "warning", "info"):
                probs.add(where, "severity label %r is not critical, warning or info" % labels.get("severity"))
            for a in ("summary", "description", "runbook_url"):
                if not isinstance(ann.get(a), str) or not ann[a].strip():
                    probs.add(where, "no %s annotation" % a)
            url = ann.get("runbook_url") or ""
            if anchors is not None and url:
                frag = url.partition("#")[2]
                if not frag:
                    probs.add(where, "runbook_url %s has no #anchor" % url)
                elif frag not in anchors:
                    probs.add(where, "runbook_url anchor #%s is no heading of %s" % (frag, docs_path))


# ---- promtool: do the dashboard's exprs parse? ---------------------------------------------

def promtool_parse(promtool, exprs, probs):
    def grafana_values(e):
        e = re.sub(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}", "5m", e)
        e = re.sub(r"\$__(range_s|interval_ms|range_ms)\b", "300", e)
        return re.sub(r"\$\{[^}]*\}|\$\w+", ".*", e)

    body = ["groups:", "  - name: dashboard", "    rules:"]
    for i, (_, e) in enumerate(exprs):
        body.append("      - record: dashboard:expr_%d" % i)
        body.append("        expr: %s" % json.dumps(grafana_values(e)))
    fd, tmp = tempfile.mkstemp(prefix="kvring-dashboard-", suffix=".yml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(body) + "\n")
        try:
            r = subprocess.run([promtool, "check", "rules", tmp], capture_output=True, text=True, timeout=60)
        except OSError as e:
            probs.add("promtool", "cannot run %s: %s" % (promtool, e))
            return
        if r.returncode != 0:
            out = r.stdout + r.stderr
            idx = {"dashboard:expr_%d" % i: w for i, (w, _) in enumerate(exprs)}
            named = False
            for name, where in idx.items():
                if re.search(r"\b%s\b" % re.escape(name), out):
                    probs.add(where, "promtool cannot parse the expr")
                    named = True
            probs.add("promtool", "check rules on the dashboard's exprs failed%s:\n%s" %
                      ("" if named else " (no expr named)", out.strip()))
    finally:
        os.unlink(tmp)


# ---- main -------------------------------------------------------------------------------

def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--metrics", required=True, help="a /metrics exposition (text format) of a real kvringd")
    ap.add_argument("--dashboard", action="append", default=[], help="a Grafana dashboard JSON")
    ap.add_argument("--rules", action="append", default=[], help="a Prometheus rules file")
    ap.add_argument("--docs", help="the runbook (docs/monitoring.md): runbook_url anchors must be its headings")
    ap.add_argument("--promtool", help="promtool: also check that the dashboard's exprs parse")
    ap.add_argument("--list", action="store_true", help="print every metric name used and where")
    a = ap.parse_args(argv)
    if not a.dashboard and not a.rules:
        ap.error("nothing to check: give --dashboard and/or --rules")

    probs = Problems()
    try:
        with open(a.metrics) as f:
            have = exposition_names(f.read())
    except OSError as e:
        print("%s: cannot read: %s" % (a.metrics, e))
        return 1
    if not have:
        probs.add(a.metrics, "no samples in the exposition")
    anchors = None
    if a.docs:
        try:
            anchors = doc_anchors(a.docs)
        except OSError as e:
            probs.add(a.docs, "cannot read: %s" % e)

    uses, records, exprs = [], set(), []
    for r in a.rules:
        check_rules(r, probs, uses, records, anchors, a.docs)
    for d in a.dashboard:
        exprs += check_dashboard(d, probs, uses)

    missing = {}
    used = set()
    for where, _, names in uses:
        for n in names:
            if n in records or n in NOT_KVRING:
                continue
            used.add(n)
            if n not in have:
                missing.setdefault(n, []).append(where)
    for n in sorted(missing):
        what = "not a recording rule of the rules files" if ":" in n else "not in the exposition"
        probs.add(n, "%s; used by %s" % (what, "; ".join(missing[n][:3]) +
                                      (" and %d more" % (len(missing[n]) - 3) if len(missing[n]) > 3 else "")))
    if a.promtool and exprs:
        promtool_parse(a.promtool, exprs, probs)

    if a.list:
        for n in sorted(used):
            print("uses %s" % n)
    for p in probs.items:
        print(p)
    if probs.items:
        print("check-monitoring: %d problem%s" % (len(probs.items), "" if len(probs.items) == 1 else "s"))
        return 1
    print("check-monitoring: ok: %d metric names in %d exprs exist in %s; %d recording rules" %
          (len(used), len(uses), a.metrics, len(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
