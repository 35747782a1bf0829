"""The daemon itself: command line, the embedded default with no config,
config errors with file:line, health/readiness/metrics, JSON logs, SIGHUP
secret rotation and graceful SIGTERM/SIGINT."""

import base64
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
import uuid

from divtest import (DIVERGED, Daemon, GITHUB_CONFIG, api, compact,
                     fixture, run_tests, with_comment)

DOC = with_comment(fixture(
    "github/go-playground--pull-request-issue-comment.json"),
    "/diverge status")


def run(args, **kw):
    p = subprocess.run([DIVERGED] + args, capture_output=True, text=True,
                       timeout=30, **kw)
    return p.returncode, p.stdout, p.stderr


def port_free(port):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def cli(t):
    rc, out, _ = run(["--version"])
    t.ok(rc == 0 and out.startswith("diverged "), "--version", out)
    rc, out, _ = run(["--help"])
    t.ok(rc == 0 and "--config" in out and "--check-config" in out,
         "--help")
    rc, _, err = run(["--frobnicate"])
    t.ok(rc == 2 and "usage" in err, "unknown flag: exit 2 with usage")
    rc, _, err = run(["extra"])
    t.eq(rc, 2, "stray argument: exit 2")


def config_errors(t):
    tmp = tempfile.mkdtemp(prefix="diverge-cfg-")
    cases = {
        "unknown key": ("listen: 127.0.0.1:0\nlistne: x\n", ":2:"),
        "bad value": ("log:\n  level: info\n  format: xml\n", ":3:"),
        "provider without secret": ("github:\n  enabled: true\n", ":2:"),
        "bad yaml": ("a: [1, 2\n", ":"),
    }
    for name, (text, line) in cases.items():
        path = os.path.join(tmp, name.replace(" ", "-") + ".yaml")
        with open(path, "w") as f:
            f.write(text)
        rc, _, err = run(["--config", path, "--check-config"])
        t.ok(rc == 2 and err.startswith("config: " + path + line),
             "config %s: exit 2 with config: FILE:LINE" % name, (rc, err))
    path = os.path.join(tmp, "missing-secret.yaml")
    with open(path, "w") as f:
        f.write("github:\n  enabled: true\n  webhook_secrets: "
                "[\"file:%s/nope\"]\n" % tmp)
    rc, _, err = run(["--config", path])
    t.ok(rc == 2 and "github.webhook_secrets" in err and "nope" in err,
         "unreadable secret file: refuses to start, names the key and file",
         (rc, err))
    # a secret that cannot be resolved is a bad value: config: FILE:LINE
    t.ok(err.startswith("config: %s:3: 'github.webhook_secrets[0]': "
                        % path), "unreadable secret: config: FILE:LINE",
         err)
    path = os.path.join(tmp, "signing.yaml")
    with open(path, "w") as f:
        f.write("gitlab:\n  enabled: true\n"
                "  signing_token: env:DIVERGE_TEST_SIGNING\n")
    rc, _, err = run(["--config", path, "--check-config"],
                     env=dict(os.environ, DIVERGE_TEST_SIGNING="plain"))
    t.ok(rc == 2 and err.startswith(
        "config: %s:3: 'gitlab.signing_token': not a whsec_" % path),
        "a signing token not whsec_<base64>: config: FILE:LINE", (rc, err))
    # a valid key followed by a NUL byte: refused, not cut short at it
    with open(os.path.join(tmp, "signing"), "wb") as f:
        f.write(b"whsec_" + base64.b64encode(b"k" * 24) + b"\0tail\n")
    with open(path, "w") as f:
        f.write("gitlab:\n  enabled: true\n"
                "  signing_token: \"file:%s/signing\"\n" % tmp)
    rc, _, err = run(["--config", path, "--check-config"])
    t.ok(rc == 2 and err.startswith(
        "config: %s:3: 'gitlab.signing_token': the secret holds a NUL byte"
        % path), "a signing token with a NUL byte: config: FILE:LINE",
        (rc, err))
    # every secret named, not only the webhook ones, with --check-config too
    with open(os.path.join(tmp, "hook"), "w") as f:
        f.write("s3cret\n")
    for key, text in (
            ("github.token", "github:\n  enabled: true\n  webhook_secrets: "
             "[\"file:%s/hook\"]\n  token: \"file:%s/nope\"\n"),
            ("api.token", "api: {listen: 127.0.0.1:0, token: "
             "\"file:%s/hook-gone\"}\n# %s\n")):
        path = os.path.join(tmp, key + ".yaml")
        with open(path, "w") as f:
            f.write(text % (tmp, tmp))
        line = 4 if key == "github.token" else 1
        for extra in (["--check-config"], []):
            rc, out, err = run(["--config", path] + extra)
            t.ok(rc == 2 and err.startswith("config: %s:%d: '%s'" %
                                            (path, line, key)) and
                 "configuration ok" not in out,
                 "an unreadable %s: exit 2%s" % (key, " with --check-config"
                                                   if extra else ""),
                 (rc, out, err))
    rc, _, err = run(["--config", os.path.join(tmp, "absent.yaml")])
    t.ok(rc == 2 and "absent.yaml" in err, "missing config file: exit 2",
         err)
    d = Daemon(GITHUB_CONFIG)
    rc, out, err = run(["--config", d.config_file, "--check-config"])
    t.ok(rc == 0, "--check-config on a valid file: exit 0", err)
    # the options that override keys are checked like them, by
    # --check-config too (it said "configuration ok", and the start then
    # failed with exit status 1)
    for args, want in (
            (["--listen", "bogus"], "--listen 'bogus'"),
            (["--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1"],
             "--api-listen '127.0.0.1'"),
            (["--listen", "127.0.0.1:0", "--api-listen", "0.0.0.0:8081"],
             "not a loopback address"),
            (["--listen", "127.0.0.1:0", "--state-dir", ""],
             "--state-dir ''")):
        for extra in (["--check-config"], []):
            rc, out, err = run(args + extra, cwd=tmp)
            t.ok(rc == 2 and want in err and "configuration ok" not in out,
                 "%s%s: exit 2" % (" ".join(args), " --check-config"
                                   if extra else ""), (rc, out, err))
    rc, out, err = run(["--api-listen", "off", "--listen", "127.0.0.1:0",
                        "--check-config"])
    t.ok(rc == 0 and "configuration ok" in out,
         "--api-listen off --check-config: exit 0", (rc, err))
    # kubeconfig mode: --check-config reads the kubeconfig (not the cluster)
    kc = os.path.join(tmp, "kubeconfig")
    cfg = os.path.join(tmp, "kube.yaml")
    with open(cfg, "w") as f:
        f.write("kubernetes: {mode: kubeconfig, kubeconfig: %s}\n" % kc)
    for user, ok in (("{token: t}", True),
                     ("{exec: {apiVersion: client.authentication.k8s.io/v1,"
                      " command: kubelogin, interactiveMode: Always}}", False)):
        with open(kc, "w") as f:
            f.write("current-context: m\n"
                    "contexts: [{name: m, context: {cluster: c, user: u}}]\n"
                    "clusters: [{name: c, cluster: {server: "
                    "'https://k.example'}}]\n"
                    "users: [{name: u, user: %s}]\n" % user)
        rc, out, err = run(["--config", cfg, "--check-config"], cwd=tmp)
        t.ok((rc, "configuration ok" in out) == ((0, True) if ok else
                                                 (2, False)) and
             (ok or "config: user 'u' in '%s': 'exec.interactiveMode'" % kc
              in err), "--check-config reads the kubeconfig: %s" %
             ("a good one, exit 0" if ok else "a plugin that needs a "
              "terminal, exit 2 naming the user"), (rc, out, err))
    # ... and its cluster's proxy-url, whose password is never shown
    for proxy, why in (("socks5://u:S3CRET@127.0.0.1:1080", None),
                       ("ftp://u:S3CRET@127.0.0.1:21",
                        "'proxy-url' scheme 'ftp' is not http, https or "
                        "socks5")):
        with open(kc, "w") as f:
            f.write("current-context: m\n"
                    "contexts: [{name: m, context: {cluster: c, user: u}}]\n"
                    "clusters: [{name: c, cluster: {server: "
                    "'https://k.example', proxy-url: '%s'}}]\n"
                    "users: [{name: u, user: {token: t}}]\n" % proxy)
        rc, out, err = run(["--config", cfg, "--check-config"], cwd=tmp)
        t.ok((rc == 0 and "configuration ok" in out) if why is None else
             (rc == 2 and "config: cluster 'c' in '%s': %s" % (kc, why)
              in err and "S3CRET" not in out + err),
             "--check-config: a kubeconfig with proxy-url %s" %
             ("socks5://, exit 0" if why is None else "ftp://, exit 2 "
              "naming the cluster, not the password"), (rc, out, err))


