#!/usr/bin/env python3
"""Writes build/hot-code.ld: the functions a request runs, linked next to each other.

At one user a request finds the proxy's code cold: between two requests the client, the model
server and the kernel have run, and the code a request needs is spread over the binary's 5 MiB
of text, one or two functions a page. Linked where they happen to fall, the code the two legs
of TTFT ran (each from the wake-up that brought its read to its write) sat on 87 and 76 pages,
libc's included; linked together, on 44 and 52 (nginx's: 67 and 51), and the median TTFT of
2,000 one-user requests came 29 µs lower (both ways round against the same code unordered;
docs/performance.md, "Against nginx").

The script runs the shipping binary under valgrind's callgrind while the footprint bench's mock
serves one user's requests, takes every function of the binary that ran from the sixth request
on (the legs of TTFT first, then the rest of a request, each hottest first), and writes them as
a linker script that `build.rs` hands to the linker for the release binary: an output section
of its own, inserted before `.text`, so the default layout is otherwise kept (rust-lld, the
default linker, and GNU ld both read it). A function LLVM thinks cold has its section named
`.text.unlikely.NAME` (`main`, which holds the runtime's loop when it runs on one thread, is
one); both names are listed. The names are matched with their hashes and crate disambiguators
left open, so the list holds across builds; a generic with many instances (which differ only by
hash) is left out. A function the code no longer has matches nothing, so tests/hot_code.rs fails
when too many of the proxy's own functions in the list no longer exist: rerun this script.

Rerun it when the request path changes much:

    python3 benches/hot_code.py                    # builds the release binary first, then seconds
    python3 benches/hot_code.py --tokenmeter PATH
"""

import argparse
import collections
import importlib.util
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "hot-code.ld"
spec = importlib.util.spec_from_file_location("footprint", ROOT / "benches" / "footprint.py")
footprint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(footprint)

REQUESTS, SKIPPED, TOKENS, PACE_MS = 30, 5, 8, 20
# The head parsers that tell the legs apart (mangled: callgrind runs with --demangle=no).
REQUEST_MARK = "5http14head13parse_request"
FIRST_TOKEN_MARK = "5http14head14parse_response"


def pattern(name):
    """A section-name pattern for a mangled symbol that survives rebuilds: legacy mangling's
    hash, v0 mangling's crate disambiguators and LLVM's clone suffixes left open."""
    clone = re.search(r"\.(llvm\.)?[0-9]+$", name)
    name = re.sub(r"\.(llvm\.)?[0-9]+$", "", name)
    hashed = re.search(r"17h[0-9a-f]{16}E$", name)
    name = re.sub(r"17h[0-9a-f]{16}E$", "17h*", name)
    name = re.sub(r"Cs[0-9a-zA-Z]+_", "Cs*_", name)
    return name if hashed or not clone else name + "*"


