"""Webhook intake end to end: status codes and bodies of DESIGN section 6,
bad input that must keep the daemon serving, duplicates, GitLab tokens and
Standard Webhooks signatures, back-pressure, and the worker's record."""

import base64
import hashlib
import hmac
import json
import time
import uuid

from divtest import (Daemon, GITHUB_CONFIG, compact, fixture, run_tests,
                     sign, with_comment)

SIGNING = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

PR_COMMENT = fixture("github/go-playground--pull-request-issue-comment.json")
MR_NOTE = fixture("gitlab/gitlab-docs--comment-on-a-merge-request.json")
MR_CLOSE = fixture("gitlab/go-gitlab--merge_request.json")
MR_CLOSE["object_attributes"]["action"] = "close"


def did():
    return str(uuid.uuid4())


def github_cases(t, d):
    doc = with_comment(PR_COMMENT, "LGTM\n/diverge fix stop the N+1 queries")
    body = compact(doc)
    key = did()
    s, _, j = d.github("issue_comment", body, key)
    t.eq((s, j), (202, {"accepted": True, "delivery": key}),
         "relevant comment: 202 accepted with the delivery id")
    s, _, j = d.github("issue_comment", body, key)
    t.eq((s, j.get("duplicate")), (200, True),
         "same delivery id again: 200 duplicate")

    s, _, j = d.github("issue_comment", PR_COMMENT, did())
    t.eq((s, j), (200, {"ignored": "no /diverge command"}),
         "comment without a command: 200 ignored")
    s, _, j = d.github("ping", fixture("github/octokit-webhooks--ping.payload.json"),
                       did())
    t.eq((s, j), (200, {"ignored": "ping"}), "ping: 200 ignored")
    s, _, j = d.github("push", {"ref": "refs/heads/main"}, did())
    t.eq((s, j), (200, {"ignored": "event not handled"}),
         "push: 200 ignored")
    edited = with_comment(
        fixture("github/octokit-webhooks--issue_comment.edited.payload.json"),
        "/diverge fix x")
    s, _, j = d.github("issue_comment", edited, did())
    t.eq(s, 200, "edited comment with a command: 200 ignored")

    # signatures
    hdr = {"Content-Type": "application/json", "X-GitHub-Event":
           "issue_comment", "X-GitHub-Delivery": did()}
    good = sign(d.secret, body)
    bad = {
        "missing": None,
        "wrong secret": sign("nope", body),
        "truncated": good[:-1],
        "upper-cased": "sha256=" + good[7:].upper(),
        "sha1 only": "sha1=" + hmac.new(d.secret.encode(), body,
                                        hashlib.sha1).hexdigest(),
        "empty": "",
    }
    for name, value in bad.items():
        h = dict(hdr)
        if value is not None:
            h["X-Hub-Signature-256"] = value
        if name == "sha1 only":
            h["X-Hub-Signature"] = value
            del h["X-Hub-Signature-256"]
        s, _, j = d.json("POST", "/webhooks/github", body, h)
        t.ok(s == 401 and isinstance(j, dict) and "error" in j,
             "signature %s: 401 with a JSON error" % name, (s, j))
        t.ok(d.secret not in json.dumps(j), "signature %s: secret not echoed"
             % name)
    s, _, j = d.json("POST", "/webhooks/github", body + b" ",
                     dict(hdr, **{"X-Hub-Signature-256": good}))
    t.eq(s, 401, "body changed after signing: 401")

    # form-encoded body
    form = b"payload=" + __import__("urllib.parse").parse.quote_plus(
        body.decode()).encode()
    s, _, j = d.github("issue_comment", form, did(),
                       content_type="application/x-www-form-urlencoded")
    t.eq(s, 202, "form-encoded payload= delivery: 202")

    # malformed but signed
    bads = {
        "invalid JSON": b"{\"action\":",
        "array": b"[1,2]",
        "missing fields": compact({"action": "created", "issue": {
            "number": 1, "pull_request": {}}}),
        "wrong types": compact(dict(doc, comment=dict(doc["comment"],
                                                      id="7"))),
        "huge number": body.replace(b'"number":3', b'"number":' +
                                    b"9" * 40),
        "deep nesting": b'{"a":' * 10000 + b"1" + b"}" * 10000,
        # a parser keeping the last "comment" sees no body, no author
        "a duplicate parent key": body[:-1] + b',"comment":{}}',
    }
    for name, payload in bads.items():
        s, _, j = d.github("issue_comment", payload, did())
        t.ok(s == 400 and j and j.get("error"), "%s: 400 with a reason" %
             name, (s, j))

    # content type, method, size
    s, _, j = d.github("issue_comment", body, did(), content_type="text/plain")
    t.eq(s, 415, "text/plain: 415")
    s, h, j = d.json("GET", "/webhooks/github")
    t.ok(s == 405 and "POST" in h.get("allow", ""), "GET: 405 with Allow",
         (s, h))
    s, _, j = d.json("GET", "/nope")
    t.ok(s == 404 and j.get("error"), "unknown path: 404 JSON", (s, j))
    # HEAD is served wherever GET is, without the body (RFC 9110 9.3.2)
    for path in (b"/healthz", b"/metrics"):
        out = d.raw(b"HEAD %s HTTP/1.1\r\nHost: x\r\nConnection: close"
                    b"\r\n\r\n" % path)
        head, _, rest = out.partition(b"\r\n\r\n")
        t.ok(head.startswith(b"HTTP/1.1 200") and rest == b"" and
             b"content-length:" in head.lower(),
             "HEAD %s: 200, the headers only" % path.decode(), out[:300])
    s, h, j = d.json("PUT", "/healthz")
    t.ok(s == 405 and h.get("allow") == "GET, HEAD",
         "PUT /healthz: 405, Allow: GET, HEAD", (s, h))
    out = d.raw(b"HEAD /webhooks/github HTTP/1.1\r\nHost: x\r\n"
                b"Connection: close\r\n\r\n")
    t.ok(out.startswith(b"HTTP/1.1 405") and b"Allow: POST\r\n" in out,
         "HEAD /webhooks/github: 405, Allow: POST", out[:300])
    # a client announcing a body over 5 MiB gets 413 after the headers
    out = d.raw(b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nX-GitHub-Event: "
                b"issue_comment\r\nContent-Length: %d\r\n\r\n" %
                (5 * 1024 * 1024 + 1))
    t.ok(out.startswith(b"HTTP/1.1 413") and b'"error"' in out,
         "Content-Length over 5 MiB: 413 before the body is read", out[:300])
    # chunked body over the limit, no Content-Length
    req = (b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\n"
           b"Content-Type: application/json\r\nTransfer-Encoding: chunked"
           b"\r\nX-GitHub-Event: issue_comment\r\n\r\n")
    chunk = b"x" * 65536
    payload = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk)
                       for _ in range(90)) + b"0\r\n\r\n"
    out = d.raw(req + payload, timeout=5)
    t.ok(out.startswith(b"HTTP/1.1 413") or out == b"",
         "chunked body over the limit: 413 or closed, never accepted",
         out[:200])
    # a body length a proxy in front could read otherwise: a JSON 400
    # before the body, nothing stored, the connection not reused
    signed = (b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nX-GitHub-Event: "
              b"issue_comment\r\nX-Hub-Signature-256: %s\r\n"
              % sign(d.secret, body).encode())
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    framings = {
        "Content-Length and Transfer-Encoding":
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked,
        "Transfer-Encoding identity":
            b"Transfer-Encoding: identity\r\n\r\n" + body,
        "Transfer-Encoding gzip, chunked":
            b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked,
        "two different Content-Length":
            b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n"
            % len(body) + body,
    }
    for name, rest in framings.items():
        key2 = did()
        out = d.raw(signed + b"X-GitHub-Delivery: %s\r\n" % key2.encode()
                    + rest + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        j = out.partition(b"\r\n\r\n")[2]
        t.ok(out.startswith(b"HTTP/1.1 400") and b'"error"' in j and
             b"HTTP/1.1 200" not in out and b"HTTP/1.1 202" not in out,
             "%s: 400 with a JSON error, nothing after it" % name, out[:300])
        t.eq(d.count("inbox", "key = 'github:%s'" % key2), 0,
             "%s: nothing stored" % name)
    # RFC 9112 3.2, 5.1: a header name that is not a token (libmicrohttpd
    # takes "Content-Length : N" as another header and read no body: the
    # body a proxy in front sent by it was our next request), two Hosts,
    # or none in HTTP/1.1: 400 with a JSON error, nothing after it
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    heads = {
        "Content-Length : N": b"Content-Length : %d\r\nHost: x\r\n" %
                              (len(body) + len(smuggled)),
        "Host : x": b"Host : x\r\nContent-Length: %d\r\n" % len(body),
        "a tab in a name": b"Host: x\r\nX\tPad: 1\r\nContent-Length: %d"
                           b"\r\n" % len(body),
        "two Hosts": b"Host: x\r\nHost: y\r\nContent-Length: %d\r\n" %
                     len(body),
        "no Host": b"Content-Length: %d\r\n" % len(body),
    }
    for name, head in heads.items():
        key2 = did()
        out = d.raw(b"POST /webhooks/github HTTP/1.1\r\n" + head +
                    b"Content-Type: application/json\r\nX-GitHub-Event: "
                    b"issue_comment\r\nX-Hub-Signature-256: %s\r\n"
                    b"X-GitHub-Delivery: %s\r\n\r\n" % (
                        sign(d.secret, body).encode(), key2.encode()) +
                    body + smuggled)
        t.ok(out.startswith(b"HTTP/1.1 400") and
             out.partition(b"\r\n\r\n")[2].startswith(b'{"error":') and
             out.count(b"HTTP/1.1 ") == 1,
             "%s: 400 with a JSON error, nothing after it" % name, out[:300])
        t.eq(d.count("inbox", "key = 'github:%s'" % key2), 0,
             "%s: nothing stored" % name)
    out = d.raw(b"GET /healthz HTTP/1.0\r\n\r\n")
    t.ok(out.startswith(b"HTTP/1.1 200"), "HTTP/1.0 needs no Host: 200",
         out[:100])
    # a %00 would cut the decoded path short: refused, not routed
    key2 = did()
    out = d.raw(b"POST /webhooks/github%%00x HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nX-GitHub-Event: "
                b"issue_comment\r\nX-Hub-Signature-256: %s\r\n"
                b"X-GitHub-Delivery: %s\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (
                    sign(d.secret, body).encode(), key2.encode(), len(body),
                    body))
    t.ok(out.startswith(b"HTTP/1.1 400") and b"NUL" in
         out.partition(b"\r\n\r\n")[2], "a signed delivery to "
         "/webhooks/github%00x: 400 with a JSON error", out[:300])
    t.eq(d.count("inbox", "key = 'github:%s'" % key2), 0,
         "... nothing stored")
    out = d.raw(b"GET /healthz?x=%00 HTTP/1.1\r\nHost: x\r\n"
                b"Connection: close\r\n\r\n")
    t.ok(out.startswith(b"HTTP/1.1 400"), "GET /healthz?x=%00: 400",
         out[:120])

    def pad(kib):
        return b"".join(b"X-Pad-%d: %s\r\n" % (i, b"y" * 1000)
                        for i in range(kib))
    # README: diverged's JSON 431 over http.max_header_bytes (32 KiB), up
    # to the connection's memory (twice that plus 16 KiB); libmicrohttpd's
    # own 431 past it, and its own answers to what is not HTTP/1.x
    out = d.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + pad(40) + b"\r\n")
    t.ok(out.startswith(b"HTTP/1.1 431") and
         out.partition(b"\r\n\r\n")[2].startswith(b'{"error":'),
         "40 KB of headers: 431 with a JSON error", out[:300])
    out = d.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + pad(100) +
                b"\r\n")
    t.ok(out.startswith(b"HTTP/1.1 431"),
         "100 KB of headers: 431 (libmicrohttpd's)", out[:60])
    mhd = {
        "a Content-Length that is not a number":
            (b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\nContent-Type:"
             b" application/json\r\nContent-Length: -1\r\n\r\n{}",
             b"HTTP/1.1 400"),
        "HTTP/2.0 on the request line":
            (b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", b"HTTP/1.1 505"),
        "HTTP/2's connection preface":
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"HTTP/1.1 505"),
        "a request line that is not HTTP": (b"GARBAGE\r\n\r\n", b""),
    }
    for name, (req, want) in mhd.items():
        t0 = time.monotonic()
        out = d.raw(req)
        # b"" is also what a timeout returns: closed means before it
        t.ok(out[:12] == want and time.monotonic() - t0 < 4, "%s: %s" % (
            name, want.decode() or "the connection closed, no answer"),
            (out[:120], time.monotonic() - t0))
    s, _, _ = d.json("GET", "/healthz")
    t.eq(s, 200, "still serving after bad input")
    return key


