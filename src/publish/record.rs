//! The per-request record: one line per finished request, as JSON lines or CSV.
//!
//! Records are handed to a writer thread through a bounded queue, so a slow disk or a blocked
//! stdout never stalls a stream. A record is dropped and counted
//! (`tokenmeter_access_log_dropped_total`) when the queue is full or when it cannot be written
//! (a full disk), each record lost counted once and the failure logged once, not per record.
//! At exit [`RecordSink::close`] writes and flushes everything queued, within a bound. Prompts
//! and completions are never part of a record.
//!
//! Who wrote a record (its pod, namespace and deployment) is the same for every record of a
//! process: it is resolved once, when the writer starts, and the writer adds it as it formats
//! each line, so the request path never carries it.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime};

use prometheus::IntCounter;
use serde::Serialize;
use tokio::time::Instant;

use crate::config::{AccessLog, Identity, LogFormat, LogPath};

/// How many finished records may wait for the writer before new ones are dropped.
const QUEUE_DEPTH: usize = 8192;

/// The columns, in order; also the CSV header. The writer's own (who wrote the record) come last.
pub const COLUMNS: [&str; 49] = [
    "ts",
    "request_id",
    "route",
    "model",
    "method",
    "path",
    "status",
    "outcome",
    "slo",
    "violated",
    "finish_reason",
    "prompt_tokens",
    "output_tokens",
    "token_source",
    "events",
    "ttfb_ms",
    "ttft_ms",
    "ttfc_ms",
    "tpot_ms",
    "max_itl_ms",
    "e2e_ms",
    "in_flight",
    "bytes",
    "in_flight_total",
    "reason",
    "read",
    "retries",
    "upstream_conn",
    "connect_ms",
    "proxy_ms",
    "cached_tokens",
    "cache_creation_tokens",
    "reasoning_tokens",
    "engine_queue_ms",
    "engine_prefill_ms",
    "engine_decode_ms",
    "engine_inference_ms",
    "engine_load_ms",
    "engine_total_ms",
    "engine_prompt_n",
    "engine_source",
    "queue_ms",
    "queue_source",
    "engine_running",
    "engine_waiting",
    "engine_kv_usage",
    "pod",
    "namespace",
    "deployment",
];

/// One finished request, as `docs/MEASUREMENT.md` lists it. Missing values are `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
///
/// Built on the request path without copying or formatting anything that can wait: the start
/// time is formatted, and every field serialized, by the writer thread.
pub(crate) struct Record {
    pub(crate) ts: Timestamp,
    pub(crate) request_id: Option<Box<str>>,
    pub(crate) route: Arc<str>,
    pub(crate) model: Option<Arc<str>>,
    #[serde(serialize_with = "method_name")]
    pub(crate) method: http::Method,
    pub(crate) path: Box<str>,
    pub(crate) status: Option<u16>,
    pub(crate) outcome: &'static str,
    pub(crate) slo: Option<&'static str>,
    pub(crate) violated: Vec<&'static str>,
    pub(crate) finish_reason: Option<&'static str>,
    pub(crate) prompt_tokens: Option<u64>,
    pub(crate) output_tokens: u64,
    pub(crate) token_source: &'static str,
    pub(crate) events: u64,
    pub(crate) ttfb_ms: Option<f64>,
    pub(crate) ttft_ms: Option<f64>,
    pub(crate) ttfc_ms: Option<f64>,
    pub(crate) tpot_ms: Option<f64>,
    pub(crate) max_itl_ms: Option<f64>,
    pub(crate) e2e_ms: f64,
    pub(crate) in_flight: i64,
    pub(crate) bytes: u64,
    /// Requests in flight in the whole proxy at arrival, this one included.
    pub(crate) in_flight_total: i64,
    /// Why the request did not end normally (`upstream_idle`, `client_body_timeout`, ...).
    pub(crate) reason: Option<&'static str>,
    /// How the response body was read: `parsed`, `encoded`, `opaque`, `none`.
    pub(crate) read: &'static str,
    /// Upstream attempts after the first.
    pub(crate) retries: u8,
    /// `new` or `reused`: the upstream connection of the attempt that answered.
    pub(crate) upstream_conn: Option<&'static str>,
    /// Connecting to the upstream, when that connection was new.
    pub(crate) connect_ms: Option<f64>,
    /// The proxy's own share: request head read to request handed to the upstream connection.
    pub(crate) proxy_ms: Option<f64>,
    /// What explains the figures, as the engine reported it (`docs/MEASUREMENT.md`).
    pub(crate) cached_tokens: Option<u64>,
    pub(crate) cache_creation_tokens: Option<u64>,
    pub(crate) reasoning_tokens: Option<u64>,
    pub(crate) engine_queue_ms: Option<f64>,
    pub(crate) engine_prefill_ms: Option<f64>,
    pub(crate) engine_decode_ms: Option<f64>,
    pub(crate) engine_inference_ms: Option<f64>,
    pub(crate) engine_load_ms: Option<f64>,
    pub(crate) engine_total_ms: Option<f64>,
    pub(crate) engine_prompt_n: Option<u64>,
    pub(crate) engine_source: Option<&'static str>,
    /// Queue time: the engine's own (`engine`), or TTFT − engine prefill − proxy share
    /// (`derived`).
    pub(crate) queue_ms: Option<f64>,
    pub(crate) queue_source: Option<&'static str>,
    /// The engine's state at arrival, from its own metrics.
    pub(crate) engine_running: Option<f64>,
    pub(crate) engine_waiting: Option<f64>,
    pub(crate) engine_kv_usage: Option<f64>,
}

