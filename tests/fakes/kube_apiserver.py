#!/usr/bin/env python3
"""A fake kube-apiserver for tests: TLS with a throw-away CA, bearer tokens,
optimistic concurrency (409), expired watches (410) and watch streams.

Python 3.11 standard library, the `openssl` command-line tool to mint the
certificates, and PyYAML to read the CRD schemas of deploy/crds (without it,
AgentTask and Environment are not validated).  See tests/fakes/README.md for
the command line, the /_fake control endpoints and the list of deviations
from kube-apiserver.
The behaviour follows doc/reference k8s-api-subset.md (§ numbers below).
"""

import argparse
import base64
import collections
import copy
import hmac
import http.server
import json
import os
import queue
import random
import re
import select
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import uuid

# ---------------------------------------------------------------------------
# Kinds


class Kind:
    """One served resource (all of them are namespaced)."""

    def __init__(self, group, version, plural, singular, kind, status,
                 short=(), generation=True, builtin=False):
        self.group = group
        self.version = version
        self.plural = plural
        self.singular = singular
        self.kind = kind
        self.status = status            # has a /status subresource
        self.short = list(short)
        self.generation = generation    # tracks metadata.generation
        self.builtin = builtin          # compiled-in type, not a CRD
        self.schema = None              # openAPIV3Schema (load_schemas)
        self.api_version = f"{group}/{version}" if group else version
        # "agenttasks.divergedev.com", core: "secrets"
        self.qualified = f"{plural}.{group}" if group else plural
        # "AgentTask.divergedev.com", core: "Secret"
        self.qualified_kind = f"{kind}.{group}" if group else kind
        self.prefix = f"/apis/{group}/{version}" if group else "/api/v1"


KINDS = [
    Kind("divergedev.com", "v1alpha1", "agenttasks", "agenttask",
         "AgentTask", True, ["at"]),
    Kind("divergedev.com", "v1alpha1", "environments", "environment",
         "Environment", True, ["env"]),
    Kind("", "v1", "secrets", "secret", "Secret", False,
         generation=False, builtin=True),
    Kind("agents.x-k8s.io", "v1beta1", "sandboxes", "sandbox", "Sandbox",
         True, ["sandbox"]),
    Kind("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims",
         "sandboxclaim", "SandboxClaim", True, ["sandboxclaim"]),
    Kind("networking.k8s.io", "v1", "networkpolicies", "networkpolicy",
         "NetworkPolicy", False, ["netpol"], builtin=True),
    # leader election (coordination.k8s.io): no status, no generation
    Kind("coordination.k8s.io", "v1", "leases", "lease", "Lease", False,
         generation=False, builtin=True),
]
KIND_LEASE = KINDS[-1]
# (group, version) -> {plural: Kind}
GV = collections.OrderedDict()
for _k in KINDS:
    GV.setdefault((_k.group, _k.version), collections.OrderedDict())[
        _k.plural] = _k

VERSION_INFO = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.0", "gitCommit": "",
    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23", "compiler": "gc", "platform": "linux/amd64",
}

OPTIMISTIC_LOCK_MSG = ("the object has been modified; please apply your "
                       "changes to the latest version and try again")
MT_JSON_PATCH = "application/json-patch+json"
MT_MERGE_PATCH = "application/merge-patch+json"
MT_SMP = "application/strategic-merge-patch+json"
MT_APPLY = "application/apply-patch+yaml"

# ---------------------------------------------------------------------------
# Status errors (§2.3)


class ApiError(Exception):
    def __init__(self, code, body, headers=None):
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body
        self.headers = headers or {}


def status_body(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {},
         "status": "Failure", "message": message, "reason": reason}
    if details is not None:
        s["details"] = details
    s["code"] = code
    return s


def _details(kind, name, kind_field):
    d = {"name": name}
    if kind.group:
        d["group"] = kind.group
    d["kind"] = kind_field
    return d


def err_not_found(kind, name):
    return ApiError(404, status_body(
        404, "NotFound", f'{kind.qualified} "{name}" not found',
        _details(kind, name, kind.plural)))


def err_already_exists(kind, name):
    return ApiError(409, status_body(
        409, "AlreadyExists", f'{kind.qualified} "{name}" already exists',
        _details(kind, name, kind.plural)))


def err_conflict(kind, name, why=OPTIMISTIC_LOCK_MSG):
    return ApiError(409, status_body(
        409, "Conflict",
        f'Operation cannot be fulfilled on {kind.qualified} "{name}": {why}',
        _details(kind, name, kind.plural)))


def err_invalid(kind, name, causes, use_resource=False):
    """causes: [(reason, field, message)].  details.kind is the Kind, except
    for the "must be specified for an update" error, where the apiserver
    fills the Kind with the plural (store.go Update, use_resource)."""
    if use_resource:
        qk, dk = kind.qualified, kind.plural
    else:
        qk, dk = kind.qualified_kind, kind.kind
    parts = []
    for (_, f, m) in causes:            # ToAggregate drops duplicates
        if f"{f}: {m}" not in parts:
            parts.append(f"{f}: {m}")
    text = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    d = _details(kind, name, dk)
    d["causes"] = [{"reason": r, "message": m, "field": f}
                   for (r, f, m) in causes]
    return ApiError(422, status_body(
        422, "Invalid", f'{qk} "{name}" is invalid: {text}', d))


def err_bad_request(msg):
    return ApiError(400, status_body(400, "BadRequest", msg))


def err_route_not_found():
    return ApiError(404, status_body(
        404, "NotFound", "the server could not find the requested resource",
        {}))


def err_method():
    return ApiError(405, status_body(
        405, "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {}))


def err_unsupported_media(kind):
    types = [MT_JSON_PATCH, MT_MERGE_PATCH]
    if kind is not None and kind.builtin:
        types.append(MT_SMP)
    types.append(MT_APPLY)
    return ApiError(415, status_body(
        415, "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media "
        "types include: " + ", ".join(types)))


def err_unauthorized():
    return ApiError(401, status_body(401, "Unauthorized", "Unauthorized"))


def err_expired(n, oldest):
    return status_body(410, "Expired",
                       f"too old resource version: {n} ({oldest})")


CONTINUE_EXPIRED_MSG = (
    "The provided continue parameter is too old to display a consistent "
    "list result. You can start a new list without the continue parameter.")


# etcd3 watcher.go, when the revision a watch stands on is compacted
WATCH_EXPIRED_MSG = "The resourceVersion for the provided watch is too old."
WATCH_ERROR_MSG = "Internal error occurred: etcdserver: request timed out"


def err_continue_expired():
    return ApiError(410, status_body(410, "Expired", CONTINUE_EXPIRED_MSG))


def err_bad_continue(why):
    return err_bad_request(f"invalid continue token: continue key is not "
                           f"valid: {why}")


FAULT_REASONS = {
    400: ("BadRequest", "injected fault"),
    401: ("Unauthorized", "Unauthorized"),
    403: ("Forbidden", "forbidden: injected fault"),
    404: ("NotFound", "the server could not find the requested resource"),
    409: ("Conflict", "injected fault"),
    410: ("Expired", "injected fault"),
    # an admission webhook's denial or a validation: NewInvalid's reason
    422: ("Invalid", "injected fault"),
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable",
          "the server is currently unable to handle the request"),
    504: ("Timeout", "Timeout: request did not complete within the allowed "
                     "duration"),
}


def fault_error(code, retry_after, echo=None, message=None):
    """echo: the Authorization header line to quote in the message, as
    an authenticating proxy in front of the API server may; message: the
    text instead of the code's (a quota's "exceeded quota: ..." 403)."""
    reason, msg = FAULT_REASONS.get(code, ("InternalError", "injected fault"))
    if message is not None:
        msg = message
    if echo is not None:
        msg = "%s (request had Authorization: %s)" % (msg, echo)
    details = None
    headers = {}
    if retry_after is not None:
        details = {"retryAfterSeconds": int(retry_after)}
        headers["Retry-After"] = str(int(retry_after))
    return ApiError(code, status_body(code, reason, msg, details), headers)


# ---------------------------------------------------------------------------
# Validation helpers

DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery rand.String

NAME_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case "
            "alphanumeric characters, '-' or '.', and must start and end with "
            "an alphanumeric character (e.g. 'example.com', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]"
            "([-a-z0-9]*[a-z0-9])?)*')")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of "
                   "alphanumeric characters, '-', '_' or '.', and must start "
                   "and end with an alphanumeric character (e.g. 'MyValue',  "
                   "or 'my_value',  or '12345', regex used for validation is "
                   "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def label_key_ok(key):
    if not isinstance(key, str):
        return False
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253
                       or not DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(LABEL_NAME.match(name))


def label_value_ok(v):
    return isinstance(v, str) and len(v) <= 63 and bool(LABEL_VALUE.match(v))


