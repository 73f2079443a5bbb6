//! `tokenmeter rules`: Prometheus recording and alerting rules generated from the routes' SLOs.
//!
//! The same YAML that tells the proxy what each route promises tells Prometheus when to page.
//! Recording rules follow Prometheus' `level:metric:operations` naming and always sum counters
//! across pods before dividing (a ratio of sums, never an average of ratios; `sum by (le)` for
//! buckets), so one Prometheus, or Thanos or Mimir above many, serves a fleet of any size.
//! Alerts are the SRE Workbook's multiwindow, multi-burn-rate set with each route's objective
//! written into the expression, a plain goodput-below-objective alert with a minimum-traffic
//! guard, and an alert for the sidecar's metrics going missing. Output is built as serde values
//! and printed either as a plain rule file or as a prometheus-operator `PrometheusRule`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::{Config, Cost, Route};

/// The windows of the SLO recording rules: those the burn-rate alerts need (5m, 30m, 1h, 6h,
/// 3d), a day for dashboards, and the 30-day compliance period.
pub const SLO_WINDOWS: [&str; 7] = ["5m", "30m", "1h", "6h", "1d", "3d", "30d"];

/// The Grafana dashboard's uid, shared with `grafana/dashboards/tokenmeter.json`.
pub const DASHBOARD_UID: &str = "tokenmeter";

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
    /// Label matchers added to every tokenmeter series the rules read, like `job="llm"`.
    #[arg(long, value_name = "MATCHERS", value_parser = parse_selector)]
    pub selector: Option<String>,
    /// Below this many eligible requests in the last hour, the goodput-below-objective alert
    /// stays quiet (a handful of requests says little).
    #[arg(long, value_name = "N", default_value = "100")]
    pub min_requests_per_hour: u64,
}

/// What shapes the rules besides the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub format: Format,
    pub dashboard_url: String,
    pub selector: Option<String>,
    pub min_requests_per_hour: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            format: Format::PrometheusRule,
            dashboard_url: "http://localhost:3000".into(),
            selector: None,
            min_requests_per_hour: 100,
        }
    }
}

