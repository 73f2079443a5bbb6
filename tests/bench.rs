//! `tokenmeter bench` against the in-process simulator: its TTFT agrees with the sim's timing
//! model, its CSV has one row per request, a concurrency sweep finds the sim's batch limit as the
//! saturation point, and failed requests are counted rather than ending the run. The open loop
//! sends on its seeded Poisson schedule and finds the rate the sim cannot serve; prompts files,
//! drawn max_tokens, cost, the plot, progress, --level-duration and --compare each do what their
//! flag says. Failures are summed up by cause and fail the run past --max-error-share; the
//! recommendation weighs goodput within the SLO; https, --header, the completions endpoint and
//! --no-stream reach a local TLS server; the plot's x axis is log-2. (The knee on sim sweeps
//! whose answer is known is tests/knee.rs.) Where timing matters, time is paused: the clock moves only to the sim's and
//! bench's own timers, so the figures are exact rather than noisy.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokenmeter::tools::bench::{self, report, BenchArgs, Load, MaxTokens, Target};
use tokenmeter::tools::sim::{self, RunningSim, SimConfig};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn start(tweak: impl FnOnce(&mut SimConfig)) -> std::io::Result<RunningSim> {
    let mut config = SimConfig {
        listen: "127.0.0.1:0".parse().expect("a literal address"),
        prefill_base: Duration::from_millis(1),
        prefill_per_token: Duration::ZERO,
        decode_step: Duration::from_millis(2),
        decode_step_per_request: Duration::ZERO,
        ..SimConfig::default()
    };
    tweak(&mut config);
    sim::start(config).await
}

fn args(sim: &RunningSim, concurrency: &[u32], requests: u32, max_tokens: u32) -> BenchArgs {
    let mut args =
        BenchArgs::new(&format!("http://{}/v1/chat/completions", sim.addr)).expect("a valid URL");
    args.concurrency = concurrency.to_vec();
    args.requests = requests;
    args.prompt_tokens = 16;
    args.max_tokens = MaxTokens::Fixed(max_tokens);
    args.timeout = Duration::from_secs(10);
    args
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tokenmeter-bench-{}-{name}", std::process::id()))
}

