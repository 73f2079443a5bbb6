#!/usr/bin/env bash
# Checks docker/Dockerfile as far as a machine without a Docker engine allows, by replaying it:
#  1. the build context is a clean copy of the working tree (tracked and unignored files, as a
#     fresh clone has them) filtered by .dockerignore, and every COPY source must be in it;
#  2. the builder stage's RUN steps run as written, in that copy, with the host's toolchain
#     standing in for the rust image (same Debian release); target/ is kept in
#     target/docker-check between runs, as Docker's layer cache would keep it;
#  3. the runtime stage's files are laid out in a directory standing in for the image;
#  4. the binary links only libraries distroless cc ships, against glibc <= 2.36 (bookworm's),
#     with the request's code linked together (build.rs, build/hot-code.ld);
#  5. the entrypoint runs as the image's user: `check --config` on the image's config, then the
#     proxy with the image's CMD (listeners moved to 127.0.0.1:0) until /readyz answers 200 and
#     /metrics has tokenmeter_build_info, then SIGTERM and a clean exit.
# Prints the binary's size for the image-size estimate. Exit 0 when everything holds.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "docker/check.sh: python3 is needed" >&2; exit 2; }
exec python3 - "$@" <<'PY'
import fnmatch, json, os, re, shlex, shutil, signal, subprocess, sys, tempfile, time
import urllib.request

REPO = os.getcwd()
DOCKERFILE = "docker/Dockerfile"
# What gcr.io/distroless/cc-debian12 ships in /lib: glibc's libraries and libgcc_s.
ALLOWED_LIBS = {"linux-vdso.so.1", "libc.so.6", "libm.so.6", "libgcc_s.so.1", "libpthread.so.0",
                "libdl.so.2", "librt.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
MAX_GLIBC = (2, 36)


def fail(msg):
    print(f"docker/check.sh: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ok(msg):
    print(f"docker/check.sh: ok: {msg}")


def dockerignore_patterns():
    path = os.path.join(REPO, ".dockerignore")
    if not os.path.exists(path):
        return []
    pats = []
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = os.path.normpath(line[1:] if neg else line).lstrip("/")
        pats.append((neg, pat.split("/")))
    return pats


def segs_match(pat, segs):
    """Docker's matching: path segments, `*` within one, `**` across any number."""
    if not pat:
        return not segs
    if pat[0] == "**":
        return any(segs_match(pat[1:], segs[i:]) for i in range(len(segs) + 1))
    return bool(segs) and fnmatch.fnmatchcase(segs[0], pat[0]) and segs_match(pat[1:], segs[1:])


def ignored(path, pats):
    segs = path.split("/")
    verdict = False
    for neg, pat in pats:
        # A pattern naming a directory covers everything under it.
        if any(segs_match(pat, segs[:n]) for n in range(1, len(segs) + 1)):
            verdict = not neg
    return verdict


def build_context(dest):
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True, cwd=REPO).stdout.decode().split("\0")
    pats = dockerignore_patterns()
    kept = [f for f in files if f and os.path.isfile(os.path.join(REPO, f)) and not ignored(f, pats)]
    for f in kept:
        os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(REPO, f), os.path.join(dest, f))
    return kept


def instructions():
    text = open(os.path.join(REPO, DOCKERFILE)).read()
    lines, cur = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") and not cur:
            continue
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        cur += raw
        if cur.strip():
            op, _, rest = cur.strip().partition(" ")
            lines.append((op.upper(), rest.strip()))
        cur = ""
    return lines


def expand(text, args):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def copy_into(src, dst):
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)