/// A wall-clock time, written as RFC 3339 in UTC with milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Timestamp(pub(crate) SystemTime);

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        humantime::format_rfc3339_millis(self.0).fmt(f)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn method_name<S: serde::Serializer>(method: &http::Method, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(method.as_str())
}

impl Record {
    fn csv_fields(&self) -> [String; 46] {
        fn opt<T: ToString>(v: &Option<T>) -> String {
            v.as_ref().map(ToString::to_string).unwrap_or_default()
        }
        [
            self.ts.to_string(),
            opt(&self.request_id),
            self.route.to_string(),
            opt(&self.model),
            self.method.to_string(),
            self.path.to_string(),
            opt(&self.status),
            self.outcome.to_string(),
            opt(&self.slo),
            self.violated.join(";"),
            opt(&self.finish_reason),
            opt(&self.prompt_tokens),
            self.output_tokens.to_string(),
            self.token_source.to_string(),
            self.events.to_string(),
            opt(&self.ttfb_ms),
            opt(&self.ttft_ms),
            opt(&self.ttfc_ms),
            opt(&self.tpot_ms),
            opt(&self.max_itl_ms),
            self.e2e_ms.to_string(),
            self.in_flight.to_string(),
            self.bytes.to_string(),
            self.in_flight_total.to_string(),
            opt(&self.reason),
            self.read.to_string(),
            self.retries.to_string(),
            opt(&self.upstream_conn),
            opt(&self.connect_ms),
            opt(&self.proxy_ms),
            opt(&self.cached_tokens),
            opt(&self.cache_creation_tokens),
            opt(&self.reasoning_tokens),
            opt(&self.engine_queue_ms),
            opt(&self.engine_prefill_ms),
            opt(&self.engine_decode_ms),
            opt(&self.engine_inference_ms),
            opt(&self.engine_load_ms),
            opt(&self.engine_total_ms),
            opt(&self.engine_prompt_n),
            opt(&self.engine_source),
            opt(&self.queue_ms),
            opt(&self.queue_source),
            opt(&self.engine_running),
            opt(&self.engine_waiting),
            opt(&self.engine_kv_usage),
        ]
    }
}

/// One line as written: the request's record and who wrote it, in the order of [`COLUMNS`].
#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    record: &'a Record,
    pod: Option<&'a str>,
    namespace: Option<&'a str>,
    deployment: Option<&'a str>,
}

impl<'a> Line<'a> {
    fn new(record: &'a Record, identity: &'a Identity) -> Self {
        Line {
            record,
            pod: identity.pod.as_deref(),
            namespace: identity.namespace.as_deref(),
            deployment: identity.deployment.as_deref(),
        }
    }
}

