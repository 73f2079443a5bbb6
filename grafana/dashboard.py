#!/usr/bin/env python3
"""Generates grafana/dashboards/tokenmeter.json, the tokenmeter Grafana dashboard.

The JSON is the artifact (compose provisions it, users import it); this script only keeps it
consistent: one datasource reference, ids in order, a grid that never overlaps. Edit here, run
`python3 grafana/dashboard.py`, commit both. `--check` exits 1 when the JSON is stale.

Queries use only what tokenmeter exports (docs/MEASUREMENT.md) and the recording rules
`tokenmeter rules` generates (docker/prometheus/rules.yaml). Per-model panels read the raw
families, because the rules aggregate by deployment and route only; tests/dashboard.rs checks
all of it, against a real Prometheus scraping several sidecars in two deployments.

A fleet, not a pod. One Prometheus scrapes many deployments whose routes share names, so:

- A deployment is told apart by its grouping labels, by default `namespace` and `job` (what
  Prometheus gives every target: a PodMonitor and a static config both set `job`), the same
  labels `tokenmeter rules` keeps through every aggregation. Each is a variable of the same name
  (so an alert's `var-namespace=...&var-job=...` link selects its deployment), each filtered by
  the ones before it, then `route`, `model` and the pod.
- Every selector carries every grouping label's matcher; every aggregation groups by all the
  grouping labels (`sum by (namespace, job, route, model)`), never fewer, so two deployments'
  counters are never summed into one; every legend starts with the deployment
  (`{{namespace}}/{{job}} · {{route}}`).
- The pod variable is `instance`, labelled "Pod": every scrape config sets `instance` (one per
  target, so one per sidecar), while `pod` exists only where Kubernetes service discovery
  relabels it in, not in static configs (compose, a laptop, a VM fleet), where a `pod` drill-down
  would offer nothing to pick. Only raw families are filtered by it: the recorded series have no
  instance label, and the Fleet row is about whole deployments, so those panels (their
  descriptions say so) show every pod of the selected deployments.
- A grouping label no target has (compose sets no `namespace`) leaves its variable with no value
  or All; both match the missing label, whose value is the empty string (`=~""`, `=~".*"`).

Fleets that name deployments otherwise (a `service` label, a `cluster` above several clusters)
generate rules with `tokenmeter rules --group-by ...` and this dashboard with the same labels:
`python3 grafana/dashboard.py --labels cluster,namespace,service --out my-dashboard.json`. The
uid stays `tokenmeter`, which the alerts link to; the committed JSON uses namespace, job.
"""

import argparse
import json
import pathlib
import re
import sys

OUT = pathlib.Path(__file__).resolve().parent / "dashboards" / "tokenmeter.json"
DEFAULT_LABELS = ["namespace", "job"]

DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
DASHED = {"fill": "dash", "dash": [10, 10]}
# The pod drill-down's variable and label (see the module docstring for why `instance`).
POD = "instance"


class Fleet:
    """The grouping labels that tell deployments apart, and the PromQL and legends built on them.

    Invariant: every selector it writes matches every grouping label against its variable, and
    every grouping clause it writes lists every grouping label.
    """

    def __init__(self, labels):
        self.labels = list(labels)
        # The recording rules' level prefix: `namespace_job`, then `_route`, `_route_le`...
        self.level = "_".join(self.labels)
        self.deployment = "/".join("{{%s}}" % l for l in self.labels)

    def sel(self, *parts):
        """A label matcher set: every grouping label, then `route`, `model`, `pod` (the pod
        variable) or literal matchers, in the order given."""
        matchers = [f'{l}=~"${l}"' for l in self.labels]
        for part in parts:
            if part in ("route", "model"):
                matchers.append(f'{part}=~"${part}"')
            elif part == "pod":
                matchers.append(f'{POD}=~"${POD}"')
            else:
                matchers.append(part)
        return "{" + ", ".join(matchers) + "}"

    def by(self, *extra):
        return "by (" + ", ".join(self.labels + list(extra)) + ")"

    def on_target(self):
        """`on (...)` matching two families of the same scrape target."""
        extra = [l for l in ("job", POD) if l not in self.labels]
        return "on (" + ", ".join(self.labels + extra) + ")"

    def rec(self, extra, metric, operations):
        """A recorded series name: `namespace_job_route:metric:operations`."""
        return ":".join(["_".join([self.level, *extra]), metric, operations])

    def legend(self, *parts):
        """The deployment, then the rest: `{{namespace}}/{{job}} · {{route}} · {{model}}`."""
        return " · ".join([self.deployment, *parts])


