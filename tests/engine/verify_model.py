#!/usr/bin/env python3
"""Checks the tiny model's promise against a running llama-server, with no request help
(no ignore_eos, no logit bias): every stream runs to max_tokens and every streamed chunk
carries exactly one token, a space and ASCII letters, on every endpoint tests/engine.rs uses,
under several samplers (the server's defaults, temperature 1 and 2 with top-k, top-p and min-p
off, greedy).

Usage: verify_model.py HOST:PORT [--requests 25] [--max-tokens 64]
"""

import argparse
import http.client
import json
import re
import sys

WORD = re.compile(r"^ [a-z]+$")

SAMPLERS = {
    "defaults": {},
    "t1-open": {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
    "t2-open": {"temperature": 2.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
    "greedy": {"temperature": 0.0},
}


def stream(addr, path, body):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, (resp.status, resp.read())
    events = []
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data: "):
            data = line[6:]
            events.append(None if data == "[DONE]" else json.loads(data))
    conn.close()
    return events


def check(name, events, n, piece, finish, count):
    pieces = [piece(e) for e in events if e is not None]
    texts = [p for p in pieces if p]
    assert len(texts) == n, f"{name}: {len(texts)} output chunks, want {n}"
    bad = [t for t in texts if not WORD.match(t)]
    assert not bad, f"{name}: not one word per chunk: {bad[:5]}"
    fins = [finish(e) for e in events if e is not None and finish(e)]
    assert fins == ["length"], f"{name}: finish {fins}"
    counts = [count(e) for e in events if e is not None and count(e) is not None]
    assert counts and counts[-1] == n, f"{name}: engine count {counts[-1:]} want {n}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("--requests", type=int, default=25)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    n = a.max_tokens
    total = 0
    for sname, sampling in SAMPLERS.items():
        for i in range(a.requests):
            prompt = f"Request {i}: tell me about lighthouses, {sname}."
            chat = {"model": "tiny", "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": n, "stream": True, **sampling}
            ev = stream(a.addr, "/v1/chat/completions",
                        {**chat, "stream_options": {"include_usage": True}})
            check(f"chat+usage {sname} {i}", ev, n,
                  lambda e: (e["choices"][0]["delta"].get("content") if e["choices"] else None),
                  lambda e: e["choices"][0]["finish_reason"] if e["choices"] else None,
                  lambda e: e.get("usage", {}).get("completion_tokens") if e.get("usage") else None)
            ev = stream(a.addr, "/v1/chat/completions", chat)
            assert not any(e and e.get("usage") for e in ev), "usage without include_usage"
            check(f"chat {sname} {i}", ev, n,
                  lambda e: e["choices"][0]["delta"].get("content"),
                  lambda e: e["choices"][0]["finish_reason"],
                  lambda e: (e.get("timings") or {}).get("predicted_n"))
            ev = stream(a.addr, "/v1/completions",
                        {"model": "tiny", "prompt": prompt, "max_tokens": n, "stream": True,
                         "stream_options": {"include_usage": True}, **sampling})
            check(f"completions {sname} {i}", ev, n,
                  lambda e: e["choices"][0]["text"] if e["choices"] else None,
                  lambda e: e["choices"][0]["finish_reason"] if e["choices"] else None,
                  lambda e: e.get("usage", {}).get("completion_tokens") if e.get("usage") else None)
            ev = stream(a.addr, "/completion",
                        {"prompt": prompt, "n_predict": n, "stream": True, **sampling})
            check(f"/completion {sname} {i}", ev, n,
                  lambda e: e.get("content"),
                  lambda e: {"limit": "length"}.get(e.get("stop_type"), e.get("stop_type"))
                  if e.get("stop") else None,
                  lambda e: e.get("tokens_predicted"))
            total += 4
    print(f"verify_model.py: {total} streams of {n} tokens, {len(SAMPLERS)} samplers: "
          f"all ran to max_tokens, one token per chunk")


if __name__ == "__main__":
    sys.exit(main())
