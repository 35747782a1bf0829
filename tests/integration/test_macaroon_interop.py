"""Our macaroons against independent implementations, both ways.

Our side is tests/tools/macaroon_tool (the library behind a command line).
The other side is Debian's python3-pymacaroons (run with /usr/bin/python3:
the python3 on PATH may be a separate build that does not see Debian's
dist-packages) and the npm package "macaroon" (= go-macaroon's js-macaroon),
installed into $top_builddir/tests/node-cache/macaroon. Whichever of them is
available is used; with neither, everything is skipped.

For each implementation: a token we mint parses there to the same fields and
signature and verifies there; the same inputs minted there give the very
same token text, and verify here; and what only they produce (an empty
location field, V1, a caveat added by a holder, a third-party caveat) is
read here with the right outcome.
"""

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import traceback

TOP_SRCDIR = os.environ.get("top_srcdir") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
TOP_BUILDDIR = os.environ.get("top_builddir") or TOP_SRCDIR
TOOL = os.path.join(TOP_BUILDDIR, "tests", "tools", "macaroon_tool")
SYSTEM_PYTHON = "/usr/bin/python3"
NPM_PACKAGE = "macaroon@3.0.4"

KEY = bytes(range(0x40, 0x60))
OTHER_KEY = bytes(range(0x41, 0x61))
# shorter than the 16 bytes we take: never a root key, whoever signed
SHORT_KEY = bytes(range(0x40, 0x48))
NOW = int(time.time())


def rfc3339(t):
    return datetime.datetime.fromtimestamp(
        t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


CAVEATS = [
    "task_id = t1", "namespace = ns1", "repo = acme/shop",
    "branch = diverge/t1", "tools = bash,git", "models = claude-*,gpt-4o",
    "max_cost_usd = 5.00", "max_tokens = 200000",
    "expires = " + rfc3339(NOW + 3600),
]
LOCATION = "https://diverge.example"
MODEL = "claude-3-7-sonnet"


class Tap:
    """Minimal TAP producer; the plan is printed at the end."""

    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, name, detail=None):
        self.n += 1
        if cond:
            print("ok %d - %s" % (self.n, name))
        else:
            self.failed += 1
            print("not ok %d - %s" % (self.n, name))
            if detail is not None:
                for line in str(detail).splitlines()[:40]:
                    print("# " + line)
        sys.stdout.flush()
        return cond

    def eq(self, got, want, name):
        return self.ok(got == want, name, "got %r, want %r" % (got, want))

    def skip_all(self, why):
        print("1..0 # SKIP %s" % why)
        sys.exit(0)

    def done(self):
        print("1..%d" % self.n)
        sys.exit(1 if self.failed else 0)


# ---- our side ----

def tool(*args):
    p = subprocess.run([TOOL] + list(args), capture_output=True, text=True,
                       timeout=30)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


def mint(key, ident, loc, caveats):
    rc, out, err = tool("mint", key.hex(), ident, loc, *caveats)
    if rc != 0:
        raise RuntimeError("macaroon_tool mint: " + err)
    return out


def verify(token, key=KEY, model=MODEL, task="t1", ns="ns1", now=NOW):
    """Our verdict: "ok" or the reason."""
    rc, out, _ = tool("verify", key.hex(), token, task, ns, model or "-",
                      str(now))
    if (rc == 0) != (out == "ok"):
        return "exit status %d with %r" % (rc, out)
    return out


def signature(token):
    rc, out, err = tool("signature", token)
    return out if rc == 0 else "error: " + err


# ---- their side: one subprocess per batch of operations (JSON in/out) ----