// Paused time (as tests/sim.rs does with sockets): the clock only moves to the sim's timers,
// so real timer overshoot and scheduling noise cannot blur the comparison.
#[tokio::test(start_paused = true)]
async fn lone_request_ttft_matches_the_sim_model() -> TestResult {
    let sim = start(|c| {
        c.prefill_base = Duration::from_millis(5);
        c.prefill_per_token = Duration::from_micros(20);
        c.decode_step = Duration::from_millis(4);
        c.decode_step_per_request = Duration::from_millis(1);
    })
    .await?;
    let mut a = args(&sim, &[1], 7, 4);
    a.prompt_tokens = 100;
    let sweep = bench::run(&a).await;
    let level = &sweep.levels[0];
    assert_eq!(level.errors, 0, "{:?}", level.records);

    // The sim counts ceil(bytes / 4) of the message content as prompt tokens.
    let prompt_tokens = bench::synthetic_prompt(100).len().div_ceil(4) as u32;
    assert_eq!(
        level.records[0].prompt_tokens,
        Some(u64::from(prompt_tokens))
    );
    // A lone request is admitted into an empty batch: its first token ends the step that holds
    // its prefill and one decode step of a batch of one; tokio's timer ends it on a whole ms.
    let model = Duration::from_millis(5 + 4 + 1) + Duration::from_micros(20) * prompt_tokens;
    let expected_ms = (model.as_micros() as f64 / 1000.0).ceil();
    let p50 = level.ttft.p50.ok_or("no TTFT measured")?;
    assert!(
        (p50 - expected_ms).abs() <= 1.0,
        "p50 TTFT {p50:.3} ms, the sim's model says {expected_ms} ms"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_has_the_header_and_one_row_per_request() -> TestResult {
    let sim = start(|_| {}).await?;
    let sweep = bench::run(&args(&sim, &[1, 3], 5, 6)).await;
    let path = temp("rows.csv");
    report::write_csv(&path, &sweep.levels)?;
    let mut reader = csv::Reader::from_path(&path)?;
    let header: Vec<String> = reader.headers()?.iter().map(String::from).collect();
    assert_eq!(
        header.join(","),
        "request_id,concurrency,prompt_tokens,output_tokens,ttft_ms,tpot_ms,total_ms,status,error,max_itl_ms,token_source,rate,max_tokens,start_ms,target"
    );
    let rows: Vec<csv::StringRecord> = reader.records().collect::<Result<_, _>>()?;
    std::fs::remove_file(&path)?;
    assert_eq!(rows.len(), 10, "5 requests at each of 2 levels");
    for row in &rows {
        assert_eq!(&row[3], "6", "output_tokens equals --max-tokens: {row:?}");
        assert_eq!(&row[7], "200");
        assert_eq!(&row[8], "", "no error");
        assert_eq!(&row[10], "usage", "the sim reports usage");
        assert!(row[4].parse::<f64>()? > 0.0);
        assert_eq!(&row[11], "", "no rate in a closed loop");
        assert_eq!(&row[12], "6", "the max_tokens asked for");
        assert!(row[13].parse::<f64>()? >= 0.0, "a start time");
        assert_eq!(&row[14], "A");
    }
    let levels: Vec<&str> = rows.iter().map(|r| &r[1]).collect();
    assert_eq!(levels, [["1"; 5], ["3"; 5]].concat());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_names_the_batch_limit_as_saturation() -> TestResult {
    let sim = start(|c| {
        c.max_batch = 2;
        c.decode_step = Duration::from_millis(10);
        c.decode_step_per_request = Duration::from_millis(2);
    })
    .await?;
    // Long enough answers that the moment between two requests of one worker (its round trip
    // and prefill) is a small part of a level, or level 4 outgrows level 2 by that idle time.
    // 20 requests a level: the knee rule's minimum sample.
    let mut a = args(&sim, &[1, 2, 4, 8], report::MIN_LEVEL_SAMPLE as u32, 32);
    a.prompt_tokens = 4;
    let sweep = bench::run(&a).await;
    let tps: Vec<f64> = sweep.levels.iter().map(|l| l.output_tokens_per_s).collect();
    for level in &sweep.levels {
        assert_eq!(level.errors, 0, "{:?}", level.records);
    }
    // Two running requests share a 14 ms step where one had a 12 ms step: throughput nearly
    // doubles from 1 to 2. Past 2 the batch is full, so extra requests only queue: tokens/s stays
    // flat (within 10 %) while TTFT takes the queueing. The knee is level 2.
    assert!(tps[1] > tps[0] * 1.5, "tokens/s by level: {tps:?}");
    assert!(tps[2] < tps[1] * 1.1, "tokens/s by level: {tps:?}");
    assert_eq!(
        report::saturation(&sweep.levels),
        Some(2),
        "tokens/s by level: {tps:?}"
    );
    let text = report::render(&sweep.levels, &a.slo());
    assert!(text.contains("past concurrency 2 "), "{text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_not_fatal() -> TestResult {
    let sim = start(|c| c.fail_rate = 1.0).await?;
    let mut a = args(&sim, &[1, 2], 4, 4);
    a.slo_ttft = Some(Duration::from_secs(5));
    let sweep = bench::run(&a).await;
    assert_eq!(sweep.levels.len(), 2, "every level ran");
    for level in &sweep.levels {
        assert_eq!(level.records.len(), 4);
        assert_eq!(level.errors, 4);
        assert_eq!(level.good, 0, "a failure is never good");
        assert_eq!(level.attainment, 0.0);
        for r in &level.records {
            assert_eq!(r.status, 500);
            assert_eq!(r.error.as_deref(), Some("status 500"));
        }
    }
    let text = report::render(&sweep.levels, &a.slo());
    assert!(text.contains("4 errors"), "{text}");
    assert!(
        text.contains("too few levels with 20 or more successful requests to tell"),
        "{text}"
    );
    Ok(())
}

fn sorted_starts(level: &report::LevelReport) -> Vec<Duration> {
    let mut starts: Vec<Duration> = level.records.iter().map(|r| r.start).collect();
    starts.sort();
    starts
}

#[tokio::test(start_paused = true)]
async fn open_loop_sends_on_the_seeded_poisson_schedule() -> TestResult {
    let sim = start(|c| c.max_batch = 64).await?;
    let mut a = args(&sim, &[1], 200, 2);
    a.rate = vec![50.0];
    a.seed = 7;
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let level = &sweep.levels[0];
    assert_eq!(level.load, Load::Rate(50.0));
    assert_eq!(level.errors, 0, "{:?}", level.records);
    assert_eq!(
        level.capped, 0,
        "1024 in flight is far above what 50/s needs"
    );

    // The schedule the seed gives: request i is due at the sum of the first i + 1 gaps.
    let mut arrivals = bench::workload::Arrivals::new(50.0, 7);
    let mut due = Duration::ZERO;
    for r in &level.records {
        due += arrivals.gap();
        let late = r.start.as_secs_f64() - due.as_secs_f64();
        // tokio's timer wakes on the next whole millisecond, never early.
        assert!(
            (-1e-6..=1.001e-3).contains(&late),
            "request {} sent {late:+.6}s off its due time",
            r.request_id
        );
        assert_eq!(r.rate, Some(50.0));
        assert!(r.concurrency >= 1);
    }
    // 200 exponential gaps with a 20 ms mean: the offered rate is 50/s within sampling error.
    let offered = 200.0 / due.as_secs_f64();
    assert!((40.0..60.0).contains(&offered), "offered {offered:.1}/s");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn open_loop_names_the_rate_the_sim_cannot_serve() -> TestResult {
    let sim = start(|c| {
        c.max_batch = 2;
        c.decode_step = Duration::from_millis(10);
        c.decode_step_per_request = Duration::from_millis(2);
    })
    .await?;
    let mut a = args(&sim, &[1], 40, 8);
    a.prompt_tokens = 4;
    a.rate = vec![3.0, 6.0, 12.0, 48.0];
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let tps: Vec<f64> = sweep.levels.iter().map(|l| l.output_tokens_per_s).collect();
    // A full batch of two takes 14 ms a step for two tokens: at most ~143 tokens/s, ~18
    // requests/s of 8 tokens. Up to 12/s the served tokens/s follows the offered rate; at 48/s
    // it cannot, so requests queue and p99 TTFT climbs. The knee is 12/s.
    let knee = report::knee(&sweep.levels).ok_or(format!("no knee, tokens/s {tps:?}"))?;
    assert_eq!(knee.load, Load::Rate(12.0), "tokens/s by level: {tps:?}");
    let text = report::render(&sweep.levels, &a.slo());
    assert!(text.contains("past 12 requests/s offered"), "{text}");
    assert!(text.contains("rate 48/s: 40 requests"), "{text}");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn max_in_flight_holds_arrivals_back_and_says_so() -> TestResult {
    let sim = start(|c| c.decode_step = Duration::from_millis(10)).await?;
    let mut a = args(&sim, &[1], 20, 4);
    a.rate = vec![1000.0];
    a.max_in_flight = 2;
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let level = &sweep.levels[0];
    assert_eq!(level.records.len(), 20);
    assert!(level.records.iter().all(|r| r.concurrency <= 2));
    assert_eq!(level.concurrency, 2, "the peak in flight is the cap");
    // Requests take ~50 ms and arrive every ~1 ms: all but the first two had to wait.
    assert_eq!(level.capped, 18);
    let text = report::render(&sweep.levels, &a.slo());
    assert!(
        text.contains("18 arrivals waited for a free slot: --max-in-flight 2 capped"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_file_lines_go_in_order_and_cycle() -> TestResult {
    let sim = start(|_| {}).await?;
    let path = temp("prompts.jsonl");
    let long = "x".repeat(40);
    std::fs::write(
        &path,
        format!(
            "{{\"prompt\": \"{long}\"}}\n{{\"messages\": [{{\"role\": \"system\", \"content\": \"yyyyyyyy\"}}, {{\"role\": \"user\", \"content\": \"zzzzzzzzzzzz\"}}], \"max_tokens\": 3}}\n"
        ),
    )?;
    let mut a = args(&sim, &[2], 6, 5);
    a.prompts = Some(path.clone());
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    std::fs::remove_file(&path)?;
    let level = &sweep.levels[0];
    assert_eq!(level.errors, 0, "{:?}", level.records);
    let got: Vec<(u32, Option<u64>, u64, u32)> = level
        .records
        .iter()
        .map(|r| (r.request_id, r.prompt_tokens, r.output_tokens, r.max_tokens))
        .collect();
    // The sim counts ceil(content bytes / 4): 40 bytes -> 10 tokens, 8 + 12 bytes -> 5 tokens.
    // The second line's own max_tokens (3) overrides --max-tokens (5).
    let first = (Some(10), 5, 5);
    let second = (Some(5), 3, 3);
    let want: Vec<(u32, Option<u64>, u64, u32)> = (0..6)
        .map(|i| {
            let (p, o, m) = if i % 2 == 0 { first } else { second };
            (i, p, o, m)
        })
        .collect();
    assert_eq!(got, want);
    Ok(())
}

#[test]
fn a_bad_prompts_line_stops_bench_before_it_starts() -> TestResult {
    let path = temp("bad.jsonl");
    std::fs::write(&path, "{\"prompt\": \"fine\"}\n{\"prompt\": \"cut\n")?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(["bench", "--url", "http://127.0.0.1:9", "--prompts"])
        .arg(&path)
        .output()?;
    std::fs::remove_file(&path)?;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr)?;
    assert!(
        stderr.starts_with(&format!("tokenmeter: {}:2: not JSON", path.display())),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(out.stdout.is_empty(), "no report: nothing ran");

    // Open and closed loop at once cannot both be meant.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args([
            "bench",
            "--url",
            "http://127.0.0.1:9",
            "--rate",
            "5",
            "--concurrency",
            "2",
        ])
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr)?.contains("cannot be used with"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drawn_max_tokens_are_seeded_and_honoured() -> TestResult {
    let sim = start(|_| {}).await?;
    let mut a = args(&sim, &[1, 3], 12, 1);
    a.max_tokens = "uniform:2-12".parse()?;
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let asked =
        |l: &report::LevelReport| l.records.iter().map(|r| r.max_tokens).collect::<Vec<_>>();
    for level in &sweep.levels {
        assert_eq!(level.errors, 0);
        for r in &level.records {
            assert!((2..=12).contains(&r.max_tokens), "{r:?}");
            assert_eq!(
                r.output_tokens,
                u64::from(r.max_tokens),
                "the sim honours it"
            );
        }
    }
    let first = asked(&sweep.levels[0]);
    let mut distinct = first.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() >= 4, "drawn, not fixed: {first:?}");
    assert_eq!(
        first,
        asked(&sweep.levels[1]),
        "request i asks the same at every level"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_is_the_hourly_price_over_what_the_hour_serves() -> TestResult {
    let sim = start(|_| {}).await?;
    let mut a = args(&sim, &[1, 2], 6, 8);
    a.cost_per_hour = Some(3.6);
    a.currency = "EUR".into();
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let price = a.cost().ok_or("a price was given")?;
    for level in &sweep.levels {
        let (per_request, per_million) = level.cost(&price).ok_or("something was served")?;
        // 3.6 an hour is 0.001 a second: a request costs 0.001 × its share of the wall time.
        let secs_per_request = level.wall.as_secs_f64() / level.records.len() as f64;
        assert!((per_request / (0.001 * secs_per_request) - 1.0).abs() < 1e-9);
        assert!((per_million * level.output_tokens_per_s / 1000.0 - 1.0).abs() < 1e-9);
    }
    let text = report::render_sweep(&sweep, &a);
    assert!(text.contains("EUR per million output tokens"), "{text}");
    assert!(
        text.contains("recommendation: concurrency 2: cheapest per successful request")
            && text.contains("(no SLO given"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plot_draws_the_curves_into_an_svg() -> TestResult {
    let sim = start(|_| {}).await?;
    let sweep = bench::run_with(&args(&sim, &[1, 2, 4], 4, 4), &bench::progress::Silent).await;
    let path = temp("curve.svg");
    bench::plot::write_svg(&path, &sweep)?;
    let svg = std::fs::read_to_string(&path)?;
    std::fs::remove_file(&path)?;
    assert!(
        svg.trim_start().starts_with("<svg"),
        "{}",
        &svg[..80.min(svg.len())]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    for label in [
        "TTFT p50 (ms)",
        "TTFT p99 (ms)",
        "output tokens/s",
        "concurrency",
    ] {
        assert!(svg.contains(label), "no {label}");
    }
    // Three curves of three points each.
    assert!(svg.matches("<polyline").count() >= 3, "{svg}");
    Ok(())
}

// Issue 38: on a linear axis levels 1, 2, 4 and 8 of a sweep to 64 were crushed together; on a
// log-2 axis each doubling is the same width. The SLO is drawn, and the colours are
// Okabe-Ito's (no red against green).
#[tokio::test(start_paused = true)]
async fn plot_has_a_log2_axis_the_slo_line_and_colour_blind_safe_colours() -> TestResult {
    let sim = start(|_| {}).await?;
    let mut a = args(&sim, &[1, 2, 4, 8, 64], 2, 2);
    a.slo_ttft = Some(Duration::from_millis(40));
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let path = temp("log2.svg");
    bench::plot::write_svg_with(&path, &sweep, &a.slo())?;
    let svg = std::fs::read_to_string(&path)?;
    std::fs::remove_file(&path)?;
    assert!(svg.contains("SLO: TTFT 40 ms"), "{svg}");
    // Ticks at the doublings, labelled as the loads themselves.
    let labels: Vec<&str> = svg
        .split("</text>")
        .filter_map(|t| Some(t.rsplit_once('>')?.1.trim()))
        .collect();
    for tick in ["1", "2", "4", "8", "16", "32", "64"] {
        assert!(labels.contains(&tick), "no tick {tick}: {labels:?}");
    }
    let upper = svg.to_ascii_uppercase();
    for okabe_ito in ["#0072B2", "#D55E00", "#009E73"] {
        assert!(upper.contains(okabe_ito), "no {okabe_ito}");
    }
    for pure in ["#FF0000", "#00FF00"] {
        assert!(!upper.contains(pure), "{pure} is not colour-blind safe");
    }
    // TTFT p50's points: x of 1, 2, 4 and 8 equally spaced, 64 three gaps further on.
    let xs: Vec<f64> = svg
        .split("<polyline")
        .filter(|l| l.contains("stroke=\"#0072B2\""))
        .filter_map(|l| l.split("points=\"").nth(1)?.split('"').next())
        .map(|points| {
            points
                .split_whitespace()
                .filter_map(|p| p.split(',').next()?.parse().ok())
                .collect::<Vec<f64>>()
        })
        .max_by_key(Vec::len)
        .ok_or("a TTFT p50 curve")?;
    assert_eq!(xs.len(), 5, "{xs:?}");
    let gap = xs[1] - xs[0];
    assert!(gap > 50.0, "{xs:?}");
    for w in xs.windows(2).take(3) {
        assert!((w[1] - w[0] - gap).abs() <= 1.0, "{xs:?}");
    }
    assert!((xs[4] - xs[3] - 3.0 * gap).abs() <= 2.0, "{xs:?}");
    Ok(())
}

/// Notes every call, in order.
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<String>>,
    done: AtomicU32,
}

impl bench::Progress for Recording {
    fn level_started(&self, label: &str, total: u32) {
        self.calls
            .lock()
            .expect("lock")
            .push(format!("start {label} {total}"));
    }
    fn request_done(&self, _: &bench::Record) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }
    fn level_finished(&self, report: &report::LevelReport) {
        let done = self.done.swap(0, Ordering::Relaxed);
        self.calls.lock().expect("lock").push(format!(
            "finish {} {} after {done}",
            report.load.label(),
            report.records.len()
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_hears_every_level_and_request() -> TestResult {
    let sim = start(|_| {}).await?;
    let progress = Recording::default();
    bench::run_with(&args(&sim, &[1, 3], 5, 2), &progress).await;
    let calls = progress.calls.lock().map_err(|_| "poisoned")?.clone();
    assert_eq!(
        calls,
        [
            "start c=1 5",
            "finish c=1 5 after 5",
            "start c=3 5",
            "finish c=3 5 after 5"
        ]
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn level_duration_stops_new_requests_and_lets_the_rest_finish() -> TestResult {
    let sim = start(|c| c.decode_step = Duration::from_millis(10)).await?;
    let limit = Duration::from_millis(300);
    let mut a = args(&sim, &[2], 100_000, 4);
    a.level_duration = Some(limit);
    let closed = bench::run_with(&a, &bench::progress::Silent).await;
    a.rate = vec![100.0];
    let open = bench::run_with(&a, &bench::progress::Silent).await;
    for level in closed.levels.iter().chain(&open.levels) {
        // A request here takes about 50 ms: in 300 ms a handful, never the 100,000 asked.
        assert!(
            (4..100).contains(&level.records.len()),
            "{}: {} requests",
            level.load,
            level.records.len()
        );
        assert_eq!(level.errors, 0, "in-flight requests finished, not cut");
        assert!(sorted_starts(level).iter().all(|s| *s < limit));
        assert!(level.wall >= limit - Duration::from_millis(50));
        assert!(
            level.wall < limit + Duration::from_millis(200),
            "{:?}",
            level.wall
        );
    }
    Ok(())
}

/// `--stagger`: a level's concurrent requests start one step apart, not together; each one
/// that ends is followed at once by the next, as without it.
#[tokio::test(start_paused = true)]
async fn stagger_starts_a_levels_requests_one_step_apart() -> TestResult {
    // 16 tokens of 50 ms: a request outlasts the three steps of the ramp.
    let sim = start(|c| c.decode_step = Duration::from_millis(50)).await?;
    let step = Duration::from_millis(100);
    let mut a = args(&sim, &[4], 8, 16);
    a.stagger = Some(step);
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let level = &sweep.levels[0];
    assert_eq!((level.records.len(), level.errors), (8, 0));
    let mut by_slot: Vec<_> = level.records.iter().collect();
    by_slot.sort_by_key(|r| r.request_id);
    let ms = |d: Duration| d.as_millis();
    let first: Vec<u128> = by_slot[..4].iter().map(|r| ms(r.start)).collect();
    assert_eq!(first, [0, 100, 200, 300]);
    // The rest replace the ones that ended: never more than four in flight, and the fifth
    // follows the first.
    let first_end = by_slot[0].start + by_slot[0].e2e;
    assert!(by_slot[4].start >= first_end, "{:?}", by_slot[4].start);
    // Without it, all four go at once.
    a.stagger = None;
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let starts: Vec<u128> = sorted_starts(&sweep.levels[0])
        .iter()
        .map(|d| ms(*d))
        .collect();
    assert_eq!(starts[..4], [0, 0, 0, 0]);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn compare_reports_the_added_prefill_of_b() -> TestResult {
    let sim_a = start(|_| {}).await?;
    let sim_b = start(|c| c.prefill_base = Duration::from_millis(21)).await?;
    let mut a = args(&sim_a, &[1, 4], 20, 4);
    a.compare = Some(bench::server_url(&format!("http://{}", sim_b.addr))?);
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    assert_eq!(sweep.compared.len(), 2);
    for (la, lb) in sweep.levels.iter().zip(&sweep.compared) {
        assert_eq!((la.target, lb.target), (Target::A, Target::B));
        assert_eq!((la.records.len(), lb.records.len()), (20, 20));
        assert_eq!((la.errors, lb.errors), (0, 0));
        let max_tokens =
            |l: &report::LevelReport| l.records.iter().map(|r| r.max_tokens).collect::<Vec<_>>();
        assert_eq!(max_tokens(la), max_tokens(lb), "the same requests");
        // Never less than B's extra prefill; past one request at a time more, because in the
        // sim a request's prefill also delays the requests running beside it.
        let added = lb.ttft.p50.ok_or("TTFT")? - la.ttft.p50.ok_or("TTFT")?;
        assert!(added >= 19.0, "{}: added TTFT p50 {added:.3} ms", la.load);
    }
    // One request at a time: B's first token comes exactly 20 ms of prefill later, and its
    // tokens are spaced as A's.
    let (la, lb) = (&sweep.levels[0], &sweep.compared[0]);
    let added = |f: fn(&report::LevelReport) -> Option<f64>| -> Result<f64, String> {
        Ok(f(lb).ok_or("B")? - f(la).ok_or("A")?)
    };
    for (name, value, want) in [
        ("TTFT p50", added(|l| l.ttft.p50)?, 20.0),
        ("TTFT p99", added(|l| l.ttft.p99)?, 20.0),
        ("ITL p50", added(|l| l.itl.p50)?, 0.0),
        ("ITL p99", added(|l| l.itl.p99)?, 0.0),
    ] {
        assert!(
            (value - want).abs() <= 1.0,
            "added {name} {value:.3} ms, want {want}"
        );
    }
    // Interleaved: A, B, then B, A, so neither is always second.
    let mut order: Vec<(Duration, Target)> = la
        .records
        .iter()
        .chain(&lb.records)
        .map(|r| (r.start, r.target))
        .collect();
    order.sort_by_key(|o| o.0);
    let targets: Vec<Target> = order.iter().take(8).map(|o| o.1).collect();
    use Target::{A, B};
    assert_eq!(targets, [A, B, B, A, A, B, B, A]);
    let text = report::render_sweep(&sweep, &a);
    assert!(text.contains("added (B - A)"), "{text}");
    assert!(text.contains("B: http://"), "{text}");
    Ok(())
}

/// A port on this machine with nothing listening: bound, then released.
fn closed_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn bench_cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("bench")
        .args(args)
        .output()
        .expect("tokenmeter runs")
}

// Issue 38: with nothing listening, bench printed "3 errors" and exited 0; a CI job could not
// tell a dead server from a fast one, and the reason was only in the CSV.
#[test]
fn nothing_listening_prints_the_causes_and_exits_1() -> TestResult {
    let url = format!("http://127.0.0.1:{}", closed_port()?);
    let out = bench_cli(&["--url", &url, "--concurrency", "1,2", "--requests", "3"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("errors: 6 of 6 requests failed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("     6  connection refused (first: connection refused: "),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "failed requests above --max-error-share 5 % at concurrency 1 (100 % failed), concurrency 2 (100 % failed)"
        ),
        "{stderr}"
    );
    // The gate is the flag's: allowing every request to fail, the same run exits 0.
    let out = bench_cli(&[
        "--url",
        &url,
        "--concurrency",
        "1",
        "--requests",
        "2",
        "--max-error-share",
        "1",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = bench_cli(&["--url", &url, "--max-error-share", "5"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("`5` is not a share"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_summary_groups_by_cause_and_the_gate_counts_each_level() -> TestResult {
    let sim = start(|c| c.fail_rate = 0.5).await?;
    let a = args(&sim, &[1, 2], 20, 2);
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let failed: usize = sweep.levels.iter().map(|l| l.errors).sum();
    assert!(failed > 0 && failed < 40, "about half fail: {failed}");
    let text = report::render_sweep(&sweep, &a);
    assert!(
        text.contains(&format!("errors: {failed} of 40 requests failed")),
        "{text}"
    );
    assert!(
        text.contains(&format!("{failed:>6}  HTTP status 500 (first: status 500)")),
        "{text}"
    );
    // Each level is judged on its own share against the threshold.
    let share = |l: &report::LevelReport| l.errors as f64 / 20.0;
    let failing = report::failing_levels(&sweep.levels, 0.05);
    assert_eq!(
        failing.len(),
        sweep.levels.iter().filter(|l| share(l) > 0.05).count()
    );
    assert!(report::failing_levels(&sweep.levels, 1.0).is_empty());
    Ok(())
}

// Issue 38: bench recommended "cheapest at concurrency 16" for a level where 25 % of requests
// met the SLO. Cheap requests that miss the SLO are not what is bought: the recommendation
// weighs goodput, among levels that meet the SLO, and says so when none does.
#[tokio::test(start_paused = true)]
async fn the_recommendation_is_the_most_goodput_within_the_slo() -> TestResult {
    let sim = start(|c| {
        c.max_batch = 2;
        c.decode_step = Duration::from_millis(10);
        c.decode_step_per_request = Duration::from_millis(2);
    })
    .await?;
    let mut a = args(&sim, &[1, 2, 8], 20, 8);
    a.prompt_tokens = 4;
    a.cost_per_hour = Some(3.6);
    // Two run at once; at 8 users six queue for whole answers (8 tokens of 14 ms steps), so
    // most of level 8 waits far past 60 ms for its first token while 1 and 2 never wait.
    a.slo_ttft = Some(Duration::from_millis(60));
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let attainment: Vec<f64> = sweep.levels.iter().map(|l| l.attainment).collect();
    assert!(
        attainment[1] >= 0.9 && attainment[2] < 0.5,
        "{attainment:?}"
    );
    let price = a.cost().ok_or("priced")?;
    let raw = |i: usize| sweep.levels[i].cost(&price).map_or(f64::MAX, |c| c.0);
    assert!(
        raw(2) <= raw(1) * 1.05,
        "per request served, 8 users cost no more than 2"
    );
    let text = report::render_sweep(&sweep, &a);
    assert!(
        text.contains("recommendation: concurrency 2: the most goodput")
            && text.contains("within the SLO (objective 90 %)")
            && text.contains("USD per good request"),
        "{text}"
    );
    // A good request at level 8 costs what a served one does over its attainment.
    let (good, _) = sweep.levels[2]
        .good_cost(&price, &a.slo())
        .ok_or("level 8 had good requests")?;
    assert!((good * attainment[2] / raw(2) - 1.0).abs() < 1e-9);

    a.slo_ttft = Some(Duration::from_millis(5));
    let strict = report::render_sweep(&sweep, &a);
    assert!(
        strict.contains("recommendation: none: no level meets the SLO for 90 % of requests"),
        "{strict}"
    );
    Ok(())
}

/// An https server made for one test: TLS with a self-signed certificate for 127.0.0.1
/// (generated now), forwarding the decrypted bytes to `upstream`; it keeps the head of the
/// first request of each connection.
struct TlsFront {
    addr: std::net::SocketAddr,
    ca_pem: std::path::PathBuf,
    heads: std::sync::Arc<Mutex<Vec<String>>>,
}

async fn tls_front(
    upstream: std::net::SocketAddr,
    name: &str,
) -> Result<TlsFront, Box<dyn std::error::Error>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])?;
    let ca_pem = temp(&format!("{name}-ca.pem"));
    std::fs::write(&ca_pem, certified.cert.pem())?;
    #[allow(deprecated)] // ring, as bench itself uses (see src/tools/bench/tls.rs)
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.key_pair.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let heads = std::sync::Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if server.write_all(&head).await.is_err() {
                    return;
                }
                if let Ok(mut heads) = seen.lock() {
                    heads.push(String::from_utf8_lossy(&head).into_owned());
                }
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
            });
        }
    });
    Ok(TlsFront {
        addr,
        ca_pem,
        heads,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_completions_unstreamed_with_headers() -> TestResult {
    let sim = start(|_| {}).await?;
    let front = tls_front(sim.addr, "https").await?;
    let mut a = BenchArgs::new(&format!("https://{}", front.addr)).map_err(|e| e.to_string())?;
    a.concurrency = vec![2];
    a.requests = 4;
    a.prompt_tokens = 8;
    a.max_tokens = MaxTokens::Fixed(5);
    a.endpoint = Some(bench::Endpoint::Completions);
    a.no_stream = true;
    a.ca_cert = Some(front.ca_pem.clone());
    for h in [
        "Authorization: Bearer sk-test",
        "x-tier: gold",
        "X-Tier: silver",
    ] {
        a.headers.push(bench::parse_header(h)?);
    }
    let sweep = bench::run_with(&a, &bench::progress::Silent).await;
    let level = &sweep.levels[0];
    assert_eq!(level.errors, 0, "{:?}", level.records);
    for r in &level.records {
        assert_eq!(r.output_tokens, 5, "the body's usage: {r:?}");
        // Unstreamed, the first token arrives with the whole body: TTFT is that moment, just
        // before E2E ends, and there is no pace of tokens to measure.
        let ttft = r.ttft.ok_or("a TTFT")?;
        assert!(
            ttft <= r.e2e && ttft * 10 >= r.e2e * 9,
            "{ttft:?} of {:?}",
            r.e2e
        );
        assert_eq!((r.tpot, r.itl.len()), (None, 0));
    }
    let heads = front.heads.lock().map_err(|_| "poisoned")?.clone();
    assert!(!heads.is_empty());
    for head in &heads {
        let lower = head.to_ascii_lowercase();
        assert!(
            head.starts_with("POST /v1/completions HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            lower.contains("\r\nauthorization: bearer sk-test\r\n"),
            "{head}"
        );
        assert!(
            lower.contains("\r\nx-tier: gold\r\n") && lower.contains("\r\nx-tier: silver\r\n"),
            "{head}"
        );
        assert!(lower.contains("\r\naccept: application/json\r\n"), "{head}");
    }

    // Without the CA the self-signed certificate is refused, and said so; --insecure takes it.
    a.ca_cert = None;
    let refused = bench::run_with(&a, &bench::progress::Silent).await;
    let causes = report::error_causes(&refused.levels);
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!(causes[0].0, "connect failed", "{causes:?}");
    assert!(causes[0].2.contains("UnknownIssuer"), "{causes:?}");
    a.insecure = true;
    let accepted = bench::run_with(&a, &bench::progress::Silent).await;
    assert_eq!(
        accepted.levels[0].errors, 0,
        "{:?}",
        accepted.levels[0].records
    );
    let _ = std::fs::remove_file(&front.ca_pem);
    Ok(())
}

#[test]
fn bad_headers_urls_and_ca_files_are_one_line_errors() {
    for (args, says) in [
        (
            vec!["-H", "no colon"],
            "is not a header: write 'Name: value'",
        ),
        (vec!["-H", "bad name: x"], "`bad name` is not a header name"),
        (
            vec!["--compare", "ftp://host"],
            "must be an http:// or https:// URL",
        ),
        (
            vec!["--ca-cert", "/nonexistent.pem"],
            "--ca-cert /nonexistent.pem:",
        ),
    ] {
        let mut all = vec!["--url", "https://127.0.0.1:9", "--requests", "1"];
        all.extend(args);
        let out = bench_cli(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {stderr}");
        assert!(stderr.contains(says), "{all:?}: {stderr}");
    }
}
