//! `tokenmeter rules`: Prometheus recording and alerting rules generated from the routes' SLOs.
//!
//! One rule set serves a whole fleet: every aggregation keeps a set of grouping labels (by
//! default `namespace` and `job`, which Prometheus gives every target a PodMonitor or a static
//! config scrapes), so two deployments that both have a route `chat` are never summed into one
//! goodput, the objective is matched per deployment and route (each sidecar exports its own as
//! `tokenmeter_slo_objective_ratio`), and every alert carries the deployment's labels. Recording
//! rules follow Prometheus' `level:metric:operations` naming, the level naming the labels kept
//! (`namespace_job_route:`), and always sum counters across pods before dividing (a ratio of
//! sums, never an average of ratios; `sum by (..., le)` for buckets). Alerts are the SRE
//! Workbook's multiwindow, multi-burn-rate set over the recorded burn ratios, a plain
//! goodput-below-objective alert with a minimum-traffic guard, and alerts for the sidecars'
//! metrics going missing, fleet-wide and per deployment. Output is built as serde values and
//! printed either as a plain rule file or as a prometheus-operator `PrometheusRule`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::{Config, Cost};

/// The windows of the SLO recording rules: those the burn-rate alerts need (5m, 30m, 1h, 6h,
/// 3d), a day for dashboards, and the 30-day compliance period.
pub const SLO_WINDOWS: [&str; 7] = ["5m", "30m", "1h", "6h", "1d", "3d", "30d"];

/// The Grafana dashboard's uid, shared with `grafana/dashboards/tokenmeter.json`.
pub const DASHBOARD_UID: &str = "tokenmeter";

/// The labels every aggregation keeps unless told otherwise: what Prometheus itself gives every
/// target, so deployments stay apart with no relabelling.
pub const DEFAULT_GROUP_BY: [&str; 2] = ["namespace", "job"];

/// Labels the rules aggregate by or add themselves, which a grouping label must not shadow.
const RESERVED_LABELS: [&str; 6] = ["route", "le", "criterion", "currency", "model", "rule_set"];

/// One row of the SRE Workbook's multiwindow, multi-burn-rate table (chapter 5).
struct BurnAlert {
    factor: f64,
    long: &'static str,
    short: &'static str,
    severity: &'static str,
    /// How long the condition must hold; the short window already stops the alert soon after
    /// the burn stops, so this only filters a single unlucky evaluation.
    hold: &'static str,
}

const BURN_ALERTS: [BurnAlert; 3] = [
    BurnAlert {
        factor: 14.4,
        long: "1h",
        short: "5m",
        severity: "page",
        hold: "2m",
    },
    BurnAlert {
        factor: 6.0,
        long: "6h",
        short: "30m",
        severity: "page",
        hold: "15m",
    },
    BurnAlert {
        factor: 1.0,
        long: "3d",
        short: "6h",
        severity: "ticket",
        hold: "1h",
    },
];

/// The latency histograms that get a per-route, per-bucket 5m rate for fleet-wide quantiles.
const HISTOGRAMS: [&str; 4] = [
    "tokenmeter_time_to_first_token_seconds",
    "tokenmeter_time_per_output_token_seconds",
    "tokenmeter_inter_token_latency_seconds",
    "tokenmeter_request_duration_seconds",
];

/// Counters (without `_total`) that get a per-route 5m rate.
const TRAFFIC: [&str; 4] = [
    "tokenmeter_requests",
    "tokenmeter_output_tokens",
    "tokenmeter_prompt_tokens",
    "tokenmeter_slo_good_output_tokens",
];

/// The two shapes of output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A monitoring.coreos.com/v1 PrometheusRule for prometheus-operator.
    #[default]
    PrometheusRule,
    /// A plain Prometheus rule file (`groups:`), for `rule_files:`.
    Prometheus,
}

/// The flags of `tokenmeter rules`.
#[derive(Args, Clone, Debug)]
pub struct RulesArgs {
    /// The tokenmeter configuration whose routes' SLOs become rules.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// What to print.
    #[arg(long, value_enum, default_value_t = Format::PrometheusRule)]
    pub format: Format,
    /// Grafana's base URL, for the dashboard link in every alert.
    #[arg(long, value_name = "URL", default_value = "http://localhost:3000", value_parser = parse_base_url)]
    pub dashboard_url: String,
    /// Label matchers added to every tokenmeter series the rules read, like `job="llm"`: the
    /// deployments this rule set covers, when several rule sets share one Prometheus.
    #[arg(long, value_name = "MATCHERS", value_parser = parse_selector)]
    pub selector: Option<String>,
    /// The labels that tell deployments apart, kept by every recording rule and alert
    /// (comma-separated; `cluster,namespace,job` above several clusters, `namespace,service`
    /// where a service label names the deployment).
    #[arg(long, value_name = "LABELS", default_value = "namespace,job", value_parser = parse_group_by)]
    pub group_by: GroupBy,
    /// The rule set's name: the PrometheusRule's name, its groups' prefix and the `rule_set`
    /// label of its absence alert. Rule sets sharing one Prometheus need different names.
    #[arg(long, value_name = "NAME", default_value = "tokenmeter", value_parser = parse_name)]
    pub name: String,
    /// Below this many eligible requests in the last hour, the goodput-below-objective alert
    /// stays quiet (a handful of requests says little).
    #[arg(long, value_name = "N", default_value = "100")]
    pub min_requests_per_hour: u64,
}

