//! `tokenmeter bench` against the in-process simulator: its TTFT agrees with the sim's timing
//! model, its CSV has one row per request, a concurrency sweep finds the sim's batch limit as the
//! saturation point, and failed requests are counted rather than ending the run.

use std::time::Duration;

use tokenmeter::loadgen::{self, report, BenchArgs};
use tokenmeter::sim::{self, RunningSim, SimConfig};

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
    BenchArgs {
        url: format!("http://{}/v1/chat/completions", sim.addr)
            .parse()
            .expect("a valid URL"),
        concurrency: concurrency.to_vec(),
        requests,
        prompt_tokens: 16,
        max_tokens,
        model: "sim-llama".into(),
        csv: None,
        slo_ttft: None,
        slo_tpot: None,
        slo_e2e: None,
        timeout: Duration::from_secs(10),
    }
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
    let sweep = loadgen::run(&a).await;
    let level = &sweep.levels[0];
    assert_eq!(level.errors, 0, "{:?}", level.records);

    // The sim counts ceil(bytes / 4) of the message content as prompt tokens.
    let prompt_tokens = loadgen::synthetic_prompt(100).len().div_ceil(4) as u32;
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
    let sweep = loadgen::run(&args(&sim, &[1, 3], 5, 6)).await;
    let path = std::env::temp_dir().join(format!("tokenmeter-bench-{}.csv", std::process::id()));
    report::write_csv(&path, &sweep.levels)?;
    let mut reader = csv::Reader::from_path(&path)?;
    let header: Vec<String> = reader.headers()?.iter().map(String::from).collect();
    assert_eq!(
        header.join(","),
        "request_id,concurrency,prompt_tokens,output_tokens,ttft_ms,tpot_ms,total_ms,status,error,max_itl_ms,token_source"
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
    let mut a = args(&sim, &[1, 2, 4, 8], 8, 8);
    a.prompt_tokens = 4;
    let sweep = loadgen::run(&a).await;
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
    let sweep = loadgen::run(&a).await;
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
        text.contains("no saturation within the levels tried"),
        "{text}"
    );
    Ok(())
}
