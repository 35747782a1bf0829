#!/usr/bin/env python3
"""TAP self-test for tests/fakes/scm_fake.py (fake GitHub and GitLab APIs).

Starts the fake with tests/data/api/scm-seed-example.json, talks to it with
http.client, prints "ok N - name" / "not ok N - name" and "1..N", and exits
1 on any failure.  Runs in a few seconds.
"""

import base64
import calendar
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "scm_fake.py")
DATA = os.path.join(HERE, "..", "data", "api")
SEED = os.path.join(DATA, "scm-seed-example.json")
GH_TOKEN = "ghp_test_token"
GL_TOKEN = "glpat-test-token"
REPO = "/github/repos/octocat/Hello-World"
PROJ = "/gitlab/api/v4/projects/5"
MR = PROJ + "/merge_requests/2"
APP_ID = 12345

RESULTS = []


def check(name, cond, diag=None):
    n = len(RESULTS) + 1
    RESULTS.append(bool(cond))
    print(f"{'ok' if cond else 'not ok'} {n} - {name}", flush=True)
    if not cond and diag is not None:
        for line in str(diag).splitlines()[:30]:
            print(f"#   {line}", flush=True)


def fixture(provider, name):
    with open(os.path.join(DATA, provider, name), encoding="utf-8") as f:
        return json.load(f)


def jwt(payload, header=None):
    enc = lambda o: base64.urlsafe_b64encode(                 # noqa: E731
        json.dumps(o, separators=(",", ":")).encode()).rstrip(b"=").decode()
    return enc(header or {"alg": "RS256", "typ": "JWT"}) + "." + \
        enc(payload) + ".c2lnbmF0dXJl"


def app_jwt(iss=APP_ID, iat_off=-30, exp_off=570):
    t = int(time.time())
    return jwt({"iat": t + iat_off, "exp": t + exp_off, "iss": iss})


class Resp:
    def __init__(self, r, raw, elapsed):
        self.status = r.status
        self.headers = {k.lower(): v for k, v in r.getheaders()}
        self.raw = raw
        self.elapsed = elapsed
        try:
            self.json = json.loads(raw)
        except ValueError:
            self.json = None

    def h(self, name):
        return self.headers.get(name.lower())

    def links(self):
        out = {}
        for part in (self.h("link") or "").split(","):
            part = part.strip()
            if not part:
                continue
            url, _, rel = part.partition(";")
            out[rel.strip().split("=")[1].strip('"')] = url.strip()[1:-1]
        return out


class Fake:
    def __init__(self, *args):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, FAKE, "--port", "0", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        r, _, _ = select.select([self.proc.stdout], [], [], 15)
        if not r:
            raise RuntimeError("the fake did not start within 15 s")
        self.info = json.loads(self.proc.stdout.readline())
        self.port = self.info["port"]

    def req(self, method, path, body=None, headers=None, timeout=10):
        c = http.client.HTTPConnection("127.0.0.1", self.port,
                                       timeout=timeout)
        h = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        t0 = time.monotonic()
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        return Resp(r, raw, time.monotonic() - t0)

    def gh(self, method, path, body=None, token=GH_TOKEN, scheme="Bearer",
           headers=None):
        h = {"Accept": "application/vnd.github+json",
             "X-GitHub-Api-Version": "2022-11-28",
             "User-Agent": "diverge-test/1"}
        if token is not None:
            h["Authorization"] = f"{scheme} {token}"
        h.update(headers or {})
        if path.startswith("/"):
            path = REPO + path if not path.startswith(("/github",
                                                       "/gitlab")) else path
        return self.req(method, path, body, h)

    def gl(self, method, path, body=None, token=GL_TOKEN, bearer=False,
           headers=None):
        h = {"User-Agent": "diverge-test/1"}
        if token is not None:
            if bearer:
                h["Authorization"] = "Bearer " + token
            else:
                h["PRIVATE-TOKEN"] = token
        h.update(headers or {})
        return self.req(method, path, body, h)

    def ctl(self, method, path, body=None):
        return self.req(method, "/_fake/" + path, body)

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def strip_base(obj, base):
    """Fake URLs back to https://api.github.com, to compare with fixtures."""
    return json.loads(json.dumps(obj).replace(base, "https://api.github.com"))


# ---------------------------------------------------------------------------


def test_start(f):
    i = f.info
    check("start-up line names port, github and gitlab bases",
          i["github"] == f"http://127.0.0.1:{f.port}/github" and
          i["gitlab"] == f"http://127.0.0.1:{f.port}/gitlab/api/v4" and
          i["control"].endswith("/_fake"), i)


def test_github_fixtures(f):
    base = f.info["github"]
    r = f.gh("GET", "/issues/1347/comments")
    want = fixture("github", "issues.list-comments.json")
    got = strip_base(r.json, base) if r.json else None
    ok = r.status == 200 and isinstance(got, list) and len(got) == 1
    if ok:
        # a PR comment's html_url says /pull/ where the fixture says /issues/
        check("list comments: html_url of a PR comment uses /pull/",
              got[0]["html_url"].endswith("/pull/1347#issuecomment-1"),
              got[0]["html_url"])
        got[0]["html_url"] = want[0]["html_url"]
    check("list comments of the seeded fixture comment == "
          "issues.list-comments.json", ok and got == want,
          json.dumps(got)[:2000])
    check("list comments key order as the fixture",
          ok and list(got[0]) == list(want[0]))
    r = f.gh("GET", "/pulls/1347")
    want = fixture("github", "pulls.get.json")
    ok = r.status == 200 and list(r.json) == list(want)
    check("GET pull: same keys in the same order as pulls.get.json", ok,
          r.raw[:500])
    check("GET pull: head/base ref and sha, repo, state",
          r.json["head"]["ref"] == "new-topic" and
          r.json["head"]["sha"] == "6dcb09b5b57875f334f61aebed695e2e4193db5e"
          and r.json["base"]["ref"] == "main" and
          r.json["head"]["repo"]["full_name"] == "octocat/Hello-World" and
          list(r.json["head"]["repo"]) == list(want["head"]["repo"]) and
          r.json["state"] == "open" and r.json["merged"] is False and
          r.json["number"] == 1347, r.raw[:500])
    r = f.gh("GET", "/pulls/7")
    check("GET fork pull: head repo is the fork (fork: true)",
          r.status == 200 and r.json["head"]["repo"]["full_name"] ==
          "mallory/Hello-World" and r.json["head"]["repo"]["fork"] is True and
          r.json["base"]["repo"]["full_name"] == "octocat/Hello-World" and
          r.json["head"]["label"] == "mallory:evil", r.raw[:300])
    r = f.gh("GET", "/pulls/99")
    check("GET missing pull: 404 Not Found",
          r.status == 404 and r.json["message"] == "Not Found" and
          "documentation_url" in r.json, r.raw)


