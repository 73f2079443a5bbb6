//! The processes a way passes through, each a child of the bench so its CPU time and RSS are
//! its own: the real `tokenmeter` release binary, nginx as the floor (installed from Debian when
//! missing, configured from `nginx.conf` beside this file), and with `TOKENMETER_BENCH_RELAY=1`
//! a bare TCP relay. Each is killed when dropped, so a panic cannot leave one behind.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::net::TcpListener;

use crate::procfs;
use crate::serving::{self, Complaints};

/// A proxy running as a child process, listening on loopback.
pub(crate) struct ProxyProcess {
    child: Child,
    pub(crate) listen: SocketAddr,
    /// tokenmeter's admin listener (`/metrics`); `None` for the other proxies.
    pub(crate) admin: Option<SocketAddr>,
    pub(crate) complaints: Complaints,
    /// VmRSS before any load.
    pub(crate) idle_rss_kib: Option<u64>,
    /// nginx's directory of config, pid file and temp paths, removed when the process is.
    scratch: Option<PathBuf>,
}

impl ProxyProcess {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets start-up allocations settle, then notes what is left as the idle RSS.
    fn settle(mut self) -> ProxyProcess {
        std::thread::sleep(Duration::from_millis(200));
        self.idle_rss_kib = procfs::rss_kib(self.pid());
        self
    }

    /// This source's `tokenmeter` as `cargo build --release` builds it (see `overhead/shipping.rs`), on
    /// embedded defaults: metrics and the live view on, no per-request access log (nginx's is
    /// off too); with `workers` shards (its own default, one per CPU, when `None`).
    pub(crate) fn tokenmeter(
        upstream: SocketAddr,
        workers: Option<usize>,
    ) -> Result<ProxyProcess, String> {
        ProxyProcess::tokenmeter_from(&crate::shipping::binary()?, upstream, workers)
    }

    /// Another `tokenmeter` binary (`TOKENMETER_BENCH_CANDIDATE`), run the same way: two builds
    /// compared in one run, on the same machine state.
    pub(crate) fn tokenmeter_from(
        binary: &Path,
        upstream: SocketAddr,
        workers: Option<usize>,
    ) -> Result<ProxyProcess, String> {
        ProxyProcess::tokenmeter_with(binary, upstream, workers, &[])
    }

    /// This source's `tokenmeter` with one worker, exporting over OTLP/HTTP to `sink`: metrics
    /// every second (so export happens within the rounds) and a span for every request
    /// (`always_on`); the span queue and batch on the SDK's defaults, as a user gets them.
    pub(crate) fn tokenmeter_otlp(
        upstream: SocketAddr,
        sink: SocketAddr,
    ) -> Result<ProxyProcess, String> {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{sink}")),
            ("OTEL_TRACES_SAMPLER", "always_on".to_string()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000".to_string()),
        ];
        ProxyProcess::tokenmeter_with(&crate::shipping::binary()?, upstream, Some(1), &env)
    }

