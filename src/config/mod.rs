//! Floor 2, `config`: the configuration file: its schema, every default and its validation.
//!
//! Configuration is data: the YAML is read once into typed values and checked before anything
//! uses it. Every error names the file, the field (with its line where the YAML parser gives it)
//! and the problem, in one line that quotes at most a short excerpt of the file; unknown fields
//! are refused, so a typo never silently means "default".
//!
//! A configuration file cannot hurt the process that reads it, whether `check`, the start or a
//! reload: only a regular file of at most 256 KiB is read ([`file`]), nesting deeper than 16
//! levels is refused before the YAML parser runs ([`nesting`]), and every list, map and string
//! is bounded while it is read ([`bounded`]), so that no alias expansion can build more than
//! the limits below allow: 256 routes of at most 52 strings each (name, path, path prefix,
//! model glob, 16 methods, 16 header names and values) and 1,000 models, every string at most
//! 1 KiB: about 14 MiB in the very worst case, against a few KB for a real configuration.

mod bounded;
mod excerpt;
mod file;
mod identity;
mod nesting;
mod otel;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, DeserializeSeed, Deserializer, Visitor};
use serde::Deserialize;

use bounded::{Entries, List, Optional, Plain, Text};
pub use excerpt::{excerpt, one_line};
pub use file::{read as read_file, MAX_FILE_BYTES};
pub use identity::Identity;
pub use nesting::MAX_NESTING;
pub use otel::{
    resolve as resolve_otel, Compression, Endpoint, HistogramAggregation, Otel, OtelSettings,
    PemFile, Root, Sampler,
};

/// The name of the route that takes every request no configured route matched.
pub const DEFAULT_ROUTE: &str = "default";
/// How many distinct model names get a label of their own before the rest become `other`.
pub const DEFAULT_MODEL_LABEL_LIMIT: usize = 16;
/// The most routes a configuration may hold; each one is a set of series in `/metrics`.
pub const MAX_ROUTES: usize = 256;
/// The most names in `models`, as many as `model_label_limit` allows labels.
pub const MAX_MODELS: usize = 1000;
/// The most methods one route may match (HTTP defines nine).
pub const MAX_METHODS: usize = 16;
/// The most header conditions one route may have.
pub const MAX_HEADERS: usize = 16;

/// A checked configuration, ready to serve.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where clients connect (HTTP/1.1 and h2c).
    pub listen: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub admin: SocketAddr,
    /// The one model server every request goes to.
    pub upstream: Upstream,
    /// The per-request record; absent means none is written.
    pub access_log: Option<AccessLog>,
    /// The pod, namespace and deployment the record names where the environment does not say
    /// them ([`Identity::resolve`]).
    pub identity: Identity,
    pub timeouts: Timeouts,
    /// Routes in match order; the first match wins.
    #[serde(deserialize_with = "routes")]
    pub routes: Vec<Route>,
    /// Model names that get a metric label of their own; any other model is `other`.
    #[serde(deserialize_with = "models")]
    pub models: Option<Vec<String>>,
    /// Without `models`, how many distinct model names get a label before the rest are `other`.
    pub model_label_limit: usize,
    pub stream: StreamLimits,
    /// Bounds on connections and what each may hold.
    pub limits: Limits,
    pub reload: Reload,
    /// What one replica (the pod: model server and sidecar) costs; absent means no cost rules.
    pub cost: Option<Cost>,
    /// The engine's own Prometheus metrics, sampled for its state at each request's arrival;
    /// absent means none is read.
    pub engine_metrics: Option<EngineMetrics>,
    /// OpenTelemetry export (OTLP); the `OTEL_*` environment variables override it, and can
    /// switch it on without it ([`resolve_otel`]).
    pub otel: Option<Otel>,
}

/// Where and how often the engine's own metrics are read: one bounded scrape per interval, never
/// one per request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineMetrics {
    /// `http://host:port/path`, like `http://127.0.0.1:8000/metrics`.
    pub url: MetricsUrl,
    #[serde(
        deserialize_with = "duration",
        default = "EngineMetrics::default_interval"
    )]
    pub interval: Duration,
}