def canonical(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def json_equal(a, b):
    return canonical(a) == canonical(b)


def now_rfc3339():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def spec_part(obj):
    return {k: v for k, v in obj.items()
            if k not in ("metadata", "status", "apiVersion", "kind")}


# ---------------------------------------------------------------------------
# Selectors (§5)


class SelectorError(Exception):
    pass


_SPECIAL = set(" \t\r\n!=,()<>")


def _lex_selector(s):
    toks, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if c.isspace():
            i += 1
        elif s[i:i + 2] in ("!=", "=="):
            toks.append(("op", s[i:i + 2]))
            i += 2
        elif c == "!":
            toks.append(("not", c))
            i += 1
        elif c in "=<>":
            toks.append(("op", c))
            i += 1
        elif c in ",()":
            toks.append((c, c))
            i += 1
        else:
            j = i
            while j < n and s[j] not in _SPECIAL:
                j += 1
            toks.append(("id", s[i:j]))
            i = j
    toks.append(("eos", ""))
    return toks


def _check_key(key):
    if not label_key_ok(key):
        raise SelectorError(
            f"unable to parse requirement: key: Invalid value: "
            f"{json.dumps(key)}: name part must consist of alphanumeric "
            f"characters, '-', '_' or '.', and must start and end with an "
            f"alphanumeric character")


def _check_value(v):
    if not label_value_ok(v):
        raise SelectorError(
            f"unable to parse requirement: values[0]: Invalid value: "
            f"{json.dumps(v)}: {LABEL_VALUE_MSG}")


def parse_label_selector(s):
    """Returns a list of (op, key, values); raises SelectorError."""
    toks = _lex_selector(s)
    pos, reqs = 0, []
    while True:
        t, lit = toks[pos]
        if t == "eos":
            return reqs
        if t not in ("id", "not"):
            raise SelectorError(
                f"found '{lit}', expected: !, identifier, or 'end of string'")
        req, pos = _parse_requirement(toks, pos)
        reqs.append(req)
        t, lit = toks[pos]
        pos += 1
        if t == "eos":
            return reqs
        if t == ",":
            t2, l2 = toks[pos]
            if t2 not in ("id", "not"):
                raise SelectorError(
                    f"found '{l2}', expected: identifier after ','")
            continue
        raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")


def _parse_requirement(toks, pos):
    t, lit = toks[pos]
    if t == "not":
        pos += 1
        t, lit = toks[pos]
        if t != "id":
            raise SelectorError(f"found '{lit}', expected: identifier after '!'")
        _check_key(lit)
        return ("!", lit, None), pos + 1
    key = lit
    _check_key(key)
    pos += 1
    t, lit = toks[pos]
    if t in ("eos", ","):
        return ("exists", key, None), pos
    if t == "id" and lit in ("in", "notin"):
        op = lit
        pos += 1
        t, lit = toks[pos]
        if t != "(":
            raise SelectorError(f"found '{lit}', expected: '('")
        pos += 1
        vals = []
        expect_value = True
        while True:
            t, lit = toks[pos]
            if t == ")":
                if expect_value and vals:
                    vals.append("")
                pos += 1
                break
            if t == "id" and expect_value:
                vals.append(lit)
                expect_value = False
            elif t == ",":
                if expect_value:
                    vals.append("")
                expect_value = True
            else:
                raise SelectorError(
                    f"found '{lit}', expected: ',', ')' or identifier")
            pos += 1
        if not vals:
            raise SelectorError(
                "unable to parse requirement: values: Invalid value: []: "
                "for 'in', 'notin' operators, values set can't be empty")
        for v in vals:
            _check_value(v)
        return (op, key, set(vals)), pos
    if t == "op":
        op = lit
        pos += 1
        t, lit = toks[pos]
        if op in ("<", ">"):
            if t != "id" or not re.match(r"^-?[0-9]+$", lit):
                raise SelectorError(
                    f"unable to parse requirement: for 'Gt', 'Lt' operators, "
                    f"the value must be an integer: {lit!r}")
            return (op, key, int(lit)), pos + 1
        if t in ("eos", ","):
            value = ""
        elif t == "id":
            value = lit
            pos += 1
        else:
            raise SelectorError(f"found '{lit}', expected: identifier")
        _check_value(value)
        return ({"=": "in", "==": "in", "!=": "notin"}[op], key, {value}), pos
    raise SelectorError(
        f"found '{lit}', expected: [in notin = == != gt lt]")


def labels_match(reqs, labels):
    for op, key, vals in reqs:
        has = key in labels
        if op == "exists" and not has:
            return False
        if op == "!" and has:
            return False
        if op == "in" and (not has or labels[key] not in vals):
            return False
        if op == "notin" and has and labels[key] in vals:
            return False
        if op in ("<", ">"):
            if not has or not re.match(r"^-?[0-9]+$", labels[key]):
                return False
            n = int(labels[key])
            if (op == ">" and not n > vals) or (op == "<" and not n < vals):
                return False
    return True


def _split_unescaped(s, sep):
    out, cur, i = [], [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            cur.append(s[i:i + 2])
            i += 2
            continue
        if s[i] == sep:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(s[i])
        i += 1
    out.append("".join(cur))
    return out


def _unescape_field(s):
    return re.sub(r"\\(.)", r"\1", s)


def parse_field_selector(s, allowed):
    """Returns [(field, op, value)] with op in {"=", "!="}."""
    reqs = []
    if not s.strip():
        return reqs
    for term in _split_unescaped(s, ","):
        for op in ("!=", "==", "="):
            idx = _find_unescaped(term, op)
            if idx >= 0:
                field = term[:idx].strip()
                value = _unescape_field(term[idx + len(op):])
                break
        else:
            raise SelectorError(
                f"invalid selector: '{s}'; can't understand '{term}'")
        if field not in allowed:
            raise SelectorError(f"field label not supported: {field}")
        reqs.append((field, "!=" if op == "!=" else "=", value))
    return reqs


def _find_unescaped(s, op):
    i = 0
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s.startswith(op, i):
            return i
        i += 1
    return -1


def field_value(obj, field):
    md = obj.get("metadata") or {}
    if field == "metadata.name":
        return md.get("name", "")
    if field == "metadata.namespace":
        return md.get("namespace", "")
    if field == "type":
        return obj.get("type", "")
    return ""


def fields_match(reqs, obj):
    for field, op, value in reqs:
        eq = field_value(obj, field) == value
        if (op == "=") != eq:
            return False
    return True


class Matcher:
    def __init__(self, kind, ns, labels, fields):
        self.kind, self.ns, self.labels, self.fields = kind, ns, labels, fields

    def __call__(self, obj):
        md = obj.get("metadata") or {}
        if self.ns is not None and md.get("namespace") != self.ns:
            return False
        lab = md.get("labels") or {}
        return labels_match(self.labels, lab) and fields_match(self.fields,
                                                                obj)


# ---------------------------------------------------------------------------
# Patches (§2.4)


class PatchError(Exception):
    pass


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def strategic_merge_patch(target, patch):
    """A JSON merge patch, except that metadata.finalizers are merged as a
    set and metadata.ownerReferences by uid (their patchStrategy in the Go
    types).  No $patch / $retainKeys / $setElementOrder directives."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return merge_patch(target, patch)
    pmd = patch.get("metadata")
    tmd = target.get("metadata") or {}
    special = {}
    if isinstance(pmd, dict):
        pmd = dict(pmd)
        fin = pmd.get("finalizers")
        if isinstance(fin, list) and isinstance(tmd.get("finalizers"), list):
            merged = list(tmd["finalizers"])
            merged += [f for f in fin if f not in merged]
            special["finalizers"] = merged
            del pmd["finalizers"]
        refs = pmd.get("ownerReferences")
        if isinstance(refs, list) and isinstance(tmd.get("ownerReferences"),
                                                 list):
            merged = copy.deepcopy(tmd["ownerReferences"])
            for r in refs:
                uid = r.get("uid") if isinstance(r, dict) else None
                for i, m in enumerate(merged):
                    if isinstance(m, dict) and m.get("uid") == uid:
                        merged[i] = merge_patch(m, r)
                        break
                else:
                    merged.append(r)
            special["ownerReferences"] = merged
            del pmd["ownerReferences"]
        patch = dict(patch)
        patch["metadata"] = pmd
    result = merge_patch(target, patch)
    if special:
        result.setdefault("metadata", {}).update(special)
    return result


def _ptr_tokens(path):
    if not isinstance(path, str):
        raise PatchError(f"invalid JSON pointer: {path!r}")
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer must start with '/': {path!r}")
    return [t.replace("~1", "/").replace("~0", "~")
            for t in path[1:].split("/")]


def _array_index(tok, length, allow_end):
    if allow_end and tok == "-":
        return length
    if not re.match(r"^(0|[1-9][0-9]*)$", tok):
        raise PatchError(f"invalid array index: {tok!r}")
    i = int(tok)
    if i > length or (i == length and not allow_end):
        raise PatchError(f"array index out of bounds: {i}")
    return i


def _resolve(doc, tokens):
    cur = doc
    for t in tokens:
        if isinstance(cur, dict):
            if t not in cur:
                raise PatchError(f"path not found: /{'/'.join(tokens)}")
            cur = cur[t]
        elif isinstance(cur, list):
            cur = cur[_array_index(t, len(cur), False)]
        else:
            raise PatchError(f"path not found: /{'/'.join(tokens)}")
    return cur


def _jp_add(doc, tokens, value):
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1])
    key = tokens[-1]
    if isinstance(parent, dict):
        parent[key] = value
    elif isinstance(parent, list):
        parent.insert(_array_index(key, len(parent), True), value)
    else:
        raise PatchError(f"cannot add at /{'/'.join(tokens)}")
    return doc


def _jp_remove(doc, tokens):
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _resolve(doc, tokens[:-1])
    key = tokens[-1]
    if isinstance(parent, dict):
        if key not in parent:
            raise PatchError(f"path not found: /{'/'.join(tokens)}")
        return parent.pop(key)
    if isinstance(parent, list):
        return parent.pop(_array_index(key, len(parent), False))
    raise PatchError(f"path not found: /{'/'.join(tokens)}")


def json_patch(doc, ops):
    """RFC 6902."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be an array of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError("each JSON patch operation needs an 'op'")
        name = op["op"]
        tokens = _ptr_tokens(op.get("path"))
        if name in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation '{name}' needs a 'value'")
        if name == "add":
            doc = _jp_add(doc, tokens, copy.deepcopy(op["value"]))
        elif name == "remove":
            _jp_remove(doc, tokens)
        elif name == "replace":
            if tokens:
                _jp_remove(doc, tokens)
            doc = _jp_add(doc, tokens, copy.deepcopy(op["value"]))
        elif name == "move":
            src = _ptr_tokens(op.get("from"))
            if tokens[:len(src)] == src and len(tokens) > len(src):
                raise PatchError("cannot move a value into one of its "
                                 "children")
            value = _jp_remove(doc, src) if src else doc
            doc = _jp_add(doc, tokens, value)
        elif name == "copy":
            src = _ptr_tokens(op.get("from"))
            value = copy.deepcopy(_resolve(doc, src))
            doc = _jp_add(doc, tokens, value)
        elif name == "test":
            if not json_equal(_resolve(doc, tokens), op["value"]):
                raise PatchError(
                    f"testing value {op.get('path')} failed: test failed")
        else:
            raise PatchError(f"unexpected kind: {name}")
    return doc


# ---------------------------------------------------------------------------
# The store


def delete_options_invalid(reason, msg):
    return ApiError(422, status_body(
        422, "Invalid", 'DeleteOptions.meta.k8s.io "" is invalid: '
        f"propagationPolicy: {msg}",
        {"group": "meta.k8s.io", "kind": "DeleteOptions",
         "causes": [{"reason": reason, "message": msg,
                     "field": "propagationPolicy"}]}))


def delete_policy(options):
    """The propagation policy DeleteOptions ask for (validated by the
    handler): propagationPolicy, else orphanDependents, else
    Background."""
    if options.get("propagationPolicy"):
        return options["propagationPolicy"]
    return "Orphan" if options.get("orphanDependents") is True else \
        "Background"


class Event:
    __slots__ = ("rv", "type", "ns", "plural", "obj", "prev", "obj_json")

    def __init__(self, rv, etype, ns, plural, obj, prev):
        self.rv, self.type, self.ns, self.plural = rv, etype, ns, plural
        self.obj, self.prev = obj, prev
        self.obj_json = json.dumps(obj, separators=(",", ":"),
                                   ensure_ascii=False)


CONTINUE_TTL = 300      # seconds a continue token lives (etcd compaction)
CONTINUE_KEPT = 256     # snapshots kept; the oldest beyond expire


class Snapshot:
    """The items of a chunked list as its first page saw them."""
    __slots__ = ("id", "rv", "items", "scope", "made")

    def __init__(self, sid, rv, items, scope):
        self.id, self.rv, self.items, self.scope = sid, rv, items, scope
        self.made = time.monotonic()

    def token(self, pos):
        t = {"v": "meta.k8s.io/v1", "rv": self.rv, "snap": self.id,
             "pos": pos}
        return base64.urlsafe_b64encode(json.dumps(
            t, separators=(",", ":")).encode()).decode().rstrip("=")


class Store:
    """Objects are never mutated once stored (they are replaced), so they
    and the events that share them can be serialized outside the lock."""

    def __init__(self, history):
        self.lock = threading.RLock()
        self.rv = 0
        self.objects = {}            # (plural, ns, name) -> object
        self.history = collections.deque()
        self.history_max = history
        self.floor = 0               # watches from an RV below this get 410
        self.watchers = set()
        # chunked lists: id -> Snapshot; ids up to snap_seq that are not
        # here have expired
        self.snapshots = collections.OrderedDict()
        self.snap_seq = 0

    # -- plumbing -----------------------------------------------------------

    def _next_rv(self):
        self.rv += 1
        return str(self.rv)

    def _emit(self, etype, kind, obj, prev=None):
        ev = Event(int(obj["metadata"]["resourceVersion"]), etype,
                   obj["metadata"].get("namespace"), kind.plural, obj, prev)
        self.history.append(ev)
        while len(self.history) > self.history_max:
            self.floor = self.history.popleft().rv
        if self.history_max == 0:
            self.floor = ev.rv
        for q in self.watchers:
            q.put(ev)

    def compact(self):
        """Forget the watch history; the continue tokens of chunked lists
        expire with it, as etcd's compaction ends both."""
        with self.lock:
            self.history.clear()
            self.floor = self.rv
            self.snapshots.clear()
            return self.rv, self.floor

    def kind_of(self, plural):
        for k in KINDS:
            if k.plural == plural:
                return k
        raise KeyError(plural)

    # -- reads --------------------------------------------------------------

    def get(self, kind, ns, name):
        with self.lock:
            obj = self.objects.get((kind.plural, ns, name))
        if obj is None:
            raise err_not_found(kind, name)
        return obj

    def list(self, kind, matcher, limit=0, cont=None, scope=None):
        """The matching objects sorted by namespace/name; with limit > 0 at
        most limit of them and, when more remain, a continue token.  The
        pages after the first come from a snapshot kept under the token
        (objects are never mutated, so it is a list of references): the
        first page's resourceVersion, whatever changed since, as etcd
        serves them at that revision.  scope is what a continue request
        must repeat (the collection and its selectors)."""
        with self.lock:
            if cont is None:
                items = [o for (p, _, _), o in self.objects.items()
                         if p == kind.plural and matcher(o)]
                rv = self.rv
                items.sort(key=lambda o: (o["metadata"]["namespace"],
                                          o["metadata"]["name"]))
                snap, pos = None, 0
            else:
                snap, pos = self._snapshot(cont, scope)
                items, rv = snap.items, snap.rv
            md = {"resourceVersion": str(rv), "continue": ""}
            if limit > 0 and len(items) - pos > limit:
                if snap is None:
                    self.snap_seq += 1
                    snap = Snapshot(self.snap_seq, rv, items, scope)
                    self.snapshots[snap.id] = snap
                    while len(self.snapshots) > CONTINUE_KEPT:
                        self.snapshots.popitem(last=False)
                end = pos + limit
                md["continue"] = snap.token(end)
                if not scope[2] and not scope[3]:   # no selectors
                    md["remainingItemCount"] = len(items) - end
                items = items[pos:end]
            else:
                items = items[pos:]
        return {"kind": kind.kind + "List", "apiVersion": kind.api_version,
                "metadata": md, "items": items}

    def _snapshot(self, cont, scope):
        """The snapshot and position a continue token stands for: 400 when
        it is not one of ours or not for this request, 410 when it has
        expired (compaction, age, the CONTINUE_KEPT bound, a rule)."""
        try:
            t = json.loads(base64.urlsafe_b64decode(
                cont + "=" * (-len(cont) % 4)))
            sid, pos, rv = int(t["snap"]), int(t["pos"]), int(t["rv"])
            if t.get("v") != "meta.k8s.io/v1":
                raise ValueError("server does not recognize this encoded "
                                 "version")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise err_bad_continue(str(e) or "undecodable")
        if sid < 1 or sid > self.snap_seq or pos < 0:
            raise err_bad_continue("unknown token")
        snap = self.snapshots.get(sid)
        if snap is not None and time.monotonic() - snap.made > CONTINUE_TTL:
            del self.snapshots[sid]
            snap = None
        if snap is None:
            raise err_continue_expired()
        if snap.rv != rv or pos > len(snap.items):
            raise err_bad_continue("unknown token")
        if snap.scope != scope:
            raise err_bad_continue("the collection or selectors differ "
                                   "from those of the list's first request")
        return snap, pos

    def expire_continue(self, cont):
        """Drop the snapshot behind a continue token (if it is one)."""
        try:
            t = json.loads(base64.urlsafe_b64decode(
                cont + "=" * (-len(cont) % 4)))
            with self.lock:
                self.snapshots.pop(int(t["snap"]), None)
        except (ValueError, TypeError, KeyError, AttributeError):
            pass

    def namespaces(self):
        with self.lock:
            used = {ns for (_, ns, _) in self.objects}
        return sorted(used | {"default", "kube-system", "kube-public"})

    # -- writes -------------------------------------------------------------

    def create(self, kind, ns, body, opts=None):
        obj = copy.deepcopy(body)
        schema_decode(kind, obj, opts, "create")
        md = obj.get("metadata")
        if md is None:
            md = {}
        md = copy.deepcopy(md)
        if md.get("namespace") not in (None, "", ns):
            raise err_bad_request(
                "the namespace of the provided object does not match the "
                "namespace sent on the request")
        for f in ("uid", "creationTimestamp", "resourceVersion", "generation",
                  "deletionTimestamp", "deletionGracePeriodSeconds",
                  "managedFields", "selfLink"):
            md.pop(f, None)
        if kind.status:
            obj.pop("status", None)
        with self.lock:
            name = md.get("name") or ""
            gen = md.get("generateName") or ""
            if not name and gen:
                while True:
                    name = gen + "".join(random.choice(GENERATE_ALPHABET)
                                         for _ in range(5))
                    if (kind.plural, ns, name) not in self.objects:
                        break
            if kind.schema is not None:
                cand = dict(obj, apiVersion=kind.api_version, kind=kind.kind,
                            metadata=dict(md, name=name, namespace=ns))
                validate_meta(kind, name, md, schema_causes(kind, cand))
            else:
                validate_meta(kind, name, md)
            if (kind.plural, ns, name) in self.objects:
                raise err_already_exists(kind, name)
            md["name"] = name
            md["namespace"] = ns
            md["uid"] = str(uuid.uuid4())
            md["resourceVersion"] = self._next_rv()
            if kind.generation:
                md["generation"] = 1
            md["creationTimestamp"] = now_rfc3339()
            obj["metadata"] = md
            obj["apiVersion"] = kind.api_version
            obj["kind"] = kind.kind
            apply_defaults(kind, obj)
            self.objects[(kind.plural, ns, name)] = obj
            self._emit("ADDED", kind, obj)
            self._collect_dangling(kind, obj)
            return obj

    def update(self, kind, ns, name, body, subresource, opts=None):
        """PUT on the resource or its /status (§2.3, §2.5)."""
        body = copy.deepcopy(body)
        schema_decode(kind, body, opts, "update")
        md = body.get("metadata") or {}
        check_name_ns(name, ns, md)
        with self.lock:
            old = self.objects.get((kind.plural, ns, name))
            if old is None:
                raise err_not_found(kind, name)
            rv = md.get("resourceVersion")
            if rv in (None, "", "0", 0):
                # CRDs (customResourceStrategy) allow no unconditional
                # update; Secret and NetworkPolicy strategies do
                if not kind.builtin:
                    raise err_invalid(kind, name, [(
                        "FieldValueInvalid", "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an "
                        "update")], use_resource=True)
            elif str(rv) != old["metadata"]["resourceVersion"]:
                raise err_conflict(kind, name)
            return self._commit(kind, old, body, subresource)

    def patch(self, kind, ns, name, ctype, patch, subresource, opts=None):
        with self.lock:
            old = self.objects.get((kind.plural, ns, name))
            if old is None:
                raise err_not_found(kind, name)
            try:
                if ctype == MT_MERGE_PATCH:
                    new = merge_patch(old, patch)
                elif ctype == MT_SMP:
                    new = strategic_merge_patch(old, patch)
                else:
                    new = json_patch(old, patch)
            except PatchError as e:
                raise ApiError(422, status_body(
                    422, "Invalid", "the server rejected our request due to "
                    "an error in our request",
                    {"causes": [{"reason": "UnexpectedServerResponse",
                                 "message": str(e)}]}))
            if not isinstance(new, dict):
                raise err_bad_request("the patched object is not a JSON "
                                      "object")
            schema_decode(kind, new, opts, "patch")
            md = new.get("metadata")
            if not isinstance(md, dict):
                raise err_bad_request("the patched object has no metadata")
            check_name_ns(name, ns, md)
            rv = md.get("resourceVersion")
            if rv not in (None, "") and str(rv) != \
                    old["metadata"]["resourceVersion"]:
                raise err_conflict(kind, name)
            return self._commit(kind, old, new, subresource)

    def _commit(self, kind, old, new, subresource):
        """Applies the subresource rules and server-owned fields to `new`,
        stores it unless it is a no-op, and emits MODIFIED.  Lock held."""
        if not isinstance(new.get("metadata"), dict):
            new["metadata"] = {}
        if kind.status and subresource == "status":
            cand = copy.deepcopy(old)
            if "status" in new:
                cand["status"] = new["status"]
            else:
                cand.pop("status", None)
        else:
            cand = new
            if kind.status:
                if "status" in old:
                    cand["status"] = copy.deepcopy(old["status"])
                else:
                    cand.pop("status", None)
        md = cand["metadata"]
        omd = old["metadata"]
        for f in ("name", "namespace", "uid", "creationTimestamp",
                  "generation", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "resourceVersion"):
            if f in omd:
                md[f] = omd[f]
            else:
                md.pop(f, None)
        md.pop("managedFields", None)
        md.pop("selfLink", None)
        cand["apiVersion"] = kind.api_version
        cand["kind"] = kind.kind
        validate_meta(kind, md["name"], md, schema_causes(kind, cand))
        apply_defaults(kind, cand)
        if kind.generation and not json_equal(spec_part(cand),
                                              spec_part(old)):
            md["generation"] = int(omd.get("generation", 0)) + 1
        if json_equal(cand, old):
            return old                       # no-op: no new RV, no event
        if md.get("deletionTimestamp") and not md.get("finalizers"):
            return self._remove(kind, cand)
        md["resourceVersion"] = self._next_rv()
        key = (kind.plural, md["namespace"], md["name"])
        self.objects[key] = cand
        self._emit("MODIFIED", kind, cand, old)
        self._collect_dangling(kind, cand)
        return cand

    def _collect_dangling(self, kind, obj):
        """The garbage collector deletes an object whose ownerReferences
        all name uids that do not exist (a real cluster does it shortly
        after the write; this fake does it at once).  Lock held."""
        refs = [r for r in obj["metadata"].get("ownerReferences") or []
                if isinstance(r, dict) and r.get("uid")]
        if not refs:
            return
        live = {o["metadata"]["uid"] for o in self.objects.values()}
        if not any(r["uid"] in live for r in refs):
            self._delete(kind, obj, "Background")

    def delete(self, kind, ns, name, options):
        """Returns (object, removed)."""
        with self.lock:
            obj = self.objects.get((kind.plural, ns, name))
            if obj is None:
                raise err_not_found(kind, name)
            pre = options.get("preconditions") or {}
            md = obj["metadata"]
            if pre.get("uid") and pre["uid"] != md["uid"]:
                raise err_conflict(kind, name, (
                    f"Precondition failed: UID in precondition: {pre['uid']}, "
                    f"UID in object meta: {md['uid']}"))
            if pre.get("resourceVersion") and \
                    pre["resourceVersion"] != md["resourceVersion"]:
                raise err_conflict(kind, name, (
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{pre['resourceVersion']}, ResourceVersion in object "
                    f"meta: {md['resourceVersion']}"))
            return self._delete(kind, obj, delete_policy(options))

    def delete_collection(self, kind, matcher, options):
        policy = delete_policy(options)
        with self.lock:
            victims = [o for (p, _, _), o in sorted(self.objects.items())
                       if p == kind.plural and matcher(o)]
            out = []
            for o in victims:
                cur = self.objects.get((kind.plural, o["metadata"]["namespace"],
                                        o["metadata"]["name"]))
                if cur is not None:
                    out.append(self._delete(kind, cur, policy)[0])
            return {"kind": kind.kind + "List",
                    "apiVersion": kind.api_version,
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": out}

    def _delete(self, kind, obj, policy, doomed=frozenset()):
        """Deletes (or, with finalizers, marks) one object.  Lock held.
        doomed: the uids a Foreground deletion is deleting further up."""
        md = obj["metadata"]
        if policy == "Foreground":
            doomed = doomed | {md["uid"]}
            self._settle_dependents(md["uid"], policy, doomed)
        if md.get("finalizers"):
            if md.get("deletionTimestamp"):
                return obj, False
            cand = copy.deepcopy(obj)
            cmd = cand["metadata"]
            cmd["deletionTimestamp"] = now_rfc3339()
            cmd["deletionGracePeriodSeconds"] = 0
            if cmd.get("generation"):
                cmd["generation"] = int(cmd["generation"]) + 1
            cmd["resourceVersion"] = self._next_rv()
            self.objects[self._key(kind, cand)] = cand
            self._emit("MODIFIED", kind, cand, obj)
            return cand, False
        self._remove(kind, obj, policy, doomed)
        return obj, True

    def _remove(self, kind, obj, policy="Background", doomed=frozenset()):
        """Removes from storage, emits DELETED, then runs the garbage
        collector on the dependents.  Lock held."""
        self.objects.pop(self._key(kind, obj), None)
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        self._emit("DELETED", kind, gone)
        self._settle_dependents(obj["metadata"]["uid"], policy, doomed)
        return gone

    def _settle_dependents(self, uid, policy, doomed):
        """The garbage collector on the dependents of owner uid: with
        Orphan, or when a dependent has another owner that exists (and
        is not in doomed), it only loses its reference to uid; otherwise
        it is deleted (Foreground: before its owner).  Lock held."""
        for dkind, dep in self._dependents(uid):
            cur = self.objects.get(self._key(dkind, dep))
            if cur is None or cur["metadata"]["uid"] in doomed:
                continue                 # gone, or a cycle on its way
            live_uids = {o["metadata"]["uid"] for o in self.objects.values()
                         } - set(doomed) - {uid}
            refs = cur["metadata"].get("ownerReferences") or []
            others = [r for r in refs if isinstance(r, dict)
                      and r.get("uid") != uid]
            if policy == "Orphan" or any(r.get("uid") in live_uids
                                         for r in others):
                cand = copy.deepcopy(cur)
                if others:
                    cand["metadata"]["ownerReferences"] = others
                else:
                    cand["metadata"].pop("ownerReferences", None)
                cand["metadata"]["resourceVersion"] = self._next_rv()
                self.objects[self._key(dkind, cand)] = cand
                self._emit("MODIFIED", dkind, cand, cur)
            else:
                self._delete(dkind, cur, "Foreground" if policy ==
                             "Foreground" else "Background", doomed)

    def _dependents(self, uid):
        out = []
        for (plural, _, _), o in sorted(self.objects.items()):
            refs = o["metadata"].get("ownerReferences") or []
            if any(isinstance(r, dict) and r.get("uid") == uid for r in refs):
                out.append((self.kind_of(plural), o))
        return out

    @staticmethod
    def _key(kind, obj):
        return (kind.plural, obj["metadata"]["namespace"],
                obj["metadata"]["name"])

    # -- watch --------------------------------------------------------------

    def open_watch(self, kind, matcher, rv_param, send_initial):
        """Registers a watcher.  Returns (initial, queue, rv): initial is the
        list of (type, object JSON) to send first (synthetic ADDED for an
        unset/"0" resourceVersion, else the retained events after it).
        When the resourceVersion is older than the history, returns
        (Expired Status, None, None)."""
        with self.lock:
            initial = []
            if rv_param in (None, "", "0") or send_initial:
                objs = [o for (p, _, _), o in self.objects.items()
                        if p == kind.plural and matcher(o)]
                objs.sort(key=lambda o: (o["metadata"]["namespace"],
                                         o["metadata"]["name"]))
                initial = [("ADDED", json.dumps(o, separators=(",", ":"),
                                                ensure_ascii=False))
                           for o in objs]
                start_rv = self.rv
            else:
                if not re.match(r"^[0-9]+$", rv_param):
                    raise err_bad_request(
                        f"invalid resource version: strconv.ParseUint: "
                        f"parsing {json.dumps(rv_param)}: invalid syntax")
                n = int(rv_param)
                if n < self.floor:
                    return err_expired(n, self.floor), None, None
                for ev in self.history:
                    if ev.rv > n:
                        out = translate_event(ev, kind, matcher)
                        if out:
                            initial.append(out)
                start_rv = self.rv
            q = queue.SimpleQueue()
            self.watchers.add(q)
            return initial, q, start_rv

    def close_watch(self, q):
        with self.lock:
            self.watchers.discard(q)

    def end_watches(self, mode):
        """Ask every open watch stream to end, as the apiserver ends them
        (its timeout, a restart): "close" with the clean end of the
        chunked body, "cut" by dropping the connection in the middle of
        the next event line it sends (half of it sent, no end), "expire"
        with an ERROR event (410 Expired, as when etcd compacts the
        revision a watch stands on) and the clean end, "error" with an
        ERROR event (500 InternalError, as when etcd fails under the
        watch cache) and the clean end.  Returns
        how many streams were asked."""
        with self.lock:
            for q in self.watchers:
                q.put(EndWatch(mode))
            return len(self.watchers)


class EndWatch:
    """Queued to a watch stream by /_fake/end_watches."""
    __slots__ = ("mode",)

    def __init__(self, mode):
        self.mode = mode


def translate_event(ev, kind, matcher):
    """What a watcher with `matcher` sees of `ev`: (type, json) or None.
    Like the cacher, a MODIFIED that enters/leaves the selection becomes
    ADDED/DELETED."""
    if ev.plural != kind.plural:
        return None
    cur = matcher(ev.obj)
    if ev.type != "MODIFIED":
        return (ev.type, ev.obj_json) if cur else None
    old = ev.prev is not None and matcher(ev.prev)
    if cur and old:
        return ("MODIFIED", ev.obj_json)
    if cur:
        return ("ADDED", ev.obj_json)
    if old:
        prev = copy.deepcopy(ev.prev)
        prev["metadata"]["resourceVersion"] = str(ev.rv)
        return ("DELETED", json.dumps(prev, separators=(",", ":"),
                                      ensure_ascii=False))
    return None


def check_name_ns(name, ns, md):
    if md.get("name") not in (None, "", name):
        raise err_bad_request(
            f"the name of the object ({md.get('name')}) does not match the "
            f"name on the URL ({name})")
    if md.get("namespace") not in (None, "", ns):
        raise err_bad_request(
            "the namespace of the provided object does not match the "
            "namespace sent on the request")


def validate_meta(kind, name, md, extra=()):
    """ObjectMeta validation; `extra` causes (the schema's) are reported
    in the same 422, after the metadata ones, as the CR strategy does."""
    causes = meta_causes(kind, name, md) + list(extra)
    if causes:
        raise err_invalid(kind, name, causes)


def meta_causes(kind, name, md):
    causes = []
    if not name:
        causes.append(("FieldValueRequired", "metadata.name",
                       "Required value: name or generateName is required"))
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        causes.append(("FieldValueInvalid", "metadata.name",
                       f"Invalid value: {json.dumps(name)}: {NAME_MSG}"))
    for field in ("labels", "annotations"):
        m = md.get(field)
        if m is None:
            continue
        if not isinstance(m, dict) or not all(isinstance(v, str)
                                              for v in m.values()):
            raise err_bad_request(
                f"{kind.kind} in version \"{kind.version}\" cannot be handled "
                f"as a {kind.kind}: metadata.{field}: expected a map of "
                f"strings")
        for k, v in m.items():
            if not label_key_ok(k):
                causes.append((
                    "FieldValueInvalid", f"metadata.{field}",
                    f"Invalid value: {json.dumps(k)}: name part must consist "
                    f"of alphanumeric characters, '-', '_' or '.', and must "
                    f"start and end with an alphanumeric character"))
            elif field == "labels" and not label_value_ok(v):
                causes.append(("FieldValueInvalid", "metadata.labels",
                               f"Invalid value: {json.dumps(v)}: "
                               f"{LABEL_VALUE_MSG}"))
    for field in ("finalizers", "ownerReferences"):
        if md.get(field) is not None and not isinstance(md[field], list):
            raise err_bad_request(
                f"{kind.kind} in version \"{kind.version}\" cannot be handled "
                f"as a {kind.kind}: metadata.{field}: expected a list")
    return causes


MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?"
                        r"(Z|[+-]\d\d:\d\d)$")


def lease_check(obj):
    """A Lease as the apiserver decodes and validates it: the MicroTime
    fields parse (else 400, as the JSON decoder fails), the integers are
    integers, leaseDurationSeconds is above 0 (ValidateLeaseSpec)."""
    spec = obj.get("spec")
    if spec is None:
        return
    pre = 'Lease in version "v1" cannot be handled as a Lease: '
    if not isinstance(spec, dict):
        raise err_bad_request(pre + "spec: expected an object")
    for f in ("acquireTime", "renewTime"):
        v = spec.get(f)
        if v is not None and (not isinstance(v, str) or
                              not MICRO_TIME.match(v)):
            raise err_bad_request(
                pre + f'parsing time {json.dumps(v)} as '
                '"2006-01-02T15:04:05.000000Z07:00": cannot parse')
    for f in ("leaseDurationSeconds", "leaseTransitions"):
        v = spec.get(f)
        if v is not None and (isinstance(v, bool) or
                              not isinstance(v, int)):
            raise err_bad_request(pre + f"spec.{f}: expected an integer")
    v = spec.get("holderIdentity")
    if v is not None and not isinstance(v, str):
        raise err_bad_request(pre + "spec.holderIdentity: expected a "
                              "string")
    causes = []
    if spec.get("leaseDurationSeconds") is not None and \
            spec["leaseDurationSeconds"] <= 0:
        causes.append(("FieldValueInvalid", "spec.leaseDurationSeconds",
                       f"Invalid value: {spec['leaseDurationSeconds']}: "
                       "must be greater than 0"))
    if spec.get("leaseTransitions") is not None and \
            spec["leaseTransitions"] < 0:
        causes.append(("FieldValueInvalid", "spec.leaseTransitions",
                       f"Invalid value: {spec['leaseTransitions']}: "
                       "must be greater than or equal to 0"))
    if causes:
        raise err_invalid(KIND_LEASE, obj["metadata"]["name"], causes)


def apply_defaults(kind, obj):
    """The defaulting (and, for a Lease, the validation) a real apiserver
    does for the built-in kinds."""
    if kind.kind == "Lease":
        lease_check(obj)
    elif kind.kind == "Secret":
        data = obj.get("data")
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise err_bad_request('Secret in version "v1" cannot be handled '
                                  'as a Secret: data: expected a map')
        for k, v in data.items():
            try:
                if not isinstance(v, str):
                    raise ValueError
                base64.b64decode(v, validate=True)
            except (ValueError, TypeError):
                raise err_bad_request(
                    'Secret in version "v1" cannot be handled as a Secret: '
                    f'illegal base64 data at input byte 0 (key {k!r})')
        sd = obj.pop("stringData", None)
        if isinstance(sd, dict):
            data = dict(data)
            for k, v in sd.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        if data or "data" in obj:
            obj["data"] = data
        obj.setdefault("type", "Opaque")
    elif kind.kind == "NetworkPolicy":
        spec = obj.get("spec")
        if isinstance(spec, dict):
            for rk in ("ingress", "egress"):
                for rule in spec.get(rk) or []:
                    if isinstance(rule, dict):
                        for p in rule.get("ports") or []:
                            if isinstance(p, dict):
                                p.setdefault("protocol", "TCP")
            if not spec.get("policyTypes"):
                spec["policyTypes"] = ["Ingress"] + (
                    ["Egress"] if spec.get("egress") else [])


# ---------------------------------------------------------------------------
# CRD schemas: pruning, strict field validation and structural-schema
# validation of AgentTask and Environment (apiextensions-apiserver).
#
# The openAPIV3Schema of deploy/crds/*.yaml is loaded at start (PyYAML).
# Decoding a body (create, update) or a patched object (patch) prunes the
# fields the schema does not know (pruning.go; metadata: the ObjectMeta
# fields) and the nulls of non-nullable fields (prunenulls.go); with
# ?fieldValidation=Strict an unknown field is a 400 instead.  Before an
# object is stored it is validated the way kube-openapi's SchemaValidator
# does it (validate/schema.go, type.go, values.go, errors/schema.go) and the
# errors are turned into field errors as in apiextensions-apiserver
# validation.go kubeOpenAPIResultToFieldErrors, then into one 422 Invalid.

CRD_FILES = ("divergedev.com_agenttasks.yaml",
             "divergedev.com_environments.yaml")
# the formats apiextensions keeps (validation/formats.go); the others,
# int32 and int64 among them, are stripped and so never checked
SUPPORTED_FORMATS = {
    "bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr",
    "mac", "uuid", "uuid3", "uuid4", "uuid5", "isbn", "isbn10", "isbn13",
    "creditcard", "ssn", "hexcolor", "rgbcolor", "byte", "password", "date",
    "duration", "datetime"}
OBJECT_META_FIELDS = {
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
    "generation", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences",
    "finalizers", "managedFields"}
FIELD_VALIDATION = ("", "Ignore", "Strict", "Warn")   # sets.List order
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_JSON_FLOAT = float((1 << 53) - 1)     # swag.IsFloat64AJSONInteger


def load_schemas(crd_dir):
    """Attaches the openAPIV3Schema of each CRD in crd_dir to its Kind.
    Returns the Kinds that got one; warns on stderr and skips otherwise."""
    def warn(msg):
        sys.stderr.write(f"fake-kube-apiserver: warning: {msg}; no schema "
                         f"validation for it\n")
        sys.stderr.flush()
    try:
        import yaml
    except ImportError:
        warn("PyYAML is not installed (import yaml failed)")
        return []
    done = []
    for fname in CRD_FILES:
        path = os.path.join(crd_dir, fname)
        try:
            with open(path, encoding="utf-8") as f:
                crd = yaml.safe_load(f)
            spec = crd["spec"]
            kind = next(k for k in KINDS if k.group == spec["group"] and
                        k.kind == spec["names"]["kind"])
            ver = next(v for v in spec["versions"]
                       if v["name"] == kind.version)
            schema = ver["schema"]["openAPIV3Schema"]
            if not isinstance(schema, dict):
                raise ValueError("openAPIV3Schema is not a mapping")
        except FileNotFoundError:
            warn(f"{path} not found")
            continue
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError,
                StopIteration) as e:
            warn(f"cannot use {path}: {e.__class__.__name__}: {e}")
            continue
        _compile_patterns(schema)
        kind.schema = schema
        done.append(kind)
    return done


_PATTERNS = {}


def re2_to_python(p):
    """Go RE2 -> Python re: outside a character class, `$` (without the m
    flag) and `\\z` only match at the very end in RE2, while Python's `$`
    also matches before a final newline: both become `\\Z`.  Compiled with
    re.ASCII, as RE2's \\d, \\w, \\s and \\b are ASCII-only."""
    if "(?m" in p:
        return p
    out, i, in_class = [], 0, False
    while i < len(p):
        c = p[i]
        if c == "\\" and i + 1 < len(p):
            nxt = p[i + 1]
            out.append("\\Z" if nxt == "z" and not in_class else c + nxt)
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            if p[i + 1:i + 2] == "^":
                out.append("[^")
                i += 2
            else:
                out.append(c)
                i += 1
            if p[i:i + 1] == "]":           # a leading ] is a literal
                out.append("]")
                i += 1
            continue
        elif c == "$":
            out.append("\\Z")
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _compile_patterns(s):
    """Pre-compiles every `pattern` (Go RE2 syntax, close enough to Python's
    re once \\z is spelled \\Z); ones Python cannot compile are ignored."""
    if not isinstance(s, dict):
        return
    p = s.get("pattern")
    if isinstance(p, str) and p not in _PATTERNS:
        try:
            _PATTERNS[p] = re.compile(re2_to_python(p), re.ASCII)
        except re.error as e:
            sys.stderr.write(f"fake-kube-apiserver: warning: pattern {p!r} "
                             f"ignored: {e}\n")
            _PATTERNS[p] = None
    for sub in (s.get("properties") or {}).values():
        _compile_patterns(sub)
    for key in ("items", "additionalProperties"):
        _compile_patterns(s.get(key))


class WriteOptions:
    """The fieldValidation directive of one write, and the warnings
    (Warning headers) it produced."""

    def __init__(self, directive="Warn"):
        self.directive = directive or "Warn"
        self.warnings = []

    def warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)