def test_github_comments(f):
    want = fixture("github", "issues.create-comment.json")
    r = f.gh("POST", "/issues/1347/comments", {"body": "hello"})
    ok = r.status == 201 and list(r.json) == list(want)
    check("create comment: 201 shaped like issues.create-comment.json", ok,
          r.raw[:500])
    cid = r.json["id"] if ok else 0
    check("create comment: Location, body, user of the token",
          ok and r.h("location") == f.info["github"] +
          f"/repos/octocat/Hello-World/issues/comments/{cid}" and
          r.json["body"] == "hello" and
          r.json["user"]["login"] == "diverge-test" and
          r.json["author_association"] == "COLLABORATOR", r.headers)
    r = f.gh("PATCH", f"/issues/comments/{cid}", {"body": "hello again"})
    check("update comment: 200 with the new body",
          r.status == 200 and r.json["body"] == "hello again" and
          list(r.json) == list(fixture("github",
                                       "issues.update-comment.json")), r.raw)
    r = f.gh("GET", f"/issues/comments/{cid}")
    check("get comment", r.status == 200 and r.json["body"] == "hello again")
    r = f.gh("PATCH", "/issues/comments/424242", {"body": "x"})
    check("update missing comment: 404", r.status == 404)
    r = f.gh("POST", "/issues/1347/comments", {"body": "x" * 65536})
    check("comment of exactly 65536 characters: 201", r.status == 201)
    big = f.gh("POST", "/issues/1347/comments", {"body": "x" * 65537})
    e = (big.json or {}).get("errors") or [{}]
    check("comment of 65537 characters: 422 Body is too long",
          big.status == 422 and big.json["message"] == "Validation Failed"
          and e[0].get("message") ==
          "Body is too long (maximum is 65536 characters)" and
          e[0].get("resource") == "IssueComment", big.raw[:300])
    r = f.gh("PATCH", f"/issues/comments/{cid}", {"body": "é" * 65537})
    check("update with 65537 characters: 422", r.status == 422)
    r = f.gh("POST", "/issues/1347/comments", {"text": "no body"})
    check("create without body: 422", r.status == 422, r.raw)
    r = f.gh("POST", "/issues/1347/comments", "{not json")
    check("create with bad JSON: 400 Problems parsing JSON",
          r.status == 400 and r.json["message"] == "Problems parsing JSON")
    r = f.gh("DELETE", f"/issues/comments/{cid}")
    r2 = f.gh("GET", f"/issues/comments/{cid}")
    check("delete comment: 204, then 404", r.status == 204 and
          r.raw == b"" and r2.status == 404)


def test_github_reactions(f):
    want = fixture("github", "reactions.create-for-issue-comment.json")
    r = f.gh("POST", "/issues/comments/1/reactions", {"content": "eyes"})
    check("reaction: 201 the first time, shaped like the fixture",
          r.status == 201 and list(r.json) == list(want) and
          r.json["content"] == "eyes" and
          r.json["user"]["login"] == "diverge-test", r.raw[:300])
    rid = r.json["id"] if r.json else None
    r = f.gh("POST", "/issues/comments/1/reactions", {"content": "eyes"})
    check("same reaction again: 200 with the same reaction",
          r.status == 200 and r.json["id"] == rid, r.raw[:200])
    r = f.gh("POST", "/issues/comments/1/reactions", {"content": "eyes"},
             token="ghp_alice_token")
    check("same content by another user: 201", r.status == 201)
    r = f.gh("POST", "/issues/comments/1/reactions", {"content": "smile"})
    check("reaction outside the enum: 422", r.status == 422, r.raw)
    r = f.gh("POST", "/issues/comments/9999/reactions", {"content": "+1"})
    check("reaction on a missing comment: 404", r.status == 404)
    # review comment 1 (on the diff) is not issue comment 1: ids apart
    r = f.gh("POST", "/pulls/comments/1/reactions", {"content": "rocket"})
    check("reaction on a review comment: 201, shaped like the fixture",
          r.status == 201 and list(r.json) == list(want) and
          r.json["content"] == "rocket", r.raw[:300])
    r = f.gh("POST", "/pulls/comments/1/reactions", {"content": "rocket"})
    check("same review-comment reaction again: 200", r.status == 200)
    r = f.gh("GET", "/pulls/comments/1/reactions")
    r2 = f.gh("GET", "/issues/comments/1/reactions")
    check("review and issue comment 1 keep their own reactions",
          r.status == 200 and [x["content"] for x in r.json] == ["rocket"]
          and "rocket" not in [x["content"] for x in r2.json],
          (r.raw[:200], r2.raw[:200]))
    r = f.gh("POST", "/pulls/comments/9999/reactions", {"content": "+1"})
    check("reaction on a missing review comment: 404", r.status == 404)
    pull = f.ctl("GET", "state").json["github"]["repos"][
        "octocat/Hello-World"]["pulls"]["1347"]
    check("GET /_fake/state: review comments with their reactions",
          [(c["id"], [x["content"] for x in c["reactions"]])
           for c in pull["review_comments"]] == [(1, ["rocket"])],
          pull.get("review_comments"))


def test_github_permissions(f):
    want = fixture("github", "repos.get-collaborator-permission-level.json")
    got = {}
    for who in ("alice", "bob", "carol", "dave", "mallory", "octocat"):
        r = f.gh("GET", f"/collaborators/{who}/permission")
        got[who] = (r.status, r.json.get("permission"),
                    r.json.get("role_name"), r.json["user"]["login"],
                    list(r.json) == list(want))
    check("permission: admin/maintain->write/triage->read/read, "
          "non-collaborator of a public repo read, owner admin",
          got == {"alice": (200, "admin", "admin", "alice", True),
                  "bob": (200, "write", "maintain", "bob", True),
                  "carol": (200, "read", "triage", "carol", True),
                  "dave": (200, "read", "read", "dave", True),
                  "mallory": (200, "read", "read", "mallory", True),
                  "octocat": (200, "admin", "admin", "octocat", True)}, got)
    r = f.gh("GET", "/collaborators/nobody-at-all/permission")
    check("permission of an unknown user: 404", r.status == 404, r.raw)


def test_github_contents(f):
    want = fixture("github", "repos.get-content.json")
    r = f.gh("GET", "/contents/.diverge/agent.yaml?ref=main")
    ok = r.status == 200 and list(r.json) == list(want)
    check("contents: 200 shaped like repos.get-content.json", ok, r.raw[:300])
    lines = r.json["content"].split("\n") if ok else []
    check("contents: base64 in lines of 60 characters ending in \\n",
          ok and r.json["content"].endswith("\n") and
          all(len(x) <= 60 for x in lines) and
          base64.b64decode(r.json["content"]) ==
          b"image: base:1\nmax_iterations: 3\n" and
          r.json["encoding"] == "base64" and r.json["path"] ==
          ".diverge/agent.yaml", r.raw[:300])
    r = f.gh("GET", "/contents/.diverge/agent.yaml?ref=new-topic")
    check("contents on the head branch differ",
          r.status == 200 and base64.b64decode(r.json["content"]) ==
          b"image: head:2\nmax_iterations: 99\n")
    r = f.gh("GET", "/contents/.diverge/agent.yaml?ref="
             "6dcb09b5b57875f334f61aebed695e2e4193db5e")
    check("contents at the PR head SHA", r.status == 200 and
          b"head:2" in base64.b64decode(r.json["content"]))
    r = f.gh("GET", "/contents/.diverge/agent.yaml")
    check("contents without ref: the default branch", r.status == 200 and
          b"base:1" in base64.b64decode(r.json["content"]))
    r = f.gh("GET", "/contents/.diverge/agent.yaml",
             headers={"Accept": "application/vnd.github.raw+json"})
    check("contents with the raw media type: the bytes",
          r.status == 200 and r.raw == b"image: base:1\nmax_iterations: 3\n",
          r.raw)
    r = f.gh("GET", "/contents/.diverge/missing.yaml?ref=main")
    check("missing file: 404 {\"message\":\"Not Found\"}",
          r.status == 404 and r.json["message"] == "Not Found", r.raw)
    r = f.gh("GET", "/contents/.diverge?ref=main")
    check("directory listing", r.status == 200 and isinstance(r.json, list)
          and r.json[0]["name"] == "agent.yaml" and r.json[0]["type"] ==
          "file", r.raw[:300])
    r = f.gh("GET", "/contents/.diverge/agent.yaml?ref=no-such-branch")
    check("unknown ref: 404", r.status == 404, r.raw)
    r = f.gh("GET", "/github/repos/mallory/Hello-World/contents/x?ref=evil")
    check("fork without files: 404", r.status == 404, r.raw)