/// The grouping labels, checked: Prometheus label names, none reserved, none twice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupBy(Vec<String>);

impl Default for GroupBy {
    fn default() -> Self {
        GroupBy(DEFAULT_GROUP_BY.iter().map(|l| l.to_string()).collect())
    }
}

impl GroupBy {
    pub fn labels(&self) -> &[String] {
        &self.0
    }

    /// The recording rules' level for these labels and `extra`: `namespace_job_route`.
    fn level(&self, extra: &[&str]) -> String {
        self.0
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect::<Vec<_>>()
            .join("_")
    }

    /// The label list of a `by (...)` or `on (...)` clause: `namespace, job, route`.
    fn clause(&self, extra: &[&str]) -> String {
        self.0
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What shapes the rules besides the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub format: Format,
    pub dashboard_url: String,
    pub selector: Option<String>,
    pub group_by: GroupBy,
    pub name: String,
    pub min_requests_per_hour: u64,
    /// Every window and hold divided by this (1: as written). Only tests set it, so that a real
    /// Prometheus pages within seconds; the recorded names keep the unscaled windows.
    pub time_divisor: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            format: Format::PrometheusRule,
            dashboard_url: "http://localhost:3000".into(),
            selector: None,
            group_by: GroupBy::default(),
            name: "tokenmeter".into(),
            min_requests_per_hour: 100,
            time_divisor: 1,
        }
    }
}

impl From<&RulesArgs> for Options {
    fn from(args: &RulesArgs) -> Self {
        Options {
            format: args.format,
            dashboard_url: args.dashboard_url.clone(),
            selector: args.selector.clone(),
            group_by: args.group_by.clone(),
            name: args.name.clone(),
            min_requests_per_hour: args.min_requests_per_hour,
            time_divisor: 1,
        }
    }
}

/// A plain Prometheus rule file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleFile {
    pub groups: Vec<Group>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub name: String,
    pub rules: Vec<Rule>,
}

/// A recording rule (`record`) or an alerting rule (`alert`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    pub expr: String,
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// prometheus-operator's custom resource around a rule file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusRule {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: RuleFile,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl Rule {
    fn record(name: String, expr: String) -> Rule {
        Rule {
            record: Some(name),
            alert: None,
            expr,
            hold: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }

    fn alert(name: &str, expr: String, hold: String) -> Rule {
        Rule {
            record: None,
            alert: Some(name.to_string()),
            expr,
            hold: Some(hold),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }

    fn label(mut self, name: &str, value: &str) -> Rule {
        self.labels.insert(name.to_string(), value.to_string());
        self
    }

    fn annotate(mut self, name: &str, value: String) -> Rule {
        self.annotations.insert(name.to_string(), value);
        self
    }
}

/// Writes PromQL for the rules: raw series with the user's matchers added, the grouping
/// clauses, recorded names at the grouping's level, and windows scaled for tests.
struct Writer<'a> {
    selector: Option<&'a str>,
    group: &'a GroupBy,
    divisor: u32,
}

impl Writer<'_> {
    fn raw(&self, name: &str) -> String {
        match self.selector {
            Some(s) => format!("{name}{{{s}}}"),
            None => name.to_string(),
        }
    }

    /// `by (namespace, job, extra...)`.
    fn by(&self, extra: &[&str]) -> String {
        format!("by ({})", self.group.clause(extra))
    }

    /// `on (namespace, job, extra...)`.
    fn on(&self, extra: &[&str]) -> String {
        format!("on ({})", self.group.clause(extra))
    }

    /// A recorded name: `namespace_job_route:metric:operations`.
    fn name(&self, extra: &[&str], metric: &str, operations: &str) -> String {
        format!("{}:{metric}:{operations}", self.group.level(extra))
    }

    /// A window or hold as Prometheus reads it, divided for tests.
    fn time(&self, duration: &str) -> String {
        let seconds = seconds(duration) / u64::from(self.divisor.max(1));
        prometheus_duration(seconds.max(1))
    }
}

/// Seconds in a duration this module writes (`5m`, `1h`, `30d`).
fn seconds(duration: &str) -> u64 {
    let (number, unit) = duration.split_at(duration.len() - 1);
    let n: u64 = number
        .parse()
        .expect("the module's own durations are well formed");
    n * match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => unreachable!("the module's own durations use s, m, h or d"),
    }
}

/// The largest whole unit that says `seconds` exactly.
fn prometheus_duration(seconds: u64) -> String {
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if seconds % size == 0 {
            return format!("{}{unit}", seconds / size);
        }
    }
    format!("{seconds}s")
}