impl EngineMetrics {
    fn default_interval() -> Duration {
        Duration::from_secs(1)
    }
}

/// An `http://` URL with a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsUrl {
    pub authority: http::uri::Authority,
    pub path: http::uri::PathAndQuery,
}

impl fmt::Display for MetricsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

impl<'de> Deserialize<'de> for MetricsUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Text.deserialize(d)?;
        let uri: http::Uri = text
            .parse()
            .map_err(|e| de::Error::custom(format!("invalid URL `{}`: {e}", excerpt(&text))))?;
        if uri.scheme() != Some(&http::uri::Scheme::HTTP) {
            return Err(de::Error::custom(format!(
                "`{}`: only http:// is supported, like http://127.0.0.1:8000/metrics",
                excerpt(&text)
            )));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| de::Error::custom(format!("`{}` needs a host", excerpt(&text))))?;
        let path = uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/metrics"));
        Ok(MetricsUrl { authority, path })
    }
}

/// The price of one replica, from which `tokenmeter rules` derives cost per request and per
/// million tokens. The proxy itself never reads it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// What one replica costs per hour, in `currency`.
    #[serde(deserialize_with = "price")]
    pub per_hour: f64,
    /// An ISO 4217 code, like USD or EUR; it becomes the `currency` label of the cost series.
    #[serde(deserialize_with = "currency")]
    pub currency: String,
}

/// Bounds on connections: how many, and what each may hold in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Client connections open at once; one more is answered 503 and closed. `0` (the default)
    /// derives it from the process's file-descriptor limit: half of what is left after a
    /// reserve, since each client connection may hold an upstream connection too.
    pub max_connections: usize,
    /// The largest request head (request line and headers) a client may send; a larger one is
    /// answered 431. Also hyper's per-connection read and write buffer.
    pub max_request_head_bytes: usize,
    /// A request body up to this size is kept until the response head arrives, so that a request
    /// whose reused upstream connection died before answering can be sent again on a fresh one.
    /// Larger bodies are not retried.
    pub retry_body_bytes: usize,
    /// HTTP/2 streams one client connection may have open at once.
    pub max_concurrent_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 0,
            max_request_head_bytes: 64 << 10,
            retry_body_bytes: 1 << 20,
            max_concurrent_streams: 128,
        }
    }
}

/// Bounds on reading response streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamLimits {
    /// An event larger than this is forwarded untouched but not parsed; this also bounds the
    /// reader's memory per stream.
    pub max_event_bytes: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            max_event_bytes: 1 << 20,
        }
    }
}

/// How the configuration file is watched for changes (SIGHUP always reloads it too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Reload {
    /// How often the file is read to see whether it changed; `0s` turns watching off.
    #[serde(deserialize_with = "duration")]
    pub watch_interval: Duration,
}

impl Default for Reload {
    fn default() -> Self {
        Reload {
            watch_interval: Duration::from_secs(2),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            admin: SocketAddr::from(([0, 0, 0, 0], 9464)),
            upstream: Upstream::parse("http://127.0.0.1:8000").expect("built-in upstream is valid"),
            access_log: None,
            identity: Identity::default(),
            timeouts: Timeouts::default(),
            routes: Vec::new(),
            models: None,
            model_label_limit: DEFAULT_MODEL_LABEL_LIMIT,
            stream: StreamLimits::default(),
            limits: Limits::default(),
            reload: Reload::default(),
            cost: None,
            engine_metrics: None,
            otel: None,
        }
    }
}

/// The upstream model server, as an `http://host:port` origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: http::uri::Scheme,
    pub authority: http::uri::Authority,
}