def rate(metric, sel, window=RI):
    return f"rate({metric}{sel}[{window}])"


class Layout:
    """Places panels left to right on Grafana's 24-column grid, one row after another."""

    def __init__(self):
        self.panels = []
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_h = 0

    def _id(self):
        self.next_id += 1
        return self.next_id - 1

    def row(self, title, repeat=None):
        self._newline()
        row = {
            "id": self._id(),
            "type": "row",
            "title": title,
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            "panels": [],
        }
        if repeat:
            row["repeat"] = repeat
        self.panels.append(row)
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def add(self, panel, w, h=8):
        assert 0 < w <= 24, w
        if self.x + w > 24:
            self._newline()
        panel = {"id": self._id(), **panel, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y}}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def target(ref, expr, legend, instant=False, table=False):
    t = {
        "datasource": DS,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend,
        "editorMode": "code",
        "range": not instant,
        "instant": instant,
    }
    if table:
        t["format"] = "table"
    return t


def targets(*queries, instant=False, table=False):
    return [target(chr(ord("A") + i), e, l, instant, table) for i, (e, l) in enumerate(queries)]


def dashed(ref, color=None):
    """An override drawing every series of query `ref` as a dashed line (objectives, thresholds)."""
    props = [
        {"id": "custom.lineStyle", "value": DASHED},
        {"id": "custom.fillOpacity", "value": 0},
    ]
    if color:
        props.append({"id": "color", "value": {"mode": "fixed", "fixedColor": color}})
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": props}


def timeseries(title, description, tgts, unit, overrides=(), stack=False, bars=False, **defaults):
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 60 if bars else (30 if stack else 8),
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    custom.update(defaults.pop("custom", {}))
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {"unit": unit, "color": {"mode": "palette-classic"}, "custom": custom, **defaults},
            "overrides": list(overrides),
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": tgts,
    }


def steps(*pairs):
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in pairs]}


BURN_STEPS = steps((None, "green"), (1, "yellow"), (6, "orange"), (14.4, "red"))
BUDGET_STEPS = steps((None, "red"), (0, "orange"), (0.25, "yellow"), (0.5, "green"))


def stat(title, description, tgts, unit, thresholds=None, decimals=None, graph=True):
    defaults = {"unit": unit, "color": {"mode": "thresholds"}}
    defaults["thresholds"] = thresholds or steps((None, "blue"))
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area" if graph else "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "value_and_name",
        },
        "targets": tgts,
    }


def bargauge(title, description, tgts, unit):
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {"unit": unit, "min": 0, "color": {"mode": "continuous-YlRd"}},
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
        },
        "targets": tgts,
    }


def table(title, description, keys, columns):
    """One row per series key (`keys`, the labels the queries share), one column per instant
    query: `columns` is a list of (title, expr, unit, decimals, thresholds or None). Grafana
    names a query's value `Value #<refId>` once there are several; `merge` joins the rows on the
    shared labels and `organize` names the columns and drops Time."""
    tgts = targets(*[(expr, title) for title, expr, *_ in columns], instant=True, table=True)
    rename, order, overrides = {}, {k: i for i, k in enumerate(keys)}, []
    for t, (name, _expr, unit, decimals, thresholds) in zip(tgts, columns):
        rename[f"Value #{t['refId']}"] = name
        order[f"Value #{t['refId']}"] = len(order)
        props = [{"id": "unit", "value": unit}, {"id": "decimals", "value": decimals}]
        if thresholds:
            props += [
                {"id": "thresholds", "value": thresholds},
                {"id": "color", "value": {"mode": "thresholds"}},
                {"id": "custom.cellOptions", "value": {"type": "color-background", "mode": "basic"}},
            ]
        overrides.append({"matcher": {"id": "byName", "options": name}, "properties": props})
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}},
            "overrides": overrides,
        },
        "options": {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True},
                "indexByName": order,
                "renameByName": rename,
            }},
        ],
        "targets": tgts,
    }


