//! The live view end to end: a known load through a proxy, `/stats` read back against what was
//! sent, and the page on `/` rendered by a real headless browser (Debian's chromium), whose DOM
//! must show the same numbers. Chromium is required: without it this test fails, it never skips.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";
/// The sketch's relative accuracy, as `/stats` states it.
const ALPHA: f64 = 0.01;

/// A stream whose first token comes `first_ms` after the head, then two more 20 ms apart.
fn stream(first_ms: u64) -> Script {
    Script {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        chunked: true,
        steps: vec![
            Step::Write(role_chunk()),
            Step::At(Duration::from_millis(first_ms)),
            Step::Write(chat_chunk("a")),
            Step::Wait(Duration::from_millis(20)),
            Step::Write(chat_chunk("b")),
            Step::Wait(Duration::from_millis(20)),
            Step::Write(chat_chunk("c")),
            Step::Write(finish_chunk("stop", Some(3))),
            Step::Write(done()),
            Step::End,
        ],
    }
}

async fn get_json(url: &str) -> Value {
    let r = send(url, "GET", "", &[], false).await;
    assert_eq!(r.status, 200, "{url}");
    serde_json::from_slice(&r.bytes()).unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn route<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["routes"]
        .as_array()
        .and_then(|routes| routes.iter().find(|r| r["route"] == name))
        .unwrap_or_else(|| panic!("route {name} missing in {stats}"))
}

/// numpy's default percentile over exact samples, and the two order statistics it blends.
fn numpy_percentile(sorted: &[f64], p: f64) -> (f64, f64, f64) {
    let h = p * (sorted.len() - 1) as f64;
    let (lo, hi) = (sorted[h.floor() as usize], sorted[h.ceil() as usize]);
    (lo + (h - h.floor()) * (hi - lo), lo, hi)
}

/// The stated bound: `x_lo·(1−α) ≤ q̂ ≤ x_hi·(1+α)`; records are rounded to the microsecond.
fn assert_within_bound(what: &str, estimate: f64, sorted: &[f64], p: f64) {
    let (exact, lo, hi) = numpy_percentile(sorted, p);
    assert!(
        estimate >= lo * (1.0 - ALPHA) - 0.001 && estimate <= hi * (1.0 + ALPHA) + 0.001,
        "{what}: {estimate} outside [{lo}·(1−α), {hi}·(1+α)] (exact {exact}) for {sorted:?}"
    );
}

fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "this test needs a real browser: Debian's `chromium` is not on PATH \
             (install it with `apt-get install chromium`; tests/run.sh does)"
        )
    })
}

