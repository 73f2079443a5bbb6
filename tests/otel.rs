//! OpenTelemetry export, end to end, against a receiver of the tests' own that decodes OTLP/HTTP
//! with the official protobuf definitions (`opentelemetry-proto`). What must never happen: a
//! metric or span that disagrees with the request's record, a span outside its caller's trace,
//! a violating or failed request's span sampled away, or a collector that is down, refusing or
//! hanging costing a client anything or the proxy unbounded memory.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, Metric};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;
use tokio::time::Instant;

use common::*;
use tokenmeter::{Config, Otel};

/// What the receiver answers: a status, or (0) nothing at all, ever.
const HANG: u16 = 0;

/// A collector of the tests' own: keeps every request it decodes and answers `status`.
#[derive(Clone, Default)]
struct Receiver {
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    spans: Arc<Mutex<Vec<Span>>>,
    status: Arc<AtomicU16>,
    /// Each body's `content-encoding` (empty for none).
    encodings: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start(status: u16) -> (Receiver, SocketAddr) {
        Receiver::start_with(status, None).await
    }

    /// Over TLS when `tls` is given: a connection whose handshake fails is dropped.
    async fn start_with(
        status: u16,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> (Receiver, SocketAddr) {
        let receiver = Receiver::default();
        receiver.status.store(status, Ordering::Relaxed);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let r = receiver.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let r = r.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let r = r.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let header = |name: &str| {
                                req.headers()
                                    .get(name)
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_owned)
                            };
                            let content_type = header("content-type");
                            let encoding = header("content-encoding").unwrap_or_default();
                            let body = req.into_body().collect().await?.to_bytes();
                            let body = if encoding == "gzip" {
                                gunzip(&body)
                            } else {
                                body
                            };
                            r.encodings.lock().unwrap().push(encoding);
                            assert_eq!(content_type.as_deref(), Some("application/x-protobuf"));
                            let status = r.status.load(Ordering::Relaxed);
                            if status == HANG {
                                std::future::pending::<()>().await;
                            }
                            if status == 200 {
                                match path.as_str() {
                                    "/v1/metrics" => r.keep_metrics(body),
                                    "/v1/traces" => r.keep_traces(body),
                                    other => panic!("unexpected path {other}"),
                                }
                            }
                            Ok::<_, hyper::Error>(
                                http::Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                    match tls {
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        (receiver, addr)
    }

    /// Keeps a decoded metrics export, whole.
    fn keep_metrics(&self, message: Bytes) {
        let export = ExportMetricsServiceRequest::decode(message).expect("OTLP metrics");
        self.metrics.lock().unwrap().push(export);
    }

    /// Keeps the spans of a decoded trace export.
    fn keep_traces(&self, message: Bytes) {
        let export = ExportTraceServiceRequest::decode(message).expect("OTLP traces");
        let mut spans = self.spans.lock().unwrap();
        for rs in export.resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The metric `name` of the latest export (cumulative: it holds everything so far).
    fn latest(&self, name: &str) -> Option<Metric> {
        let exports = self.metrics.lock().unwrap();
        let last = exports.last()?;
        last.resource_metrics
            .iter()
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .find(|m| m.name == name)
            .cloned()
    }
}

/// Export switched on through the `otel:` section, fast enough for a test.
fn otel_to(addr: SocketAddr, more: impl FnOnce(&mut Otel)) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        let mut otel = Otel {
            endpoint: Some(format!("http://{addr}")),
            metric_export_interval: Some(Duration::from_millis(100)),
            bsp_schedule_delay: Some(Duration::from_millis(50)),
            ..Default::default()
        };
        more(&mut otel);
        c.otel = Some(otel);
    }
}

/// The model the upstream's responses name: not the request's own (`llama-3`), as a server
/// that resolves an alias answers.
const SERVED_MODEL: &str = "llama-3-8b-instruct";

fn stream_script() -> Script {
    Script::stream(
        "text/event-stream",
        vec![
            Bytes::from(format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"{SERVED_MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"finish_reason\":null}}]}}\n\n"
            )),
            chat_chunk("Hello"),
            chat_chunk(" world"),
            finish_chunk("stop", Some(3)),
            done(),
        ],
    )
}

