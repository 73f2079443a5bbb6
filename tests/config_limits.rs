//! Hostile configuration files. `tokenmeter check`, the start and a reload refuse what would
//! hurt the process, fast, in one short line naming the file and the problem, and a refused
//! reload never stops the old configuration from serving. What must never happen again: a
//! file of aliases under ConfigMap's 1 MiB growing the proxy to 2.7 GB until it aborts,
//! 100,000 nested brackets taking 21 s to refuse, `/dev/zero` read for 1 GB, a FIFO hanging
//! the reader, a 100 MB string echoed back as a 100 MB "line", and `check --config
//! /etc/shadow` printing a password hash.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use tokenmeter::{Config, Running};
use tokio::time::Instant;

/// The address space a `check` may use. The debug binary itself runs in under 50 MB of it and
/// the largest configuration the limits let any file expand into is about 14 MiB; before the
/// limits, the bombs below needed gigabytes and died.
const ADDRESS_SPACE_KIB: u64 = 256 * 1024;
/// How long a refusal may take: wide, for a debug build on a shared machine. Before the limits
/// these cases took from 1 s (20,000 brackets) to forever (a FIFO).
const FAST: Duration = Duration::from_secs(3);

struct Checked {
    code: Option<i32>,
    stderr: String,
    took: Duration,
}

/// Runs `tokenmeter check --config path` in `ADDRESS_SPACE_KIB` of address space; a run that
/// has not ended after 30 s is killed and fails the test.
fn check(path: &Path) -> Checked {
    let started = Instant::now();
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" check --config \"$1\""
        ))
        .arg(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg(path)
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("check --config {} still running after 30 s", path.display());
        }
    };
    Checked {
        code: output.status.code(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        took: started.elapsed(),
    }
}

/// Checks that `path` is refused as it must be, and returns the one line that says why.
fn refused(path: &Path, wants: &[&str]) -> String {
    let checked = check(path);
    let name = path.display();
    let line = checked.stderr.trim_end();
    assert_eq!(checked.code, Some(2), "{name}: {line}");
    assert_eq!(line.lines().count(), 1, "{name}: one line: {line}");
    assert!(
        line.starts_with(&format!("tokenmeter: invalid configuration in {name}: ")),
        "{line}"
    );
    assert!(
        line.chars().count() < 500,
        "{name}: a short line, not {} characters",
        line.len()
    );
    for want in wants {
        assert!(line.contains(want), "{name}: `{want}` not in: {line}");
    }
    assert!(!line.contains("panicked"), "{line}");
    assert!(
        checked.took < FAST,
        "{name}: took {:?}: {line}",
        checked.took
    );
    line.to_string()
}

fn write(dir: &TempDir, name: &str, text: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success());
}

#[test]
fn special_files_are_refused_by_their_kind_before_being_opened() {
    let dir = TempDir::new();
    refused(
        Path::new("/dev/zero"),
        &["it is a character device, not a regular file"],
    );
    let fifo = dir.path().join("fifo.yaml");
    mkfifo(&fifo);
    refused(&fifo, &["it is a FIFO, not a regular file"]);
    refused(dir.path(), &["it is a directory, not a regular file"]);
    // Kubernetes mounts a ConfigMap as symlinks, so they are followed, to what they point at.
    let link = dir.path().join("link.yaml");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    refused(&link, &["character device"]);
    refused(&dir.path().join("absent.yaml"), &["cannot read the file"]);
}

#[test]
fn a_file_over_256_kib_is_refused_without_being_read() {
    let dir = TempDir::new();
    let huge = dir.path().join("huge.yaml");
    let file = std::fs::File::create(&huge).unwrap();
    // Sparse: 100 MB that costs nothing to make, and that reading would take a while.
    file.set_len(100 << 20).unwrap();
    refused(&huge, &["larger than 256 KiB (104857600 bytes)"]);
    // Just over the limit, a valid comment, still refused; at the limit, read.
    let over = write(&dir, "over.yaml", "#".repeat(256 * 1024 + 1));
    refused(&over, &["larger than 256 KiB"]);
    let at = write(&dir, "at.yaml", "#".repeat(256 * 1024));
    assert_eq!(check(&at).code, Some(0));
}