PY_HELPER = r"""
import json, sys
from pymacaroons import Macaroon, Verifier, MACAROON_V1, MACAROON_V2

def text(x):
    return x.decode() if isinstance(x, bytes) else x

def run(op):
    key = bytes.fromhex(op.get("key", ""))
    if op["op"] == "mint":
        m = Macaroon(location=op["loc"], identifier=op["id"], key=key,
                     version=MACAROON_V1 if op.get("version") == 1
                     else MACAROON_V2)
        for c in op["caveats"]:
            m.add_first_party_caveat(c)
        tp = op.get("third_party")
        if tp:
            m.add_third_party_caveat(tp["loc"], bytes.fromhex(tp["key"]),
                                     tp["id"])
        return {"token": m.serialize()}
    m = Macaroon.deserialize(op["token"])
    if op["op"] == "verify":
        v = Verifier()
        for c in op["allow"]:
            v.satisfy_exact(c)
        try:
            return {"ok": bool(v.verify(m, key))}
        except Exception as e:
            return {"ok": False, "error": str(e)}
    if op["op"] == "parse":
        return {"id": text(m.identifier), "loc": text(m.location),
                "caveats": [text(c.caveat_id) for c in m.caveats],
                "sig": text(m.signature)}
    if op["op"] == "attenuate":
        m.add_first_party_caveat(op["caveat"])
        return {"token": m.serialize()}
    raise ValueError(op["op"])

print(json.dumps([run(op) for op in json.load(sys.stdin)]))
"""

# macaroon@3.0.4's ByteBuffer._grow() tests this._capacity, which nothing
# sets, so every append doubles the buffer and exportBinary() of a token
# with a dozen fields asks for gigabytes. The getter below supplies the
# missing property (the capacity is the backing array's length); it
# changes no byte of the output.
JS_HELPER = r"""
Object.defineProperty(Object.prototype, '_capacity', {
  configurable: true,
  get() { return this._buf instanceof Uint8Array ? this._buf.length
                                                 : undefined; },
});
const M = require(process.argv[1]);
const ops = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const bytes = h => Uint8Array.from(Buffer.from(h || '', 'hex'));
const text = b => Buffer.from(b).toString('utf8');
const run = op => {
  if (op.op === 'mint') {
    const m = M.newMacaroon({rootKey: bytes(op.key), identifier: op.id,
                             location: op.loc, version: op.version || 2});
    op.caveats.forEach(c => m.addFirstPartyCaveat(c));
    const tp = op.third_party;
    if (tp) m.addThirdPartyCaveat(bytes(tp.key), tp.id, tp.loc);
    return {token: M.bytesToBase64(m.exportBinary())};
  }
  const m = M.importMacaroon(op.token);
  if (op.op === 'verify') {
    try {
      m.verify(bytes(op.key), c => op.allow.includes(c) ? null : 'refused');
      return {ok: true};
    } catch (e) {
      return {ok: false, error: String(e)};
    }
  }
  if (op.op === 'parse')
    return {id: text(m.identifier), loc: m.location,
            caveats: m.caveats.map(c => text(c.identifier)),
            sig: Buffer.from(m.signature).toString('hex')};
  if (op.op === 'attenuate') {
    m.addFirstPartyCaveat(op.caveat);
    return {token: M.bytesToBase64(m.exportBinary())};
  }
  throw new Error(op.op);
};
console.log(JSON.stringify(ops.map(run)));
"""