/// The rule file for `config`.
pub fn rule_file(config: &Config, options: &Options) -> RuleFile {
    let w = Writer {
        selector: options.selector.as_deref(),
        group: &options.group_by,
        divisor: options.time_divisor,
    };
    // The alerts share the SLO rules' group: a group runs its rules in order, so each alert
    // reads ratios recorded in the same evaluation, never the one before.
    let mut slo = slo_rules(&w);
    slo.extend(alert_rules(options, &w));
    let mut groups = vec![
        Group {
            name: format!("{}-slo", options.name),
            rules: slo,
        },
        Group {
            name: format!("{}-traffic", options.name),
            rules: traffic_rules(&w),
        },
    ];
    if let Some(cost) = &config.cost {
        groups.push(Group {
            name: format!("{}-cost", options.name),
            rules: cost_rules(cost, &w),
        });
    }
    RuleFile { groups }
}

/// The requested output, as YAML with a header saying how to regenerate it.
pub fn render(config: &Config, options: &Options, config_path: &str) -> String {
    let mut command = format!("tokenmeter rules --config {config_path}");
    if options.format == Format::Prometheus {
        command.push_str(" --format prometheus");
    }
    let defaults = Options::default();
    if options.dashboard_url != defaults.dashboard_url {
        let _ = write!(command, " --dashboard-url {}", options.dashboard_url);
    }
    if let Some(selector) = &options.selector {
        let _ = write!(command, " --selector '{selector}'");
    }
    if options.group_by != defaults.group_by {
        let _ = write!(command, " --group-by {}", options.group_by.0.join(","));
    }
    if options.name != defaults.name {
        let _ = write!(command, " --name {}", options.name);
    }
    if options.min_requests_per_hour != defaults.min_requests_per_hour {
        let _ = write!(
            command,
            " --min-requests-per-hour {}",
            options.min_requests_per_hour
        );
    }
    if options.time_divisor > 1 {
        let _ = write!(
            command,
            " (for a test: every window divided by {})",
            options.time_divisor
        );
    }
    let rules = rule_file(config, options);
    // Serialising plain strings and maps cannot fail.
    let body = match options.format {
        Format::Prometheus => serde_yaml::to_string(&rules),
        Format::PrometheusRule => serde_yaml::to_string(&PrometheusRule {
            api_version: "monitoring.coreos.com/v1".into(),
            kind: "PrometheusRule".into(),
            metadata: Metadata {
                name: options.name.clone(),
                labels: BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    "tokenmeter".to_string(),
                )]),
            },
            spec: rules,
        }),
    }
    .expect("rule files serialise");
    format!(
        "# Generated by `{command}`: edit the configuration and regenerate, not this file.\n{body}"
    )
}

fn slo_rules(w: &Writer) -> Vec<Rule> {
    let objective = w.name(&["route"], "tokenmeter_slo_objective", "ratio");
    // Each sidecar exports its own routes' objectives, so a deployment is judged by its own
    // configuration; `max` settles a rollout where two versions of it disagree.
    let mut rules = vec![Rule::record(
        objective.clone(),
        format!(
            "max {} ({})",
            w.by(&["route"]),
            w.raw("tokenmeter_slo_objective_ratio")
        ),
    )];
    for window in SLO_WINDOWS {
        let range = w.time(window);
        let rate = format!("rate{window}");
        for metric in [
            "tokenmeter_slo_eligible_requests",
            "tokenmeter_slo_good_requests",
        ] {
            rules.push(Rule::record(
                w.name(&["route"], metric, &rate),
                format!(
                    "sum {} (rate({}[{range}]))",
                    w.by(&["route"]),
                    w.raw(&format!("{metric}_total"))
                ),
            ));
        }
        let goodput = w.name(
            &["route"],
            "tokenmeter_slo_goodput",
            &format!("ratio_{rate}"),
        );
        rules.push(Rule::record(
            goodput.clone(),
            format!(
                "{} / {}",
                w.name(&["route"], "tokenmeter_slo_good_requests", &rate),
                w.name(&["route"], "tokenmeter_slo_eligible_requests", &rate)
            ),
        ));
        rules.push(Rule::record(
            w.name(
                &["route"],
                "tokenmeter_slo_error_budget_burn",
                &format!("ratio_{rate}"),
            ),
            format!("(1 - {goodput}) / {} (1 - {objective})", w.on(&["route"])),
        ));
    }
    for window in ["5m", "1h"] {
        rules.push(Rule::record(
            w.name(
                &["route", "criterion"],
                "tokenmeter_slo_violations",
                &format!("rate{window}"),
            ),
            format!(
                "sum {} (rate({}[{}]))",
                w.by(&["route", "criterion"]),
                w.raw("tokenmeter_slo_violations_total"),
                w.time(window)
            ),
        ));
    }
    rules
}

fn traffic_rules(w: &Writer) -> Vec<Rule> {
    let mut rules = Vec::new();
    for name in TRAFFIC {
        rules.push(Rule::record(
            w.name(&["route"], name, "rate5m"),
            format!(
                "sum {} (rate({}[{}]))",
                w.by(&["route"]),
                w.raw(&format!("{name}_total")),
                w.time("5m")
            ),
        ));
    }
    for name in HISTOGRAMS {
        rules.push(Rule::record(
            w.name(&["route", "le"], &format!("{name}_bucket"), "rate5m"),
            format!(
                "sum {} (rate({}[{}]))",
                w.by(&["route", "le"]),
                w.raw(&format!("{name}_bucket")),
                w.time("5m")
            ),
        ));
    }
    rules
}