    /// Every tokenmeter way starts here. The bench's own `OTEL_*` variables are not passed on:
    /// only the way given `env` exports.
    fn tokenmeter_with(
        binary: &Path,
        upstream: SocketAddr,
        workers: Option<usize>,
        env: &[(&str, String)],
    ) -> Result<ProxyProcess, String> {
        let mut command = Command::new(binary);
        command
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .arg("--upstream")
            .arg(format!("http://{upstream}"));
        if let Some(workers) = workers {
            command.arg("--workers").arg(workers.to_string());
        }
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("OTEL_") {
                command.env_remove(name);
            }
        }
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = command
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let (line, complaints) = serving::await_serving(&mut child)?;
        let proxy = ProxyProcess {
            child,
            listen: serving::address(&line, "listen=")?,
            admin: serving::address(&line, "admin=").ok(),
            complaints,
            idle_rss_kib: None,
            scratch: None,
        };
        Ok(proxy.settle())
    }

    /// nginx in front of `upstream`, ready for `streams` concurrent streams.
    ///
    /// nginx cannot listen on port 0 and tell us the port, so the bench binds 127.0.0.1:0
    /// itself, notes the port, releases it and writes it into the config. Another process may
    /// take the port in between; nginx then fails with "Address already in use" and the bench
    /// tries again with a fresh port, up to three times.
    pub(crate) fn nginx(
        binary: &Path,
        upstream: SocketAddr,
        streams: usize,
    ) -> Result<ProxyProcess, String> {
        let scratch =
            std::env::temp_dir().join(format!("tokenmeter-overhead-nginx-{}", std::process::id()));
        std::fs::create_dir_all(&scratch)
            .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
        let mut last_error = String::new();
        for _attempt in 0..3 {
            match nginx_once(binary, &scratch, upstream, streams) {
                Ok((child, listen, complaints)) => {
                    let proxy = ProxyProcess {
                        child,
                        listen,
                        admin: None,
                        complaints,
                        idle_rss_kib: None,
                        scratch: Some(scratch),
                    };
                    return Ok(proxy.settle());
                }
                Err(e) if e.contains("Address already in use") => last_error = e,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&scratch);
                    return Err(e);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&scratch);
        Err(last_error)
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(scratch) = &self.scratch {
            let _ = std::fs::remove_dir_all(scratch);
        }
    }
}

/// One attempt at starting nginx on a port that was free a moment ago.
fn nginx_once(
    binary: &Path,
    scratch: &Path,
    upstream: SocketAddr,
    streams: usize,
) -> Result<(Child, SocketAddr, Complaints), String> {
    let listen = StdTcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("cannot find a free port for nginx: {e}"))?;
    // Each stream holds a client and an upstream connection, and the clients' pools open a
    // fresh connection now and then before a finished one is back in the pool, so twice that
    // again: with fewer, nginx warns "worker_connections are not enough" and closes idle ones.
    let connections = 4 * streams + 256;
    let config = include_str!("nginx.conf")
        .replace("{{DIR}}", &scratch.display().to_string())
        .replace("{{NOFILE}}", &(2 * connections).to_string())
        .replace("{{CONNECTIONS}}", &connections.to_string())
        .replace("{{UPSTREAM}}", &upstream.to_string())
        .replace("{{KEEPALIVE}}", &streams.max(16).to_string())
        .replace("{{LISTEN}}", &listen.to_string());
    let config_path = scratch.join("nginx.conf");
    std::fs::write(&config_path, config)
        .map_err(|e| format!("cannot write {}: {e}", config_path.display()))?;
    let pid_path = scratch.join("nginx.pid");
    let _ = std::fs::remove_file(&pid_path);
    let mut child = Command::new(binary)
        .arg("-p")
        .arg(scratch)
        .arg("-c")
        .arg(&config_path)
        // Messages from before the config is read go to stderr too, not to /var/log/nginx.
        .args(["-e", "stderr"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let complaints = Complaints::default();
    let Some(stderr) = child.stderr.take() else {
        let _ = child.kill();
        return Err("nginx's stderr was not piped".into());
    };
    let kept = complaints.clone();
    // Every line nginx writes at `warn` or above is a complaint; it writes nothing else.
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            kept.keep(line);
        }
    });
    // nginx writes its pid file after it has bound its listening socket, so our child's pid in
    // that file means it is accepting.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let written = std::fs::read_to_string(&pid_path).unwrap_or_default();
        if written.trim() == child.id().to_string() {
            return Ok((child, listen, complaints));
        }
        if let Ok(Some(status)) = child.try_wait() {
            let _ = reader.join();
            return Err(format!(
                "nginx exited ({status}) before serving:\n{}",
                complaints.lines().join("\n")
            ));
        }
        if tokio::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("nginx did not write its pid file within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where nginx is: `TOKENMETER_BENCH_NGINX=PATH` if given, else `nginx` on the PATH or in an
/// sbin directory, else Debian's `nginx` package is installed with apt-get (as tests/run.sh
/// installs what the tests use) and looked for again. `TOKENMETER_BENCH_NGINX=0` leaves nginx
/// out; so does a failed install, with the reason in the report.
pub(crate) fn find_or_install_nginx() -> Result<PathBuf, String> {
    if let Ok(chosen) = std::env::var("TOKENMETER_BENCH_NGINX") {
        match chosen.as_str() {
            "" => {}
            "0" => return Err("left out (TOKENMETER_BENCH_NGINX=0)".into()),
            path => return Ok(PathBuf::from(path)),
        }
    }
    if let Some(found) = find_nginx() {
        return Ok(found);
    }
    eprintln!("overhead bench: nginx is missing; installing Debian's nginx package with apt-get");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    let apt = |args: &[&str]| {
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.arg("apt-get");
            sudo
        };
        command
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let installed = apt(&["update", "-qq"])
        && apt(&["install", "-y", "-qq", "--no-install-recommends", "nginx"]);
    match find_nginx() {
        Some(found) => Ok(found),
        None if installed => Err("apt-get installed nginx but no nginx binary was found".into()),
        None => Err(
            "not installed and `apt-get install nginx` failed; install it or set TOKENMETER_BENCH_NGINX=PATH"
                .into(),
        ),
    }
}

fn find_nginx() -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"])
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join("nginx"))
        .find(|candidate| candidate.is_file());
    found
}