def main():
    tmp = tempfile.mkdtemp(prefix="tokenmeter-docker-check-")
    os.chmod(tmp, 0o755)  # the image's user (65532) must reach the staged files
    try:
        run_check(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_check(tmp):
    context = os.path.join(tmp, "context")
    kept = build_context(context)
    ok(f"build context: {len(kept)} files after .dockerignore")
    cache = os.path.join(REPO, "target", "docker-check")
    os.makedirs(cache, exist_ok=True)

    args, stages, stage = {}, {}, None
    for op, rest in instructions():
        rest = expand(rest, args)
        if op == "ARG":
            name, _, default = rest.partition("=")
            args.setdefault(name, default)
        elif op == "FROM":
            words = rest.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            root = os.path.join(tmp, "stage-" + name)
            os.makedirs(root)
            stage = {"name": name, "image": words[0], "root": root, "workdir": "/", "user": None,
                     "entrypoint": None, "cmd": None, "env": dict(os.environ)}
            stages[name] = stage
        elif op == "WORKDIR":
            stage["workdir"] = os.path.join(stage["workdir"], rest)
            os.makedirs(stage["root"] + stage["workdir"], exist_ok=True)
        elif op == "COPY":
            words = shlex.split(rest)
            src_root = context
            while words[0].startswith("--"):
                flag = words.pop(0)
                if flag.startswith("--from="):
                    src_root = stages[flag.split("=", 1)[1]]["root"]
            *srcs, dest = words
            if not dest.startswith("/"):
                dest = os.path.join(stage["workdir"], dest)
            for s in srcs:
                src = os.path.join(src_root, s.lstrip("/"))
                if not os.path.exists(src):
                    where = "the build context (see .dockerignore)" if src_root == context else "stage " + rest
                    fail(f"{DOCKERFILE}: COPY {s}: not in {where}")
                into = dest
                if dest.endswith("/") or len(srcs) > 1:
                    into = os.path.join(dest, os.path.basename(s.rstrip("/")))
                copy_into(src, stage["root"] + into)
            ok(f"COPY {rest}")
        elif op == "RUN":
            cmd = re.sub(r"^(--\S+\s+)+", "", rest)
            if re.search(r"(^|\s)/(?!dev/null)", cmd):
                fail(f"{DOCKERFILE}: RUN uses an absolute path, which this replay cannot map: {cmd}")
            cwd = stage["root"] + stage["workdir"]
            target = os.path.join(cwd, "target")
            if "cargo" in cmd and not os.path.lexists(target):
                os.symlink(cache, target)
            print(f"docker/check.sh: RUN {cmd}", flush=True)
            started = time.monotonic()
            if subprocess.run(["sh", "-c", cmd], cwd=cwd, env=stage["env"]).returncode != 0:
                fail(f"{DOCKERFILE}: RUN failed: {cmd}")
            ok(f"RUN took {time.monotonic() - started:.0f} s")
        elif op == "ENV":
            name, _, value = rest.partition("=")
            stage["env"][name] = value
        elif op == "USER":
            stage["user"] = rest
        elif op == "ENTRYPOINT":
            stage["entrypoint"] = json.loads(rest)
        elif op == "CMD":
            stage["cmd"] = json.loads(rest)
        elif op not in ("EXPOSE", "LABEL"):
            fail(f"{DOCKERFILE}: {op} is not handled by this check; extend docker/check.sh")

    final = stage
    if not final["image"].startswith("gcr.io/distroless/cc-debian12"):
        fail(f"the runtime image is {final['image']}; this check knows distroless cc-debian12 only")
    root = final["root"]
    staged = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    if staged != ["etc/tokenmeter/tokenmeter.yaml", "usr/local/bin/tokenmeter"]:
        fail(f"the image should hold only the binary and its config, it holds {staged}")
    ok("image holds only /usr/local/bin/tokenmeter and /etc/tokenmeter/tokenmeter.yaml")

    user = final["user"] or ""
    uid = user.split(":")[0]
    if not uid.isdigit() or int(uid) == 0:
        fail(f"USER {user!r}: give a numeric non-root uid so runAsNonRoot can verify it")
    ok(f"USER {user}")

    binary = root + final["entrypoint"][0]
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = {line.split()[0].rsplit("/", 1)[-1] for line in ldd.splitlines() if line.strip()}
    extra = libs - ALLOWED_LIBS
    if extra:
        fail(f"the binary links {sorted(extra)}, which distroless cc does not ship")
    ok(f"dynamic deps: {', '.join(sorted(libs))}")
    syms = subprocess.run(["objdump", "-T", binary], capture_output=True, text=True, check=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", syms)}
    newest = max(versions)
    if newest > MAX_GLIBC:
        fail(f"the binary needs GLIBC_{'.'.join(map(str, newest))}, newer than the runtime's 2.36")
    ok(f"needs glibc {'.'.join(map(str, newest))} (runtime has 2.36)")
    # build.rs links the functions a request runs together (build/hot-code.ld); a context
    # without the script, or a linker that ignored it, would still build, only slower.
    headers = subprocess.run(["objdump", "-h", binary], capture_output=True, text=True, check=True).stdout
    hot = re.search(r"\s\.text\.hot\s+([0-9a-f]+)", headers)
    if not hot:
        fail("the binary has no .text.hot section: build.rs or build/hot-code.ld did not reach the linker")
    ok(f"the request's code linked together: .text.hot holds {int(hot.group(1), 16) // 1024} KiB")

    def in_image(arg):
        return root + arg if arg.startswith("/") and os.path.exists(root + arg) else arg

    as_user = []
    if os.geteuid() == 0 and shutil.which("setpriv"):
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={user.partition(':')[2] or uid}", "--clear-groups"]
    entry = [in_image(a) for a in final["entrypoint"]]
    cmd = [in_image(a) for a in final["cmd"] or []]
    config = next((a for a in cmd if a.startswith(root)), None)
    if config is None:
        fail("CMD does not name a file in the image (expected --config /etc/tokenmeter/tokenmeter.yaml)")
    checked = subprocess.run(as_user + entry + ["check", "--config", config], capture_output=True, text=True)
    if checked.returncode != 0:
        fail(f"`tokenmeter check --config` on the image's config: {checked.stderr.strip()}")
    ok("entrypoint `check --config /etc/tokenmeter/tokenmeter.yaml` passes")

    proxy = subprocess.Popen(as_user + entry + cmd + ["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        admin, deadline = None, time.monotonic() + 20
        while admin is None and time.monotonic() < deadline:
            line = proxy.stderr.readline()
            if not line:
                break
            m = re.search(r"tokenmeter is serving.*admin=(\S+)", line)
            admin = m and m.group(1)
        if not admin:
            fail("the entrypoint with the image's CMD did not start serving")
        ready = urllib.request.urlopen(f"http://{admin}/readyz", timeout=5).status
        metrics = urllib.request.urlopen(f"http://{admin}/metrics", timeout=5).read().decode()
        if ready != 200 or "tokenmeter_build_info" not in metrics:
            fail(f"/readyz answered {ready}, /metrics without tokenmeter_build_info")
        ok(f"the entrypoint with CMD {final['cmd']} serves: /readyz 200, /metrics has tokenmeter_build_info")
        proxy.send_signal(signal.SIGTERM)
        code = proxy.wait(timeout=20)
        if code != 0:
            fail(f"after SIGTERM the proxy exited {code}")
        ok("SIGTERM: clean exit 0")
    finally:
        if proxy.poll() is None:
            proxy.kill()

    size = os.path.getsize(binary)
    print(f"docker/check.sh: binary size {size} bytes ({size / 2**20:.1f} MiB)")
    print("docker/check.sh: all checks passed")


main()
PY