def embedded_default(t):
    """No config at all: ./diverge-state and 127.0.0.1:8080."""
    if not port_free(8080) or not port_free(8081):
        t.skip("embedded default on 127.0.0.1:8080 (API 8081): a port is "
               "busy")
        return
    cwd = tempfile.mkdtemp(prefix="diverge-cwd-")
    d = Daemon(config=None, args=[], cwd=cwd).start()
    t.eq(d.port, 8080, "no config: listens on 127.0.0.1:8080")
    t.ok(os.path.exists(os.path.join(cwd, "diverge-state", "diverge.db")),
         "no config: state in ./diverge-state")
    # written just after the start line the start waits for
    t.ok(d.wait_log("webhook providers disabled") and
         any("webhook providers disabled" in l and "--config" in l
             for l in d.log()), "no config: one line says how to enable "
         "webhooks")
    s, _, j = d.github("issue_comment", DOC, "x-1")
    t.ok(s == 404 and "not enabled" in j["error"],
         "disabled provider: 404 with a reason", (s, j))
    t.eq(d.stop(), 0, "SIGTERM: exit 0")


def process_metrics(t, d, t0, m):
    """The process_* series and diverge_sqlite_memory_bytes of /metrics
    against what /proc says of the daemon's process and the test's clock
    around its start (t0: before it)."""
    vals = dict(l.split(" ", 1) for l in m.splitlines()
                if l and not l.startswith("#") and "{" not in l)
    vals = {k: float(v) for k, v in vals.items()}
    pid = d.proc.pid
    t.ok("# TYPE process_cpu_seconds_total counter" in m and
         "# TYPE process_resident_memory_bytes gauge" in m,
         "metrics: process_cpu_seconds_total is a counter, the rest gauges")
    with open("/proc/%d/statm" % pid) as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    got = vals.get("process_resident_memory_bytes", 0)
    t.ok(rss / 2 <= got <= rss * 2,
         "metrics: process_resident_memory_bytes is the daemon's RSS",
         (got, rss))
    fds = len(os.listdir("/proc/%d/fd" % pid))
    got = vals.get("process_open_fds", 0)
    t.ok(abs(got - fds) <= 8, "metrics: process_open_fds counts the "
         "daemon's descriptors", (got, fds))
    with open("/proc/%d/limits" % pid) as f:
        soft = [l.split()[3] for l in f if l.startswith("Max open files")]
    t.ok(soft and vals.get("process_max_fds") == float(soft[0]),
         "metrics: process_max_fds is its RLIMIT_NOFILE", (vals.get(
             "process_max_fds"), soft))
    start = vals.get("process_start_time_seconds", 0)
    t.ok(t0 - 1 <= start <= time.time(), "metrics: "
         "process_start_time_seconds is when the daemon started",
         (t0, start, time.time()))
    cpu = vals.get("process_cpu_seconds_total", -1)
    t.ok(0 < cpu <= (time.time() - t0) * os.cpu_count() + 1,
         "metrics: process_cpu_seconds_total", cpu)
    t.ok(vals.get("process_virtual_memory_bytes", 0) >= rss and
         vals.get("diverge_sqlite_memory_bytes", 0) > 0,
         "metrics: process_virtual_memory_bytes, diverge_sqlite_memory_bytes",
         (vals.get("process_virtual_memory_bytes"),
          vals.get("diverge_sqlite_memory_bytes")))