/// What the writer thread is asked to do.
enum Message {
    Write(Box<Record>),
    /// Reopen the file by its path (logrotate moved the old one away).
    Reopen,
    /// Write and flush everything queued before this, answer, and stop (at exit).
    Close(mpsc::Sender<()>),
}

/// How long closing the record may hold the exit. Writing what can be queued (at most
/// `QUEUE_DEPTH` records, a few MB) takes milliseconds on any disk; one that hangs must not
/// keep the process from ending.
pub(crate) const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// Formatted records are written in pieces of about this size, and at the end of each burst.
const BATCH_BYTES: usize = 64 * 1024;

/// While records cannot be written, how often the log says so again (besides the first time
/// and when writing works again): one line per failure would flood the log under load.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// The sending side: cheap to clone, never blocks.
#[derive(Clone)]
pub(crate) struct RecordSink {
    tx: SyncSender<Message>,
    dropped: IntCounter,
    /// The writer thread, joined by [`RecordSink::close`].
    writer: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl RecordSink {
    /// Queues a record for writing, or drops and counts it when the writer is behind (or
    /// closed).
    pub(crate) fn send(&self, record: Record) {
        match self.tx.try_send(Message::Write(Box::new(record))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped.inc(),
        }
    }

    /// Whether `other` hands its records to the same writer.
    pub(crate) fn same_writer(&self, other: &RecordSink) -> bool {
        Arc::ptr_eq(&self.writer, &other.writer)
    }

    /// Asks the writer to reopen its file; a no-op for standard output.
    pub(crate) fn reopen(&self) {
        // Blocking here is fine: it happens on SIGHUP, not on a request's path.
        let _ = self.tx.send(Message::Reopen);
    }

    /// At exit: writes and flushes every record queued so far, stops the writer and joins it,
    /// waiting at most [`CLOSE_WITHIN`]. A record sent afterwards is dropped and counted.
    /// Returns whether everything queued was written (or counted as dropped) in time.
    pub(crate) fn close(&self) -> bool {
        self.close_within(CLOSE_WITHIN)
    }

    /// [`RecordSink::close`], waiting at most `within`.
    pub(crate) fn close_within(&self, within: Duration) -> bool {
        let (done_tx, done) = mpsc::channel();
        let tx = self.tx.clone();
        // The queue may be full behind a disk that hangs: the message is handed over by a
        // thread of its own, so that the wait below keeps its bound.
        let handing = thread::Builder::new()
            .name("tokenmeter-access-log-close".into())
            .spawn(move || {
                let _ = tx.send(Message::Close(done_tx));
            });
        if handing.is_err() {
            return false;
        }
        match done.recv_timeout(within) {
            // Disconnected: the writer had already stopped, so nothing is left to write.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(writer) = writer {
                    let _ = writer.join();
                }
                true
            }
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    within = %humantime::format_duration(within),
                    "the access log was not written to its end in time; the records still queued are lost"
                );
                false
            }
        }
    }
}

impl RecordSink {
    #[cfg(test)]
    /// A sink whose records arrive on the returned receiver, for tests that read them directly.
    pub(crate) fn channel(depth: usize, dropped: IntCounter) -> (RecordSink, Receiver<Record>) {
        let (tx, rx) = mpsc::sync_channel::<Message>(depth);
        let (records_tx, records) = mpsc::sync_channel(depth);
        let writer = thread::spawn(move || {
            while let Ok(message) = rx.recv() {
                match message {
                    Message::Write(record) => {
                        let _ = records_tx.send(*record);
                    }
                    Message::Reopen => {}
                    Message::Close(done) => {
                        let _ = done.send(());
                        return;
                    }
                }
            }
        });
        let sink = RecordSink {
            tx,
            dropped,
            writer: Arc::new(Mutex::new(Some(writer))),
        };
        (sink, records)
    }
}

fn open(path: &LogPath) -> io::Result<Box<dyn Write + Send>> {
    Ok(match path {
        LogPath::Stdout => Box::new(io::stdout()),
        LogPath::File(path) => Box::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("access_log {}: {e}", path.display()))
                })?,
        ),
    })
}

