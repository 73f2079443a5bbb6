//! Reading per-request records: JSON lines or CSV, told apart per file by its extension or,
//! failing that, by its first byte, so a pod's file is read whichever format its proxy wrote.
//!
//! Records are handed on one at a time as they are read, never all held: a fleet's day of
//! records is larger than a laptop's memory, and the report folds each into bounded summaries.
//!
//! A reader must survive what a real log holds: a line cut off by a crash or a rotation, a
//! record from an older proxy without this round's fields, a hand-edited cell. A line that is not
//! a record is skipped and counted as `FILE:LINE: problem`; only a file that cannot be read at
//! all stops the report.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

/// How many malformed lines are kept with their problem; the rest are only counted.
const KEPT_PROBLEMS: usize = 20;

/// The proxy's CSV columns in order, for a CSV file that starts without its header (a file
/// appended to after its first lines were rotated away). Old records stop after `bytes`.
use crate::RECORD_COLUMNS as COLUMNS;

/// The fields of a record that the report reads; every other field is ignored, so records
/// from older and newer proxies both read. Only `ts`, `route` and `e2e_ms` are required.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Fields {
    pub ts: String,
    pub request_id: Option<String>,
    pub route: String,
    pub model: Option<String>,
    pub status: Option<u16>,
    pub outcome: Option<String>,
    pub slo: Option<String>,
    pub reason: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub max_itl_ms: Option<f64>,
    pub e2e_ms: f64,
    pub in_flight: Option<i64>,
    pub in_flight_total: Option<i64>,
    pub retries: Option<u64>,
    pub upstream_conn: Option<String>,
    pub connect_ms: Option<f64>,
    pub proxy_ms: Option<f64>,
    pub cached_tokens: Option<u64>,
    pub engine_prefill_ms: Option<f64>,
    pub engine_load_ms: Option<f64>,
    pub queue_ms: Option<f64>,
    pub queue_source: Option<String>,
    pub engine_running: Option<f64>,
    pub engine_waiting: Option<f64>,
    /// Who served the request; absent in records of older proxies, null or empty when the
    /// proxy did not know.
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub deployment: Option<String>,
}

fn known(name: &Option<String>) -> Option<&str> {
    name.as_deref().filter(|n| !n.is_empty())
}

impl Fields {
    /// The pod that served the request, when the record names one.
    pub fn pod(&self) -> Option<&str> {
        known(&self.pod)
    }

    /// The deployment, as `namespace/deployment` when the namespace is known too (two
    /// namespaces may each have a deployment of the same name), when the record names one.
    pub fn deployment(&self) -> Option<String> {
        let deployment = known(&self.deployment)?;
        Some(match known(&self.namespace) {
            Some(namespace) => format!("{namespace}/{deployment}"),
            None => deployment.to_string(),
        })
    }
}

/// One record, with where it came from.
#[derive(Clone, Debug)]
pub struct Request {
    /// Index into [`Loaded::sources`].
    pub file: usize,
    /// 1-based line of the file.
    pub line: u64,
    /// `ts` as seconds since the Unix epoch.
    pub at: f64,
    pub fields: Fields,
}

impl Request {
    /// Whether the request ended normally (an older record without `outcome` counts as ok).
    pub fn ok(&self) -> bool {
        self.fields.outcome.as_deref().is_none_or(|o| o == "ok")
    }
}

/// How a file's records are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Jsonl,
    Csv,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::Csv => "csv",
        }
    }
}

/// One file read.
#[derive(Clone, Debug, Serialize)]
pub struct Source {
    pub path: String,
    pub format: Format,
    pub records: usize,
    pub malformed: usize,
}

/// A line that is not a record.
#[derive(Clone, Debug)]
pub struct Problem {
    pub path: String,
    pub line: u64,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.path, self.line, self.message)
    }
}

/// What reading the files found, besides the records themselves (handed on as they are read).
#[derive(Debug, Default)]
pub struct Loaded {
    pub sources: Vec<Source>,
    /// Records read, over all files.
    pub records: usize,
    /// The first malformed lines, at most `KEPT_PROBLEMS`.
    pub problems: Vec<Problem>,
    pub malformed: usize,
}