def gitlab_cases(t, d, signing=False):
    note = with_comment(MR_NOTE, "/diverge fix make it fast")
    key = did()
    extra = None
    body = compact(note)
    if signing:
        ts = str(int(time.time()))
        raw = base64.b64decode(SIGNING[6:])
        sig = base64.b64encode(hmac.new(raw, ("%s.%s." % (key, ts)).encode()
                                        + body, hashlib.sha256).digest())
        extra = {"webhook-id": key, "webhook-timestamp": ts,
                 "webhook-signature": "v1," + sig.decode()}
    s, _, j = d.gitlab("Note Hook", body, key, extra=extra)
    t.eq((s, j), (202, {"accepted": True, "delivery": key}),
         "gitlab note with a command: 202 (signing=%s)" % signing)
    s, _, j = d.gitlab("Note Hook", body, key, extra=extra)
    t.eq(s, 200, "gitlab same Idempotency-Key: 200 duplicate")
    s, _, j = d.gitlab("Note Hook", body, did(), token="wrong", extra=extra)
    t.eq(s, 401, "gitlab wrong token: 401")
    s, _, j = d.gitlab("Note Hook", body, did(), token=None, extra=extra)
    t.eq(s, 401, "gitlab missing token: 401")
    s, _, j = d.gitlab("Note Hook", MR_NOTE, did(), extra=extra)
    t.eq(s, 200 if not signing else 401,
         "gitlab note without a command: 200 ignored (or 401 when the "
         "signature does not cover it)")
    s, _, j = d.gitlab("Push Hook", fixture("gitlab/go-gitlab--push.json"),
                       did(), extra=extra)
    t.ok(s in (200, 401), "gitlab push: never 4xx other than auth", s)
    if not signing:
        # GitLab 14.8 to 17.3: no Idempotency-Key, and X-Gitlab-Event-UUID
        # is the originating request's, on every event it triggers
        same = {"X-Gitlab-Event-UUID": did()}
        both = compact(with_comment(MR_NOTE, "/diverge status\n/close"))
        s, _, j = d.gitlab("Note Hook", both, None, extra=same)
        t.eq(s, 202, "gitlab note keyed by X-Gitlab-Event-UUID: 202")
        s, _, j = d.gitlab("Note Hook", both, None, extra=same)
        t.eq((s, j.get("duplicate")), (200, True),
             "the same note with the same X-Gitlab-Event-UUID: duplicate")
        s, _, j = d.gitlab("Merge Request Hook", MR_CLOSE, None, extra=same)
        t.eq(s, 202, "the merge request it closed, same X-Gitlab-Event-UUID:"
             " 202, not a duplicate")
    if signing:
        # the same signed delivery replayed under another Idempotency-Key
        # (not signed): the signed webhook-id keys it, a duplicate
        s, _, j = d.gitlab("Note Hook", body, did(), extra=extra)
        t.eq((s, j), (200, {"duplicate": True, "delivery": key}),
             "gitlab signed delivery replayed under a new Idempotency-Key: "
             "200 duplicate of its webhook-id")
        stale = dict(extra, **{"webhook-timestamp": str(int(time.time())
                                                        - 600)})
        s, _, j = d.gitlab("Note Hook", body, did(), extra=stale)
        t.eq(s, 401, "gitlab signature with a stale timestamp: 401")
        s, _, j = d.gitlab("Note Hook", body, did(), extra=None)
        t.eq(s, 401, "gitlab signing configured, no signature: 401")
    return key