def test_github_pagination(f):
    f.ctl("POST", "seed", {"github": {"repos": [{
        "full_name": "octocat/paged", "collaborators": {},
        "pulls": [{"number": 5, "comments": [
            {"id": 100 + i, "user": "alice", "body": f"c{i}"}
            for i in range(7)]}]}]}})
    path = "/github/repos/octocat/paged/issues/5/comments?per_page=3"
    r = f.gh("GET", path)
    pages, rels, url = [], [], None
    while True:
        pages.append([c["id"] for c in r.json])
        rels.append(sorted(r.links()))
        url = r.links().get("next")
        if not url or len(pages) > 5:
            break
        r = f.gh("GET", urllib.parse.urlsplit(url).path + "?" +
                 urllib.parse.urlsplit(url).query)
    check("GitHub pagination: 3 pages by Link rel=next, ascending ids",
          pages == [[100, 101, 102], [103, 104, 105], [106]], pages)
    check("GitHub Link rels: next+last, prev+next+last+first, prev+first",
          rels == [["last", "next"], ["first", "last", "next", "prev"],
                   ["first", "prev"]], rels)
    check("GitHub Link keeps per_page",
          "per_page=3" in (url or r.links().get("first", "")), r.h("link"))
    # a proxy that strips Link: the page as usual without it; GitHub
    # behind it still answers ?page=N
    f.ctl("POST", "faults", {"provider": "github", "count": 2,
                             "omit_headers": ["link"]})
    r = f.gh("GET", path)
    r2 = f.gh("GET", path + "&page=3")
    check("omit_headers: no Link, the rest as usual (pages by ?page=N)",
          r.status == 200 and [c["id"] for c in r.json] == [100, 101, 102]
          and r.h("link") is None and
          r.h("x-ratelimit-remaining") is not None and
          r2.status == 200 and [c["id"] for c in r2.json] == [106] and
          r2.h("link") is None, (r.headers, r2.headers))
    r = f.gh("GET", path + "&page=2")
    check("omit_headers: for count requests only",
          sorted(r.links()) == ["first", "last", "next", "prev"], r.headers)
    f.ctl("POST", "faults", {"provider": "github", "count": 1,
                             "omit_headers": ["X-Total"]})
    r = f.gh("GET", path)
    check("omit_headers X-Total on GitHub (it sends none): the Link keeps "
          "rel=\"last\"", sorted(r.links()) == ["last", "next"], r.headers)
    # a broken server or proxy whose next page goes back
    f.ctl("POST", "faults", {"provider": "github", "count": 3,
                             "stale_next": "same"})
    r = f.gh("GET", path + "&page=2")
    r1 = f.gh("GET", "/github/repos/octocat/paged/issues/5/comments")
    f.ctl("DELETE", "faults")
    f.ctl("POST", "faults", {"provider": "github", "count": 2,
                             "stale_next": "back"})
    rb1 = f.gh("GET", path)
    rb3 = f.gh("GET", path + "&page=3")
    check("stale_next: next names this page (also a page of its own), or "
          "page 1 from page 2 on; the items as usual",
          "page=2" in r.links().get("next", "") and
          [c["id"] for c in r.json] == [103, 104, 105] and
          "page=1" in r1.links().get("next", "") and
          "page=2" in rb1.links().get("next", "") and
          "page=1" in rb3.links().get("next", "") and
          [c["id"] for c in rb3.json] == [106],
          (r.headers, r1.headers, rb1.headers, rb3.headers))
    f.ctl("DELETE", "faults")
    r = f.gh("GET", "/github/repos/octocat/paged/issues/5/comments")
    check("GitHub: one page (default per_page 30): no Link header",
          r.status == 200 and len(r.json) == 7 and r.h("link") is None)
    r = f.gh("GET", "/github/repos/octocat/paged/issues/5/comments?"
             "per_page=3&page=9")
    check("GitHub: page past the end: []", r.status == 200 and r.json == [])
    r = f.gh("GET", "/github/repos/octocat/paged/issues/5/comments?"
             "since=2030-01-01T00:00:00Z")
    check("GitHub: since filters by updated_at", r.json == [])


def test_github_auth(f):
    r = f.gh("GET", "/issues/1347/comments", token=None)
    check("GitHub without token: 401 Requires authentication",
          r.status == 401 and r.json["message"] == "Requires authentication"
          and r.h("x-ratelimit-limit") == "60", r.raw)
    r = f.gh("GET", "/issues/1347/comments", token="ghp_wrong")
    check("GitHub bad token: 401 Bad credentials",
          r.status == 401 and r.json["message"] == "Bad credentials" and
          r.json["status"] == "401", r.raw)
    r = f.gh("GET", "/issues/1347/comments", scheme="token")
    check("GitHub 'token' scheme accepted", r.status == 200)
    r = f.gh("GET", "/issues/1347/comments", headers={"User-Agent": ""})
    check("GitHub without User-Agent: 403 text",
          r.status == 403 and b"User-Agent" in r.raw, r.raw)
    r = f.gh("GET", "/issues/1347/comments",
             headers={"X-GitHub-Api-Version": "1999-01-01"})
    check("GitHub unsupported API version: 400", r.status == 400, r.raw)
    r = f.gh("GET", "/github/user")
    check("GET /user: the token's user",
          r.status == 200 and r.json["login"] == "diverge-test" and
          r.json["id"] == 77 and r.json["name"] == "Diverge Test", r.raw)
    r1 = f.gh("GET", "/issues/1347/comments")
    r2 = f.gh("GET", "/issues/1347/comments")
    check("GitHub rate-limit headers on every reply, remaining decrements",
          all(r1.h(h) for h in ("x-ratelimit-limit", "x-ratelimit-remaining",
                                "x-ratelimit-used", "x-ratelimit-reset",
                                "x-ratelimit-resource")) and
          int(r2.h("x-ratelimit-remaining")) ==
          int(r1.h("x-ratelimit-remaining")) - 1 and
          int(r1.h("x-ratelimit-reset")) > time.time(), r1.headers)


