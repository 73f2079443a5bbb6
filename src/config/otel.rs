//! The `otel:` section and the standard `OTEL_*` environment variables, resolved into one
//! [`OtelSettings`]: where OTLP goes, how often, what is sampled.
//!
//! Each field of the section is named after its environment variable (`OTEL_` and, for the
//! exporter's, `EXPORTER_OTLP_` left out, lower case). For every setting the environment wins
//! over the file and the file over the built-in default: a value the operator gives the pod
//! (`OTEL_*` in its spec, often injected by the OpenTelemetry Operator) overrides what the
//! shared configuration file says, as the OpenTelemetry SDKs do. An environment variable that is
//! set but empty counts as unset, as the SDK specification says.
//!
//! Export is switched on by an `otel:` section or by any of the three
//! `OTEL_EXPORTER_OTLP_*ENDPOINT` variables; `OTEL_SERVICE_NAME` alone (common in pod specs for
//! other reasons) does not. `OTEL_SDK_DISABLED=true` (or `sdk_disabled: true`) turns it off
//! whatever else says. Without any of these nothing is started: no thread, no queue, no metric.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, Deserializer};
use serde::Deserialize;

use super::bounded::{self, Entries, Optional, Text};
use super::excerpt;

/// The most entries `headers` and `resource_attributes` may hold.
pub const MAX_OTEL_ENTRIES: usize = 32;

/// The `otel:` section as written; every field optional, each one the same setting as its
/// environment variable.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Otel {
    /// `OTEL_SDK_DISABLED`.
    #[serde(default)]
    pub sdk_disabled: Option<bool>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: the base URL; `/v1/metrics` and `/v1/traces` are added.
    #[serde(default, deserialize_with = "optional_text")]
    pub endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`: the full URL, used as it is.
    #[serde(default, deserialize_with = "optional_text")]
    pub metrics_endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: the full URL, used as it is.
    #[serde(default, deserialize_with = "optional_text")]
    pub traces_endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` or `grpc`.
    #[serde(default, deserialize_with = "optional_text")]
    pub protocol: Option<String>,
    /// `OTEL_EXPORTER_OTLP_HEADERS`: sent with every export (an API key, a tenant).
    #[serde(default, deserialize_with = "entries")]
    pub headers: Option<BTreeMap<String, String>>,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`: the longest one export may take.
    #[serde(default, deserialize_with = "opt_duration")]
    pub timeout: Option<Duration>,
    /// `OTEL_EXPORTER_OTLP_COMPRESSION`: `gzip` or `none`.
    #[serde(default, deserialize_with = "optional_text")]
    pub compression: Option<String>,
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`: a PEM file of the CAs an https collector's certificate
    /// may chain to, beside Mozilla's roots.
    #[serde(default, deserialize_with = "optional_text")]
    pub certificate: Option<String>,
    /// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`: a PEM certificate chain for mutual TLS.
    #[serde(default, deserialize_with = "optional_text")]
    pub client_certificate: Option<String>,
    /// `OTEL_EXPORTER_OTLP_CLIENT_KEY`: the PEM private key of `client_certificate`.
    #[serde(default, deserialize_with = "optional_text")]
    pub client_key: Option<String>,
    /// `OTEL_SERVICE_NAME`.
    #[serde(default, deserialize_with = "optional_text")]
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`.
    #[serde(default, deserialize_with = "entries")]
    pub resource_attributes: Option<BTreeMap<String, String>>,
    /// `OTEL_METRICS_EXPORTER`: `otlp` or `none`.
    #[serde(default, deserialize_with = "optional_text")]
    pub metrics_exporter: Option<String>,
    /// `OTEL_TRACES_EXPORTER`: `otlp` or `none`.
    #[serde(default, deserialize_with = "optional_text")]
    pub traces_exporter: Option<String>,
    /// `OTEL_METRIC_EXPORT_INTERVAL` (the variable is in milliseconds; here a duration).
    #[serde(default, deserialize_with = "opt_duration")]
    pub metric_export_interval: Option<Duration>,
    /// `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`:
    /// `base2_exponential_bucket_histogram` or `explicit_bucket_histogram`.
    #[serde(default, deserialize_with = "optional_text")]
    pub metrics_default_histogram_aggregation: Option<String>,
    /// `OTEL_TRACES_SAMPLER`.
    #[serde(default, deserialize_with = "optional_text")]
    pub traces_sampler: Option<String>,
    /// `OTEL_TRACES_SAMPLER_ARG`: the ratio of the `traceidratio` samplers.
    #[serde(default, deserialize_with = "super::opt_ratio")]
    pub traces_sampler_arg: Option<f64>,
    /// `OTEL_BSP_SCHEDULE_DELAY` (milliseconds in the variable): how long a span may wait to be
    /// sent with others.
    #[serde(default, deserialize_with = "opt_duration")]
    pub bsp_schedule_delay: Option<Duration>,
    /// `OTEL_BSP_MAX_QUEUE_SIZE`: spans waiting for export; more are dropped and counted.
    #[serde(default)]
    pub bsp_max_queue_size: Option<usize>,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`: spans per export request.
    #[serde(default)]
    pub bsp_max_export_batch_size: Option<usize>,
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    super::positive_duration(d).map(Some)
}

