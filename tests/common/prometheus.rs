//! A real Prometheus for tests: started on loopback over a temporary directory, scraping the
//! targets it is given every second with the rules it is given, killed on drop. Debian's
//! `prometheus` package brings it; tests/run.sh installs it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::time::Instant;

use super::TempDir;

/// One scrape target and the target labels Prometheus gives it (`job` and `namespace` among
/// them, as a PodMonitor or a static config would set them).
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub labels: Vec<(String, String)>,
}

impl Target {
    pub fn new(addr: SocketAddr, labels: &[(&str, &str)]) -> Target {
        Target {
            addr,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

/// A Prometheus started by the test on loopback, killed on drop.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET url`: the status and body, or `None` while nothing answers.
pub async fn get(url: &str) -> Option<(u16, String)> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response = tokio::time::timeout(Duration::from_secs(5), client.get(url.parse().ok()?))
        .await
        .ok()?
        .ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (as job `tokenmeter`) every second with `rules`.
    pub async fn start(target: SocketAddr, rules: &str) -> Prometheus {
        Prometheus::scraping(&[Target::new(target, &[("job", "tokenmeter")])], rules).await
    }

    /// Starts Prometheus scraping every target every second with `rules` loaded (evaluated every
    /// second). The port is found by binding port 0 and releasing it; should another process
    /// take it meanwhile, try again.
    pub async fn scraping(targets: &[Target], rules: &str) -> Prometheus {
        // One static config per target, so each carries its own labels; a `job` label set there
        // overrides the job name, as relabelling would.
        let mut static_configs = String::new();
        for t in targets {
            let labels: Vec<String> = t
                .labels
                .iter()
                .map(|(k, v)| format!("{k}: {}", serde_json::to_string(v).unwrap()))
                .collect();
            static_configs.push_str(&format!(
                "      - {{targets: ['{}'], labels: {{{}}}}}\n",
                t.addr,
                labels.join(", ")
            ));
        }
        for _attempt in 0..5 {
            let dir = TempDir::new();
            std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
            std::fs::write(
                dir.path().join("prometheus.yml"),
                format!(
                    "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [rules.yaml]\nscrape_configs:\n  - job_name: tokenmeter\n    static_configs:\n{static_configs}"
                ),
            )
            .unwrap();
            let addr = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap();
            let log = dir.path().join("prometheus.log");
            let child = Command::new("prometheus")
                .arg(format!(
                    "--config.file={}",
                    dir.path().join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot run prometheus ({e}): install Debian's prometheus package, as tests/run.sh does")
                });
            let mut prometheus = Prometheus {
                child,
                addr,
                log,
                _dir: dir,
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(status) = prometheus.child.try_wait().unwrap() {
                    let log = prometheus.log_text();
                    // The port was taken between our release and Prometheus' bind: try another.
                    assert!(
                        log.contains("address already in use"),
                        "prometheus exited ({status}):\n{log}"
                    );
                    break;
                }
                if let Some((200, _)) = get(&prometheus.url("/-/ready")).await {
                    return prometheus;
                }
                assert!(
                    Instant::now() < deadline,
                    "prometheus not ready in 30 s:\n{}",
                    prometheus.log_text()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("prometheus found no free port in 5 attempts");
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An instant query: each series' labels and value.
    pub async fn query(&self, promql: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let (status, body) = get(&self.url(&format!("/api/v1/query?query={}", url_encode(promql))))
            .await
            .unwrap_or_else(|| panic!("prometheus did not answer {promql}"));
        assert_eq!(status, 200, "{promql}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let labels = serde_json::from_value(s["metric"].clone()).unwrap();
                let value = s["value"][1].as_str().unwrap().parse::<f64>().unwrap();
                (labels, value)
            })
            .collect()
    }

    /// The active (pending or firing) alerts: their labels and state.
    pub async fn alerts(&self) -> Vec<(BTreeMap<String, String>, String)> {
        let (_, body) = get(&self.url("/api/v1/alerts"))
            .await
            .expect("prometheus answers /api/v1/alerts");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    serde_json::from_value(a["labels"].clone()).unwrap(),
                    a["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// The annotations of every active alert named `name`, with its labels.
    pub async fn annotations(
        &self,
        name: &str,
    ) -> Vec<(BTreeMap<String, String>, BTreeMap<String, String>)> {
        let (_, body) = get(&self.url("/api/v1/alerts"))
            .await
            .expect("prometheus answers /api/v1/alerts");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] == name)
            .map(|a| {
                (
                    serde_json::from_value(a["labels"].clone()).unwrap(),
                    serde_json::from_value(a["annotations"].clone()).unwrap(),
                )
            })
            .collect()
    }

    /// Polls `check` (every 200 ms, up to `secs`) until it returns `Some`; fails naming `what`
    /// and the last thing seen otherwise.
    pub async fn until<T, F, Fut>(&self, what: &str, secs: u64, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            match check().await {
                Ok(v) => return v,
                Err(last) => assert!(
                    Instant::now() < deadline,
                    "timed out after {secs} s waiting for {what}; last seen: {last}\nprometheus log:\n{}",
                    self.log_text()
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