/// Opens the record's destination and starts its writer thread, which names in every record
/// the pod, namespace and deployment that `identity` and the environment say
/// ([`Identity::resolve`]). The thread ends when every sink clone is gone (after a reload that
/// changed the destination), or on [`RecordSink::close`].
pub(crate) fn start(
    config: &AccessLog,
    identity: &Identity,
    dropped: IntCounter,
) -> io::Result<RecordSink> {
    let identity = identity
        .from_environment()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let header = needs_header(&config.path);
    let out = open(&config.path)?;
    let (tx, rx) = mpsc::sync_channel(QUEUE_DEPTH);
    let config = config.clone();
    let writer = Writer::new(out, config.format, identity, header, dropped.clone());
    let writer = thread::Builder::new()
        .name("tokenmeter-access-log".into())
        .spawn(move || writer.run(rx, &config))?;
    Ok(RecordSink {
        tx,
        dropped,
        writer: Arc::new(Mutex::new(Some(writer))),
    })
}

/// Whether a CSV destination needs its header: stdout always, a file when it is new or empty.
fn needs_header(path: &LogPath) -> bool {
    match path {
        LogPath::Stdout => true,
        LogPath::File(p) => std::fs::metadata(p).map_or(true, |m| m.len() == 0),
    }
}

/// The writer thread's state: records are formatted into a batch that is written whole, so
/// that a failed write knows exactly which records it lost.
struct Writer {
    out: Box<dyn Write + Send>,
    format: LogFormat,
    /// Who writes: added to every record.
    identity: Identity,
    batch: Vec<u8>,
    /// Where each record in `batch` ends.
    ends: Vec<usize>,
    /// A failed write left part of a line in the destination: the next write ends that line
    /// first, so the records after it are whole lines again.
    torn: bool,
    dropped: IntCounter,
    failing: Option<Failing>,
}

/// Records are being lost: what the log has and has not said about it yet.
struct Failing {
    logged_at: Instant,
    not_logged: u64,
    total: u64,
}

impl Writer {
    fn new(
        out: Box<dyn Write + Send>,
        format: LogFormat,
        identity: Identity,
        header: bool,
        dropped: IntCounter,
    ) -> Self {
        let mut writer = Writer {
            out,
            format,
            identity,
            batch: Vec::with_capacity(BATCH_BYTES),
            ends: Vec::new(),
            torn: false,
            dropped,
            failing: None,
        };
        if header && format == LogFormat::Csv {
            writer.csv_row(COLUMNS);
        }
        writer
    }

    fn run(mut self, rx: Receiver<Message>, config: &AccessLog) {
        // Block for the next message; write what a burst queued once the queue is empty (or
        // the batch is full), so records reach the file promptly without a write per record.
        while let Ok(mut message) = rx.recv() {
            loop {
                match message {
                    Message::Write(record) => {
                        self.push(&record);
                        if self.batch.len() >= BATCH_BYTES {
                            self.write_batch();
                        }
                    }
                    Message::Reopen if config.path != LogPath::Stdout => {
                        self.write_batch();
                        let header = needs_header(&config.path);
                        match open(&config.path) {
                            Ok(file) => {
                                self.out = file;
                                self.torn = false;
                                if header && self.format == LogFormat::Csv {
                                    self.csv_row(COLUMNS);
                                }
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot reopen the access log; keeping the old file")
                            }
                        }
                    }
                    Message::Reopen => {}
                    Message::Close(done) => {
                        self.write_batch();
                        let _ = done.send(());
                        return;
                    }
                }
                match rx.try_recv() {
                    Ok(next) => message = next,
                    Err(_) => break,
                }
            }
            self.write_batch();
        }
    }

    /// Formats one record into the batch.
    fn push(&mut self, record: &Record) {
        match self.format {
            LogFormat::Jsonl => {
                let before = self.batch.len();
                let line = Line::new(record, &self.identity);
                if serde_json::to_writer(&mut self.batch, &line).is_err() {
                    self.batch.truncate(before);
                    self.dropped.inc();
                    return;
                }
                self.batch.push(b'\n');
            }
            LogFormat::Csv => {
                let who = [
                    &self.identity.pod,
                    &self.identity.namespace,
                    &self.identity.deployment,
                ]
                .map(|name| name.clone().unwrap_or_default());
                self.csv_row(record.csv_fields().into_iter().chain(who));
            }
        }
        self.ends.push(self.batch.len());
    }