def operations(t):
    t0 = time.time()
    d = Daemon(GITHUB_CONFIG).start()
    s, _, j = d.json("GET", "/healthz")
    t.eq((s, j), (200, {"status": "ok"}), "/healthz")
    s, _, j = d.json("GET", "/readyz")
    t.eq((s, j), (200, {"ready": True}), "/readyz")
    d.github("issue_comment", DOC, str(uuid.uuid4()))
    d.wait_handled([], timeout=1)
    time.sleep(0.3)
    m = d.metrics()
    for name in ("diverge_http_requests_total{route=\"/healthz\","
                 "code=\"200\"}",
                 "diverge_webhook_deliveries_total",
                 "diverge_inbox_depth",
                 "diverge_inbox_processing_seconds_bucket",
                 "diverge_http_request_duration_seconds_bucket",
                 "# TYPE diverge_inbox_processing_seconds histogram"):
        t.ok(name in m, "metrics: %s" % name)
    # counters whose events have not happened yet are there, at 0
    zero = ["diverge_http_connections_timed_out_total 0",
            'diverge_inbox_processed_total{outcome="dead"} 0',
            'diverge_meter_suspensions_total{reason="budget exceeded"} 0',
            'diverge_meter_completions_total{result="failed"} 0',
            'diverge_reconciles_total{result="error"} 0']
    t.ok(all(z in m.splitlines() for z in zero), "metrics: counters "
         "start at 0 before their first event",
         [z for z in zero if z not in m.splitlines()])
    process_metrics(t, d, t0, m)

    # SIGHUP: rotate the secret file
    with open(d.secret_file, "w") as f:
        f.write("rotated-secret\n")
    d.send_signal(signal.SIGHUP)
    t.ok(d.wait_log("reloaded secrets"), "SIGHUP: reload logged")
    s, _, _ = d.github("issue_comment", DOC, str(uuid.uuid4()))
    t.eq(s, 401, "after SIGHUP the old secret is refused")
    s, _, _ = d.github("issue_comment", DOC, str(uuid.uuid4()),
                       secret="rotated-secret")
    t.eq(s, 202, "after SIGHUP the new secret is accepted")
    restart = "take effect only at a restart"
    t.ok(not any(restart in l for l in d.log()), "the file unchanged but "
         "for the secret, and the command line's overrides: nothing more "
         "to say")
    # keys a reload does not apply are named; log settings are applied
    with open(d.config_file) as f:
        text = f.read()
    with open(d.config_file, "w") as f:
        f.write(text.replace("level: debug", "level: info") +
                "controller: {workers: 9}\nhttp: {threads: 3}\n")
    d.send_signal(signal.SIGHUP)
    t.ok(d.wait_log(restart), "SIGHUP with other keys changed: a warning")
    t.ok([l for l in d.log() if restart in l and "level=warn" in l and
          "keys=controller.workers,http.threads" in l],
         "naming exactly the keys that wait for a restart",
         [l for l in d.log() if restart in l])
    os.unlink(d.secret_file)
    d.send_signal(signal.SIGHUP)
    t.ok(d.wait_log("reload failed"), "SIGHUP with an unreadable secret: "
         "the running one is kept")
    s, _, _ = d.github("issue_comment", DOC, str(uuid.uuid4()),
                       secret="rotated-secret")
    t.eq(s, 202, "still serving with the previous secret")
    t.ok(not any("rotated-secret" in l for l in d.log()),
         "secrets never in logs")
    t.eq(d.stop(signal.SIGINT), 0, "SIGINT: exit 0")
    t.ok(any("stopped" in l for l in d.log()), "stop logged")