def test_github_app(f):
    want = fixture("github", "apps.get-authenticated.json")
    r = f.gh("GET", "/github/app", token=app_jwt())
    check("GET /app with a JWT: 200 shaped like apps.get-authenticated.json",
          r.status == 200 and list(r.json) == list(want) and
          r.json["id"] == APP_ID and r.json["slug"] == "diverge-test",
          r.raw[:300])
    r = f.gh("GET", "/github/app", token=app_jwt(iss=str(APP_ID)))
    check("JWT iss as a string", r.status == 200)
    r = f.gh("GET", "/github/app", token=app_jwt(iss="Iv1.0123456789abcdef"))
    check("JWT iss = client id", r.status == 200)
    r = f.gh("GET", "/github/app", token=app_jwt(iat_off=-700, exp_off=-100))
    check("expired JWT: 401", r.status == 401 and "exp" in r.json["message"],
          r.raw)
    r = f.gh("GET", "/github/app", token=app_jwt(exp_off=3600))
    check("JWT exp too far: 401 too far in the future",
          r.status == 401 and "too far" in r.json["message"], r.raw)
    r = f.gh("GET", "/github/app", token=app_jwt(iss=999))
    check("JWT of another app: 401", r.status == 401, r.raw)
    r = f.gh("GET", "/github/app", token="a.b.c")
    check("malformed JWT: 401 could not be decoded", r.status == 401 and
          "could not be decoded" in r.json["message"], r.raw)
    r = f.gh("GET", "/github/app")
    check("GET /app with a PAT: 401", r.status == 401, r.raw)
    r = f.gh("GET", "/installation", token=app_jwt())
    check("GET /repos/o/r/installation: the installation",
          r.status == 200 and r.json["id"] == 42 and
          r.json["app_id"] == APP_ID and list(r.json) == list(
              fixture("github", "apps.get-repo-installation.json")), r.raw)
    t0 = time.time()
    r = f.gh("POST", "/github/app/installations/42/access_tokens",
             token=app_jwt())
    want = fixture("github", "apps.create-installation-access-token.json")
    exp = 0
    if r.status == 201:
        exp = calendar.timegm(time.strptime(r.json["expires_at"],
                                            "%Y-%m-%dT%H:%M:%SZ"))
    check("installation token: 201, ghs_, expires_at one hour ahead",
          r.status == 201 and r.json["token"].startswith("ghs_") and
          abs(exp - t0 - 3600) < 5 and
          [k for k in want if k != "repositories"] == list(r.json), r.raw)
    tok = r.json["token"] if r.status == 201 else "x"
    r = f.gh("POST", "/github/app/installations/42/access_tokens",
             {"repositories": ["Hello-World"],
              "permissions": {"issues": "write"}}, token=app_jwt())
    check("installation token for named repositories",
          r.status == 201 and r.json["repositories"][0]["full_name"] ==
          "octocat/Hello-World" and r.json["permissions"] ==
          {"issues": "write"} and list(r.json["repositories"][0]) ==
          list(want["repositories"][0]), r.raw[:300])
    limited = r.json["token"] if r.status == 201 else "x"
    r = f.gh("POST", "/github/app/installations/42/access_tokens",
             {"repositories": ["paged"]}, token=app_jwt())
    check("token for a repository outside the installation: 422",
          r.status == 422, r.raw)
    r = f.gh("POST", "/github/app/installations/7/access_tokens",
             token=app_jwt())
    check("token for an unknown installation: 404", r.status == 404)
    r = f.gh("POST", "/issues/1347/comments", {"body": "from the app"},
             token=tok)
    check("installation token posts as <slug>[bot] (type Bot)",
          r.status == 201 and r.json["user"]["login"] == "diverge-test[bot]"
          and r.json["user"]["type"] == "Bot", r.raw[:300])
    r = f.gh("GET", "/github/repos/octocat/paged/issues/5/comments",
             token=tok)
    check("installation token on a repository outside it: 404",
          r.status == 404, r.raw)
    r = f.gh("GET", "/pulls/1347", token=limited)
    check("token without pull_requests permission: 403 not accessible",
          r.status == 403 and r.json["message"] ==
          "Resource not accessible by integration", r.raw)
    r = f.gh("GET", "/github/user", token=tok)
    check("GET /user with an installation token: 403", r.status == 403)
    r = f.gh("GET", "/issues/1347/comments", token=app_jwt())
    check("a JWT on a repository endpoint: 401", r.status == 401)
    f.ctl("POST", "expire_tokens")
    r = f.gh("GET", "/issues/1347/comments", token=tok)
    check("expired installation token: 401 Bad credentials",
          r.status == 401 and r.json["message"] == "Bad credentials", r.raw)


def test_github_faults(f):
    f.ctl("POST", "faults", {"status": 502, "count": 2, "match":
                             "/issues/1347/comments", "method": "GET"})
    codes = [f.gh("GET", "/issues/1347/comments").status for _ in range(3)]
    check("5xx burst: 502, 502, then 200", codes == [502, 502, 200], codes)
    f.ctl("POST", "faults", {"status": 502, "provider": "github"})
    r = f.gh("GET", "/pulls/1347")
    check("502 is an HTML page", r.status == 502 and
          r.h("content-type").startswith("text/html"), r.headers)
    f.ctl("POST", "faults", [{"status": 500}, {"status": 503,
                                              "retry_after": 7}])
    r1 = f.gh("GET", "/pulls/1347")
    r2 = f.gh("GET", "/pulls/1347")
    check("500 JSON Server Error; 503 with Retry-After",
          r1.status == 500 and r1.json["message"] == "Server Error" and
          r2.status == 503 and r2.h("retry-after") == "7", (r1.raw, r2.raw))
    f.ctl("POST", "faults", {"status": 429, "ratelimit_reset_in": 30})
    r = f.gh("GET", "/pulls/1347")
    check("429 primary limit: remaining 0, reset, message",
          r.status == 429 and r.h("x-ratelimit-remaining") == "0" and
          abs(int(r.h("x-ratelimit-reset")) - time.time() - 30) < 3 and
          "API rate limit exceeded for user ID 77" in r.json["message"],
          (r.headers, r.raw))
    r = f.gh("GET", "/issues/1347/comments")
    check("... and the user stays limited until the reset, whatever the "
          "request", r.status == 429 and
          r.h("x-ratelimit-remaining") == "0", r.raw)
    f.ctl("DELETE", "faults")       # and the limits they started
    f.ctl("POST", "faults", {"status": 403, "ratelimit_remaining": 0})
    r = f.gh("GET", "/pulls/1347")
    check("403 primary limit with x-ratelimit-remaining: 0",
          r.status == 403 and r.h("x-ratelimit-remaining") == "0" and
          "rate limit exceeded" in r.json["message"], r.raw)
    f.ctl("DELETE", "faults")
    f.ctl("POST", "faults", {"status": 403, "secondary": True,
                             "retry_after": 3, "method": "POST"})
    r0 = f.gh("GET", "/pulls/1347")
    r = f.gh("POST", "/issues/1347/comments", {"body": "x"})
    check("secondary limit: 403, retry-after, remaining not 0, "
          "octokit's /secondary rate/ matches",
          r0.status == 200 and r.status == 403 and r.h("retry-after") == "3"
          and r.h("x-ratelimit-remaining") != "0" and
          "secondary rate limit" in r.json["message"], r.raw)
    r1 = f.gh("GET", "/pulls/1347")
    r2 = f.gh("GET", "/pulls/1347", token="ghp_alice_token")
    check("a secondary limit holds the user's token for Retry-After, on "
          "every request; another user's token is served",
          r1.status == 403 and "secondary rate limit" in
          r1.json["message"] and 1 <= int(r1.h("retry-after") or 0) <= 3
          and r2.status == 200, (r1.raw, r2.status))
    f.ctl("DELETE", "faults")
    f.ctl("POST", "faults", {"status": 401})
    r = f.gh("GET", "/pulls/1347")
    check("401 fault: Bad credentials", r.status == 401 and
          r.json["message"] == "Bad credentials")
    f.ctl("POST", "faults", {"status": 404, "match": "/pulls/"})
    r = f.gh("GET", "/pulls/1347")
    check("404 fault", r.status == 404 and r.json["message"] == "Not Found")
    f.ctl("POST", "faults", {"status": 403})
    r = f.gh("GET", "/pulls/1347")
    check("403 fault: Resource not accessible by integration",
          r.status == 403 and "not accessible" in r.json["message"], r.raw)
    f.ctl("POST", "faults", {"delay_ms": 400, "match": "/pulls/1347"})
    r = f.gh("GET", "/pulls/1347")
    check("slow answer: delay_ms 400", r.status == 200 and
          r.elapsed >= 0.39, r.elapsed)
    f.ctl("POST", "faults", {"close": True})
    try:
        r = f.gh("GET", "/pulls/1347")
        closed = False
    except (http.client.HTTPException, ConnectionError, socket.timeout):
        closed = True
    check("close: the connection is dropped without an answer", closed)
    f.ctl("POST", "faults", {"status": 500, "count": 5, "match": "/nowhere"})
    r = f.ctl("GET", "faults")
    f.ctl("DELETE", "faults")
    r2 = f.ctl("GET", "faults")
    check("GET/DELETE /_fake/faults", len(r.json) == 1 and r2.json == [],
          (r.json, r2.json))
    f.ctl("POST", "rate", {"provider": "github", "used": 5000})
    r = f.gh("GET", "/pulls/1347")
    f.ctl("POST", "rate", {"provider": "github", "used": 0})
    check("primary limit used up: 403 with remaining 0",
          r.status == 403 and r.h("x-ratelimit-remaining") == "0" and
          "API rate limit exceeded" in r.json["message"], r.raw)