/// nginx's version line, such as `nginx version: nginx/1.22.1`.
pub(crate) fn nginx_version(binary: &Path) -> Option<String> {
    let out = Command::new(binary).arg("-v").output().ok()?;
    let text = String::from_utf8(out.stderr).ok()?;
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("nginx version: "))
        .map(str::to_string)
}

/// A bare TCP relay in a process of its own (this executable, run with `--relay-for ADDR`): the
/// cost of one more process and two more loopback sockets on the path, without HTTP.
pub(crate) fn relay(upstream: SocketAddr) -> Result<ProxyProcess, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this bench: {e}"))?;
    let mut child = Command::new(exe)
        .arg("--relay-for")
        .arg(upstream.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the relay: {e}"))?;
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        let mut first = BufReader::new(stdout);
        let _ = first.read_line(&mut line);
        // Drain the rest, should it ever print more, so it can never block on a full pipe.
        std::thread::spawn(move || {
            let _ = first.read_to_end(&mut Vec::new());
        });
    }
    let mut relay = ProxyProcess {
        child,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin: None,
        complaints: Complaints::default(),
        idle_rss_kib: None,
        scratch: None,
    };
    relay.listen = line
        .trim()
        .strip_prefix("listen=")
        .and_then(|addr| addr.parse().ok())
        .ok_or_else(|| format!("the relay did not say where it listens: {line:?}"))?;
    Ok(relay.settle())
}

/// The relay's own `main`: accept, connect upstream, copy both ways until either side closes.
/// It uses tokio's default multi-threaded runtime, as tokenmeter does.
pub(crate) fn relay_main(upstream: Option<&String>) -> Result<(), String> {
    let upstream = upstream
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .ok_or("--relay-for needs the upstream's ADDR")?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| format!("relay runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("relay bind: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("relay address: {e}"))?;
        println!("listen={addr}");
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            let _ = inbound.set_nodelay(true);
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = outbound.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    })
}

/// One counter's value from a proxy's `/metrics` (the sum over its series whose name and labels
/// begin with `series`), read with a plain HTTP/1.0 GET; `None` if it cannot be read.
pub(crate) fn scrape(admin: SocketAddr, series: &str) -> Option<f64> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return None;
    }
    let values: Vec<f64> = body
        .lines()
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    Some(values.iter().sum())
}

/// Pins every thread of process `pid` to the CPUs of `mask` (`taskset`, from util-linux).
pub(crate) fn pin(pid: u32, mask: &str) -> Result<(), String> {
    let status = Command::new("taskset")
        .args(["-a", "-p", mask, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run taskset: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("taskset -a -p {mask} {pid} failed: {status}"))
    }
}