# -- formatting like Go ------------------------------------------------------


def go_quote(s):
    """strconv.Quote."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append("\\" + "abfnrtv"["\a\b\f\n\r\t\v".index(ch)])
        elif ch.isprintable():
            out.append(ch)
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


def go_float(f):
    """fmt's %v of a float64 (strconv 'g', shortest, %e from exponent 6)."""
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "0"
    import decimal
    sign, digits, exp = decimal.Decimal(repr(abs(f))).normalize().as_tuple()
    ds = "".join(map(str, digits))
    nd, dp = len(ds), len(ds) + exp
    neg = "-" if f < 0 else ""
    x = dp - 1
    if x < -4 or x >= 6:
        mant = ds[0] + ("." + ds[1:] if nd > 1 else "")
        return f"{neg}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if dp <= 0:
        return f"{neg}0.{'0' * -dp}{ds}"
    if dp >= nd:
        return f"{neg}{ds}{'0' * (dp - nd)}"
    return f"{neg}{ds[:dp]}.{ds[dp:]}"


def _go_sharp_v(v):
    """An approximation of %#v for decoded JSON values."""
    if v is None:
        return "interface {}(nil)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return go_quote(v)
    if isinstance(v, int) and INT64_MIN <= v <= INT64_MAX:
        return str(v)
    if isinstance(v, (int, float)):
        return go_float(float(v))
    if isinstance(v, list):
        return "[]interface {}{" + ", ".join(map(_go_sharp_v, v)) + "}"
    return "map[string]interface {}{" + ", ".join(
        f"{go_quote(k)}:{_go_sharp_v(v[k])}" for k in sorted(v)) + "}"