def test_gitlab(f):
    r = f.gl("GET", "/gitlab/api/v4/user")
    want = fixture("gitlab", "get-current-user.json")
    check("GitLab GET /user: the token's user, shaped like the fixture",
          r.status == 200 and r.json["username"] == "diverge-bot" and
          r.json["id"] == 50 and list(r.json) == list(want), r.raw[:300])
    r = f.gl("GET", "/gitlab/api/v4/user", bearer=True)
    check("GitLab Authorization: Bearer accepted", r.status == 200)
    r = f.gl("GET", MR + "/notes", token="glpat-wrong")
    r2 = f.gl("GET", MR + "/notes", token=None)
    check("GitLab bad/missing token: 401 {\"message\":\"401 Unauthorized\"}",
          r.status == 401 and r.json == {"message": "401 Unauthorized"} and
          r2.status == 401 and r2.json == r.json, r.raw)
    want = fixture("gitlab", "get-mr-note.json")
    r = f.gl("GET", MR + "/notes")
    got = r.json[0] if r.status == 200 and r.json else {}
    got = dict(got, created_at=want["created_at"],
               updated_at=want["updated_at"])
    check("list MR notes: the seeded note == get-mr-note.json "
          "(timestamps with milliseconds)", got == want, r.raw)
    r = f.gl("GET", "/gitlab/api/v4/projects/diaspora%2Fdiaspora/"
             "merge_requests/2/notes/301")
    check("project by URL-encoded path; GET one note",
          r.status == 200 and r.json["id"] == 301, r.raw)
    r = f.gl("GET", "/gitlab/api/v4/projects/diaspora/diaspora/"
             "merge_requests/2/notes/301")
    check("project path not encoded: 404", r.status == 404)
    r = f.gl("POST", MR + "/notes", {"body": "sticky"})
    want = fixture("gitlab", "create-mr-note.json")
    ok = r.status == 201 and list(r.json) == list(want)
    check("create note: 201 shaped like create-mr-note.json, author = token",
          ok and r.json["body"] == "sticky" and
          r.json["author"]["username"] == "diverge-bot" and
          r.json["noteable_iid"] == 2 and r.json["project_id"] == 5, r.raw)
    nid = r.json["id"] if ok else 0
    r = f.gl("POST", MR + "/notes", "body=form+encoded",
             headers={"Content-Type": "application/x-www-form-urlencoded"})
    check("create note from a form body", r.status == 201 and
          r.json["body"] == "form encoded", r.raw)
    r = f.gl("PUT", MR + f"/notes/{nid}", {"body": "sticky 2"})
    check("update note: 200", r.status == 200 and
          r.json["body"] == "sticky 2", r.raw)
    r = f.gl("PUT", MR + "/notes/301", {"body": "hijack"})
    check("update another user's note: 403", r.status == 403 and
          r.json == {"message": "403 Forbidden"}, r.raw)
    r = f.gl("POST", MR + "/notes", {"body": "x" * 1000000})
    check("note of 1,000,000 characters: 201", r.status == 201)
    r = f.gl("POST", MR + "/notes", {"body": "x" * 1000001})
    check("note of 1,000,001 characters: 400 too long",
          r.status == 400 and "too long" in r.json["message"], r.raw[:200])
    r = f.gl("POST", MR + "/notes", {})
    check("note without body: 400 body is missing",
          r.status == 400 and r.json == {"error": "body is missing"}, r.raw)
    r = f.gl("GET", MR + "/notes?sort=asc")
    r2 = f.gl("GET", MR + "/notes")
    ids = [n["id"] for n in r.json]
    check("notes sort=asc oldest first; default desc",
          ids[0] == 301 and [n["id"] for n in r2.json] == ids[::-1], ids)
    want = fixture("gitlab", "award-emoji-on-note.json")
    r = f.gl("POST", MR + "/notes/301/award_emoji", {"name": "eyes"})
    check("award emoji: 201 shaped like award-emoji-on-note.json",
          r.status == 201 and list(r.json) == list(want) and
          r.json["name"] == "eyes" and r.json["awardable_id"] == 301 and
          r.json["user"]["username"] == "diverge-bot", r.raw)
    r = f.gl("POST", MR + "/notes/301/award_emoji", {"name": "eyes"})
    check("same award again: 404", r.status == 404 and
          "Award Emoji" in r.json["message"], r.raw)
    r = f.gl("GET", MR + "/notes/301/award_emoji")
    check("list award emoji", r.status == 200 and len(r.json) == 1)
    r = f.gl("GET", MR + "/notes/999999")
    check("missing note: 404 Note Not Found", r.status == 404 and
          r.json == {"message": "404 Note Not Found"})
    r = f.gl("GET", PROJ + "/merge_requests/77/notes")
    check("missing MR: 404", r.status == 404)
    want = fixture("gitlab", "get-project-member-all.json")
    r = f.gl("GET", PROJ + "/members/all/1")
    check("members/all/:id: access level, shaped like the fixture",
          r.status == 200 and r.json["access_level"] == 40 and
          r.json["username"] == "pipin" and list(r.json) == list(want),
          r.raw)
    r = f.gl("GET", PROJ + "/members/all/50")
    check("non-member: 404", r.status == 404, r.raw)
    r = f.gl("GET", PROJ + "/repository/files/.diverge%2Fagent.yaml/raw"
             "?ref=main")
    r2 = f.gl("GET", PROJ + "/repository/files/.diverge%2Fagent.yaml/raw"
              "?ref=feature")
    check("raw file at the target and at the source branch",
          r.status == 200 and r.raw == b"image: base:1\n" and
          r2.raw == b"image: head:2\n" and
          r.h("content-type").startswith("text/plain"), (r.raw, r2.raw))
    r = f.gl("GET", PROJ + "/repository/files/.diverge%2Fagent.yaml?ref=main")
    check("file as JSON with base64 content", r.status == 200 and
          base64.b64decode(r.json["content"]) == b"image: base:1\n")
    r = f.gl("GET", PROJ + "/repository/files/.diverge%2Fnone.yaml/raw"
             "?ref=main")
    check("missing file: 404 File Not Found", r.status == 404 and
          r.json == {"message": "404 File Not Found"}, r.raw)
    r = f.gl("GET", MR)
    check("GET merge request: branches", r.status == 200 and
          r.json["source_branch"] == "feature" and
          r.json["target_branch"] == "main", r.raw)
    want = fixture("gitlab", "get-user.json")
    r = f.gl("GET", "/gitlab/api/v4/users/3")
    check("GET /users/:id: the user, shaped like get-user.json, with "
          "bot false", r.status == 200 and r.json["id"] == 3 and
          r.json["username"] == "raymond_smith" and
          list(r.json) == list(want) + ["bot"] and r.json["bot"] is False and
          r.h("ratelimit-remaining") is not None, r.raw)
    f.ctl("POST", "seed", {"gitlab": {"users": [
        {"username": "release-helper", "id": 60, "bot": True}]}})
    r = f.gl("GET", "/gitlab/api/v4/users/60")
    check("a user seeded with bot: true (a service account's own name)",
          r.status == 200 and r.json["username"] == "release-helper" and
          r.json["bot"] is True, r.raw)
    r = f.gl("GET", "/gitlab/api/v4/users/999999")
    r2 = f.gl("GET", "/gitlab/api/v4/users/pipin")
    check("unknown user id: 404 User Not Found; a name: no such route",
          r.status == 404 and r.json == {"message": "404 User Not Found"}
          and r2.status == 404, (r.raw, r2.raw))
    r = f.gl("GET", "/gitlab/api/v4/users/3", token=None)
    check("GET /users/:id needs the token", r.status == 401, r.raw)
    r1 = f.gl("GET", "/gitlab/api/v4/user")
    r2 = f.gl("GET", "/gitlab/api/v4/user")
    check("GitLab RateLimit-* on every reply, decrementing",
          all(r1.h(h) is not None for h in (
              "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset",
              "ratelimit-observed", "ratelimit-name", "ratelimit-resettime"))
          and int(r2.h("ratelimit-remaining")) ==
          int(r1.h("ratelimit-remaining")) - 1, r1.headers)