impl Upstream {
    /// Parses `http://host:port` (a trailing `/` is allowed; any other path is refused because
    /// the proxy forwards paths as the client sent them).
    pub fn parse(text: &str) -> Result<Self, String> {
        let uri: http::Uri = text
            .parse()
            .map_err(|e| format!("invalid upstream URL `{}`: {e}", excerpt(text)))?;
        // Quoted only as an excerpt in the messages below.
        let text = excerpt(text);
        let scheme = uri.scheme().cloned().ok_or_else(|| {
            format!("upstream `{text}` needs a scheme, like http://127.0.0.1:8000")
        })?;
        if scheme != http::uri::Scheme::HTTP {
            return Err(format!(
                "upstream `{text}`: only http:// is supported (a sidecar talks to its model server in the clear over loopback)"
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("upstream `{text}` needs a host, like http://127.0.0.1:8000"))?;
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(format!(
                "upstream `{text}` must not have a path: requests keep the path the client sent"
            ));
        }
        Ok(Upstream { scheme, authority })
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

impl<'de> Deserialize<'de> for Upstream {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Text.deserialize(d)?;
        Upstream::parse(&text).map_err(de::Error::custom)
    }
}

/// Where the per-request record goes and in which format.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLog {
    /// A file path, or `-` for standard output.
    pub path: LogPath,
    #[serde(default)]
    pub format: LogFormat,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogPath {
    Stdout,
    File(PathBuf),
}

impl<'de> Deserialize<'de> for LogPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Text.deserialize(d)?;
        match text.as_str() {
            "" => Err(de::Error::custom(
                "empty path: give a file path, or - for standard output",
            )),
            "-" => Ok(LogPath::Stdout),
            _ => Ok(LogPath::File(PathBuf::from(text))),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Jsonl,
    Csv,
}

/// How long the proxy waits, and for what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Connecting to the upstream; past it the client gets 502. Zero would fail every request.
    #[serde(deserialize_with = "positive_duration")]
    pub connect: Duration,
    /// From forwarding the request to the upstream's response head; past it the client gets 504.
    /// Non-streaming completions send their head only when generation is done, so this is long.
    /// Zero would fail every request.
    #[serde(deserialize_with = "positive_duration")]
    pub response_head: Duration,
    /// After SIGTERM, how long in-flight streams may go on before the process exits anyway.
    #[serde(deserialize_with = "duration")]
    pub drain: Duration,
    /// For a client's first bytes, and for each request head to be complete from its first
    /// byte: a connection that sends nothing, a partial head and an incomplete HTTP/2 preface
    /// are closed.
    #[serde(deserialize_with = "duration")]
    pub request_head: Duration,
    /// An HTTP/1.1 keep-alive connection waiting this long for its next request is closed; an
    /// HTTP/2 connection with no request in progress this long is closed (GOAWAY).
    #[serde(deserialize_with = "duration")]
    pub client_idle: Duration,
    /// While the client uploads its request body, the longest pause between two of its pieces;
    /// past it the client gets 408 and the request is the client's fault.
    #[serde(deserialize_with = "duration")]
    pub request_body: Duration,
    /// Once the response has started, the longest the upstream may send nothing; past it the
    /// client's response ends as an error and the request is `error` (Envoy's
    /// `stream_idle_timeout`). Real engines send a token every few ms to a few s, and an SSE
    /// comment or a token at least every minute even while a reasoning model thinks; five
    /// minutes is far beyond any of them and still frees a hung stream.
    #[serde(deserialize_with = "duration")]
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            response_head: Duration::from_secs(300),
            drain: Duration::from_secs(30),
            request_head: Duration::from_secs(30),
            client_idle: Duration::from_secs(75),
            request_body: Duration::from_secs(30),
            idle: Duration::from_secs(300),
        }
    }
}

/// One route: which requests it takes and the SLO it promises them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    #[serde(deserialize_with = "text")]
    pub name: String,
    #[serde(default, rename = "match")]
    pub matcher: Match,
    #[serde(default)]
    pub slo: Option<Slo>,
    /// Pins how responses on this route are read (`openai-chat`, `anthropic`, `tgi`, ...,
    /// `auto` to decide from the first payload, `unknown` to measure bytes only); without it
    /// the path, content type and first payload decide.
    #[serde(default, deserialize_with = "dialect")]
    pub dialect: Option<crate::parse::Dialect>,
}

struct DialectVisitor;

// Checked inside the visitor so that serde_yaml names the field and its line.
impl Visitor<'_> for DialectVisitor {
    type Value = crate::parse::Dialect;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a dialect name, like openai-chat or anthropic")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        bounded::check_length(v)?.parse().map_err(E::custom)
    }
}

