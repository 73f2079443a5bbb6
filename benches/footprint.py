#!/usr/bin/env python3
"""What one request and one event cost each proxy in instructions and cache lines, without noise.

The overhead bench (`cargo bench --bench overhead`) times both proxies on a shared 2-core
machine, where a round's CPU per frame moves by 10-20 % and a one-user p99 by tens of µs from
run to run. This script counts instead: tokenmeter (one worker, embedded defaults) and nginx
(the overhead bench's config) each run under valgrind's callgrind with a simulated cache
(32 KiB 8-way L1 instruction and data caches, 1 MiB L2), and the same client sends them
requests one at a time through a mock upstream (a head and two events at once, then one event
a millisecond). Each count is a difference of two runs, so start-up and shutdown cancel:

  per request = (110 requests of 4 tokens - 10 of 4) / 100
  per event   = (110 of 36 tokens - 110 of 4) / (110 x 32)
  per event at 128 streams = (128 streams of 36 tokens - 128 of 4) / (128 x 32)

The last has 128 streams open at once, an event every 50 ms on each, their starts spread: each
event finds the caches holding the other streams' state, not its own, as in the overhead bench's
concurrent levels (where CPU per frame is compared), and events that arrive together are
served from one `epoll_wait`.

A request's count includes work off its TTFT's path (reading its events after they are written,
finishing its record). The legs count only what lies on it: each proxy runs once more, its
profile cut at every call that reads or writes a socket, and a leg is the stretch from a read to
the write it leads to (the system calls themselves not counted):

  request leg      the client's request read -> the request written upstream
  first-token leg  the upstream's head and first token read -> written to the client

each the median over the requests after the first five, the mock's events after the first two
20 ms apart (at 1 ms, under valgrind's slowness, they sometimes arrived in one read, and that
leg then carried the whole response).
A leg is told by the head parser it runs: tokenmeter's `http1::head::parse_request` and
`http1::head::parse_response`, nginx's `ngx_http_parse_request_line` and `ngx_http_parse_status_line`.

The cache lines fetched are what a request pays when the machine has evicted the proxy's code
and data between two of them (one user, where the other processes run in between): at one
user, TTFT follows them more than it follows the instruction count.

    python3 benches/footprint.py              # builds the release binary; ~3 minutes
    python3 benches/footprint.py --tokenmeter PATH --nginx PATH

Needs valgrind and nginx (Debian: apt-get install valgrind nginx); installs them with
apt-get when missing and run as root.
"""

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,16,64"]
BODY = (
    b'{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"Tell me a story."}],'
    b'"stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"pace_ms":%d}'
)
# The concurrent measurement: streams open at once, and the pace of each one's events.
STREAMS, PACE_MS = 128, 50


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mock:
    """An OpenAI-like upstream on its own thread: max_tokens events, the first two at once."""

    def __init__(self):
        self.port = None
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        if not ready.wait(10):
            sys.exit("footprint: the mock upstream did not start")

    def _run(self, ready):
        async def main():
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            async with server:
                await server.serve_forever()

        asyncio.run(main())

    @staticmethod
    def chunk(data):
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def _serve(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                body = await reader.readexactly(int(length.group(1)) if length else 0)
                tokens = int(re.search(rb'"max_tokens":(\d+)', body).group(1))
                pace = int(re.search(rb'"pace_ms":(\d+)', body).group(1)) / 1000
                out = (
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                out += self.chunk(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
                out += self.chunk(b'data: {"choices":[{"delta":{"content":" t0"}}]}\n\n')
                writer.write(out)
                await writer.drain()
                for i in range(1, tokens):
                    await asyncio.sleep(pace)
                    writer.write(self.chunk(b'data: {"choices":[{"delta":{"content":" t%d"}}]}\n\n' % i))
                    await writer.drain()
                usage = b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d}}\n\n' % tokens
                writer.write(
                    self.chunk(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n')
                    + self.chunk(usage)
                    + self.chunk(b"data: [DONE]\n\n")
                    + b"0\r\n\r\n"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass


def request(tokens, pace_ms):
    body = BODY % (tokens, pace_ms)
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )


def send(port, count, tokens, pace_ms=1):
    """`count` requests, one at a time on one connection, 5 ms apart, their events `pace_ms` apart."""
    request_bytes = request(tokens, pace_ms)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for _ in range(count):
            s.sendall(request_bytes)
            received = b""
            while not received.endswith(b"0\r\n\r\n"):
                data = s.recv(65536)
                if not data:
                    sys.exit("footprint: the proxy closed the connection")
                received += data
            if b" 200 " not in received.split(b"\r\n", 1)[0]:
                sys.exit("footprint: the proxy answered " + received.split(b"\r\n", 1)[0].decode())
            time.sleep(0.005)


def concurrent(port, streams, tokens):
    """`streams` streams at once, one per connection, their starts spread over one pace."""

    async def one(i, request_bytes):
        await asyncio.sleep(PACE_MS / 1000 * i / streams)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            data = await asyncio.wait_for(reader.read(65536), 30)
            if not data:
                sys.exit("footprint: the proxy closed a connection")
            received += data
        writer.close()
        if b" 200 " not in received.split(b"\r\n", 1)[0]:
            sys.exit("footprint: the proxy answered " + received.split(b"\r\n", 1)[0].decode())

    async def all_streams():
        request_bytes = request(tokens, PACE_MS)
        await asyncio.gather(*(one(i, request_bytes) for i in range(streams)))

    asyncio.run(all_streams())


def wait_for(port, process, what):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"footprint: {what} exited early ({process.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"footprint: {what} did not listen within 60 s")


def totals(path):
    """The event names and totals of a callgrind output file."""
    events, summary = None, None
    for line in Path(path).read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            summary = [int(x) for x in line.split()[1:]]
    if not events or not summary:
        sys.exit(f"footprint: no totals in {path}")
    return dict(zip(events, summary))


def under_callgrind(proxy, command, signo, listen, load, work, options):
    """Runs a proxy under callgrind with `options` while `load` sends to it, then stops it."""
    valgrind = ["valgrind", "--tool=callgrind", *CACHE, *options]
    with open(work / f"{proxy}.log", "a") as log:
        process = subprocess.Popen(valgrind + command, stdout=log, stderr=log)
        try:
            wait_for(listen, process, proxy)
            load(listen)
        finally:
            process.send_signal(signo)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure(proxy, command, signo, listen, load, work, name):
    out = work / f"{proxy}-{name}.out"
    under_callgrind(proxy, command, signo, listen, load, work, [f"--callgrind-out-file={out}"])
    return totals(out)


# Where a profile is cut for the legs: before every call that reads or writes a socket (the
# libc entry points both proxies use; a pattern that matches nothing costs nothing).
CUTS = ["recv*", "__libc_recv*", "send", "__libc_send", "sendmsg", "__libc_sendmsg", "writev", "__writev"]
# What tells each proxy's legs apart: the head parser each runs.
LEG_MARKS = {
    "tokenmeter": {"request": "tokenmeter::proxy::http1::head::parse_request",
                   "first token": "tokenmeter::proxy::http1::head::parse_response"},
    "nginx": {"request": "ngx_http_parse_request_line", "first token": "ngx_http_parse_status_line"},
}
# The events after the first come this far apart, so that the first token's read holds only the
# head and the first events, however slowly the proxy runs under valgrind.
LEG_REQUESTS, LEG_SKIPPED, LEG_PACE_MS = 30, 5, 20


def legs(proxy, command, signo, listen, work):
    """The instructions and cache lines of each TTFT leg, the median over the requests (see the top)."""
    out = work / f"{proxy}-legs" / "cut.out"
    out.parent.mkdir()
    options = ["--compress-strings=no", f"--callgrind-out-file={out}"]
    options += [f"--dump-before={name}" for name in CUTS]
    load = lambda port: send(port, LEG_REQUESTS, 4, LEG_PACE_MS)
    under_callgrind(proxy, command, signo, listen, load, work, options)
    parts = []
    for path in out.parent.glob("cut.out.*"):
        text = path.read_text(errors="replace")
        part = int(re.search(r"^part: (\d+)", text, re.M).group(1))
        cut = re.search(r"^desc: Trigger: (.*)$", text, re.M).group(1)
        names = set(re.findall(r"^fn=(?:\(\d+\) )?(.*)$", text, re.M))
        parts.append((part, cut, names, totals(path)))
    parts.sort(key=lambda p: p[0])
    # A leg runs from a read to a write: a part cut at a write whose part before was cut at a read
    # (a parser also runs, finding nothing, when a socket wakes its task before the read).
    spans = [(names, c) for (_, before, _, _), (_, cut, names, c) in zip(parts, parts[1:])
             if "recv" in before and ("send" in cut or "writev" in cut)]
    found = {}
    for leg, mark in LEG_MARKS[proxy].items():
        counts = [c for names, c in spans if mark in names][LEG_SKIPPED:]
        if len(counts) < LEG_REQUESTS - LEG_SKIPPED - 2:
            sys.exit(f"footprint: {proxy}: found the {leg} leg {len(counts)} times in {out.parent}")
        keys = set().union(*counts)
        found[leg] = {k: statistics.median(c.get(k, 0) for c in counts) for k in keys}
    return found


def ensure(tool, package):
    if shutil.which(tool) or Path("/usr/sbin", tool).exists():
        return
    if os.geteuid() != 0:
        sys.exit(f"footprint: {tool} is missing (Debian: apt-get install {package})")
    print(f"footprint: installing {package} with apt-get", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], check=True, env=env)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenmeter", help="a tokenmeter binary (default: build target/release/tokenmeter)")
    parser.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    args = parser.parse_args()
    ensure("valgrind", "valgrind")
    ensure("nginx", "nginx")
    tokenmeter = args.tokenmeter
    if not tokenmeter:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
        tokenmeter = str(ROOT / "target/release/tokenmeter")
    mock = Mock()
    work = Path(tempfile.mkdtemp(prefix="tokenmeter-footprint-"))
    upstream = f"127.0.0.1:{mock.port}"
    template = (ROOT / "benches/overhead/nginx.conf").read_text()

    def tokenmeter_way(listen):
        admin = free_port()
        return [tokenmeter, "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}",
                "--upstream", f"http://{upstream}", "--workers", "1"], signal.SIGINT

    def nginx_way(listen):
        conf = work / "nginx.conf"
        fields = {"DIR": str(work), "NOFILE": "4096", "CONNECTIONS": "1024", "KEEPALIVE": "16",
                  "LISTEN": f"127.0.0.1:{listen}", "UPSTREAM": upstream}
        conf.write_text(re.sub(r"\{\{([A-Z_]+)\}\}", lambda m: fields[m.group(1)], template))
        return [args.nginx, "-c", str(conf), "-p", str(work)], signal.SIGQUIT

    results = {}
    for proxy, way in (("nginx", nginx_way), ("tokenmeter", tokenmeter_way)):
        runs = {}
        for count, tokens in ((10, 4), (110, 4), (110, 36)):
            listen = free_port()
            command, signo = way(listen)
            print(f"footprint: {proxy}, {count} requests of {tokens} tokens", file=sys.stderr)
            load = lambda port, count=count, tokens=tokens: send(port, count, tokens)
            runs[(count, tokens)] = measure(proxy, command, signo, listen, load, work, f"{count}-{tokens}")
        for tokens in (4, 36):
            listen = free_port()
            command, signo = way(listen)
            print(f"footprint: {proxy}, {STREAMS} streams at once of {tokens} tokens", file=sys.stderr)
            # A first wave opens the upstream connections and grows the buffers; the second,
            # of `tokens` tokens, is the one the two runs differ in.
            load = lambda port, tokens=tokens: (concurrent(port, STREAMS, 4), concurrent(port, STREAMS, tokens))
            runs[("streams", tokens)] = measure(proxy, command, signo, listen, load, work, f"streams-{tokens}")
        listen = free_port()
        command, signo = way(listen)
        print(f"footprint: {proxy}, the legs of {LEG_REQUESTS} requests", file=sys.stderr)
        runs["legs"] = legs(proxy, command, signo, listen, work)
        keys = runs[(10, 4)]
        per_request = {k: (runs[(110, 4)][k] - runs[(10, 4)][k]) / 100 for k in keys}
        per_event = {k: (runs[(110, 36)][k] - runs[(110, 4)][k]) / (110 * 32) for k in keys}
        at_scale = {k: (runs[("streams", 36)][k] - runs[("streams", 4)][k]) / (STREAMS * 32) for k in keys}
        results[proxy] = (per_request, per_event, at_scale, runs["legs"]["request"], runs["legs"]["first token"])

    rows = [
        ("instructions", lambda c: c["Ir"]),
        ("instruction-cache lines fetched (L1 misses)", lambda c: c["I1mr"]),
        ("data-cache lines fetched (L1 read + write misses)", lambda c: c["D1mr"] + c["D1mw"]),
        ("lines fetched from memory (L2 misses)", lambda c: c["ILmr"] + c["DLmr"] + c["DLmw"]),
    ]
    def table(title, first, sections, figures):
        print(f"\n## {title}\n")
        print(f"| {first} | figure | nginx | tokenmeter | tokenmeter / nginx |")
        print("|---|---|---|---|---|")
        for index, label in sections:
            for name, value in figures:
                n, t = value(results["nginx"][index]), value(results["tokenmeter"][index])
                ratio = f"{t / n:.2f}" if n >= 1 else "n/a"
                print(f"| {label} | {name} | {n:,.0f} | {t:,.0f} | {ratio} |")

    table("Footprint against nginx (`python3 benches/footprint.py`, callgrind)", "per",
          ((0, "request (4 tokens)"), (1, "event"), (2, f"event, {STREAMS} streams")), rows)
    # The legs leave out the L2 row: a leg's part of a run fetches next to nothing from memory.
    table("The legs of TTFT at one user (each from its socket read to its socket write)", "leg",
          ((3, "request: client -> upstream"), (4, "first token: upstream -> client")), rows[:3])
    print(f"\n(user space only; a request's figures include its 4 events; files in {work})")


if __name__ == "__main__":
    main()
