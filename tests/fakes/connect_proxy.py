#!/usr/bin/env python3
"""A small forward proxy for tests, on 127.0.0.1 only: HTTP CONNECT
tunnels (what a client uses for an https:// server through an http:// or
https:// proxy) or, with --socks5, SOCKS5 CONNECT. Every tunnel asked for
is appended to --log as one line, "CONNECT host:port" or "SOCKS5
host:port", before it is opened; anything else than CONNECT is answered
405 and logged as "405 METHOD target". Tunnels go to loopback addresses
only (others: 403 / SOCKS5 "not allowed"), so a test can never reach out.

    connect_proxy.py --port 0 --log FILE [--socks5] [--auth USER:PASS]
                     [--tls CERT KEY]

--auth: Proxy-Authorization Basic (HTTP, else 407) or SOCKS5
username/password (RFC 1929) is required; the credentials are never
logged. --tls: the proxy itself speaks TLS with that certificate (an
https:// proxy). Once it listens it prints one JSON line, {"port": N},
and it exits at end of input on stdin, like kube_apiserver.py.

Python 3 standard library only.
"""

import argparse
import base64
import ipaddress
import json
import select
import socket
import ssl
import struct
import sys
import threading

LOCK = threading.Lock()


def log(path, line):
    with LOCK, open(path, "a") as f:
        f.write(line + "\n")


def loopback(host):
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def relay(a, b):
    """Copy bytes both ways until either side closes."""
    socks = [a, b]
    try:
        while True:
            r, _, _ = select.select(socks, [], [], 60)
            if not r:
                return
            for s in r:
                data = s.recv(65536)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        return


def read_head(conn):
    """The request head (up to the blank line), as text, or None."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk or len(data) > 65536:
            return None
        data += chunk
    return data.split(b"\r\n\r\n", 1)[0].decode("latin-1")


def reply(conn, status, reason):
    conn.sendall(("HTTP/1.1 %d %s\r\nContent-Length: 0\r\n"
                  "Connection: close\r\n\r\n" % (status, reason)).encode())


def serve_http(conn, args):
    head = read_head(conn)
    if head is None:
        return
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        reply(conn, 400, "Bad Request")
        return
    method, target = parts[0], parts[1]
    if method != "CONNECT":
        log(args.log, "405 %s %s" % (method, target.split("?")[0]))
        reply(conn, 405, "Method Not Allowed")
        return
    if args.auth is not None:
        want = "Basic " + base64.b64encode(args.auth.encode()).decode()
        got = [l.split(":", 1)[1].strip() for l in lines[1:]
               if l.lower().startswith("proxy-authorization:")]
        if got != [want]:
            log(args.log, "407 CONNECT %s" % target)
            conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                         b"Proxy-Authenticate: Basic realm=\"test\"\r\n"
                         b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            return
    log(args.log, "CONNECT %s" % target)
    host, _, port = target.rpartition(":")
    if not loopback(host) or not port.isdigit():
        reply(conn, 403, "Forbidden")
        return
    try:
        up = socket.create_connection((host.strip("[]"), int(port)), 10)
    except OSError:
        reply(conn, 502, "Bad Gateway")
        return
    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    with up:
        relay(conn, up)


def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("short read")
        data += chunk
    return data


def serve_socks5(conn, args):
    ver, n = recv_exact(conn, 2)
    methods = recv_exact(conn, n)
    want = 2 if args.auth is not None else 0
    if ver != 5 or want not in methods:
        conn.sendall(b"\x05\xff")
        return
    conn.sendall(bytes([5, want]))
    if want == 2:
        _, ulen = recv_exact(conn, 2)
        user = recv_exact(conn, ulen)
        plen = recv_exact(conn, 1)[0]
        pw = recv_exact(conn, plen)
        if (user + b":" + pw).decode("latin-1") != args.auth:
            conn.sendall(b"\x01\x01")
            return
        conn.sendall(b"\x01\x00")
    ver, cmd, _, atyp = recv_exact(conn, 4)
    if atyp == 1:
        host = socket.inet_ntop(socket.AF_INET, recv_exact(conn, 4))
    elif atyp == 4:
        host = socket.inet_ntop(socket.AF_INET6, recv_exact(conn, 16))
    elif atyp == 3:
        host = recv_exact(conn, recv_exact(conn, 1)[0]).decode("latin-1")
    else:
        return
    port = struct.unpack("!H", recv_exact(conn, 2))[0]
    log(args.log, "SOCKS5 %s:%d" % (host, port))
    fail = b"\x05%c\x00\x01\x00\x00\x00\x00\x00\x00"
    if cmd != 1:
        conn.sendall(fail % 7)
        return
    if not loopback(host):
        conn.sendall(fail % 2)
        return
    try:
        up = socket.create_connection((host, port), 10)
    except OSError:
        conn.sendall(fail % 5)
        return
    conn.sendall(b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x00")
    with up:
        relay(conn, up)


def handle(conn, args, ctx):
    try:
        conn.settimeout(30)
        if ctx is not None:
            conn = ctx.wrap_socket(conn, server_side=True)
        conn.settimeout(None)
        (serve_socks5 if args.socks5 else serve_http)(conn, args)
    except (OSError, ssl.SSLError, ValueError):
        pass
    finally:
        try:
            conn.close()
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--socks5", action="store_true")
    ap.add_argument("--auth")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    args = ap.parse_args()
    ctx = None
    if args.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls[0], args.tls[1])
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", args.port))
    srv.listen(64)
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)

    def accept():
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=handle, args=(conn, args, ctx),
                             daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()        # until the test closes our stdin


if __name__ == "__main__":
    main()