fn optional_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Optional(Text).deserialize(d)
}

fn entries<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    let entries = Optional(Entries {
        key: Text,
        value: Text,
        max: MAX_OTEL_ENTRIES,
        what: "entries",
    })
    .deserialize(d)?;
    Ok(entries.map(|e| e.into_iter().collect()))
}

/// How each histogram is aggregated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistogramAggregation {
    /// Base-2 exponential buckets (native histograms in Prometheus): no boundaries to guess.
    Exponential,
    /// The GenAI conventions' advised explicit boundaries.
    Explicit,
}

/// `OTEL_TRACES_SAMPLER`, for the requests that went well: those that failed or violated their
/// SLO are always kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
    /// The caller's sampled flag decides when there is a caller; `root` otherwise.
    ParentBased(Root),
}

/// What a parent-based sampler does for a request without a caller's `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
}

/// How an export body is sent (`OTEL_EXPORTER_OTLP_COMPRESSION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

/// A PEM file a setting names, with the setting's name for the errors reading it gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemFile {
    pub path: std::path::PathBuf,
    /// The variable or `otel.` field it came from.
    pub setting: String,
}

/// Where and how one signal is sent: an OTLP/HTTP URL (`http://` or `https://host:port/path`)
/// and the signal's own headers, timeout, compression and TLS files, each from the signal's
/// variable (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`), else the general one, else the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// OTLP over gRPC (HTTP/2, `application/grpc`); else OTLP/HTTP protobuf.
    pub grpc: bool,
    pub tls: bool,
    pub authority: http::uri::Authority,
    pub path: http::uri::PathAndQuery,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub compression: Compression,
    /// CAs trusted beside Mozilla's roots.
    pub certificate: Option<PemFile>,
    /// A client certificate chain and its key, for mutual TLS.
    pub client: Option<(PemFile, PemFile)>,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.path)
    }
}

/// Everything the exporter needs, resolved from the environment, the file and the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct OtelSettings {
    /// `None`: metrics are not exported.
    pub metrics_endpoint: Option<Endpoint>,
    /// `None`: spans are not exported.
    pub traces_endpoint: Option<Endpoint>,
    /// The resource's attributes, `service.name` included.
    pub resource: Vec<(String, String)>,
    pub metric_export_interval: Duration,
    pub histogram: HistogramAggregation,
    pub sampler: Sampler,
    pub schedule_delay: Duration,
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
}

/// The defaults of the OpenTelemetry SDK specification.
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";
pub const DEFAULT_GRPC_ENDPOINT: &str = "http://localhost:4317";
/// The OTLP/gRPC methods (`opentelemetry/proto/collector/*/v1/*_service.proto`).
pub const GRPC_METRICS_METHOD: &str =
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
pub const GRPC_TRACES_METHOD: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_METRIC_EXPORT_INTERVAL: Duration = Duration::from_secs(60);
pub const DEFAULT_SCHEDULE_DELAY: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 2048;
pub const DEFAULT_MAX_EXPORT_BATCH_SIZE: usize = 512;
/// Spans held for export are bounded: a larger queue would be memory a down collector fills.
pub const MAX_QUEUE_SIZE: usize = 65_536;

/// One setting's value and where it came from, for error messages.
struct Source {
    value: Option<String>,
    name: String,
}