impl Loaded {
    fn problem(&mut self, path: &str, line: u64, message: String) {
        self.malformed += 1;
        if let Some(source) = self.sources.last_mut() {
            source.malformed += 1;
        }
        if self.problems.len() < KEPT_PROBLEMS {
            self.problems.push(Problem {
                path: path.to_string(),
                line,
                message,
            });
        }
    }

    fn record(&mut self, path: &str, line: u64, fields: Fields, each: &mut impl FnMut(Request)) {
        match check(&fields) {
            Ok(at) => {
                let file = self.sources.len() - 1;
                self.sources[file].records += 1;
                self.records += 1;
                each(Request {
                    file,
                    line,
                    at,
                    fields,
                });
            }
            Err(message) => self.problem(path, line, message),
        }
    }
}

/// What serde cannot check: the timestamp and the duration make sense.
fn check(fields: &Fields) -> Result<f64, String> {
    let at = humantime::parse_rfc3339_weak(&fields.ts)
        .map_err(|e| format!("ts `{}` is not an RFC 3339 time: {e}", fields.ts))?
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("ts `{}` is before 1970", fields.ts))?
        .as_secs_f64();
    if !(fields.e2e_ms.is_finite() && fields.e2e_ms >= 0.0) {
        return Err(format!("e2e_ms {} is not a duration", fields.e2e_ms));
    }
    if fields.route.is_empty() {
        return Err("route is empty".into());
    }
    Ok(at)
}

/// Reads every file in order, handing each record to `each` as it is read. Fails only when a
/// file cannot be opened or read, or is not a record file at all.
pub fn stream(paths: &[impl AsRef<Path>], mut each: impl FnMut(Request)) -> Result<Loaded, String> {
    let mut loaded = Loaded::default();
    for path in paths {
        let path = path.as_ref();
        let name = path.display().to_string();
        let cannot = |e: std::io::Error| format!("{name}: cannot read: {e}");
        let mut reader = BufReader::new(File::open(path).map_err(cannot)?);
        let format = detect(path, reader.fill_buf().map_err(cannot)?);
        loaded.sources.push(Source {
            path: name.clone(),
            format,
            records: 0,
            malformed: 0,
        });
        match format {
            Format::Jsonl => read_jsonl(&name, reader, &mut loaded, &mut each).map_err(cannot)?,
            Format::Csv => read_csv(&name, reader, &mut loaded, &mut each)?,
        }
    }
    Ok(loaded)
}

/// By extension, else by the first byte that is not white space: `{` is JSON lines.
fn detect(path: &Path, start: &[u8]) -> Format {
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match extension.as_deref() {
        Some("jsonl" | "json" | "ndjson") => Format::Jsonl,
        Some("csv") => Format::Csv,
        _ => match start.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') | None => Format::Jsonl,
            Some(_) => Format::Csv,
        },
    }
}

fn read_jsonl(
    name: &str,
    mut reader: impl BufRead,
    loaded: &mut Loaded,
    each: &mut impl FnMut(Request),
) -> std::io::Result<()> {
    // Bytes, not `lines()`: a line of invalid UTF-8 is one malformed record, not the end.
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        number += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let record = line.strip_suffix(b"\n").unwrap_or(&line);
        let record = record.strip_suffix(b"\r").unwrap_or(record);
        match serde_json::from_slice::<Fields>(record) {
            Ok(fields) => loaded.record(name, number, fields, each),
            Err(e) => {
                // Every record is one line, so serde's "at line 1" says nothing.
                let message = e.to_string().replace(" at line 1 column ", " at column ");
                loaded.problem(name, number, message);
            }
        }
    }
}

