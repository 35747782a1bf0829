#!/usr/bin/env python3
"""Fake GitHub REST and GitLab REST v4 APIs for integration tests.

One process serves both: GitHub under /github (the equivalent of
https://api.github.com) and GitLab under /gitlab/api/v4.  Python 3 standard
library only.  State (repositories, pull/merge requests, comments/notes,
reactions/award emoji, permissions, files at refs, users, the GitHub App and
its installations) lives in memory and is declared through POST /_fake/seed.
Every API request is recorded (GET /_fake/requests).  Faults (5xx bursts,
401/403/404, 403/429 with rate-limit headers, secondary limits, slow answers,
dropped connections) are injected through POST /_fake/faults.

Responses are built from the example responses copied from the shared
fixtures (tests/data/api/github, tests/data/api/gitlab).  See
tests/fakes/README.md ("Fake GitHub and GitLab APIs") for the command line,
the seed format, the control endpoints and the deviations from the real APIs.
Wire facts: reference/scm-wire.md of the shared docs (§ numbers below).
"""

import argparse
import base64
import copy
import datetime
import hashlib
import http.server
import json
import os
import random
import signal
import socket
import stat
import string
import sys
import threading
import time
import traceback
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FIXTURES = os.path.join(HERE, "..", "data", "api")

GH_PREFIX = "/github"
GL_PREFIX = "/gitlab/api/v4"
GH_DOCS = "https://docs.github.com/rest"
GH_PLACEHOLDER = "https://api.github.com"   # replaced by the fake's base URL

GH_VERSIONS = ("2022-11-28", "2026-03-10")
GH_REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket",
                "eyes")
GH_BODY_MAX = 65536
GL_BODY_MAX = 1000000
GL_APP_LIMIT_MSG = ("This endpoint has been requested too many times. "
                    "Try again later.")
# GitHub role -> "permission" field (§3: maintain->write, triage->read)
GH_ROLE_PERMISSION = {"admin": "admin", "maintain": "write", "write": "write",
                      "push": "write", "triage": "read", "read": "read",
                      "pull": "read", "none": "none"}
GH_NO_UA_TEXT = (
    "Request forbidden by administrative rules. Please make sure your "
    "request has a User-Agent header (https://docs.github.com/en/rest/"
    "overview/resources-in-the-rest-api#user-agent-required). Check "
    "https://developer.github.com for other possible causes.\n")
GH_SECONDARY_MSG = (
    "You have exceeded a secondary rate limit. Please wait a few minutes "
    "before you try again. If you reach out to GitHub Support for help, "
    "please include the request ID {rid}.")

# ---------------------------------------------------------------------------
# helpers


def now():
    return time.time()


def member_expired(m):
    """A GitLab membership past its expires_at (a date, UTC): it still
    shows in members/all until the daily worker removes it, but grants
    nothing."""
    exp = m.get("expires_at")
    if not exp:
        return False
    today = datetime.datetime.fromtimestamp(
        now(), datetime.timezone.utc).date().isoformat()
    return str(exp)[:10] < today