/// Resolves the settings: `env` looks a variable up (the process's environment, or a test's
/// map). `None` when export is off. An error names the variable or the `otel.` field and says
/// what is wrong, in one line.
pub fn resolve(
    file: Option<&Otel>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<OtelSettings>, String> {
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let empty = Otel::default();
    let f = file.unwrap_or(&empty);
    // Environment first, then the file: each pick says where its value came from.
    let pick = |var: &str, field: &str, from_file: Option<String>| -> Source {
        match env(var) {
            Some(v) => Source {
                value: Some(v),
                name: var.to_string(),
            },
            None => Source {
                value: from_file,
                name: field.to_string(),
            },
        }
    };
    // A signal's own variable (`OTEL_EXPORTER_OTLP_TRACES_COMPRESSION`), else the general one
    // (`OTEL_EXPORTER_OTLP_COMPRESSION`), else the file's field.
    let pick_for = |signal: &str, setting: &str, field: &str, from_file: Option<String>| {
        let own = format!("OTEL_EXPORTER_OTLP_{signal}_{setting}");
        match env(&own) {
            Some(v) => Source {
                value: Some(v),
                name: own,
            },
            None => pick(&format!("OTEL_EXPORTER_OTLP_{setting}"), field, from_file),
        }
    };
    let endpoint_vars = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ];
    if file.is_none() && endpoint_vars.iter().all(|v| env(v).is_none()) {
        return Ok(None);
    }
    let disabled = pick(
        "OTEL_SDK_DISABLED",
        "otel.sdk_disabled",
        f.sdk_disabled.map(|b| b.to_string()),
    );
    if let Some(v) = &disabled.value {
        match v.trim().to_ascii_lowercase().as_str() {
            "true" => return Ok(None),
            "false" => {}
            _ => return Err(bad(&disabled, "true or false")),
        }
    }

    let base = pick(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "otel.endpoint",
        f.endpoint.clone(),
    );
    // Checked as written, so that an error quotes what the operator wrote.
    if let Some(url) = &base.value {
        endpoint(url, &base)?;
    }
    let signal_endpoint = |signal: &str, from_file: Option<String>, suffix: &str| {
        let protocol = pick_for(signal, "PROTOCOL", "otel.protocol", f.protocol.clone());
        let grpc = match protocol.value.as_deref().map(str::trim) {
            None | Some("http/protobuf") => false,
            Some("grpc") => true,
            Some("http/json") => {
                return Err(format!(
                    "{}: http/json is not supported; use http/protobuf or grpc",
                    protocol.name
                ))
            }
            Some(_) => return Err(bad(&protocol, "http/protobuf or grpc")),
        };
        let own = pick(
            &format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"),
            &format!("otel.{}_endpoint", signal.to_ascii_lowercase()),
            from_file,
        );
        let default = if grpc {
            DEFAULT_GRPC_ENDPOINT
        } else {
            DEFAULT_ENDPOINT
        };
        let base_text = base.value.as_deref().unwrap_or(default);
        let (tls, authority, path) = match (&own.value, grpc) {
            (Some(url), false) => endpoint(url, &own)?,
            // gRPC: the URL names the server; the path is the service's method.
            (Some(url), true) => endpoint(url, &own)?,
            (None, true) => endpoint(base_text, &base)?,
            (None, false) => {
                // The base URL with the signal's path added, after a `/` (the specification).
                let joined = format!("{}/{suffix}", base_text.trim_end_matches('/'));
                endpoint(&joined, &base)?
            }
        };
        let path = if grpc {
            http::uri::PathAndQuery::from_static(if signal == "METRICS" {
                GRPC_METRICS_METHOD
            } else {
                GRPC_TRACES_METHOD
            })
        } else {
            path
        };
        let headers = {
            let h = pick_for(signal, "HEADERS", "otel.headers", None);
            match &h.value {
                Some(v) => pairs(v, &h.name)?,
                None => f
                    .headers
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            }
        };
        for (name, value) in &headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err()
                || http::HeaderValue::from_str(value).is_err()
            {
                return Err(format!(
                    "OTLP header `{}`: not a valid HTTP header name and value",
                    excerpt(name)
                ));
            }
        }
        let timeout = {
            let t = pick_for(signal, "TIMEOUT", "otel.timeout", None);
            millis(&t.name, t.value)?
                .or(f.timeout)
                .unwrap_or(DEFAULT_TIMEOUT)
        };
        let compression = pick_for(
            signal,
            "COMPRESSION",
            "otel.compression",
            f.compression.clone(),
        );
        let compression = match compression.value.as_deref().map(str::trim) {
            None | Some("none") => Compression::None,
            Some("gzip") => Compression::Gzip,
            Some(_) => return Err(bad(&compression, "gzip or none")),
        };
        let pem = |setting: &str, field: &str, from_file: &Option<String>| {
            let p = pick_for(signal, setting, field, from_file.clone());
            p.value.map(|v| PemFile {
                path: v.trim().into(),
                setting: p.name,
            })
        };
        let certificate = pem("CERTIFICATE", "otel.certificate", &f.certificate);
        let client = match (
            pem(
                "CLIENT_CERTIFICATE",
                "otel.client_certificate",
                &f.client_certificate,
            ),
            pem("CLIENT_KEY", "otel.client_key", &f.client_key),
        ) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(c), None) => {
                return Err(format!(
                    "{}: a client certificate needs its key (OTEL_EXPORTER_OTLP_CLIENT_KEY or otel.client_key)",
                    c.setting
                ))
            }
            (None, Some(k)) => {
                return Err(format!(
                    "{}: a client key needs its certificate (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE or otel.client_certificate)",
                    k.setting
                ))
            }
        };
        // TLS files for a plain-http signal: the signal's own setting is a mistake; a general
        // one may serve the other signal (checked once both are known).
        let (certificate, client) = if tls {
            (certificate, client)
        } else {
            let own = format!("_{signal}_");
            let files = certificate.iter().chain(client.iter().map(|c| &c.0));
            if let Some(p) = files.into_iter().find(|p| p.setting.contains(&own)) {
                return Err(format!(
                    "{}: TLS files need an https:// endpoint; {} go to http://{authority}",
                    p.setting,
                    signal.to_ascii_lowercase()
                ));
            }
            (None, None)
        };
        Ok::<Endpoint, String>(Endpoint {
            grpc,
            tls,
            authority,
            path,
            headers,
            timeout,
            compression,
            certificate,
            client,
        })
    };
    let exporter = |var, field, from_file: Option<String>| -> Result<bool, String> {
        let s = pick(var, field, from_file);
        match s.value.as_deref().map(str::trim) {
            None | Some("otlp") => Ok(true),
            Some("none") => Ok(false),
            Some(_) => Err(bad(&s, "otlp or none")),
        }
    };
    let metrics_endpoint = if exporter(
        "OTEL_METRICS_EXPORTER",
        "otel.metrics_exporter",
        f.metrics_exporter.clone(),
    )? {
        Some(signal_endpoint(
            "METRICS",
            f.metrics_endpoint.clone(),
            "v1/metrics",
        )?)
    } else {
        None
    };
    let traces_endpoint = if exporter(
        "OTEL_TRACES_EXPORTER",
        "otel.traces_exporter",
        f.traces_exporter.clone(),
    )? {
        Some(signal_endpoint(
            "TRACES",
            f.traces_endpoint.clone(),
            "v1/traces",
        )?)
    } else {
        None
    };

    let mut resource: Vec<(String, String)> = match env("OTEL_RESOURCE_ATTRIBUTES") {
        Some(v) => pairs(&v, "OTEL_RESOURCE_ATTRIBUTES")?,
        None => f
            .resource_attributes
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    // `OTEL_SERVICE_NAME` wins over a `service.name` among the attributes (the specification).
    let service_name = env("OTEL_SERVICE_NAME")
        .or_else(|| f.service_name.clone())
        .or_else(|| {
            resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|| "tokenmeter".into());
    resource.retain(|(k, _)| k != "service.name");
    resource.insert(0, ("service.name".into(), service_name));

    let metric_export_interval = millis(
        "OTEL_METRIC_EXPORT_INTERVAL",
        env("OTEL_METRIC_EXPORT_INTERVAL"),
    )?
    .or(f.metric_export_interval)
    .unwrap_or(DEFAULT_METRIC_EXPORT_INTERVAL);
    let schedule_delay = millis("OTEL_BSP_SCHEDULE_DELAY", env("OTEL_BSP_SCHEDULE_DELAY"))?
        .or(f.bsp_schedule_delay)
        .unwrap_or(DEFAULT_SCHEDULE_DELAY);

    let aggregation = pick(
        "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
        "otel.metrics_default_histogram_aggregation",
        f.metrics_default_histogram_aggregation.clone(),
    );
    let histogram = match aggregation.value.as_deref().map(str::trim) {
        None | Some("base2_exponential_bucket_histogram") => HistogramAggregation::Exponential,
        Some("explicit_bucket_histogram") => HistogramAggregation::Explicit,
        Some(_) => {
            return Err(bad(
                &aggregation,
                "base2_exponential_bucket_histogram or explicit_bucket_histogram",
            ))
        }
    };

    let arg = match env("OTEL_TRACES_SAMPLER_ARG") {
        Some(v) => Some(
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| {
                    format!(
                        "OTEL_TRACES_SAMPLER_ARG: `{}` is not a ratio between 0 and 1, like 0.1",
                        excerpt(&v)
                    )
                })?,
        ),
        None => f.traces_sampler_arg,
    };
    let ratio = arg.unwrap_or(1.0);
    let sampler_source = pick(
        "OTEL_TRACES_SAMPLER",
        "otel.traces_sampler",
        f.traces_sampler.clone(),
    );
    let sampler = match sampler_source.value.as_deref().map(str::trim) {
        None | Some("parentbased_always_on") => Sampler::ParentBased(Root::AlwaysOn),
        Some("parentbased_always_off") => Sampler::ParentBased(Root::AlwaysOff),
        Some("parentbased_traceidratio") => Sampler::ParentBased(Root::TraceIdRatio(ratio)),
        Some("always_on") => Sampler::AlwaysOn,
        Some("always_off") => Sampler::AlwaysOff,
        Some("traceidratio") => Sampler::TraceIdRatio(ratio),
        Some(_) => {
            return Err(bad(
                &sampler_source,
                "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio",
            ))
        }
    };

    let count = |var: &'static str, from_file: Option<usize>, default: usize| {
        let n = match env(var) {
            Some(v) => Some(
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("{var}: `{}` is not a whole number", excerpt(&v)))?,
            ),
            None => from_file,
        }
        .unwrap_or(default);
        if n == 0 || n > MAX_QUEUE_SIZE {
            return Err(format!(
                "{var}: {n} is outside 1..={MAX_QUEUE_SIZE} (spans held for export)"
            ));
        }
        Ok(n)
    };
    let max_queue_size = count(
        "OTEL_BSP_MAX_QUEUE_SIZE",
        f.bsp_max_queue_size,
        DEFAULT_MAX_QUEUE_SIZE,
    )?;
    let max_export_batch_size = count(
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        f.bsp_max_export_batch_size,
        DEFAULT_MAX_EXPORT_BATCH_SIZE,
    )?
    // The specification: a batch larger than the queue is the queue.
    .min(max_queue_size);

    if metrics_endpoint.is_none() && traces_endpoint.is_none() {
        return Ok(None);
    }
    let https = [&metrics_endpoint, &traces_endpoint]
        .into_iter()
        .flatten()
        .any(|e| e.tls);
    if !https {
        for (var, field, from_file) in [
            (
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                "otel.certificate",
                &f.certificate,
            ),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                "otel.client_certificate",
                &f.client_certificate,
            ),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                "otel.client_key",
                &f.client_key,
            ),
        ] {
            let s = pick(var, field, from_file.clone());
            if s.value.is_some() {
                return Err(format!(
                    "{}: TLS files need an https:// endpoint; every signal goes over http",
                    s.name
                ));
            }
        }
    }
    Ok(Some(OtelSettings {
        metrics_endpoint,
        traces_endpoint,
        resource,
        metric_export_interval,
        histogram,
        sampler,
        schedule_delay,
        max_queue_size,
        max_export_batch_size,
    }))
}