fn read_csv(
    name: &str,
    reader: impl Read,
    loaded: &mut Loaded,
    each: &mut impl FnMut(Request),
) -> Result<(), String> {
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(reader);
    let mut header: Option<csv::ByteRecord> = None;
    let mut row = csv::ByteRecord::new();
    loop {
        match csv.read_byte_record(&mut row) {
            Ok(false) => return Ok(()),
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line());
                if e.is_io_error() {
                    return Err(format!("{name}: cannot read: {e}"));
                }
                loaded.problem(name, line, e.to_string());
                continue;
            }
        }
        let line = row.position().map_or(0, |p| p.line());
        if row.len() == 1 && row.get(0).is_some_and(<[u8]>::is_empty) {
            continue;
        }
        if header.is_none() {
            if row.iter().any(|cell| cell == b"e2e_ms") {
                header = Some(row.clone());
                continue;
            }
            if looks_like_a_header(&row) {
                return Err(not_records(name, &row));
            }
            // No header: the proxy's own order, as far as this row goes.
            let known = &COLUMNS[..row.len().min(COLUMNS.len())];
            header = Some(csv::ByteRecord::from(known.to_vec()));
        }
        let Some(columns) = &header else { continue };
        if row.len() != columns.len() {
            let message = format!("{} fields, the header has {}", row.len(), columns.len());
            loaded.problem(name, line, message);
            continue;
        }
        match row.deserialize::<Fields>(Some(columns)) {
            Ok(fields) => loaded.record(name, line, fields, each),
            Err(e) => {
                let message = match e.kind() {
                    csv::ErrorKind::Deserialize { err, .. } => {
                        let column = err
                            .field()
                            .and_then(|i| columns.get(i as usize))
                            .map(|c| String::from_utf8_lossy(c).into_owned());
                        match column {
                            Some(column) => format!("{column}: {}", err.kind()),
                            None => err.kind().to_string(),
                        }
                    }
                    _ => e.to_string(),
                };
                loaded.problem(name, line, message);
            }
        }
    }
}

/// Whether a CSV file's first row is a header (names, not values): three or more cells, none a
/// timestamp, each a name of letters, digits and `_` starting with a letter. A record file's
/// header holds `e2e_ms`; a row like this without it is some other file's header, where reading
/// on would only report every line as malformed.
fn looks_like_a_header(row: &csv::ByteRecord) -> bool {
    let name = |cell: &[u8]| {
        cell.first().is_some_and(u8::is_ascii_alphabetic)
            && cell.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
    };
    row.len() >= 3 && row.iter().all(name)
}