def secrets_statuses(d, toks):
    """The statuses of listing Secrets with each token of toks, over one
    kept-alive connection (a new one when the server closes it)."""
    hc = __import__("http.client").client
    out, c = [], None
    for tok in toks:
        for attempt in (0, 1):
            if c is None:
                c = hc.HTTPConnection("127.0.0.1", d.api_port, timeout=10)
            try:
                c.request("GET", "/api/v1/namespaces/default/secrets",
                          headers={"Authorization": "Bearer " + tok})
                r = c.getresponse()
                r.read()
                out.append(r.status)
                if r.getheader("Connection", "").lower() == "close":
                    c.close()
                    c = None
                break
            except (OSError, hc.HTTPException):
                c.close()
                c = None
                if attempt:
                    raise
    if c is not None:
        c.close()
    return out


def secrets_status(d, tok):
    """The status of listing Secrets on d's API with bearer token tok."""
    return secrets_statuses(d, [tok])[0]


def sighup_reloaded(d):
    """Send d a SIGHUP and wait for the reload to be logged."""
    n = sum("reloaded secrets" in l for l in d.log())
    d.send_signal(signal.SIGHUP)
    end = time.time() + 10
    while time.time() < end and sum("reloaded secrets" in l
                                    for l in d.log()) == n:
        time.sleep(0.05)


def api_token_rotation(t):
    """SIGHUP re-reads api.token: the old token stops working, the new one
    works (a revoked token must not live until the next restart)."""
    d = Daemon("log: {{level: info}}\napi: {{token: \"file:{tmp}/api-token\"}}\n")
    path = os.path.join(d.tmp, "api-token")
    with open(path, "w") as f:
        f.write("token-a\n")
    d.start()

    t.eq((secrets_status(d, "token-a"), secrets_status(d, "token-b")),
         (200, 401),
         "api.token: the configured token works, another does not")
    # near misses: one character replaced at each place, and suffixes;
    # a check that compared a part of the digests would let some through
    good = "token-a"
    near = [good[:i] + chr(c) + good[i + 1:] for i in range(len(good))
            for c in range(0x21, 0x7f) if chr(c) != good[i]]
    near += ["%s%d" % (good, i) for i in range(1000)]
    got = secrets_statuses(d, near)
    t.eq((len(got), sorted(set(got))), (len(near), [401]),
         "%d near misses of api.token: every one 401" % len(near))
    with open(path, "w") as f:
        f.write("token-b\n")
    sighup_reloaded(d)
    t.eq((secrets_status(d, "token-a"), secrets_status(d, "token-b")),
         (401, 200),
         "after SIGHUP: the old api.token is refused, the new one works")
    t.ok(not any("token-a" in l or "token-b" in l for l in d.log()),
         "the tokens are never logged")
    # api.token removed from the file: it needs a restart, and says so
    with open(d.config_file, "w") as f:
        f.write("log: {level: info}\n")
    sighup_reloaded(d)
    t.eq((secrets_status(d, "token-b"), secrets_status(d, "token-x")), (200, 401),
         "api.token removed, then SIGHUP: the running token stays")
    t.ok(any("api.token" in l and "needs a restart" in l and
             "level=error" in l for l in d.log()),
         "and the log says the removal waits for a restart")
    t.eq(d.stop(), 0, "exit 0")