fn bad(source: &Source, expected: &str) -> String {
    format!(
        "{}: `{}` is not one of {expected}",
        source.name,
        excerpt(source.value.as_deref().unwrap_or_default())
    )
}

/// A duration in milliseconds, as the `OTEL_*` variables give them.
fn millis(var: &str, value: Option<String>) -> Result<Option<Duration>, String> {
    let Some(v) = value else { return Ok(None) };
    match v.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
        _ => Err(format!(
            "{var}: `{}` is not a positive number of milliseconds",
            excerpt(&v)
        )),
    }
}

/// `key1=value1,key2=value2`, values percent-decoded (the W3C Baggage format the variables use).
fn pairs(text: &str, var: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in text.split(',').filter(|i| !i.trim().is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            format!(
                "{var}: `{}` is not key=value (entries are separated by commas)",
                excerpt(item)
            )
        })?;
        let (k, v) = (k.trim(), percent_decode(v.trim()));
        if k.is_empty() {
            return Err(format!("{var}: `{}` has an empty key", excerpt(item)));
        }
        if out.len() == MAX_OTEL_ENTRIES {
            return Err(format!("{var}: more than {MAX_OTEL_ENTRIES} entries"));
        }
        bounded::check_length::<de::value::Error>(k)
            .and(bounded::check_length::<de::value::Error>(&v))
            .map_err(|e| format!("{var}: {e}"))?;
        out.push((k.to_string(), v));
    }
    Ok(out)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses an OTLP/HTTP URL: whether it is https, its authority and path; `source` names where