class Impl:
    def __init__(self, name, argv, v1):
        self.name = name
        self.argv = argv
        self.v1 = v1        # whether it writes V1

    def batch(self, ops):
        p = subprocess.run(self.argv, input=json.dumps(ops),
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError("%s: %s" % (self.name, p.stderr.strip()))
        return json.loads(p.stdout)

    def one(self, op):
        return self.batch([op])[0]


def find_pymacaroons():
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return None, "no " + SYSTEM_PYTHON
    p = subprocess.run([SYSTEM_PYTHON, "-c", "import pymacaroons, nacl"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None, "python3-pymacaroons is not installed"
    return Impl("pymacaroons", [SYSTEM_PYTHON, "-c", PY_HELPER],
                True), None


def find_npm_macaroon():
    node = os.environ.get("NODE") or shutil.which("node")
    npm = os.environ.get("NPM") or shutil.which("npm")
    if not node or not npm:
        return None, "node or npm is not installed"
    prefix = os.path.join(TOP_BUILDDIR, "tests", "node-cache", "macaroon")
    module = os.path.join(prefix, "node_modules", "macaroon")
    if not os.path.exists(os.path.join(module, "package.json")):
        os.makedirs(prefix, exist_ok=True)
        try:
            p = subprocess.run([npm, "install", "--prefix", prefix,
                                "--no-audit", "--no-fund", "--silent",
                                NPM_PACKAGE], capture_output=True,
                               text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return None, "npm install %s timed out" % NPM_PACKAGE
        if p.returncode != 0 or not os.path.exists(module):
            return None, "cannot install %s: %s" % (
                NPM_PACKAGE, (p.stderr.strip().splitlines() or ["?"])[-1])
    # it reads and writes V2 only ("V1 binary export not supported")
    return Impl("npm macaroon", [node, "-e", JS_HELPER, module], False), None


# ---- the cases ----

def ours_to_them(t, impl):
    n = impl.name
    token = mint(KEY, "diverge-t1-1", LOCATION, CAVEATS)
    t.eq(verify(token), "ok", "%s: our token verifies here" % n)
    parsed, good, bad, narrow = impl.batch([
        {"op": "parse", "token": token},
        {"op": "verify", "token": token, "key": KEY.hex(),
         "allow": CAVEATS},
        {"op": "verify", "token": token, "key": OTHER_KEY.hex(),
         "allow": CAVEATS},
        {"op": "verify", "token": token, "key": KEY.hex(),
         "allow": CAVEATS[1:]},
    ])
    t.eq((parsed["id"], parsed["loc"], parsed["caveats"]),
         ("diverge-t1-1", LOCATION, CAVEATS),
         "%s: reads our token's fields" % n)
    t.eq(parsed["sig"], signature(token),
         "%s: computes our token's signature" % n)
    t.ok(good["ok"], "%s: verifies our token" % n, good.get("error"))
    t.ok(not bad["ok"], "%s: refuses our token under another key" % n)
    t.ok(not narrow["ok"],
         "%s: refuses our token when a caveat is not satisfied" % n)

    # no location: we omit the field, as every implementation but
    # pymacaroons does
    token = mint(KEY, "diverge-t1-2", "", CAVEATS[:2])
    res = impl.one({"op": "verify", "token": token, "key": KEY.hex(),
                    "allow": CAVEATS[:2]})
    t.ok(res["ok"], "%s: verifies our token without location" % n,
         res.get("error"))


def them_to_ours(t, impl):
    n = impl.name
    key = KEY.hex()
    expired = CAVEATS[:2] + ["expires = " + rfc3339(NOW - 60)]
    ops = [
        {"op": "mint", "key": key, "id": "diverge-t1-1", "loc": LOCATION,
         "caveats": CAVEATS},
        {"op": "mint", "key": key, "id": "diverge-t1-3", "loc": "",
         "caveats": CAVEATS},
        {"op": "mint", "key": OTHER_KEY.hex(), "id": "diverge-t1-1",
         "loc": LOCATION, "caveats": CAVEATS},
        {"op": "mint", "key": key, "id": "diverge-t1-4", "loc": LOCATION,
         "caveats": expired},
        {"op": "mint", "key": key, "id": "diverge-t1-5", "loc": LOCATION,
         "caveats": CAVEATS[:2] + ["colour = red"]},
        {"op": "mint", "key": key, "id": "diverge-t1-6", "loc": LOCATION,
         "caveats": CAVEATS[:2], "third_party": {
             "loc": "https://auth.example", "key": OTHER_KEY.hex(),
             "id": "3p-caveat-1"}},
        {"op": "mint", "key": key, "id": "diverge-t1-7", "loc": LOCATION,
         "caveats": ["task_id = t2", "namespace = ns1"]},
        {"op": "mint", "key": SHORT_KEY.hex(), "id": "diverge-t1-8",
         "loc": LOCATION, "caveats": CAVEATS},
    ]
    if impl.v1:
        ops.append({"op": "mint", "key": key, "id": "diverge-t1-1",
                    "loc": LOCATION, "caveats": CAVEATS, "version": 1})
    res = [r["token"] for r in impl.batch(ops)]
    same, noloc, other, old, unknown, third, task, short = res[:8]

    ours = mint(KEY, "diverge-t1-1", LOCATION, CAVEATS)
    t.eq(same, ours, "%s: the same inputs give the same token text" % n)
    t.eq(verify(same), "ok", "%s: its token verifies here" % n)
    t.eq(verify(same, model="gpt-4o"), "ok",
         "%s: its token verifies here for another allowed model" % n)
    t.eq(verify(same, model="o3"), "caveat not met: models",
         "%s: its token's models caveat is enforced here" % n)
    if impl.name == "pymacaroons":
        # 02 01 00: the zero-length location field only it writes
        t.ok(noloc.startswith("AgEA"),
             "%s: writes an empty location field" % n, noloc[:8])
    t.eq(verify(noloc), "ok",
         "%s: its token without location verifies here" % n)
    t.eq(verify(other), "bad signature",
         "%s: its token under another key is refused here" % n)
    t.eq(verify(old), "expired", "%s: its expired token is refused" % n)
    t.eq(verify(unknown), "unknown caveat",
         "%s: its unknown caveat is refused here" % n)
    t.eq(verify(third), "unknown caveat",
         "%s: its third-party caveat signs as we compute, then is "
         "refused" % n)
    t.eq(verify(task), "caveat not met: task_id",
         "%s: its token for another task is refused here" % n)
    t.eq(verify(short, key=SHORT_KEY), "bad signature",
         "%s: its token under a root key of %d bytes is refused here, with "
         "that key" % (n, len(SHORT_KEY)))
    if impl.v1:
        v1 = res[8]
        t.ok(v1.startswith("MDA"), "%s: writes V1" % n, v1[:20])
        t.eq(verify(v1), "ok", "%s: its V1 token verifies here" % n)
        t.eq(signature(v1), signature(same),
             "%s: its V1 token has the V2 token's signature" % n)

    # a holder adds caveats to our token: the chain continues
    narrowed, hijack = [r["token"] for r in impl.batch([
        {"op": "attenuate", "token": ours, "caveat": "models = gpt-4o"},
        {"op": "attenuate", "token": ours, "caveat": "task_id = t2"},
    ])]
    t.eq(verify(narrowed, model="gpt-4o"), "ok",
         "%s: our token narrowed there verifies here" % n)
    t.eq(verify(narrowed, model=MODEL), "caveat not met: models",
         "%s: the added models caveat holds here" % n)
    t.eq(verify(hijack), "caveat not met: task_id",
         "%s: a conflicting task_id added there is refused here" % n)


def main(t):
    if not os.access(TOOL, os.X_OK):
        t.skip_all("%s is not built" % TOOL)
    impls, missing = [], []
    for find in (find_pymacaroons, find_npm_macaroon):
        impl, why = find()
        if impl:
            impls.append(impl)
        else:
            missing.append(why)
    if not impls:
        t.skip_all("no independent implementation: " + "; ".join(missing))
    for why in missing:
        print("# not used: " + why)
    for impl in impls:
        for case in (ours_to_them, them_to_ours):
            try:
                case(t, impl)
            except Exception:  # noqa: BLE001 - a failure, not a crash
                t.ok(False, "%s: %s raised" % (impl.name, case.__name__),
                     traceback.format_exc())


if __name__ == "__main__":
    tap = Tap()
    main(tap)
    tap.done()
