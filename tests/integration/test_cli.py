"""The command-line client, diverge(1), end to end.

token inspect on tokens minted here (the standard construction, V2).
"""

import base64
import hashlib
import hmac
import os
import subprocess

from divtest import TOP_BUILDDIR, run_tests

DIVERGE = os.path.join(TOP_BUILDDIR, "diverge")


def run(args, stdin=None, env=None, cwd=None, timeout=60):
    """Run diverge; (exit status, stdout, stderr) as text."""
    e = dict(os.environ)
    e.pop("NO_COLOR", None)
    e.pop("DIVERGE_SERVER", None)
    if env:
        e.update(env)
    p = subprocess.run([DIVERGE] + list(args), input=stdin,
                       capture_output=True, text=True, env=e, cwd=cwd,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


# ---- macaroons, minted independently of the C code ----

def _field(t, data):
    n = len(data)
    v = b""
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            v += bytes([b | 0x80])
        else:
            v += bytes([b])
            break
    return bytes([t]) + v + data


def mint(key, ident, location, caveats):
    """A V2 macaroon, base64url without padding."""
    derived = hmac.new(b"macaroons-key-generator", key,
                       hashlib.sha256).digest()
    sig = hmac.new(derived, ident.encode(), hashlib.sha256).digest()
    out = b"\x02"
    if location:
        out += _field(1, location.encode())
    out += _field(2, ident.encode()) + b"\x00"
    for c in caveats:
        sig = hmac.new(sig, c.encode(), hashlib.sha256).digest()
        out += _field(2, c.encode()) + b"\x00"
    out += b"\x00" + _field(6, sig)
    return base64.urlsafe_b64encode(out).decode().rstrip("=")


KEY = bytes(range(32))


def token_inspect(t):
    caveats = ["task_id = fix-pr-42", "namespace = default",
               "max_cost_usd = 5.00", "max_tokens = 1000000",
               "expires = 2026-12-01T00:00:00Z"]
    tok = mint(KEY, "abc123", "http://127.0.0.1:8080", caveats)
    want = ("version: 2\nidentifier: abc123\n"
            "location: http://127.0.0.1:8080\n" +
            "".join("caveat: %s\n" % c for c in caveats))
    rc, out, err = run(["token", "inspect", tok])
    t.ok(rc == 0 and out == want and err == "",
         "token inspect: fields and caveats", (rc, out, err))
    rc, out, err = run(["token", "inspect", "-"], stdin=tok + "\n")
    t.ok(rc == 0 and out == want, "token inspect -: from stdin",
         (rc, out, err))
    # a forged signature is shown all the same: nothing is verified
    raw = bytearray(base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4)))
    raw[-1] ^= 1
    forged = base64.b64encode(bytes(raw)).decode()
    rc, out, err = run(["token", "inspect", forged])
    t.ok(rc == 0 and out == want,
         "token inspect: not verified (bad signature, std base64 padded)",
         (rc, out, err))
    tok = mint(KEY, "x", "", [])
    rc, out, err = run(["token", "inspect", tok])
    t.eq((rc, out), (0, "version: 2\nidentifier: x\nlocation: (none)\n"),
         "token inspect: no location, no caveat")
    for name, bad in (("not base64", "!!!"), ("truncated", tok[:-6]),
                      ("empty", "")):
        rc, out, err = run(["token", "inspect", bad])
        t.ok(rc == 1 and out == "" and
             err.startswith("diverge: malformed token") and
             err.count("\n") == 1,
             "token inspect: malformed token (%s): message, exit 1" % name,
             (rc, out, err))
    rc, out, err = run(["token", "inspect", "-"], stdin="")
    t.ok(rc == 1 and err.startswith("diverge: malformed token"),
         "token inspect -: empty stdin, exit 1", (rc, err))
    rc, out, err = run(["token", "inspect", "-"], stdin="A" * 100000)
    t.ok(rc == 1 and "too large" in err,
         "token inspect -: oversized input refused", (rc, err))
    rc, out, err = run(["token", "inspect"])
    t.ok(rc == 2 and "usage: diverge token inspect" in err,
         "token inspect without a token: usage, exit 2", (rc, err))
    rc, out, err = run(["token", "inspect", "a", "b"])
    t.eq(rc, 2, "token inspect with two tokens: exit 2")
    rc, out, err = run(["token", "inspect", "--help"])
    t.ok(rc == 0 and out.startswith("usage: diverge token inspect") and
         "stdin" in out, "token inspect --help", (rc, out))
    rc, out, err = run(["token", "inspect", "--frob", tok])
    t.eq(rc, 2, "token inspect --frob: exit 2")


def main(t):
    if not os.access(DIVERGE, os.X_OK):
        t.skip_all("diverge is not built")
    token_inspect(t)


if __name__ == "__main__":
    run_tests(main)