def main(t):
    d = Daemon(GITHUB_CONFIG).start()
    gh_key = github_cases(t, d)
    gl_key = gitlab_cases(t, d)
    got = d.wait_handled(["github:" + gh_key, "gitlab:" + gl_key])
    t.eq(got.get("github:" + gh_key), 1, "github delivery handled once")
    t.eq(got.get("gitlab:" + gl_key), 1, "gitlab delivery handled once")
    rows = d.query("SELECT repo, number, comment_id, body FROM "
                   "handled_events WHERE key = ?", ("github:" + gh_key,))
    t.eq(rows, [("chhsia0/knative-route-demo", 3, 546616131,
                 "LGTM\n/diverge fix stop the N+1 queries")],
         "the handler saw the normalized event")
    m = d.metrics()
    t.ok('diverge_webhook_deliveries_total{provider="github",outcome='
         '"accepted",reason="accepted"}' in m, "metrics count accepted")
    t.ok('outcome="ignored",reason="ping"' in m, "metrics count ignored "
         "by reason")
    t.ok('diverge_http_requests_total{route="/webhooks/github",code="401"}'
         in m, "metrics count requests by route and code")
    lines = [l for l in d.log() if "webhook" in l]
    t.ok(lines and all("delivery=" in l for l in lines),
         "every webhook log line carries its delivery id",
         "\n".join(l for l in lines if "delivery=" not in l))
    t.ok(not any(d.secret in l for l in d.log()), "secret never logged")
    t.eq(d.stop(), 0, "SIGTERM: exit 0")

    # GitLab with a signing token as well
    d2 = Daemon(GITHUB_CONFIG + "  signing_token: \"file:{tmp}/signing\"\n")
    with open(d2.tmp + "/signing", "w") as f:
        f.write(SIGNING + "\n")
    d2.start()
    gitlab_cases(t, d2, signing=True)
    d2.stop()

    # back-pressure: workers held, capacity 3
    d3 = Daemon(GITHUB_CONFIG + "inbox: {{capacity: 3}}\n",
                env={"DIVERGE_TEST_HOLD_INBOX": "1"}).start()
    body = with_comment(PR_COMMENT, "/diverge status")
    keys = [did() for _ in range(3)]
    codes = [d3.github("issue_comment", body, k)[0] for k in keys]
    t.eq(codes, [202, 202, 202], "inbox below capacity: 202")
    s, h, j = d3.github("issue_comment", body, did())
    t.ok(s == 503 and h.get("retry-after") and j.get("error"),
         "full inbox: 503 with Retry-After", (s, h, j))
    s, _, j = d3.github("issue_comment", body, keys[1])
    t.eq((s, j.get("duplicate")), (200, True), "full inbox: a redelivery "
         "of a stored delivery is still 200 duplicate, not 503")
    t.eq(d3.count("inbox"), 3,
         "full inbox stored nothing more")
    t.ok("diverge_inbox_depth 3" in d3.metrics(), "inbox depth gauge")
    d3.stop()
    # restart without the hold: the three are processed
    d4 = Daemon(GITHUB_CONFIG, state_dir=d3.state_dir).start()
    got = d4.wait_handled([k for (k,) in d4.query("SELECT key FROM inbox")])
    t.eq(len(got), 3, "entries stored before a restart are processed after")
    d4.stop()


run_tests(main)