    fn csv_row<I: IntoIterator<Item = T>, T: AsRef<[u8]>>(&mut self, fields: I) {
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .buffer_capacity(1024)
            .from_writer(&mut self.batch);
        // Writing into memory cannot fail.
        let _ = w.write_record(fields);
        let _ = w.flush();
    }

    /// Writes the batch and flushes; on failure, counts as dropped every record not written
    /// whole, and says so in the log (not once per record).
    fn write_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        if self.torn {
            self.batch.insert(0, b'\n');
            self.ends.iter_mut().for_each(|end| *end += 1);
        }
        let mut written = 0;
        let result = loop {
            if written == self.batch.len() {
                break self.out.flush().map_err(|e| (e, true));
            }
            match self.out.write(&self.batch[written..]) {
                Ok(0) => break Err((io::ErrorKind::WriteZero.into(), false)),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err((e, false)),
            }
        };
        match result {
            Ok(()) => {
                self.torn = false;
                if let Some(failing) = self.failing.take() {
                    tracing::info!(
                        dropped = failing.total,
                        "the access log can be written again"
                    );
                }
            }
            Err((error, flushing)) => {
                // A flush that fails after every byte was handed over cannot say which records
                // it lost: all of them are counted.
                let lost = if flushing {
                    self.ends.len()
                } else {
                    self.ends.iter().filter(|end| **end > written).count()
                };
                if !flushing && written > 0 {
                    self.torn = self.batch[written - 1] != b'\n';
                }
                self.failed(&error, lost as u64);
            }
        }
        self.batch.clear();
        self.ends.clear();
    }

    fn failed(&mut self, error: &io::Error, lost: u64) {
        self.dropped.inc_by(lost);
        let now = Instant::now();
        match &mut self.failing {
            None => {
                tracing::warn!(
                    error = %error,
                    dropped = lost,
                    "cannot write the access log; records are dropped and counted in tokenmeter_access_log_dropped_total until it can be written again"
                );
                self.failing = Some(Failing {
                    logged_at: now,
                    not_logged: 0,
                    total: lost,
                });
            }
            Some(failing) => {
                failing.total += lost;
                failing.not_logged += lost;
                if now.duration_since(failing.logged_at) >= FAILURE_LOG_EVERY {
                    tracing::warn!(
                        error = %error,
                        dropped = failing.not_logged,
                        "the access log still cannot be written"
                    );
                    failing.logged_at = now;
                    failing.not_logged = 0;
                }
            }
        }
    }
}

/// A record with every field set, for tests elsewhere.
#[cfg(test)]
impl Record {
    pub(crate) fn example() -> Record {
        tests::record()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn record() -> Record {
        Record {
            ts: Timestamp(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)),
            request_id: Some("r,1".into()),
            route: "default".into(),
            model: None,
            method: http::Method::POST,
            path: "/v1/chat/completions".into(),
            status: Some(200),
            outcome: "ok",
            slo: None,
            violated: vec!["ttft", "tpot"],
            finish_reason: Some("stop"),
            prompt_tokens: Some(10),
            output_tokens: 3,
            token_source: "usage",
            events: 5,
            ttfb_ms: Some(1.5),
            ttft_ms: Some(2.0),
            ttfc_ms: Some(2.0),
            tpot_ms: Some(0.5),
            max_itl_ms: Some(0.75),
            e2e_ms: 3.25,
            in_flight: 1,
            bytes: 100,
            in_flight_total: 2,
            reason: None,
            read: "parsed",
            retries: 0,
            upstream_conn: Some("reused"),
            connect_ms: None,
            proxy_ms: Some(0.125),
            cached_tokens: None,
            cache_creation_tokens: None,
            reasoning_tokens: None,
            engine_queue_ms: None,
            engine_prefill_ms: None,
            engine_decode_ms: None,
            engine_inference_ms: None,
            engine_load_ms: None,
            engine_total_ms: None,
            engine_prompt_n: None,
            engine_source: None,
            queue_ms: None,
            queue_source: None,
            engine_running: None,
            engine_waiting: None,
            engine_kv_usage: None,
        }
    }