#[test]
fn deep_nesting_is_refused_before_the_yaml_parser_runs() {
    let dir = TempDir::new();
    for (name, text) in [
        ("brackets", format!("routes: {}", "[".repeat(100_000))),
        ("braces", format!("routes: {}", "{a: ".repeat(60_000))),
        ("dashes", format!("routes:\n  {}x\n", "- ".repeat(100_000))),
        (
            "indented",
            (0..600)
                .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
                .collect(),
        ),
    ] {
        let path = write(&dir, &format!("{name}.yaml"), text);
        refused(&path, &["nested deeper than 16 levels at line"]);
    }
}

/// The classic "billion laughs": each level a list of nine aliases to the level below.
fn laughs(levels: usize) -> String {
    let mut text = format!("&l0 [{}]", ["lol"; 9].join(", "));
    for level in 1..levels {
        let below = vec![format!("*l{}", level - 1); 8].join(", ");
        text = format!("&l{level} [{text}, {below}]");
    }
    text
}

/// Events after the bomb, so that serde_yaml's own limit (100 alias jumps per event of the
/// document) is not what stops it: a key no one reads, as the bomb fails first.
fn padding() -> String {
    format!("zzz: [{}]\n", vec!["a"; 60_000].join(","))
}

fn aliases(alias: &str, n: usize) -> String {
    vec![alias; n].join(", ")
}

