//! The per-request record: one line per finished request, as JSON lines or CSV.
//!
//! Records are handed to a writer thread through a bounded queue, so a slow disk or a blocked
//! stdout never stalls a stream; when the queue is full the record is dropped and counted
//! (`tokenmeter_access_log_dropped_total`). Prompts and completions are never part of a record.

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread;

use prometheus::IntCounter;
use serde::Serialize;

use crate::config::{AccessLog, LogFormat, LogPath};

/// How many finished records may wait for the writer before new ones are dropped.
const QUEUE_DEPTH: usize = 8192;

/// The columns, in order; also the CSV header.
pub(crate) const COLUMNS: [&str; 30] = [
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
];

/// One finished request, as `docs/MEASUREMENT.md` lists it. Missing values are `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Record {
    pub(crate) ts: String,
    pub(crate) request_id: Option<String>,
    pub(crate) route: String,
    pub(crate) model: Option<String>,
    pub(crate) method: String,
    pub(crate) path: String,
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
}

impl Record {
    fn csv_fields(&self) -> [String; 30] {
        fn opt<T: ToString>(v: &Option<T>) -> String {
            v.as_ref().map(ToString::to_string).unwrap_or_default()
        }
        [
            self.ts.clone(),
            opt(&self.request_id),
            self.route.clone(),
            opt(&self.model),
            self.method.clone(),
            self.path.clone(),
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
        ]
    }
}

/// What the writer thread is asked to do.
enum Message {
    Write(Box<Record>),
    /// Reopen the file by its path (logrotate moved the old one away).
    Reopen,
}

/// The sending side: cheap to clone, never blocks.
#[derive(Clone)]
pub(crate) struct RecordSink {
    tx: SyncSender<Message>,
    dropped: IntCounter,
}

impl RecordSink {
    /// Queues a record for writing, or drops and counts it when the writer is behind.
    pub(crate) fn send(&self, record: Record) {
        match self.tx.try_send(Message::Write(Box::new(record))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped.inc(),
        }
    }

    /// Asks the writer to reopen its file; a no-op for standard output.
    pub(crate) fn reopen(&self) {
        // Blocking here is fine: it happens on SIGHUP, not on a request's path.
        let _ = self.tx.send(Message::Reopen);
    }
}

impl RecordSink {
    #[cfg(test)]
    /// A sink whose records arrive on the returned receiver, for tests that read them directly.
    pub(crate) fn channel(depth: usize, dropped: IntCounter) -> (RecordSink, Receiver<Record>) {
        let (tx, rx) = mpsc::sync_channel::<Message>(depth);
        let (records_tx, records) = mpsc::sync_channel(depth);
        thread::spawn(move || {
            while let Ok(message) = rx.recv() {
                if let Message::Write(record) = message {
                    let _ = records_tx.send(*record);
                }
            }
        });
        (RecordSink { tx, dropped }, records)
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

/// Opens the record's destination and starts its writer thread. The thread ends when every
/// sink clone is gone (after a reload that changed the destination).
pub(crate) fn start(config: &AccessLog, dropped: IntCounter) -> io::Result<RecordSink> {
    let header = needs_header(&config.path);
    let out = open(&config.path)?;
    let (tx, rx) = mpsc::sync_channel(QUEUE_DEPTH);
    let config = config.clone();
    thread::Builder::new()
        .name("tokenmeter-access-log".into())
        .spawn(move || write_records(rx, Output::new(out, config.format, header), &config))?;
    Ok(RecordSink { tx, dropped })
}

/// Where records are formatted: the CSV writer keeps its own buffer, JSON lines use a BufWriter.
enum Output {
    Jsonl(BufWriter<Box<dyn Write + Send>>),
    Csv(Box<csv::Writer<Box<dyn Write + Send>>>),
}

impl Output {
    fn new(out: Box<dyn Write + Send>, format: LogFormat, header: bool) -> Output {
        match format {
            LogFormat::Jsonl => Output::Jsonl(BufWriter::new(out)),
            LogFormat::Csv => {
                let mut w = csv::WriterBuilder::new()
                    .has_headers(false)
                    .from_writer(out);
                if header {
                    if let Err(e) = w.write_record(COLUMNS) {
                        tracing::warn!(error = %e, "cannot write the access log header");
                    }
                }
                Output::Csv(Box::new(w))
            }
        }
    }

    fn write(&mut self, record: &Record) -> io::Result<()> {
        match self {
            Output::Jsonl(out) => {
                serde_json::to_writer(&mut *out, record).map_err(io::Error::other)?;
                out.write_all(b"\n")
            }
            Output::Csv(w) => w
                .write_record(record.csv_fields())
                .map_err(io::Error::other),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Jsonl(out) => out.flush(),
            Output::Csv(w) => w.flush(),
        }
    }
}

/// Whether a CSV destination needs its header: stdout always, a file when it is new or empty.
fn needs_header(path: &LogPath) -> bool {
    match path {
        LogPath::Stdout => true,
        LogPath::File(p) => std::fs::metadata(p).map_or(true, |m| m.len() == 0),
    }
}

fn write_records(rx: Receiver<Message>, mut out: Output, config: &AccessLog) {
    // Block for the next message; after a burst, flush once the queue is empty so records
    // reach the file promptly without a write per record.
    while let Ok(mut message) = rx.recv() {
        loop {
            match message {
                Message::Write(record) => {
                    if let Err(e) = out.write(&record) {
                        tracing::warn!(error = %e, "cannot write the access log");
                    }
                }
                Message::Reopen if config.path != LogPath::Stdout => {
                    let _ = out.flush();
                    let header = needs_header(&config.path);
                    match open(&config.path) {
                        Ok(file) => out = Output::new(file, config.format, header),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot reopen the access log; keeping the old file")
                        }
                    }
                }
                Message::Reopen => {}
            }
            match rx.try_recv() {
                Ok(next) => message = next,
                Err(_) => break,
            }
        }
        if let Err(e) = out.flush() {
            tracing::warn!(error = %e, "cannot flush the access log");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            ts: "2026-01-01T00:00:00.000Z".into(),
            request_id: Some("r,1".into()),
            route: "default".into(),
            model: None,
            method: "POST".into(),
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
        }
    }

    #[test]
    fn json_has_every_column_in_order_with_nulls() {
        let v = serde_json::to_value(record()).unwrap();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        let mut expected: Vec<_> = COLUMNS.iter().map(|s| s.to_string()).collect();
        expected.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, expected);
        assert!(v["model"].is_null() && v["slo"].is_null());
        assert_eq!(v["violated"], serde_json::json!(["ttft", "tpot"]));
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
        assert_eq!(
            csv::ReaderBuilder::new()
                .has_headers(false)
                .from_reader(line.as_bytes())
                .records()
                .next()
                .unwrap()
                .unwrap()
                .len(),
            COLUMNS.len()
        );
    }
}
