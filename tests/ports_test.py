#!/usr/bin/env python3
"""Every listening port of a real coordinator and real workers survives what a network can
send it, and the services go on serving afterwards.

A coordinator and two workers on loopback (real binaries), then, against both the
coordinator's and a worker's metrics port:
  1. GET /, GET /nope, HEAD /metrics, POST, PUT, DELETE /metrics, HTTP/1.0, a 64 KiB
     header, a garbage request line, binary junk, a TLS ClientHello: each gets its
     documented status (docs/observability.md), or a close for what is no HTTP at all.
  2. A slow client sending one byte a second is cut off within the request deadline
     (10 s), and scrapes are served meanwhile.
  3. Three idle connections held open do not hold up a scrape.
  4. 200 concurrent GET /metrics all get the full text.
  5. A randomized HTTP client (seeded; BATON_PORTS_FUZZ_REQUESTS requests per port,
     default 300): every connection ends with a well-formed response or a close, never a
     hang.
Against every gRPC port (the coordinator's, both workers'):
  6. Random bytes, HTTP/1.1 requests, a TLS ClientHello, the HTTP/2 preface followed by
     junk frames, 64 KiB of zeros, and idle connections.
Then:
  7. Every process is still running; both metrics ports serve GET /metrics; the
     coordinator lists both workers idle; and a two-stage job over the workers' gRPC
     tensor transport succeeds with the weights digest of `batonctl train-local`.

usage: ports_test.py --bin-dir build/bin [--seed N] [--keep]
"""

import argparse
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_test import (Cluster, Failure, check, last_reason, tiny_gpt,  # noqa: E402
                          wait_for)

REQUEST_DEADLINE_S = 10  # HttpServerOptions.request_timeout's default


def split(address):
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def connect(address, timeout=5.0):
    s = socket.create_connection(split(address), timeout=timeout)
    s.settimeout(timeout)
    return s


def read_all(s, limit=1 << 22):
    """Reads until EOF (or a reset); raises socket.timeout when the peer neither answers
    nor closes in time."""
    out = b""
    while len(out) < limit:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            raise
        except OSError:  # reset, or not connected any more: the server closed
            break
        if not chunk:
            break
        out += chunk
    return out