def api_token_nul(t):
    """An api.token file with a NUL byte is refused: the API server takes
    the token as a C string, so "\\0secret" was an empty token and the
    server ran without authentication (auth=none), "abc\\0secret" the
    token "abc"."""
    d = Daemon("log: {{level: info}}\napi: {{token: \"file:{tmp}/api-token\"}}\n")
    path = os.path.join(d.tmp, "api-token")
    for content in (b"\0api-secret\n", b"abc\0api-secret\n"):
        with open(path, "wb") as f:
            f.write(content)
        for extra in (["--check-config"], []):
            rc, out, err = run(d.command()[1:] + extra)
            t.ok(rc == 2 and "'api.token'" in err and "NUL" in err and
                 "api-secret" not in err + out,
                 "api.token %r: exit 2%s" % (content[:4], " with "
                                             "--check-config" if extra
                                             else ""), (rc, out, err[-300:]))
    # a SIGHUP to such a file keeps the running token
    with open(path, "w") as f:
        f.write("token-a\n")
    d.start()

    with open(path, "wb") as f:
        f.write(b"abc\0api-secret\n")
    sighup_reloaded(d)
    t.eq((secrets_status(d, "token-a"), secrets_status(d, "abc")),
         (200, 401),
         "after SIGHUP to a token with a NUL byte: the running one stays")
    t.ok(not any("api-secret" in l for l in d.log()),
         "the token is never logged")
    t.eq(d.stop(), 0, "exit 0")


def reload_each_secret(t):
    """A SIGHUP replaces every secret that loads even when another one does
    not: a github.token file gone must not keep a rotated (revoked)
    api.token in force."""
    d = Daemon("log: {{level: info}}\n"
               "api: {{token: \"file:{tmp}/api-token\"}}\n"
               "github:\n  enabled: true\n  api_url: http://127.0.0.1:9\n"
               "  webhook_secrets: [\"file:{secret_file}\"]\n"
               "  token: \"file:{tmp}/gh-token\"\n")
    path = os.path.join(d.tmp, "api-token")
    with open(path, "w") as f:
        f.write("token-a\n")
    with open(os.path.join(d.tmp, "gh-token"), "w") as f:
        f.write("ghp_x\n")
    d.start()
    os.unlink(os.path.join(d.tmp, "gh-token"))
    with open(path, "w") as f:
        f.write("token-b\n")
    sighup_reloaded(d)
    t.eq((secrets_status(d, "token-a"), secrets_status(d, "token-b")),
         (401, 200), "github.token unreadable: api.token is rotated still")
    t.ok(any("github.token" in l and "level=error" in l for l in d.log()),
         "the github.token that failed is logged")
    # a webhook secret gone must not keep the other secrets (nor the log
    # settings) either
    with open(os.path.join(d.tmp, "gh-token"), "w") as f:
        f.write("ghp_x\n")
    os.unlink(d.secret_file)
    with open(path, "w") as f:
        f.write("token-c\n")
    sighup_reloaded(d)
    t.eq((secrets_status(d, "token-b"), secrets_status(d, "token-c")),
         (401, 200), "webhook secret unreadable: api.token is rotated still")
    t.ok(any("keeping the running webhook secrets" in l and
             "level=error" in l for l in d.log()),
         "the webhook secret that failed is logged")
    t.eq(d.stop(), 0, "exit 0")


def json_logs(t):
    d = Daemon(GITHUB_CONFIG.replace("log: {{level: debug}}",
                                     "log: {{level: info, format: json}}"))
    d.start()
    key = str(uuid.uuid4())
    d.github("issue_comment", DOC, key)
    d.stop()
    lines = [l for l in d.log() if l.strip()]
    parsed = []
    for l in lines:
        try:
            parsed.append(json.loads(l))
        except ValueError:
            t.ok(False, "log line is JSON", l)
            return
    t.ok(all("ts" in p and "level" in p and "msg" in p for p in parsed),
         "json logs: every line has ts, level, msg")
    t.ok(any(p.get("delivery") == key for p in parsed),
         "json logs: webhook line carries the delivery id")


def graceful(t):
    """SIGTERM while requests are in flight: they finish, exit 0."""
    d = Daemon(GITHUB_CONFIG).start()
    # a slow client holding a request open
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    start = time.time()
    rc = d.stop()
    t.eq(rc, 0, "SIGTERM with a half-sent request: exit 0")
    t.ok(time.time() - start < 35, "stopped within the shutdown timeout")
    s.close()