def test_github_comment_moderation():
    """GitHub: a comment's author, and anyone with write access (write,
    maintain, admin), may edit or delete it; a read or triage user, or a
    user of no role on a public repository, gets 403."""
    seed = {"github": {
        "tokens": {"ghp_reader": "reader", "ghp_triage": "triager",
                   "ghp_write": "writer", "ghp_maintain": "maintainer",
                   "ghp_owner": "octo", "ghp_author": "pipin",
                   "ghp_outsider": "outsider"},
        "repos": [{
            "full_name": "octo/mod", "private": False,
            "collaborators": {"reader": "read", "triager": "triage",
                              "writer": "write", "maintainer": "maintain",
                              "pipin": "read"},
            "pulls": [{"number": 3, "comments": [
                {"id": 701, "user": "pipin", "body": "pipin's"},
                {"id": 702, "user": "pipin", "body": "to delete"}]}]}]}}
    with tempfile.NamedTemporaryFile("w", suffix=".json",
                                     delete=False) as tf:
        json.dump(seed, tf)
    f = Fake("--seed", tf.name)
    os.unlink(tf.name)
    base = "/github/repos/octo/mod/issues/comments/"
    try:
        got, msg = {}, None
        for who in ("reader", "triage", "outsider", "write", "maintain",
                    "owner", "author"):
            r = f.gh("PATCH", base + "701", {"body": "by " + who},
                     token="ghp_" + who)
            got[who] = r.status
            if who == "reader":
                msg = r.json
        check("edit another user's comment: 403 for read, triage and no "
              "role; 200 for write, maintain, the owner and the author",
              got == {"reader": 403, "triage": 403, "outsider": 403,
                      "write": 200, "maintain": 200, "owner": 200,
                      "author": 200}, got)
        check("... the 403 is GitHub's JSON error",
              isinstance(msg, dict) and msg.get("message") ==
              "Must have admin rights to Repository." and
              "documentation_url" in msg, msg)
        r = f.gh("GET", base + "701", token="ghp_reader")
        check("... the comment keeps its author and the last allowed body",
              r.status == 200 and r.json["user"]["login"] == "pipin" and
              r.json["body"] == "by author", r.raw[:300])
        r = f.gh("DELETE", base + "702", token="ghp_triage")
        r2 = f.gh("DELETE", base + "702", token="ghp_write")
        check("delete another user's comment: 403 for triage, 204 for "
              "write", (r.status, r2.status) == (403, 204),
              (r.status, r2.status))
    finally:
        f.stop()


def test_gitlab_note_admin():
    """GitLab's admin_note: a note's author, a Maintainer (or more) of the
    project and an administrator may edit or delete it; a Developer, a
    Maintainer whose membership expired, and a non-member get 403."""
    seed = {"gitlab": {
        "user": {"username": "diverge-bot", "id": 50},
        "tokens": {"glpat-dev": "dev", "glpat-maint": "maint",
                   "glpat-old": "old-maint", "glpat-admin": "root",
                   "glpat-out": "outsider", "glpat-pipin": "pipin"},
        "users": [{"username": "pipin", "id": 1},
                  {"username": "dev", "id": 2},
                  {"username": "maint", "id": 3},
                  {"username": "old-maint", "id": 4},
                  {"username": "root", "id": 5, "is_admin": True},
                  {"username": "outsider", "id": 6}],
        "projects": [{
            "id": 5, "path_with_namespace": "diaspora/diaspora",
            "members": {"pipin": 30, "dev": 30, "maint": 40,
                        "old-maint": {"access_level": 50,
                                      "expires_at": "2020-01-01"}},
            "merge_requests": [{"iid": 2, "author": "pipin", "notes": [
                {"id": 301, "author": "pipin", "body": "pipin's"}]}]}]}}
    with tempfile.NamedTemporaryFile("w", suffix=".json",
                                     delete=False) as tf:
        json.dump(seed, tf)
    f = Fake("--seed", tf.name)
    os.unlink(tf.name)
    try:
        got = {}
        for tok in ("dev", "old", "out", "maint", "admin", "pipin"):
            r = f.gl("PUT", MR + "/notes/301", {"body": "by " + tok},
                     token="glpat-" + tok)
            got[tok] = r.status
        check("edit another user's note: 403 for a Developer, an expired "
              "Maintainer, a non-member; 200 for a Maintainer, an "
              "administrator, the author",
              got == {"dev": 403, "old": 403, "out": 403, "maint": 200,
                      "admin": 200, "pipin": 200}, got)
        r = f.gl("GET", MR + "/notes/301", token="glpat-dev")
        check("... the note keeps its author",
              r.status == 200 and r.json["author"]["username"] == "pipin" and
              r.json["body"] == "by pipin", r.raw)
        r = f.gl("DELETE", MR + "/notes/301", token="glpat-dev")
        r2 = f.gl("DELETE", MR + "/notes/301", token="glpat-maint")
        check("delete another user's note: 403 for a Developer, 204 for a "
              "Maintainer", (r.status, r2.status) == (403, 204),
              (r.status, r2.status))
    finally:
        f.stop()