#[test]
fn alias_bombs_aimed_at_every_list_map_and_string_are_refused_fast_in_bounded_memory() {
    let dir = TempDir::new();
    let kib = "k".repeat(1024);
    let big = "b".repeat(100_000);
    let route = format!(
        "{{name: r, match: {{path_prefix: /{}, methods: [POST], model: m}}}}",
        "p".repeat(1000)
    );
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "laughs-in-a-header",
            format!(
                "routes:\n  - name: a\n    match:\n      headers:\n        x: {}\n",
                laughs(9)
            ),
            "routes[0].match.headers.x: invalid type: sequence",
        ),
        (
            "laughs-in-models",
            format!("models: {}\n", laughs(9)),
            "models[0]: invalid type: sequence",
        ),
        (
            "laughs-in-methods",
            format!(
                "routes:\n  - name: a\n    match: {{methods: {}}}\n",
                laughs(9)
            ),
            "routes[0].match.methods[0]: invalid type: sequence",
        ),
        (
            "laughs-as-routes",
            format!("routes: {}\n", laughs(9)),
            "routes[0]: invalid type: sequence",
        ),
        (
            "routes",
            format!("routes: [&r {route}, {}]\n", aliases("*r", 5000)),
            "routes: more than 256 routes",
        ),
        (
            "models",
            format!("models: [&s {kib}, {}]\n", aliases("*s", 20_000)),
            "models: more than 1000 models",
        ),
        (
            "a-big-model",
            format!("models: [&s {big}, {}]\n", aliases("*s", 1000)),
            "models[0]: a string of 100000 bytes",
        ),
        (
            "methods",
            format!(
                "routes:\n  - name: a\n    match: {{methods: [&m {kib}, {}]}}\n",
                aliases("*m", 20_000)
            ),
            "routes[0].match.methods: more than 16 methods",
        ),
        (
            "headers",
            format!(
                "routes:\n  - name: a\n    match:\n      headers: {{h: &v {kib}, {}}}\n",
                (0..5000)
                    .map(|i| format!("h{i}: *v"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "routes[0].match.headers: more than 16 headers",
        ),
        (
            // Every list and string at its limit, through aliases: the largest configuration
            // any file can expand into, refused only afterwards (the names repeat).
            "the-largest",
            format!(
                "routes:\n  - &r\n    name: &s {kib}\n    match:\n      path: /{p}\n      path_prefix: /{p}\n      model: *s\n      methods: [{m}]\n      headers: {{{h}}}\n  - {rest}\nmodels: [{models}]\n",
                p = &kib[1..],
                m = aliases("*s", 16),
                h = vec!["*s : *s"; 16].join(", "),
                rest = vec!["*r"; 255].join("\n  - "),
                models = aliases("*s", 1000),
            ),
            "routes[1].name: `kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk…` is used by an earlier route",
        ),
    ];
    for (name, text, want) in cases {
        // The largest is valid until its routes are compared: nothing must follow it.
        let padding = if name == "the-largest" {
            String::new()
        } else {
            padding()
        };
        let path = write(&dir, &format!("{name}.yaml"), text + &padding);
        assert!(
            std::fs::metadata(&path).unwrap().len() <= 256 * 1024,
            "{name} must fit the file limit"
        );
        refused(&path, &[want]);
    }
}

#[test]
fn a_long_string_in_any_field_is_refused_with_its_length_not_its_text() {
    let dir = TempDir::new();
    let long = "x".repeat(200_000);
    for (field, text) in [
        ("listen", format!("listen: {long}\n")),
        ("upstream", format!("upstream: {long}\n")),
        ("access_log.path", format!("access_log: {{path: {long}}}\n")),
        (
            "access_log.format",
            format!("access_log: {{path: -, format: {long}}}\n"),
        ),
        (
            "timeouts.connect",
            format!("timeouts: {{connect: {long}}}\n"),
        ),
        ("routes[0].name", format!("routes: [{{name: {long}}}]\n")),
        (
            "routes[0].match.path",
            format!("routes: [{{name: a, match: {{path: {long}}}}}]\n"),
        ),
        (
            "routes[0].match.model",
            format!("routes: [{{name: a, match: {{model: {long}}}}}]\n"),
        ),
        (
            "routes[0].match.headers",
            format!("routes: [{{name: a, match: {{headers: {{{long}: true}}}}}}]\n"),
        ),
        (
            "routes[0].match.headers.h",
            format!("routes: [{{name: a, match: {{headers: {{h: {long}}}}}}}]\n"),
        ),
        (
            "routes[0].dialect",
            format!("routes: [{{name: a, dialect: {long}}}]\n"),
        ),
        (
            "routes[0].slo.ttft",
            format!("routes: [{{name: a, slo: {{ttft: {long}}}}}]\n"),
        ),
        (
            "cost.currency",
            format!("cost: {{per_hour: 1, currency: {long}}}\n"),
        ),
        ("models[0]", format!("models: [{long}]\n")),
    ] {
        let path = write(&dir, "long.yaml", text);
        let line = refused(&path, &[field]);
        assert!(!line.contains(&"x".repeat(41)), "{field}: {line}");
    }
}

/// A file that is not a tokenmeter configuration must not have its content printed.
#[test]
fn a_file_that_is_not_a_configuration_is_not_echoed() {
    let dir = TempDir::new();
    let hash = "$6$abcdefghijklmnop$qrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (name, text, want) in [
        (
            "shadow",
            format!("root:{hash}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"),
            "unknown field (not shown",
        ),
        (
            "one-line",
            format!("root:{hash}:19000:0:99999:7\n"),
            "holds a string, not a mapping of settings",
        ),
        (
            "list",
            format!("- root:{hash}\n- daemon\n"),
            "holds a list, not a mapping of settings",
        ),
        ("number", "19000\n".to_string(), "holds a number"),
        (
            "control",
            "\u{7f}ELF\u{2}\u{1}".to_string(),
            "control characters are not allowed",
        ),
    ] {
        let path = write(&dir, &format!("{name}.txt"), text);
        let line = refused(&path, &[want]);
        assert!(
            !line.contains("root:") && !line.contains("$6$") && !line.contains("abcdefgh"),
            "{name}: {line}"
        );
    }
    let binary = write(&dir, "binary.bin", b"a: \xff\xfe\x00\x01\n");
    refused(&binary, &["not UTF-8"]);
}

#[test]
fn durations_that_would_fail_every_request_are_refused() {
    let dir = TempDir::new();
    for (text, field) in [
        ("timeouts:\n  connect: 0s\n", "timeouts.connect"),
        (
            "timeouts:\n  response_head: 0ms\n",
            "timeouts.response_head",
        ),
        (
            "routes:\n  - name: a\n    slo: {ttft: 0s}\n",
            "routes[0].slo.ttft",
        ),
        (
            "routes:\n  - name: a\n    slo: {e2e: 0s}\n",
            "routes[0].slo.e2e",
        ),
    ] {
        let path = write(&dir, "zero.yaml", text);
        refused(&path, &[field, "0s", "line "]);
    }
    // Zero where it means something stays allowed: no drain, no watching.
    let path = write(
        &dir,
        "ok.yaml",
        "timeouts: {drain: 0s}\nreload: {watch_interval: 0s}\n",
    );
    assert_eq!(check(&path).code, Some(0));
}

fn chat_stream() -> Script {
    Script::stream(
        "text/event-stream",
        vec![chat_chunk("a"), finish_chunk("stop", Some(1)), done()],
    )
}