fn dialect<'de, D: Deserializer<'de>>(d: D) -> Result<Option<crate::parse::Dialect>, D::Error> {
    d.deserialize_str(DialectVisitor).map(Some)
}

/// What a request must look like to take a route; every key given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    #[serde(default, deserialize_with = "optional_text")]
    pub path: Option<String>,
    #[serde(default, deserialize_with = "optional_text")]
    pub path_prefix: Option<String>,
    #[serde(default, deserialize_with = "methods")]
    pub methods: Option<Vec<String>>,
    #[serde(default, deserialize_with = "headers")]
    pub headers: Option<BTreeMap<String, HeaderMatch>>,
    /// A glob over the request's `model` (`*` and `?`).
    #[serde(default, deserialize_with = "optional_text")]
    pub model: Option<String>,
}

/// A header condition: an exact value, or `true` for "present with any value".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderMatch {
    Present(bool),
    Exact(String),
}

// Not `#[serde(untagged)]`: that buffers the whole value, whatever its shape, before trying
// each variant, so an alias bomb under a header would be expanded in full.
impl<'de> Deserialize<'de> for HeaderMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(HeaderMatchVisitor)
    }
}

struct HeaderMatchVisitor;

impl Visitor<'_> for HeaderMatchVisitor {
    type Value = HeaderMatch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a header value, or `true` for \"present\"")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<HeaderMatch, E> {
        Ok(HeaderMatch::Present(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<HeaderMatch, E> {
        bounded::check_length(v).map(|v| HeaderMatch::Exact(v.to_owned()))
    }
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Text.deserialize(d)
}

fn optional_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Optional(Text).deserialize(d)
}

fn routes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Route>, D::Error> {
    List {
        element: Plain::<Route>::new(),
        max: MAX_ROUTES,
        what: "routes",
    }
    .deserialize(d)
}

fn models<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Optional(List {
        element: Text,
        max: MAX_MODELS,
        what: "models",
    })
    .deserialize(d)
}

fn methods<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Optional(List {
        element: Text,
        max: MAX_METHODS,
        what: "methods",
    })
    .deserialize(d)
}

fn headers<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, HeaderMatch>>, D::Error> {
    let entries = Optional(Entries {
        key: Text,
        value: Plain::<HeaderMatch>::new(),
        max: MAX_HEADERS,
        what: "headers",
    })
    .deserialize(d)?;
    Ok(entries.map(|entries| entries.into_iter().collect()))
}

/// A route's promise to its users. Thresholds are inclusive (`≤`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    // A threshold of zero can never be met: every request would be bad.
    #[serde(default, deserialize_with = "opt_positive_duration")]
    pub ttft: Option<Duration>,
    #[serde(default, deserialize_with = "opt_positive_duration")]
    pub tpot: Option<Duration>,
    #[serde(default, deserialize_with = "opt_positive_duration")]
    pub e2e: Option<Duration>,
    #[serde(default, deserialize_with = "opt_positive_duration")]
    pub max_itl: Option<Duration>,
    /// The fraction of requests that must be good, in `0..=1`.
    #[serde(default, deserialize_with = "opt_ratio")]
    pub objective: Option<f64>,
}

/// A configuration that could not be used, with everything needed to fix it.
#[derive(Debug)]
pub struct ConfigError {
    /// The file it came from, or `<built-in>` / `<command line>`.
    pub origin: String,
    pub message: String,
}