/// it came from.
fn endpoint(
    url: &str,
    source: &Source,
) -> Result<(bool, http::uri::Authority, http::uri::PathAndQuery), String> {
    let uri: http::Uri = url
        .trim()
        .parse()
        .map_err(|e| format!("{}: `{}` is not a URL: {e}", source.name, excerpt(url)))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(format!(
                "{}: `{}` needs http:// or https://, like http://otel-collector:4318",
                source.name,
                excerpt(url)
            ))
        }
    };
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| format!("{}: `{}` needs a host", source.name, excerpt(url)))?;
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    Ok((tls, authority, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn section(yaml: &str) -> Otel {
        serde_yaml::from_str(yaml).expect("a valid section")
    }

    #[test]
    fn nothing_set_means_nothing_started() {
        assert_eq!(resolve(None, &env(&[])), Ok(None));
        // Settings that do not say where to send switch nothing on.
        let only_name = env(&[("OTEL_SERVICE_NAME", "x"), ("OTEL_TRACES_SAMPLER", "bogus")]);
        assert_eq!(resolve(None, &only_name), Ok(None));
        // Set but empty is unset.
        assert_eq!(
            resolve(None, &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])),
            Ok(None)
        );
    }

    #[test]
    fn the_base_endpoint_gets_each_signals_path_and_the_defaults_of_the_specification() {
        let s = resolve(
            None,
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]),
        )
        .unwrap()
        .expect("on");
        assert_eq!(
            s.metrics_endpoint.as_ref().unwrap().to_string(),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            s.traces_endpoint.as_ref().unwrap().to_string(),
            "http://collector:4318/v1/traces"
        );
        let metrics = s.metrics_endpoint.as_ref().unwrap();
        assert_eq!(metrics.timeout, DEFAULT_TIMEOUT);
        assert_eq!(metrics.compression, Compression::None);
        assert!(!metrics.tls && metrics.certificate.is_none() && metrics.client.is_none());
        assert_eq!(s.metric_export_interval, DEFAULT_METRIC_EXPORT_INTERVAL);
        assert_eq!(s.histogram, HistogramAggregation::Exponential);
        assert_eq!(s.sampler, Sampler::ParentBased(Root::AlwaysOn));
        assert_eq!(
            s.resource,
            vec![("service.name".into(), "tokenmeter".into())]
        );
        assert_eq!(s.max_queue_size, DEFAULT_MAX_QUEUE_SIZE);
    }

    #[test]
    fn a_signals_own_endpoint_is_used_as_it_is_and_alone_switches_export_on() {
        let s = resolve(
            None,
            &env(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://tempo:4318/otlp/t",
            )]),
        )
        .unwrap()
        .expect("on");
        assert_eq!(
            s.traces_endpoint.unwrap().to_string(),
            "http://tempo:4318/otlp/t"
        );
        // The other signal goes to the default base.
        assert_eq!(
            s.metrics_endpoint.unwrap().to_string(),
            "http://localhost:4318/v1/metrics"
        );
    }

    #[test]
    fn the_environment_wins_over_the_file_and_the_file_over_the_defaults() {
        let file = section(
            "endpoint: http://from-file:4318\nservice_name: file-name\nmetric_export_interval: 5s\ntraces_sampler: traceidratio\ntraces_sampler_arg: 0.25\nheaders: {x-key: file}\nresource_attributes: {deployment.environment: prod}\n",
        );
        let from_file = resolve(Some(&file), &env(&[])).unwrap().expect("on");
        assert_eq!(
            from_file.metrics_endpoint.unwrap().to_string(),
            "http://from-file:4318/v1/metrics"
        );
        assert_eq!(from_file.metric_export_interval, Duration::from_secs(5));
        assert_eq!(from_file.sampler, Sampler::TraceIdRatio(0.25));
        assert_eq!(
            from_file.traces_endpoint.as_ref().unwrap().headers,
            vec![("x-key".into(), "file".into())]
        );
        assert_eq!(
            from_file.resource,
            vec![
                ("service.name".into(), "file-name".into()),
                ("deployment.environment".into(), "prod".into())
            ]
        );

        let over = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://from-env:4318"),
            ("OTEL_SERVICE_NAME", "env-name"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1500"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=env%20value,x-tenant=a"),
        ]);
        let s = resolve(Some(&file), &over).unwrap().expect("on");
        assert_eq!(
            s.traces_endpoint.unwrap().to_string(),
            "http://from-env:4318/v1/traces"
        );
        assert_eq!(s.metric_export_interval, Duration::from_millis(1500));
        // The sampler from the file, its ratio from the environment.
        assert_eq!(s.sampler, Sampler::TraceIdRatio(0.5));
        assert_eq!(
            s.metrics_endpoint.as_ref().unwrap().headers,
            vec![
                ("x-key".into(), "env value".into()),
                ("x-tenant".into(), "a".into())
            ]
        );
        assert_eq!(s.resource[0], ("service.name".into(), "env-name".into()));
    }

    #[test]
    fn each_signal_takes_its_own_setting_else_the_general_one_else_the_file() {
        let file = section(
            "endpoint: https://collector:4318\ncompression: gzip\ncertificate: /file/ca.pem\ntimeout: 3s\nheaders: {x-key: file}\n",
        );
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "/env/traces-ca.pem",
            ),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-key=metrics"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "500"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/env/client.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/env/client.key"),
        ]);
        let s = resolve(Some(&file), &vars).unwrap().expect("on");
        let (m, t) = (s.metrics_endpoint.unwrap(), s.traces_endpoint.unwrap());
        assert_eq!(m.to_string(), "https://collector:4318/v1/metrics");
        assert!(m.tls && t.tls);
        assert_eq!(m.compression, Compression::Gzip);
        assert_eq!(t.compression, Compression::None);
        let path = |p: &Option<PemFile>| p.as_ref().map(|p| (p.path.clone(), p.setting.clone()));
        assert_eq!(
            path(&m.certificate),
            Some(("/file/ca.pem".into(), "otel.certificate".into()))
        );
        assert_eq!(
            path(&t.certificate),
            Some((
                "/env/traces-ca.pem".into(),
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE".into()
            ))
        );
        let (chain, key) = t.client.expect("mutual TLS");
        assert_eq!(chain.path, std::path::PathBuf::from("/env/client.pem"));
        assert_eq!(key.setting, "OTEL_EXPORTER_OTLP_CLIENT_KEY");
        assert_eq!(m.headers, vec![("x-key".into(), "metrics".into())]);
        assert_eq!(t.headers, vec![("x-key".into(), "file".into())]);
        assert_eq!(m.timeout, Duration::from_millis(500));
        assert_eq!(t.timeout, Duration::from_millis(2000));
        // A general TLS file is left off a signal that goes over plain http.
        let mixed = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://t:4318/v1/traces",
            ),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/env/ca.pem"),
        ]);
        let s = resolve(None, &mixed).unwrap().expect("on");
        assert!(s.metrics_endpoint.unwrap().certificate.is_none());
        assert!(s.traces_endpoint.unwrap().certificate.is_some());
    }

    #[test]
    fn grpc_takes_the_url_as_it_is_and_the_services_method_as_its_path() {
        let only = env(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_SERVICE_NAME", "x"),
        ]);
        let file = section("protocol: grpc\n");
        let s = resolve(Some(&file), &only).unwrap().expect("on");
        let (m, t) = (s.metrics_endpoint.unwrap(), s.traces_endpoint.unwrap());
        assert!(m.grpc && t.grpc);
        assert_eq!(
            m.to_string(),
            "http://localhost:4317/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
        );
        assert_eq!(
            t.to_string(),
            "http://localhost:4317/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        // One signal over gRPC to its own URL, the other over HTTP to the base.
        let mixed = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://tempo:4317"),
        ]);
        let s = resolve(None, &mixed).unwrap().expect("on");
        let (m, t) = (s.metrics_endpoint.unwrap(), s.traces_endpoint.unwrap());
        assert!(!m.grpc && t.grpc && t.tls);
        assert_eq!(m.to_string(), "http://collector:4318/v1/metrics");
        assert_eq!(
            t.to_string(),
            "https://tempo:4317/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        // The base URL is taken as it is for gRPC: no `/v1/traces` added.
        let base = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        let s = resolve(None, &base).unwrap().expect("on");
        assert_eq!(
            s.traces_endpoint.unwrap().authority.as_str(),
            "collector:4317"
        );
    }

    #[test]
    fn disabled_wins_and_the_environment_can_undo_the_files_disabling() {
        let on = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]);
        let off = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ]);
        assert!(resolve(None, &on).unwrap().is_some());
        assert_eq!(resolve(None, &off), Ok(None));
        let file = section("sdk_disabled: true\n");
        assert_eq!(resolve(Some(&file), &env(&[])), Ok(None));
        let undo = env(&[("OTEL_SDK_DISABLED", "false")]);
        assert!(resolve(Some(&file), &undo).unwrap().is_some());
        // Both signals `none`: nothing to start.
        let none = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_METRICS_EXPORTER", "none"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ]);
        assert_eq!(resolve(None, &none), Ok(None));
    }

    #[test]
    fn bad_values_are_refused_naming_their_variable_or_field() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "OTEL_EXPORTER_OTLP_PROTOCOL: http/json is not supported",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift")],
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: `thrift` is not one of http/protobuf or grpc",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT: `collector:4318` needs http://",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")],
                "OTEL_EXPORTER_OTLP_COMPRESSION: `zstd` is not one of gzip or none",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon")],
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: `soon` is not a positive number",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ca.pem")],
                "OTEL_EXPORTER_OTLP_CERTIFICATE: TLS files need an https:// endpoint",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
                    ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/etc/client.pem"),
                ],
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: a client certificate needs its key",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://t:4318/v1/traces"),
                    ("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "/etc/ca.pem"),
                ],
                "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE: TLS files need an https:// endpoint; metrics go to http://c:4318",
            ),
            (
                &[("OTEL_TRACES_SAMPLER", "jaeger_remote")],
                "OTEL_TRACES_SAMPLER: `jaeger_remote` is not one of",
            ),
            (
                &[("OTEL_TRACES_SAMPLER_ARG", "2")],
                "OTEL_TRACES_SAMPLER_ARG: `2` is not a ratio",
            ),
            (
                &[("OTEL_METRIC_EXPORT_INTERVAL", "10s")],
                "OTEL_METRIC_EXPORT_INTERVAL: `10s` is not a positive number of milliseconds",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")],
                "OTEL_EXPORTER_OTLP_HEADERS: `novalue` is not key=value",
            ),
            (
                &[("OTEL_SDK_DISABLED", "yes")],
                "OTEL_SDK_DISABLED: `yes` is not one of true or false",
            ),
            (
                &[("OTEL_BSP_MAX_QUEUE_SIZE", "0")],
                "OTEL_BSP_MAX_QUEUE_SIZE: 0 is outside",
            ),
            (
                &[("OTEL_METRICS_EXPORTER", "prometheus")],
                "OTEL_METRICS_EXPORTER: `prometheus` is not one of otlp or none",
            ),
        ];
        for (vars, expected) in cases {
            let mut vars = vars.to_vec();
            if !vars
                .iter()
                .any(|(k, _)| *k == "OTEL_EXPORTER_OTLP_ENDPOINT")
            {
                vars.push(("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"));
            }
            let err = resolve(None, &env(&vars)).expect_err(expected);
            assert!(err.contains(expected), "{err:?} should say {expected:?}");
            assert!(!err.contains('\n'));
        }
        let file = section("protocol: http/json\n");
        let err = resolve(Some(&file), &env(&[])).expect_err("http/json");
        assert!(err.starts_with("otel.protocol: http/json"), "{err}");
    }
}