/// One streamed chat request through `proxy`: whatever the collector does, the client gets it
/// whole (200, every byte up to `[DONE]`, no body error).
async fn chat(proxy: &TestProxy, model: &str) {
    let r = send(
        &proxy.url("/v1/chat/completions"),
        "POST",
        &chat_request(model),
        &[("content-type", "application/json")],
        false,
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body_error.is_none());
    assert!(String::from_utf8_lossy(&r.bytes()).ends_with("data: [DONE]\n\n"));
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attr(attributes, key)? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn number(attributes: &[KeyValue], key: &str) -> Option<f64> {
    match attr(attributes, key)? {
        any_value::Value::IntValue(n) => Some(*n as f64),
        any_value::Value::DoubleValue(x) => Some(*x),
        _ => None,
    }
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of a `/metrics` series whose line starts with `prefix`, or 0.
fn series(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_spans_agree_with_the_records_and_spans_sit_in_the_callers_trace() {
    let mut upstream = upstream(|_| stream_script()).await;
    let (receiver, addr) = Receiver::start(200).await;
    let proxy = proxy(upstream.addr, otel_to(addr, |_| {})).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{parent}-01");
    for i in 0..3 {
        let mut headers = vec![("content-type", "application/json")];
        if i == 0 {
            headers.push(("traceparent", &traceparent));
            headers.push(("tracestate", "vendor=abc"));
        }
        let r = send(
            &proxy.url("/v1/chat/completions"),
            "POST",
            &chat_request("llama-3"),
            &headers,
            false,
        )
        .await;
        assert_eq!(r.status, 200);
        assert!(r.body_error.is_none());
    }
    let records = proxy.records(3).await;
    // The model server received the caller's trace context unchanged.
    let first = upstream.seen.recv().await.expect("the first request");
    assert_eq!(
        first.header("traceparent").as_deref(),
        Some(traceparent.as_str())
    );
    assert_eq!(first.header("tracestate").as_deref(), Some("vendor=abc"));

    until("three spans", || receiver.spans().len() == 3).await;
    let spans = receiver.spans();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let child: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .collect();
    assert_eq!(child.len(), 1, "one span in the caller's trace");
    assert_eq!(hex(&child[0].parent_span_id), parent);
    assert_eq!(child[0].trace_state, "vendor=abc");
    for s in spans.iter().filter(|s| hex(&s.trace_id) != trace_id) {
        assert!(
            s.parent_span_id.is_empty(),
            "a span without a caller is a root"
        );
    }
    for span in &spans {
        assert_eq!(span.name, "chat llama-3");
        let a = &span.attributes;
        let record = records
            .iter()
            .find(|r| {
                close(
                    r["ttft_ms"].as_f64().unwrap() / 1e3,
                    number(a, "tokenmeter.ttft").unwrap(),
                )
            })
            .expect("a record with the span's TTFT");
        assert_eq!(text(a, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(text(a, "gen_ai.provider.name").as_deref(), Some("openai"));
        assert_eq!(text(a, "gen_ai.request.model").as_deref(), Some("llama-3"));
        assert_eq!(
            text(a, "gen_ai.response.model").as_deref(),
            Some(SERVED_MODEL)
        );
        assert_eq!(
            number(a, "gen_ai.usage.output_tokens"),
            record["output_tokens"].as_f64()
        );
        assert_eq!(
            number(a, "gen_ai.usage.input_tokens"),
            record["prompt_tokens"].as_f64()
        );
        assert_eq!(
            number(a, "server.port"),
            Some(f64::from(upstream.addr.port()))
        );
        assert_eq!(text(a, "tokenmeter.outcome").as_deref(), Some("ok"));
        assert!(matches!(
            attr(a, "gen_ai.request.stream"),
            Some(any_value::Value::BoolValue(true))
        ));
        assert!(close(
            number(a, "tokenmeter.tpot").unwrap(),
            record["tpot_ms"].as_f64().unwrap() / 1e3
        ));
        let duration = (span.end_time_unix_nano - span.start_time_unix_nano) as f64 / 1e6;
        assert!((duration - record["e2e_ms"].as_f64().unwrap()).abs() < 0.01);
        assert_eq!(span.events.len(), 1, "an event at the first token");
        let first = (span.events[0].time_unix_nano - span.start_time_unix_nano) as f64 / 1e6;
        assert!((first - record["ttft_ms"].as_f64().unwrap()).abs() < 0.01);
    }

    // Metrics: cumulative, so the latest export holds all three requests.
    until("TTFT of three requests", || {
        receiver
            .latest("gen_ai.server.time_to_first_token")
            .is_some_and(|m| match m.data {
                Some(metric::Data::ExponentialHistogram(h)) => {
                    h.data_points.iter().map(|p| p.count).sum::<u64>() == 3
                }
                _ => false,
            })
    })
    .await;
    let sum_of = |field: &str| -> f64 {
        records
            .iter()
            .map(|r| r[field].as_f64().unwrap() / 1e3)
            .sum()
    };
    for (name, unit, field) in [
        ("gen_ai.server.time_to_first_token", "s", Some("ttft_ms")),
        ("gen_ai.server.time_per_output_token", "s", Some("tpot_ms")),
        ("gen_ai.server.request.duration", "s", Some("e2e_ms")),
        (
            "tokenmeter.request.max_inter_token_latency",
            "s",
            Some("max_itl_ms"),
        ),
        ("gen_ai.client.token.usage", "{token}", None),
    ] {
        let m = receiver
            .latest(name)
            .unwrap_or_else(|| panic!("{name} exported"));
        assert_eq!(m.unit, unit, "{name}");
        let Some(metric::Data::ExponentialHistogram(h)) = m.data else {
            panic!("{name} is an exponential histogram");
        };
        for p in &h.data_points {
            let a = &p.attributes;
            assert_eq!(text(a, "gen_ai.operation.name").as_deref(), Some("chat"));
            assert_eq!(text(a, "gen_ai.provider.name").as_deref(), Some("openai"));
            assert_eq!(text(a, "gen_ai.request.model").as_deref(), Some("llama-3"));
            assert_eq!(
                text(a, "gen_ai.response.model").as_deref(),
                Some(SERVED_MODEL)
            );
            assert_eq!(text(a, "server.address").as_deref(), Some("127.0.0.1"));
            assert_eq!(text(a, "tokenmeter.route").as_deref(), Some("default"));
            assert!(attr(a, "error.type").is_none());
            let buckets: u64 = p
                .positive
                .as_ref()
                .map_or(0, |b| b.bucket_counts.iter().sum());
            assert_eq!(
                buckets + p.zero_count,
                p.count,
                "{name}: buckets hold every value"
            );
        }
        if let Some(field) = field {
            assert_eq!(h.data_points.len(), 1, "{name}");
            let p = &h.data_points[0];
            assert_eq!(p.count, 3, "{name}");
            assert!(
                close(p.sum.unwrap(), sum_of(field)),
                "{name}: {:?} vs {}",
                p.sum,
                sum_of(field)
            );
        } else {
            let by_type: HashMap<String, (u64, f64)> = h
                .data_points
                .iter()
                .map(|p| {
                    (
                        text(&p.attributes, "gen_ai.token.type").unwrap(),
                        (p.count, p.sum.unwrap()),
                    )
                })
                .collect();
            let tokens = |f: &str| records.iter().map(|r| r[f].as_f64().unwrap()).sum::<f64>();
            assert_eq!(by_type["input"], (3, tokens("prompt_tokens")));
            assert_eq!(by_type["output"], (3, tokens("output_tokens")));
        }
    }
    let requests = receiver.latest("tokenmeter.requests").expect("requests");
    let Some(metric::Data::Sum(sum)) = requests.data else {
        panic!("a sum")
    };
    assert!(sum.is_monotonic);
    let p = &sum.data_points[0];
    assert_eq!(
        text(&p.attributes, "tokenmeter.outcome").as_deref(),
        Some("ok")
    );
    assert_eq!(
        text(&p.attributes, "tokenmeter.finish_reason").as_deref(),
        Some("stop")
    );
    let exports = receiver.metrics.lock().unwrap().clone();
    let rm = &exports.last().unwrap().resource_metrics[0];
    assert_eq!(rm.schema_url, "https://opentelemetry.io/schemas/1.41.0");
    let resource = &rm.resource.as_ref().unwrap().attributes;
    assert_eq!(
        text(resource, "service.name").as_deref(),
        Some("tokenmeter")
    );
    let text = proxy.metrics();
    assert_eq!(series(&text, "tokenmeter_otel_dropped_total"), 0.0);
    assert!(series(&text, "tokenmeter_otel_spans_exported_total") >= 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn violating_and_failed_requests_are_kept_under_a_zero_ratio() {
    // Each request's model says how it goes: `fast` well, `slow` past its TTFT SLO, `broken` 500.
    let upstream = upstream(|seen: &Seen| {
        let body = String::from_utf8_lossy(&seen.body);
        if body.contains("broken") {
            Script::json(500, r#"{"error":"boom"}"#)
        } else if body.contains("slow") {
            let mut s = stream_script();
            s.steps.insert(0, Step::Wait(Duration::from_millis(300)));
            s
        } else {
            stream_script()
        }
    })
    .await;
    let (receiver, addr) = Receiver::start(200).await;
    let proxy = proxy(upstream.addr, |c| {
        c.routes = routes("routes:\n  - name: chat\n    slo: {ttft: 150ms}\n");
        otel_to(addr, |o| {
            o.traces_sampler = Some("traceidratio".into());
            o.traces_sampler_arg = Some(0.0);
        })(c)
    })
    .await;
    for model in ["fast", "slow", "fast", "broken", "fast"] {
        send(
            &proxy.url("/v1/chat/completions"),
            "POST",
            &chat_request(model),
            &[("content-type", "application/json")],
            false,
        )
        .await;
    }
    proxy.records(5).await;
    // Every request reached the exporter (the latest cumulative export counts five) and no
    // span waits for export: what arrived is all that will.
    until("five requests exported and no span queued", || {
        let counted = receiver.latest("tokenmeter.requests").is_some_and(|m| match m.data {
            Some(metric::Data::Sum(s)) => s
                .data_points
                .iter()
                .map(|p| match p.value {
                    Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(n)) => n,
                    _ => 0,
                })
                .sum::<i64>()
                == 5,
            _ => false,
        });
        counted && series(&proxy.metrics(), "tokenmeter_otel_queued{queue=\"spans\"}") == 0.0
    })
    .await;
    until("two spans", || receiver.spans().len() >= 2).await;
    let spans = receiver.spans();
    let mut models: Vec<String> = spans
        .iter()
        .map(|s| text(&s.attributes, "gen_ai.request.model").unwrap())
        .collect();
    models.sort();
    assert_eq!(models, ["broken", "slow"]);
    let slow = spans.iter().find(|s| s.name == "chat slow").unwrap();
    assert_eq!(
        text(&slow.attributes, "tokenmeter.slo.verdict").as_deref(),
        Some("violated")
    );
    let broken = spans.iter().find(|s| s.name == "chat broken").unwrap();
    assert_eq!(
        text(&broken.attributes, "error.type").as_deref(),
        Some("500")
    );
    assert_eq!(broken.status.as_ref().unwrap().code, 2, "status error");
    // The failure has error.type on the duration histogram.
    let duration = receiver.latest("gen_ai.server.request.duration").unwrap();
    let Some(metric::Data::ExponentialHistogram(h)) = duration.data else {
        panic!()
    };
    assert!(h
        .data_points
        .iter()
        .any(|p| text(&p.attributes, "error.type").as_deref() == Some("500")));
    let violations = receiver
        .latest("tokenmeter.slo.violations")
        .expect("violations");
    let Some(metric::Data::Sum(s)) = violations.data else {
        panic!()
    };
    // The slow request failed its TTFT, the broken one the error criterion; data points come in
    // no set order.
    let mut criteria: Vec<String> = s
        .data_points
        .iter()
        .filter_map(|p| text(&p.attributes, "tokenmeter.slo.criterion"))
        .collect();
    criteria.sort();
    assert_eq!(criteria, ["error", "ttft"]);
}

/// A collector that refuses (503), is down, or never answers: every client's response whole,
/// what is lost counted, and the spans held never above the queue's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_refusing_down_or_hanging_costs_clients_nothing_and_holds_bounded_memory() {
    let (_refusing, refusing) = Receiver::start(503).await;
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (_hanging, hanging) = Receiver::start(HANG).await;
    for collector in [refusing, down, hanging] {
        let upstream = upstream(|_| stream_script()).await;
        let proxy = proxy(
            upstream.addr,
            otel_to(collector, |o| {
                o.bsp_max_queue_size = Some(4);
                o.bsp_max_export_batch_size = Some(2);
                o.timeout = Some(Duration::from_millis(300));
            }),
        )
        .await;
        let mut max_queued = 0.0f64;
        for _ in 0..30 {
            chat(&proxy, "m").await;
            max_queued = max_queued.max(series(
                &proxy.metrics(),
                "tokenmeter_otel_queued{queue=\"spans\"}",
            ));
        }
        proxy.records(30).await;
        until("spans dropped and export errors counted", || {
            let text = proxy.metrics();
            series(&text, "tokenmeter_otel_dropped_total{signal=\"traces\"}") > 0.0
                && series(
                    &text,
                    "tokenmeter_otel_export_errors_total{signal=\"traces\"}",
                ) > 0.0
                && series(
                    &text,
                    "tokenmeter_otel_export_errors_total{signal=\"metrics\"}",
                ) > 0.0
        })
        .await;
        assert!(max_queued <= 4.0, "{collector}: {max_queued} spans held");
        let text = proxy.metrics();
        assert!(series(&text, "tokenmeter_otel_queued{queue=\"spans\"}") <= 4.0);
        assert_eq!(series(&text, "tokenmeter_otel_spans_exported_total"), 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_queued_at_shutdown_is_exported_before_exit() {
    let upstream = upstream(|_| stream_script()).await;
    let (receiver, addr) = Receiver::start(200).await;
    // Nothing would go out on its own for a minute.
    let proxy = proxy(
        upstream.addr,
        otel_to(addr, |o| {
            o.metric_export_interval = Some(Duration::from_secs(60));
            o.bsp_schedule_delay = Some(Duration::from_secs(60));
        }),
    )
    .await;
    for _ in 0..2 {
        chat(&proxy, "m").await;
    }
    proxy.records(2).await;
    assert!(receiver.spans().is_empty());
    let started = Instant::now();
    proxy.running.shutdown();
    proxy.running.wait().await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(receiver.spans().len(), 2);
    assert!(receiver.latest("gen_ai.server.request.duration").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_otel_nothing_is_started_or_published() {
    let upstream = upstream(|_| stream_script()).await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    chat(&proxy, "m").await;
    proxy.records(1).await;
    assert!(!proxy.metrics().contains("tokenmeter_otel"));
}

#[test]
fn a_bad_otel_section_names_its_field() {
    let err = Config::parse(
        "otel:\n  endpoint: http://c:4318\n  traces_sampler: sometimes\n",
        "c.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("c.yaml") && err.contains("otel.traces_sampler"),
        "{err}"
    );
    let err = Config::parse("otel:\n  endpont: http://c:4318\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown field `endpont`") && err.contains("line 2"),
        "{err}"
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA, as
/// PEM files in `dir`; and a TLS acceptor that requires a client certificate from that CA.
fn mutual_tls(dir: &std::path::Path) -> (tokio_rustls::TlsAcceptor, [std::path::PathBuf; 3]) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        (cert, key)
    };
    let (server, server_key) = leaf(vec!["127.0.0.1".into()]);
    let (client, client_key) = leaf(vec!["tokenmeter".into()]);
    let paths = [
        dir.join("ca.pem"),
        dir.join("client.pem"),
        dir.join("client.key"),
    ];
    std::fs::write(&paths[0], ca.pem()).unwrap();
    std::fs::write(&paths[1], client.pem()).unwrap();
    std::fs::write(&paths[2], client_key.serialize_pem()).unwrap();
    #[allow(deprecated)] // ring, as tokenmeter's own client uses
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![server.der().clone()], key)
        .unwrap();
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), paths)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_mutual_tls_and_gzip_reaches_the_collector_and_a_wrong_setup_costs_clients_nothing(
) {
    let dir = TempDir::new();
    let (acceptor, [ca, client_cert, client_key]) = mutual_tls(dir.path());
    let upstream = upstream(|_| stream_script()).await;
    let (receiver, addr) = Receiver::start_with(200, Some(acceptor)).await;
    let https = |client: bool| {
        let (ca, client_cert, client_key) = (ca.clone(), client_cert.clone(), client_key.clone());
        move |c: &mut Config| {
            otel_to(addr, |o| {
                o.endpoint = Some(format!("https://{addr}"));
                o.compression = Some("gzip".into());
                o.certificate = Some(ca.display().to_string());
                if client {
                    o.client_certificate = Some(client_cert.display().to_string());
                    o.client_key = Some(client_key.display().to_string());
                }
            })(c)
        }
    };
    let sending = proxy(upstream.addr, https(true)).await;
    for _ in 0..2 {
        chat(&sending, "llama-3").await;
    }
    until("two spans over https", || receiver.spans().len() == 2).await;
    until("metrics over https", || {
        receiver.latest("gen_ai.server.request.duration").is_some()
    })
    .await;
    let encodings = receiver.encodings.lock().unwrap().clone();
    assert!(!encodings.is_empty());
    assert!(encodings.iter().all(|e| e == "gzip"), "{encodings:?}");
    assert_eq!(
        series(&sending.metrics(), "tokenmeter_otel_export_errors_total"),
        0.0
    );

    // Without the client certificate the collector refuses the handshake: every export fails
    // and is counted, every request is whole.
    let spans_before = receiver.spans().len();
    let refused = proxy(upstream.addr, https(false)).await;
    for _ in 0..2 {
        chat(&refused, "llama-3").await;
    }
    until("failed exports counted", || {
        series(&refused.metrics(), "tokenmeter_otel_export_errors_total") >= 2.0
    })
    .await;
    assert_eq!(receiver.spans().len(), spans_before);

    // A TLS file that cannot be used stops the start, naming the setting and the file.
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: "127.0.0.1:0".parse().unwrap(),
        upstream: tokenmeter::Upstream::parse(&format!("http://{}", upstream.addr)).unwrap(),
        ..Config::default()
    };
    otel_to(addr, |o| {
        o.endpoint = Some(format!("https://{addr}"));
        o.certificate = Some(dir.path().join("missing.pem").display().to_string());
    })(&mut config);
    let err = tokenmeter::start(config, None, Default::default())
        .await
        .err()
        .expect("a missing CA file stops the start")
        .to_string();
    assert!(
        err.contains("otel.certificate") && err.contains("missing.pem"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}

/// A gzip member's content (`Content-Encoding: gzip` bodies, compressed gRPC messages).
fn gunzip(compressed: &[u8]) -> Bytes {
    use std::io::Read as _;
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(compressed)
        .read_to_end(&mut plain)
        .expect("gzip data");
    Bytes::from(plain)
}

/// An OTLP/gRPC collector of the tests' own (HTTP/2, over TLS with ALPN `h2` when `tls` is
/// given): unframes each message (gunzipping a compressed one), keeps what it decodes when it
/// answers `grpc-status` 0, and answers `code` in the trailers.
async fn grpc_receiver(
    code: &'static str,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (Receiver, SocketAddr) {
    let receiver = Receiver::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = receiver.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (r, tls) = (r.clone(), tls.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let r = r.clone();
                    async move {
                        assert_eq!(req.version(), http::Version::HTTP_2);
                        let header = |name: &str| {
                            req.headers()
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned)
                                .unwrap_or_default()
                        };
                        assert_eq!(header("content-type"), "application/grpc");
                        assert_eq!(header("te"), "trailers");
                        let encoding = header("grpc-encoding");
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await?.to_bytes();
                        let (flag, len) =
                            (body[0], u32::from_be_bytes(body[1..5].try_into().unwrap()));
                        assert_eq!(len as usize, body.len() - 5, "one whole frame");
                        let message = if flag == 1 {
                            assert_eq!(encoding, "gzip");
                            gunzip(&body[5..])
                        } else {
                            body.slice(5..)
                        };
                        r.encodings.lock().unwrap().push(encoding);
                        if code == "0" {
                            match path.as_str() {
                                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export" => {
                                    r.keep_metrics(message)
                                }
                                "/opentelemetry.proto.collector.trace.v1.TraceService/Export" => {
                                    r.keep_traces(message)
                                }
                                other => panic!("unexpected method {other}"),
                            }
                        }
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static(code));
                        if code != "0" {
                            trailers.insert("grpc-message", http::HeaderValue::from_static("busy"));
                        }
                        // An empty Export*ServiceResponse, in one frame.
                        let body = Full::new(Bytes::from_static(&[0, 0, 0, 0, 0]))
                            .with_trailers(async move { Some(Ok(trailers)) });
                        Ok::<_, hyper::Error>(
                            http::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
                let http2 =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                match tls {
                    None => {
                        let _ = http2.serve_connection(TokioIo::new(stream), service).await;
                    }
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            let _ = http2.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                }
            });
        }
    });
    (receiver, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_h2c_and_tls_reaches_the_collector_and_a_refusing_one_is_counted() {
    let upstream = upstream(|_| stream_script()).await;
    let dir = TempDir::new();
    let (acceptor, [ca, client_cert, client_key]) = mutual_tls(dir.path());
    // The same acceptor, offering h2 by ALPN as a gRPC server does.
    let acceptor = {
        let mut config = (**acceptor.config()).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    };
    let (plain, plain_addr) = grpc_receiver("0", None).await;
    let (secure, secure_addr) = grpc_receiver("0", Some(acceptor)).await;
    let (refusing, refusing_addr) = grpc_receiver("14", None).await;
    let grpc = |endpoint: String, gzip: bool, tls: bool| {
        let (ca, client_cert, client_key) = (ca.clone(), client_cert.clone(), client_key.clone());
        move |c: &mut Config| {
            otel_to(plain_addr, |o| {
                o.endpoint = Some(endpoint);
                o.protocol = Some("grpc".into());
                if gzip {
                    o.compression = Some("gzip".into());
                }
                if tls {
                    o.certificate = Some(ca.display().to_string());
                    o.client_certificate = Some(client_cert.display().to_string());
                    o.client_key = Some(client_key.display().to_string());
                }
            })(c)
        }
    };
    let cases = [
        (
            &plain,
            grpc(format!("http://{plain_addr}"), true, false),
            "gzip",
        ),
        (
            &secure,
            grpc(format!("https://{secure_addr}"), false, true),
            "",
        ),
    ];
    for (receiver, setup, encoding) in cases {
        let sending = proxy(upstream.addr, setup).await;
        for _ in 0..2 {
            chat(&sending, "llama-3").await;
        }
        until("two spans over gRPC", || receiver.spans().len() == 2).await;
        until("metrics over gRPC", || {
            receiver
                .latest("gen_ai.server.time_to_first_token")
                .is_some()
        })
        .await;
        let span = &receiver.spans()[0];
        assert_eq!(span.name, "chat llama-3");
        assert_eq!(
            text(&span.attributes, "gen_ai.response.model").as_deref(),
            Some(SERVED_MODEL)
        );
        assert!(receiver
            .encodings
            .lock()
            .unwrap()
            .iter()
            .all(|e| e == encoding));
        assert_eq!(
            series(&sending.metrics(), "tokenmeter_otel_export_errors_total"),
            0.0
        );
    }

    // A collector that answers grpc-status 14 (UNAVAILABLE) in its trailers over a 200: every
    // export is an error, counted, and the spans it carried are dropped and counted.
    let refused = proxy(
        upstream.addr,
        grpc(format!("http://{refusing_addr}"), false, false),
    )
    .await;
    for _ in 0..2 {
        chat(&refused, "llama-3").await;
    }
    until("the refused spans counted as dropped", || {
        series(
            &refused.metrics(),
            "tokenmeter_otel_dropped_total{signal=\"traces\"}",
        ) >= 2.0
    })
    .await;
    assert!(series(&refused.metrics(), "tokenmeter_otel_export_errors_total") >= 1.0);
    assert_eq!(
        series(&refused.metrics(), "tokenmeter_otel_spans_exported_total"),
        0.0
    );
    assert!(refusing.spans().is_empty());
}
