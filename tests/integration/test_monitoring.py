# SPDX-License-Identifier: MIT
"""The shipped Prometheus rules and Grafana dashboard (packaging/monitoring/) are checked, not trusted.

- `promtool check rules` on the rules file;
- every dashboard query is parsed by promtool too (written as a recording rule
  into a scratch rules file, Grafana's $variables replaced by what Grafana
  would put there);
- `promtool check metrics` lints a real scrape of a real feedd with a client;
- every feedd_ metric a rule or a panel names exists in that scrape.
Skips when promtool (Debian's prometheus package) is missing.
"""

import json
import re
import shutil
import subprocess
import time

import pytest

from conftest import SRC

from test_metrics import get, metrics_conf, parse_exposition, small_data

MON = SRC / "packaging" / "monitoring"
RULES = MON / "feedd-rules.yml"
DASHBOARD = MON / "feedd-dashboard.json"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(not PROMTOOL, reason="promtool missing (Debian's prometheus package)")


def promtool(*args, stdin=None):
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, input=stdin, timeout=60)


def dashboard_exprs():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    return exprs


def grafana_to_promql(expr):
    """What Grafana sends for the dashboard's variables: a regex of all values, an interval."""
    return (expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$feed", ".*"))


def test_rules_pass_promtool():
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_dashboard_query_parses(tmp_path):
    rules = tmp_path / "dashboard-queries.yml"
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, e in enumerate(dashboard_exprs()):
        lines += [f"      - record: dashboard:query_{i}", f"        expr: {json.dumps(grafana_to_promql(e))}"]
    rules.write_text("\n".join(lines) + "\n")
    r = promtool("check", "rules", str(rules))
    assert r.returncode == 0, r.stdout + r.stderr + rules.read_text()


def metric_names(text):
    """feedd_ metric families named in PromQL text (histogram suffixes folded into their family)."""
    names = set(re.findall(r"(?<![:\w])feedd_[a-z_]+(?![:\w])", text))  # not inside a recorded name (a:b:c)
    return {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count")) else n for n in names}


def test_every_metric_the_rules_and_panels_use_is_in_a_real_scrape(daemon, tmp_path):
    data = small_data(tmp_path)
    d = daemon("[diagnosis]\nwindow_s = 3\n\n" + metrics_conf(data))
    c = d.client("web", 0, 1, 10**6, sleep_ms=20)
    try:
        assert c.stdout.readline().strip() == "attached"
        time.sleep(1.5)  # a tick: the client's telemetry and verdict exist
        status, _, body = get(d)
        assert status == 200
    finally:
        c.kill()
        c.wait()
    fams = parse_exposition(body)
    # promtool's own lint of the exposition (naming, units, histogram form).
    r = promtool("check", "metrics", stdin=body)
    problems = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    assert r.returncode == 0, problems
    used = metric_names(RULES.read_text()) | metric_names("\n".join(dashboard_exprs()))
    used |= metric_names(json.dumps(json.loads(DASHBOARD.read_text())["templating"]))
    assert {"feedd_client_verdict", "feedd_client_batch_step_seconds", "feedd_client_batch_wait_seconds"} <= used
    missing = sorted(n for n in used if n not in fams)
    assert not missing, f"named in the rules or dashboard but not exported: {missing}"
    # The recorded series a panel reads are recorded by the rules.
    recorded = set(re.findall(r"record: (\S+)", RULES.read_text()))
    for e in dashboard_exprs():
        for name in re.findall(r"[a-z_]+:[a-z_0-9:]+", e):
            assert name in recorded, f"the dashboard reads {name}, which no rule records"
    # The label the rules and panels group by are on those series.
    for n in used:
        for _, labels, _ in fams[n].samples:
            if n.startswith("feedd_client_"):
                assert {"feed", "rank", "world"} <= set(labels), (n, labels)
            elif n.startswith("feedd_feed_"):
                assert "feed" in labels, (n, labels)