/// What a CSV file whose header has no `e2e_ms` is, and what the report reads instead.
fn not_records(name: &str, header: &csv::ByteRecord) -> String {
    let columns: Vec<String> = header
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    let has = |c: &str| columns.iter().any(|x| x == c);
    let missing: Vec<&str> = ["ts", "route", "e2e_ms"]
        .into_iter()
        .filter(|c| !has(c))
        .collect();
    let what = if has("concurrency") && has("total_ms") {
        "it looks like a `tokenmeter bench` CSV (one row per request the bench sent)"
    } else {
        "it is not a per-request record file"
    };
    let shown: Vec<&str> = columns.iter().take(6).map(String::as_str).collect();
    format!(
        "{name}: {what}: its header ({}{}) has no {} column; `tokenmeter report` reads the \
         per-request records the proxy writes (its access_log, JSON lines or CSV with ts, route, \
         e2e_ms, ...)",
        shown.join(", "),
        if columns.len() > shown.len() {
            ", ..."
        } else {
            ""
        },
        missing
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What reading `bytes` as a file called `name` gives, without touching the disk.
    fn try_from(name: &str, bytes: &[u8]) -> Result<(Loaded, Vec<Request>), String> {
        let format = detect(Path::new(name), bytes);
        let mut loaded = Loaded::default();
        loaded.sources.push(Source {
            path: name.into(),
            format,
            records: 0,
            malformed: 0,
        });
        let mut requests = Vec::new();
        let mut each = |r| requests.push(r);
        match format {
            Format::Jsonl => read_jsonl(name, bytes, &mut loaded, &mut each).expect("in memory"),
            Format::Csv => read_csv(name, bytes, &mut loaded, &mut each)?,
        }
        Ok((loaded, requests))
    }

    fn loaded_from(name: &str, bytes: &[u8]) -> (Loaded, Vec<Request>) {
        try_from(name, bytes).expect("a record file")
    }

    #[test]
    fn a_bench_csv_is_named_for_what_it_is() {
        let bench = "request_id,concurrency,prompt_tokens,output_tokens,ttft_ms,tpot_ms,total_ms,status,error\n0,1,12,64,80.1,20.2,1400.5,200,\n";
        let e = try_from("bench.csv", bench.as_bytes()).expect_err("not records");
        assert!(
            e.starts_with("bench.csv: it looks like a `tokenmeter bench` CSV"),
            "{e}"
        );
        assert!(e.contains("has no `ts`, `route`, `e2e_ms` column"), "{e}");
        assert!(
            e.contains("reads the per-request records the proxy writes"),
            "{e}"
        );
        assert!(!e.contains("invalid digit"), "{e}");
        let other = try_from("x.csv", b"name,colour,size\nfoo,red,3\n").expect_err("not records");
        assert!(
            other.contains("it is not a per-request record file"),
            "{other}"
        );
    }

    #[test]
    fn csv_with_the_old_columns_and_no_header_reads() {
        let text = "2026-01-01T00:00:00.000Z,r1,chat,llama,POST,/v1/chat/completions,200,ok,good,,stop,7,3,usage,6,0.6,201.4,201.4,60.2,60.4,322.1,1,812\n";
        let (loaded, requests) = loaded_from("old.log", text.as_bytes());
        assert_eq!(loaded.malformed, 0, "{:?}", loaded.problems);
        let f = &requests[0].fields;
        assert_eq!(
            (f.route.as_str(), f.e2e_ms, f.in_flight),
            ("chat", 322.1, Some(1))
        );
        assert_eq!(f.queue_ms, None);
        assert_eq!(loaded.sources[0].format, Format::Csv);
    }

    #[test]
    fn who_served_a_request_reads_from_both_formats_and_old_records_leave_it_unknown() {
        let jsonl = concat!(
            "{\"ts\":\"2026-01-01T00:00:00Z\",\"route\":\"a\",\"e2e_ms\":1,\"pod\":\"p-1\",\"namespace\":\"ns\",\"deployment\":\"chat\"}\n",
            "{\"ts\":\"2026-01-01T00:00:00Z\",\"route\":\"a\",\"e2e_ms\":1,\"pod\":null,\"namespace\":null,\"deployment\":\"chat\"}\n",
            "{\"ts\":\"2026-01-01T00:00:00Z\",\"route\":\"a\",\"e2e_ms\":1}\n",
        );
        let (loaded, requests) = loaded_from("x.jsonl", jsonl.as_bytes());
        assert_eq!(loaded.malformed, 0, "{:?}", loaded.problems);
        let who: Vec<(Option<&str>, Option<String>)> = requests
            .iter()
            .map(|r| (r.fields.pod(), r.fields.deployment()))
            .collect();
        assert_eq!(
            who,
            [
                (Some("p-1"), Some("ns/chat".into())),
                (None, Some("chat".into())),
                (None, None)
            ]
        );
        let csv = "ts,route,e2e_ms,pod,namespace,deployment\n2026-01-01T00:00:00Z,a,1,p-2,,code\n2026-01-01T00:00:00Z,a,1,,,\n";
        let (loaded, requests) = loaded_from("x.csv", csv.as_bytes());
        assert_eq!(loaded.malformed, 0, "{:?}", loaded.problems);
        let f = &requests[0].fields;
        assert_eq!(
            (f.pod(), f.deployment()),
            (Some("p-2"), Some("code".into()))
        );
        let f = &requests[1].fields;
        assert_eq!((f.pod(), f.deployment()), (None, None));
    }

    #[test]
    fn a_bad_cell_names_its_column_and_line() {
        let text = "ts,route,e2e_ms,in_flight\n2026-01-01T00:00:00Z,chat,12,1\n2026-01-01T00:00:01Z,chat,slow,1\n";
        let (loaded, requests) = loaded_from("bad.csv", text.as_bytes());
        assert_eq!(requests.len(), 1);
        let problem = loaded.problems[0].to_string();
        assert!(problem.contains("bad.csv:3: e2e_ms:"), "{problem}");
    }

    #[test]
    fn invalid_utf8_is_one_malformed_line() {
        let mut bytes =
            b"{\"ts\":\"2026-01-01T00:00:00Z\",\"route\":\"a\",\"e2e_ms\":1}\n".to_vec();
        bytes.extend_from_slice(b"\xff\xfe\n");
        bytes.extend_from_slice(
            b"{\"ts\":\"2026-01-01T00:00:01Z\",\"route\":\"a\",\"e2e_ms\":2}\r\n",
        );
        let (loaded, requests) = loaded_from("x", &bytes);
        assert_eq!((requests.len(), loaded.malformed), (2, 1));
        assert_eq!(loaded.problems[0].line, 2);
    }
}
