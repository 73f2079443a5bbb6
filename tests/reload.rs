//! Hot reload: a valid file is swapped in atomically, an invalid one is refused while the old one
//! keeps serving, requests in flight keep the route and SLO they started with, and a change of
//! the file (a Kubernetes ConfigMap's `..data` symlink swap included) is noticed on its own.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use tokenmeter::Config;
use tokenmeter::Reloaded;
use tokenmeter::Running;

const CHAT: &str = "/v1/chat/completions";

fn config_text(upstream: std::net::SocketAddr, records: &Path, routes: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{upstream}\n\
         access_log: {{path: {}, format: jsonl}}\nreload: {{watch_interval: 50ms}}\nroutes:\n{routes}",
        records.display()
    )
}

async fn start(path: &Path) -> Running {
    let config = Config::load(path).unwrap();
    tokenmeter::start(config, Some(path.to_path_buf()), Default::default())
        .await
        .unwrap()
}

fn metrics(running: &Running) -> String {
    running.metrics_text()
}

/// Waits until the metrics show `needle`, for changes the watcher makes on its own.
async fn wait_for_metric(running: &Running, needle: &str) {
    eventually(needle, || metrics(running).contains(needle)).await;
}

fn chat_stream() -> Script {
    Script::stream(
        "text/event-stream",
        vec![
            role_chunk(),
            chat_chunk("a"),
            finish_chunk("stop", Some(1)),
            done(),
        ],
    )
}

#[tokio::test]
async fn a_valid_file_is_swapped_in_and_an_invalid_one_refused() {
    let upstream = upstream(|_| chat_stream()).await;
    let dir = TempDir::new();
    let (path, records) = (dir.path().join("tm.yaml"), dir.path().join("records.jsonl"));
    std::fs::write(
        &path,
        config_text(
            upstream.addr,
            &records,
            "  - name: first\n    match: {path_prefix: /v1/}\n",
        ),
    )
    .unwrap();
    let running = start(&path).await;
    let url = format!("http://{}{CHAT}", running.listen);
    send(&url, "POST", &chat_request("m"), &[], false).await;

    std::fs::write(
        &path,
        config_text(
            upstream.addr,
            &records,
            "  - name: second\n    match: {path_prefix: /v1/}\n    slo: {ttft: 5s}\n",
        ),
    )
    .unwrap();
    assert_eq!(running.reload_config().unwrap(), Reloaded::Swapped);
    send(&url, "POST", &chat_request("m"), &[], false).await;

    // Not YAML: refused, and the second configuration keeps serving.
    std::fs::write(&path, "routes: [\n").unwrap();
    let error = running.reload_config().unwrap_err().to_string();
    assert!(error.contains("tm.yaml"), "{error}");
    send(&url, "POST", &chat_request("m"), &[], false).await;

    let r = wait_for_records(&records, 3).await;
    let routes: Vec<_> = r.iter().map(|r| r["route"].as_str().unwrap()).collect();
    assert_eq!(routes, ["first", "second", "second"]);
    assert_eq!(r[1]["slo"], "good");
    let m = metrics(&running);
    assert!(
        m.contains("tokenmeter_config_reloads_total{result=\"success\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tokenmeter_config_reloads_total{result=\"error\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tokenmeter_slo_threshold_seconds{criterion=\"ttft\",route=\"second\"} 5"),
        "{m}"
    );
    assert!(
        m.contains("tokenmeter_config_last_reload_success_timestamp_seconds"),
        "{m}"
    );
}

/// A reload must never change the route or SLO of a request already in flight.
#[tokio::test]
async fn requests_in_flight_keep_the_slo_they_started_with() {
    let upstream = upstream(|_| {
        let mut s = chat_stream();
        s.steps.insert(0, Step::Wait(Duration::from_millis(300)));
        s
    })
    .await;
    let dir = TempDir::new();
    let (path, records) = (dir.path().join("tm.yaml"), dir.path().join("records.jsonl"));
    let lenient = "  - name: chat\n    match: {path_prefix: /v1/}\n    slo: {ttft: 10s}\n";
    std::fs::write(&path, config_text(upstream.addr, &records, lenient)).unwrap();
    let running = start(&path).await;
    let url = format!("http://{}{CHAT}", running.listen);
    let slow =
        tokio::spawn(async move { send(&url, "POST", &chat_request("m"), &[], false).await });
    wait_for_metric(&running, "tokenmeter_in_flight_requests{route=\"chat\"} 1").await;
    let strict = "  - name: chat\n    match: {path_prefix: /v1/}\n    slo: {ttft: 10ms}\n";
    std::fs::write(&path, config_text(upstream.addr, &records, strict)).unwrap();
    assert_eq!(running.reload_config().unwrap(), Reloaded::Swapped);
    slow.await.unwrap();
    let r = &wait_for_records(&records, 1).await[0];
    assert!(r["ttft_ms"].as_f64().unwrap() > 10.0);
    assert_eq!(r["slo"], "good", "judged by the SLO it started with: {r}");
}