// Whoever built the message, it prints as one short line quoting only excerpts.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration in {}: {}",
            one_line(&self.origin),
            one_line(&self.message)
        )
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads and checks a configuration file, within the limits of `read_file`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text = read_file(path).map_err(|e| ConfigError {
            origin: origin.clone(),
            message: format!("cannot read the file: {e}"),
        })?;
        Config::parse(&text, &origin)
    }

    /// Parses and checks configuration text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let error = |message: String| ConfigError {
            origin: origin.to_string(),
            message,
        };
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(error(format!(
                "{} bytes is larger than {} KiB, the limit for a configuration",
                text.len(),
                MAX_FILE_BYTES / 1024
            )));
        }
        // An empty file (or one holding only comments) means "all defaults".
        let config: Config = if text.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---"
        }) {
            Config::default()
        } else {
            nesting::check(text, MAX_NESTING).map_err(|at| {
                error(format!(
                    "nested deeper than {MAX_NESTING} levels at line {} column {}; a configuration needs at most 5",
                    at.line, at.column
                ))
            })?;
            serde_yaml::from_str::<Document>(text)
                .map_err(|e| error(e.to_string()))?
                .0
        };
        config.validate().map_err(error)?;
        Ok(config)
    }

    /// Checks what the schema alone cannot: relations between fields.
    fn validate(&self) -> Result<(), String> {
        // The section's values are checked as they are written; the environment is read when
        // the proxy starts.
        if self.otel.is_some() {
            otel::resolve(self.otel.as_ref(), &|_| None)?;
        }
        let mut seen = std::collections::HashSet::new();
        for (i, route) in self.routes.iter().enumerate() {
            let name = route.name.as_str();
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
            {
                return Err(format!(
                    "routes[{i}].name: `{}` must be non-empty and use only letters, digits, `_`, `-` and `.` (it becomes a metric label)",
                    excerpt(name)
                ));
            }
            if !seen.insert(name) {
                return Err(format!(
                    "routes[{i}].name: `{}` is used by an earlier route",
                    excerpt(name)
                ));
            }
            if name == DEFAULT_ROUTE && route.matcher != Match::default() {
                return Err(format!(
                    "routes[{i}].match: the route named `default` takes every request no other route matched; it cannot have a match"
                ));
            }
            if let Some(prefix) = &route.matcher.path_prefix {
                if !prefix.starts_with('/') {
                    return Err(format!(
                        "routes[{i}].match.path_prefix: `{}` must start with `/`",
                        excerpt(prefix)
                    ));
                }
            }
            if let Some(path) = &route.matcher.path {
                if !path.starts_with('/') {
                    return Err(format!(
                        "routes[{i}].match.path: `{}` must start with `/`",
                        excerpt(path)
                    ));
                }
            }
            for method in route.matcher.methods.iter().flatten() {
                if http::Method::from_bytes(method.as_bytes()).is_err() {
                    return Err(format!(
                        "routes[{i}].match.methods: `{}` is not an HTTP method",
                        excerpt(method)
                    ));
                }
            }
            for (header, _) in route.matcher.headers.iter().flatten() {
                if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                    return Err(format!(
                        "routes[{i}].match.headers: `{}` is not a header name",
                        excerpt(header)
                    ));
                }
            }
            if let Some(HeaderMatch::Present(false)) = route
                .matcher
                .headers
                .iter()
                .flatten()
                .map(|(_, m)| m)
                .find(|m| **m == HeaderMatch::Present(false))
            {
                return Err(format!(
                    "routes[{i}].match.headers: `false` is not a condition; use `true` for \"present\" or a string for an exact value"
                ));
            }
        }
        // Port 0 asks the system for a free port, so two of them never collide.
        if self.stream.max_event_bytes < 1024 {
            return Err(format!(
                "stream.max_event_bytes: {} is too small to hold one event; use at least 1024",
                self.stream.max_event_bytes
            ));
        }
        if self.model_label_limit > 1000 {
            return Err(format!(
                "model_label_limit: {} would let clients create too many series; keep it under 1000",
                self.model_label_limit
            ));
        }
        for (field, value) in [
            ("timeouts.request_head", self.timeouts.request_head),
            ("timeouts.client_idle", self.timeouts.client_idle),
            ("timeouts.request_body", self.timeouts.request_body),
            ("timeouts.idle", self.timeouts.idle),
        ] {
            if value.is_zero() {
                return Err(format!(
                    "{field}: 0s would end every connection or request at once; give a positive duration"
                ));
            }
        }
        if !(8 << 10..=1 << 20).contains(&self.limits.max_request_head_bytes) {
            return Err(format!(
                "limits.max_request_head_bytes: {} is outside 8192..1048576",
                self.limits.max_request_head_bytes
            ));
        }
        if self.limits.retry_body_bytes > 16 << 20 {
            return Err(format!(
                "limits.retry_body_bytes: {} would hold too much per request; keep it at most 16777216",
                self.limits.retry_body_bytes
            ));
        }
        if let Some(engine) = &self.engine_metrics {
            if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&engine.interval)
            {
                return Err(format!(
                    "engine_metrics.interval: {} is outside 100ms..1h",
                    humantime::format_duration(engine.interval)
                ));
            }
        }
        if self.limits.max_concurrent_streams == 0 {
            return Err(
                "limits.max_concurrent_streams: 0 would refuse every HTTP/2 request".to_string(),
            );
        }
        if self.listen == self.admin && self.listen.port() != 0 {
            return Err(format!(
                "admin: {} is also the listen address; the admin listener needs a port of its own",
                self.admin
            ));
        }
        Ok(())
    }
}