def go_value(v):
    """How field.Error.ErrorBody prints a bad value."""
    if v is None:
        return '"null"'
    if isinstance(v, (list, dict)):
        return _go_sharp_v(v)
    if isinstance(v, str):
        return go_quote(v)
    return _go_sharp_v(v)


# -- JSON values as Go's unstructured decoding sees them ----------------------


def _is_int64(v):
    return (isinstance(v, int) and not isinstance(v, bool)
            and INT64_MIN <= v <= INT64_MAX)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_float(v):
    try:
        return float(v)
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")


def _schema_info(v):
    """(JSON type, format) of a decoded value (type.go schemaInfoForType):
    integers that do not fit an int64 are float64s, as in apimachinery's
    JSON decoding."""
    if isinstance(v, bool):
        return "boolean", ""
    if isinstance(v, str):
        return "string", ""
    if _is_int64(v):
        return "integer", "int64"
    if isinstance(v, (int, float)):
        return "number", "float64"
    if isinstance(v, list):
        return "array", ""
    return "object", ""


def _is_json_integer(f):
    return (f == f and -MAX_JSON_FLOAT <= f <= MAX_JSON_FLOAT
            and f == int(f))


# -- pruning (decode) ---------------------------------------------------------


def _join(path, key):
    return f"{path}.{key}" if path else key