def test_gitlab_pagination(f):
    f.ctl("POST", "seed", {"gitlab": {"projects": [{
        "id": 9, "path_with_namespace": "g/paged",
        "merge_requests": [{"iid": 1, "author": "pipin", "notes": [
            {"id": 500 + i, "author": "pipin", "body": f"n{i}"}
            for i in range(7)]}]}]}})
    path = "/gitlab/api/v4/projects/9/merge_requests/1/notes?sort=asc&per_page=3"
    pages, heads = [], []
    r = f.gl("GET", path)
    while True:
        pages.append([n["id"] for n in r.json])
        heads.append((r.h("x-page"), r.h("x-next-page"), r.h("x-prev-page"),
                      r.h("x-total"), r.h("x-total-pages"),
                      r.h("x-per-page")))
        if not r.h("x-next-page") or len(pages) > 5:
            break
        r = f.gl("GET", path + "&page=" + r.h("x-next-page"))
    check("GitLab pagination: 3 pages by x-next-page",
          pages == [[500, 501, 502], [503, 504, 505], [506]], pages)
    check("GitLab x-page/x-next-page/x-prev-page/x-total/x-total-pages",
          heads == [("1", "2", "", "7", "3", "3"), ("2", "3", "1", "7", "3",
                                                    "3"),
                    ("3", "", "2", "7", "3", "3")], heads)
    check("GitLab Link header: prev/next/first/last",
          sorted(r.links()) == ["first", "last", "prev"] and
          "per_page=3" in r.links()["last"], r.h("link"))
    r = f.gl("GET", "/gitlab/api/v4/projects/9/merge_requests/1/notes?"
             "per_page=500")
    check("GitLab per_page capped at 100", r.h("x-per-page") == "100")
    # GitLab.com beyond 10,000 records: no X-Total, X-Total-Pages, nor
    # rel="last"; a proxy: no X-Next-Page; the rest as usual
    f.ctl("POST", "faults", {"provider": "gitlab", "count": 1,
                             "omit_headers": ["X-Total", "X-Total-Pages",
                                              "x-next-page"]})
    r = f.gl("GET", path)
    check("omit_headers: X-Total, X-Total-Pages, X-Next-Page and the last "
          "link left out, nothing else",
          r.status == 200 and [n["id"] for n in r.json] == [500, 501, 502]
          and r.h("x-total") is None and r.h("x-total-pages") is None and
          r.h("x-next-page") is None and r.h("x-page") == "1" and
          sorted(r.links()) == ["first", "next"], r.headers)
    r = f.gl("GET", path)
    check("omit_headers: for count requests only", r.h("x-total") == "7" and
          r.h("x-next-page") == "2", r.headers)
    f.ctl("POST", "faults", {"provider": "gitlab", "count": 1,
                             "stale_next": "same"})
    r = f.gl("GET", path + "&page=2")
    check("stale_next: X-Next-Page and Link rel=next name this page",
          r.h("x-next-page") == "2" and
          "page=2" in r.links().get("next", "") and
          [n["id"] for n in r.json] == [503, 504, 505], r.headers)


def test_gitlab_faults(f):
    f.ctl("POST", "faults", {"status": 429, "retry_after": 9,
                             "provider": "gitlab"})
    r = f.gl("POST", MR + "/notes", {"body": "x"})
    check("GitLab 429: Retry-After, RateLimit-Remaining 0, Retry later",
          r.status == 429 and r.h("retry-after") == "9" and
          r.h("ratelimit-remaining") == "0" and r.raw == b"Retry later\n",
          (r.headers, r.raw))
    r = f.gl("GET", "/gitlab/api/v4/user")
    check("GitLab: the user stays limited for Retry-After",
          r.status == 429 and 1 <= int(r.h("retry-after") or 0) <= 9, r.raw)
    f.ctl("DELETE", "faults")       # and the limit it started
    f.ctl("POST", "faults", {"status": 429, "provider": "gitlab",
                             "message": "This endpoint has been requested "
                             "too many times. Try again later."})
    r = f.gl("POST", MR + "/notes", {"body": "x"})
    check("GitLab 429 with the application limiter message",
          r.status == 429 and "too many times" in r.json["message"]["error"],
          r.raw)
    check("GitLab application limiter: no Retry-After, the user's "
          "RateLimit-* budget not used up (render_api_error!)",
          r.h("retry-after") is None and
          int(r.h("ratelimit-remaining") or 0) > 0, r.headers)
    r = f.gl("GET", "/gitlab/api/v4/user")
    check("GitLab application limiter: other endpoints still served",
          r.status == 200, r.raw)
    f.ctl("DELETE", "faults")
    f.ctl("POST", "faults", {"status": 500, "count": 3,
                             "provider": "gitlab"})
    codes = [f.gl("GET", "/gitlab/api/v4/user").status for _ in range(4)]
    check("GitLab 5xx burst", codes == [500, 500, 500, 200], codes)
    f.ctl("POST", "faults", {"status": 401, "provider": "gitlab"})
    r = f.gl("GET", "/gitlab/api/v4/user")
    check("GitLab 401 fault", r.status == 401 and
          r.json == {"message": "401 Unauthorized"})
    f.ctl("POST", "faults", {"status": 403, "provider": "gitlab"})
    r = f.gl("GET", "/gitlab/api/v4/user")
    check("GitLab 403 fault", r.status == 403 and
          r.json == {"message": "403 Forbidden"})
    f.ctl("POST", "faults", {"status": 404, "provider": "gitlab"})
    r = f.gl("GET", "/gitlab/api/v4/user")
    check("GitLab 404 fault", r.status == 404)
    f.ctl("POST", "faults", {"delay_ms": 300, "provider": "gitlab"})
    r = f.gl("GET", "/gitlab/api/v4/user")
    check("GitLab slow answer", r.status == 200 and r.elapsed >= 0.29,
          r.elapsed)
    f.ctl("POST", "rate", {"provider": "gitlab", "used": 2000})
    r = f.gl("GET", "/gitlab/api/v4/user")
    f.ctl("POST", "rate", {"provider": "gitlab", "used": 0})
    check("GitLab limit used up: 429 with Retry-After",
          r.status == 429 and r.h("retry-after") is not None, r.raw)