async fn route_served(running: &Running, records: &Path, n: usize) -> String {
    let got = send(
        &format!("http://{}/v1/chat/completions", running.listen),
        "POST",
        &chat_request("m"),
        &[],
        false,
    )
    .await;
    assert_eq!(got.status, 200);
    let r = wait_for_records(records, n).await;
    r[n - 1]["route"].as_str().unwrap().to_string()
}

/// Each hostile file dropped into the watched configuration is refused and counted, fast, and
/// the routes in force keep serving; SIGHUP refuses them the same way.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_file_dropped_into_the_watched_config_is_refused_and_the_old_one_serves() {
    let upstream = upstream(|_| chat_stream()).await;
    let dir = TempDir::new();
    let path = dir.path().join("tm.yaml");
    let records = dir.path().join("records.jsonl");
    let good = format!(
        "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{}\n\
         access_log: {{path: {}}}\nreload: {{watch_interval: 20ms}}\n\
         routes:\n  - name: before\n    match: {{path_prefix: /v1/}}\n",
        upstream.addr,
        records.display()
    );
    std::fs::write(&path, &good).unwrap();
    let config = Config::load(&path).unwrap();
    let running = tokenmeter::start(config, Some(path.clone()), Default::default())
        .await
        .unwrap();
    assert_eq!(route_served(&running, &records, 1).await, "before");

    let kib = "k".repeat(1024);
    let bombs: Vec<(&str, String)> = vec![
        (
            "string aliases into models",
            format!(
                "models: [&s {}, {}]\n",
                "b".repeat(100_000),
                aliases("*s", 3000)
            ),
        ),
        (
            "laughs in a header",
            format!(
                "routes:\n  - name: a\n    match:\n      headers:\n        x: {}\n{}",
                laughs(9),
                padding()
            ),
        ),
        (
            "route aliases",
            format!(
                "routes: [&r {{name: r, match: {{model: {kib}}}}}, {}]\n",
                aliases("*r", 5000)
            ),
        ),
        (
            "nested brackets",
            format!("routes: {}", "[".repeat(100_000)),
        ),
        ("over 256 KiB", format!("# {}\n", "x".repeat(300_000))),
        (
            "not a configuration",
            "root:$6$abc$def:19000:0:99999:7\n".to_string(),
        ),
        (
            "a zero timeout",
            good.replace("routes:", "timeouts: {connect: 0s}\nroutes:"),
        ),
    ];
    for (i, (what, text)) in bombs.iter().enumerate() {
        // Written beside and renamed over, as an editor or the kubelet does, so the watcher
        // never sees half a file.
        let next = dir.path().join("next.yaml");
        std::fs::write(&next, text).unwrap();
        let dropped = Instant::now();
        std::fs::rename(&next, &path).unwrap();
        let errors = format!(
            "tokenmeter_config_reloads_total{{result=\"error\"}} {}",
            i + 1
        );
        eventually(what, || running.metrics_text().contains(&errors)).await;
        assert!(dropped.elapsed() < FAST, "{what}: {:?}", dropped.elapsed());
        assert_eq!(running.config().routes[0].name, "before", "{what}");
        assert_eq!(
            route_served(&running, &records, i + 2).await,
            "before",
            "{what}"
        );
    }

    // Special files swapped in, and SIGHUP's reload of them, each counted.
    let mut errors = bombs.len();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let swaps = [
        ("a FIFO", fifo.clone()),
        ("/dev/zero", PathBuf::from("/dev/zero")),
    ];
    for (i, (what, target)) in swaps.iter().enumerate() {
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(target, &link).unwrap();
        std::fs::rename(&link, &path).unwrap();
        errors += 1;
        let counted = format!("tokenmeter_config_reloads_total{{result=\"error\"}} {errors}");
        eventually(what, || running.metrics_text().contains(&counted)).await;
        let e = running.reload_config().unwrap_err().to_string();
        errors += 1;
        assert!(e.contains("not a regular file"), "{what}: {e}");
        assert_eq!(
            route_served(&running, &records, bombs.len() + i + 2).await,
            "before",
            "{what}"
        );
    }
    let m = running.metrics_text();
    assert!(
        m.contains("tokenmeter_config_reloads_total{result=\"success\"} 0"),
        "{m}"
    );
}