def parts(out_dir):
    """The profile's parts in order: (what cut it, {function: instructions})."""
    found = []
    for path in out_dir.glob("cut.out.*"):
        text = path.read_text(errors="replace")
        part = int(re.search(r"^part: (\d+)", text, re.M).group(1))
        cut = re.search(r"^desc: Trigger: (.*)$", text, re.M).group(1)
        costs, fn, skip = collections.Counter(), None, False
        for line in text.splitlines():
            if line.startswith("fn="):
                fn = re.sub(r"^fn=(\(\d+\) )?", "", line)
            elif line.startswith("calls="):
                skip = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip:
                    skip = False
                elif fn is not None and len(line.split()) > 1:
                    costs[fn] += int(line.split()[1])
        found.append((part, cut, costs))
    found.sort(key=lambda p: p[0])
    return [(cut, costs) for _, cut, costs in found]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenmeter", help="a tokenmeter binary (default: build target/release/tokenmeter)")
    args = parser.parse_args()
    footprint.ensure("valgrind", "valgrind")
    tokenmeter = args.tokenmeter
    if not tokenmeter:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
        tokenmeter = str(ROOT / "target/release/tokenmeter")
    symbols = set()
    for line in subprocess.run(["nm", "--defined-only", tokenmeter], capture_output=True,
                               text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in "tTwW":
            symbols.add(fields[2])
    mock = footprint.Mock()
    work = Path(tempfile.mkdtemp(prefix="tokenmeter-hot-code-"))
    listen, admin = footprint.free_port(), footprint.free_port()
    command = [tokenmeter, "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}",
               "--upstream", f"http://127.0.0.1:{mock.port}", "--workers", "1"]
    out = work / "cut.out"
    options = ["--demangle=no", "--compress-strings=no", f"--callgrind-out-file={out}"]
    options += [f"--dump-before={name}" for name in footprint.CUTS + ["epoll_wait"]]
    print(f"hot_code: {REQUESTS} requests under callgrind", file=sys.stderr)
    footprint.under_callgrind("tokenmeter", command, signal.SIGINT, listen,
                              lambda port: footprint.send(port, REQUESTS, TOKENS, PACE_MS), work, options)
    profile = parts(work)
    # From the sixth request on: the first ones run what later ones do not (the connection's
    # start, the first upstream connection, the sketches' first growth).
    seen, start = 0, None
    for i, (_, costs) in enumerate(profile):
        if any(REQUEST_MARK in f for f in costs):
            seen += 1
            if seen == SKIPPED + 1:
                start = i
                break
    if start is None:
        sys.exit(f"hot_code: fewer than {SKIPPED + 1} requests found in {work}")
    # A leg runs from the wake-up that brought its read (`epoll_wait` returning: the runtime's
    # loop, then the task) to its write: a part of the profile ends at each cut, so a leg is the
    # parts from one ending at `epoll_wait` to one ending at a write.
    groups = [collections.Counter(), collections.Counter(), collections.Counter()]
    leg = []
    for cut, costs in profile[start:]:
        leg.append(costs)
        if "epoll_wait" in cut:
            # What ran after a write and before the next wait is the rest of a request.
            for part in leg:
                for fn, ir in part.items():
                    if fn in symbols:
                        groups[2][fn] += ir
            leg = []
        elif "send" in cut or "writev" in cut:
            ran = set().union(*leg)
            if any(REQUEST_MARK in f for f in ran):
                group = groups[0]
            elif any(FIRST_TOKEN_MARK in f for f in ran):
                group = groups[1]
            else:
                group = groups[2]
            for part in leg:
                for fn, ir in part.items():
                    if fn in symbols:
                        group[fn] += ir
            leg = []
    # What ran outside the legs (the rest of a request: its events, its finish) comes last.
    for costs in leg:
        for fn, ir in costs.items():
            if fn in symbols:
                groups[2][fn] += ir
    # A pattern that matches many functions (a generic's instances: tokio's task `poll` for
    # every future spawned, `Arc::drop_slow` for every type) would bring them all along; those
    # are left out rather than named with their hash, which the next toolchain or dependency
    # bump changes without a word (tests/hot_code.rs checks that the list still resolves).
    opened = collections.Counter(pattern(s) for s in symbols)
    ordered, patterns = [], set()
    for group in groups:
        for fn, _ in group.most_common():
            if opened[pattern(fn)] > 2:
                continue
            p = pattern(fn)
            if p not in patterns:
                patterns.add(p)
                ordered.append(p)
    if len(ordered) < 100:
        sys.exit(f"hot_code: only {len(ordered)} functions found; is {tokenmeter} the proxy?")
    OUT.parent.mkdir(exist_ok=True)
    with open(OUT, "w") as f:
        f.write("/* Generated by benches/hot_code.py: the functions a request runs, linked together\n")
        f.write("   (see that script and build.rs). Request leg, first-token leg, then the rest. */\n")
        f.write("SECTIONS\n{\n  .text.hot : ALIGN(4096)\n  {\n")
        for p in ordered:
            f.write(f"    *(.text.{p} .text.unlikely.{p})\n")
        f.write("  }\n}\nINSERT BEFORE .text;\n")
    print(f"hot_code: {len(ordered)} functions ({', '.join(str(len(g)) for g in groups)} by group) "
          f"written to {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