def quantiles(f, bucket, sel, *by):
    """p50/p95/p99 per deployment (and `by`): the buckets of one deployment's pods summed, never
    two deployments'."""
    return [
        (f"histogram_quantile({q}, sum {f.by(*by, 'le')} ({rate(bucket, sel)}))",
         f.legend(*[f"{{{{{l}}}}}" for l in by], f"p{int(q * 100)}"))
        for q in (0.5, 0.95, 0.99)
    ]


def fleet_row(g, f):
    """Every deployment side by side: attainment against objective, burn, traffic."""
    route = f.sel("route")
    rec = lambda metric, ops: f.rec(["route"], metric, ops) + route
    g.row("Fleet: goodput and error-budget burn per deployment")
    g.add(table(
        "Deployments side by side",
        "One row per deployment and route (recorded rules, all pods of the deployment): "
        "requests/s over 5 minutes, SLO attainment (good / judged requests) over 1 hour and "
        "30 days against the route's objective, the error-budget burn rate over 1 and 6 hours "
        "(14.4 and 6 page) and the share of the 30-day budget left.",
        f.labels + ["route"],
        [
            ("Requests/s", rec("tokenmeter_requests", "rate5m"), "reqps", 2, None),
            ("Attainment 1h", rec("tokenmeter_slo_goodput", "ratio_rate1h"), "percentunit", 3, None),
            ("Attainment 30d", rec("tokenmeter_slo_goodput", "ratio_rate30d"), "percentunit", 3, None),
            ("Objective", rec("tokenmeter_slo_objective", "ratio"), "percentunit", 3, None),
            ("Burn 1h", rec("tokenmeter_slo_error_budget_burn", "ratio_rate1h"), "suffix:×", 2, BURN_STEPS),
            ("Burn 6h", rec("tokenmeter_slo_error_budget_burn", "ratio_rate6h"), "suffix:×", 2, BURN_STEPS),
            ("Budget left 30d", "1 - " + rec("tokenmeter_slo_error_budget_burn", "ratio_rate30d"),
             "percentunit", 1, BUDGET_STEPS),
        ]), 24, 7)
    g.add(timeseries(
        "Attainment per deployment, 1h",
        "Good / judged requests over the last hour per deployment and route (recorded rule, all "
        "pods). Dashed: the objective of that deployment's route.",
        targets(
            (rec("tokenmeter_slo_goodput", "ratio_rate1h"), f.legend("{{route}}")),
            (rec("tokenmeter_slo_objective", "ratio"), f.legend("{{route}} objective")),
        ),
        "percentunit", [dashed("B", "red")], max=1), 8)
    g.add(timeseries(
        "Error-budget burn per deployment, 1h and 6h",
        "How fast each deployment's route spends its error budget (recorded rules, all pods). "
        "The fast-burn page needs 14.4 over 1 hour, the slow one 6 over 6 hours.",
        targets(
            (rec("tokenmeter_slo_error_budget_burn", "ratio_rate1h"), f.legend("{{route}} 1h")),
            (rec("tokenmeter_slo_error_budget_burn", "ratio_rate6h"), f.legend("{{route}} 6h")),
        ),
        "suffix:×", min=0, thresholds=BURN_STEPS,
        custom={"thresholdsStyle": {"mode": "dashed"}}), 8)
    g.add(timeseries(
        "Requests/s per deployment",
        "Finished requests per second per deployment and route, every outcome, all pods.",
        targets((f"sum {f.by('route')} ({rate('tokenmeter_requests_total', f.sel('route', 'model'))})",
                 f.legend("{{route}}"))),
        "reqps", min=0), 8)