def test_recording(f):
    f.ctl("DELETE", "requests")
    f.gh("POST", "/issues/1347/comments", {"body": "recorded"})
    f.gl("GET", MR + "/notes?sort=asc")
    f.gl("GET", MR + "/notes", token="glpat-wrong")
    r = f.ctl("GET", "requests")
    reqs = r.json
    ok = r.status == 200 and len(reqs) == 3
    g = reqs[0] if ok else {}
    check("recorded GitHub request: method, path, headers, body, status",
          ok and g["method"] == "POST" and g["path"] ==
          REPO + "/issues/1347/comments" and g["authorization"] == "Bearer"
          and g["credential"] == "token" and
          g["accept"] == "application/vnd.github+json" and
          g["api_version"] == "2022-11-28" and
          g["user_agent"] == "diverge-test/1" and
          g["content_type"] == "application/json" and
          g["json"] == {"body": "recorded"} and g["status"] == 201 and
          g["provider"] == "github", json.dumps(g)[:800])
    l1 = reqs[1] if ok else {}
    check("recorded GitLab request: PRIVATE-TOKEN present, query",
          ok and l1["private_token"] is True and l1["authorization"] is None
          and l1["query"] == "sort=asc" and l1["status"] == 200 and
          l1["body"] is None, json.dumps(l1)[:800])
    check("recorded failed auth: status 401, credential unknown",
          ok and reqs[2]["status"] == 401 and
          reqs[2]["credential"] == "unknown")
    check("tokens are never recorded",
          GH_TOKEN not in r.raw.decode() and GL_TOKEN not in r.raw.decode())
    v = f.ctl("POST", "verify", {"requests": [
        {"method": "POST", "path": REPO + "/issues/1347/comments",
         "headers": {"authorization": "Bearer", "x-github-api-version":
                     "2022-11-28", "user-agent": True},
         "json": {"body": "recorded"}, "status": 201},
        {"method": "GET", "path": MR + "/notes", "query": "sort=asc",
         "headers": {"private-token": True, "authorization": None}},
        {"method": "GET", "path": MR + "/notes", "status": 401}]})
    check("POST /_fake/verify: matching expectations", v.json["ok"] is True,
          v.json)
    v = f.ctl("POST", "verify", {"requests": [
        {"method": "PATCH", "path": REPO + "/issues/1347/comments",
         "json": {"body": "other"}}]})
    check("POST /_fake/verify: mismatches are listed",
          v.json["ok"] is False and len(v.json["errors"]) >= 3, v.json)
    f.ctl("DELETE", "requests")
    r = f.ctl("GET", "requests")
    check("DELETE /_fake/requests clears the log", r.json == [])
    s = f.ctl("GET", "state").json
    pr = s["github"]["repos"]["octocat/Hello-World"]["pulls"]["1347"]
    c1 = [c for c in pr["comments"] if c["id"] == 1][0]
    note = [n for n in s["gitlab"]["projects"]["5"]["merge_requests"]["2"][
        "notes"] if n["id"] == 301][0]
    check("GET /_fake/state: comments with reactions, notes with awards",
          any(c["body"] == "recorded" for c in pr["comments"]) and
          {x["content"] for x in c1["reactions"]} == {"eyes"} and
          [a["name"] for a in note["award_emoji"]] == ["eyes"], s)


def test_cases():
    """The case files of tests/data/api/cases: replay, then verify."""
    cdir = os.path.join(DATA, "cases")
    for name in sorted(os.listdir(cdir)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(cdir, name), encoding="utf-8") as fh:
            case = json.load(fh)
        seed = os.path.normpath(os.path.join(cdir, case["seed_file"]))
        f = Fake("--seed", seed)
        try:
            for w in case["requests"]:
                h = {}
                for k, v in w.get("headers", {}).items():
                    if k == "authorization" and v:
                        h["Authorization"] = f"{v} {case['token']}"
                    elif k == "private-token" and v:
                        h["PRIVATE-TOKEN"] = case["token"]
                    elif k == "user-agent" and v is True:
                        h["User-Agent"] = "diverge-test/1"
                    elif isinstance(v, str):
                        h[k] = v
                body = json.dumps(w["json"]) if "json" in w else None
                p = w["path"] + ("?" + w["query"] if w.get("query") else "")
                f.req(w["method"], p, body, h)
            v = f.ctl("POST", "verify", {"requests": case["requests"]})
            check(f"case {name}: the requests match", v.json["ok"], v.json)
        finally:
            f.stop()


def test_github_app_signed():
    """With the App's key in the seed, the RS256 signature is checked."""
    sys.path.insert(0, HERE)
    import scm_fake
    key = os.path.join(DATA, "github", "jwt-test-key.pem")
    if not os.path.exists(key):
        check("# SKIP jwt-test-key.pem not present", True)
        return
    with open(key, encoding="ascii") as fh:
        n, e, d = scm_fake.rsa_public_from_pem(fh.read())
    vec = os.path.join(DATA, "github", "jwt-test-vector.txt")
    if os.path.exists(vec):
        with open(vec, encoding="ascii") as fh:
            h64, p64, s64 = fh.read().strip().split(".")
        check("RS256 verify (pure Python) accepts octokit's test vector",
              scm_fake.rs256_verify(n, e, f"{h64}.{p64}".encode(),
                                    base64.urlsafe_b64decode(s64 + "==")))

    def signed(payload):
        enc = lambda o: base64.urlsafe_b64encode(             # noqa: E731
            json.dumps(o, separators=(",", ":")).encode()).rstrip(
                b"=").decode()
        si = enc({"alg": "RS256", "typ": "JWT"}) + "." + enc(payload)
        sig = scm_fake.rs256_sign(n, d, si.encode())
        return si + "." + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()
    f = Fake()
    try:
        f.ctl("POST", "seed", {"github": {"app": {
            "id": 1, "slug": "signed", "private_key_file": key,
            "installations": [{"id": 3, "account": "octocat"}]}}})
        t = int(time.time())
        good = signed({"iat": t - 30, "exp": t + 570, "iss": 1})
        r = f.gh("GET", "/github/app", token=good)
        check("seeded key: a correctly signed JWT is accepted",
              r.status == 200 and r.json["slug"] == "signed", r.raw[:200])
        bad = good[:-6] + ("AAAAAA" if not good.endswith("AAAAAA")
                           else "BBBBBB")
        r = f.gh("GET", "/github/app", token=bad)
        check("seeded key: a bad signature is 401 could not be decoded",
              r.status == 401 and "could not be decoded" in
              r.json["message"], r.raw)
        r = f.gh("GET", "/github/app", token=app_jwt(iss=1))
        check("seeded key: an unsigned JWT is 401", r.status == 401)
    finally:
        f.stop()


def test_provider_and_lifetime():
    f = Fake("--provider", "github", "--seed", SEED)
    try:
        r = f.gl("GET", "/gitlab/api/v4/user")
        check("--provider github: GitLab paths 404, gitlab null",
              r.status == 404 and f.info["gitlab"] is None)
        f.proc.stdin.close()
        try:
            f.proc.wait(3)
            gone = True
        except subprocess.TimeoutExpired:
            gone = False
        check("exits on end of file on stdin", gone and
              f.proc.returncode == 0, f.proc.returncode)
    finally:
        f.stop()


def main():
    t0 = time.monotonic()
    f = Fake("--seed", SEED)
    try:
        for t in (test_start, test_github_fixtures, test_github_comments,
                  test_github_reactions, test_github_permissions,
                  test_github_contents, test_github_pagination,
                  test_github_auth, test_github_app, test_github_faults,
                  test_gitlab, test_gitlab_pagination, test_gitlab_faults,
                  test_recording):
            try:
                t(f)
            except Exception:
                check(f"{t.__name__} ran without an exception", False,
                      traceback.format_exc() + "\n" + f.stderr()[-2000:])
    finally:
        f.stop()
    for t in (test_cases, test_github_app_signed,
              test_provider_and_lifetime, test_gitlab_note_admin,
              test_github_comment_moderation):
        try:
            t()
        except Exception:
            check(f"{t.__name__} ran without an exception", False,
                  traceback.format_exc())
    check("the self-test took less than 20 s", time.monotonic() - t0 < 20,
          time.monotonic() - t0)
    print(f"1..{len(RESULTS)}", flush=True)
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