fn cost_rules(cost: &Cost, w: &Writer) -> Vec<Rule> {
    let currency = cost.currency.as_str();
    let hourly = w.name(&[], "tokenmeter_cost_per_hour", "sum");
    let per_second = format!("({hourly} / 3600)");
    let per = |metric: &str, denominator: String| {
        // The cost series carries `currency`, the rates do not: match on the grouping labels
        // ignoring it, then put it back as a rule label.
        Rule::record(
            w.name(&[], metric, "rate1h"),
            format!("{per_second} / ignoring (currency) ({denominator})"),
        )
        .label("currency", currency)
    };
    let rate1h = |counter: &str| {
        format!(
            "sum {} (rate({}[{}]))",
            w.by(&[]),
            w.raw(counter),
            w.time("1h")
        )
    };
    vec![
        // One replica is one sidecar, and every sidecar exports build_info = 1.
        Rule::record(
            hourly.clone(),
            format!(
                "{} * sum {} ({})",
                cost.per_hour,
                w.by(&[]),
                w.raw("tokenmeter_build_info")
            ),
        )
        .label("currency", currency),
        per(
            "tokenmeter_cost_per_request",
            rate1h("tokenmeter_requests_total"),
        ),
        per(
            "tokenmeter_cost_per_million_output_tokens",
            format!("{} / 1e6", rate1h("tokenmeter_output_tokens_total")),
        ),
        per(
            "tokenmeter_cost_per_million_good_output_tokens",
            format!(
                "{} / 1e6",
                rate1h("tokenmeter_slo_good_output_tokens_total")
            ),
        ),
    ]
}

/// Alert-template text shared by every alert over a deployment's route.
struct Templates {
    /// `{{ $labels.namespace }}/{{ $labels.job }}`: the deployment, as people name it.
    deployment: String,
    /// The Grafana link, filtered to the deployment and route.
    dashboard: String,
    /// The criterion failing most over the last hour, queried when the alert fires.
    failing: String,
    /// The deployment's objective for the route, queried when the alert fires.
    objective: String,
}

impl Templates {
    fn new(options: &Options, w: &Writer) -> Templates {
        let labels = options.group_by.labels();
        let deployment = labels
            .iter()
            .map(|l| format!("{{{{ $labels.{l} }}}}"))
            .collect::<Vec<_>>()
            .join("/");
        let mut dashboard = format!(
            "{}/d/{DASHBOARD_UID}/tokenmeter?",
            options.dashboard_url.trim_end_matches('/')
        );
        for l in labels.iter().map(String::as_str).chain(["route"]) {
            let _ = write!(dashboard, "var-{l}={{{{ $labels.{l} | urlquery }}}}&");
        }
        dashboard.pop();
        // The series of this alert's deployment and route: `namespace=%q,job=%q,route=%q`
        // filled by printf from the alert's labels.
        let matchers = labels
            .iter()
            .map(String::as_str)
            .chain(["route"])
            .map(|l| format!("{l}=%q"))
            .collect::<Vec<_>>()
            .join(",");
        let args = labels
            .iter()
            .map(String::as_str)
            .chain(["route"])
            .map(|l| format!(" $labels.{l}"))
            .collect::<String>();
        let failing = format!(
            "{{{{ with printf \"topk(1, {}{{{matchers}}})\"{args} | query }}}}{{{{ . | first | label \"criterion\" }}}}{{{{ else }}}}none recorded{{{{ end }}}}",
            w.name(&["route", "criterion"], "tokenmeter_slo_violations", "rate1h")
        );
        let objective = format!(
            "{{{{ with printf \"{}{{{matchers}}}\"{args} | query }}}}{{{{ . | first | value | humanizePercentage }}}}{{{{ end }}}}",
            w.name(&["route"], "tokenmeter_slo_objective", "ratio")
        );
        Templates {
            deployment,
            dashboard,
            failing,
            objective,
        }
    }
}