def build(f):
    g = Layout()
    RM = f.sel("route", "model", "pod")
    R = f.sel("route")
    RP = f.sel("route", "pod")
    P = f.sel("pod")
    rm = (lambda family: rate(family, RM))
    by_rm = f.by("route", "model")

    fleet_row(g, f)

    g.row("Goodput and SLO attainment")
    g.add(timeseries(
        "Goodput (requests/s)",
        "Good requests per second (outcome ok and every SLO criterion met), against all "
        "requests judged by the SLO (dashed: good + violated), per deployment, route and model.",
        targets(
            (f"sum {by_rm} ({rm('tokenmeter_slo_good_requests_total')})",
             f.legend("{{route}}", "{{model}} good")),
            (f"sum {by_rm} ({rm('tokenmeter_slo_eligible_requests_total')})",
             f.legend("{{route}}", "{{model}} judged")),
        ),
        "reqps", [dashed("B")]), 8)
    g.add(timeseries(
        "Goodput (output tokens/s)",
        "Output tokens of good requests per second, against all output tokens (dashed), "
        "per deployment, route and model.",
        targets(
            (f"sum {by_rm} ({rm('tokenmeter_slo_good_output_tokens_total')})",
             f.legend("{{route}}", "{{model}} good")),
            (f"sum {by_rm} ({rm('tokenmeter_output_tokens_total')})",
             f.legend("{{route}}", "{{model}} all")),
        ),
        "short", [dashed("B")]), 8)
    g.add(timeseries(
        "SLO attainment vs objective",
        "Good / judged requests per deployment, route and model (counters of the deployment's "
        "pods summed first, then divided). Dashed: the objective of the deployment's route "
        "(tokenmeter_slo_objective_ratio).",
        targets(
            (f"sum {by_rm} ({rm('tokenmeter_slo_good_requests_total')})\n"
             f"  / sum {by_rm} ({rm('tokenmeter_slo_eligible_requests_total')})",
             f.legend("{{route}}", "{{model}}")),
            (f"max {f.by('route')} (tokenmeter_slo_objective_ratio{RP})", f.legend("{{route}} objective")),
        ),
        "percentunit", [dashed("B", "red")], max=1), 8)
    g.add(stat(
        "Attainment, 30 days",
        "Good / judged requests per deployment and route over 30 days (recorded rule, all pods).",
        targets((f"{f.rec(['route'], 'tokenmeter_slo_goodput', 'ratio_rate30d')}{R}",
                 f.legend("{{route}}"))),
        "percentunit", decimals=3), 4)
    g.add(stat(
        "Error budget remaining, 30 days",
        "1 − the 30-day burn rate: the share of the error budget (1 − objective) of each "
        "deployment's route not yet spent (recorded rule, all pods). Below zero, the objective "
        "is missed over 30 days.",
        targets((f"1 - {f.rec(['route'], 'tokenmeter_slo_error_budget_burn', 'ratio_rate30d')}{R}",
                 f.legend("{{route}}"))),
        "percentunit", thresholds=BUDGET_STEPS, decimals=1), 4)
    g.add(timeseries(
        "Error budget burn rate",
        "How fast each deployment's route spends its error budget (1 = exactly on budget over "
        "30 days), over 1 hour, 6 hours and 3 days (recorded rules, all pods). The alert "
        "thresholds are drawn: 14.4 (page, 1h), 6 (page, 6h), 1 (ticket, 3d).",
        targets(*[
            (f"{f.rec(['route'], 'tokenmeter_slo_error_budget_burn', f'ratio_rate{w}')}{R}",
             f.legend(f"{{{{route}}}} {w}"))
            for w in ("1h", "6h", "3d")
        ]),
        "suffix:×", min=0, thresholds=BURN_STEPS,
        custom={"thresholdsStyle": {"mode": "dashed"}}), 8)
    g.add(timeseries(
        "p99 by deployment and route (recorded 5m)",
        "p99 TTFT and E2E per deployment and route over all of its pods, from the recorded "
        "bucket rates (histogram_quantile over the buckets summed per deployment, route and le).",
        targets(*[
            (f"histogram_quantile(0.99, sum {f.by('route', 'le')} "
             f"({f.rec(['route', 'le'], family + '_bucket', 'rate5m')}{R}))",
             f.legend(f"{{{{route}}}} {name}"))
            for name, family in (("TTFT", "tokenmeter_time_to_first_token_seconds"),
                                 ("E2E", "tokenmeter_request_duration_seconds"))
        ]),
        "s"), 8)

    g.row("Latency: $route", repeat="route")
    for name, family, criterion, what in [
        ("TTFT", "tokenmeter_time_to_first_token_seconds", "ttft",
         "Time to first token: request head read to the first output-bearing event."),
        ("TPOT", "tokenmeter_time_per_output_token_seconds", "tpot",
         "Time per output token after the first: (last − first token) / (N − 1)."),
        ("ITL", "tokenmeter_inter_token_latency_seconds", "max_itl",
         "Inter-token latency, one sample per gap. The dashed max_itl threshold applies to "
         "each request's largest gap."),
        ("E2E", "tokenmeter_request_duration_seconds", "e2e",
         "End to end: request head read to the end of the response body."),
    ]:
        g.add(timeseries(
            f"{name} p50 / p95 / p99",
            f"{what} Per deployment, selected models and pods, summed by le. Dashed: the "
            "route's SLO threshold in each deployment.",
            targets(
                *quantiles(f, f"{family}_bucket", RM),
                (f"max {f.by()} (tokenmeter_slo_threshold_seconds"
                 f"{f.sel('route', 'pod', f'criterion={json.dumps(criterion)}')})",
                 f.legend(f"SLO {criterion}")),
            ),
            "s", [dashed("D", "red")]), 6)

    g.row("Traffic")
    g.add(timeseries(
        "Requests/s by outcome",
        "Finished requests per second per deployment: ok, error (5xx, 429, broken or truncated "
        "streams), client_error (other 4xx, excluded from SLOs), cancelled (client went away).",
        targets((f"sum {f.by('outcome')} ({rm('tokenmeter_requests_total')})", f.legend("{{outcome}}"))),
        "reqps", min=0), 6)
    g.add(timeseries(
        "Tokens/s in and out",
        "Prompt tokens (from usage, when the server reports it) and output tokens per second.",
        targets(
            (f"sum {by_rm} ({rm('tokenmeter_prompt_tokens_total')})", f.legend("{{route}}", "{{model}} in")),
            (f"sum {by_rm} ({rm('tokenmeter_output_tokens_total')})", f.legend("{{route}}", "{{model}} out")),
        ),
        "short"), 6)
    g.add(timeseries(
        "In flight",
        "Requests whose response has not ended yet, per deployment and route (no model label).",
        targets((f"sum {f.by('route')} (tokenmeter_in_flight_requests{RP})", f.legend("{{route}}"))),
        "short", min=0), 6)
    g.add(timeseries(
        "Output tokens per request",
        "Output tokens per finished request per deployment, selected routes, models and pods.",
        targets(*quantiles(f, "tokenmeter_request_output_tokens_bucket", RM)),
        "short"), 6)

    g.row("Errors, violations and finish reasons")
    failed = f.sel("route", "model", "pod", 'outcome=~"error|cancelled"')
    errors = f.sel("route", "model", "pod", 'outcome="error"')
    g.add(timeseries(
        "Errors and cancellations (requests/s)",
        "Requests that failed (error) or were abandoned by the client (cancelled).",
        targets((f"sum {f.by('route', 'model', 'outcome')} ({rate('tokenmeter_requests_total', failed)})",
                 f.legend("{{route}}", "{{model}} {{outcome}}"))),
        "reqps"), 8)
    g.add(timeseries(
        "Error ratio",
        "Errors / all finished requests, per deployment, route and model.",
        targets((f"sum {by_rm} ({rate('tokenmeter_requests_total', errors)})\n"
                 f"  / sum {by_rm} ({rm('tokenmeter_requests_total')})",
                 f.legend("{{route}}", "{{model}}"))),
        "percentunit", min=0), 8)
    g.add(timeseries(
        "SLO violations by criterion",
        "Failed criteria per second (ttft, tpot, e2e, max_itl, error) per deployment; one "
        "request may fail several.",
        targets((f"sum {f.by('criterion')} ({rm('tokenmeter_slo_violations_total')})",
                 f.legend("{{criterion}}"))),
        "short"), 8)
    g.add(bargauge(
        "Violations by deployment, route and criterion, last hour",
        "Failed criteria per second over the last hour (recorded rule, all pods): what fails "
        "most, and where.",
        targets((f"{f.rec(['route', 'criterion'], 'tokenmeter_slo_violations', 'rate1h')}{R}",
                 f.legend("{{route}} {{criterion}}")), instant=True),
        "short"), 12)
    g.add(timeseries(
        "Finish reasons",
        "Why generation stopped, as the server reported it, per second (route only: "
        "finish reasons carry no model label).",
        targets((f"sum {f.by('reason')} ({rate('tokenmeter_finish_reasons_total', RP)})",
                 f.legend("{{reason}}"))),
        "short"), 12)

    D = f.sel()
    g.row("Cost per deployment (all pods; needs cost in the config)")
    for title, metric in [
        ("Cost per request", "tokenmeter_cost_per_request"),
        ("Cost per million output tokens", "tokenmeter_cost_per_million_output_tokens"),
        ("Cost per million good output tokens", "tokenmeter_cost_per_million_good_output_tokens"),
    ]:
        g.add(stat(
            title,
            "The configured cost per hour of the deployment's replicas over its measured rate "
            "of the last hour (recorded rule), in the configured currency.",
            targets((f"{f.rec([], metric, 'rate1h')}{D}", f.legend("{{currency}}"))),
            "short", decimals=4), 6)
    g.add(stat(
        "Cost per hour",
        "The configured cost per hour times the deployment's replicas running (recorded rule).",
        targets((f"{f.rec([], 'tokenmeter_cost_per_hour', 'sum')}{D}", f.legend("{{currency}}"))),
        "short", decimals=2), 6)
    g.add(timeseries(
        "Cost per million output tokens over time",
        "All output tokens against those of good requests, per deployment: the gap is what SLO "
        "misses cost.",
        targets(
            (f"{f.rec([], 'tokenmeter_cost_per_million_output_tokens', 'rate1h')}{D}",
             f.legend("all ({{currency}})")),
            (f"{f.rec([], 'tokenmeter_cost_per_million_good_output_tokens', 'rate1h')}{D}",
             f.legend("good ({{currency}})")),
        ),
        "short"), 24, 7)

    g.row("Proxy health")
    pod = f.legend("{{instance}}")
    g.add(timeseries(
        "Config reloads",
        "Configuration reloads by result: error means the file was refused and the running "
        "configuration kept.",
        targets((f"sum {f.by('result')} (increase(tokenmeter_config_reloads_total{P}[{RI}]))",
                 f.legend("{{result}}"))),
        "short", bars=True), 6)
    g.add(stat(
        "Config loaded",
        "When each pod last loaded its configuration successfully.",
        targets((f"max {f.by(POD)} (tokenmeter_config_last_reload_success_timestamp_seconds{P}) * 1000",
                 pod)),
        "dateTimeFromNow", graph=False), 6)
    g.add(timeseries(
        "Access-log records dropped",
        "Per-request records dropped per second because the writer fell behind; should be 0.",
        targets((f"sum {f.by(POD)} ({rate('tokenmeter_access_log_dropped_total', P)})", pod)),
        "short", min=0), 6)
    g.add(stat(
        "Pods by version",
        "Running tokenmeter sidecars per deployment and version.",
        targets((f"count {f.by('version')} (tokenmeter_build_info{P})", f.legend("{{version}}"))),
        "short", graph=False), 6)
    g.add(timeseries(
        "CPU",
        "CPU cores used by each tokenmeter process (process metrics of the targets that "
        "export tokenmeter_build_info, so no other process on the same Prometheus counts).",
        targets((f"{rate('process_cpu_seconds_total', P)} * {f.on_target()} tokenmeter_build_info{P}", pod)),
        "short", min=0), 12)
    g.add(timeseries(
        "Resident memory",
        "Resident set size of each tokenmeter process.",
        targets((f"process_resident_memory_bytes{P} * {f.on_target()} tokenmeter_build_info{P}", pod)),
        "bytes", min=0), 12)

    return g.panels