def iso(t):
    return datetime.datetime.fromtimestamp(
        int(t), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ms(t):
    d = datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


def parse_time(s):
    """ISO 8601 (GitHub `since`, seeded timestamps) -> epoch seconds."""
    s = s.strip().replace("Z", "+00:00")
    if "T" not in s:
        s += "T00:00:00+00:00"
    d = datetime.datetime.fromisoformat(s)
    if d.tzinfo is None:
        d = d.replace(tzinfo=datetime.timezone.utc)
    return d.timestamp()


def node_id(kind_len_name, n):
    """GitHub's legacy global ids: base64("012:IssueComment1")."""
    return base64.b64encode(f"{kind_len_name}{n}".encode()).decode()


def git_sha(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fake_sha(text):
    return hashlib.sha1(text.encode()).hexdigest()


def b64_60(data):
    """Ruby's Base64.encode64: lines of 60 characters, each ending in \\n."""
    s = base64.b64encode(data).decode()
    return "".join(s[i:i + 60] + "\n" for i in range(0, len(s), 60))


def replace_strings(obj, pairs):
    """Recursive string replacement in a JSON value."""
    if isinstance(obj, str):
        for a, b in pairs:
            obj = obj.replace(a, b)
        return obj
    if isinstance(obj, list):
        return [replace_strings(v, pairs) for v in obj]
    if isinstance(obj, dict):
        return {k: replace_strings(v, pairs) for k, v in obj.items()}
    return obj


def rand_token(prefix, n=36):
    alphabet = string.ascii_letters + string.digits
    return prefix + "".join(random.choice(alphabet) for _ in range(n))


def b64url_json(part):
    part += "=" * (-len(part) % 4)
    return json.loads(base64.urlsafe_b64decode(part.encode()))


# RS256 with the standard library: DER parsing plus pow().  Used only when
# the seed gives the App's key (otherwise signatures are not checked).

_SHA256_DIGESTINFO = bytes.fromhex("3031300d060960864801650304020105000420")


def _der(data, pos=0):
    """One DER TLV at pos -> (tag, content bytes, next position)."""
    tag = data[pos]
    n = data[pos + 1]
    pos += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(data[pos:pos + k], "big")
        pos += k
    return tag, data[pos:pos + n], pos + n


def _der_seq(content):
    out, pos = [], 0
    while pos < len(content):
        tag, val, pos = _der(content, pos)
        out.append((tag, val))
    return out


def rsa_public_from_pem(pem):
    """(n, e) from a PEM RSA key: PKCS#1 or PKCS#8 private, PKCS#1 or SPKI
    public."""
    lines = [x.strip() for x in pem.strip().splitlines()]
    kind = lines[0]
    der = base64.b64decode("".join(x for x in lines if not x.startswith(
        "-----")))
    _, body, _ = _der(der)
    items = _der_seq(body)
    if "RSA PRIVATE KEY" in kind:           # PKCS#1 RSAPrivateKey
        ints = [int.from_bytes(v, "big") for t, v in items if t == 0x02]
        return ints[1], ints[2], ints[3]
    if "PRIVATE KEY" in kind:               # PKCS#8 PrivateKeyInfo
        inner = [v for t, v in items if t == 0x04][0]
        _, body, _ = _der(inner)
        ints = [int.from_bytes(v, "big") for t, v in _der_seq(body)
                if t == 0x02]
        return ints[1], ints[2], ints[3]
    if "RSA PUBLIC KEY" in kind:            # PKCS#1 RSAPublicKey
        ints = [int.from_bytes(v, "big") for t, v in items]
        return ints[0], ints[1], None
    bits = [v for t, v in items if t == 0x03][0][1:]   # SPKI
    _, body, _ = _der(bits)
    ints = [int.from_bytes(v, "big") for t, v in _der_seq(body)]
    return ints[0], ints[1], None


def _emsa_sha256(msg, k):
    t = _SHA256_DIGESTINFO + hashlib.sha256(msg).digest()
    return b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t


def rs256_verify(n, e, signing_input, sig):
    k = (n.bit_length() + 7) // 8
    if len(sig) != k:
        return False
    m = pow(int.from_bytes(sig, "big"), e, n)
    return m.to_bytes(k, "big") == _emsa_sha256(signing_input, k)


def rs256_sign(n, d, signing_input):
    """For tests: the RS256 signature (slow-ish pure Python, ~10 ms)."""
    k = (n.bit_length() + 7) // 8
    m = int.from_bytes(_emsa_sha256(signing_input, k), "big")
    return pow(m, d, n).to_bytes(k, "big")


class ApiError(Exception):
    """An HTTP error answer: status, body (JSON value or str), headers."""

    def __init__(self, status, body, headers=None, ctype=None):
        super().__init__(str(body))
        self.status = status
        self.body = body
        self.headers = headers or []
        self.ctype = ctype


def gh_error(status, message, doc=GH_DOCS, **extra):
    body = {"message": message}
    body.update(extra)
    body["documentation_url"] = doc
    body["status"] = str(status)
    return ApiError(status, body)


def gh_not_found(doc=GH_DOCS):
    return gh_error(404, "Not Found", doc)


def gl_error(status, message):
    return ApiError(status, {"message": message})


# ---------------------------------------------------------------------------
# templates (the fixtures)


class Templates:
    def __init__(self, d):
        def load(p):
            with open(os.path.join(d, p), encoding="utf-8") as f:
                return json.load(f)
        gh = lambda n: load(os.path.join("github", n))     # noqa: E731
        gl = lambda n: load(os.path.join("gitlab", n))     # noqa: E731
        self.gh_comment = gh("issues.create-comment.json")
        self.gh_comment_list_item = gh("issues.list-comments.json")[0]
        self.gh_reaction = gh("reactions.create-for-issue-comment.json")
        self.gh_permission = gh("repos.get-collaborator-permission-level.json")
        self.gh_pull = gh("pulls.get.json")
        self.gh_app = gh("apps.get-authenticated.json")
        self.gh_installation = gh("apps.get-repo-installation.json")
        self.gh_token = gh("apps.create-installation-access-token.json")
        self.gh_content_file = gh("repos.get-content.json")
        self.gh_content_dir = gh(
            "repos.get-content--response-if-content-is-a-directory.json")[0]
        self.gh_user = self.gh_comment["user"]
        self.gh_repo = self.gh_pull["base"]["repo"]
        self.gl_note = gl("get-mr-note.json")
        self.gl_award = gl("award-emoji-on-note.json")
        self.gl_member = gl("get-project-member-all.json")
        self.gl_current_user = gl("get-current-user.json")
        self.gl_user = gl("get-user.json")


# ---------------------------------------------------------------------------
# state


class GitHubState:
    def __init__(self):
        self.tokens = {}            # token -> login
        self.users = {}             # login -> {"login","id","type","name","email"}
        self.repos = {}             # "owner/name" -> repo dict
        self.app = None             # {"id","slug","client_id","name","permissions","installations":{id: inst}}
        self.inst_tokens = {}       # token -> {"installation","expires","permissions","repos"}
        self.next_id = 1000         # comments, reactions
        self.next_user_id = 5000
        self.rate_limit = 5000
        self.rate_used = 0
        self.rate_reset = int(now()) + 3600

    def user(self, login, create=True):
        u = self.users.get(login)
        if u is None and create:
            self.next_user_id += 1
            u = {"login": login, "id": self.next_user_id,
                 "type": "Bot" if login.endswith("[bot]") else "User",
                 "name": None, "email": None, "site_admin": False}
            self.users[login] = u
        return u

    def new_id(self):
        self.next_id += 1
        return self.next_id


class GitLabState:
    def __init__(self):
        self.tokens = {}            # token -> username
        self.users = {}             # username -> {"id","username","name",
        #                             "email","bot"}
        self.projects = {}          # id -> project dict
        self.next_id = 1000         # notes, award emoji, MR global ids
        self.next_user_id = 5000
        self.rate_limit = 2000
        self.rate_used = 0
        self.rate_reset = int(now()) + 60

    def user(self, username, create=True):
        u = self.users.get(username)
        if u is None and create:
            self.next_user_id += 1
            u = {"id": self.next_user_id, "username": username,
                 "name": username, "email": f"{username}@example.com",
                 "bot": False}
            self.users[username] = u
        return u

    def user_by_id(self, uid):
        for u in self.users.values():
            if u["id"] == uid:
                return u
        return None

    def project(self, ident):
        """ident: numeric id or decoded path_with_namespace."""
        if ident.isdigit():
            return self.projects.get(int(ident))
        for p in self.projects.values():
            if p["path_with_namespace"] == ident:
                return p
        return None

    def new_id(self):
        self.next_id += 1
        return self.next_id


def _ts(v, default):
    if v is None:
        return default
    if isinstance(v, (int, float)):
        return float(v)
    return parse_time(v)


def _files(spec):
    """{"ref": {"path": "text"}} -> {"ref": {"path": bytes}}."""
    out = {}
    for ref, files in (spec or {}).items():
        out[ref] = {}
        for path, content in files.items():
            if isinstance(content, dict) and "base64" in content:
                data = base64.b64decode(content["base64"])
            else:
                data = str(content).encode()
            out[ref][path.strip("/")] = data
    return out


class State:
    def __init__(self, tmpl):
        self.lock = threading.RLock()
        self.tmpl = tmpl
        self.reset()

    def reset(self):
        with self.lock:
            self.gh = GitHubState()
            self.gl = GitLabState()
            self.requests = []
            self.faults = []
            # credential -> {"until", "fault"}: a rate limit a fault
            # started holds its credential (GitHub: the user or the
            # installation; GitLab: the user) until it ends (§5, §8)
            self.limited = {}
            self.seq = 0

    # -- seeding ------------------------------------------------------------

    def seed(self, spec):
        with self.lock:
            if "github" in spec:
                self.seed_github(spec["github"] or {})
            if "gitlab" in spec:
                self.seed_gitlab(spec["gitlab"] or {})

    def seed_github(self, s):
        gh = self.gh
        t0 = 1704067200.0           # 2024-01-01T00:00:00Z: seeded timestamps
        for u in s.get("users", []):
            if isinstance(u, str):
                u = {"login": u}
            cur = gh.user(u["login"])
            for k in ("id", "type", "name", "email", "site_admin"):
                if k in u:
                    cur[k] = u[k]
        if "user" in s:                 # the default owner of the tokens
            u = s["user"] if isinstance(s["user"], dict) else {
                "login": s["user"]}
            cur = gh.user(u["login"])
            for k in ("id", "type", "name", "email", "site_admin"):
                if k in u:
                    cur[k] = u[k]
            default_login = u["login"]
        else:
            default_login = None
        toks = s.get("tokens", [])
        if isinstance(toks, list):
            for t in toks:
                gh.tokens[t] = default_login or "diverge-test-user"
                gh.user(gh.tokens[t])
        else:
            for t, login in toks.items():
                gh.tokens[t] = login
                gh.user(login)
        if "rate_limit" in s:
            gh.rate_limit = int(s["rate_limit"])
        if "rate_used" in s:
            gh.rate_used = int(s["rate_used"])
        if "app" in s:
            a = s["app"]
            app = {"id": int(a.get("id", 1)), "slug": a.get("slug", "diverge"),
                   "client_id": a.get("client_id", "Iv1.0123456789abcdef"),
                   "name": a.get("name", a.get("slug", "diverge")),
                   "owner": a.get("owner", "octocat"),
                   "permissions": a.get("permissions", {
                       "metadata": "read", "contents": "read",
                       "issues": "write", "pull_requests": "write"}),
                   "token_ttl": int(a.get("token_ttl", 3600)),
                   "key": None, "installations": {}}
            pem = a.get("public_key") or a.get("private_key")
            if a.get("private_key_file") or a.get("public_key_file"):
                with open(a.get("private_key_file") or
                          a.get("public_key_file"), encoding="ascii") as f:
                    pem = f.read()
            if pem:
                app["key"] = rsa_public_from_pem(pem)[:2]
            for inst in a.get("installations", []):
                iid = int(inst["id"])
                app["installations"][iid] = {
                    "id": iid, "account": inst.get("account", "octocat"),
                    "account_type": inst.get("account_type", "User"),
                    "repositories": inst.get("repositories", "all"),
                    "permissions": inst.get("permissions",
                                            app["permissions"])}
            gh.app = app
            gh.user(app["slug"] + "[bot]")["type"] = "Bot"
        for r in s.get("repos", []):
            full = r["full_name"]
            owner, _, name = full.partition("/")
            gh.user(owner)
            repo = {"full_name": full, "owner": owner, "name": name,
                    "id": int(r.get("id", 1296269 + len(gh.repos))),
                    "private": bool(r.get("private", False)),
                    "fork": bool(r.get("fork", False)),
                    "default_branch": r.get("default_branch", "main"),
                    "description": r.get("description"),
                    "clone_url": r.get("clone_url",
                                       f"https://github.com/{full}.git"),
                    "collaborators": dict(r.get("collaborators", {})),
                    "files": _files(r.get("files")),
                    "branches": dict(r.get("branches", {})),
                    "pulls": {}}
            for login in repo["collaborators"]:
                gh.user(login)
            gh.repos[full] = repo
            for p in r.get("pulls", []) + r.get("issues", []):
                is_pr = p in r.get("pulls", [])
                n = int(p["number"])
                head = p.get("head", {})
                base = p.get("base", {})
                head_repo = head.get("repo", full)
                if head_repo not in gh.repos:
                    ho, _, hn = head_repo.partition("/")
                    gh.user(ho)
                    gh.repos[head_repo] = {
                        "full_name": head_repo, "owner": ho, "name": hn,
                        "id": 9000000 + len(gh.repos), "private": False,
                        "fork": head_repo != full,
                        "default_branch": repo["default_branch"],
                        "description": None,
                        "clone_url": f"https://github.com/{head_repo}.git",
                        "collaborators": {}, "files": {}, "branches": {},
                        "pulls": {}}
                pr = {"number": n, "is_pr": is_pr,
                      "id": int(p.get("id", 1000000 + n)),
                      "title": p.get("title", f"Pull request {n}"),
                      "body": p.get("body"),
                      "user": p.get("user", owner),
                      "state": p.get("state", "open"),
                      "draft": bool(p.get("draft", False)),
                      "merged": bool(p.get("merged", False)),
                      "locked": bool(p.get("locked", False)),
                      "mergeable": p.get("mergeable", True),
                      "head_ref": head.get("ref", f"feature-{n}"),
                      "head_sha": head.get("sha"),
                      "head_repo": head_repo,
                      "base_ref": base.get("ref", repo["default_branch"]),
                      "base_sha": base.get("sha"),
                      "created": _ts(p.get("created_at"), t0),
                      "comments": []}
                gh.user(pr["user"])
                pr["head_sha"] = pr["head_sha"] or fake_sha(
                    f"{head_repo}:{pr['head_ref']}")
                pr["base_sha"] = pr["base_sha"] or fake_sha(
                    f"{full}:{pr['base_ref']}")
                # review comments (on the diff) are numbered apart from
                # issue comments on GitHub: the same id may name one of each
                pr["review_comments"] = []
                kinds = [("comments", c) for c in p.get("comments", [])]
                if is_pr:
                    kinds += [("review_comments", c)
                              for c in p.get("review_comments", [])]
                for i, (kind, c) in enumerate(kinds):
                    cid = int(c.get("id", 0)) or gh.new_id()
                    gh.next_id = max(gh.next_id, cid)
                    gh.user(c.get("user", owner))
                    ct = _ts(c.get("created_at"), t0 + 60 * (i + 1))
                    pr[kind].append({
                        "id": cid, "user": c.get("user", owner),
                        "body": c.get("body", ""), "created": ct,
                        "updated": _ts(c.get("updated_at"), ct),
                        "author_association": c.get("author_association"),
                        "reactions": [
                            {"id": gh.new_id(), "content": x["content"],
                             "user": x.get("user", owner), "created": ct}
                            for x in c.get("reactions", [])]})
                    if kind == "review_comments":
                        pr[kind][-1]["path"] = c.get("path", "README.md")
                        pr[kind][-1]["line"] = int(c.get("line", 1))
                repo["pulls"][n] = pr

    def seed_gitlab(self, s):
        gl = self.gl
        t0 = 1704067200.0

        def upd(u):
            if isinstance(u, str):
                u = {"username": u}
            cur = gl.user(u["username"])
            for k in ("id", "name", "email"):
                if k in u:
                    cur[k] = u[k]
            if "bot" in u:
                cur["bot"] = bool(u["bot"])
            if "is_admin" in u:
                cur["is_admin"] = bool(u["is_admin"])
            return cur
        for u in s.get("users", []):
            upd(u)
        default = upd(s["user"])["username"] if "user" in s else None
        toks = s.get("tokens", [])
        if isinstance(toks, list):
            for t in toks:
                gl.tokens[t] = default or "diverge-test-user"
                gl.user(gl.tokens[t])
        else:
            for t, name in toks.items():
                gl.tokens[t] = name
                gl.user(name)
        if "rate_limit" in s:
            gl.rate_limit = int(s["rate_limit"])
        for p in s.get("projects", []):
            pid = int(p["id"])
            pwn = p["path_with_namespace"]
            proj = {"id": pid, "path_with_namespace": pwn,
                    "default_branch": p.get("default_branch", "main"),
                    "visibility": p.get("visibility", "public"),
                    "members": {}, "files": _files(p.get("files")),
                    "mrs": {}}
            for who, m in p.get("members", {}).items():
                u = gl.user_by_id(int(who)) if str(who).isdigit() else \
                    gl.user(who)
                if u is None:
                    continue
                # a level, or {"access_level", "expires_at", "state"}
                if not isinstance(m, dict):
                    m = {"access_level": m}
                proj["members"][u["id"]] = {
                    "access_level": int(m["access_level"]),
                    "expires_at": m.get("expires_at"),
                    "state": m.get("state", "active")}
            gl.projects[pid] = proj
            for m in p.get("merge_requests", []):
                iid = int(m["iid"])
                author = m.get("author", pwn.split("/")[0])
                gl.user(author)
                mr = {"iid": iid, "id": int(m.get("id", 0)) or gl.new_id(),
                      "title": m.get("title", f"Merge request {iid}"),
                      "description": m.get("description", ""),
                      "state": m.get("state", "opened"),
                      "draft": bool(m.get("draft", False)),
                      "source_branch": m.get("source_branch",
                                             f"feature-{iid}"),
                      "target_branch": m.get("target_branch",
                                             proj["default_branch"]),
                      "source_project_id": int(m.get("source_project_id",
                                                     pid)),
                      "sha": m.get("sha"), "author": author,
                      "created": _ts(m.get("created_at"), t0),
                      "notes": []}
                mr["sha"] = mr["sha"] or fake_sha(
                    f"{mr['source_project_id']}:{mr['source_branch']}")
                for i, n in enumerate(m.get("notes", [])):
                    nid = int(n.get("id", 0)) or gl.new_id()
                    gl.next_id = max(gl.next_id, nid)
                    who = n.get("author", author)
                    gl.user(who)
                    ct = _ts(n.get("created_at"), t0 + 60 * (i + 1))
                    mr["notes"].append({
                        "id": nid, "author": who, "body": n.get("body", ""),
                        "system": bool(n.get("system", False)),
                        "internal": bool(n.get("internal", False)),
                        "created": ct, "updated": _ts(n.get("updated_at"), ct),
                        "awards": [
                            {"id": gl.new_id(), "name": a["name"],
                             "user": a.get("user", who), "created": ct}
                            for a in n.get("award_emoji", [])]})
                proj["mrs"][iid] = mr

    # -- faults -------------------------------------------------------------

    def take_fault(self, provider, method, target):
        with self.lock:
            for f in self.faults:
                if f["count"] <= 0:
                    continue
                if f.get("provider") and f["provider"] != provider:
                    continue
                if f.get("method") and f["method"].upper() != method:
                    continue
                if f.get("match") and f["match"] not in target:
                    continue
                f["count"] -= 1
                f["hits"] = f.get("hits", 0) + 1
                self.faults = [x for x in self.faults if x["count"] > 0]
                return dict(f)
        return None

    def limit_credential(self, key, until, fault):
        """A rate-limit answer: the credential stays limited until then."""
        if key is None or fault.get("held"):
            return
        with self.lock:
            w = self.limited.get(key)
            if w is None or w["until"] < until:
                self.limited[key] = {"until": until, "fault": dict(fault)}

    def held(self, key):
        """The fault to answer with while key is limited, else None."""
        with self.lock:
            w = self.limited.get(key) if key is not None else None
            if w is None or w["until"] <= now():
                return None
            f = dict(w["fault"])
            left = w["until"] - now()
        f["count"] = 0
        if f.get("retry_after") is not None:
            f["retry_after"] = max(1, int(left + 0.999))
        if f.get("ratelimit_reset_in") is not None:
            f["ratelimit_reset_in"] = left
        f["held"] = True
        return f

    # -- state dump ---------------------------------------------------------

    def dump(self):
        with self.lock:
            gh, gl = self.gh, self.gl
            repos = {}
            for full, r in gh.repos.items():
                pulls = {}

                def comments(cs):
                    return [{"id": c["id"], "user": c["user"],
                             "body": c["body"],
                             "created_at": iso(c["created"]),
                             "updated_at": iso(c["updated"]),
                             "reactions": [{"id": x["id"],
                                            "content": x["content"],
                                            "user": x["user"]}
                                           for x in c["reactions"]]}
                            for c in cs]
                for n, p in r["pulls"].items():
                    pulls[str(n)] = {
                        "is_pull_request": p["is_pr"],
                        "head": {"ref": p["head_ref"], "sha": p["head_sha"],
                                 "repo": p["head_repo"]},
                        "base": {"ref": p["base_ref"], "sha": p["base_sha"]},
                        "comments": comments(p["comments"]),
                        "review_comments": comments(p["review_comments"])}
                repos[full] = {"pulls": pulls}
            projects = {}
            for pid, p in gl.projects.items():
                mrs = {}
                for iid, m in p["mrs"].items():
                    mrs[str(iid)] = {"id": m["id"], "notes": [{
                        "id": n["id"], "author": n["author"],
                        "body": n["body"], "system": n["system"],
                        "internal": n["internal"],
                        "created_at": iso_ms(n["created"]),
                        "updated_at": iso_ms(n["updated"]),
                        "award_emoji": [{"id": a["id"], "name": a["name"],
                                         "user": a["user"]}
                                        for a in n["awards"]]}
                        for n in m["notes"]]}
                projects[str(pid)] = {
                    "path_with_namespace": p["path_with_namespace"],
                    "merge_requests": mrs}
            tokens = [{"installation": v["installation"],
                       "expires_at": iso(v["expires"]),
                       "permissions": v["permissions"]}
                      for v in gh.inst_tokens.values()]
            return {
                "github": {"repos": repos, "installation_tokens": tokens,
                           "rate": {"limit": gh.rate_limit,
                                    "used": gh.rate_used,
                                    "remaining": max(0, gh.rate_limit -
                                                     gh.rate_used),
                                    "reset": gh.rate_reset}},
                "gitlab": {"projects": projects,
                           "rate": {"limit": gl.rate_limit,
                                    "used": gl.rate_used,
                                    "remaining": max(0, gl.rate_limit -
                                                     gl.rate_used),
                                    "reset": gl.rate_reset}},
                "faults": self.faults,
                "requests": len(self.requests)}


# ---------------------------------------------------------------------------
# recorded requests and their verification (curl tests/data style)


def verify_requests(recorded, spec):
    """spec: {"requests": [{"method","path","query","headers","body","json",
    "status"}], "exact": true}.  Returns a list of error strings."""
    want = spec.get("requests", [])
    errors = []
    if spec.get("exact", True) and len(want) != len(recorded):
        errors.append(f"expected {len(want)} requests, got {len(recorded)}")
    for i, w in enumerate(want):
        if i >= len(recorded):
            errors.append(f"request {i + 1}: missing ({w.get('method')} "
                          f"{w.get('path')})")
            continue
        r = recorded[i]
        tag = f"request {i + 1} ({r['method']} {r['path']})"
        for k in ("method", "path", "query", "status", "body"):
            if k in w and w[k] != r.get(k):
                errors.append(f"{tag}: {k} {r.get(k)!r} != expected {w[k]!r}")
        if "json" in w and w["json"] != r.get("json"):
            errors.append(f"{tag}: json {r.get('json')!r} != expected "
                          f"{w['json']!r}")
        for h, v in (w.get("headers") or {}).items():
            hl = h.lower()
            if hl == "authorization":
                got = r.get("authorization")    # the scheme only
            elif hl == "private-token":
                got = "present" if r.get("private_token") else None
                if v is True:
                    v = "present"
            else:
                got = r["headers"].get(hl)
            if v is True:
                ok = got is not None
            elif v is False or v is None:
                ok = got is None
            else:
                ok = got == v
            if not ok:
                errors.append(f"{tag}: header {h} {got!r} != expected {v!r}")
    return errors


# ---------------------------------------------------------------------------
# HTTP


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-scm/1"
    sys_version = ""
    disable_nagle_algorithm = True      # TCP_NODELAY

    def log_message(self, fmt, *args):
        pass

    def log_line(self, code):
        sys.stderr.write(f"{self.command} {self.path} {code}\n")
        sys.stderr.flush()

    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            chunks = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n",
                                                             b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def send(self, code, body, ctype=None, headers=None):
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
            ctype = ctype or "application/octet-stream"
        elif isinstance(body, str):
            data = body.encode()
            ctype = ctype or "text/plain; charset=utf-8"
        elif body is None:
            data = b""
        else:
            text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
            if self.gh_base:
                text = text.replace(GH_PLACEHOLDER, self.gh_base)
            data = text.encode()
            ctype = ctype or "application/json; charset=utf-8"
        if self.rec is not None:        # before the client can see it
            self.rec["status"] = code
        self.send_response(code)
        if ctype and code != 204:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers or ():
            self.send_header(k, str(v))
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(data)
        self.flush_headers()
        self.log_line(code)

    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def dispatch(self):
        srv = self.server
        self.rec = None
        self.gh_base = None
        try:
            body = self.read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        u = urllib.parse.urlsplit(self.path)
        raw_path, query = u.path, u.query
        method = self.command
        try:
            if raw_path == "/_fake" or raw_path.startswith("/_fake/"):
                return self.control(method, raw_path, query, body)
            provider = None
            if raw_path == GH_PREFIX or raw_path.startswith(GH_PREFIX + "/"):
                provider = "github"
            elif raw_path == GL_PREFIX or raw_path.startswith(GL_PREFIX + "/"):
                provider = "gitlab"
            host = self.headers.get("Host") or f"127.0.0.1:{srv.port}"
            self.gh_base = f"http://{host}{GH_PREFIX}"
            self.record(provider, method, raw_path, query, body)
            if provider is None or provider not in srv.providers:
                return self.send(404, {"message": "Not Found"})
            fault = srv.state.take_fault(provider, method,
                                         raw_path + ("?" + query if query
                                                     else ""))
            if fault and fault.get("delay_ms"):
                time.sleep(fault["delay_ms"] / 1000.0)
            if fault and fault.get("close"):
                self.close_connection = True
                self.rec["status"] = None
                self.log_line("closed")
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if provider == "github":
                api = GitHubApi(self, srv.state, raw_path[len(GH_PREFIX):],
                                query, body, fault)
            else:
                api = GitLabApi(self, srv.state, raw_path[len(GL_PREFIX):],
                                query, body, fault)
            api.run()
        except BrokenPipeError:
            self.close_connection = True
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            try:
                self.send(500, {"message": "fake-scm internal error: " +
                                traceback.format_exc().splitlines()[-1]})
            except OSError:
                self.close_connection = True

    def record(self, provider, method, raw_path, query, body):
        h = self.headers
        auth = h.get("Authorization")
        scheme = auth.partition(" ")[0] if auth else None
        headers = {}
        for k, v in h.items():
            kl = k.lower()
            if kl in ("authorization", "private-token"):
                v = (v.partition(" ")[0] + " <redacted>") if kl == \
                    "authorization" else "<redacted>"
            headers[kl] = v
        text = body.decode("utf-8", "replace") if body else None
        parsed = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        rec = {"provider": provider, "method": method, "path": raw_path,
               "query": query,
               "authorization": scheme,
               "credential": None,
               "user": None, "installation": None,
               "private_token": "PRIVATE-TOKEN" in h,
               "accept": h.get("Accept"),
               "api_version": h.get("X-GitHub-Api-Version"),
               "user_agent": h.get("User-Agent"),
               "content_type": h.get("Content-Type"),
               "headers": headers,
               "body": text, "body_length": len(body), "json": parsed,
               "status": None, "time": now()}
        st = self.server.state
        with st.lock:
            st.seq += 1
            rec["seq"] = st.seq
            st.requests.append(rec)
        self.rec = rec

    # -- control ------------------------------------------------------------

    def control(self, method, path, query, body):
        st = self.server.state
        try:
            spec = json.loads(body) if body else None
        except ValueError as e:
            return self.send(400, {"error": f"bad JSON: {e}"})
        if path == "/_fake/seed" and method == "POST":
            try:
                st.seed(spec or {})
            except (KeyError, TypeError, ValueError) as e:
                return self.send(400, {"error": f"bad seed: {e!r}"})
            return self.send(200, {"ok": True})
        if path == "/_fake/reset" and method == "POST":
            st.reset()
            return self.send(200, {"ok": True})
        if path == "/_fake/requests":
            if method == "GET":
                with st.lock:
                    return self.send(200, list(st.requests))
            if method == "DELETE":
                with st.lock:
                    st.requests = []
                return self.send(200, {"ok": True})
        if path == "/_fake/verify" and method == "POST":
            with st.lock:
                recorded = list(st.requests)
            errs = verify_requests(recorded, spec or {})
            return self.send(200, {"ok": not errs, "errors": errs,
                                   "recorded": [
                                       f"{r['method']} {r['path']}" +
                                       (f"?{r['query']}" if r['query']
                                        else "") + f" -> {r['status']}"
                                       for r in recorded]})
        if path == "/_fake/faults":
            if method == "POST":
                rules = spec if isinstance(spec, list) else [spec]
                with st.lock:
                    for r in rules:
                        if not isinstance(r, dict):
                            return self.send(400, {"error": "rule: object"})
                        r = dict(r)
                        r["count"] = int(r.get("count", 1))
                        st.faults.append(r)
                    return self.send(200, {"ok": True, "faults": st.faults})
            if method == "GET":
                with st.lock:
                    return self.send(200, st.faults)
            if method == "DELETE":
                with st.lock:
                    st.faults = []
                    st.limited = {}
                return self.send(200, {"ok": True})
        if path == "/_fake/state" and method == "GET":
            return self.send(200, st.dump())
        if path == "/_fake/expire_tokens" and method == "POST":
            with st.lock:
                for v in st.gh.inst_tokens.values():
                    v["expires"] = now() - 1
            return self.send(200, {"ok": True})
        if path == "/_fake/rate" and method == "POST":
            # {"provider": "github", "used": N, "limit": N, "reset_in": S}
            with st.lock:
                p = st.gh if (spec or {}).get("provider",
                                              "github") == "github" else st.gl
                if "limit" in spec:
                    p.rate_limit = int(spec["limit"])
                if "used" in spec:
                    p.rate_used = int(spec["used"])
                if "reset_in" in spec:
                    p.rate_reset = int(now() + spec["reset_in"])
            return self.send(200, {"ok": True})
        return self.send(404, {"error": f"no control endpoint {method} {path}"})


# ---------------------------------------------------------------------------
# common API plumbing


class Api:
    provider = None

    def __init__(self, h, st, path, query, body, fault):
        self.h = h
        self.st = st
        self.t = st.tmpl
        self.raw_path = path
        self.segs = [urllib.parse.unquote(s) for s in path.split("/")[1:]] \
            if path else []
        if self.segs and self.segs[-1] == "" and len(self.segs) > 1:
            self.segs = self.segs[:-1]
        self.query_raw = query
        self.q = {k: v[-1] for k, v in urllib.parse.parse_qs(
            query, keep_blank_values=True).items()}
        self.body = body
        self.fault = fault
        self.method = h.command
        self.extra_headers = []

    def reply(self, code, obj, ctype=None, headers=None):
        hs = (list(headers or []) + self.rate_headers(code) +
              self.extra_headers)
        omit = {str(k).lower() for k in
                (self.fault or {}).get("omit_headers") or ()}
        if omit:
            # a proxy that strips headers (GitHub's Link, GitLab's X-*),
            # or GitLab.com counting no more than 10,000 records: no
            # X-Total, X-Total-Pages, nor the rel="last" link (§8);
            # GitHub sends no X-Total, its Link stays whole
            hs = [(k, v) for k, v in hs if k.lower() not in omit]
            if "x-total" in omit and self.provider == "gitlab":
                hs = [(k, ", ".join(x for x in str(v).split(", ")
                                    if not x.endswith('rel="last"'))
                       if k.lower() == "link" else v) for k, v in hs]
        self.h.send(code, obj, ctype, hs)

    def rate_headers(self, code):
        return []

    def page_args(self, default):
        try:
            per = int(self.q.get("per_page", default))
        except ValueError:
            per = default
        if per <= 0:
            per = default
        per = min(per, 100)
        try:
            page = max(1, int(self.q.get("page", 1)))
        except ValueError:
            page = 1
        return page, per

    def stale_next(self, page, last):
        """The page a broken server or proxy names as the next one (a
        fault's "stale_next"), else None: "same" the page just served,
        "back" page 1 from page 2 on (page 1 names page 2 as usual, if
        any)."""
        how = (self.fault or {}).get("stale_next")
        if how == "same":
            return page
        if how == "back":
            return 1 if page > 1 else (2 if last > 1 else None)
        return None

    def url_with(self, **params):
        q = urllib.parse.parse_qsl(self.query_raw, keep_blank_values=True)
        q = [(k, v) for k, v in q if k not in params]
        q += [(k, str(v)) for k, v in params.items()]
        host = self.h.headers.get("Host") or f"127.0.0.1:{self.h.server.port}"
        prefix = GH_PREFIX if self.provider == "github" else GL_PREFIX
        return (f"http://{host}{prefix}{self.raw_path}?" +
                urllib.parse.urlencode(q))

    def cred_key(self):
        """Whose rate limits the request spends (None: nobody known)."""
        return None

    def echo_auth(self, f):
        """The fault's message quoting the credential the request came
        with, as some proxies and gateways in front of an API do:
        "header" the whole Authorization (or PRIVATE-TOKEN) header line,
        "token" the bare token, "tail" its last 20 characters (a window
        of the request, as a log excerpt may quote it)."""
        h = self.h.headers
        name = "Authorization" if h.get("Authorization") else "PRIVATE-TOKEN"
        value = h.get(name) or ""
        base = f.get("message") or {401: "Bad credentials",
                                    403: "Forbidden"}.get(
            int(f["status"]), "Error")
        tok = value.split(" ", 1)[-1].strip()
        if f["echo_auth"] == "token":
            return "%s: token '%s' may not do this" % (base, tok)
        if f["echo_auth"] == "tail":
            return "%s: token '...%s' may not do this" % (base, tok[-20:])
        return "%s (request had %s: %s)" % (base, name, value)

    def run(self):
        try:
            f = self.fault
            if not (f and f.get("status")):
                f = self.st.held(self.cred_key())
            if f and f.get("status"):
                if f.get("echo_auth"):
                    f = dict(f, message=self.echo_auth(f))
                raise self.fault_error(f)
            self.route()
        except ApiError as e:
            self.reply(e.status, e.body, e.ctype, e.headers)


# ---------------------------------------------------------------------------
# GitHub


class GitHubApi(Api):
    provider = "github"

    def __init__(self, *a):
        super().__init__(*a)
        self.gh = self.st.gh
        self.login = None           # the authenticated user (PAT) or bot
        self.inst = None            # installation token record
        self.is_jwt = False
        self.rate_override = None
        self.request_id = "%04X:%04X:%06X:%06X:%08X" % tuple(
            random.getrandbits(b) for b in (16, 16, 24, 24, 32))
        self.counted = False

    # -- headers ------------------------------------------------------------

    def rate_headers(self, code):
        gh = self.gh
        with self.st.lock:
            if self.counted is False and self.login is not None:
                if now() >= gh.rate_reset:
                    gh.rate_used = 0
                    gh.rate_reset = int(now()) + 3600
                gh.rate_used += 1
                self.counted = True
            limit = gh.rate_limit if self.login else 60
            used = min(gh.rate_used, limit) if self.login else 1
            remaining = max(0, limit - used)
            reset = gh.rate_reset
        if self.rate_override:
            o = self.rate_override
            if "remaining" in o:
                remaining = o["remaining"]
                used = limit - remaining
            if "reset" in o:
                reset = o["reset"]
        hs = [("x-github-api-version-selected",
               self.h.headers.get("X-GitHub-Api-Version") or GH_VERSIONS[0]),
              ("x-github-media-type", "github.v3; format=json"),
              ("x-ratelimit-limit", limit),
              ("x-ratelimit-remaining", remaining),
              ("x-ratelimit-reset", reset),
              ("x-ratelimit-used", used),
              ("x-ratelimit-resource", "core"),
              ("x-github-request-id", self.request_id)]
        return hs

    # -- faults -------------------------------------------------------------

    def fault_error(self, f):
        status = int(f["status"])
        hs = []
        if f.get("retry_after") is not None:
            hs.append(("retry-after", int(f["retry_after"])))
        override = {}
        if f.get("ratelimit_remaining") is not None:
            override["remaining"] = int(f["ratelimit_remaining"])
        if f.get("ratelimit_reset_in") is not None:
            override["reset"] = int(now() + f["ratelimit_reset_in"])
        primary = (not f.get("secondary") and status in (403, 429) and
                   (status == 429 or override.get("remaining") == 0))
        if primary and "remaining" not in override:
            override["remaining"] = 0
        self.rate_override = override or None
        self.auth(required=False)       # the rate headers name the user
        if f.get("secondary") or primary:
            # limited until Retry-After, else the reset (primary), else
            # the minute GitHub asks for after a secondary limit
            if f.get("retry_after") is not None:
                until = now() + int(f["retry_after"])
            elif primary:
                until = override.get("reset", self.gh.rate_reset)
            else:
                until = now() + 60
            self.st.limit_credential(self.cred_key(), until, f)
        if "body" in f:
            return ApiError(status, f["body"], hs)
        msg = f.get("message")
        if f.get("secondary"):
            return ApiError(status, gh_error(
                status, msg or GH_SECONDARY_MSG.format(rid=self.request_id),
                "https://docs.github.com/free-pro-team@latest/rest/overview/"
                "rate-limits-for-the-rest-api#about-secondary-rate-limits"
            ).body, hs)
        if primary:
            who = (f"installation ID {self.inst['installation']}"
                   if self.inst else f"user ID {self.user_obj()['id']}"
                   if self.login else "127.0.0.1")
            return ApiError(status, gh_error(
                status, msg or f"API rate limit exceeded for {who}.",
                "https://docs.github.com/rest/overview/rate-limits-for-the-"
                "rest-api#about-the-primary-rate-limit").body, hs)
        texts = {401: "Bad credentials", 403: "Resource not accessible by "
                 "integration", 404: "Not Found", 422: "Validation Failed",
                 500: "Server Error"}
        if status in (502, 503, 504) and not msg:
            return ApiError(status, html_error(status), hs,
                            "text/html; charset=utf-8")
        return ApiError(status, gh_error(status, msg or texts.get(
            status, "Error")).body, hs)

    # -- auth ---------------------------------------------------------------

    def cred_key(self):
        """GitHub counts per user (tokens), per installation, per App."""
        _, tok = self.credential()
        if tok is None:
            return None
        gh = self.gh
        with self.st.lock:
            if tok in gh.tokens:
                return ("github", "user", gh.tokens[tok])
            if tok in gh.inst_tokens:
                return ("github", "installation",
                        gh.inst_tokens[tok]["installation"])
        if tok.count(".") == 2 and gh.app is not None:
            return ("github", "app")
        return None

    def credential(self):
        auth = self.h.headers.get("Authorization") or ""
        scheme, _, tok = auth.partition(" ")
        tok = tok.strip()
        if scheme.lower() not in ("bearer", "token") or not tok:
            return None, None
        return scheme.lower(), tok

    def auth(self, required=True, jwt=False):
        """Sets self.login / self.inst; raises 401 unless anonymous is OK."""
        scheme, tok = self.credential()
        gh = self.gh
        rec = self.h.rec
        if tok is None:
            if required:
                raise gh_error(401, "Requires authentication")
            return
        if tok.count(".") == 2 and gh.app is not None:
            rec["credential"] = "jwt"
            if not jwt:
                if required:
                    raise gh_error(401, "Bad credentials")
                return
            if scheme != "bearer":
                raise gh_error(401, "Bad credentials")
            self.check_jwt(tok)
            self.is_jwt = True
            self.login = gh.app["slug"] + "[bot]"
            self.check_rate()
            return
        with self.st.lock:
            if tok in gh.tokens:
                rec["credential"] = "token"
                self.login = gh.tokens[tok]
                rec["user"] = self.login
            elif tok in gh.inst_tokens:
                it = gh.inst_tokens[tok]
                rec["credential"] = "installation-token"
                rec["installation"] = it["installation"]
                if it["expires"] <= now():
                    if required:
                        raise gh_error(401, "Bad credentials")
                    return
                self.inst = it
                self.login = gh.app["slug"] + "[bot]"
            else:
                rec["credential"] = "unknown"
        if self.login is not None:
            self.check_rate()
        if jwt and required:
            raise gh_error(
                401, "A JSON web token could not be decoded",
                "https://docs.github.com/rest/apps/apps")
        if self.login is None and required:
            raise gh_error(401, "Bad credentials")

    def check_rate(self):
        """The primary limit, when the requests have used it up (§5)."""
        gh = self.gh
        with self.st.lock:
            if now() >= gh.rate_reset:
                gh.rate_used = 0
                gh.rate_reset = int(now()) + 3600
            exhausted = gh.rate_used >= gh.rate_limit
        if exhausted:
            self.counted = True         # a refused request costs nothing
            who = (f"installation ID {self.inst['installation']}"
                   if self.inst else f"user ID {self.user_obj()['id']}")
            raise gh_error(
                403, f"API rate limit exceeded for {who}.",
                "https://docs.github.com/rest/overview/rate-limits-for-the-"
                "rest-api#about-the-primary-rate-limit")

    def check_jwt(self, tok):
        app = self.gh.app
        doc = "https://docs.github.com/rest"
        try:
            h64, p64, s64 = tok.split(".")
            hdr = b64url_json(h64)
            payload = b64url_json(p64)
            sig = base64.urlsafe_b64decode(s64 + "=" * (-len(s64) % 4))
        except (ValueError, TypeError):
            raise gh_error(401, "A JSON web token could not be decoded", doc)
        if app["key"] is not None and not rs256_verify(
                app["key"][0], app["key"][1], f"{h64}.{p64}".encode(), sig):
            raise gh_error(401, "A JSON web token could not be decoded", doc)
        if not isinstance(hdr, dict) or hdr.get("alg") != "RS256" or \
                not isinstance(payload, dict):
            raise gh_error(401, "A JSON web token could not be decoded", doc)
        t = now()
        iat, exp, iss = payload.get("iat"), payload.get("exp"), \
            payload.get("iss")
        if not isinstance(iat, int) or iat > t + 60:
            raise gh_error(401, "'Issued at' claim ('iat') must be an "
                           "Integer representing the time that the "
                           "assertion was issued.", doc)
        if not isinstance(exp, int) or exp <= t:
            raise gh_error(401, "'Expiration time' claim ('exp') must be a "
                           "numeric value representing the future time at "
                           "which the assertion expires.", doc)
        if exp - iat > 600 or exp > t + 660:
            raise gh_error(401, "'Expiration time' claim ('exp') is too far "
                           "in the future.", doc)
        if str(iss) not in (str(app["id"]), app["client_id"]):
            raise gh_error(401, "A JSON web token could not be decoded", doc)

    def need(self, perm, level="read"):
        """Installation-token permission check (pulls/issues/contents)."""
        if self.inst is None:
            return
        perms = self.inst["permissions"]
        names = perm if isinstance(perm, tuple) else (perm,)
        for n in names:
            v = perms.get(n)
            if v == "write" or (v == "read" and level == "read"):
                return
        raise gh_error(403, "Resource not accessible by integration")

    # -- objects ------------------------------------------------------------

    def user_obj(self, login=None):
        login = login or self.login
        u = self.gh.user(login)
        q = urllib.parse.quote(login)
        obj = replace_strings(self.t.gh_user, [
            ("users/octocat", "users/" + q), ("github.com/octocat",
                                              "github.com/" + q)])
        obj["login"] = login
        obj["id"] = u["id"]
        kind = "Bot" if u["type"] == "Bot" else "User"
        obj["node_id"] = node_id("03:Bot" if kind == "Bot" else "04:User",
                                 u["id"])
        obj["type"] = u["type"]
        obj["site_admin"] = bool(u.get("site_admin", False))
        return obj

    def repo_obj(self, full, tmpl=None):
        r = self.gh.repos[full]
        obj = replace_strings(tmpl or self.t.gh_repo, [
            ("octocat/Hello-World", full)])
        obj["id"] = r["id"]
        obj["node_id"] = node_id("010:Repository", r["id"])
        obj["name"] = r["name"]
        obj["full_name"] = full
        obj["owner"] = self.user_obj(r["owner"])
        obj["private"] = r["private"]
        obj["description"] = r["description"]
        obj["fork"] = r["fork"]
        obj["clone_url"] = r["clone_url"]
        obj["mirror_url"] = None
        obj["default_branch"] = r["default_branch"]
        if "visibility" in obj:
            obj["visibility"] = "private" if r["private"] else "public"
        return obj

    def find_repo(self, owner, name):
        full = f"{owner}/{name}"
        r = self.gh.repos.get(full)
        if r is None:
            # GitHub matches names case-insensitively
            for k, v in self.gh.repos.items():
                if k.lower() == full.lower():
                    r = v
        if r is None:
            raise gh_not_found()
        if self.inst is not None:
            sel = self.inst["repos"]
            if sel != "all" and r["full_name"] not in sel:
                raise gh_not_found()
        return r

    def find_issue(self, repo, n):
        try:
            p = repo["pulls"].get(int(n))
        except ValueError:
            p = None
        if p is None:
            raise gh_not_found(
                "https://docs.github.com/rest/issues/comments")
        return p

    def find_comment(self, repo, cid, review=False):
        """An issue comment, or a review comment (on a PR's diff): their
        ids are apart, the same number may name one of each."""
        try:
            cid = int(cid)
        except ValueError:
            raise gh_not_found()
        for p in repo["pulls"].values():
            for c in p["review_comments" if review else "comments"]:
                if c["id"] == cid:
                    return p, c
        raise gh_not_found(
            "https://docs.github.com/rest/pulls/comments"
            "#get-a-review-comment-for-a-pull-request" if review else
            "https://docs.github.com/rest/issues/comments#get-an-issue-comment")

    def association(self, repo, login):
        if login == repo["owner"]:
            return "OWNER"
        if login in repo["collaborators"]:
            return "COLLABORATOR"
        return "NONE"

    def comment_obj(self, repo, p, c, list_item=False):
        t = self.t.gh_comment_list_item if list_item else self.t.gh_comment
        full = repo["full_name"]
        kind = "pull" if p["is_pr"] else "issues"
        obj = copy.deepcopy(t)
        obj["id"] = c["id"]
        obj["node_id"] = node_id("012:IssueComment", c["id"])
        obj["url"] = f"{GH_PLACEHOLDER}/repos/{full}/issues/comments/{c['id']}"
        obj["html_url"] = (f"https://github.com/{full}/{kind}/{p['number']}"
                           f"#issuecomment-{c['id']}")
        obj["body"] = c["body"]
        obj["user"] = self.user_obj(c["user"])
        obj["created_at"] = iso(c["created"])
        obj["updated_at"] = iso(c["updated"])
        obj["issue_url"] = f"{GH_PLACEHOLDER}/repos/{full}/issues/{p['number']}"
        obj["author_association"] = c.get("author_association") or \
            self.association(repo, c["user"])
        return obj

    def pull_obj(self, repo, p):
        full = repo["full_name"]
        n = p["number"]
        t = self.t.gh_pull
        head_tmpl, base_tmpl = t["head"], t["base"]
        rest = {k: v for k, v in t.items() if k not in ("head", "base")}
        obj = replace_strings(rest, [
            ("octocat/Hello-World", full), ("/1347", f"/{n}"),
            ("6dcb09b5b57875f334f61aebed695e2e4193db5e", p["head_sha"])])
        obj["id"] = p["id"]
        obj["node_id"] = node_id("011:PullRequest", p["id"])
        obj["number"] = n
        merged = p["merged"]
        obj["state"] = "closed" if merged else p["state"]
        obj["locked"] = p["locked"]
        obj["title"] = p["title"]
        obj["user"] = self.user_obj(p["user"])
        obj["body"] = p["body"]
        obj["labels"] = []
        obj["milestone"] = None
        obj["active_lock_reason"] = None
        obj["created_at"] = obj["updated_at"] = iso(p["created"])
        closed = obj["state"] == "closed"
        obj["closed_at"] = iso(p["created"] + 3600) if closed else None
        obj["merged_at"] = iso(p["created"] + 3600) if merged else None
        obj["merge_commit_sha"] = fake_sha(f"merge:{full}:{n}")
        obj["assignee"] = None
        obj["assignees"] = []
        obj["requested_reviewers"] = []
        obj["requested_teams"] = []
        hr = self.gh.repos[p["head_repo"]]
        head = copy.deepcopy(head_tmpl)
        head.update({"label": f"{hr['owner']}:{p['head_ref']}",
                     "ref": p["head_ref"], "sha": p["head_sha"],
                     "user": self.user_obj(hr["owner"]),
                     "repo": self.repo_obj(p["head_repo"],
                                           head_tmpl["repo"])})
        base = copy.deepcopy(base_tmpl)
        base.update({"label": f"{repo['owner']}:{p['base_ref']}",
                     "ref": p["base_ref"], "sha": p["base_sha"],
                     "user": self.user_obj(repo["owner"]),
                     "repo": self.repo_obj(full)})
        # keep the template's key order: rebuild with head/base in place
        out = {}
        for k in t:
            out[k] = head if k == "head" else base if k == "base" else obj[k]
        out["author_association"] = self.association(repo, p["user"])
        out["draft"] = p["draft"]
        out["merged"] = merged
        out["mergeable"] = p["mergeable"]
        out["mergeable_state"] = "clean" if p["mergeable"] else (
            "unknown" if p["mergeable"] is None else "dirty")
        out["merged_by"] = self.user_obj(repo["owner"]) if merged else None
        out["comments"] = len(p["comments"])
        if "review_comments" in out:
            out["review_comments"] = len(p["review_comments"])
        return out

    # -- routing ------------------------------------------------------------

    def route(self):
        h = self.h.headers
        if not h.get("User-Agent"):
            raise ApiError(403, GH_NO_UA_TEXT, ctype="text/plain")
        ver = h.get("X-GitHub-Api-Version")
        if ver is not None and ver not in GH_VERSIONS:
            raise gh_error(400, f"API version {ver} is not supported.",
                           "https://docs.github.com/rest/about-the-rest-api/"
                           "api-versions")
        s, m = self.segs, self.method
        if s == ["app"] and m == "GET":
            return self.get_app()
        if len(s) == 4 and s[:2] == ["app", "installations"] and \
                s[3] == "access_tokens" and m == "POST":
            return self.create_token(s[2])
        if s == ["rate_limit"] and m == "GET":
            return self.rate_limit()
        if s == ["user"] and m == "GET":
            return self.get_user()
        if len(s) >= 3 and s[0] == "repos":
            return self.route_repo(s[1], s[2], s[3:], m)
        self.auth(required=False)
        raise gh_not_found()

    def route_repo(self, owner, name, s, m):
        if s == ["installation"] and m == "GET":
            return self.repo_installation(owner, name)
        self.auth()
        repo = self.find_repo(owner, name)
        if s == [] and m == "GET":
            return self.reply(200, self.repo_obj(repo["full_name"]))
        if len(s) == 3 and s[0] == "issues" and s[2] == "comments":
            if m == "GET":
                return self.list_comments(repo, s[1])
            if m == "POST":
                return self.create_comment(repo, s[1])
        if len(s) == 3 and s[:2] == ["issues", "comments"]:
            if m == "GET":
                return self.get_comment(repo, s[2])
            if m == "PATCH":
                return self.update_comment(repo, s[2])
            if m == "DELETE":
                return self.delete_comment(repo, s[2])
        if len(s) == 4 and s[:2] == ["issues", "comments"] and \
                s[3] == "reactions":
            if m == "POST":
                return self.create_reaction(repo, s[2])
            if m == "GET":
                return self.list_reactions(repo, s[2])
        if len(s) == 4 and s[:2] == ["pulls", "comments"] and \
                s[3] == "reactions":
            if m == "POST":
                return self.create_reaction(repo, s[2], review=True)
            if m == "GET":
                return self.list_reactions(repo, s[2], review=True)
        if len(s) == 2 and s[0] == "pulls" and m == "GET":
            return self.get_pull(repo, s[1])
        if len(s) == 3 and s[0] == "collaborators" and \
                s[2] == "permission" and m == "GET":
            return self.get_permission(repo, s[1])
        if len(s) >= 1 and s[0] == "contents" and m == "GET":
            # the path keeps its slashes: take it from the raw path
            prefix = f"/repos/{owner}/{name}/contents"
            rest = self.raw_path[len(prefix):].strip("/")
            return self.get_contents(repo, urllib.parse.unquote(rest))
        raise gh_not_found()

    # -- endpoints ----------------------------------------------------------

    def get_user(self):
        self.auth()
        if self.inst is not None:
            raise gh_error(403, "Resource not accessible by integration",
                           "https://docs.github.com/rest/users/users"
                           "#get-the-authenticated-user")
        u = self.gh.user(self.login)
        obj = self.user_obj()
        obj.update({"name": u.get("name"), "company": None, "blog": "",
                    "location": None, "email": u.get("email"),
                    "hireable": None, "bio": None,
                    "twitter_username": None, "public_repos": 0,
                    "public_gists": 0, "followers": 0, "following": 0,
                    "created_at": "2024-01-01T00:00:00Z",
                    "updated_at": "2024-01-01T00:00:00Z"})
        self.reply(200, obj)

    def rate_limit(self):
        self.auth(required=False)
        gh = self.gh
        limit = gh.rate_limit if self.login else 60
        used = min(gh.rate_used, limit) if self.login else 0
        core = {"limit": limit, "used": used,
                "remaining": max(0, limit - used), "reset": gh.rate_reset}
        self.counted = True         # free, like the real one
        self.reply(200, {"resources": {"core": core}, "rate": core})

    def app_obj(self):
        a = self.gh.app
        obj = copy.deepcopy(self.t.gh_app)
        obj["id"] = a["id"]
        obj["slug"] = a["slug"]
        obj["client_id"] = a["client_id"]
        obj["node_id"] = node_id("03:Integration", a["id"])
        obj["owner"] = self.user_obj(a["owner"])
        obj["name"] = a["name"]
        obj["html_url"] = f"https://github.com/apps/{a['slug']}"
        obj["permissions"] = dict(a["permissions"])
        obj["events"] = ["issue_comment", "pull_request"]
        return obj

    def get_app(self):
        if self.gh.app is None:
            self.auth(required=False)
            raise gh_not_found()
        self.auth(jwt=True)
        self.reply(200, self.app_obj())

    def inst_obj(self, inst):
        a = self.gh.app
        obj = copy.deepcopy(self.t.gh_installation)
        obj["id"] = inst["id"]
        acct = self.user_obj(inst["account"])
        if inst["account_type"] == "Organization":
            acct["type"] = "Organization"
        obj["account"] = acct
        obj["repository_selection"] = "all" if inst["repositories"] == \
            "all" else "selected"
        obj["access_tokens_url"] = (f"{GH_PLACEHOLDER}/app/installations/"
                                    f"{inst['id']}/access_tokens")
        obj["html_url"] = (f"https://github.com/settings/installations/"
                           f"{inst['id']}")
        obj["app_id"] = a["id"]
        obj["client_id"] = a["client_id"]
        obj["target_id"] = self.gh.user(inst["account"])["id"]
        obj["target_type"] = inst["account_type"]
        obj["permissions"] = dict(inst["permissions"])
        obj["events"] = ["issue_comment", "pull_request"]
        obj["single_file_name"] = None
        obj["has_multiple_single_files"] = False
        obj["single_file_paths"] = []
        obj["app_slug"] = a["slug"]
        return obj

    def repo_installation(self, owner, name):
        if self.gh.app is None:
            self.auth(required=False)
            raise gh_not_found()
        self.auth(jwt=True)
        full = f"{owner}/{name}"
        for inst in self.gh.app["installations"].values():
            sel = inst["repositories"]
            if full in self.gh.repos and (sel == "all" and self.gh.repos[
                    full]["owner"] == inst["account"] or
                    sel != "all" and full in sel):
                return self.reply(200, self.inst_obj(inst))
        raise gh_not_found("https://docs.github.com/rest/apps/apps"
                           "#get-a-repository-installation-for-the-"
                           "authenticated-app")

    def create_token(self, inst_id):
        if self.gh.app is None:
            self.auth(required=False)
            raise gh_not_found()
        self.auth(jwt=True)
        try:
            inst = self.gh.app["installations"].get(int(inst_id))
        except ValueError:
            inst = None
        if inst is None:
            raise gh_not_found("https://docs.github.com/rest/apps/apps"
                               "#create-an-installation-access-token-for-an-"
                               "app")
        try:
            req = json.loads(self.body) if self.body else {}
        except ValueError:
            raise gh_error(400, "Problems parsing JSON")
        if not isinstance(req, dict):
            raise gh_error(400, "Problems parsing JSON")
        if inst["repositories"] == "all":
            allowed = [f for f, r in self.gh.repos.items()
                       if r["owner"] == inst["account"]]
        else:
            allowed = list(inst["repositories"])
        repos = None
        bad = ApiError(422, gh_error(
            422, "There is at least one repository that does not exist or "
            "is not accessible to the parent installation.",
            "https://docs.github.com/rest/apps/apps#create-an-installation-"
            "access-token-for-an-app").body)
        if "repositories" in req:
            repos = []
            for nm in req["repositories"]:
                full = f"{inst['account']}/{nm}"
                if full not in allowed or full not in self.gh.repos:
                    raise bad
                repos.append(full)
        if "repository_ids" in req:
            repos = repos or []
            for rid in req["repository_ids"]:
                hit = [f for f in allowed if f in self.gh.repos and
                       self.gh.repos[f]["id"] == rid]
                if not hit:
                    raise bad
                repos.append(hit[0])
        perms = dict(inst["permissions"])
        if "permissions" in req:
            for k, v in req["permissions"].items():
                have = inst["permissions"].get(k)
                if have is None or (have == "read" and v == "write"):
                    raise ApiError(422, gh_error(
                        422, "The permissions requested are not granted to "
                        "this installation.",
                        "https://docs.github.com/rest/apps/apps"
                        "#create-an-installation-access-token-for-an-app"
                    ).body)
            perms = dict(req["permissions"])
        ttl = self.gh.app["token_ttl"]
        tok = rand_token("ghs_")
        exp = int(now()) + ttl
        with self.st.lock:
            self.gh.inst_tokens[tok] = {
                "installation": inst["id"], "expires": exp,
                "permissions": perms,
                "repos": repos if repos is not None else (
                    "all" if inst["repositories"] == "all" else allowed)}
        obj = copy.deepcopy(self.t.gh_token)
        obj["token"] = tok
        obj["expires_at"] = iso(exp)
        obj["permissions"] = perms
        if repos is not None:
            obj["repository_selection"] = "selected"
            tmpl_repo = self.t.gh_token["repositories"][0]
            out = []
            for full in repos:
                r = self.repo_obj(full)
                out.append({k: r.get(k, v) for k, v in tmpl_repo.items()})
            obj["repositories"] = out
        else:
            obj["repository_selection"] = "all" if inst["repositories"] == \
                "all" else "selected"
            del obj["repositories"]
        self.reply(201, obj)

    def paginate(self, items):
        page, per = self.page_args(30)
        total = len(items)
        last = max(1, (total + per - 1) // per)
        chunk = items[(page - 1) * per: page * per]
        links = []
        stale = self.stale_next(page, last)
        if total > per or stale:
            if page > 1:
                links.append((self.url_with(page=min(page - 1, last)),
                              "prev"))
            if stale:
                links.append((self.url_with(page=stale), "next"))
            elif page < last:
                links.append((self.url_with(page=page + 1), "next"))
            if page < last:
                links.append((self.url_with(page=last), "last"))
            if page > 1:
                links.append((self.url_with(page=1), "first"))
        hs = []
        if links:
            hs.append(("Link", ", ".join(f'<{u}>; rel="{r}"'
                                         for u, r in links)))
        return chunk, hs

    def list_comments(self, repo, n):
        self.need(("issues", "pull_requests"))
        p = self.find_issue(repo, n)
        items = sorted(p["comments"], key=lambda c: c["id"])
        if "since" in self.q:
            try:
                since = parse_time(self.q["since"])
            except ValueError:
                raise gh_error(422, "Invalid request.\n\nInvalid since.")
            items = [c for c in items if c["updated"] >= since]
        chunk, hs = self.paginate(items)
        self.reply(200, [self.comment_obj(repo, p, c, True) for c in chunk],
                   headers=hs)

    def json_body(self, field):
        try:
            req = json.loads(self.body) if self.body else None
        except ValueError:
            raise gh_error(400, "Problems parsing JSON")
        if not isinstance(req, dict) or not isinstance(req.get(field), str):
            raise gh_error(422, f"Invalid request.\n\n\"{field}\" wasn't "
                           "supplied.")
        return req

    def check_body(self, body, doc):
        if len(body) > GH_BODY_MAX:
            raise gh_error(422, "Validation Failed", doc, errors=[{
                "resource": "IssueComment", "code": "unprocessable",
                "field": "data",
                "message": "Body is too long (maximum is 65536 characters)"}])

    def create_comment(self, repo, n):
        doc = ("https://docs.github.com/rest/issues/comments"
               "#create-an-issue-comment")
        self.need(("issues", "pull_requests"), "write")
        p = self.find_issue(repo, n)
        req = self.json_body("body")
        self.check_body(req["body"], doc)
        with self.st.lock:
            t = now()
            c = {"id": self.gh.new_id(), "user": self.login,
                 "body": req["body"], "created": t, "updated": t,
                 "author_association": None, "reactions": []}
            p["comments"].append(c)
        obj = self.comment_obj(repo, p, c)
        self.reply(201, obj, headers=[("Location", obj["url"].replace(
            GH_PLACEHOLDER, self.h.gh_base))])

    def get_comment(self, repo, cid):
        self.need(("issues", "pull_requests"))
        p, c = self.find_comment(repo, cid)
        self.reply(200, self.comment_obj(repo, p, c))

    def role(self, repo, login):
        """A user's role on repo, as the permission endpoint reports it."""
        role = repo["collaborators"].get(login)
        if role is None:
            role = "admin" if login == repo["owner"] else (
                "none" if repo["private"] else "read")
        return role

    def may_moderate(self, repo, c, doc):
        """Editing or deleting someone else's comment takes write access
        (GitHub's role table: "Edit and delete anyone's comments" is
        Write, Maintain and Admin). A user token with less gets the 403
        GitHub gives for a repository change it lacks the rights to (seen
        in graalvm/mandrel#945 and rmetzger/flink-community-tools#12); an
        installation token's issues or pull_requests write is enough, as
        need() checked."""
        if self.inst is not None or c["user"] == self.login:
            return
        if GH_ROLE_PERMISSION.get(self.role(repo, self.login),
                                  "read") in ("write", "admin"):
            return
        raise gh_error(403, "Must have admin rights to Repository.", doc)

    def update_comment(self, repo, cid):
        doc = ("https://docs.github.com/rest/issues/comments"
               "#update-an-issue-comment")
        self.need(("issues", "pull_requests"), "write")
        p, c = self.find_comment(repo, cid)
        self.may_moderate(repo, c, doc)
        req = self.json_body("body")
        self.check_body(req["body"], doc)
        with self.st.lock:
            c["body"] = req["body"]
            c["updated"] = now()
        self.reply(200, self.comment_obj(repo, p, c))

    def delete_comment(self, repo, cid):
        self.need(("issues", "pull_requests"), "write")
        p, c = self.find_comment(repo, cid)
        self.may_moderate(repo, c, "https://docs.github.com/rest/issues/"
                          "comments#delete-an-issue-comment")
        with self.st.lock:
            p["comments"] = [x for x in p["comments"] if x is not c]
        self.reply(204, None)

    def reaction_obj(self, x):
        obj = copy.deepcopy(self.t.gh_reaction)
        obj["id"] = x["id"]
        obj["node_id"] = node_id("08:Reaction", x["id"])
        obj["user"] = self.user_obj(x["user"])
        obj["content"] = x["content"]
        obj["created_at"] = iso(x["created"])
        return obj

    def create_reaction(self, repo, cid, review=False):
        self.need(("issues", "pull_requests"), "write")
        p, c = self.find_comment(repo, cid, review)
        req = self.json_body("content")
        if req["content"] not in GH_REACTIONS:
            raise gh_error(
                422, "Validation Failed",
                "https://docs.github.com/rest/reactions/reactions"
                "#create-reaction-for-a-pull-request-review-comment" if
                review else "https://docs.github.com/rest/reactions/"
                "reactions#create-reaction-for-an-issue-comment",
                errors=[{"resource": "Reaction", "code": "invalid",
                         "field": "content"}])
        with self.st.lock:
            for x in c["reactions"]:
                if x["user"] == self.login and x["content"] == req["content"]:
                    return self.reply(200, self.reaction_obj(x))
            x = {"id": self.gh.new_id(), "content": req["content"],
                 "user": self.login, "created": now()}
            c["reactions"].append(x)
        self.reply(201, self.reaction_obj(x))

    def list_reactions(self, repo, cid, review=False):
        self.need(("issues", "pull_requests"))
        p, c = self.find_comment(repo, cid, review)
        items = c["reactions"]
        if "content" in self.q:
            items = [x for x in items if x["content"] == self.q["content"]]
        chunk, hs = self.paginate(items)
        self.reply(200, [self.reaction_obj(x) for x in chunk], headers=hs)

    def get_pull(self, repo, n):
        self.need("pull_requests")
        try:
            p = repo["pulls"].get(int(n))
        except ValueError:
            p = None
        if p is None or not p["is_pr"]:
            raise gh_not_found("https://docs.github.com/rest/pulls/pulls"
                               "#get-a-pull-request")
        self.reply(200, self.pull_obj(repo, p))

    def get_permission(self, repo, login):
        u = self.gh.users.get(login)
        if u is None:
            raise gh_error(404, f"{login} is not a user",
                           "https://docs.github.com/rest/collaborators/"
                           "collaborators#get-repository-permissions-for-a-"
                           "user")
        role = self.role(repo, login)
        perm = GH_ROLE_PERMISSION.get(role, "read")
        obj = copy.deepcopy(self.t.gh_permission)
        obj["permission"] = perm
        obj["role_name"] = role
        obj["user"] = self.user_obj(login)
        self.reply(200, obj)

    def get_contents(self, repo, path):
        self.need("contents")
        ref = self.q.get("ref") or repo["default_branch"]
        files = repo["files"].get(ref)
        if files is None:
            # a commit SHA of a PR head/base names that ref's files
            for p in self.gh.repos.values():
                for pr in p["pulls"].values():
                    if pr["head_sha"] == ref and pr["head_repo"] == \
                            repo["full_name"]:
                        files = repo["files"].get(pr["head_ref"])
                    if pr["base_sha"] == ref and p is repo:
                        files = repo["files"].get(pr["base_ref"])
        if files is None:
            if ref in repo["branches"] or ref == repo["default_branch"]:
                files = {}
            else:
                raise gh_error(404, f"No commit found for the ref {ref}",
                               "https://docs.github.com/rest/repos/contents"
                               "#get-repository-content")
        full = repo["full_name"]
        qref = urllib.parse.quote(ref, safe="")
        doc = "https://docs.github.com/rest/repos/contents#get-repository-content"
        accept = self.h.headers.get("Accept") or ""
        if path in files:
            data = files[path]
            if "application/vnd.github.raw" in accept or \
                    "application/vnd.github.v3.raw" in accept:
                return self.reply(200, data,
                                  "application/vnd.github.raw; "
                                  "charset=utf-8")
            sha = git_sha(data)
            obj = copy.deepcopy(self.t.gh_content_file)
            obj["size"] = len(data)
            obj["name"] = path.rsplit("/", 1)[-1]
            obj["path"] = path
            obj["content"] = b64_60(data)
            obj["sha"] = sha
            self_url = f"{GH_PLACEHOLDER}/repos/{full}/contents/{path}?ref={qref}"
            obj["url"] = self_url
            obj["git_url"] = f"{GH_PLACEHOLDER}/repos/{full}/git/blobs/{sha}"
            obj["html_url"] = f"https://github.com/{full}/blob/{ref}/{path}"
            obj["download_url"] = (f"https://raw.githubusercontent.com/"
                                   f"{full}/{ref}/{path}")
            obj["_links"] = {"self": self_url, "git": obj["git_url"],
                             "html": obj["html_url"]}
            return self.reply(200, obj)
        prefix = path + "/" if path else ""
        entries = {}
        for fp, data in files.items():
            if fp.startswith(prefix):
                rest = fp[len(prefix):]
                name, sep, _ = rest.partition("/")
                entries.setdefault(name, ("dir" if sep else "file",
                                          data if not sep else None))
        if not entries:
            raise gh_not_found(doc)
        out = []
        for name in sorted(entries):
            typ, data = entries[name]
            ep = prefix + name
            obj = copy.deepcopy(self.t.gh_content_dir)
            sha = git_sha(data) if data is not None else fake_sha("tree:" + ep)
            obj.update({"type": typ, "size": len(data) if data else 0,
                        "name": name, "path": ep, "sha": sha})
            u = f"{GH_PLACEHOLDER}/repos/{full}/contents/{ep}?ref={qref}"
            kind = "blobs" if typ == "file" else "trees"
            obj["url"] = u
            obj["git_url"] = f"{GH_PLACEHOLDER}/repos/{full}/git/{kind}/{sha}"
            obj["html_url"] = (f"https://github.com/{full}/"
                               f"{'blob' if typ == 'file' else 'tree'}/"
                               f"{ref}/{ep}")
            obj["download_url"] = (f"https://raw.githubusercontent.com/{full}/"
                                   f"{ref}/{ep}" if typ == "file" else None)
            obj["_links"] = {"self": u, "git": obj["git_url"],
                             "html": obj["html_url"]}
            out.append(obj)
        self.reply(200, out)


def html_error(status):
    texts = {502: "Bad Gateway", 503: "Service Unavailable",
             504: "Gateway Timeout"}
    t = texts.get(status, "Error")
    return (f"<html><head><title>{status} {t}</title></head><body>"
            f"<h1>{status} {t}</h1></body></html>\n")


# ---------------------------------------------------------------------------
# GitLab


class GitLabApi(Api):
    provider = "gitlab"

    def __init__(self, *a):
        super().__init__(*a)
        self.gl = self.st.gl
        self.user = None
        self.rate_override = None
        self.counted = False

    def rate_headers(self, code):
        gl = self.gl
        with self.st.lock:
            if not self.counted:
                if now() >= gl.rate_reset:
                    gl.rate_used = 0
                    gl.rate_reset = int(now()) + 60
                gl.rate_used += 1
                self.counted = True
            used = min(gl.rate_used, gl.rate_limit)
            remaining = max(0, gl.rate_limit - used)
            reset = gl.rate_reset
        if self.rate_override:
            o = self.rate_override
            remaining = o.get("remaining", remaining)
            reset = o.get("reset", reset)
        return [("RateLimit-Name", "throttle_authenticated_api"),
                ("RateLimit-Limit", gl.rate_limit),
                ("RateLimit-Observed", gl.rate_limit - remaining),
                ("RateLimit-Remaining", remaining),
                ("RateLimit-Reset", reset),
                ("RateLimit-ResetTime",
                 time.strftime("%a, %d %b %Y %H:%M:%S GMT",
                               time.gmtime(reset))),
                ("X-Request-Id", "%026x" % random.getrandbits(104))]

    def fault_error(self, f):
        status = int(f["status"])
        hs = []
        override = {}
        if f.get("ratelimit_remaining") is not None:
            override["remaining"] = int(f["ratelimit_remaining"])
        if f.get("ratelimit_reset_in") is not None:
            override["reset"] = int(now() + f["ratelimit_reset_in"])
        msg = f.get("message")
        # the application limiter (notes_create_limit, ...): one
        # endpoint's count, answered by render_api_error! without
        # Retry-After; the user's RateLimit-* budget is not what ran out
        app = status == 429 and (f.get("app_limiter") or
                                 GL_APP_LIMIT_MSG in (msg or ""))
        if status == 429 and not app:
            override.setdefault("remaining", 0)
            ra = f.get("retry_after", 60)
            override.setdefault("reset", int(now() + ra))
            hs.append(("Retry-After", int(ra)))
            self.st.limit_credential(self.cred_key(), now() + int(ra), f)
        elif f.get("retry_after") is not None:
            hs.append(("Retry-After", int(f["retry_after"])))
        self.rate_override = override or None
        if "body" in f:
            return ApiError(status, f["body"], hs)
        if app:
            return ApiError(status, {"message": {"error": msg or
                                                 GL_APP_LIMIT_MSG}}, hs)
        if status == 429:
            if msg:
                return ApiError(status, {"message": {"error": msg}}, hs)
            return ApiError(status, "Retry later\n", hs, "text/plain")
        if status in (502, 503, 504) and not msg:
            return ApiError(status, html_error(status), hs,
                            "text/html; charset=utf-8")
        texts = {400: "400 Bad request", 401: "401 Unauthorized",
                 403: "403 Forbidden", 404: "404 Not found",
                 409: "409 Conflict", 500: "500 Internal Server Error"}
        return ApiError(status, {"message": msg or texts.get(
            status, f"{status} Error")}, hs)

    def token(self):
        h = self.h.headers
        tok = h.get("PRIVATE-TOKEN")
        if tok is None:
            auth = h.get("Authorization") or ""
            scheme, _, t = auth.partition(" ")
            if scheme.lower() == "bearer":
                tok = t.strip()
        return tok

    def cred_key(self):
        """GitLab counts per user."""
        tok = self.token()
        with self.st.lock:
            name = self.gl.tokens.get(tok) if tok else None
        return ("gitlab", "user", name) if name else None

    def auth(self):
        tok = self.token()
        rec = self.h.rec
        with self.st.lock:
            name = self.gl.tokens.get(tok) if tok else None
        rec["credential"] = None if tok is None else (
            "token" if name else "unknown")
        rec["user"] = name
        if name is None:
            raise gl_error(401, "401 Unauthorized")
        self.user = self.gl.user(name)
        gl = self.gl
        with self.st.lock:
            if now() >= gl.rate_reset:
                gl.rate_used = 0
                gl.rate_reset = int(now()) + 60
            exhausted = gl.rate_used >= gl.rate_limit
        if exhausted:
            self.counted = True
            ra = max(1, int(gl.rate_reset - now()))
            raise ApiError(429, "Retry later\n", [("Retry-After", ra)],
                           "text/plain")

    def params(self):
        """Query parameters merged with a JSON or form body."""
        p = dict(self.q)
        if self.body:
            ct = (self.h.headers.get("Content-Type") or "").lower()
            if "json" in ct:
                try:
                    j = json.loads(self.body)
                except ValueError:
                    raise ApiError(400, {"error": "The provided content-type "
                                         "'application/json' is not "
                                         "supported."})
                if isinstance(j, dict):
                    p.update(j)
            else:
                for k, v in urllib.parse.parse_qs(
                        self.body.decode("utf-8", "replace"),
                        keep_blank_values=True).items():
                    p[k] = v[-1]
        return p

    def paginate(self, items):
        page, per = self.page_args(20)
        total = len(items)
        pages = max(1, (total + per - 1) // per)
        chunk = items[(page - 1) * per: page * per]
        nxt = self.stale_next(page, pages) or (page + 1 if page < pages
                                                 else "")
        prv = page - 1 if page > 1 else ""
        links = []
        if prv:
            links.append((self.url_with(page=prv, per_page=per), "prev"))
        if nxt:
            links.append((self.url_with(page=nxt, per_page=per), "next"))
        links.append((self.url_with(page=1, per_page=per), "first"))
        links.append((self.url_with(page=pages, per_page=per), "last"))
        hs = [("Link", ", ".join(f'<{u}>; rel="{r}"' for u, r in links)),
              ("X-Next-Page", nxt), ("X-Page", page), ("X-Per-Page", per),
              ("X-Prev-Page", prv), ("X-Total", total),
              ("X-Total-Pages", pages)]
        return chunk, hs

    # -- objects ------------------------------------------------------------

    def author_obj(self, username):
        u = self.gl.user(username)
        a = copy.deepcopy(self.t.gl_note["author"])
        a.update({"id": u["id"], "username": u["username"],
                  "email": u["email"], "name": u["name"]})
        return a

    def note_obj(self, proj, mr, n):
        obj = copy.deepcopy(self.t.gl_note)
        obj["id"] = n["id"]
        obj["body"] = n["body"]
        obj["author"] = self.author_obj(n["author"])
        obj["created_at"] = iso_ms(n["created"])
        obj["updated_at"] = iso_ms(n["updated"])
        obj["system"] = n["system"]
        obj["noteable_id"] = mr["id"]
        obj["noteable_type"] = "MergeRequest"
        obj["project_id"] = proj["id"]
        obj["noteable_iid"] = mr["iid"]
        obj["confidential"] = n["internal"]
        obj["internal"] = n["internal"]
        return obj

    def award_obj(self, n, a):
        u = self.gl.user(a["user"])
        obj = copy.deepcopy(self.t.gl_award)
        obj["id"] = a["id"]
        obj["name"] = a["name"]
        obj["user"] = dict(obj["user"], name=u["name"],
                           username=u["username"], id=u["id"],
                           web_url=f"http://gitlab.example.com/"
                                   f"{u['username']}")
        obj["created_at"] = obj["updated_at"] = iso_ms(a["created"])
        obj["awardable_id"] = n["id"]
        obj["awardable_type"] = "Note"
        return obj

    # -- routing ------------------------------------------------------------

    def route(self):
        self.auth()
        s, m = self.segs, self.method
        if s == ["user"] and m == "GET":
            return self.get_user()
        if s == ["users"] and m == "GET":
            return self.list_users()
        if len(s) == 2 and s[0] == "users" and m == "GET":
            return self.get_user_by_id(s[1])
        if len(s) >= 2 and s[0] == "projects":
            proj = self.gl.project(s[1])
            if proj is None:
                raise gl_error(404, "404 Project Not Found")
            return self.route_project(proj, s[2:], m)
        raise ApiError(404, {"error": "404 Not Found"})

    def route_project(self, proj, s, m):
        if s == [] and m == "GET":
            return self.reply(200, self.project_obj(proj))
        if len(s) == 3 and s[:2] == ["members", "all"] and m == "GET":
            return self.get_member(proj, s[2])
        if s == ["members", "all"] and m == "GET":
            return self.list_members(proj)
        if len(s) >= 3 and s[:2] == ["repository", "files"] and m == "GET":
            if len(s) == 4 and s[3] == "raw":
                return self.get_file(proj, s[2], raw=True)
            if len(s) == 3:
                return self.get_file(proj, s[2], raw=False)
        if len(s) >= 2 and s[0] == "merge_requests":
            mr = proj["mrs"].get(int(s[1])) if s[1].isdigit() else None
            if mr is None:
                raise gl_error(404, "404 Merge Request Not Found")
            s = s[2:]
            if s == [] and m == "GET":
                return self.reply(200, self.mr_obj(proj, mr))
            if s == ["notes"]:
                if m == "GET":
                    return self.list_notes(proj, mr)
                if m == "POST":
                    return self.create_note(proj, mr)
            if len(s) >= 2 and s[0] == "notes":
                n = self.find_note(mr, s[1])
                if len(s) == 2:
                    if m == "GET":
                        return self.reply(200, self.note_obj(proj, mr, n))
                    if m == "PUT":
                        return self.update_note(proj, mr, n)
                    if m == "DELETE":
                        return self.delete_note(proj, mr, n)
                if s[2:] == ["award_emoji"]:
                    if m == "GET":
                        return self.list_awards(n)
                    if m == "POST":
                        return self.create_award(n)
        raise ApiError(404, {"error": "404 Not Found"})

    # -- endpoints ----------------------------------------------------------

    def get_user(self):
        u = self.user
        obj = copy.deepcopy(self.t.gl_current_user)
        obj.update({"id": u["id"], "username": u["username"],
                    "email": u["email"], "name": u["name"],
                    "web_url": f"http://gitlab.example.com/{u['username']}",
                    "public_email": u["email"]})
        self.reply(200, obj)

    def get_user_by_id(self, uid):
        """GET /users/:id: the docs' single-user example (get-user.json)
        with the user's fields and "bot", which GitLab's API::Entities::User
        exposes after job_title (true for access token bots and service
        accounts). The route takes digits only, as GitLab's (requirements
        id: /[0-9]*/); an unknown id is 404 User Not Found."""
        if not uid.isdigit():
            raise ApiError(404, {"error": "404 Not Found"})
        with self.st.lock:
            u = self.gl.user_by_id(int(uid))
            u = dict(u) if u is not None else None
        if u is None:
            raise gl_error(404, "404 User Not Found")
        obj = copy.deepcopy(self.t.gl_user)
        obj.update({"id": u["id"], "username": u["username"],
                    "name": u["name"],
                    "web_url": f"http://gitlab.example.com/{u['username']}",
                    "public_email": u["email"]})
        obj["bot"] = u["bot"]
        self.reply(200, obj)

    def list_users(self):
        items = list(self.gl.users.values())
        if "username" in self.q:
            items = [u for u in items
                     if u["username"].lower() == self.q["username"].lower()]
        chunk, hs = self.paginate(items)
        self.reply(200, [{"id": u["id"], "username": u["username"],
                          "name": u["name"], "state": "active",
                          "locked": False,
                          "avatar_url": None,
                          "web_url": f"http://gitlab.example.com/"
                                     f"{u['username']}"} for u in chunk],
                   headers=hs)

    def project_obj(self, p):
        pwn = p["path_with_namespace"]
        ns, _, path = pwn.rpartition("/")
        return {"id": p["id"], "description": None, "name": path,
                "name_with_namespace": pwn.replace("/", " / "),
                "path": path, "path_with_namespace": pwn,
                "default_branch": p["default_branch"],
                "visibility": p["visibility"],
                "web_url": f"http://gitlab.example.com/{pwn}",
                "http_url_to_repo": f"http://gitlab.example.com/{pwn}.git",
                "ssh_url_to_repo": f"git@gitlab.example.com:{pwn}.git",
                "namespace": {"id": p["id"], "name": ns, "path": ns,
                              "kind": "group", "full_path": ns}}

    def mr_obj(self, proj, mr):
        return {"id": mr["id"], "iid": mr["iid"], "project_id": proj["id"],
                "title": mr["title"], "description": mr["description"],
                "state": mr["state"],
                "created_at": iso_ms(mr["created"]),
                "updated_at": iso_ms(mr["created"]),
                "target_branch": mr["target_branch"],
                "source_branch": mr["source_branch"],
                "author": self.author_obj(mr["author"]),
                "source_project_id": mr["source_project_id"],
                "target_project_id": proj["id"], "draft": mr["draft"],
                "work_in_progress": mr["draft"],
                "merge_status": "can_be_merged",
                "detailed_merge_status": "mergeable",
                "sha": mr["sha"],
                "user_notes_count": sum(1 for n in mr["notes"]
                                        if not n["system"]),
                "web_url": f"http://gitlab.example.com/"
                           f"{proj['path_with_namespace']}/-/merge_requests/"
                           f"{mr['iid']}"}

    def member_obj(self, uid, m):
        """A membership as members/all shows it: "state" is the user's
        (active, blocked, ...), and an expired membership is still listed
        with its old access_level until GitLab's daily worker removes it,
        so expires_at is the reader's to check."""
        u = self.gl.user_by_id(uid)
        obj = copy.deepcopy(self.t.gl_member)
        obj.update({"id": u["id"], "username": u["username"],
                    "name": u["name"],
                    "web_url": f"http://gitlab.example.com/{u['username']}",
                    "access_level": m["access_level"], "email": u["email"],
                    "state": m["state"], "expires_at": m["expires_at"]})
        return obj

    def get_member(self, proj, uid):
        if not uid.isdigit() or int(uid) not in proj["members"]:
            raise gl_error(404, "404 Not found")
        self.reply(200, self.member_obj(int(uid), proj["members"][int(uid)]))

    def list_members(self, proj):
        items = sorted(proj["members"].items())
        chunk, hs = self.paginate(items)
        self.reply(200, [self.member_obj(uid, m) for uid, m in chunk],
                   headers=hs)

    def get_file(self, proj, path, raw):
        ref = self.q.get("ref")
        if not ref:
            if not raw:
                raise ApiError(400, {"error": "ref is missing"})
            ref = proj["default_branch"]
        files = proj["files"].get(ref)
        if files is None:
            for mr in proj["mrs"].values():
                if mr["sha"] == ref:
                    files = proj["files"].get(mr["source_branch"])
        data = (files or {}).get(path.strip("/"))
        if data is None:
            raise gl_error(404, "404 File Not Found")
        if raw:
            return self.reply(200, data, "text/plain; charset=utf-8")
        sha = git_sha(data)
        self.reply(200, {
            "file_name": path.rsplit("/", 1)[-1], "file_path": path,
            "size": len(data), "encoding": "base64",
            "content_sha256": hashlib.sha256(data).hexdigest(), "ref": ref,
            "blob_id": sha, "commit_id": fake_sha(f"commit:{ref}"),
            "last_commit_id": fake_sha(f"commit:{ref}"),
            "execute_filemode": False,
            "content": base64.b64encode(data).decode()})

    def find_note(self, mr, nid):
        if nid.isdigit():
            for n in mr["notes"]:
                if n["id"] == int(nid):
                    return n
        raise gl_error(404, "404 Note Not Found")

    def list_notes(self, proj, mr):
        sort = self.q.get("sort", "desc")
        order = self.q.get("order_by", "created_at")
        if sort not in ("asc", "desc"):
            raise ApiError(400, {"error": "sort does not have a valid value"})
        if order not in ("created_at", "updated_at"):
            raise ApiError(400, {"error": "order_by does not have a valid "
                                 "value"})
        key = "created" if order == "created_at" else "updated"
        items = sorted(mr["notes"], key=lambda n: (n[key], n["id"]),
                       reverse=(sort == "desc"))
        chunk, hs = self.paginate(items)
        self.reply(200, [self.note_obj(proj, mr, n) for n in chunk],
                   headers=hs)

    def note_body(self, p):
        body = p.get("body")
        if body is None:
            raise ApiError(400, {"error": "body is missing"})
        if not isinstance(body, str):
            body = str(body)
        if body == "":
            raise ApiError(400, {"error": "body is empty"})
        if len(body) > GL_BODY_MAX:
            raise gl_error(400, "400 Bad request - Note {:note=>[\"is too "
                           "long (maximum is 1000000 characters)\"]}")
        return body

    def create_note(self, proj, mr):
        p = self.params()
        body = self.note_body(p)
        # internal (since 15.0) overrides its older name, confidential
        flag = p.get("internal", p.get("confidential", False))
        internal = str(flag).lower() in ("true", "1")
        with self.st.lock:
            t = now()
            n = {"id": self.gl.new_id(), "author": self.user["username"],
                 "body": body, "system": False, "internal": internal,
                 "created": t, "updated": t, "awards": []}
            mr["notes"].append(n)
        self.reply(201, self.note_obj(proj, mr, n))

    def may_admin_note(self, proj, n):
        """GitLab's admin_note ability (NotePolicy, ProjectPolicy): the
        note's author, a member of the project with the Maintainer role
        (40) or more, or an administrator may edit or delete a note."""
        u = self.user
        if n["author"] == u["username"] or u.get("is_admin"):
            return True
        m = proj["members"].get(u["id"])
        return (m is not None and m["state"] == "active" and
                m["access_level"] >= 40 and not member_expired(m))

    def update_note(self, proj, mr, n):
        if not self.may_admin_note(proj, n):
            raise gl_error(403, "403 Forbidden")
        body = self.note_body(self.params())
        with self.st.lock:
            n["body"] = body
            n["updated"] = now()
        self.reply(200, self.note_obj(proj, mr, n))

    def delete_note(self, proj, mr, n):
        if not self.may_admin_note(proj, n):
            raise gl_error(403, "403 Forbidden")
        with self.st.lock:
            mr["notes"] = [x for x in mr["notes"] if x is not n]
        self.reply(204, None)

    def list_awards(self, n):
        chunk, hs = self.paginate(n["awards"])
        self.reply(200, [self.award_obj(n, a) for a in chunk], headers=hs)

    def create_award(self, n):
        p = self.params()
        name = p.get("name")
        if not name:
            raise ApiError(400, {"error": "name is missing"})
        name = str(name)
        with self.st.lock:
            for a in n["awards"]:
                if a["user"] == self.user["username"] and a["name"] == name:
                    raise gl_error(404, "404 Award Emoji {:name=>[\"has "
                                   "already been taken\"]} Not Found")
            a = {"id": self.gl.new_id(), "name": name,
                 "user": self.user["username"], "created": now()}
            n["awards"].append(a)
        self.reply(201, self.award_obj(n, a))


# ---------------------------------------------------------------------------
# main


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        e = sys.exc_info()[1]
        if isinstance(e, (ConnectionError, socket.timeout, TimeoutError)):
            sys.stderr.write(f"connection error: {e.__class__.__name__}: "
                             f"{e}\n")
        else:
            traceback.print_exc()
        sys.stderr.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description="fake GitHub and GitLab APIs")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--provider", choices=("github", "gitlab", "both"),
                    default="both")
    ap.add_argument("--seed", action="append", default=[],
                    help="JSON seed file(s) loaded at start")
    ap.add_argument("--fixtures", default=DEFAULT_FIXTURES,
                    help="directory with github/ and gitlab/ example "
                    "responses (default tests/data/api)")
    ap.add_argument("--ignore-stdin", action="store_true",
                    help="do not exit when stdin reaches end of file")
    args = ap.parse_args(argv)

    def bye(*_):
        try:
            sys.stderr.flush()
        finally:
            os._exit(0)

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGINT, bye)
    try:
        state = State(Templates(args.fixtures))
        for path in args.seed:
            with open(path, encoding="utf-8") as f:
                state.seed(json.load(f))
        srv = Server(("127.0.0.1", args.port), Handler)
    except Exception as e:
        sys.stderr.write(f"fake-scm: {e}\n")
        return 1
    srv.port = srv.server_address[1]
    srv.state = state
    srv.providers = ("github", "gitlab") if args.provider == "both" else (
        args.provider,)

    st = os.fstat(0) if not args.ignore_stdin else None
    if st is not None and (stat.S_ISFIFO(st.st_mode) or
                           stat.S_ISSOCK(st.st_mode)):
        def stdin_reader():
            while True:
                try:
                    if not os.read(0, 65536):
                        break
                except InterruptedError:
                    continue
                except OSError:
                    break
            bye()
        threading.Thread(target=stdin_reader, daemon=True).start()
    parent = os.getppid()

    def parent_watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        bye()
    threading.Thread(target=parent_watch, daemon=True).start()

    base = f"http://127.0.0.1:{srv.port}"
    sys.stdout.write(json.dumps({
        "port": srv.port, "server": base,
        "github": base + GH_PREFIX if "github" in srv.providers else None,
        "gitlab": base + GL_PREFIX if "gitlab" in srv.providers else None,
        "control": base + "/_fake"}) + "\n")
    sys.stdout.flush()
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        bye()


if __name__ == "__main__":
    sys.exit(main())
