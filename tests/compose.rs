//! docker/compose.yaml checked without a Docker engine: every host path it mounts is in the
//! repository, the commands parse with tokenmeter's own flags, the services reach each other on
//! the ports they listen on, and Prometheus' configuration passes `promtool check config`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;
use tokenmeter::Config;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn compose() -> Value {
    let text = std::fs::read_to_string(repo().join("docker/compose.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a list: {v:?}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("not a string: {s:?}"))
                .to_string()
        })
        .collect()
}

/// A service's bind mounts as (host path in the repository, path in the container).
fn mounts(service: &Value) -> Vec<(PathBuf, String)> {
    let Some(volumes) = service["volumes"].as_sequence() else {
        return Vec::new();
    };
    volumes
        .iter()
        .map(|v| {
            let spec = v.as_str().unwrap();
            let mut parts = spec.split(':');
            let host = parts.next().unwrap();
            let inside = parts
                .next()
                .unwrap_or_else(|| panic!("{spec}: no container path"));
            assert!(
                host.starts_with('.'),
                "{spec}: mount a path of the repository"
            );
            // Compose resolves relative paths from the compose file's directory.
            (
                normal(&repo().join("docker").join(host)),
                inside.to_string(),
            )
        })
        .collect()
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Where a path inside a service's container comes from on the host.
fn host_path(service: &Value, inside: &str) -> PathBuf {
    mounts(service)
        .into_iter()
        .find_map(|(host, dir)| {
            Path::new(inside)
                .strip_prefix(&dir)
                .ok()
                .map(|rest| host.join(rest))
        })
        .unwrap_or_else(|| panic!("{inside} is not mounted"))
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .map(|i| args[i + 1].clone())
}

fn port_of(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

/// Paths produced by other parts of the repository (`tokenmeter rules`, the dashboard); each
/// is checked here when present.
const GENERATED: [&str; 2] = [
    "docker/prometheus/rules.yaml",
    "grafana/dashboards/tokenmeter.json",
];

#[test]
fn every_mounted_host_path_is_in_the_repository() {
    let compose = compose();
    let services = compose["services"].as_mapping().unwrap();
    let (mut count, mut waiting) = (0, 0);
    for (name, service) in services {
        for (host, _) in mounts(service) {
            let generated_dir = GENERATED
                .iter()
                .any(|g| repo().join(g).parent() == Some(host.as_path()));
            if generated_dir && !host.exists() {
                eprintln!(
                    "{}: not in this tree yet (generated elsewhere)",
                    host.display()
                );
                waiting += 1;
                continue;
            }
            assert!(
                host.exists(),
                "{name:?} mounts {}, which does not exist",
                host.display()
            );
            count += 1;
        }
    }
    assert_eq!(
        (count + waiting, waiting <= 1),
        (4, true),
        "{count} mounts, {waiting} waiting"
    );
}

#[test]
fn the_image_and_the_commands_are_tokenmeters_own() {
    let compose = compose();
    let s = &compose["services"];
    for name in ["sim", "tokenmeter", "load"] {
        assert_eq!(
            s[name]["build"]["dockerfile"].as_str(),
            Some("docker/Dockerfile"),
            "{name}"
        );
        assert_eq!(s[name]["build"]["context"].as_str(), Some(".."), "{name}");
        assert_eq!(s[name]["image"], s["tokenmeter"]["image"], "{name}");
        assert_flags_parse(&strings(&s[name]["command"]));
    }
}

/// clap parses every flag and value before it honours --help: a typo in `args` fails here.
fn assert_flags_parse(args: &[String]) {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tokenmeter {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_slow_override_keeps_the_sim_where_tokenmeter_looks_for_it() {
    let text = std::fs::read_to_string(repo().join("docker/compose.slow.yaml")).unwrap();
    let slow: Value = serde_yaml::from_str(&text).unwrap();
    let services = slow["services"].as_mapping().unwrap();
    assert_eq!(services.len(), 1, "the override touches the sim only");
    let args = strings(&slow["services"]["sim"]["command"]);
    let normal = strings(&compose()["services"]["sim"]["command"]);
    assert_eq!(flag(&args, "--listen"), flag(&normal, "--listen"));
    // Slower than the chat route's TPOT objective, so the chat SLO is missed.
    let step = flag(&args, "--decode-step").unwrap();
    let config = Config::load(&repo().join("config/tokenmeter.yaml")).unwrap();
    let chat = config.routes.iter().find(|r| r.name == "chat").unwrap();
    let tpot = chat.slo.as_ref().and_then(|s| s.tpot).unwrap();
    assert!(tokenmeter::parse_duration(&step).unwrap() > tpot);
    assert_flags_parse(&args);
}

#[test]
fn the_services_reach_each_other_on_the_ports_they_listen_on() {
    let compose = compose();
    let s = &compose["services"];
    let sim = strings(&s["sim"]["command"]);
    let proxy = strings(&s["tokenmeter"]["command"]);

    // tokenmeter's config is the mounted file, valid, and its upstream is the sim.
    let config_path = host_path(&s["tokenmeter"], &flag(&proxy, "--config").unwrap());
    let config = Config::load(&config_path).unwrap();
    let sim_listen = flag(&sim, "--listen").unwrap();
    assert!(
        sim_listen.starts_with("0.0.0.0:"),
        "the sim must listen beyond its container"
    );
    assert_eq!(
        flag(&proxy, "--upstream").unwrap(),
        format!("http://sim:{}", port_of(&sim_listen))
    );
    let published = strings(&s["tokenmeter"]["ports"]);
    for port in [config.listen.port(), config.admin.port()] {
        assert!(
            published.contains(&format!("{port}:{port}")),
            "{port} not published"
        );
    }
    let load = strings(&s["load"]["command"]);
    assert_eq!(
        flag(&load, "--url").unwrap(),
        format!("http://tokenmeter:{}", config.listen.port())
    );

    // Prometheus scrapes the admin port.
    let prom_args = strings(&s["prometheus"]["command"]);
    let prom_file = host_path(
        &s["prometheus"],
        flag_eq(&prom_args, "--config.file").as_str(),
    );
    let prom: Value = serde_yaml::from_str(&std::fs::read_to_string(&prom_file).unwrap()).unwrap();
    let targets = strings(&prom["scrape_configs"][0]["static_configs"][0]["targets"]);
    assert_eq!(targets, [format!("tokenmeter:{}", config.admin.port())]);
    assert_eq!(strings(&prom["rule_files"]), ["rules.yaml"]);

    // Grafana's datasource is that Prometheus, with the uid the dashboard expects.
    let ds_file = host_path(
        &s["grafana"],
        "/etc/grafana/provisioning/datasources/prometheus.yaml",
    );
    let ds: Value = serde_yaml::from_str(&std::fs::read_to_string(ds_file).unwrap()).unwrap();
    let ds = &ds["datasources"][0];
    assert_eq!(ds["uid"].as_str(), Some("prometheus"));
    assert_eq!(ds["url"].as_str(), Some("http://prometheus:9090"));
    assert!(strings(&s["prometheus"]["ports"]).contains(&"9090:9090".to_string()));

    // The dashboards provider loads the directory where the dashboards are mounted.
    let provider = host_path(
        &s["grafana"],
        "/etc/grafana/provisioning/dashboards/tokenmeter.yaml",
    );
    let provider: Value =
        serde_yaml::from_str(&std::fs::read_to_string(provider).unwrap()).unwrap();
    let dir = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    let home = s["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        .as_str()
        .unwrap();
    assert!(home.starts_with(dir), "{home} is outside {dir}");
    let dashboard = host_path(&s["grafana"], home);
    assert_eq!(dashboard, repo().join(GENERATED[1]));
    if dashboard.exists() {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&dashboard).unwrap()).unwrap();
        assert_eq!(json["uid"].as_str(), Some("tokenmeter"));
    }
}

fn flag_eq(args: &[String], name: &str) -> String {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")).map(String::from))
        .unwrap_or_else(|| panic!("no {name}= in {args:?}"))
}

#[test]
fn promtool_accepts_the_prometheus_config() {
    let config = repo().join("docker/prometheus/prometheus.yml");
    let rules_present = repo().join(GENERATED[0]).exists();
    let mut cmd = Command::new("promtool");
    cmd.args(["check", "config"]);
    if !rules_present {
        // rules.yaml is generated by `tokenmeter rules`; until it is here, the syntax only.
        cmd.arg("--syntax-only");
    }
    let out = cmd
        .arg(&config)
        .output()
        .expect("promtool is needed (tests/run.sh installs Debian's prometheus)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check config:\n{text}");
    if rules_present {
        assert!(text.contains("rules found"), "{text}");
    }
}
