#!/usr/bin/env python3
"""Generates grafana/dashboards/tokenmeter.json, the tokenmeter Grafana dashboard.

The JSON is the artifact (compose provisions it, users import it); this script only keeps it
consistent: one datasource reference, ids in order, a grid that never overlaps. Edit here, run
`python3 grafana/dashboard.py`, commit both. `--check` exits 1 when the JSON is stale.

Queries use only what tokenmeter exports (docs/MEASUREMENT.md) and the recording rules
`tokenmeter rules` generates (docker/prometheus/rules.yaml). Per-model panels read the raw
families, because the rules aggregate by route only; tests/dashboard.rs checks all of it.
"""

import json
import pathlib
import sys

OUT = pathlib.Path(__file__).resolve().parent / "dashboards" / "tokenmeter.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
RM = '{route=~"$route", model=~"$model"}'
R = '{route=~"$route"}'
RI = "$__rate_interval"
DASHED = {"fill": "dash", "dash": [10, 10]}


def rate(metric, sel=RM, window=RI):
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
        if self.x + w > 24:
            self._newline()
        panel = {"id": self._id(), **panel, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y}}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def target(ref, expr, legend, instant=False):
    return {
        "datasource": DS,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend,
        "editorMode": "code",
        "range": not instant,
        "instant": instant,
    }


def targets(*queries, instant=False):
    return [target(chr(ord("A") + i), e, l, instant) for i, (e, l) in enumerate(queries)]


def dashed(ref, color=None):
    """An override drawing every series of query `ref` as a dashed line (objectives, thresholds)."""
    props = [
        {"id": "custom.lineStyle", "value": DASHED},
        {"id": "custom.fillOpacity", "value": 0},
    ]
    if color:
        props.append({"id": "color", "value": {"mode": "fixed", "fixedColor": color}})
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": props}


def colors(**by_name):
    return [
        {
            "matcher": {"id": "byName", "options": name},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": color}}],
        }
        for name, color in by_name.items()
    ]


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


def quantiles(bucket, sel, by="le"):
    return [
        (f"histogram_quantile({q}, sum by ({by}) ({rate(bucket, sel)}))", f"p{int(q * 100)}")
        for q in (0.5, 0.95, 0.99)
    ]