/// Parses a duration written with a unit: `300ms`, `2s`, `1m`, `1h30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let text = excerpt(text);
    if trimmed.bytes().all(|b| b.is_ascii_digit() || b == b'.') && !trimmed.is_empty() {
        return Err(format!(
            "`{text}` has no unit: write it like 300ms, 2s or 1m"
        ));
    }
    humantime::parse_duration(trimmed)
        .map_err(|e| format!("`{text}` is not a duration ({e}): write it like 300ms, 2s or 1m"))
}

/// Reads a duration; with `if_zero`, a zero duration is refused with that message. Checked
/// inside the visitor so that serde_yaml names the field and its line.
#[derive(Default)]
struct DurationVisitor {
    if_zero: Option<&'static str>,
}

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration with a unit, like 300ms, 2s or 1m")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        let duration = parse_duration(bounded::check_length(v)?).map_err(E::custom)?;
        match self.if_zero {
            Some(message) if duration.is_zero() => Err(E::custom(message)),
            _ => Ok(duration),
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "`{v}` has no unit: write it like 300ms, 2s or 1m"
        )))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "`{v}` has no unit: write it like 300ms, 2s or 1m"
        )))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "`{v}` has no unit: write it like 300ms, 2s or 1m"
        )))
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor::default())
}

fn positive_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor {
        if_zero: Some("0s would fail every request: give a positive duration, like 5s"),
    })
}

fn opt_positive_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    d.deserialize_any(DurationVisitor {
        if_zero: Some(
            "0s can never be met, so every request would be bad: give a positive duration, like 300ms",
        ),
    })
    .map(Some)
}

/// The whole file: a mapping of settings. Anything else is refused without quoting it, since
/// a file that is not a mapping is most likely not a configuration at all.
struct Document(Config);

impl<'de> Deserialize<'de> for Document {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DocumentVisitor)
    }
}

struct DocumentVisitor;