    /// A destination that takes `room` bytes and then fails like a full disk; what it took is
    /// shared with the test.
    struct Disk {
        room: usize,
        taken: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut taken = self.taken.lock().unwrap();
            let n = buf.len().min(self.room - taken.len().min(self.room));
            if n == 0 {
                return Err(io::Error::from_raw_os_error(28)); // ENOSPC
            }
            taken.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn counter() -> IntCounter {
        IntCounter::new("dropped", "dropped").unwrap()
    }

    /// Records a full disk refused must never go uncounted (1,000 lost records once left the
    /// counter at 0), nor be counted twice.
    #[test]
    fn every_record_a_full_disk_refuses_is_counted_once() {
        let line = lines(LogFormat::Jsonl, Identity::default(), 1).len();
        let taken = Arc::new(Mutex::new(Vec::new()));
        let dropped = counter();
        // Room for two records and half of a third.
        let disk = Disk {
            room: 2 * line + line / 2,
            taken: taken.clone(),
        };
        let mut writer = Writer::new(
            Box::new(disk),
            LogFormat::Jsonl,
            Identity::default(),
            false,
            dropped.clone(),
        );
        for _ in 0..5 {
            writer.push(&record());
        }
        writer.write_batch();
        assert_eq!(dropped.get(), 3, "the torn third and the two after it");
        for _ in 0..1000 {
            writer.push(&record());
            writer.write_batch();
        }
        assert_eq!(dropped.get(), 1003);
        // Two whole lines, then the torn one.
        let text = String::from_utf8(taken.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text
            .lines()
            .take(2)
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
    }

    #[test]
    fn after_a_torn_line_the_next_records_start_on_a_line_of_their_own() {
        let line = lines(LogFormat::Jsonl, Identity::default(), 1).len();
        let taken = Arc::new(Mutex::new(Vec::new()));
        let dropped = counter();
        let mut writer = Writer::new(
            Box::new(Disk {
                room: line / 2,
                taken: taken.clone(),
            }),
            LogFormat::Jsonl,
            Identity::default(),
            false,
            dropped.clone(),
        );
        writer.push(&record());
        writer.write_batch();
        assert_eq!(dropped.get(), 1);
        // The disk has room again.
        writer.out = Box::new(Disk {
            room: usize::MAX,
            taken: taken.clone(),
        });
        writer.push(&record());
        writer.write_batch();
        assert_eq!(dropped.get(), 1);
        let text = String::from_utf8(taken.lock().unwrap().clone()).unwrap();
        let last = text.lines().last().unwrap();
        assert!(
            serde_json::from_str::<serde_json::Value>(last).is_ok(),
            "{text}"
        );
    }

    /// At exit no queued record may be lost: close writes them all before it returns.
    #[test]
    fn close_writes_every_queued_record_and_later_ones_are_counted() {
        let dir = std::env::temp_dir().join(format!("tm-record-close-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("records.jsonl");
        let config = AccessLog {
            path: LogPath::File(path.clone()),
            format: LogFormat::Jsonl,
        };
        let dropped = counter();
        let sink = start(&config, &Identity::default(), dropped.clone()).unwrap();
        for _ in 0..QUEUE_DEPTH {
            sink.send(record());
        }
        let queued = QUEUE_DEPTH as u64 - dropped.get();
        assert!(sink.close());
        let lines = std::fs::read_to_string(&path).unwrap().lines().count() as u64;
        assert_eq!(lines, queued);
        sink.send(record());
        assert_eq!(dropped.get(), QUEUE_DEPTH as u64 - queued + 1);
        assert!(sink.close(), "a second close has nothing left to do");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A destination that never returns must not hold the exit past the bound.
    #[test]
    fn close_gives_up_on_a_writer_that_hangs() {
        struct Hung(mpsc::Receiver<()>);
        impl Write for Hung {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                let _ = self.0.recv();
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let (release, hung) = mpsc::channel();
        let (tx, rx) = mpsc::sync_channel(QUEUE_DEPTH);
        let writer = Writer::new(
            Box::new(Hung(hung)),
            LogFormat::Jsonl,
            Identity::default(),
            false,
            counter(),
        );
        let config = AccessLog {
            path: LogPath::Stdout,
            format: LogFormat::Jsonl,
        };
        let thread = thread::spawn(move || writer.run(rx, &config));
        let sink = RecordSink {
            tx,
            dropped: counter(),
            writer: Arc::new(Mutex::new(Some(thread))),
        };
        sink.send(record());
        let started = Instant::now();
        assert!(!sink.close_within(Duration::from_millis(100)));
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(release);
    }

    /// What a writer with `identity` writes for `n` records (a CSV header first).
    fn lines(format: LogFormat, identity: Identity, n: usize) -> String {
        let taken = Arc::new(Mutex::new(Vec::new()));
        let disk = Disk {
            room: usize::MAX,
            taken: taken.clone(),
        };
        let header = format == LogFormat::Csv;
        let mut writer = Writer::new(Box::new(disk), format, identity, header, counter());
        for _ in 0..n {
            writer.push(&record());
        }
        writer.write_batch();
        let text = String::from_utf8(taken.lock().unwrap().clone()).unwrap();
        text
    }

    fn who() -> Identity {
        Identity {
            pod: Some("llm-7d9f8c6b5-x2x4q".into()),
            namespace: Some("inference".into()),
            deployment: None,
        }
    }

    #[test]
    fn json_has_every_column_in_order_with_nulls() {
        let text = lines(LogFormat::Jsonl, Identity::default(), 1);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        let mut expected: Vec<_> = COLUMNS.iter().map(|s| s.to_string()).collect();
        expected.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, expected);
        assert!(v["model"].is_null() && v["slo"].is_null());
        assert!(v["pod"].is_null() && v["namespace"].is_null() && v["deployment"].is_null());
        assert_eq!(v["violated"], serde_json::json!(["ttft", "tpot"]));
    }

    /// Every record names who wrote it, in JSON and in CSV, under the header's names; an unknown
    /// name is null in JSON and empty in CSV.
    #[test]
    fn every_record_names_its_pod_namespace_and_deployment() {
        let text = lines(LogFormat::Jsonl, who(), 2);
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["pod"], "llm-7d9f8c6b5-x2x4q");
            assert_eq!(v["namespace"], "inference");
            assert!(v["deployment"].is_null());
            assert_eq!(
                v["route"], "default",
                "the record's own fields are all there"
            );
        }
        let text = lines(LogFormat::Csv, who(), 2);
        let mut csv = csv::Reader::from_reader(text.as_bytes());
        let header: Vec<String> = csv.headers().unwrap().iter().map(String::from).collect();
        assert_eq!(header, COLUMNS);
        let rows: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
        assert_eq!(rows.len(), 2);
        for row in rows {
            let at = |name: &str| &row[COLUMNS.iter().position(|c| *c == name).unwrap()];
            assert_eq!(
                (at("pod"), at("namespace"), at("deployment"), at("route")),
                ("llm-7d9f8c6b5-x2x4q", "inference", "", "default")
            );
        }
    }

    #[test]
    fn csv_quotes_and_leaves_missing_values_empty() {
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(Vec::new());
        w.write_record(record().csv_fields()).unwrap();
        let line = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert!(
            line.starts_with("2026-01-01T00:00:00.000Z,\"r,1\",default,,POST,"),
            "{line}"
        );
        assert!(line.contains(",ttft;tpot,stop,10,3,usage,5,"), "{line}");
        let text = lines(LogFormat::Csv, Identity::default(), 1);
        let row = text.lines().nth(1).unwrap();
        assert!(row.starts_with(line.trim_end()), "{row}");
        assert_eq!(
            csv::ReaderBuilder::new()
                .has_headers(false)
                .from_reader(row.as_bytes())
                .records()
                .next()
                .unwrap()
                .unwrap()
                .len(),
            COLUMNS.len()
        );
    }
}