def _prune(x, s, path, unknown, root=False):
    """pruning.go prune: drops (and records) the fields s does not know."""
    if isinstance(s, dict) and s.get("x-kubernetes-preserve-unknown-fields"):
        return _skip_prune(x, s, path, unknown)
    if isinstance(x, dict):
        if s is None:
            for k in sorted(x):
                unknown.append(_join(path, k))
            x.clear()
            return
        props = s.get("properties") or {}
        addl = s.get("additionalProperties")
        for k in list(x):
            if root and k in ("apiVersion", "kind", "metadata"):
                continue
            if k in props:
                _prune(x[k], props[k], _join(path, k), unknown)
            elif addl is not None and addl is not False:
                _prune(x[k], addl if isinstance(addl, dict) else None,
                       _join(path, k), unknown)
            else:
                unknown.append(_join(path, k))
                del x[k]
    elif isinstance(x, list):
        items = s.get("items") if isinstance(s, dict) else None
        for i, v in enumerate(x):
            _prune(v, items, f"{path}[{i}]", unknown)


def _skip_prune(x, s, path, unknown):
    if isinstance(x, dict):
        props = s.get("properties") or {}
        addl = s.get("additionalProperties")
        for k in list(x):
            if k in props:
                _prune(x[k], props[k], _join(path, k), unknown)
            elif isinstance(addl, dict):
                _prune(x[k], addl, _join(path, k), unknown)
    elif isinstance(x, list) and isinstance(s.get("items"), dict):
        for i, v in enumerate(x):
            _skip_prune(v, s["items"], f"{path}[{i}]", unknown)


def _prune_nulls(x, s):
    """prunenulls.go: nulls of non-nullable fields without a default go."""
    if not isinstance(s, dict):
        return
    if isinstance(x, dict):
        props = s.get("properties") or {}
        addl = s.get("additionalProperties")
        for k in list(x):
            ps = props.get(k)
            if ps is None and isinstance(addl, dict):
                ps = addl
            if ps is None:
                continue
            if x[k] is None and not ps.get("nullable") and "default" not in ps:
                del x[k]
            else:
                _prune_nulls(x[k], ps)
    elif isinstance(x, list):
        for v in x:
            _prune_nulls(v, s.get("items"))


def schema_decode(kind, obj, opts, verb):
    """What decoding `obj` (a request body, or a patched object for verb
    "patch") does for a kind with a schema: unknown fields and non-nullable
    nulls are pruned in place; with fieldValidation=Strict unknown fields
    are a 400, with Warn (the default) Warning headers."""
    if kind.schema is None:
        return
    opts = opts or WriteOptions()
    unknown = []
    md = obj.get("metadata")
    if isinstance(md, dict):
        for k in sorted(md):
            if k not in OBJECT_META_FIELDS:
                unknown.append(f"metadata.{k}")
                del md[k]
    pruned = []
    _prune(obj, kind.schema, "", pruned, root=True)
    unknown += sorted(pruned)
    _prune_nulls(obj, kind.schema)
    errs = [f"unknown field {json.dumps(p)}" for p in unknown]
    if not errs:
        return
    if opts.directive == "Strict":
        msg = "strict decoding error: " + ", ".join(errs)
        if verb != "patch":                 # handlers' transformDecodeError
            msg = (f'{kind.kind} in version "{kind.version}" cannot be '
                   f'handled as a {kind.kind}: {msg}')
        raise err_bad_request(msg)
    if opts.directive == "Warn":
        for e in errs:
            opts.warn(e)


# -- validation --------------------------------------------------------------


def _field(name):
    """kubeOpenAPIResultToFieldErrors: the field is the error's name without
    a leading "."; errors without a name get the nil path."""
    if not name or name == ".":
        return "<nil>"
    return name[1:] if name.startswith(".") else name


def _invalid(name, value, msg):
    return ("FieldValueInvalid", _field(name),
            f"Invalid value: {go_value(value)}: {msg}")


def _type_invalid(name, type_name, value):
    msg = f"{name} in body must be of type {type_name}: {go_quote(value)}"
    return ("FieldValueTypeInvalid", _field(name),
            f"Invalid value: {go_quote(value)}: {msg}")


def _format_of(s):
    f = s.get("format") or ""
    return f if f.replace("-", "") in SUPPORTED_FORMATS else ""