/// Kubernetes updates a mounted ConfigMap by writing a new timestamped directory and swapping
/// the `..data` symlink; the watcher must notice through the symlinks.
#[tokio::test]
async fn a_configmap_symlink_swap_is_noticed() {
    use std::os::unix::fs::symlink;
    let upstream = upstream(|_| chat_stream()).await;
    let dir = TempDir::new();
    let records = dir.path().join("records.jsonl");
    let mount = dir.path().join("mount");
    std::fs::create_dir_all(mount.join("..2026_01_01_00_00_00.1")).unwrap();
    std::fs::write(
        mount.join("..2026_01_01_00_00_00.1/tokenmeter.yaml"),
        config_text(upstream.addr, &records, "  - name: before\n"),
    )
    .unwrap();
    symlink("..2026_01_01_00_00_00.1", mount.join("..data")).unwrap();
    symlink("..data/tokenmeter.yaml", mount.join("tokenmeter.yaml")).unwrap();
    let running = start(&mount.join("tokenmeter.yaml")).await;

    std::fs::create_dir_all(mount.join("..2026_01_01_00_01_00.2")).unwrap();
    std::fs::write(
        mount.join("..2026_01_01_00_01_00.2/tokenmeter.yaml"),
        config_text(
            upstream.addr,
            &records,
            "  - name: after\n    slo: {e2e: 9s}\n",
        ),
    )
    .unwrap();
    // The swap is atomic: a new symlink renamed over the old one, as the kubelet does.
    symlink("..2026_01_01_00_01_00.2", mount.join("..data_tmp")).unwrap();
    std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
    wait_for_metric(
        &running,
        "tokenmeter_config_reloads_total{result=\"success\"} 1",
    )
    .await;
    assert!(metrics(&running)
        .contains("tokenmeter_slo_threshold_seconds{criterion=\"e2e\",route=\"after\"} 9"));
    send(
        &format!("http://{}{CHAT}", running.listen),
        "POST",
        &chat_request("m"),
        &[],
        false,
    )
    .await;
    let r = &wait_for_records(&records, 1).await[0];
    assert_eq!(r["route"], "after");

    // A broken edit is noticed too, counted, and changes nothing.
    std::fs::create_dir_all(mount.join("..2026_01_01_00_02_00.3")).unwrap();
    std::fs::write(
        mount.join("..2026_01_01_00_02_00.3/tokenmeter.yaml"),
        "timeouts: {drain: forever}\n",
    )
    .unwrap();
    symlink("..2026_01_01_00_02_00.3", mount.join("..data_tmp")).unwrap();
    std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
    wait_for_metric(
        &running,
        "tokenmeter_config_reloads_total{result=\"error\"} 1",
    )
    .await;
    assert_eq!(running.config().routes[0].name, "after");
}

/// The listen address cannot move without a restart: a reload keeps serving where it was.
#[tokio::test]
async fn a_new_listen_address_waits_for_a_restart() {
    let upstream = upstream(|_| chat_stream()).await;
    let dir = TempDir::new();
    let (path, records) = (dir.path().join("tm.yaml"), dir.path().join("records.jsonl"));
    std::fs::write(&path, config_text(upstream.addr, &records, "  - name: a\n")).unwrap();
    let running = start(&path).await;
    let before = running.config().listen;
    let moved = config_text(upstream.addr, &records, "  - name: b\n")
        .replace("listen: 127.0.0.1:0", "listen: 127.0.0.1:1");
    std::fs::write(&path, moved).unwrap();
    assert_eq!(running.reload_config().unwrap(), Reloaded::Swapped);
    let after = running.config();
    assert_eq!(after.listen, before);
    assert_eq!(after.routes[0].name, "b");
    let got = send(
        &format!("http://{}/v1/models", running.listen),
        "GET",
        "",
        &[],
        false,
    )
    .await;
    assert!(got.status < 500);
}
