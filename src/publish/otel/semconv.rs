//! Every name tokenmeter exports over OTLP, in one place: the GenAI semantic conventions it
//! follows (pinned to [`VERSION`]) and its own `tokenmeter.` names for what they lack.
//!
//! The GenAI conventions are still in development ("Development" stability): they left the
//! core repository after v1.41.0 for `semantic-conventions-genai`. The constants of
//! `opentelemetry-semantic-conventions` for them are deprecated, so they are written here, and a
//! change of the conventions is a change of this file (and of `docs/opentelemetry.md`).

/// The schema URL of the semantic-conventions release these names follow (v1.41.0), set on
/// every batch and scope.
pub(crate) const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.41.0";

// Metrics of the GenAI conventions.
pub(crate) const TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
pub(crate) const TIME_PER_OUTPUT_TOKEN: &str = "gen_ai.server.time_per_output_token";
pub(crate) const REQUEST_DURATION: &str = "gen_ai.server.request.duration";
pub(crate) const TOKEN_USAGE: &str = "gen_ai.client.token.usage";

// tokenmeter's own metrics: what the conventions have no name for.
pub(crate) const MAX_INTER_TOKEN_LATENCY: &str = "tokenmeter.request.max_inter_token_latency";
pub(crate) const REQUESTS: &str = "tokenmeter.requests";
pub(crate) const SLO_REQUESTS: &str = "tokenmeter.slo.requests";
pub(crate) const SLO_VIOLATIONS: &str = "tokenmeter.slo.violations";
pub(crate) const GOODPUT_OUTPUT_TOKENS: &str = "tokenmeter.goodput.output_tokens";

// Units (UCUM, as the conventions write them).
pub(crate) const SECONDS: &str = "s";
pub(crate) const TOKENS: &str = "{token}";
pub(crate) const REQUESTS_UNIT: &str = "{request}";

// Attributes of the conventions.
pub(crate) const OPERATION_NAME: &str = "gen_ai.operation.name";
pub(crate) const PROVIDER_NAME: &str = "gen_ai.provider.name";
pub(crate) const REQUEST_MODEL: &str = "gen_ai.request.model";
pub(crate) const RESPONSE_MODEL: &str = "gen_ai.response.model";
pub(crate) const REQUEST_STREAM: &str = "gen_ai.request.stream";
pub(crate) const TOKEN_TYPE: &str = "gen_ai.token.type";
pub(crate) const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub(crate) const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub(crate) const USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
pub(crate) const USAGE_REASONING_OUTPUT_TOKENS: &str = "gen_ai.usage.reasoning.output_tokens";
pub(crate) const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
pub(crate) const RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
pub(crate) const ERROR_TYPE: &str = "error.type";
pub(crate) const SERVER_ADDRESS: &str = "server.address";
pub(crate) const SERVER_PORT: &str = "server.port";
pub(crate) const HTTP_REQUEST_METHOD: &str = "http.request.method";
pub(crate) const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
pub(crate) const URL_PATH: &str = "url.path";

// tokenmeter's own attributes.
pub(crate) const ROUTE: &str = "tokenmeter.route";
pub(crate) const OUTCOME: &str = "tokenmeter.outcome";
pub(crate) const FINISH_REASON: &str = "tokenmeter.finish_reason";
pub(crate) const SLO_VERDICT: &str = "tokenmeter.slo.verdict";
pub(crate) const SLO_CRITERION: &str = "tokenmeter.slo.criterion";
pub(crate) const SLO_VIOLATED: &str = "tokenmeter.slo.violated";
pub(crate) const REQUEST_ID: &str = "tokenmeter.request_id";
pub(crate) const REASON: &str = "tokenmeter.reason";
pub(crate) const TTFT: &str = "tokenmeter.ttft";
pub(crate) const TPOT: &str = "tokenmeter.tpot";
pub(crate) const MAX_ITL: &str = "tokenmeter.max_itl";
pub(crate) const E2E: &str = "tokenmeter.e2e";
pub(crate) const QUEUE: &str = "tokenmeter.queue";
pub(crate) const QUEUE_SOURCE: &str = "tokenmeter.queue.source";
pub(crate) const ENGINE_PREFILL: &str = "tokenmeter.engine.prefill";
pub(crate) const ENGINE_DECODE: &str = "tokenmeter.engine.decode";
pub(crate) const IN_FLIGHT: &str = "tokenmeter.in_flight";
pub(crate) const IN_FLIGHT_TOTAL: &str = "tokenmeter.in_flight_total";
pub(crate) const ENGINE_WAITING: &str = "tokenmeter.engine.waiting";
pub(crate) const ENGINE_KV_USAGE: &str = "tokenmeter.engine.kv_usage";

/// The span event at the first token.
pub(crate) const FIRST_TOKEN_EVENT: &str = "tokenmeter.first_token";

// The conventions' advised explicit boundaries, for `explicit_bucket_histogram`.
pub(crate) const DURATION_BOUNDS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
pub(crate) const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
pub(crate) const TPOT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
pub(crate) const TOKEN_BOUNDS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
