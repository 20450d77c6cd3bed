#!/usr/bin/env python3
"""tools/check-monitoring.py on small hand-made dashboards, rules and expositions: what it must find and what it must not."""

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

SRC = os.environ.get("KVR_SOURCE_ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(SRC, "tools", "check-monitoring.py")
_spec = importlib.util.spec_from_file_location("check_monitoring", TOOL)
cm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cm)

EXPOSITION = """# HELP kvring_l1_slots L1 slots by state.
# TYPE kvring_l1_slots gauge
kvring_l1_slots{state="free"} 4
kvring_l1_slots{state="committed"} 2
# TYPE kvring_matched_tokens_total counter
kvring_matched_tokens_total 64
# TYPE kvring_requested_tokens_total counter
kvring_requested_tokens_total 128
# TYPE kvring_load_duration_seconds histogram
kvring_load_duration_seconds_bucket{le="0.000016"} 0
kvring_load_duration_seconds_bucket{le="+Inf"} 2
kvring_load_duration_seconds_sum 0.5
kvring_load_duration_seconds_count 2
# TYPE kvring_instance_state gauge
kvring_instance_state{state="running"} 1
"""

RULES = """groups:
  - name: r
    rules:
      - record: kvring:token_hit_ratio:rate5m
        expr: rate(kvring_matched_tokens_total[5m]) / rate(kvring_requested_tokens_total[5m])
      - alert: KvringHitRateLow
        expr: kvring:token_hit_ratio:rate5m < 0.1 and on(instance) up == 1
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: "low"
          description: >-
            Low hit ratio
            for a while.
          runbook_url: "docs/monitoring.md#kvringhitratelow"
"""

DOCS = "# Monitoring\n\n## Alerts\n\n### KvringHitRateLow\n\ntext\n"

DS = {"type": "prometheus", "uid": "${datasource}"}


def dashboard(panels, **extra):
    d = {
        "title": "t", "uid": "u", "schemaVersion": 39, "panels": panels,
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            {"name": "instance", "type": "query", "datasource": DS,
             "query": {"query": "label_values(kvring_instance_state, instance)", "refId": "v"}},
        ]},
    }
    d.update(extra)
    return d


def panel(pid, expr, x=0, y=0, **extra):
    p = {"id": pid, "type": "timeseries", "title": "p%d" % pid, "datasource": DS,
         "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
         "targets": [{"refId": "A", "expr": expr, "datasource": DS}]}
    p.update(extra)
    return p


