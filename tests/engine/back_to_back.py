#!/usr/bin/env python3
"""Back-to-back streamed chats with httpx, as a Python client sends them: N requests per client
over one keep-alive connection each, K clients at once. httpx writes a request's head and body
in separate writes, so the proxy may start forwarding a request before its body has come: the
case a stale pooled connection's close can meet mid-upload (tests/engine.rs).

Usage: back_to_back.py URL N K [MAX_TOKENS]. Prints one JSON line: {"failed": F, "total": T,
"first": "<the first failure>"}.
"""

import json
import sys
import threading

import httpx


def main() -> int:
    url, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "stream": True, "max_tokens": max_tokens}
    failed, first, lock = [0], [None], threading.Lock()

    def client():
        with httpx.Client(timeout=60) as c:
            for _ in range(n):
                why = None
                try:
                    with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                        data = b"".join(r.iter_bytes())
                        if r.status_code != 200 or b"[DONE]" not in data:
                            why = f"{r.status_code}: {data[:200]!r}"
                except httpx.HTTPError as e:
                    why = repr(e)
                if why:
                    with lock:
                        failed[0] += 1
                        first[0] = first[0] or why

    threads = [threading.Thread(target=client) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"failed": failed[0], "total": n * k, "first": first[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