/// Runs headless chromium on `url` with `extra` flags, lets the page run for 10 s of virtual
/// time (ten refreshes of `/stats`, two of `/stats/series`) and returns the DOM it then holds.
fn chromium_dom(extra: &[String], url: &str) -> String {
    let profile = TempDir::new();
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .args(["--virtual-time-budget=10000", "--dump-dom", url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromium: {e}"));
    // Read both pipes on their own threads, so a large DOM cannot fill a pipe and stall it.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = pipe.read_to_string(&mut out);
            out
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().expect("chromium's status") {
            break status;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish within 90 s: {}",
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (dom, log) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    assert!(
        status.success() && dom.contains("</html>"),
        "chromium failed ({status}): {log}\n{dom}"
    );
    dom
}

/// The page at `url` as a browser window `width` CSS pixels wide renders it.
fn rendered_dom(url: &str, width: u32) -> String {
    chromium_dom(&[format!("--window-size={width},2000")], url)
}

/// The live page of the admin listener at `admin` (`http://host:port`) rendered `width` CSS
/// pixels wide, for widths below headless chromium's smallest window (500 px): the page runs
/// in a frame of that width, its own copy with `<base>` pointing at the admin listener, and
/// the frame's DOM is copied out once it has run 9 s. Only for tests: the frame's fetches
/// cross origins, so this chromium runs without web security.
fn rendered_dom_narrow(admin: &str, width: u32) -> String {
    let dir = TempDir::new();
    // The detailed tables open, so that they too must fit.
    let page = tokenmeter::LIVE_PAGE
        .replacen("<head>", &format!("<head><base href=\"{admin}/\">"), 1)
        .replacen("id=\"details\">", "id=\"details\" open>", 1);
    assert!(
        page.contains("id=\"details\" open>"),
        "the page has no #details"
    );
    let escaped = page
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let wrapper = format!(
        r#"<!doctype html><html><body style="margin:0"><iframe id="frame" srcdoc="{escaped}" style="width:{width}px;height:2000px;border:0"></iframe><div id="copy"></div>
<script>
setTimeout(() => {{
  const frame = document.getElementById("frame");
  const d = frame.contentDocument;
  document.documentElement.dataset.layout = d.documentElement.dataset.layout || "";
  document.body.dataset.stats = d.body.dataset.stats || "";
  document.getElementById("copy").innerHTML = d.body.innerHTML;
  frame.remove();
}}, 9000);
</script></body></html>"#
    );
    let path = dir.path().join("narrow.html");
    std::fs::write(&path, wrapper).unwrap();
    chromium_dom(
        &[
            "--window-size=1280,2000".into(),
            "--disable-web-security".into(),
        ],
        &format!("file://{}", path.display()),
    )
}

/// The opening tag of the element with `id`.
fn tag<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id} in the rendered page:\n{dom}"));
    let start = dom[..at].rfind('<').expect("inside a tag");
    let end = at + dom[at..].find('>').expect("tag ends");
    &dom[start..end]
}

/// The value of attribute `name` in an opening tag.
fn attr(tag: &str, name: &str) -> Option<String> {
    tag.split(&format!(" {name}=\""))
        .nth(1)
        .and_then(|v| v.split('"').next())
        .map(str::to_string)
}

/// The page's own measurement: nothing wider than the window, which is `width` wide.
fn assert_no_horizontal_overflow(dom: &str, width: u32) {
    let html = &dom[dom.find("<html").expect("an html element")..];
    let html = &html[..html.find('>').unwrap()];
    let layout = attr(html, "data-layout").unwrap_or_else(|| panic!("no data-layout: {html}"));
    let [scroll, inner]: [u32; 2] = layout
        .split(' ')
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{layout}: {e}")))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| panic!("{layout}"));
    assert_eq!(inner, width, "the window is not {width} px wide: {layout}");
    assert!(
        scroll <= inner,
        "at {width} px the page is {scroll} px wide: it overflows horizontally"
    );
}

/// What the page must show, whatever its width: the scoreboard with the route's status and
/// number, the model rows, the over-threshold mark, the charts with their SLO line where the
/// threshold is, the empty route collapsed.
fn assert_page_shows(dom: &str, width: u32) {
    assert!(
        dom.contains("data-stats=\"ok\""),
        "{width} px: the page never loaded /stats:\n{dom}"
    );
    assert_no_horizontal_overflow(dom, width);
    // 10 of 20 good against 99 %: a burn rate of 50 over both windows.
    let row = tag(dom, "board-chat");
    assert_eq!(attr(row, "data-status").as_deref(), Some("broken"), "{row}");
    let status = &dom[dom.find("id=\"board-chat-status\"").unwrap()..];
    assert!(
        status[..status.find("</span>").unwrap()].contains("✕ broken"),
        "{status}"
    );
    assert_eq!(number(dom, "board-chat-attainment"), 0.5);
    assert_eq!(number(dom, "board-chat-in-flight"), 1.0);
    // p99 TTFT ~300 ms against 200 ms: marked, not only coloured.
    let ttft = tag(dom, "board-chat-ttft-p99");
    assert_eq!(attr(ttft, "data-over").as_deref(), Some("true"), "{ttft}");
    let cell = &dom[dom.find("id=\"board-chat-ttft-p99\"").unwrap()..];
    assert!(cell[..cell.find("</td>").unwrap()].contains('▲'), "{cell}");
    // One row per model: the fast one meets the SLO, the slow one fails every request.
    let fast = tag(dom, "board-chat-model-fast");
    let slow = tag(dom, "board-chat-model-slow");
    assert_eq!(attr(fast, "data-status").as_deref(), Some("met"), "{fast}");
    assert_eq!(
        attr(slow, "data-status").as_deref(),
        Some("broken"),
        "{slow}"
    );
    assert_eq!(number(dom, "board-chat-model-fast-attainment"), 1.0);
    assert_eq!(number(dom, "board-chat-model-slow-attainment"), 0.0);
    // The configured route without traffic is one line, in the scoreboard and the tables.
    assert!(
        attr(tag(dom, "board-empty-routes"), "data-routes")
            .unwrap()
            .split(' ')
            .any(|r| r == "default"),
        "{}",
        tag(dom, "board-empty-routes")
    );
    assert_eq!(
        attr(tag(dom, "route-default"), "data-empty").as_deref(),
        Some("true")
    );
    assert!(!dom.contains("id=\"stat-default-1m-requests\""));
    assert!(!dom.contains("id=\"board-default\""));
    // The charts: TTFT with its SLO line at 200 ms, on the chart's own scale.
    for chart in ["ttft", "tpot", "throughput", "in-flight"] {
        tag(dom, &format!("chart-chat-{chart}"));
    }
    let svg = tag(dom, "chart-chat-ttft");
    let num = |tag: &str, name: &str| -> f64 {
        attr(tag, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {tag}"))
    };
    let (y_max, top, bottom) = (
        num(svg, "data-y-max"),
        num(svg, "data-plot-top"),
        num(svg, "data-plot-bottom"),
    );
    let body = &dom[dom.find("id=\"chart-chat-ttft\"").unwrap()..];
    let body = &body[..body.find("</svg>").unwrap()];
    let line = &body[body.find("class=\"slo-line\"").expect("an SLO line")..];
    let line = &format!(" {}", &line[..line.find('>').unwrap()]);
    assert_eq!(num(line, "data-threshold"), 200.0, "{line}");
    let expected = bottom - 200.0 / y_max * (bottom - top);
    assert!(
        (num(line, "y1") - expected).abs() < 0.01 && num(line, "y2") == num(line, "y1"),
        "the SLO line is at y={} not {expected}: {line}",
        num(line, "y1")
    );
    assert!(y_max >= 300.0, "the scale must hold the p99: {svg}");
    assert!(
        body.contains("data-series=\"p99\"") && body.contains("data-series=\"p50\""),
        "{body}"
    );
    let in_flight = &dom[dom.find("id=\"chart-chat-in-flight\"").unwrap()..];
    assert!(
        in_flight[..in_flight.find("</svg>").unwrap()].contains("data-series=\"in flight\""),
        "{in_flight}"
    );
}

/// The `data-value` of the element with `id`, as the DOM holds it.
fn data_value(dom: &str, id: &str) -> String {
    let tag = tag(dom, id);
    attr(tag, "data-value").unwrap_or_else(|| panic!("#{id} has no data-value: {tag}"))
}

fn number(dom: &str, id: &str) -> f64 {
    let v = data_value(dom, id);
    v.parse()
        .unwrap_or_else(|e| panic!("#{id} data-value `{v}` is not a number: {e}"))
}

/// The same number, whether serde printed it or JavaScript did.
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(1.0)
}

/// Ten requests with a first token at ~100 ms and ten at ~300 ms, on a route whose SLO wants
/// TTFT ≤ 200 ms: `/stats` and the rendered page must both say 20 requests, attainment 0.5,
/// ten TTFT violations, and TTFT percentiles within the sketch's bound of the exact ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_page_shows_what_was_sent() {
    chromium();
    let upstream = upstream(|seen: &Seen| {
        let body = String::from_utf8_lossy(&seen.body);
        if body.contains("\"model\":\"hang\"") {
            Script::silent()
        } else {
            stream(if body.contains("\"model\":\"slow\"") {
                300
            } else {
                100
            })
        }
    })
    .await;
    let proxy = proxy(upstream.addr, |c| {
        c.routes = routes("routes:\n  - name: chat\n    match: {path_prefix: /v1/chat/}\n    slo: {ttft: 200ms, objective: 0.99}\n");
    })
    .await;

    let mut load = tokio::task::JoinSet::new();
    for model in ["fast", "slow"] {
        for _ in 0..10 {
            let url = proxy.url(CHAT);
            load.spawn(async move {
                let r = send(&url, "POST", &chat_request(model), &[], false).await;
                assert_eq!(r.status, 200);
            });
        }
    }
    while let Some(done) = load.join_next().await {
        done.unwrap();
    }
    let records = proxy.records(20).await;
    // One more request stays in flight while the page is read; it never finishes before that.
    let url = proxy.url(CHAT);
    let hanging =
        tokio::spawn(async move { send(&url, "POST", &chat_request("hang"), &[], false).await });

    // Every request is in the live view by the time its record is written; allow a moment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let before = loop {
        let stats = get_json(&proxy.admin_url("/stats")).await;
        let chat = route(&stats, "chat");
        if chat["windows"]["1m"]["requests"] == 20 && chat["in_flight"] == 1 {
            break stats;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the live view never counted the 20 requests and the one in flight (is LiveStats::record called at finish?): {stats}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // `/stats` against what was sent.
    let chat = route(&before, "chat");
    assert_eq!(chat["objective"], 0.99);
    assert_eq!(before["windows"], serde_json::json!(["1m", "5m", "1h"]));
    assert_eq!(before["percentile_relative_error"], ALPHA);
    route(&before, "default");
    for window in ["1m", "5m", "1h"] {
        let w = &chat["windows"][window];
        assert_eq!(w["requests"], 20, "{window}: {w}");
        assert_eq!(w["outcomes"]["ok"], 20, "{window}: {w}");
        assert_eq!(
            (w["good"].as_u64(), w["violated"].as_u64()),
            (Some(10), Some(10))
        );
        assert_eq!(w["attainment"], 0.5, "{window}: {w}");
        assert_eq!(w["meets_objective"], false, "{window}: {w}");
        let violations = &w["violations"];
        assert_eq!(violations["ttft"], 10, "{w}");
        for other in ["tpot", "e2e", "max_itl", "error"] {
            assert_eq!(violations[other], 0, "{other}: {w}");
        }
        // The process is younger than every window: rates divide by its age.
        let seconds = w["seconds"].as_f64().unwrap();
        assert!(seconds > 0.0 && seconds < 50.0, "{w}");
        let rate = |n: f64| n / seconds;
        assert!(same(w["requests_per_second"].as_f64().unwrap(), rate(20.0)));
        assert!(same(
            w["output_tokens_per_second"].as_f64().unwrap(),
            rate(60.0)
        ));
        assert!(same(
            w["input_tokens_per_second"].as_f64().unwrap(),
            rate(140.0)
        ));
        assert!(same(
            w["goodput_requests_per_second"].as_f64().unwrap(),
            rate(10.0)
        ));
        assert!(same(
            w["goodput_output_tokens_per_second"].as_f64().unwrap(),
            rate(30.0)
        ));
    }
    let w = &chat["windows"]["1m"];
    let mut ttft: Vec<f64> = records
        .iter()
        .map(|r| r["ttft_ms"].as_f64().unwrap())
        .collect();
    let mut e2e: Vec<f64> = records
        .iter()
        .map(|r| r["e2e_ms"].as_f64().unwrap())
        .collect();
    ttft.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);
    assert!(ttft[9] < 200.0 && ttft[10] >= 300.0, "{ttft:?}");
    for (p, key) in [(0.5, "p50"), (0.95, "p95"), (0.99, "p99")] {
        assert_within_bound("ttft", w["ttft_ms"][key].as_f64().unwrap(), &ttft, p);
        assert_within_bound("e2e", w["e2e_ms"][key].as_f64().unwrap(), &e2e, p);
    }
    let p50 = w["ttft_ms"]["p50"].as_f64().unwrap();
    let p95 = w["ttft_ms"]["p95"].as_f64().unwrap();
    // Linear interpolation halfway between the slowest fast and the fastest slow request.
    assert!(p95 >= 290.0, "{p95}");
    assert!(
        (p50 - (ttft[9] + ttft[10]) / 2.0).abs() <= ALPHA * ttft[10] + 0.001,
        "p50 {p50} is not halfway between {} and {}",
        ttft[9],
        ttft[10]
    );
    // Two gaps of ~20 ms per request.
    let itl = w["itl_ms"]["p50"].as_f64().unwrap();
    assert!((18.0..60.0).contains(&itl), "{itl}");

    // The page, as a browser renders it.
    let page = send(&proxy.admin_url("/"), "GET", "", &[], false).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.headers["content-type"], "text/html; charset=utf-8",
        "{:?}",
        page.headers
    );
    let head = send(&proxy.admin_url("/stats"), "GET", "", &[], false).await;
    assert_eq!(head.headers["content-type"], "application/json");

    // The scoreboard's numbers in `/stats`: the route and each model, judged as the module
    // doc says (10 of 20 good against 0.99 burns 50 times as fast as allowed: broken).
    let board = &chat["scoreboard"];
    assert_eq!(board["status"], "broken", "{board}");
    assert_eq!(
        (board["requests"].as_u64(), board["attainment"].as_f64()),
        (Some(20), Some(0.5))
    );
    assert!(
        (board["burn_rate_5m"].as_f64().unwrap() - 50.0).abs() < 1e-6,
        "{board}"
    );
    assert_eq!(board["errors"], 0);
    assert_eq!(chat["thresholds_ms"]["ttft"], 200.0);
    let model = |name: &str| {
        chat["models"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["model"] == name))
            .unwrap_or_else(|| panic!("model {name} missing in {chat}"))
    };
    assert_eq!(model("fast")["scoreboard"]["status"], "met");
    assert_eq!(model("fast")["scoreboard"]["requests"], 10);
    assert_eq!(model("slow")["scoreboard"]["status"], "broken");
    assert_eq!(model("slow")["scoreboard"]["attainment"], 0.0);
    assert!(
        model("slow")["scoreboard"]["ttft_p99_ms"].as_f64().unwrap() >= ttft[10] * (1.0 - ALPHA)
    );

    // `/stats/series`: the young process's one minute, and the 10 s slots since start, hold
    // the 20 requests; the in-flight level was seen at finishes and at the reads above.
    let series = get_json(&proxy.admin_url("/stats/series")).await;
    let chat_series = route(&series, "chat");
    for (ring, width) in [("minutes", 60), ("ten_seconds", 10)] {
        let points = chat_series[ring]["points"].as_array().unwrap();
        assert_eq!(chat_series[ring]["slot_seconds"], width);
        assert_eq!(points[0]["start"], 0, "{ring}");
        let total: u64 = points.iter().map(|p| p["requests"].as_u64().unwrap()).sum();
        assert_eq!(total, 20, "{ring}: {points:?}");
        assert!(
            points
                .iter()
                .any(|p| p["in_flight_max"].as_i64() >= Some(1)),
            "{ring}: {points:?}"
        );
        let ttft_p99 = points
            .iter()
            .filter_map(|p| p["ttft_p99_ms"].as_f64())
            .fold(0.0, f64::max);
        assert!(ttft_p99 >= ttft[10] * (1.0 - ALPHA), "{ring}: {points:?}");
    }
    assert_eq!(chat_series["thresholds_ms"]["ttft"], 200.0);

    // The page, as a browser renders it: a laptop, a wide screen and a phone.
    let (wide, wider, phone) = (
        tokio::task::spawn_blocking({
            let url = proxy.admin_url("/");
            move || rendered_dom(&url, 1280)
        }),
        tokio::task::spawn_blocking({
            // With the detailed tables open.
            let url = proxy.admin_url("/#details");
            move || rendered_dom(&url, 1400)
        }),
        tokio::task::spawn_blocking({
            let admin = proxy.admin_url("");
            move || rendered_dom_narrow(admin.trim_end_matches('/'), 390)
        }),
    );
    let (dom, wider, phone) = (
        wide.await.unwrap(),
        wider.await.unwrap(),
        phone.await.unwrap(),
    );
    let after = get_json(&proxy.admin_url("/stats")).await;
    assert_page_shows(&dom, 1280);
    assert_page_shows(&wider, 1400);
    for dom in [&wider, &phone] {
        assert!(
            dom.contains("id=\"details\" open"),
            "the tables were not open"
        );
        assert_eq!(number(dom, "stat-chat-1m-requests"), 20.0);
    }
    assert_page_shows(&phone, 390);

    // The detailed tables: the young process's three windows cover the same time, so they
    // are one row, under the 1m ids.
    assert!(
        after["uptime_seconds"].as_f64().unwrap() < 50.0,
        "the test ran too long for its windows to coincide: {after}"
    );
    assert!(dom.contains("data-windows=\"1m 5m 1h\""), "{dom}");
    assert!(!dom.contains("id=\"stat-chat-5m-requests\""));
    let window = "1m";
    let id = |column: &str| format!("stat-chat-{window}-{column}");
    let w = &chat["windows"][window];
    assert_eq!(number(&dom, &id("requests")), 20.0);
    assert_eq!(number(&dom, &id("attainment")), 0.5);
    assert_eq!(number(&dom, &id("violations-ttft")), 10.0);
    assert_eq!(number(&dom, &id("violations-error")), 0.0);
    for key in ["p50", "p95", "p99"] {
        for metric in ["ttft", "e2e"] {
            let shown = number(&dom, &id(&format!("{metric}-{key}")));
            let served = w[format!("{metric}_ms")][key].as_f64().unwrap();
            assert!(
                same(shown, served),
                "{metric} {key}: page {shown}, /stats {served}"
            );
        }
    }
    // Rates fall as the young process ages: the page's lie between two reads of `/stats`.
    let rps = number(&dom, &id("rps"));
    let (hi, lo) = (
        w["requests_per_second"].as_f64().unwrap(),
        route(&after, "chat")["windows"][window]["requests_per_second"]
            .as_f64()
            .unwrap(),
    );
    assert!(lo <= rps && rps <= hi, "page {rps} not in [{lo}, {hi}]");
    let p50_shown = number(&dom, "stat-chat-1m-ttft-p50");
    assert!(ttft[9] < p50_shown && p50_shown < ttft[10], "{p50_shown}");
    // The attainment cell says, in words and mark, that the objective is missed.
    let cell = &dom[dom.find("id=\"stat-chat-1m-attainment\"").unwrap()..];
    let cell = &cell[..cell.find("</td>").unwrap()];
    assert!(
        cell.contains("data-meets=\"false\"") && cell.contains('✗'),
        "{cell}"
    );
    assert_eq!(number(&dom, "stat-chat-in-flight"), 1.0);
    assert_eq!(number(&dom, "stat-chat-objective"), 0.99);
    // Links to what else there is.
    for link in ["href=\"/metrics\"", "href=\"/stats\"", "tokenmeter report"] {
        assert!(dom.contains(link), "{link}");
    }
    hanging.abort();
}

/// The page must say so when `/stats` cannot be reached, instead of showing nothing or stale
/// numbers as if they were current.
#[tokio::test]
async fn the_page_says_when_stats_cannot_be_reached() {
    chromium();
    let dir = TempDir::new();
    let page = dir.path().join("live.html");
    std::fs::write(&page, tokenmeter::LIVE_PAGE).unwrap();
    let url = format!("file://{}", Path::new(&page).display());
    let dom = tokio::task::spawn_blocking(move || rendered_dom(&url, 1280))
        .await
        .unwrap();
    assert!(dom.contains("data-stats=\"unreachable\""), "{dom}");
    let alert = &dom[dom.find("id=\"stats-error\"").expect("the error box")..];
    let alert = &alert[..alert.find("</div>").unwrap()];
    assert!(
        alert.contains("Cannot reach /stats") && !alert.contains("hidden"),
        "{alert}"
    );
}