impl From<&RulesArgs> for Options {
    fn from(args: &RulesArgs) -> Self {
        Options {
            format: args.format,
            dashboard_url: args.dashboard_url.clone(),
            selector: args.selector.clone(),
            min_requests_per_hour: args.min_requests_per_hour,
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

    fn alert(name: &str, expr: String, hold: &str) -> Rule {
        Rule {
            record: None,
            alert: Some(name.to_string()),
            expr,
            hold: Some(hold.to_string()),
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

/// Writes PromQL for the series the rules read, with the user's matchers added.
struct Series<'a> {
    selector: Option<&'a str>,
}

impl Series<'_> {
    fn raw(&self, name: &str) -> String {
        match self.selector {
            Some(s) => format!("{name}{{{s}}}"),
            None => name.to_string(),
        }
    }
}

/// The rule file for `config`.
pub fn rule_file(config: &Config, options: &Options) -> RuleFile {
    let series = Series {
        selector: options.selector.as_deref(),
    };
    // The alerts share the SLO rules' group: a group runs its rules in order, so each alert
    // reads ratios recorded in the same evaluation, never the one before.
    let mut slo = slo_rules(&series);
    slo.extend(alert_rules(config, options, &series));
    let mut groups = vec![
        Group {
            name: "tokenmeter-slo".into(),
            rules: slo,
        },
        Group {
            name: "tokenmeter-traffic".into(),
            rules: traffic_rules(&series),
        },
    ];
    if let Some(cost) = &config.cost {
        groups.push(Group {
            name: "tokenmeter-cost".into(),
            rules: cost_rules(cost, &series),
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
    if options.min_requests_per_hour != defaults.min_requests_per_hour {
        let _ = write!(
            command,
            " --min-requests-per-hour {}",
            options.min_requests_per_hour
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
                name: "tokenmeter".into(),
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

fn slo_rules(series: &Series) -> Vec<Rule> {
    let mut rules = Vec::new();
    for w in SLO_WINDOWS {
        for (counter, recorded) in [
            (
                "tokenmeter_slo_eligible_requests_total",
                "tokenmeter_slo_eligible_requests",
            ),
            (
                "tokenmeter_slo_good_requests_total",
                "tokenmeter_slo_good_requests",
            ),
        ] {
            rules.push(Rule::record(
                format!("route:{recorded}:rate{w}"),
                format!("sum by (route) (rate({}[{w}]))", series.raw(counter)),
            ));
        }
        rules.push(Rule::record(
            format!("route:tokenmeter_slo_goodput:ratio_rate{w}"),
            format!(
                "route:tokenmeter_slo_good_requests:rate{w} / route:tokenmeter_slo_eligible_requests:rate{w}"
            ),
        ));
        rules.push(Rule::record(
            format!("route:tokenmeter_slo_error_budget_burn:ratio_rate{w}"),
            format!(
                "(1 - route:tokenmeter_slo_goodput:ratio_rate{w}) / on (route) (1 - max by (route) ({}))",
                series.raw("tokenmeter_slo_objective_ratio")
            ),
        ));
    }
    for w in ["5m", "1h"] {
        rules.push(Rule::record(
            format!("route_criterion:tokenmeter_slo_violations:rate{w}"),
            format!(
                "sum by (route, criterion) (rate({}[{w}]))",
                series.raw("tokenmeter_slo_violations_total")
            ),
        ));
    }
    rules
}

fn traffic_rules(series: &Series) -> Vec<Rule> {
    let mut rules = Vec::new();
    for name in TRAFFIC {
        rules.push(Rule::record(
            format!("route:{name}:rate5m"),
            format!(
                "sum by (route) (rate({}[5m]))",
                series.raw(&format!("{name}_total"))
            ),
        ));
    }
    for name in HISTOGRAMS {
        rules.push(Rule::record(
            format!("route_le:{name}_bucket:rate5m"),
            format!(
                "sum by (route, le) (rate({}[5m]))",
                series.raw(&format!("{name}_bucket"))
            ),
        ));
    }
    rules
}

fn cost_rules(cost: &Cost, series: &Series) -> Vec<Rule> {
    let currency = cost.currency.as_str();
    // One replica is one sidecar, and every sidecar exports build_info = 1.
    let per_second = "(:tokenmeter_cost_per_hour:sum / 3600)";
    let per = |record: &str, denominator: String| {
        // The cost series carries `currency`, the rates do not: match ignoring it, then put it
        // back as a rule label.
        Rule::record(
            record.to_string(),
            format!("{per_second} / ignoring (currency) ({denominator})"),
        )
        .label("currency", currency)
    };
    let rate1h = |counter: &str| format!("sum(rate({}[1h]))", series.raw(counter));
    vec![
        Rule::record(
            ":tokenmeter_cost_per_hour:sum".into(),
            format!(
                "{} * sum({})",
                cost.per_hour,
                series.raw("tokenmeter_build_info")
            ),
        )
        .label("currency", currency),
        per(
            ":tokenmeter_cost_per_request:rate1h",
            rate1h("tokenmeter_requests_total"),
        ),
        per(
            ":tokenmeter_cost_per_million_output_tokens:rate1h",
            format!("{} / 1e6", rate1h("tokenmeter_output_tokens_total")),
        ),
        per(
            ":tokenmeter_cost_per_million_good_output_tokens:rate1h",
            format!(
                "{} / 1e6",
                rate1h("tokenmeter_slo_good_output_tokens_total")
            ),
        ),
    ]
}

/// A percentage for people: at most four significant decimals, no trailing zeros.
fn percent(ratio: f64) -> String {
    let text = format!("{:.4}", ratio * 100.0);
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}%")
}

/// The routes that promise an objective; only they can have a budget to burn.
fn objectives(config: &Config) -> impl Iterator<Item = (&Route, f64)> {
    config
        .routes
        .iter()
        .filter_map(|r| r.slo.and_then(|s| s.objective).map(|o| (r, o)))
}

fn alert_rules(config: &Config, options: &Options, series: &Series) -> Vec<Rule> {
    let dashboard = |route: Option<&str>| {
        let mut url = format!(
            "{}/d/{DASHBOARD_UID}/tokenmeter",
            options.dashboard_url.trim_end_matches('/')
        );
        if let Some(route) = route {
            let _ = write!(url, "?var-route={route}");
        }
        url
    };
    let absent = Rule::alert(
        "TokenmeterMetricsAbsent",
        format!("absent({})", series.raw("tokenmeter_build_info")),
        "5m",
    )
    .label("severity", "page")
    .annotate(
        "summary",
        "No tokenmeter sidecar is being scraped".into(),
    )
    .annotate(
        "description",
        format!(
            "Prometheus has had no {} series for 5 minutes: the sidecars are down or not scraped, and no SLO alert can fire meanwhile.",
            series.raw("tokenmeter_build_info")
        ),
    )
    .annotate("dashboard", dashboard(None));
    let mut rules = vec![absent];
    for (route, objective) in objectives(config) {
        let name = route.name.as_str();
        let allowed = percent(1.0 - objective);
        // A query template, so the page says which criterion to look at first.
        let failing = format!(
            "{{{{ with query `topk(1, route_criterion:tokenmeter_slo_violations:rate1h{{route=\"{name}\"}})` }}}}{{{{ . | first | label \"criterion\" }}}}{{{{ else }}}}none recorded{{{{ end }}}}"
        );
        for burn in &BURN_ALERTS {
            // Burning faster than 1 / (1 - objective) is impossible (every request bad), so a
            // row whose threshold is unreachable would be a promise that can never be kept.
            if burn.factor * (1.0 - objective) >= 1.0 {
                continue;
            }
            let over = |w: &str| {
                format!(
                    "(1 - route:tokenmeter_slo_goodput:ratio_rate{w}{{route=\"{name}\"}}) > ({} * (1 - {objective}))",
                    burn.factor
                )
            };
            rules.push(
                Rule::alert(
                    "TokenmeterErrorBudgetBurn",
                    format!("{}\nand\n{}", over(burn.long), over(burn.short)),
                    burn.hold,
                )
                .label("severity", burn.severity)
                .label("route", name)
                .label("long_window", burn.long)
                .annotate(
                    "summary",
                    format!(
                        "Route {name} is burning its error budget at {}x or faster over {} and {}",
                        burn.factor, burn.long, burn.short
                    ),
                )
                .annotate(
                    "description",
                    format!(
                        "{{{{ $value | humanizePercentage }}}} of eligible requests on route {name} missed the SLO over the last {}; the objective allows {allowed}.",
                        burn.long
                    ),
                )
                .annotate("failing_criterion", failing.clone())
                .annotate("dashboard", dashboard(Some(name))),
            );
        }
        rules.push(
            Rule::alert(
                "TokenmeterGoodputBelowObjective",
                format!(
                    "route:tokenmeter_slo_goodput:ratio_rate1h{{route=\"{name}\"}} < {objective}\nand\nroute:tokenmeter_slo_eligible_requests:rate1h{{route=\"{name}\"}} * 3600 >= {}",
                    options.min_requests_per_hour
                ),
                "15m",
            )
            .label("severity", "ticket")
            .label("route", name)
            .annotate(
                "summary",
                format!(
                    "Route {name} is below its goodput objective of {} over 1h",
                    percent(objective)
                ),
            )
            .annotate(
                "description",
                format!(
                    "Goodput on route {name} over the last hour is {{{{ $value | humanizePercentage }}}} of eligible requests, under its objective of {}.",
                    percent(objective)
                ),
            )
            .annotate("failing_criterion", failing)
            .annotate("dashboard", dashboard(Some(name))),
        );
    }
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
    fn ratios_are_sums_divided_never_averages() {
        let file = rule_file(&config(ROUTES), &Options::default());
        for w in SLO_WINDOWS {
            assert_eq!(
                recorded(
                    &file,
                    &format!("route:tokenmeter_slo_eligible_requests:rate{w}")
                )
                .expr,
                format!("sum by (route) (rate(tokenmeter_slo_eligible_requests_total[{w}]))")
            );
            assert_eq!(
                recorded(&file, &format!("route:tokenmeter_slo_goodput:ratio_rate{w}")).expr,
                format!("route:tokenmeter_slo_good_requests:rate{w} / route:tokenmeter_slo_eligible_requests:rate{w}")
            );
        }
        assert_eq!(
            recorded(
                &file,
                "route_le:tokenmeter_time_to_first_token_seconds_bucket:rate5m"
            )
            .expr,
            "sum by (route, le) (rate(tokenmeter_time_to_first_token_seconds_bucket[5m]))"
        );
        for rule in all(&file) {
            assert!(!rule.expr.contains("avg"), "{rule:?}");
            if rule.expr.contains("rate(") {
                assert!(rule.expr.contains("sum"), "an unsummed rate: {rule:?}");
            }
        }
    }

    #[test]
    fn only_routes_with_an_objective_get_alerts_and_unreachable_burns_are_left_out() {
        let file = rule_file(&config(ROUTES), &Options::default());
        let alerts: Vec<(String, String, String)> = all(&file)
            .filter_map(|r| {
                Some((
                    r.alert.clone()?,
                    r.labels.get("route").cloned().unwrap_or_default(),
                    r.labels.get("long_window").cloned().unwrap_or_default(),
                ))
            })
            .collect();
        let expect = |a: &str, r: &str, w: &str| (a.to_string(), r.to_string(), w.to_string());
        assert_eq!(
            alerts,
            vec![
                expect("TokenmeterMetricsAbsent", "", ""),
                expect("TokenmeterErrorBudgetBurn", "chat", "1h"),
                expect("TokenmeterErrorBudgetBurn", "chat", "6h"),
                expect("TokenmeterErrorBudgetBurn", "chat", "3d"),
                expect("TokenmeterGoodputBelowObjective", "chat", ""),
                // 14.4 × 10 % is more than every request failing.
                expect("TokenmeterErrorBudgetBurn", "loose", "6h"),
                expect("TokenmeterErrorBudgetBurn", "loose", "3d"),
                expect("TokenmeterGoodputBelowObjective", "loose", ""),
            ]
        );
        let fast = all(&file)
            .find(|r| r.labels.get("long_window").map(String::as_str) == Some("1h"))
            .unwrap();
        assert_eq!(
            fast.expr,
            "(1 - route:tokenmeter_slo_goodput:ratio_rate1h{route=\"chat\"}) > (14.4 * (1 - 0.99))\nand\n(1 - route:tokenmeter_slo_goodput:ratio_rate5m{route=\"chat\"}) > (14.4 * (1 - 0.99))"
        );
        assert_eq!(fast.labels["severity"], "page");
        assert_eq!(
            fast.annotations["dashboard"],
            "http://localhost:3000/d/tokenmeter/tokenmeter?var-route=chat"
        );
        assert!(fast.annotations["description"].contains("allows 1%"));
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
                // Recorded names (`route:tokenmeter_...`) are ours and carry no selector.
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
        let hourly = recorded(&with, ":tokenmeter_cost_per_hour:sum");
        assert_eq!(hourly.expr, "2.5 * sum(tokenmeter_build_info)");
        let per_million = recorded(&with, ":tokenmeter_cost_per_million_output_tokens:rate1h");
        assert_eq!(
            per_million.expr,
            "(:tokenmeter_cost_per_hour:sum / 3600) / ignoring (currency) (sum(rate(tokenmeter_output_tokens_total[1h])) / 1e6)"
        );
        assert_eq!(per_million.labels["currency"], "EUR");
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
        assert_eq!(wrapped.spec, plain);
    }

    #[test]
    fn selectors_and_urls_are_checked() {
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
        assert_eq!(
            parse_base_url("https://grafana.example/").unwrap(),
            "https://grafana.example"
        );
        assert!(parse_base_url("grafana:3000").is_err());
        assert!(parse_base_url("http://").is_err());
    }

    #[test]
    fn percentages_read_well() {
        assert_eq!(percent(1.0 - 0.99), "1%");
        assert_eq!(percent(1.0 - 0.999), "0.1%");
        assert_eq!(percent(0.955), "95.5%");
    }
}
