#!/usr/bin/env bash
# Makes the README's screenshots from a real run: `tokenmeter demo` (the simulator, tokenmeter in
# front of it and a load sweep through it) kept serving after its sweep, the live view on its
# admin port and the HTML report over the proxy's own records, each captured by headless
# Chromium at 1400 px wide into docs/img/. Run it again whenever the pages change:
#
#   bash docs/screenshots.sh                            # the release binary, built if stale
#   TOKENMETER=target/debug/tokenmeter bash docs/screenshots.sh
#
# It takes about half a minute once the binary exists. The sweep is short and fixed (levels
# 1, 2, 4, 8, 16 for 20 s, the simulator's fixed seed), so the pictures change only when the
# pages or the measurements do. Each picture is the top of its page, 1400 px wide and
# LIVE_HEIGHT (1100) or REPORT_HEIGHT (1800) px tall: set them when a page grows. Needs chromium (tests/run.sh installs it) and python3; with
# `pngquant` on PATH (apt-get install pngquant) the PNGs are reduced to a 64-colour palette. Each must stay under 300 KiB to be
# committed; the script says so when one is not.
set -euo pipefail
cd "$(dirname "$0")/.."

# Without TOKENMETER, the release binary of this checkout: cargo build is a no-op when it is
# current, and a stale binary would picture pages the code no longer draws.
if [ -z "${TOKENMETER:-}" ]; then
    cargo build --release
fi
bin=${TOKENMETER:-target/release/tokenmeter}
if [ ! -x "$bin" ]; then
    echo "screenshots: $bin is not an executable" >&2
    exit 2
fi
bin=$(realpath "$bin")
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
    echo "screenshots: needs chromium on PATH (apt-get install chromium)" >&2
    exit 2
fi

work=$(mktemp -d)
demo_pid=
cleanup() {
    if [ -n "$demo_pid" ]; then
        kill -INT "$demo_pid" 2>/dev/null || true
        wait "$demo_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# A free port for the admin listener (the demo falls back to any port if its own is taken,
# but the script must know which one to open).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" demo --duration 20s --levels 1,2,4,8,16 --out "$work/demo" \
    --admin "127.0.0.1:$port" --serve >"$work/demo.log" 2>&1 &
demo_pid=$!

# The sweep ends with "Still serving"; the windows of the live view then hold all of it.
deadline=$((SECONDS + 90))
until grep -qs "Still serving" "$work/demo.log"; do
    if ! kill -0 "$demo_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
        echo "screenshots: the demo did not finish its sweep:" >&2
        cat "$work/demo.log" >&2
        exit 1
    fi
    sleep 0.5
done
admin=$(sed -n 's|.*Still serving (live view http://\([^/]*\)/).*|\1|p' "$work/demo.log")

# shot FILE HEIGHT URL: one screenshot 1400 px wide; the virtual time budget lets the page's
# script fetch and draw before the capture.
shot() {
    "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --disable-dev-shm-usage --hide-scrollbars --user-data-dir="$work/profile" \
        --window-size="1400,$2" --virtual-time-budget=5000 \
        --screenshot="$1" "$3" >"$work/chromium.log" 2>&1 || {
        cat "$work/chromium.log" >&2
        exit 1
    }
    if command -v pngquant >/dev/null; then
        pngquant --force --skip-if-larger --output "$1" 64 "$1" || true
    fi
    if [ "$(stat -c %s "$1")" -ge $((300 * 1024)) ]; then
        echo "screenshots: $1 is 300 KiB or more; too large to commit" >&2
    fi
    echo "screenshots: $1 ($(($(stat -c %s "$1") / 1024)) KiB)"
}

mkdir -p docs/img
shot docs/img/live-view.png "${LIVE_HEIGHT:-1100}" "http://$admin/"
# From the records' directory, so the page names the files as a reader would (no temporary path).
(cd "$work/demo" && "$bin" report proxy-records.csv --config tokenmeter.yaml \
    --html ../report.html >/dev/null)
shot docs/img/report.png "${REPORT_HEIGHT:-1800}" "file://$work/report.html"