fn alert_rules(options: &Options, w: &Writer) -> Vec<Rule> {
    let labels = options.group_by.labels().join(", ");
    let t = Templates::new(options, w);
    let home = format!(
        "{}/d/{DASHBOARD_UID}/tokenmeter",
        options.dashboard_url.trim_end_matches('/')
    );
    let build_info = w.raw("tokenmeter_build_info");
    let absent = Rule::alert(
        "TokenmeterMetricsAbsent",
        format!("absent({build_info})"),
        w.time("5m"),
    )
    .label("severity", "page")
    .label("rule_set", &options.name)
    .annotate(
        "summary",
        "No tokenmeter sidecar is being scraped".into(),
    )
    .annotate(
        "description",
        format!(
            "Prometheus has had no {build_info} series for 5 minutes: the sidecars are down or not scraped, and no SLO alert of rule set {} can fire meanwhile.",
            options.name
        ),
    )
    .annotate("dashboard", home);
    // A deployment whose every sidecar stopped being scraped within the last hour, while
    // others still are: `absent` alone stays quiet for as long as one deployment remains.
    let vanished = Rule::alert(
        "TokenmeterDeploymentMetricsAbsent",
        format!(
            "group {} (max_over_time({build_info}[{}]))\nunless {}\ngroup {} ({build_info})",
            w.by(&[]),
            w.time("1h"),
            w.on(&[]),
            w.by(&[])
        ),
        w.time("5m"),
    )
    .label("severity", "ticket")
    .annotate(
        "summary",
        format!("Deployment {} has no tokenmeter sidecar scraped", t.deployment),
    )
    .annotate(
        "description",
        format!(
            "Deployment {} ({labels}) was scraped in the last hour and has not been for 5 minutes: its sidecars are down, unscraped or the deployment was removed. No SLO alert can fire for it meanwhile; the alert clears an hour after it went.",
            t.deployment
        ),
    );
    let mut rules = vec![absent, vanished];
    for burn in &BURN_ALERTS {
        // A burn faster than 1 / (1 - objective) means more than every request failing, so
        // for a loose objective the row simply never fires.
        let over = |window: &str| {
            format!(
                "{} > {}",
                w.name(
                    &["route"],
                    "tokenmeter_slo_error_budget_burn",
                    &format!("ratio_rate{window}")
                ),
                burn.factor
            )
        };
        rules.push(
            Rule::alert(
                "TokenmeterErrorBudgetBurn",
                format!("{}\nand\n{}", over(burn.long), over(burn.short)),
                w.time(burn.hold),
            )
            .label("severity", burn.severity)
            .label("long_window", burn.long)
            .annotate(
                "summary",
                format!(
                    "{}: route {{{{ $labels.route }}}} is burning its error budget at {}x or faster over {} and {}",
                    t.deployment, burn.factor, burn.long, burn.short
                ),
            )
            .annotate(
                "description",
                format!(
                    "Deployment {} is spending the error budget of route {{{{ $labels.route }}}} {{{{ $value | printf \"%.1f\" }}}} times as fast as its objective of {} allows, over the last {}.",
                    t.deployment, t.objective, burn.long
                ),
            )
            .annotate("failing_criterion", t.failing.clone())
            .annotate("dashboard", t.dashboard.clone()),
        );
    }
    rules.push(
        Rule::alert(
            "TokenmeterGoodputBelowObjective",
            format!(
                "{} < {} {}\nand\n{} * {} >= {}",
                w.name(&["route"], "tokenmeter_slo_goodput", "ratio_rate1h"),
                w.on(&["route"]),
                w.name(&["route"], "tokenmeter_slo_objective", "ratio"),
                w.name(&["route"], "tokenmeter_slo_eligible_requests", "rate1h"),
                seconds(&w.time("1h")),
                options.min_requests_per_hour
            ),
            w.time("15m"),
        )
        .label("severity", "ticket")
        .annotate(
            "summary",
            format!(
                "{}: route {{{{ $labels.route }}}} is below its goodput objective of {} over 1h",
                t.deployment, t.objective
            ),
        )
        .annotate(
            "description",
            format!(
                "Goodput of deployment {} on route {{{{ $labels.route }}}} over the last hour is {{{{ $value | humanizePercentage }}}} of eligible requests, under its objective of {}.",
                t.deployment, t.objective
            ),
        )
        .annotate("failing_criterion", t.failing)
        .annotate("dashboard", t.dashboard),
    );
    rules
}

fn parse_base_url(text: &str) -> Result<String, String> {
    let url = text.trim().trim_end_matches('/');
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("`{text}` is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.contains(char::is_whitespace) || url.contains(['"', '{', '}']) {
        return Err(format!(
            "`{text}` is not a usable base URL, like http://grafana:3000"
        ));
    }
    Ok(url.to_string())
}

/// Checks the grouping labels: comma-separated Prometheus label names, none that the rules
/// use themselves, none twice.
pub fn parse_group_by(text: &str) -> Result<GroupBy, String> {
    let mut labels: Vec<String> = Vec::new();
    for label in text.split(',').map(str::trim) {
        let valid = label
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        if label.is_empty() || !valid || label.starts_with("__") {
            return Err(format!(
                "`{text}` is not a comma-separated list of label names like namespace,job"
            ));
        }
        if RESERVED_LABELS.contains(&label) {
            return Err(format!(
                "`{label}` cannot be a grouping label: the rules aggregate by or add it themselves{}",
                if label == "model" {
                    " (objectives are per route, so burn rates are too)"
                } else {
                    ""
                }
            ));
        }
        if labels.iter().any(|l| l == label) {
            return Err(format!("`{label}` is named twice in `{text}`"));
        }
        labels.push(label.to_string());
    }
    Ok(GroupBy(labels))
}

/// Checks a rule set's name: a Kubernetes object name (lowercase letters, digits and `-`),
/// since it names the PrometheusRule.
fn parse_name(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-');
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!(
            "`{text}` is not a rule set name: lowercase letters, digits and '-', at most 63"
        ))
    }
}