impl DocumentVisitor {
    fn not_a_mapping<E: de::Error>(holds: &str) -> E {
        E::custom(format!(
            "the file holds {holds}, not a mapping of settings like `listen: 0.0.0.0:8080`: is it a tokenmeter configuration?"
        ))
    }
}

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = Document;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping of settings")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Document, A::Error> {
        Config::deserialize(de::value::MapAccessDeserializer::new(map)).map(Document)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Document, E> {
        Err(Self::not_a_mapping("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Document, E> {
        Err(Self::not_a_mapping("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Document, E> {
        Err(Self::not_a_mapping("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Document, E> {
        Err(Self::not_a_mapping("a number"))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Document, E> {
        Err(Self::not_a_mapping("a string"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Document, E> {
        Err(Self::not_a_mapping("null"))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Document, A::Error> {
        Err(Self::not_a_mapping("a list"))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<Document, A::Error> {
        Err(Self::not_a_mapping("a tagged value"))
    }
}

/// A number checked as it is read: the check runs inside the visitor so that serde_yaml names
/// the field and its line.
struct CheckedNumber {
    expecting: &'static str,
    check: fn(f64) -> Result<f64, String>,
}

impl CheckedNumber {
    fn accept<E: de::Error>(&self, v: f64) -> Result<f64, E> {
        (self.check)(v).map_err(E::custom)
    }
}

impl Visitor<'_> for CheckedNumber {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        self.accept(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        self.accept(v as f64)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        self.accept(v as f64)
    }
}

fn opt_ratio<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    d.deserialize_any(CheckedNumber {
        expecting: "a ratio between 0 and 1, like 0.99",
        check: |v| {
            if (0.0..=1.0).contains(&v) {
                Ok(v)
            } else {
                Err(format!(
                    "{v} is outside 0..1: an objective is a fraction of requests, like 0.99"
                ))
            }
        },
    })
    .map(Some)
}

fn price<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    d.deserialize_any(CheckedNumber {
        expecting: "a positive amount per hour, like 2.50",
        check: |v| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(format!(
                    "{v} is not a price: give a positive amount per hour, like 2.50"
                ))
            }
        },
    })
}

struct CurrencyVisitor;

impl Visitor<'_> for CurrencyVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a currency code of three capital letters, like USD")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        if v.len() == 3 && v.bytes().all(|b| b.is_ascii_uppercase()) {
            Ok(v.to_string())
        } else {
            Err(E::custom(format!(
                "`{}` is not a currency code: write three capital letters, like USD or EUR",
                excerpt(v)
            )))
        }
    }
}

fn currency<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_str(CurrencyVisitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text, "t.yaml").unwrap_err().to_string()
    }

    #[test]
    fn empty_file_means_defaults() {
        assert_eq!(
            Config::parse("# nothing\n", "t.yaml").unwrap(),
            Config::default()
        );
        let d = Config::default();
        assert_eq!(d.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(d.admin.to_string(), "0.0.0.0:9464");
        assert_eq!(d.upstream.to_string(), "http://127.0.0.1:8000");
    }

    #[test]
    fn full_example_parses() {
        let c = Config::parse(
            r#"
listen: 127.0.0.1:18080
admin: 127.0.0.1:19464
upstream: http://vllm:8000/
access_log: {path: "-", format: csv}
timeouts: {connect: 2s, response_head: 1m, drain: 1m30s}
routes:
  - name: chat
    match: {path_prefix: /v1/chat/, methods: [POST], headers: {x-tier: gold, x-debug: true}, model: "llama-*"}
    slo: {ttft: 300ms, tpot: 40ms, e2e: 8s, max_itl: 1s, objective: 0.99}
  - name: batch
"#,
            "t.yaml",
        )
        .unwrap();
        assert_eq!(c.upstream.to_string(), "http://vllm:8000");
        assert_eq!(c.access_log.as_ref().unwrap().path, LogPath::Stdout);
        assert_eq!(c.access_log.as_ref().unwrap().format, LogFormat::Csv);
        assert_eq!(c.timeouts.drain, Duration::from_secs(90));
        let slo = c.routes[0].slo.unwrap();
        assert_eq!(slo.ttft, Some(Duration::from_millis(300)));
        assert_eq!(slo.objective, Some(0.99));
        let headers = c.routes[0].matcher.headers.as_ref().unwrap();
        assert_eq!(headers["x-tier"], HeaderMatch::Exact("gold".into()));
        assert_eq!(headers["x-debug"], HeaderMatch::Present(true));
        assert_eq!(c.routes[1].slo, None);
    }

    #[test]
    fn errors_name_file_field_line_and_problem() {
        let e = err("routes:\n  - name: a\n    slo:\n      tft: 3s\n");
        assert!(
            e.contains("t.yaml")
                && e.contains("routes[0].slo")
                && e.contains("unknown field `tft`")
                && e.contains("line 4"),
            "{e}"
        );

        let e = err("timeouts:\n  connect: 300\n");
        assert!(
            e.contains("timeouts.connect") && e.contains("no unit") && e.contains("line 2"),
            "{e}"
        );

        let e = err("timeouts:\n  drain: soon\n");
        assert!(
            e.contains("timeouts.drain") && e.contains("`soon` is not a duration"),
            "{e}"
        );

        let e = err("listen: localhost\n");
        assert!(e.contains("listen") && e.contains("socket address"), "{e}");

        let e = err("routes:\n  - name: a\n    slo: {objective: 1.5}\n");
        assert!(
            e.contains("routes[0].slo.objective") && e.contains("outside 0..1"),
            "{e}"
        );

        let e = err("upstream: https://x:1\n");
        assert!(e.contains("upstream") && e.contains("only http://"), "{e}");

        let e = err("listen: [\n");
        assert!(e.contains("t.yaml"), "{e}");

        let e = err("lisen: 0.0.0.0:1\n");
        assert!(e.contains("unknown field `lisen`"), "{e}");
    }

    #[test]
    fn relations_between_fields_are_checked() {
        let e = err("routes:\n  - name: a\n  - name: a\n");
        assert!(
            e.contains("routes[1].name") && e.contains("earlier route"),
            "{e}"
        );
        let e = err("routes:\n  - name: a b\n");
        assert!(e.contains("routes[0].name"), "{e}");
        let e = err("routes:\n  - name: a\n    match: {path_prefix: v1}\n");
        assert!(e.contains("routes[0].match.path_prefix"), "{e}");
        let e = err("listen: 127.0.0.1:1\nadmin: 127.0.0.1:1\n");
        assert!(e.contains("admin"), "{e}");
        assert!(Config::parse("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n", "t.yaml").is_ok());
        let e = err("routes:\n  - name: a\n    dialect: openai\n");
        assert!(
            e.contains("routes[0].dialect") && e.contains("unknown dialect `openai`"),
            "{e}"
        );
        let c = Config::parse("routes:\n  - name: a\n    dialect: tgi\n", "t.yaml").unwrap();
        assert_eq!(c.routes[0].dialect, Some(crate::parse::Dialect::Tgi));
        let e = err("routes:\n  - name: a\n    match: {methods: [\"GE T\"]}\n");
        assert!(e.contains("routes[0].match.methods"), "{e}");
    }

    #[test]
    fn cost_is_a_positive_price_in_a_currency() {
        let c = Config::parse("cost: {per_hour: 2.50, currency: USD}\n", "t.yaml").unwrap();
        assert_eq!(
            c.cost,
            Some(Cost {
                per_hour: 2.5,
                currency: "USD".into()
            })
        );
        assert_eq!(
            Config::parse("cost: {per_hour: 3, currency: EUR}\n", "t.yaml")
                .unwrap()
                .cost
                .map(|c| c.per_hour),
            Some(3.0)
        );
        assert_eq!(Config::default().cost, None);
        for (text, field, problem) in [
            (
                "cost:\n  per_hour: 0\n  currency: USD\n",
                "cost.per_hour",
                "not a price",
            ),
            (
                "cost:\n  per_hour: -1.5\n  currency: USD\n",
                "cost.per_hour",
                "not a price",
            ),
            (
                "cost:\n  per_hour: .inf\n  currency: USD\n",
                "cost.per_hour",
                "not a price",
            ),
            (
                "cost:\n  per_hour: .nan\n  currency: USD\n",
                "cost.per_hour",
                "not a price",
            ),
            (
                "cost:\n  per_hour: 2\n  currency: usd\n",
                "cost.currency",
                "not a currency",
            ),
            (
                "cost:\n  per_hour: 2\n  currency: DOLLAR\n",
                "cost.currency",
                "not a currency",
            ),
            (
                "cost:\n  per_hour: 2\n  currency: USD\n  per_day: 3\n",
                "cost",
                "unknown field `per_day`",
            ),
            ("cost:\n  per_hour: 2\n", "cost", "missing field `currency`"),
        ] {
            let e = err(text);
            assert!(
                e.contains("t.yaml")
                    && e.contains(field)
                    && e.contains(problem)
                    && e.contains("line "),
                "{text:?} gave {e}"
            );
        }
    }

    #[test]
    fn missing_file_is_named() {
        let e = Config::load(Path::new("/nonexistent/tm.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/nonexistent/tm.yaml") && e.contains("cannot read"),
            "{e}"
        );
    }
}