def exchange(address, data, timeout=5.0):
    """Sends `data`, shuts the write side, and returns everything until the server closes."""
    with connect(address, timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except socket.timeout:
            raise
        except OSError:
            # EPIPE, ECONNRESET, ENOTCONN: the server answered (or refused) and closed
            # before taking it all; read what it said.
            pass
        return read_all(s)


def parse_response(raw):
    """(status, {lower-case field: value}, body) of one HTTP/1.1 response; Failure if it is
    not one."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    check(sep, f"no complete response head in {raw[:200]!r}")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    check(len(parts) >= 2 and parts[0] == "HTTP/1.1" and parts[1].isdigit(),
          f"bad status line {lines[0]!r}")
    fields = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        check(colon, f"bad header line {line!r}")
        fields[name.strip().lower()] = value.strip()
    return int(parts[1]), fields, body


def get(address, path="/metrics", extra=b"", timeout=5.0):
    raw = exchange(address, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n" + extra +
                   b"Connection: close\r\n\r\n", timeout)
    return parse_response(raw)


def check_scrape(address, what, timeout=5.0):
    status, fields, body = get(address, timeout=timeout)
    check(status == 200, f"{what}: GET /metrics gave {status}")
    check(b"baton_build_info{" in body, f"{what}: /metrics lacks baton_build_info")
    check(body.endswith(b"\n"), f"{what}: /metrics text is cut short")
    check(int(fields.get("content-length", -1)) == len(body),
          f"{what}: Content-Length {fields.get('content-length')} but {len(body)} bytes")
    return body


# ---- 1. the requests of the issue -----------------------------------------------------

def case_requests(addresses):
    big = b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n"
    cases = [
        # (what, bytes, expected status, must the body be empty)
        ("GET /", b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", 200, False),
        ("GET /nope", b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n", 404, False),
        ("HEAD /metrics", b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n", 200, True),
        ("POST /metrics", b"POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n"
                          b"hello", 405, False),
        ("PUT /metrics", b"PUT /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",
         405, False),
        ("DELETE /metrics", b"DELETE /metrics HTTP/1.1\r\nHost: t\r\n\r\n", 405, False),
        ("HTTP/1.0", b"GET /metrics HTTP/1.0\r\n\r\n", 200, False),
        ("64 KiB header", big, 431, False),
        ("garbage request line", b"\x01garbage garbage garbage garbage\r\n\r\n", 400, False),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, False),
    ]
    for name, address in addresses.items():
        for what, data, want, empty in cases:
            raw = exchange(address, data)
            check(raw, f"{name}: {what}: the connection closed without an answer")
            status, fields, body = parse_response(raw)
            check(status == want, f"{name}: {what} gave {status}, want {want}")
            if empty:
                check(body == b"" and int(fields.get("content-length", 0)) > 0,
                      f"{name}: {what}: want no body and the GET's Content-Length, got "
                      f"{len(body)} bytes and {fields.get('content-length')}")
            elif what != "HTTP/2 preface":
                check(int(fields.get("content-length", -1)) == len(body),
                      f"{name}: {what}: Content-Length differs from the body")
            if status == 405:
                check(fields.get("allow") == "GET, HEAD",
                      f"{name}: {what}: 405 without Allow: GET, HEAD ({fields})")
        # What is no HTTP at all: answered with 400 or closed, never a hang or a crash.
        for what, data in [("TLS ClientHello", bytes.fromhex("160301020001000001fc0303") +
                            os.urandom(64)),
                           ("binary junk", bytes(range(256)) * 4)]:
            raw = exchange(address, data)
            if raw:
                status, _, _ = parse_response(raw)
                check(status == 400, f"{name}: {what} gave {status}, want 400")
        check_scrape(address, f"{name} after the requests")
        print(f"  {name}: {len(cases) + 2} kinds of request answered as documented")


# ---- 2 and 3. slow and idle clients ---------------------------------------------------

SLOW_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: slow\r\n\r\n"


def slow_client(address, result):
    """Sends a request head one byte a second (SLOW_REQUEST: about 40 s, four times the
    request deadline); records how many bytes went out before the server cut it off, what
    it answered, and when."""
    data = SLOW_REQUEST
    start = time.monotonic()
    result["sent"] = 0
    try:
        with connect(address, timeout=REQUEST_DEADLINE_S + 10) as s:
            for i in range(len(data)):
                try:
                    s.sendall(data[i:i + 1])
                except OSError:  # EPIPE, ECONNRESET, ENOTCONN: cut off
                    break
                result["sent"] = i + 1
                # Cut off? The server says 408 and closes.
                s.settimeout(1.0)
                try:
                    chunk = s.recv(4096)
                except socket.timeout:
                    continue
                except OSError:
                    break
                result["answer"] = chunk
                break
    except OSError as e:
        result["error"] = f"{type(e).__name__}: {e}"
    result["seconds"] = time.monotonic() - start


def still_open(sock):
    """Whether the server still holds `sock` open without having said anything on it."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # b"": closed; bytes: an answer (a 408)
        return False
    except BlockingIOError:  # nothing to read: open and quiet
        return True
    except OSError:  # reset
        return False
    finally:
        sock.setblocking(True)


def case_slow_and_idle(addresses):
    results = {name: {} for name in addresses}
    threads = [threading.Thread(target=slow_client, args=(a, results[n]))
               for n, a in addresses.items()]
    for t in threads:
        t.start()
    try:
        # The slow clients are under way: each has sent a byte or two.
        wait_for(lambda: all(r.get("sent", 0) >= 2 for r in results.values()), 60,
                 "the slow clients to start sending")
        for name, address in addresses.items():
            idle = [connect(address) for _ in range(3)]
            try:
                start = time.monotonic()
                check_scrape(address, f"{name} with 3 idle connections and a slow client")
                took = time.monotonic() - start
                # Served while the idle connections were still held open (the server cuts
                # them off only at its request deadline), not after them.
                check(all(still_open(s) for s in idle),
                      f"{name}: the idle connections were closed before the scrape was "
                      f"answered ({took:.1f} s)")
            finally:
                for s in idle:
                    s.close()
            print(f"  {name}: scraped in {took * 1000:.0f} ms beside 3 idle connections "
                  f"and a slow client")
    finally:
        for t in threads:
            t.join(timeout=len(SLOW_REQUEST) + REQUEST_DEADLINE_S + 60)
    for name, r in results.items():
        check("error" not in r, f"{name}: slow client: {r.get('error')}")
        # Cut off before it could finish its request (which takes about 40 s to send): by
        # the request deadline, however late this loaded machine noticed.
        check(r.get("sent", 0) < len(SLOW_REQUEST),
              f"{name}: a one-byte-a-second client sent its whole request ({r.get('sent')} "
              f"bytes in {r.get('seconds', 0):.1f} s) without being cut off "
              f"(request deadline {REQUEST_DEADLINE_S} s)")
        answer = r.get("answer", b"")
        check(answer == b"" or answer.startswith(b"HTTP/1.1 408 "),
              f"{name}: the slow client got {answer[:60]!r}, want 408 or a close")
        print(f"  {name}: slow client cut off after {r['seconds']:.1f} s "
              f"({'408' if answer else 'closed'})")


# ---- 4. many scrapers at once ---------------------------------------------------------

def case_concurrent(addresses, n=200):
    for name, address in addresses.items():
        ok, errors = [0], []
        lock = threading.Lock()

        def one():
            try:
                # 200 at once on a loaded 2-core machine: a generous bound on each.
                check_scrape(address, name, timeout=60.0)
                with lock:
                    ok[0] += 1
            except (Failure, OSError) as e:
                with lock:
                    errors.append(str(e))
        threads = [threading.Thread(target=one) for _ in range(n)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        check(ok[0] == n, f"{name}: {ok[0]} of {n} concurrent scrapes succeeded; first "
                          f"errors: {errors[:3]}")
        print(f"  {name}: {n} concurrent scrapes in {time.monotonic() - start:.1f} s")


# ---- 5. randomized requests -----------------------------------------------------------

METHODS = [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE",
           b"CONNECT", b"BREW", b"get", b"G\x00T", b""]
PATHS = [b"/metrics", b"/", b"/nope", b"/metrics?x=1", b"*", b"http://h/metrics",
         b"/metrics/../metrics", b"//", b"/%00", b"/" + b"a" * 5000, b""]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.1x", b"HTTP", b""]
HEADERS = [b"Host: t", b"Accept-Encoding: gzip", b"Accept-Encoding: gzip;q=0",
           b"Connection: close", b"Connection: keep-alive", b"Content-Length: 3",
           b"Content-Length: -1", b"Content-Length: 99999999999999999999",
           b"Transfer-Encoding: chunked", b"X: " + b"v" * 2000, b"NoColon", b" folded",
           b"Bad Name: v", b"X: \x00\x7f", b"Content-Length: 1\r\nContent-Length: 2"]


def random_request(rng):
    parts = [rng.choice(METHODS), b" ", rng.choice(PATHS), b" ", rng.choice(VERSIONS),
             b"\r\n"]
    for _ in range(rng.randrange(6)):
        parts += [rng.choice(HEADERS), rng.choice([b"\r\n", b"\n"])]
    parts.append(b"\r\n")
    if rng.random() < 0.3:
        parts.append(b"abc")
    data = bytearray(b"".join(parts))
    for _ in range(rng.choice([0, 0, 1, 3])):  # a few byte-level mutations
        if data:
            i = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[i] = rng.randrange(256)
            elif op == 1:
                del data[i]
            else:
                data.insert(i, rng.randrange(256))
    if rng.random() < 0.2:  # pipelined: a second request after the first
        data += b"GET /metrics HTTP/1.1\r\n\r\n"
    return bytes(data)


def case_random(addresses, seed, count):
    rng = random.Random(seed)
    statuses = {}
    for name, address in addresses.items():
        for i in range(count):
            data = random_request(rng)
            try:
                raw = exchange(address, data, timeout=5.0)
            except socket.timeout:
                raise Failure(f"{name}: request {i} (seed {seed}) neither answered nor "
                              f"closed within 5 s: {data[:200]!r}")
            if not raw:
                statuses["closed"] = statuses.get("closed", 0) + 1
                continue
            # Every response on the connection is well-formed; count the first one's status.
            status, fields, body = parse_response(raw)
            statuses[status] = statuses.get(status, 0) + 1
        check_scrape(address, f"{name} after {count} random requests")
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items(), key=str))
    print(f"  {count} random requests per port (seed {seed}): {summary}")