GOOD_PANELS = [
    {"id": 1, "type": "row", "title": "r", "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0}, "panels": []},
    panel(2, 'sum by (instance) (rate(kvring_matched_tokens_total{instance=~"$instance"}[$__rate_interval]))', 0, 1),
    panel(3, 'histogram_quantile(0.99, sum by (le) (rate(kvring_load_duration_seconds_bucket[$__rate_interval])))',
          8, 1),
    panel(4, 'sum without (state) (kvring_l1_slots{state="free"}) / ignoring(state) group_left '
             'sum(kvring_l1_slots) offset 5m', 16, 1),
]


class Checker(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvr-check-monitoring-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, name, text):
        p = os.path.join(self.dir, name)
        with open(p, "w") as f:
            f.write(text if isinstance(text, str) else json.dumps(text))
        return p

    def run_tool(self, dash=None, rules=RULES, docs=DOCS, exposition=EXPOSITION, extra=()):
        args = ["--metrics", self.write("metrics.txt", exposition)]
        if dash is not None:
            args += ["--dashboard", self.write("d.json", dash)]
        if rules is not None:
            args += ["--rules", self.write("r.yml", rules)]
        if docs is not None:
            args += ["--docs", self.write("monitoring.md", docs)]
        out = io.StringIO()
        with redirect_stdout(out):
            rc = cm.main(args + list(extra))
        return rc, out.getvalue()

    def test_good(self):
        rc, out = self.run_tool(dashboard(GOOD_PANELS))
        self.assertEqual(rc, 0, out)
        self.assertIn("check-monitoring: ok: 5 metric names", out)

    def test_missing_metric_is_named(self):
        panels = GOOD_PANELS + [panel(5, 'rate(kvring_no_such_metric_total[5m])', 0, 9)]
        rc, out = self.run_tool(dashboard(panels))
        self.assertEqual(rc, 1, out)
        self.assertIn("kvring_no_such_metric_total: not in the exposition; used by ", out)
        self.assertIn("panel 5 (p5) target A", out)
        self.assertIn("check-monitoring: 1 problem\n", out)

    def test_histogram_family_name_alone_is_not_a_series(self):
        panels = [panel(1, 'rate(kvring_load_duration_seconds[5m])')]
        rc, out = self.run_tool(dashboard(panels))
        self.assertEqual(rc, 1, out)
        self.assertIn("kvring_load_duration_seconds: not in the exposition", out)

    def test_missing_metric_in_rules_and_undefined_recording_rule(self):
        rules = RULES.replace("rate(kvring_requested_tokens_total[5m])", "rate(kvring_requested_tokenz_total[5m])")
        rules = rules.replace("kvring:token_hit_ratio:rate5m < 0.1", "kvring:token_hit_ratio:rate1m < 0.1")
        rc, out = self.run_tool(None, rules)
        self.assertEqual(rc, 1, out)
        self.assertIn("kvring_requested_tokenz_total: not in the exposition; used by ", out)
        self.assertIn("kvring:token_hit_ratio:rate1m: not a recording rule of the rules files", out)

    def test_variable_query_is_checked(self):
        d = dashboard(GOOD_PANELS)
        d["templating"]["list"][1]["query"]["query"] = "label_values(kvring_instance_statez, instance)"
        rc, out = self.run_tool(d)
        self.assertEqual(rc, 1, out)
        self.assertIn("kvring_instance_statez: not in the exposition; used by ", out)
        self.assertIn("variable instance", out)

    def test_structure(self):
        bad = [
            panel(1, "kvring_l1_slots"),
            panel(1, "kvring_l1_slots", 8, 0),                          # duplicate id
            {"id": 3, "type": "timeseries", "datasource": DS, "targets": [{"refId": "A", "expr": "kvring_l1_slots"}]},
            panel(4, "", 16, 0),                                         # empty expr
            {"id": 5, "gridPos": {"h": 2, "w": 4, "x": 0, "y": 20}, "datasource": DS,
             "targets": [{"refId": "A", "expr": "kvring_l1_slots"}]},    # no type
            panel(6, "kvring_l1_slots", 4, 4),                           # overlaps panel 1
            panel(7, "kvring_l1_slots", 20, 30),                         # past column 24
            dict(panel(8, "kvring_l1_slots", 0, 40), targets=[]),        # no targets
            dict(panel(9, "kvring_l1_slots", 0, 50), datasource={"type": "prometheus", "uid": "P1234"},
                 targets=[{"refId": "A", "expr": "kvring_l1_slots"}]),   # a fixed datasource uid
            dict(panel(10, "kvring_l1_slots", 0, 60), datasource={"type": "loki", "uid": "${datasource}"},
                 targets=[{"refId": "A", "expr": "kvring_l1_slots"}]),   # not prometheus
        ]
        rc, out = self.run_tool(dashboard(bad, schemaVersion=16), rules=None)
        self.assertEqual(rc, 1, out)
        for want in ["schemaVersion 16", "panel 1 (p1): id 1 already used",
                     "panel 3: no gridPos", "panel 4 (p4) target A: no expr", "panel 5: no type",
                     "panel 6 (p6): gridPos overlaps", "panel 7 (p7): gridPos", "outside the 24-column grid",
                     "panel 8 (p8): no targets", "uid 'P1234' is not a datasource variable",
                     "datasource type 'loki', not prometheus"]:
            self.assertIn(want, out)

    def test_no_datasource_variable_and_no_instance_variable(self):
        d = dashboard(GOOD_PANELS)
        d["templating"]["list"] = []
        rc, out = self.run_tool(d, rules=None)
        self.assertEqual(rc, 1, out)
        self.assertIn("no Prometheus datasource template variable or __inputs entry", out)
        self.assertIn("no instance variable", out)

    def test_inputs_datasource(self):
        ds = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        panels = [dict(panel(1, "kvring_l1_slots"), datasource=ds, targets=[{"refId": "A", "expr": "kvring_l1_slots",
                                                                             "datasource": ds}])]
        d = dashboard(panels, __inputs=[{"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}])
        d["templating"]["list"] = [{"name": "instance", "type": "query", "datasource": ds,
                                    "query": "label_values(kvring_l1_slots, instance)"}]
        rc, out = self.run_tool(d, rules=None)
        self.assertEqual(rc, 0, out)

    def test_alert_annotations_and_runbook_anchor(self):
        rules = RULES.replace("          severity: warning\n", "          severity: page\n")
        rules = rules.replace('          summary: "low"\n', "")
        rules = rules.replace("#kvringhitratelow", "#nowhere")
        rc, out = self.run_tool(None, rules)
        self.assertEqual(rc, 1, out)
        self.assertIn("alert KvringHitRateLow: severity label 'page'", out)
        self.assertIn("alert KvringHitRateLow: no summary annotation", out)
        self.assertIn("runbook_url anchor #nowhere is no heading of", out)

    @unittest.skipUnless(shutil.which("promtool"), "promtool is not installed")
    def test_promtool_finds_a_bad_expr(self):
        panels = [panel(1, "sum(rate(kvring_l1_slots[5m])"), panel(2, "kvring_l1_slots", 8, 0)]
        rc, out = self.run_tool(dashboard(panels), rules=None, extra=["--promtool", "promtool"])
        self.assertEqual(rc, 1, out)
        self.assertIn("panel 1 (p1) target A: promtool cannot parse the expr", out)
        self.assertNotIn("panel 2 (p2) target A: promtool", out)

    def test_command_line_exit_codes(self):
        m = self.write("metrics.txt", EXPOSITION)
        r = subprocess.run([sys.executable, TOOL, "--metrics", m], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        d = self.write("d.json", dashboard([panel(1, "kvring_gone")]))
        r = subprocess.run([sys.executable, TOOL, "--metrics", m, "--dashboard", d], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("kvring_gone: not in the exposition", r.stdout)


class PromQL(unittest.TestCase):
    def names(self, e):
        return cm.promql_metric_names(e)

    def test_functions_keywords_labels_are_not_names(self):
        self.assertEqual(self.names('sum by (instance, le) (rate(a_bucket{job=~"$job",le!="x"}[$__rate_interval]))'),
                         ["a_bucket"])
        self.assertEqual(self.names('a / on(instance) group_left(state) b unless c and bool d or e'),
                         ["a", "b", "c", "d", "e"])
        self.assertEqual(self.names('topk(10, a) > 1e3 and a offset -5m > 0x1f'), ["a", "a"])
        self.assertEqual(self.names('count_values("v", a) + quantile(0.5, b) + absent(c{x="sum(d)"})'),
                         ["a", "b", "c"])
        self.assertEqual(self.names('max_over_time(rate(a[5m])[1h:1m]) + b @ start()'), ["a", "b"])
        self.assertEqual(self.names('kvring:x:rate5m * on() group_left() vector(1)'), ["kvring:x:rate5m"])
        self.assertEqual(self.names('{__name__="a"}'), [])

    def test_variable_queries(self):
        self.assertEqual(cm.grafana_query_names('label_values(a{job=~"$job"}, instance)'), ["a"])
        self.assertEqual(cm.grafana_query_names("label_values(job)"), [])
        self.assertEqual(cm.grafana_query_names("query_result(topk(3, b))"), ["b"])


class Yaml(unittest.TestCase):
    def test_subset(self):
        text = ("a: 1\nb:\n  - x: 'q''s'\n    y: \"d\\\"q\" # c\n  - plain # comment\n"
                "c: >-\n  one\n  two\n\n  three\nd: |\n  l1\n  l2\ne: {k: v, n: [1, 2]}\nf: [p, 'q']\n")
        self.assertEqual(cm.yaml_load(text), {
            "a": "1", "b": [{"x": "q's", "y": 'd"q'}, "plain"], "c": "one two\nthree", "d": "l1\nl2\n",
            "e": {"k": "v", "n": ["1", "2"]}, "f": ["p", "q"]})

    def test_the_rules_file_parses(self):
        with open(os.path.join(SRC, "monitoring", "prometheus", "kvring-alerts.yml")) as f:
            doc = cm.yaml_load(f.read())
        alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
        self.assertGreaterEqual(len(alerts), 20)
        for r in alerts:
            self.assertTrue(r["annotations"]["runbook_url"].startswith("docs/monitoring.md#"), r["alert"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