/// Checks PromQL label matchers (`name="value"`, also `!=`, `=~`, `!~`, comma-separated), so a
/// typo fails here rather than in Prometheus. Braces around them are accepted and dropped.
pub fn parse_selector(text: &str) -> Result<String, String> {
    let inner = text.trim();
    let inner = inner
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or(inner)
        .trim();
    let bad =
        |why: &str| format!("`{text}` is not a list of label matchers like job=\"llm\": {why}");
    if inner.is_empty() {
        return Err(bad("it is empty"));
    }
    let bytes = inner.as_bytes();
    let mut i = 0;
    let skip_spaces = |i: &mut usize| {
        while *i < bytes.len() && bytes[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_spaces(&mut i);
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        if i == start || bytes[start].is_ascii_digit() {
            return Err(bad("a label name is missing or starts with a digit"));
        }
        skip_spaces(&mut i);
        let op = ["=~", "!~", "!=", "="]
            .into_iter()
            .find(|op| inner[i..].starts_with(op))
            .ok_or_else(|| bad("expected =, !=, =~ or !~ after a label name"))?;
        i += op.len();
        skip_spaces(&mut i);
        if bytes.get(i) != Some(&b'"') {
            return Err(bad("label values must be in double quotes"));
        }
        i += 1;
        loop {
            match bytes.get(i) {
                None => return Err(bad("a quoted value is not closed")),
                Some(b'\\') => i += 2,
                Some(b'"') => break,
                Some(_) => i += 1,
            }
        }
        i += 1;
        skip_spaces(&mut i);
        match bytes.get(i) {
            None => break,
            Some(b',') => {
                i += 1;
                skip_spaces(&mut i);
                if i == bytes.len() {
                    break;
                }
            }
            Some(_) => return Err(bad("matchers must be separated by commas")),
        }
    }
    Ok(inner.to_string())
}

/// The `tokenmeter rules` command.
pub fn main(args: RulesArgs) -> ExitCode {
    match Config::load(&args.config) {
        Ok(config) => {
            print!(
                "{}",
                render(
                    &config,
                    &Options::from(&args),
                    &args.config.display().to_string()
                )
            );
            ExitCode::SUCCESS
        }
        Err(e) => crate::tools::cli::fail(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, "t.yaml").unwrap()
    }

    fn all(file: &RuleFile) -> impl Iterator<Item = &Rule> {
        file.groups.iter().flat_map(|g| &g.rules)
    }

    fn recorded<'a>(file: &'a RuleFile, name: &str) -> &'a Rule {
        all(file)
            .find(|r| r.record.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no rule records {name}"))
    }

    const ROUTES: &str = "routes:\n  - name: chat\n    slo: {ttft: 1s, objective: 0.99}\n  - name: loose\n    slo: {e2e: 9s, objective: 0.9}\n  - name: watched\n    slo: {ttft: 1s}\n  - name: free\n";

    #[test]
    fn ratios_are_sums_divided_never_averages_and_keep_the_deployment() {
        let file = rule_file(&config(ROUTES), &Options::default());
        for w in SLO_WINDOWS {
            assert_eq!(
                recorded(
                    &file,
                    &format!("namespace_job_route:tokenmeter_slo_eligible_requests:rate{w}")
                )
                .expr,
                format!("sum by (namespace, job, route) (rate(tokenmeter_slo_eligible_requests_total[{w}]))")
            );
            assert_eq!(
                recorded(&file, &format!("namespace_job_route:tokenmeter_slo_goodput:ratio_rate{w}")).expr,
                format!("namespace_job_route:tokenmeter_slo_good_requests:rate{w} / namespace_job_route:tokenmeter_slo_eligible_requests:rate{w}")
            );
            assert_eq!(
                recorded(&file, &format!("namespace_job_route:tokenmeter_slo_error_budget_burn:ratio_rate{w}")).expr,
                format!("(1 - namespace_job_route:tokenmeter_slo_goodput:ratio_rate{w}) / on (namespace, job, route) (1 - namespace_job_route:tokenmeter_slo_objective:ratio)")
            );
        }
        assert_eq!(
            recorded(
                &file,
                "namespace_job_route_le:tokenmeter_time_to_first_token_seconds_bucket:rate5m"
            )
            .expr,
            "sum by (namespace, job, route, le) (rate(tokenmeter_time_to_first_token_seconds_bucket[5m]))"
        );
        for rule in all(&file) {
            assert!(!rule.expr.contains("avg"), "{rule:?}");
            // Every aggregation and every match keeps the deployment's labels.
            for (at, _) in rule
                .expr
                .match_indices("by (")
                .chain(rule.expr.match_indices("on ("))
            {
                assert!(
                    rule.expr[at..].contains("(namespace, job"),
                    "an aggregation or match that merges deployments: {rule:?}"
                );
            }
            if rule.expr.contains("rate(") {
                assert!(rule.expr.contains("sum by ("), "an unsummed rate: {rule:?}");
            }
            if let Some(name) = &rule.record {
                assert!(name.starts_with("namespace_job"), "{name}");
            }
        }
    }

    #[test]
    fn alerts_read_each_deployments_own_objective_and_name_the_deployment() {
        let file = rule_file(&config(ROUTES), &Options::default());
        let alerts: Vec<(String, String, String)> = all(&file)
            .filter_map(|r| {
                Some((
                    r.alert.clone()?,
                    r.labels.get("severity").cloned().unwrap_or_default(),
                    r.labels.get("long_window").cloned().unwrap_or_default(),
                ))
            })
            .collect();
        let expect = |a: &str, s: &str, w: &str| (a.to_string(), s.to_string(), w.to_string());
        // One set for every deployment and route; a route without an objective has no burn
        // series, so it can never match.
        assert_eq!(
            alerts,
            vec![
                expect("TokenmeterMetricsAbsent", "page", ""),
                expect("TokenmeterDeploymentMetricsAbsent", "ticket", ""),
                expect("TokenmeterErrorBudgetBurn", "page", "1h"),
                expect("TokenmeterErrorBudgetBurn", "page", "6h"),
                expect("TokenmeterErrorBudgetBurn", "ticket", "3d"),
                expect("TokenmeterGoodputBelowObjective", "ticket", ""),
            ]
        );
        let fast = all(&file)
            .find(|r| r.labels.get("long_window").map(String::as_str) == Some("1h"))
            .unwrap();
        assert_eq!(
            fast.expr,
            "namespace_job_route:tokenmeter_slo_error_budget_burn:ratio_rate1h > 14.4\nand\nnamespace_job_route:tokenmeter_slo_error_budget_burn:ratio_rate5m > 14.4"
        );
        assert!(!fast.labels.contains_key("route"), "{fast:?}");
        assert_eq!(
            fast.annotations["dashboard"],
            "http://localhost:3000/d/tokenmeter/tokenmeter?var-namespace={{ $labels.namespace | urlquery }}&var-job={{ $labels.job | urlquery }}&var-route={{ $labels.route | urlquery }}"
        );
        assert!(fast.annotations["summary"]
            .starts_with("{{ $labels.namespace }}/{{ $labels.job }}: route {{ $labels.route }}"));
        assert!(fast.annotations["description"].contains(
            "printf \"namespace_job_route:tokenmeter_slo_objective:ratio{namespace=%q,job=%q,route=%q}\" $labels.namespace $labels.job $labels.route | query"
        ));
        let below = all(&file)
            .find(|r| r.alert.as_deref() == Some("TokenmeterGoodputBelowObjective"))
            .unwrap();
        assert_eq!(
            below.expr,
            "namespace_job_route:tokenmeter_slo_goodput:ratio_rate1h < on (namespace, job, route) namespace_job_route:tokenmeter_slo_objective:ratio\nand\nnamespace_job_route:tokenmeter_slo_eligible_requests:rate1h * 3600 >= 100"
        );
    }

    #[test]
    fn other_grouping_labels_name_the_levels_clauses_and_links() {
        let options = Options {
            group_by: parse_group_by("cluster, namespace,service").unwrap(),
            ..Options::default()
        };
        let file = rule_file(&config(ROUTES), &options);
        assert_eq!(
            recorded(
                &file,
                "cluster_namespace_service_route:tokenmeter_slo_good_requests:rate1h"
            )
            .expr,
            "sum by (cluster, namespace, service, route) (rate(tokenmeter_slo_good_requests_total[1h]))"
        );
        let fast = all(&file)
            .find(|r| r.labels.get("long_window").map(String::as_str) == Some("1h"))
            .unwrap();
        assert!(fast.annotations["summary"].starts_with(
            "{{ $labels.cluster }}/{{ $labels.namespace }}/{{ $labels.service }}: route"
        ));
        assert!(fast.annotations["dashboard"]
            .contains("var-cluster={{ $labels.cluster | urlquery }}&var-namespace="));
        let text = render(&config(ROUTES), &options, "c.yaml");
        assert!(
            text.contains("--group-by cluster,namespace,service"),
            "{text}"
        );
    }

    #[test]
    fn the_selector_reaches_every_raw_series() {
        let options = Options {
            selector: Some(parse_selector("{job=\"llm\", namespace=~\"a|b\"}").unwrap()),
            ..Options::default()
        };
        let file = rule_file(
            &config(&format!("{ROUTES}cost: {{per_hour: 2.5, currency: EUR}}\n")),
            &options,
        );
        let selector = "{job=\"llm\", namespace=~\"a|b\"}";
        let mut raw_series = 0;
        for rule in all(&file) {
            for (at, _) in rule.expr.match_indices("tokenmeter_") {
                // Recorded names (`namespace_job_route:tokenmeter_...`) are ours and carry no
                // selector.
                if at > 0 && rule.expr.as_bytes()[at - 1] == b':' {
                    continue;
                }
                let end = rule.expr[at..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .map_or(rule.expr.len(), |n| at + n);
                assert!(
                    rule.expr[end..].starts_with(selector),
                    "{} without the selector in {rule:?}",
                    &rule.expr[at..end]
                );
                raw_series += 1;
            }
        }
        assert!(raw_series > 30, "{raw_series}");
    }

    #[test]
    fn cost_rules_exist_only_with_a_cost_and_carry_the_currency() {
        let without = rule_file(&config(ROUTES), &Options::default());
        assert!(!without.groups.iter().any(|g| g.name == "tokenmeter-cost"));
        let with = rule_file(
            &config(&format!("{ROUTES}cost: {{per_hour: 2.5, currency: EUR}}\n")),
            &Options::default(),
        );
        let hourly = recorded(&with, "namespace_job:tokenmeter_cost_per_hour:sum");
        assert_eq!(
            hourly.expr,
            "2.5 * sum by (namespace, job) (tokenmeter_build_info)"
        );
        let per_million = recorded(
            &with,
            "namespace_job:tokenmeter_cost_per_million_output_tokens:rate1h",
        );
        assert_eq!(
            per_million.expr,
            "(namespace_job:tokenmeter_cost_per_hour:sum / 3600) / ignoring (currency) (sum by (namespace, job) (rate(tokenmeter_output_tokens_total[1h])) / 1e6)"
        );
        assert_eq!(per_million.labels["currency"], "EUR");
    }

    #[test]
    fn the_name_names_the_resource_the_groups_and_the_absence_alert() {
        let options = Options {
            name: "llm-a".into(),
            ..Options::default()
        };
        let c = config(&format!("{ROUTES}cost: {{per_hour: 2.5, currency: EUR}}\n"));
        let wrapped: PrometheusRule =
            serde_yaml::from_str(&render(&c, &options, "c.yaml")).unwrap();
        assert_eq!(wrapped.metadata.name, "llm-a");
        let groups: Vec<&str> = wrapped
            .spec
            .groups
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        assert_eq!(groups, ["llm-a-slo", "llm-a-traffic", "llm-a-cost"]);
        let absent = all(&wrapped.spec)
            .find(|r| r.alert.as_deref() == Some("TokenmeterMetricsAbsent"))
            .unwrap();
        assert_eq!(absent.labels["rule_set"], "llm-a");
    }

    #[test]
    fn a_time_divisor_shortens_windows_and_holds_but_not_names() {
        let options = Options {
            time_divisor: 60,
            ..Options::default()
        };
        let file = rule_file(&config(ROUTES), &options);
        assert_eq!(
            recorded(
                &file,
                "namespace_job_route:tokenmeter_slo_good_requests:rate30d"
            )
            .expr,
            "sum by (namespace, job, route) (rate(tokenmeter_slo_good_requests_total[12h]))"
        );
        assert_eq!(
            recorded(
                &file,
                "namespace_job_route:tokenmeter_slo_good_requests:rate5m"
            )
            .expr,
            "sum by (namespace, job, route) (rate(tokenmeter_slo_good_requests_total[5s]))"
        );
        let fast = all(&file)
            .find(|r| r.labels.get("long_window").map(String::as_str) == Some("1h"))
            .unwrap();
        assert_eq!(fast.hold.as_deref(), Some("2s"));
        let below = all(&file)
            .find(|r| r.alert.as_deref() == Some("TokenmeterGoodputBelowObjective"))
            .unwrap();
        // The guard counts requests per (scaled) hour.
        assert!(below.expr.ends_with("rate1h * 60 >= 100"), "{}", below.expr);
        assert_eq!(prometheus_duration(90), "90s");
        assert_eq!(prometheus_duration(7200), "2h");
    }

    #[test]
    fn both_formats_hold_the_same_groups_and_say_how_to_regenerate() {
        let c = config(ROUTES);
        let plain = render(
            &c,
            &Options {
                format: Format::Prometheus,
                ..Options::default()
            },
            "c.yaml",
        );
        assert!(plain
            .starts_with("# Generated by `tokenmeter rules --config c.yaml --format prometheus`"));
        let plain: RuleFile = serde_yaml::from_str(&plain).unwrap();
        let wrapped: PrometheusRule =
            serde_yaml::from_str(&render(&c, &Options::default(), "c.yaml")).unwrap();
        assert_eq!(wrapped.kind, "PrometheusRule");
        assert_eq!(wrapped.api_version, "monitoring.coreos.com/v1");
        assert_eq!(wrapped.metadata.name, "tokenmeter");
        assert_eq!(wrapped.spec, plain);
    }

    #[test]
    fn selectors_grouping_labels_names_and_urls_are_checked() {
        assert_eq!(parse_selector(" job=\"x\" ").unwrap(), "job=\"x\"");
        assert_eq!(
            parse_selector("job=\"a\\\"b\",ns!~\"c\",").unwrap(),
            "job=\"a\\\"b\",ns!~\"c\","
        );
        for bad in [
            "",
            "job",
            "job=x",
            "job=\"x",
            "9job=\"x\"",
            "a=\"1\" b=\"2\"",
            "{}",
        ] {
            assert!(parse_selector(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(parse_group_by("namespace,job").unwrap(), GroupBy::default());
        for (bad, why) in [
            ("", "label names"),
            ("namespace,,job", "label names"),
            ("9x", "label names"),
            ("__name__", "label names"),
            ("name-space", "label names"),
            ("route", "aggregate by or add"),
            ("model", "objectives are per route"),
            ("job,job", "named twice"),
        ] {
            let err = parse_group_by(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        assert_eq!(parse_name("llm-a").unwrap(), "llm-a");
        for bad in ["", "LLM", "a_b", "-a", "a-", &"a".repeat(64)] {
            assert!(parse_name(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(
            parse_base_url("https://grafana.example/").unwrap(),
            "https://grafana.example"
        );
        assert!(parse_base_url("grafana:3000").is_err());
        assert!(parse_base_url("http://").is_err());
    }
}