def build():
    g = Layout()

    g.row("Goodput and SLO attainment")
    g.add(timeseries(
        "Goodput (requests/s)",
        "Good requests per second (outcome ok and every SLO criterion met), against all "
        "requests judged by the SLO (dashed: good + violated), per route and model.",
        targets(
            (f"sum by (route, model) ({rate('tokenmeter_slo_good_requests_total')})", "{{route}} · {{model}} good"),
            (f"sum by (route, model) ({rate('tokenmeter_slo_eligible_requests_total')})", "{{route}} · {{model}} judged"),
        ),
        "reqps", [dashed("B")]), 8)
    g.add(timeseries(
        "Goodput (output tokens/s)",
        "Output tokens of good requests per second, against all output tokens (dashed), "
        "per route and model.",
        targets(
            (f"sum by (route, model) ({rate('tokenmeter_slo_good_output_tokens_total')})", "{{route}} · {{model}} good"),
            (f"sum by (route, model) ({rate('tokenmeter_output_tokens_total')})", "{{route}} · {{model}} all"),
        ),
        "short", [dashed("B")]), 8)
    g.add(timeseries(
        "SLO attainment vs objective",
        "Good / judged requests per route and model (counters summed first, then divided). "
        "Dashed: the route's objective (tokenmeter_slo_objective_ratio).",
        targets(
            (f"sum by (route, model) ({rate('tokenmeter_slo_good_requests_total')})\n"
             f"  / sum by (route, model) ({rate('tokenmeter_slo_eligible_requests_total')})",
             "{{route}} · {{model}}"),
            (f"max by (route) (tokenmeter_slo_objective_ratio{R})", "{{route}} objective"),
        ),
        "percentunit", [dashed("B", "red")], max=1), 8)
    g.add(stat(
        "Attainment, 30 days",
        "Good / judged requests per route over 30 days (recorded rule).",
        targets((f"route:tokenmeter_slo_goodput:ratio_rate30d{R}", "{{route}}")),
        "percentunit", decimals=3), 4)
    g.add(stat(
        "Error budget remaining, 30 days",
        "1 − the 30-day burn rate: the share of the route's error budget (1 − objective) not "
        "yet spent. Below zero, the objective is missed over 30 days.",
        targets((f"1 - route:tokenmeter_slo_error_budget_burn:ratio_rate30d{R}", "{{route}}")),
        "percentunit",
        thresholds=steps((None, "red"), (0, "orange"), (0.25, "yellow"), (0.5, "green")),
        decimals=1), 4)
    g.add(timeseries(
        "Error budget burn rate",
        "How fast each route spends its error budget (1 = exactly on budget over 30 days), "
        "over 1 hour, 6 hours and 3 days (recorded rules). The alert thresholds are drawn: "
        "14.4 (page, 1h), 6 (page, 6h), 1 (ticket, 3d).",
        targets(
            (f"route:tokenmeter_slo_error_budget_burn:ratio_rate1h{R}", "{{route}} 1h"),
            (f"route:tokenmeter_slo_error_budget_burn:ratio_rate6h{R}", "{{route}} 6h"),
            (f"route:tokenmeter_slo_error_budget_burn:ratio_rate3d{R}", "{{route}} 3d"),
        ),
        "suffix:×",
        min=0,
        thresholds=steps((None, "green"), (1, "yellow"), (6, "orange"), (14.4, "red")),
        custom={"thresholdsStyle": {"mode": "dashed"}}), 8)
    g.add(timeseries(
        "p99 by route (all replicas, recorded 5m)",
        "Fleet-wide p99 TTFT and E2E per route from the recorded bucket rates "
        "(histogram_quantile over sum by (route, le)).",
        targets(
            ("histogram_quantile(0.99, sum by (route, le) "
             f"(route_le:tokenmeter_time_to_first_token_seconds_bucket:rate5m{R}))", "{{route}} TTFT"),
            ("histogram_quantile(0.99, sum by (route, le) "
             f"(route_le:tokenmeter_request_duration_seconds_bucket:rate5m{R}))", "{{route}} E2E"),
        ),
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
            f"{what} Selected models, summed by le. Dashed: the route's SLO threshold.",
            targets(
                *quantiles(f"{family}_bucket", RM),
                (f'max(tokenmeter_slo_threshold_seconds{{route=~"$route", criterion="{criterion}"}})',
                 f"SLO {criterion}"),
            ),
            "s", [dashed("D", "red")]), 6)

    g.row("Traffic")
    g.add(timeseries(
        "Requests/s by outcome",
        "Finished requests per second: ok, error (5xx, 429, broken or truncated streams), "
        "client_error (other 4xx, excluded from SLOs), cancelled (client went away).",
        targets((f"sum by (outcome) ({rate('tokenmeter_requests_total')})", "{{outcome}}")),
        "reqps",
        colors(ok="green", error="red", client_error="yellow", cancelled="orange"),
        stack=True), 6)
    g.add(timeseries(
        "Tokens/s in and out",
        "Prompt tokens (from usage, when the server reports it) and output tokens per second.",
        targets(
            (f"sum by (route, model) ({rate('tokenmeter_prompt_tokens_total')})", "{{route}} · {{model}} in"),
            (f"sum by (route, model) ({rate('tokenmeter_output_tokens_total')})", "{{route}} · {{model}} out"),
        ),
        "short"), 6)
    g.add(timeseries(
        "In flight",
        "Requests whose response has not ended yet, per route (no model label).",
        targets((f"sum by (route) (tokenmeter_in_flight_requests{R})", "{{route}}")),
        "short", min=0), 6)
    g.add(timeseries(
        "Output tokens per request",
        "Output tokens per finished request, selected routes and models.",
        targets(*quantiles("tokenmeter_request_output_tokens_bucket", RM)),
        "short"), 6)

    g.row("Errors, violations and finish reasons")
    g.add(timeseries(
        "Errors and cancellations (requests/s)",
        "Requests that failed (error) or were abandoned by the client (cancelled).",
        targets((
            'sum by (route, model, outcome) (rate(tokenmeter_requests_total{route=~"$route", '
            f'model=~"$model", outcome=~"error|cancelled"}}[{RI}]))',
            "{{route}} · {{model}} {{outcome}}")),
        "reqps"), 8)
    g.add(timeseries(
        "Error ratio",
        "Errors / all finished requests, per route and model.",
        targets((
            'sum by (route, model) (rate(tokenmeter_requests_total{route=~"$route", '
            f'model=~"$model", outcome="error"}}[{RI}]))\n'
            f"  / sum by (route, model) ({rate('tokenmeter_requests_total')})",
            "{{route}} · {{model}}")),
        "percentunit", min=0), 8)
    g.add(timeseries(
        "SLO violations by criterion",
        "Failed criteria per second (ttft, tpot, e2e, max_itl, error); one request may fail "
        "several.",
        targets((f"sum by (criterion) ({rate('tokenmeter_slo_violations_total')})", "{{criterion}}")),
        "short", stack=True), 8)
    g.add(bargauge(
        "Violations by route and criterion, last hour",
        "Failed criteria per second over the last hour (recorded rule): what fails most.",
        targets((f"route_criterion:tokenmeter_slo_violations:rate1h{R}", "{{route}} {{criterion}}"),
                instant=True),
        "short"), 12)
    g.add(timeseries(
        "Finish reasons",
        "Why generation stopped, as the server reported it, per second (route only: "
        "finish reasons carry no model label).",
        targets((f"sum by (reason) ({rate('tokenmeter_finish_reasons_total', R)})", "{{reason}}")),
        "short", stack=True), 12)

    g.row("Cost (all replicas; needs cost in the config)")
    for title, rule in [
        ("Cost per request", ":tokenmeter_cost_per_request:rate1h"),
        ("Cost per million output tokens", ":tokenmeter_cost_per_million_output_tokens:rate1h"),
        ("Cost per million good output tokens", ":tokenmeter_cost_per_million_good_output_tokens:rate1h"),
    ]:
        g.add(stat(
            title,
            "The configured cost per hour of all replicas over the measured rate of the last "
            "hour (recorded rule), in the configured currency.",
            targets((rule, "{{currency}}")), "short", decimals=4), 6)
    g.add(stat(
        "Cost per hour",
        "The configured cost per hour times the replicas running (recorded rule).",
        targets((":tokenmeter_cost_per_hour:sum", "{{currency}}")), "short", decimals=2), 6)
    g.add(timeseries(
        "Cost per million output tokens over time",
        "All output tokens against those of good requests: the gap is what SLO misses cost.",
        targets(
            (":tokenmeter_cost_per_million_output_tokens:rate1h", "all ({{currency}})"),
            (":tokenmeter_cost_per_million_good_output_tokens:rate1h", "good ({{currency}})"),
        ),
        "short"), 24, 7)

    g.row("Proxy health")
    g.add(timeseries(
        "Config reloads",
        "Configuration reloads by result: error means the file was refused and the running "
        "configuration kept.",
        targets((f"sum by (result) (increase(tokenmeter_config_reloads_total[{RI}]))", "{{result}}")),
        "short", colors(success="green", error="red"), bars=True), 6)
    g.add(stat(
        "Config loaded",
        "When each replica last loaded its configuration successfully.",
        targets(("max by (instance) (tokenmeter_config_last_reload_success_timestamp_seconds) * 1000",
                 "{{instance}}")),
        "dateTimeFromNow", graph=False), 6)
    g.add(timeseries(
        "Access-log records dropped",
        "Per-request records dropped per second because the writer fell behind; should be 0.",
        targets((f"sum by (instance) (rate(tokenmeter_access_log_dropped_total[{RI}]))", "{{instance}}")),
        "short", min=0), 6)
    g.add(stat(
        "Replicas by version",
        "Running tokenmeter processes per version.",
        targets(("count by (version) (tokenmeter_build_info)", "{{version}}")),
        "short", graph=False), 6)
    g.add(timeseries(
        "CPU",
        "CPU cores used by each tokenmeter process (process metrics of the targets that "
        "export tokenmeter_build_info, so no other process on the same Prometheus counts).",
        targets((f"rate(process_cpu_seconds_total[{RI}]) * on (job, instance) tokenmeter_build_info",
                 "{{instance}}")),
        "short", min=0), 12)
    g.add(timeseries(
        "Resident memory",
        "Resident set size of each tokenmeter process.",
        targets(("process_resident_memory_bytes * on (job, instance) tokenmeter_build_info",
                 "{{instance}}")),
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


def dashboard():
    return {
        "uid": "tokenmeter",
        "title": "tokenmeter",
        "description": "Goodput, SLO attainment, latency and cost of an LLM server, measured by the "
                       "tokenmeter sidecar.",
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
        "templating": {"list": [
            {
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
            },
            query_var("route", "Route", "label_values(tokenmeter_requests_total, route)"),
            query_var("model", "Model", 'label_values(tokenmeter_requests_total{route=~"$route"}, model)'),
        ]},
        "panels": build(),
    }


def main():
    text = json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"
    if sys.argv[1:] == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python3 grafana/dashboard.py", file=sys.stderr)
            sys.exit(1)
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)


if __name__ == "__main__":
    main()