_RX_DATE = re.compile(r"^([0-9]{4})-([0-9]{2})-([0-9]{2})$")
_RX_TIME = re.compile(
    r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")


def _is_date(v):
    m = _RX_DATE.match(v)
    return bool(m) and "01" <= m.group(2) <= "12" and \
        "01" <= m.group(3) <= "31"


def _is_date_time(v):
    """strfmt IsDateTime."""
    if len(v) < 4:
        return False
    parts = v.lower().split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    m = _RX_TIME.match(parts[1])
    return bool(m) and m.group(1) <= "23" and m.group(2) <= "59" and \
        m.group(3) <= "59"


_FORMAT_CHECKS = {"datetime": _is_date_time, "date": _is_date}


def _check_type(s, v, name):
    """type.go typeValidator.Validate."""
    if s.get("x-kubernetes-int-or-string"):
        types = ["integer", "string"]
    elif s.get("type"):
        types = [s["type"]]
    else:
        types = []
    fmt = _format_of(s)
    if not types and not fmt:
        return []
    if v is None:
        if types and not s.get("nullable"):
            return [_type_invalid(name, ",".join(types), "null")]
        return []
    sch, dfmt = _schema_info(v)
    float_int = (sch == "number" and "integer" in types and
                 _is_json_integer(_as_float(v)))
    int_float = sch == "integer" and "number" in types
    scalar = not isinstance(v, (str, list))
    if scalar and fmt and not (sch in types or dfmt == fmt or float_int or
                               int_float):
        return [_type_invalid(name, fmt, dfmt)]
    if not ("number" in types or "integer" in types) and fmt and not scalar:
        return []
    if not (sch in types or float_int or int_float):
        return [_type_invalid(name, ",".join(types), sch)]
    return []


def _check_string(s, v, name):
    """validator.go stringValidator: the first failing check only."""
    n = len(v)
    if s.get("maxLength") is not None and n > s["maxLength"]:
        return [("FieldValueTooLong", _field(name),
                 f"Too long: may not be more than {int(s['maxLength'])} "
                 f"bytes")]
    if s.get("minLength") is not None and n < s["minLength"]:
        return [_invalid(name, v, f"{name} in body should be at least "
                                  f"{int(s['minLength'])} chars long")]
    p = s.get("pattern")
    if p:
        if p not in _PATTERNS:
            _compile_patterns({"pattern": p})
        rx = _PATTERNS.get(p)
        if rx is not None and not rx.search(v):
            return [_invalid(name, v, f"{name} in body should match '{p}'")]
    return []


def _check_format(s, v, name):
    check = _FORMAT_CHECKS.get(_format_of(s).replace("-", ""))
    if check is None or check(v):
        return []
    fmt = _format_of(s)
    msg = f"{name} in body must be of type {fmt}: {go_quote(v)}"
    return [("FieldValueTypeInvalid", _field(name),
             f"Invalid value: {go_quote(v)}: {msg}")]


def _check_number(s, v, name):
    """validator.go numberValidator (multipleOf, minimum, maximum) with the
    native int64 comparisons of values.go."""
    out = []
    is_int = _is_int64(v)
    fv = _as_float(v)

    def bound(b):
        return int(b) if is_int else float(b)

    def shown(b):
        return str(b) if is_int else go_float(b)

    mo = s.get("multipleOf")
    if mo:
        if is_int and int(mo) != 0:
            bad = v % int(mo) != 0
            factor = str(int(mo))
        else:
            q = (1 / mo * fv) if mo < 1 else fv / mo
            bad = not _is_json_integer(q)
            factor = go_float(float(mo))
        if bad:
            out.append(_invalid(name, v, f"{name} in body should be a "
                                         f"multiple of {factor}"))
    if s.get("minimum") is not None:
        m, excl = bound(s["minimum"]), bool(s.get("exclusiveMinimum"))
        x = v if is_int else fv
        if x < m or (excl and x <= m):
            rel = "greater than" if excl else "greater than or equal to"
            out.append(_invalid(name, v, f"{name} in body should be {rel} "
                                         f"{shown(m)}"))
    if s.get("maximum") is not None:
        m, excl = bound(s["maximum"]), bool(s.get("exclusiveMaximum"))
        x = v if is_int else fv
        if x > m or (excl and x >= m):
            rel = "less than" if excl else "less than or equal to"
            out.append(_invalid(name, v, f"{name} in body should be {rel} "
                                         f"{shown(m)}"))
    return out


def _enum_has(enum, v):
    cv = canonical(v)
    for e in enum:
        if canonical(e) == cv:
            return True
        if _is_number(e) and _is_number(v) and _as_float(e) == _as_float(v):
            return True
    return False


def _check_enum(s, v, name):
    enum = s.get("enum")
    if not enum or _enum_has(enum, v):
        return []
    vals = ", ".join(go_quote(e if isinstance(e, str) else
                              json.dumps(e, separators=(",", ":")))
                     for e in enum)
    return [("FieldValueNotSupported", _field(name),
             f"Unsupported value: {go_value(v)}: supported values: {vals}")]


def _check_object(s, v, name):
    """object_validator.go; properties in schema order (Go iterates a map)."""
    out = []
    props = s.get("properties") or {}
    addl = s.get("additionalProperties")
    if addl is False:
        for k in sorted(v):
            if k not in props:
                out.append(("FieldValueInvalid", _field(name),
                            f"Invalid value: {go_quote(k)}: {name}.{k} in "
                            f"body is a forbidden property"))
    elif isinstance(addl, dict):
        for k in sorted(v):
            if k not in props:
                out += schema_errors(addl, v[k], f"{name}.{k}")
    for k, ps in props.items():
        if k in v:
            out += schema_errors(ps, v[k], _join(name, k))
    for k in s.get("required") or []:
        if k not in v:
            out.append(("FieldValueRequired", _field(f"{name}.{k}"),
                        "Required value"))
    return out


def schema_errors(s, v, name=""):
    """SchemaValidator.Validate of `v` at `name` against schema `s`, as
    field-error causes [(reason, field, message)]."""
    if not isinstance(s, dict):
        return []
    out = _check_type(s, v, name)
    if v is None:
        return out + _check_enum(s, v, name)
    if isinstance(v, str):
        out += _check_string(s, v, name)
        out += _check_format(s, v, name)
    elif _is_number(v):
        out += _check_number(s, v, name)
    elif isinstance(v, list):
        items = s.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(v):
                out += schema_errors(items, item, f"{name}[{i}]")
        if s.get("minItems") is not None and len(v) < s["minItems"]:
            out.append(_invalid(name, len(v), f"{name} in body should have "
                                              f"at least {int(s['minItems'])}"
                                              f" items"))
        if s.get("maxItems") is not None and len(v) > s["maxItems"]:
            out.append(("FieldValueTooMany", _field(name),
                        f"Too many: {len(v)}: must have at most "
                        f"{int(s['maxItems'])} items"))
    out += _check_enum(s, v, name)
    if isinstance(v, dict):
        out += _check_object(s, v, name)
    return out


def schema_causes(kind, obj):
    if kind.schema is None:
        return []
    return schema_errors(kind.schema, obj)


# ---------------------------------------------------------------------------
# Discovery


def discovery_apis():
    groups = collections.OrderedDict()
    for (g, v) in GV:
        if g:
            groups.setdefault(g, []).append(v)
    out = []
    for g, versions in groups.items():
        vs = [{"groupVersion": f"{g}/{v}", "version": v} for v in versions]
        out.append({"name": g, "versions": vs, "preferredVersion": vs[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}


def discovery_resources(group, version):
    res = []
    for k in GV[(group, version)].values():
        res.append({"name": k.plural, "singularName": k.singular,
                    "namespaced": True, "kind": k.kind,
                    "verbs": ["create", "delete", "deletecollection", "get",
                              "list", "patch", "update", "watch"]})
        if k.short:
            res[-1]["shortNames"] = k.short
        if k.status:
            res.append({"name": k.plural + "/status", "singularName": "",
                        "namespaced": True, "kind": k.kind,
                        "verbs": ["get", "patch", "update"]})
    if not group:
        res.insert(0, {"name": "namespaces", "singularName": "namespace",
                       "namespaced": False, "kind": "Namespace",
                       "verbs": ["get", "list"], "shortNames": ["ns"]})
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": res}


def openapi_index():
    paths = {}
    for (g, v) in GV:
        p = f"apis/{g}/{v}" if g else "api/v1"
        paths[p] = {"serverRelativeURL": f"/openapi/v3/{p}?hash=FAKE"}
    return {"paths": paths}


def openapi_gv(group, version):
    paths = {}
    for k in GV[(group, version)].values():
        paths[f"{k.prefix}/namespaces/{{namespace}}/{k.plural}/{{name}}"] = {
            "patch": {
                "x-kubernetes-group-version-kind": {
                    "group": group, "version": version, "kind": k.kind},
                "parameters": [{"name": "fieldValidation", "in": "query",
                                "schema": {"type": "string"}}],
                "requestBody": {"content": {
                    MT_MERGE_PATCH: {"schema": {"type": "object"}}}},
                "responses": {"200": {"description": "OK"}},
            }}
    return {"openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": paths, "components": {"schemas": {}}}


def namespace_obj(ns, created):
    return {"kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": ns,
                         "uid": str(uuid.uuid5(uuid.NAMESPACE_URL,
                                               "ns/" + ns)),
                         "creationTimestamp": created,
                         "labels": {"kubernetes.io/metadata.name": ns}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"}}


# ---------------------------------------------------------------------------
# RBAC (rbac.authorization.k8s.io/v1), for one restricted identity


class Rbac:
    """The authorizer of a cluster with RBAC, over the ClusterRoles, Roles
    and bindings of YAML files: what a user (a service account's
    "system:serviceaccount:NS:NAME") may do. As the RBAC authorizer does:
    the rules of every ClusterRoleBinding, and of the RoleBindings of the
    request's namespace, whose subjects name the user or one of its groups;
    a rule matches when its verbs, apiGroups and resources (with
    "resource/subresource" and "*") cover the request, and its
    resourceNames, when it has any, name the object."""

    def __init__(self, paths, user):
        import yaml
        docs = []
        for path in paths:
            with open(path, encoding="utf-8") as f:
                docs += [d for d in yaml.safe_load_all(f)
                         if isinstance(d, dict)]
        self.user = user
        self.groups = {"system:authenticated"}
        if user.startswith("system:serviceaccount:"):
            ns = user.split(":")[2]
            self.groups |= {"system:serviceaccounts",
                            f"system:serviceaccounts:{ns}"}
        self.cluster_roles, self.roles, self.bindings = {}, {}, []
        for d in docs:
            md = d.get("metadata") or {}
            kind = d.get("kind")
            if kind == "ClusterRole":
                self.cluster_roles[md["name"]] = d.get("rules") or []
            elif kind == "Role":
                self.roles[(md["namespace"], md["name"])] = \
                    d.get("rules") or []
            elif kind in ("ClusterRoleBinding", "RoleBinding"):
                self.bindings.append(
                    (md.get("namespace") if kind == "RoleBinding" else None,
                     d["roleRef"], d.get("subjects") or []))

    def _subject(self, s, binding_ns):
        kind, name = s.get("kind"), s.get("name")
        if kind == "ServiceAccount":
            ns = s.get("namespace") or binding_ns
            return self.user == f"system:serviceaccount:{ns}:{name}"
        if kind == "User":
            return self.user == name
        if kind == "Group":
            return name in self.groups
        return False

    def _rules(self, ns):
        for bns, ref, subjects in self.bindings:
            if bns is not None and bns != ns:
                continue
            if not any(self._subject(s, bns) for s in subjects):
                continue
            if ref.get("kind") == "ClusterRole":
                yield from self.cluster_roles.get(ref.get("name"), [])
            elif ref.get("kind") == "Role" and bns is not None:
                yield from self.roles.get((bns, ref.get("name")), [])

    def allowed(self, verb, group, resource, sub, ns, name):
        res = f"{resource}/{sub}" if sub else resource
        for r in self._rules(ns):
            verbs = r.get("verbs") or []
            groups = r.get("apiGroups") or []
            resources = r.get("resources") or []
            names = r.get("resourceNames") or []
            if "*" not in verbs and verb not in verbs:
                continue
            if "*" not in groups and group not in groups:
                continue
            if not ("*" in resources or res in resources or
                    (sub and (f"*/{sub}" in resources or
                              f"{resource}/*" in resources))):
                continue
            if names and name not in names:
                continue
            return True
        return False

    def forbidden(self, verb, group, resource, sub, ns, name):
        """The 403 the apiserver answers (its message, word for word)."""
        res = f"{resource}/{sub}" if sub else resource
        qual = f"{resource}.{group}" if group else resource
        what = f'{qual} "{name}"' if name else qual
        where = (f'in the namespace "{ns}"' if ns else "at the cluster scope")
        msg = (f'{what} is forbidden: User "{self.user}" cannot {verb} '
               f'resource "{res}" in API group "{group}" {where}')
        details = {"kind": resource}
        if name:
            details["name"] = name
        if group:
            details["group"] = group
        return ApiError(403, status_body(403, "Forbidden", msg, details))


# ---------------------------------------------------------------------------
# Fault injection, delays and the request log (/_fake)


class Control:
    def __init__(self):
        self.lock = threading.Lock()
        self.faults = []      # dicts with status, count, retry_after, ...
        self.delays = []      # dicts with ms, count, match, method
        self.expiries = []    # dicts with count, match: continue tokens
        self.requests = []

    @staticmethod
    def _matches(rule, method, target):
        if rule.get("method") and rule["method"].upper() != method:
            return False
        return not rule.get("match") or rule["match"] in target

    def take(self, rules, method, target):
        with self.lock:
            for r in rules:
                if r["count"] > 0 and self._matches(r, method, target):
                    r["count"] -= 1
                    if r["count"] == 0:
                        rules.remove(r)
                    return dict(r)
        return None

    def record(self, entry):
        with self.lock:
            self.requests.append(entry)
            if len(self.requests) > 100000:
                del self.requests[:50000]


# ---------------------------------------------------------------------------
# HTTP


def truthy(v):
    return v in ("1", "t", "T", "true", "TRUE", "True")


def warning_headers(opts):
    """RFC 7234 Warning headers, as apimachinery NewWarningHeader writes
    them: 299 - "text" with \\ and \" escaped."""
    out = []
    for text in (opts.warnings if opts is not None else ()):
        quoted = text.replace("\\", "\\\\").replace('"', '\\"')
        out.append(("Warning", f'299 - "{quoted}"'))
    return out


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver/1"
    sys_version = ""
    disable_nagle_algorithm = True      # no 40 ms delayed-ACK stalls

    # -- plumbing -----------------------------------------------------------

    def setup(self):
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()

    def log_message(self, fmt, *args):      # replaced by log_line
        pass

    def log_line(self, code):
        sys.stderr.write(f"{self.command} {self.path} {code}\n")
        sys.stderr.flush()

    def answering(self, code):
        """Record the answer's status in the request log (as an audit
        log's responseStatus.code) before it goes out, so that a client
        that has it finds it there."""
        entry = getattr(self, "entry", None)
        if entry is not None:
            entry["code"] = code

    def send_bytes(self, code, data, ctype="application/json", headers=None):
        if getattr(self, "swallow", False):
            return                      # an "after" fault answers instead
        self.answering(code)
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        if isinstance(headers, dict):
            headers = headers.items()
        for k, v in headers or ():
            self.send_header(k, v)
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(data)     # one write: head + body
        self.flush_headers()
        self.log_line(code)

    def send_json(self, code, obj, headers=None):
        data = json.dumps(obj, separators=(",", ":"),
                          ensure_ascii=False).encode()
        self.send_bytes(code, data, headers=headers)

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

    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def dispatch(self):
        srv = self.server
        try:
            body = self.read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        u = urllib.parse.urlsplit(self.path)
        path = u.path
        query = {k: v[0] for k, v in urllib.parse.parse_qs(
            u.query, keep_blank_values=True).items()}
        method = self.command
        self.entry = None               # this request's, when an API one
        try:
            if path == "/_fake" or path.startswith("/_fake/"):
                return self.control(method, path, body)
            ctype = self.headers.get("Content-Type") or ""
            entry = {
                "method": method, "path": path, "query": u.query,
                "content_type": ctype,
                "authorization_present": "Authorization" in self.headers,
                "accept": self.headers.get("Accept") or "",
                "body": body.decode("utf-8", "replace") if body else None,
                "time": time.time(),
                "user": None,           # set below: values change, not keys
                "forbidden": False,
                "code": None}           # the status answered, when known
            srv.control.record(entry)
            self.entry = entry
            self.restricted = False
            if srv.token is not None:
                auth = self.headers.get("Authorization") or ""
                scheme, _, tok = auth.partition(" ")
                tok = tok.strip().encode()
                if scheme.lower() != "bearer":
                    raise err_unauthorized()
                if srv.admin_token is not None and hmac.compare_digest(
                        tok, srv.admin_token.encode()):
                    pass                # cluster-admin: anything goes
                elif hmac.compare_digest(tok, srv.token.encode()):
                    self.restricted = srv.rbac is not None
                else:
                    raise err_unauthorized()
            entry["user"] = srv.rbac.user if self.restricted else "admin"
            target = path + ("?" + u.query if u.query else "")
            delay = srv.control.take(srv.control.delays, method, target)
            if delay:
                time.sleep(delay.get("ms", 0) / 1000.0)
            fault = srv.control.take(srv.control.faults, method, target)
            if fault and fault.get("after"):
                # the request takes effect, then its answer is lost
                self.swallow = True
                try:
                    self.route(method, path, query, body)
                except ApiError:
                    pass
                finally:
                    self.swallow = False
            if fault and fault.get("close"):
                self.close_connection = True
                self.answering("closed")
                self.log_line("closed")
                return
            if fault and "body" in fault:
                # a misbehaving server's (or proxy's) answer, as given:
                # JSON, or a string's bytes (watch event lines, say)
                if isinstance(fault["body"], str):
                    return self.send_bytes(int(fault["status"]),
                                           fault["body"].encode())
                return self.send_json(int(fault["status"]), fault["body"])
            if fault:
                code = int(fault["status"])
                # a real apiserver's 429 (max-in-flight, priority and
                # fairness) always says Retry-After: 1; null: none
                retry_after = fault.get("retry_after",
                                        1 if code == 429 else None)
                raise fault_error(code, retry_after, self.headers.get(
                    "Authorization", "") if fault.get("echo_auth") else None,
                    fault.get("message"))
            self.route(method, path, query, body)
        except ApiError as e:
            self.send_json(e.code, e.body, e.headers)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except Exception as e:          # a bug in the fake: say so loudly
            traceback.print_exc()
            self.send_json(500, status_body(
                500, "InternalError", f"Internal error occurred: {e!r}"))

    # -- /_fake -------------------------------------------------------------

    def control(self, method, path, body):
        srv = self.server
        ctl = srv.control
        if self.client_address[0] not in ("127.0.0.1", "::1"):
            raise ApiError(403, status_body(403, "Forbidden", "forbidden"))
        try:
            arg = json.loads(body) if body.strip() else {}
        except ValueError as e:
            raise err_bad_request(f"json parse error: {e}")
        if path == "/_fake/faults":
            if method == "POST":
                rules = arg if isinstance(arg, list) else [arg]
                for r in rules:
                    if not isinstance(r, dict) or not (isinstance(
                            r.get("status"), int) or r.get("close")):
                        raise err_bad_request("a fault needs an integer "
                                              "'status' or 'close'")
                    r.setdefault("count", 1)
                with ctl.lock:
                    ctl.faults.extend(rules)
                    return self.send_json(200, {"faults": ctl.faults})
            if method == "GET":
                with ctl.lock:
                    return self.send_json(200, {"faults": ctl.faults})
            if method == "DELETE":
                with ctl.lock:
                    ctl.faults.clear()
                return self.send_json(200, {"faults": []})
        elif path == "/_fake/delay":
            return self.control_rules(method, arg, ctl.delays, "delays",
                                      count=1, ms=0)
        elif path == "/_fake/expire_continue":
            return self.control_rules(method, arg, ctl.expiries,
                                      "expiries", count=1)
        elif path == "/_fake/end_watches":
            if method == "POST":
                mode = arg.get("mode", "close") if isinstance(arg, dict) \
                    else None
                if mode not in ("close", "cut", "expire", "error"):
                    raise err_bad_request("mode is \"close\", \"cut\", "
                                          "\"expire\" or \"error\"")
                n = srv.store.end_watches(mode)
                return self.send_json(200, {"watches": n})
        elif path == "/_fake/compact":
            if method == "POST":
                rv, floor = srv.store.compact()
                return self.send_json(200, {"resourceVersion": str(rv),
                                            "oldest": str(floor)})
        elif path == "/_fake/requests":
            if method == "GET":
                with ctl.lock:
                    reqs = list(ctl.requests)
                return self.send_json(200, reqs)
            if method == "DELETE":
                with ctl.lock:
                    ctl.requests.clear()
                return self.send_json(200, [])
        elif path == "/_fake/state":
            if method == "GET":
                st = srv.store
                with st.lock:
                    out = {"resourceVersion": str(st.rv),
                           "oldest": str(st.floor),
                           "history": len(st.history),
                           "objects": len(st.objects),
                           "watchers": len(st.watchers),
                           "continues": len(st.snapshots),
                           "schemas": [k.kind for k in KINDS
                                       if k.schema is not None]}
                return self.send_json(200, out)
        else:
            raise err_route_not_found()
        raise err_method()

    def control_rules(self, method, arg, rules, key, **defaults):
        """POST adds the rule arg (with defaults), DELETE drops them all;
        the answer is {key: the rules pending}."""
        ctl = self.server.control
        if method == "POST":
            if not isinstance(arg, dict):
                raise err_bad_request("expected an object")
            for k, v in defaults.items():
                arg.setdefault(k, v)
            with ctl.lock:
                rules.append(arg)
                return self.send_json(200, {key: rules})
        if method == "DELETE":
            with ctl.lock:
                rules.clear()
            return self.send_json(200, {key: []})
        raise err_method()

    # -- API routing --------------------------------------------------------

    def authorize(self, verb, group, resource, sub, ns, name):
        """With --rbac, the restricted token may do only what the RBAC
        objects grant it; a refusal is marked in the request log."""
        rbac = self.server.rbac
        if not self.restricted or rbac.allowed(verb, group, resource, sub,
                                               ns, name):
            return
        self.entry["forbidden"] = True
        raise rbac.forbidden(verb, group, resource, sub, ns, name)

    def admit_owner_references(self, kind, ns, name, body):
        """With --rbac, the OwnerReferencesPermissionEnforcement admission
        plugin (on in OpenShift, for one): an ownerReference with
        blockOwnerDeletion, new on the object, needs "update" on its
        owner's finalizers subresource."""
        rbac = self.server.rbac
        if not self.restricted:
            return
        try:
            obj = json.loads(body or b"{}")
        except ValueError:
            return                  # the write itself reports it
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        refs = (meta or {}).get("ownerReferences") or []
        old = []
        if name is not None:
            try:
                old = self.server.store.get(kind, ns, name)["metadata"].get(
                    "ownerReferences") or []
            except ApiError:
                old = []
        for r in refs:
            if not isinstance(r, dict) or not r.get("blockOwnerDeletion") \
                    or r in old:
                continue
            owner = next((k for k in KINDS
                          if k.api_version == r.get("apiVersion") and
                          k.kind == r.get("kind")), None)
            if owner is not None and rbac.allowed(
                    "update", owner.group, owner.plural, "finalizers", ns,
                    r.get("name")):
                continue
            self.entry["forbidden"] = True
            qual = f"{kind.plural}.{kind.group}" if kind.group else \
                kind.plural
            oname = name or (meta or {}).get("name") or ""
            raise ApiError(403, status_body(
                403, "Forbidden",
                f'{qual} "{oname}" is forbidden: cannot set '
                "blockOwnerDeletion if an ownerReference refers to a "
                "resource you can't set finalizers on: , <nil>",
                {"name": oname, "group": kind.group, "kind": kind.plural}))

    def route(self, method, path, query, body):
        srv = self.server
        segs = [urllib.parse.unquote(s) for s in path.split("/") if s]
        if not segs:
            raise err_route_not_found()
        simple = {"/version": lambda: VERSION_INFO,
                  "/api": lambda: {
                      "kind": "APIVersions", "versions": ["v1"],
                      "serverAddressByClientCIDRs": [{
                          "clientCIDR": "0.0.0.0/0",
                          "serverAddress": f"127.0.0.1:{srv.port}"}]},
                  "/apis": discovery_apis,
                  "/openapi/v3": openapi_index}
        if path.rstrip("/") in simple:
            if method != "GET":
                raise err_method()
            return self.send_json(200, simple[path.rstrip("/")]())
        if path in ("/healthz", "/livez", "/readyz"):
            if method != "GET":
                raise err_method()
            return self.send_bytes(200, b"ok", "text/plain; charset=utf-8")
        if segs[0] == "openapi" and len(segs) >= 3 and segs[1] == "v3":
            gvp = segs[2:]
            key = ("", "v1") if gvp == ["api", "v1"] else (
                (gvp[1], gvp[2]) if len(gvp) == 3 and gvp[0] == "apis"
                else None)
            if key in GV:
                if method != "GET":
                    raise err_method()
                return self.send_json(200, openapi_gv(*key))
            raise err_route_not_found()
        if segs[0] == "api":
            if len(segs) < 2 or segs[1] != "v1":
                raise err_route_not_found()
            group, version, rest = "", "v1", segs[2:]
        elif segs[0] == "apis":
            group = segs[1]
            versions = [v for (g, v) in GV if g == group]
            if not versions:
                raise err_route_not_found()
            if len(segs) == 2:
                if method != "GET":
                    raise err_method()
                vs = [{"groupVersion": f"{group}/{v}", "version": v}
                      for v in versions]
                return self.send_json(200, {
                    "kind": "APIGroup", "apiVersion": "v1", "name": group,
                    "versions": vs, "preferredVersion": vs[0]})
            version = segs[2]
            if (group, version) not in GV:
                raise err_route_not_found()
            rest = segs[3:]
        else:
            raise err_route_not_found()
        if not rest:
            if method != "GET":
                raise err_method()
            return self.send_json(200, discovery_resources(group, version))
        force_watch = False
        if rest[0] == "watch":
            force_watch, rest = True, rest[1:]
            if not rest:
                raise err_route_not_found()
        kinds = GV[(group, version)]
        if rest[0] == "namespaces" and len(rest) <= 2:
            if group:
                raise err_route_not_found()
            if method != "GET":
                raise err_method()
            self.authorize("get" if len(rest) == 2 else "list", "",
                           "namespaces", None, None,
                           rest[1] if len(rest) == 2 else None)
            if len(rest) == 2:
                return self.send_json(200, namespace_obj(rest[1],
                                                         srv.started))
            return self.send_json(200, {
                "kind": "NamespaceList", "apiVersion": "v1",
                "metadata": {"resourceVersion": str(srv.store.rv)},
                "items": [namespace_obj(n, srv.started)
                          for n in srv.store.namespaces()]})
        if rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
            kind = kinds.get(rest[0])
            if kind is None or len(rest) > 3:
                raise err_route_not_found()
            name = rest[1] if len(rest) > 1 else None
            sub = rest[2] if len(rest) > 2 else None
            if sub is not None and (sub != "status" or not kind.status):
                raise err_route_not_found()
        else:
            kind = kinds.get(rest[0])
            if kind is None or len(rest) != 1:
                raise err_route_not_found()
            ns, name, sub = None, None, None
            if method != "GET":
                raise err_method()
        watch = force_watch or truthy(query.get("watch", ""))
        verb = {"GET": "watch" if watch and sub is None else (
                    "get" if name is not None else "list"),
                "POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name is not None
                else "deletecollection"}.get(method)
        if verb is not None:
            self.authorize(verb, group, kind.plural, sub, ns, name)
        if method in ("POST", "PUT") and sub is None:
            self.admit_owner_references(kind, ns, name, body)
        if name is None:
            if method == "GET":
                if watch:
                    return self.watch(kind, ns, None, query)
                return self.send_json(200, self.list(kind, ns, query))
            if method == "POST":
                opts = self.write_options("CreateOptions", query)
                return self.send_json(201, srv.store.create(
                    kind, ns, self.parse_object(kind, body), opts),
                    warning_headers(opts))
            if method == "DELETE":
                m = self.matcher(kind, ns, None, query)
                return self.send_json(200, srv.store.delete_collection(
                    kind, m, self.delete_options(body, query)))
            raise err_method()
        if method == "GET":
            if watch and sub is None:
                return self.watch(kind, ns, name, query)
            return self.send_json(200, srv.store.get(kind, ns, name))
        if method == "PUT":
            opts = self.write_options("UpdateOptions", query)
            return self.send_json(200, srv.store.update(
                kind, ns, name, self.parse_object(kind, body), sub, opts),
                warning_headers(opts))
        if method == "PATCH":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0]
            ctype = ctype.strip().lower()
            if ctype not in (MT_MERGE_PATCH, MT_JSON_PATCH) and not (
                    ctype == MT_SMP and kind.builtin):
                raise err_unsupported_media(kind)
            opts = self.write_options("PatchOptions", query)
            try:
                patch = json.loads(body or b"null")
            except ValueError as e:
                raise err_bad_request(f"error decoding patch: {e}")
            return self.send_json(200, srv.store.patch(
                kind, ns, name, ctype, patch, sub, opts),
                warning_headers(opts))
        if method == "DELETE" and sub is None:
            obj, removed = srv.store.delete(
                kind, ns, name, self.delete_options(body, query))
            if removed and kind.builtin:
                d = {"name": name}
                if kind.group:
                    d["group"] = kind.group
                d["kind"] = kind.plural
                d["uid"] = obj["metadata"]["uid"]
                return self.send_json(200, {
                    "kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Success", "details": d})
            return self.send_json(200, obj)
        raise err_method()

    def write_options(self, what, query):
        """The fieldValidation query parameter (ValidateFieldValidation:
        case-sensitive; empty means Warn)."""
        fv = query.get("fieldValidation", "")
        if fv not in FIELD_VALIDATION:
            msg = (f"Unsupported value: {go_quote(fv)}: supported values: " +
                   ", ".join(go_quote(v) for v in FIELD_VALIDATION))
            raise ApiError(422, status_body(
                422, "Invalid", f'{what}.meta.k8s.io "" is invalid: '
                f"fieldValidation: {msg}",
                {"group": "meta.k8s.io", "kind": what,
                 "causes": [{"reason": "FieldValueNotSupported",
                             "message": msg, "field": "fieldValidation"}]}))
        return WriteOptions(fv)

    def parse_object(self, kind, body):
        # An empty Content-Type means JSON (NegotiateInputSerializer);
        # protobuf and YAML bodies are not understood here.
        ctype = (self.headers.get("Content-Type") or "").split(";")[0]
        if ctype.strip().lower() not in ("", "application/json", "*/*"):
            raise ApiError(415, status_body(
                415, "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted "
                "media types include: application/json"))
        try:
            obj = json.loads(body)
        except ValueError as e:
            raise err_bad_request(
                f"the object provided is unrecognized (must be of type "
                f"{kind.kind}): couldn't get version/kind; json parse error: "
                f"{e}")
        if not isinstance(obj, dict):
            raise err_bad_request(
                f"the object provided is unrecognized (must be of type "
                f"{kind.kind}): cannot unmarshal {type(obj).__name__} into "
                f"an object")
        av, k = obj.get("apiVersion"), obj.get("kind")
        if av not in (None, "") and av != kind.api_version:
            raise err_bad_request(
                f"the API version in the data ({av}) does not match the "
                f"expected API version ({kind.api_version})")
        if k not in (None, "") and k != kind.kind:
            raise err_bad_request(
                f"the kind in the data ({k}) does not match the expected "
                f"kind ({kind.kind})")
        if obj.get("metadata") is not None and not isinstance(
                obj["metadata"], dict):
            raise err_bad_request("metadata must be an object")
        return obj

    def delete_options(self, body, query):
        """DeleteOptions from the body when there is one, else from the
        query, as the apiserver decodes them; then validated."""
        opts = {}
        if body.strip():
            try:
                opts = json.loads(body)
            except ValueError as e:
                raise err_bad_request(f"json parse error: {e}")
            if not isinstance(opts, dict):
                raise err_bad_request("DeleteOptions must be an object")
        else:
            if query.get("propagationPolicy"):
                opts["propagationPolicy"] = query["propagationPolicy"]
            if query.get("orphanDependents") in ("true", "false"):
                opts["orphanDependents"] = query["orphanDependents"] == "true"
        pol = opts.get("propagationPolicy")
        if pol not in (None, "", "Orphan", "Background", "Foreground"):
            msg = (f"Unsupported value: {json.dumps(pol)}: supported values: "
                   f'"Foreground", "Background", "Orphan", "nil"')
            raise delete_options_invalid("FieldValueNotSupported", msg)
        if pol and opts.get("orphanDependents") is not None:
            msg = (f"Invalid value: {json.dumps(pol)}: orphanDependents and "
                   "deletionPropagation cannot be both set")
            raise delete_options_invalid("FieldValueInvalid", msg)
        return opts

    def matcher(self, kind, ns, name, query):
        try:
            labels = parse_label_selector(query.get("labelSelector", ""))
            allowed = {"metadata.name", "metadata.namespace"}
            if kind.kind == "Secret":
                allowed.add("type")
            fields = parse_field_selector(query.get("fieldSelector", ""),
                                          allowed)
        except SelectorError as e:
            raise err_bad_request(str(e))
        if name is not None:
            fields.append(("metadata.name", "=", name))
        return Matcher(kind, ns, labels, fields)

    def list(self, kind, ns, query):
        """A list, whole or in chunks (limit, continue) as in the API
        concepts' "Retrieving large results sets in chunks"."""
        srv = self.server
        m = self.matcher(kind, ns, None, query)
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise err_bad_request(f"strconv.ParseInt: parsing "
                                  f"{go_quote(query['limit'])}: invalid "
                                  f"syntax")
        cont = query.get("continue") or None
        scope = (kind.plural, ns, query.get("labelSelector", ""),
                 query.get("fieldSelector", ""))
        if cont is not None:
            if query.get("resourceVersion", "") not in ("", "0"):
                raise err_bad_request("specifying resource version is not "
                                      "allowed when using continue")
            if srv.control.take(srv.control.expiries, "GET", self.path):
                srv.store.expire_continue(cont)
        return srv.store.list(kind, m, limit, cont, scope)

    # -- watch (§3) ---------------------------------------------------------

    def watch(self, kind, ns, name, query):
        srv = self.server
        m = self.matcher(kind, ns, name, query)
        bookmarks = truthy(query.get("allowWatchBookmarks", ""))
        send_initial = truthy(query.get("sendInitialEvents", ""))
        timeout = None
        if query.get("timeoutSeconds"):
            try:
                timeout = float(int(query["timeoutSeconds"]))
            except ValueError:
                raise err_bad_request(
                    f"invalid timeoutSeconds: {query['timeoutSeconds']!r}")
        initial, q, _ = srv.store.open_watch(
            kind, m, query.get("resourceVersion"), send_initial)
        self.answering(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.log_line(200)
        if q is None:                       # 410: one ERROR event, then EOF
            try:
                self.event("ERROR", json.dumps(initial,
                                               separators=(",", ":")))
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True
            return
        alive = True
        cut = False
        try:
            for etype, oj in initial:
                self.event(etype, oj)
            if send_initial and bookmarks:
                self.bookmark(kind, {"k8s.io/initial-events-end": "true"})
            deadline = time.monotonic() + timeout if timeout else None
            last = time.monotonic()
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                wait = 1.0
                if deadline is not None:
                    wait = min(wait, deadline - now)
                if bookmarks:
                    wait = min(wait, max(0.0, last + 1.0 - now))
                try:
                    ev = q.get(timeout=max(wait, 0.001))
                except queue.Empty:
                    now = time.monotonic()
                    if bookmarks and now - last >= 1.0:
                        if self.bookmark(kind, None, q):
                            last = now
                    elif self.client_gone():
                        alive = False
                        break
                    continue
                if isinstance(ev, EndWatch):
                    if ev.mode == "expire":
                        self.event("ERROR", json.dumps(status_body(
                            410, "Expired", WATCH_EXPIRED_MSG),
                            separators=(",", ":")))
                    elif ev.mode == "error":
                        self.event("ERROR", json.dumps(status_body(
                            500, "InternalError", WATCH_ERROR_MSG),
                            separators=(",", ":")))
                    if ev.mode in ("close", "expire", "error"):
                        break
                    cut = True
                    continue
                out = translate_event(ev, kind, m)
                if out and cut:
                    # half the line, then the connection drops
                    line = ('{"type":"%s","object":%s}\n' % out).encode()
                    self.chunk(line[:len(line) // 2])
                    self.connection.shutdown(socket.SHUT_RDWR)
                    alive = False
                    break
                if out:
                    self.event(*out)
                    last = time.monotonic()
            if alive:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError:
            alive = False
        finally:
            srv.store.close_watch(q)
        if not alive:
            self.close_connection = True

    def chunk(self, text):
        data = text.encode() if isinstance(text, str) else text
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def event(self, etype, obj_json):
        self.chunk('{"type":"%s","object":%s}\n' % (etype, obj_json))

    def bookmark(self, kind, annotations, q=None):
        st = self.server.store
        with st.lock:
            if q is not None and not q.empty():
                return False            # deliver the pending events first
            rv = st.rv
        md = {"resourceVersion": str(rv)}
        if annotations:
            md["annotations"] = annotations
        self.event("BOOKMARK", json.dumps(
            {"kind": kind.kind, "apiVersion": kind.api_version,
             "metadata": md}, separators=(",", ":")))
        return True

    def client_gone(self):
        """True when the peer closed the connection (a watch client going
        away), so that idle watches do not pile up."""
        sock = self.connection
        try:
            r, _, _ = select.select([sock], [], [], 0)
            if not r:
                return False
            sock.settimeout(0.05)
            try:
                data = sock.recv(1)
            finally:
                sock.settimeout(None)
            return data == b""
        except (socket.timeout, ssl.SSLWantReadError):
            return False
        except (OSError, ValueError):
            return True


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        e = sys.exc_info()[1]
        if isinstance(e, (ConnectionError, ssl.SSLError, socket.timeout,
                          TimeoutError)):
            sys.stderr.write(f"connection error: {e.__class__.__name__}: "
                             f"{e}\n")
        else:
            traceback.print_exc()
        sys.stderr.flush()


# ---------------------------------------------------------------------------
# Certificates


OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
"""


def make_certs(d):
    """Writes ca.crt, server.crt and server.key into d (EC P-256)."""
    work = tempfile.mkdtemp(prefix="certs-", dir=d)
    try:
        cnf = os.path.join(work, "openssl.cnf")
        with open(cnf, "w") as f:
            f.write(OPENSSL_CNF)
        env = dict(os.environ, OPENSSL_CONF=cnf)
        ca_key = os.path.join(work, "ca.key")
        csr = os.path.join(work, "server.csr")
        ca_crt = os.path.join(d, "ca.crt")
        srv_crt = os.path.join(d, "server.crt")
        srv_key = os.path.join(d, "server.key")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
              "-nodes"]
        cmds = [
            ["openssl", "req", "-x509", "-config", cnf, "-extensions",
             "ca_ext", *ec, "-keyout", ca_key, "-out", ca_crt, "-days",
             "3650", "-sha256", "-subj", "/CN=diverge-fake-kube-ca",
             "-set_serial", str(random.getrandbits(63))],
            ["openssl", "req", "-new", "-config", cnf, *ec, "-keyout",
             srv_key, "-out", csr, "-subj", "/CN=127.0.0.1"],
            ["openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey",
             ca_key, "-set_serial", str(random.getrandbits(63)), "-days",
             "825", "-sha256", "-extfile", cnf, "-extensions", "server_ext",
             "-out", srv_crt],
        ]
        for c in cmds:
            p = subprocess.run(c, env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(c[:3])} failed: {p.stderr}")
        os.chmod(srv_key, 0o600)
        return ca_crt, srv_crt, srv_key
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------
# main


def main(argv=None):
    ap = argparse.ArgumentParser(description="a fake kube-apiserver")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token", default=None,
                    help="require 'Authorization: Bearer TOKEN'")
    ap.add_argument("--rbac", action="append", default=[],
                    help="YAML file of RBAC objects: the --token identity "
                    "(--rbac-user) may then do only what they grant, and "
                    "the OwnerReferencesPermissionEnforcement admission "
                    "plugin applies to it; repeatable")
    ap.add_argument("--rbac-user",
                    default="system:serviceaccount:diverge-system:diverged",
                    help="the user the --token stands for under --rbac")
    ap.add_argument("--admin-token", default=None,
                    help="a second token, unrestricted (cluster-admin)")
    ap.add_argument("--plain-http", action="store_true",
                    help="serve http:// instead of https://")
    ap.add_argument("--history", type=int, default=1000,
                    help="watch events kept for resuming watches")
    ap.add_argument("--dir", default=None,
                    help="where to write ca.crt, server.crt, server.key")
    ap.add_argument("--ignore-stdin", action="store_true",
                    help="do not exit when stdin reaches end of file")
    ap.add_argument("--crd-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
        "crds"), help="where the CRD YAML files with the schemas are")
    args = ap.parse_args(argv)
    load_schemas(args.crd_dir)

    own_dir = args.dir is None
    d = tempfile.mkdtemp(prefix="fake-kube-") if own_dir else args.dir
    os.makedirs(d, exist_ok=True)

    def bye(*_):
        try:
            sys.stderr.flush()
        finally:
            if own_dir:
                shutil.rmtree(d, ignore_errors=True)
            os._exit(0)

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGINT, bye)

    try:
        ca_crt, srv_crt, srv_key = make_certs(d)
        srv = Server(("127.0.0.1", args.port), Handler)
    except Exception as e:
        sys.stderr.write(f"fake-kube-apiserver: {e}\n")
        if own_dir:
            shutil.rmtree(d, ignore_errors=True)
        return 1
    if not args.plain_http:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(srv_crt, srv_key)
        ctx.set_alpn_protocols(["http/1.1"])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True,
                                     do_handshake_on_connect=False)
    srv.port = srv.server_address[1]
    srv.token = args.token
    srv.admin_token = args.admin_token
    try:
        srv.rbac = Rbac(args.rbac, args.rbac_user) if args.rbac else None
    except Exception as e:
        sys.stderr.write(f"fake-kube-apiserver: --rbac: {e}\n")
        if own_dir:
            shutil.rmtree(d, ignore_errors=True)
        return 1
    srv.store = Store(max(0, args.history))
    srv.control = Control()
    srv.started = now_rfc3339()

    # Never outlive the parent: exit on EOF on a stdin pipe, or when the
    # parent dies and this process is re-parented.
    st = os.fstat(0) if not args.ignore_stdin else None
    if st is not None and (stat.S_ISFIFO(st.st_mode)
                           or stat.S_ISSOCK(st.st_mode)):
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

    scheme = "http" if args.plain_http else "https"
    sys.stdout.write(json.dumps({
        "port": srv.port, "ca_file": ca_crt,
        "server": f"{scheme}://127.0.0.1:{srv.port}",
        "token": args.token or "", "dir": d}) + "\n")
    sys.stdout.flush()
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        bye()


if __name__ == "__main__":
    sys.exit(main())