def query_var(name, label, query):
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        # A plain string: every Grafana since 7 reads it (newer ones migrate it to their editor).
        "query": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


def variables(f):
    """The datasource, then each grouping label filtered by those before it, then route, model
    and pod filtered by the deployment. Deployments and pods come from tokenmeter_build_info,
    which every sidecar exports from its start, before any request."""
    out = [{
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "options": [],
        "refresh": 1,
        "regex": "",
        "hide": 0,
        "includeAll": False,
        "multi": False,
    }]
    for i, label in enumerate(f.labels):
        before = Fleet(f.labels[:i]).sel() if i else ""
        out.append(query_var(label, label.capitalize(), f"label_values(tokenmeter_build_info{before}, {label})"))
    out.append(query_var("route", "Route", f"label_values(tokenmeter_requests_total{f.sel()}, route)"))
    out.append(query_var("model", "Model", f"label_values(tokenmeter_requests_total{f.sel('route')}, model)"))
    out.append(query_var(POD, "Pod", f"label_values(tokenmeter_build_info{f.sel()}, {POD})"))
    return out


def dashboard(f):
    return {
        "uid": "tokenmeter",
        "title": "tokenmeter",
        "description": "Goodput, SLO attainment, latency and cost of a fleet of LLM servers, per "
                       "deployment (" + ", ".join(f.labels) + "), measured by the tokenmeter sidecar.",
        "tags": ["tokenmeter", "llm", "slo"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "weekStart": "",
        "liveNow": False,
        "links": [],
        "annotations": {"list": [{
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "templating": {"list": variables(f)},
        "panels": build(f),
    }


LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Labels the dashboard itself uses for something else, or Prometheus reserves.
TAKEN = {"route", "model", "le", "criterion", "outcome", "reason", "result", "version",
         "currency", POD, "datasource"}


def parse_labels(text):
    labels = [l.strip() for l in text.split(",")]
    for l in labels:
        if not LABEL.fullmatch(l) or l.startswith("__"):
            raise argparse.ArgumentTypeError(f"{l!r} is not a label name")
        if l in TAKEN:
            raise argparse.ArgumentTypeError(f"{l!r} is used by the dashboard itself")
    if len(set(labels)) != len(labels):
        raise argparse.ArgumentTypeError("a label is named twice")
    return labels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the output file is not what would be written")
    parser.add_argument("--labels", type=parse_labels, default=DEFAULT_LABELS,
                        help="the labels that tell deployments apart, as given to "
                             "`tokenmeter rules --group-by` (default: namespace,job)")
    parser.add_argument("--out", type=pathlib.Path,
                        help=f"where to write (default: {OUT.relative_to(OUT.parents[2])}, "
                             "for the default labels only)")
    args = parser.parse_args()
    out = args.out
    if out is None:
        if args.labels != DEFAULT_LABELS:
            # The committed JSON is the default labels' dashboard; another must go elsewhere.
            parser.error("--labels other than namespace,job need --out")
        out = OUT
    text = json.dumps(dashboard(Fleet(args.labels)), indent=2, ensure_ascii=False) + "\n"
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run python3 grafana/dashboard.py", file=sys.stderr)
            sys.exit(1)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