def second_daemon(listen, state_dir):
    """Start another diverged (no config file, no API listener) and wait
    up to 15 s for it to exit: (exit status, stderr); one still running
    then is stopped and its stderr says so."""
    tmp = tempfile.mkdtemp(prefix="diverge-busy-")
    p = subprocess.Popen([DIVERGED, "--listen", listen, "--api-listen", "off",
                          "--state-dir", state_dir or
                          os.path.join(tmp, "state")], cwd=tmp,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    try:
        _, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        p.terminate()
        _, err = p.communicate(timeout=20)
        err = "still running after 15 s: " + err
    return p.returncode, err


def address_in_use(t):
    """A second diverged on a listen address that one already serves
    cannot start (exit 1): with SO_REUSEPORT it started and the kernel
    gave it half of the connections, webhooks included."""
    d = Daemon(GITHUB_CONFIG).start()
    rc, err = second_daemon("127.0.0.1:%d" % d.port, None)
    t.ok(rc == 1 and "Address already in use" in err,
         "a second daemon on a busy listen address: exit 1",
         (rc, err[-400:]))
    s, _, _ = d.json("GET", "/healthz")
    t.eq(s, 200, "the first daemon still serves")
    t.eq(d.stop(), 0, "exit 0")
    # a restart on the same address binds at once (SO_REUSEADDR)
    d2 = Daemon(GITHUB_CONFIG, args=["--listen", "127.0.0.1:%d" % d.port,
                                     "--api-listen", "127.0.0.1:0",
                                     "--state-dir", d.state_dir])
    d2.start()
    s, _, _ = d2.json("GET", "/healthz")
    t.eq(s, 200, "a restart on the same address serves at once")
    t.eq(d2.stop(), 0, "exit 0 after the restart")


def limits(t):
    """Slow clients time out; connections beyond the limit are refused."""
    d = Daemon(GITHUB_CONFIG + "http: {{connection_timeout: 1s, "
               "max_connections: 4}}\n").start()
    slow = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    slow.sendall(b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\n")
    start = time.time()
    try:
        data = slow.recv(100)
    except OSError:
        data = b""
    waited = time.time() - start
    t.ok(data == b"" and waited < 5, "a client that stops sending is "
         "disconnected after the idle timeout (%.1fs)" % waited, data)
    slow.close()
    held = [socket.create_connection(("127.0.0.1", d.port), timeout=5)
            for _ in range(4)]
    for h in held:
        h.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    time.sleep(0.2)
    extra = socket.create_connection(("127.0.0.1", d.port), timeout=0.5)
    try:
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        got = extra.recv(100)
    except OSError:
        got = b""
    t.ok(not got.startswith(b"HTTP/1.1 200"), "a connection over the limit "
         "is not served while the others are held", got)
    extra.close()
    for h in held:
        h.close()
    time.sleep(0.3)
    s, _, _ = d.json("GET", "/healthz")
    t.eq(s, 200, "served again once connections are released")
    t.eq(d.stop(), 0, "exit 0")


def slow_clients(t):
    """Clients that trickle a byte every half second never go idle; with
    every connection held by one, the request deadline is what lets a
    normal client in again."""
    d = Daemon(GITHUB_CONFIG + "http: {{request_timeout: 2s, "
               "connection_timeout: 60s, max_connections: 8}}\n").start()
    conns = [socket.create_connection(("127.0.0.1", d.port), timeout=5)
             for _ in range(8)]
    line = b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\nX-Slow: " + \
        b"a" * 40
    cut = 0
    start = time.time()
    for i in range(len(line)):
        for c in conns:
            try:
                c.sendall(line[i:i + 1])
            except OSError:
                pass
        time.sleep(0.5)
        if time.time() - start > 4.5:
            break
    for c in conns:
        try:
            c.settimeout(3)
            cut += c.recv(100) == b""
        except socket.timeout:
            pass                        # still open: not cut
        except OSError:
            cut += 1                    # reset: cut
        c.close()
    t.eq(cut, 8, "clients still trickling headers after request_timeout "
         "are disconnected")
    s, _, _ = d.json("GET", "/healthz")
    t.eq(s, 200, "and the server answers others")
    metrics = d.metrics()
    m = re.search(r"^diverge_http_connections_timed_out_total(?:\{\})? (\d+)",
                  metrics, re.M)
    t.ok(m and int(m.group(1)) >= 8, "counted in "
         "diverge_http_connections_timed_out_total", m and m.group(0))
    t.eq(d.stop(), 0, "exit 0")


def many_connections(t):
    """More open connections than select() can watch (FD_SETSIZE, 1024):
    the server polls with epoll, so the 1,100th is served like the first."""
    import resource
    want = 1400
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        t.skip("many connections: the open-file limit is %d" % hard)
        return
    if soft != resource.RLIM_INFINITY and soft < want:
        # diverged inherits the raised limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    d = Daemon(GITHUB_CONFIG + "http: {{max_connections: 2000}}\n").start()
    held = []
    try:
        for _ in range(1100):
            c = socket.create_connection(("127.0.0.1", d.port), timeout=10)
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            held.append(c)
        time.sleep(0.3)
        answers = []
        for c in (held[0], held[-1]):
            c.sendall(b"\r\n")
            try:
                answers.append(c.recv(100)[:12])
            except OSError as e:
                answers.append(repr(e))
        t.eq(answers, [b"HTTP/1.1 200"] * 2, "with 1,100 connections open, "
             "the first and the last are served")
    finally:
        for c in held:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    t.eq(d.stop(), 0, "exit 0 after many connections")


def per_ip(t):
    """http.max_connections_per_ip: one client address holding its limit
    of connections has its next one closed unanswered; another address
    (127.0.0.2, the same loopback) is still served, and so is the first
    once one of its connections closes."""
    d = Daemon(GITHUB_CONFIG + "http: {{max_connections_per_ip: 2}}\n")
    d.start()

    def healthz(src):
        c = socket.socket()
        c.settimeout(5)
        try:
            c.bind((src, 0))
            c.connect(("127.0.0.1", d.port))
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                      b"Connection: close\r\n\r\n")
            return c.recv(100)[:12]
        except OSError as e:
            return type(e).__name__
        finally:
            c.close()
    held = [socket.create_connection(("127.0.0.1", d.port), timeout=5)
            for _ in range(2)]
    try:
        time.sleep(0.2)
        t.ok(healthz("127.0.0.1") in (b"", "ConnectionResetError"),
             "a third connection from one address: closed, unanswered")
        t.eq(healthz("127.0.0.2"), b"HTTP/1.1 200", "another address is "
             "served")
        held.pop().close()
        time.sleep(0.2)
        t.eq(healthz("127.0.0.1"), b"HTTP/1.1 200", "and the first again "
             "once one of its connections closes")
    finally:
        for c in held:
            c.close()
    t.eq(d.stop(), 0, "exit 0")


def threads(t):
    """Threads carry names an operator can read in top -H; the inbox
    checkpointer runs at a lower CPU priority than the request path."""
    d = Daemon(GITHUB_CONFIG).start()
    base = "/proc/%d/task" % d.proc.pid
    expected = ("inbox-writer", "inbox-worker", "inbox-ckpt", "store-writer",
                "ctrl-worker", "pruner", "http-reaper")
    # a thread that has not run yet still has its parent's name: on a
    # loaded machine, look again for a while
    deadline = time.time() + 10
    while True:
        names, nice = {}, {}
        for tid in os.listdir(base):
            try:
                with open(os.path.join(base, tid, "comm")) as f:
                    name = f.read().strip()
                with open(os.path.join(base, tid, "stat")) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            names[name] = names.get(name, 0) + 1
            nice[name] = int(fields[16])
        if all(n in names for n in expected) or time.time() > deadline:
            break
        time.sleep(0.1)
    for want in expected:
        t.ok(want in names, "a thread named %s" % want, sorted(names))
    t.eq(nice.get("pruner"), 10, "the pruner runs at nice 10")
    t.eq(nice.get("inbox-ckpt"), 0, "the checkpointer at nice 0: starved, "
         "it would let the WAL grow")
    t.eq(nice.get("inbox-writer"), 0, "the inbox writers at nice 0")
    t.eq(d.stop(), 0, "exit 0")


def state_dir_in_use(t):
    """A second diverged on a state directory that one already uses
    cannot start (exit 1, naming the holder): both would handle the same
    inbox entries and write the embedded store behind each other's back.
    The lock goes with the process, kill -9 included."""
    d = Daemon(GITHUB_CONFIG).start()
    rc, err = second_daemon("127.0.0.1:0", d.state_dir)
    t.ok(rc == 1 and "is in use by another diverged (pid %d)" %
         d.proc.pid in err, "a second daemon on the same state_dir: exit 1, "
         "naming the first one's pid", (rc, err[-400:]))
    s, _, _ = d.json("GET", "/healthz")
    t.eq(s, 200, "the first daemon still serves")
    # a crash leaves no stale lock: the next start takes it
    d.kill9()
    d.start()
    s, _, _ = d.json("GET", "/healthz")
    t.eq(s, 200, "after kill -9 a restart on the same state_dir serves")
    t.eq(d.stop(), 0, "exit 0")


SECRETS = "/api/v1/namespaces/default/secrets"



def db_stamps(path):
    """(application_id, user_version) of a database file."""
    c = sqlite3.connect(path)
    try:
        return (c.execute("PRAGMA application_id").fetchone()[0],
                c.execute("PRAGMA user_version").fetchone()[0])
    finally:
        c.close()


def db_restamp(path, app, ver):
    c = sqlite3.connect(path)
    c.execute("PRAGMA application_id = %d" % app)
    c.execute("PRAGMA user_version = %d" % ver)
    c.commit()
    c.close()


def schema_versions(t):
    """Every database of the state directory says it is diverged's and
    which schema wrote it. One from a newer diverged (an upgrade rolled
    back) or from another program stops the start with a message naming
    the file; one from before the stamps is stamped, its data kept."""
    d = Daemon().start()
    t.eq(api(d, "POST", SECRETS, {"apiVersion": "v1", "kind": "Secret",
                                  "metadata": {"name": "keep-me"},
                                  "stringData": {"k": "v"}})[0], 201,
         "an object made through the embedded API")
    t.eq(d.stop(), 0, "stopped")
    dbs = sorted(f for f in os.listdir(d.state_dir) if f.endswith(".db"))
    stamps = {f: db_stamps(os.path.join(d.state_dir, f)) for f in dbs}
    t.ok(len(dbs) == 4 and all(v == (0x44495647, 1)
                               for v in stamps.values()),
         "each database is stamped: application_id DIVG, schema 1", stamps)
    newer = os.path.join(d.state_dir, "inbox-2.db")
    for app, ver, says, name in (
            (0x44495647, 2, "was written by a newer diverged (schema 2; "
             "this one knows up to 1)", "a database of a newer schema"),
            (0x12345678, 1, "belongs to another program (application_id "
             "0x12345678", "a database of another program"),
            (0, 5, "belongs to another program (user_version 5 and no "
             "application_id", "another program's, without an "
             "application_id")):
        db_restamp(newer, app, ver)
        rc, err = second_daemon("127.0.0.1:0", d.state_dir)
        t.ok(rc == 1 and ("database '%s' %s" % (newer, says)) in err,
             name + ": exit 1, naming it", (rc, err[-400:]))
    # refused, it is left as it was: not switched to WAL mode
    other_dir = tempfile.mkdtemp(prefix="diverge-other-")
    other = os.path.join(other_dir, "diverge.db")
    c = sqlite3.connect(other)
    c.execute("PRAGMA application_id = %d" % 0x12345678)
    c.execute("CREATE TABLE theirs (k TEXT)")
    c.execute("INSERT INTO theirs VALUES ('v')")
    c.commit()
    c.close()
    rc, err = second_daemon("127.0.0.1:0", other_dir)
    c = sqlite3.connect(other)
    mode = c.execute("PRAGMA journal_mode").fetchone()[0]
    c.close()
    t.ok(rc == 1 and "belongs to another program" in err and
         mode == "delete" and not os.path.exists(other + "-wal"),
         "another program's database is refused untouched (journal mode "
         "%s)" % mode, (rc, err[-400:], sorted(os.listdir(other_dir))))
    shutil.rmtree(other_dir, ignore_errors=True)
    # from before the stamps: stamped at the next start, rows kept
    main_db = os.path.join(d.state_dir, "diverge.db")
    db_restamp(newer, 0, 0)
    db_restamp(main_db, 0, 0)
    d.start()
    s, _, _ = d.json("GET", "/healthz")
    t.eq(s, 200, "a state directory from before the stamps: it starts")
    s, obj = api(d, "GET", SECRETS + "/keep-me")
    t.eq((s, (obj or {}).get("data")), (200, {"k": "dg=="}),
         "its objects are kept")
    t.eq(d.stop(), 0, "stopped")
    t.eq((db_stamps(main_db), db_stamps(newer)),
         ((0x44495647, 1), (0x44495647, 1)), "and it is stamped")


def damaged_db(t):
    """A database SQLite finds damaged stops the start with a message that
    names the file among the state directory's four and says what to do;
    the others are not blamed."""
    for name in ("diverge.db", "inbox-2.db"):
        d = Daemon().start()
        t.eq(d.stop(), 0, "stopped")
        path = os.path.join(d.state_dir, name)
        with open(path, "r+b") as f:        # page 1 after its header
            f.seek(100)
            f.write(bytes(range(256)) * 8)
        rc, err = second_daemon("127.0.0.1:0", d.state_dir)
        t.ok(rc == 1 and ("sqlite: '%s': database disk image is malformed "
                          "(the file is damaged: stop diverged, then "
                          "restore it from a backup" % path) in err,
             "%s damaged: exit 1, naming it" % name, (rc, err[-400:]))


def main(t):
    cli(t)
    config_errors(t)
    embedded_default(t)
    operations(t)
    api_token_rotation(t)
    api_token_nul(t)
    reload_each_secret(t)
    json_logs(t)
    graceful(t)
    address_in_use(t)
    state_dir_in_use(t)
    schema_versions(t)
    damaged_db(t)
    limits(t)
    slow_clients(t)
    many_connections(t)
    per_ip(t)
    threads(t)


run_tests(main)