# ---- 6. gRPC ports --------------------------------------------------------------------

def case_grpc_garbage(grpc_addresses, seed):
    rng = random.Random(seed)
    h2_junk = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
               bytes([0, 0, 4, 4, 0, 0, 0, 0, 0]) +  # SETTINGS (malformed length)
               bytes(rng.randrange(256) for _ in range(512)))
    payloads = [
        ("random bytes", bytes(rng.randrange(256) for _ in range(4096))),
        ("an HTTP/1.1 request", b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"),
        ("a TLS ClientHello", bytes.fromhex("160301020001000001fc0303") + os.urandom(500)),
        ("the HTTP/2 preface and junk frames", h2_junk),
        ("64 KiB of zeros", bytes(64 * 1024)),
    ]
    for name, address in grpc_addresses.items():
        idle = [connect(address) for _ in range(3)]
        try:
            for what, data in payloads:
                try:
                    exchange(address, data, timeout=10.0)
                except socket.timeout:
                    raise Failure(f"{name}: gRPC port held a connection of {what} open "
                                  f"past 10 s after the client finished")
        finally:
            for s in idle:
                s.close()
        print(f"  {name} gRPC {address}: {len(payloads)} kinds of junk and 3 idle "
              f"connections")


# ---- the cluster ----------------------------------------------------------------------

def start_cluster(c):
    tmp = c.tmp
    coord_metrics_file = os.path.join(tmp, "coordinator.metrics")
    argv = [os.path.join(c.bin_dir, "coordinator"), "--listen", "127.0.0.1:0", "--db", c.db,
            "--metrics_listen", "127.0.0.1:0", "--metrics_port_file", coord_metrics_file,
            "--port_file", os.path.join(tmp, "coordinator.port"),
            "--heartbeat_interval", "0.5s", "--lease_ttl", "3s"]
    c.address = c._start("coordinator", argv, os.path.join(tmp, "coordinator.port"),
                         "the coordinator")
    metrics = {"coordinator": wait_for(lambda: _read(coord_metrics_file), 10,
                                       "the coordinator's metrics port file")}
    grpc = {"coordinator": c.address}
    for w in ("w-1", "w-2"):
        port_file = os.path.join(tmp, f"{w}.port")
        metrics_file = os.path.join(tmp, f"{w}.metrics")
        argv = [os.path.join(c.bin_dir, "worker"), "--coordinator", c.address,
                "--listen", "127.0.0.1:0", "--worker_id", w, "--port_file", port_file,
                "--metrics_listen", "127.0.0.1:0", "--metrics_port_file", metrics_file]
        grpc[w] = c._start(w, argv, port_file, f"worker {w}")
        metrics[w] = wait_for(lambda: _read(metrics_file), 10, f"{w}'s metrics port file")
    c.wait_idle(2, ids=["w-1", "w-2"])
    for name in metrics:
        print(f"  {name}: gRPC {grpc[name]}, metrics {metrics[name]}")
    return metrics, grpc


def _read(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return text or None
    except FileNotFoundError:
        return None


def case_still_serving(c, metrics):
    for name, proc in c.procs.items():
        check(proc.poll() is None,
              f"{name} exited with status {proc.returncode}:\n{c.tail(name)}")
    for name, address in metrics.items():
        check_scrape(address, f"{name} at the end")
    c.wait_idle(2, ids=["w-1", "w-2"])
    path = c.write_spec(tiny_gpt("after-the-junk", steps=6))
    job = c.submit(path, "--schedule", "1f1b", "--stages", "2")
    done = c.wait_state(job["id"], {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                    "JOB_STATE_CANCELLED"}, timeout=120)
    check(done["state"] == "JOB_STATE_SUCCEEDED",
          f"the job after the junk ended {done['state']}: {last_reason(done)}")
    want = c.reference_digest(path)
    check(done.get("weights_digest") == want,
          f"digest {done.get('weights_digest')} != train-local {want}")
    print(f"  all {len(c.procs)} processes up; {job['id']} succeeded with the "
          f"train-local digest {want[:16]}...")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("BATON_PORTS_SEED", 1)))
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, db)")
    args = parser.parse_args()
    count = int(os.environ.get("BATON_PORTS_FUZZ_REQUESTS", 300))

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = tempfile.mkdtemp(prefix="baton-ports-test.")
    c = Cluster(args.bin_dir, None, tmp)
    ok = False
    try:
        print("starting a coordinator and 2 workers")
        metrics, grpc = start_cluster(c)
        probed = {"coordinator": metrics["coordinator"], "w-1": metrics["w-1"]}
        steps = [
            ("1", "requests of every kind on the metrics ports",
             lambda: case_requests(probed)),
            ("2+3", "a slow client and idle connections",
             lambda: case_slow_and_idle(probed)),
            ("4", "200 concurrent scrapes", lambda: case_concurrent(probed)),
            ("5", "randomized requests", lambda: case_random(probed, args.seed, count)),
            ("6", "junk on every gRPC port", lambda: case_grpc_garbage(grpc, args.seed)),
            ("7", "everything still serving", lambda: case_still_serving(c, metrics)),
        ]
        for number, title, fn in steps:
            print(f"\n[{number}] {title}")
            start = time.monotonic()
            fn()
            print(f"[{number}] PASS ({time.monotonic() - start:.1f} s)")
        ok = True
    except (Failure, OSError) as e:
        print(f"ports_test: FAIL: {e}")
        for name, proc in c.procs.items():
            code = proc.poll()
            if code is None:
                print(f"  {name}: still running")
            elif code < 0:
                print(f"  {name}: KILLED by {signal.Signals(-code).name}")
            else:
                print(f"  {name}: exited with status {code}")
        for name in list(c.procs):
            print(f"  --- last lines of {name}'s log ---")
            print("  " + c.tail(name, 15).replace("\n", "\n  "))
    except Exception:
        print(f"ports_test: FAIL with an exception:\n{traceback.format_exc()}")
    except KeyboardInterrupt as e:
        print(f"ports_test: interrupted ({e})")
    finally:
        c.stop_all()
        if args.keep or not ok:
            print(f"\nlogs and db kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
