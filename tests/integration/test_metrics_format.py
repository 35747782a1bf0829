"""/metrics of a running daemon is valid Prometheus text (format 0.0.4),
as a scraper reads it: one bad line and Prometheus drops the whole scrape.

A daemon with both providers (API tokens, the fake SCM APIs), its store's
API and its meter is sent deliveries that are stored, refused and ignored,
API calls and meter calls; then its /metrics is checked line by line:
the Content-Type; names and label names; label values escaped as the
format says; values that are numbers; at most one HELP and one TYPE per
family, before its samples; every family in one block; no series twice;
counters not negative; each histogram series with ascending le bounds,
cumulative buckets, a +Inf bucket equal to its _count, and a _sum.

The checker (divtest.prom_check, which test_kube_metrics.py also runs on a
daemon on a cluster) is first held against texts with one fault each, so
that a checker that passes everything fails here. Where Debian's
python3-prometheus-client is installed (scripts/install-deps installs it),
the reference parser must read the same samples from the same text."""

import json
import math
import re
import subprocess

from divtest import ScmFake, api, meter, prom_check as check, run_tests, scm_daemon

SYSTEM_PYTHON = "/usr/bin/python3"

GOOD = """# HELP a_total A.
# TYPE a_total counter
a_total{x="q\\"\\\\\\n"} 3
# TYPE h histogram
h_bucket{k="v",le="0.5"} 1
h_bucket{k="v",le="+Inf"} 2
h_sum{k="v"} 1.5
h_count{k="v"} 2
g 1e-06
"""

BAD = {
    "no final newline": GOOD.rstrip("\n"),
    "a second TYPE": GOOD + "# TYPE g gauge\n# TYPE g gauge\n",
    "TYPE after the samples": GOOD + "# TYPE g gauge\n",
    "a family in two blocks": GOOD + "a_total{x=\"r\"} 1\n",
    "a series twice": GOOD + "g 2\n",
    "a bad escape": GOOD.replace('q\\"', 'q\\t'),
    "a raw quote in a label": GOOD.replace('x="q\\"', 'x="q"x'),
    "a value that is no number": GOOD.replace("g 1e-06", "g one"),
    "a negative counter": GOOD.replace("a_total{x=\"q\\\"\\\\\\n\"} 3",
                                       "a_total{x=\"q\"} -1"),
    "buckets not cumulative": GOOD.replace('le="0.5"} 1', 'le="0.5"} 3'),
    "+Inf not the count": GOOD.replace('h_count{k="v"} 2',
                                       'h_count{k="v"} 5'),
    "no +Inf bucket": GOOD.replace('h_bucket{k="v",le="+Inf"} 2\n', ""),
    "le not ascending": GOOD.replace('h_bucket{k="v",le="0.5"} 1\n',
                                     'h_bucket{k="v",le="0.5"} 1\n'
                                     'h_bucket{k="v",le="0.25"} 1\n'),
    "no _sum": GOOD.replace('h_sum{k="v"} 1.5\n', ""),
    "a bad metric name": GOOD.replace("g 1e-06", "9g 1"),
    "a bad label name": GOOD.replace('{k="v",le="0.5"}', '{k-1="v",le="0.5"}'),
}


def checker(t):
    errs, samples = check(GOOD)
    t.eq(errs, [], "the checker takes a valid text")
    t.eq(samples.get(("a_total", (("x", 'q"\\\n'),))), 3.0,
         "and unescapes its label values")
    for what, text in BAD.items():
        errs, _ = check(text)
        t.ok(errs, "the checker refuses %s" % what, text)


def reference_parse(text):
    """The samples Debian's prometheus_client reads in text, or (None,
    why) when it is not installed."""
    prog = r"""
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([s.name, sorted(s.labels.items()), repr(s.value)])
print(json.dumps(out))
"""
    try:
        p = subprocess.run([SYSTEM_PYTHON, "-c", "import prometheus_client"],
                           capture_output=True, text=True, timeout=60)
    except OSError as e:
        return None, str(e)
    if p.returncode != 0:
        return None, "python3-prometheus-client is not installed"
    p = subprocess.run([SYSTEM_PYTHON, "-c", prog], input=text,
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return {}, p.stderr.strip().splitlines()[-1:] or ["failed"]
    return {(n, tuple(tuple(x) for x in labels)): float(v)
            for n, labels, v in json.loads(p.stdout)}, None


def exercise(d):
    """Traffic that gives most families a sample."""
    d.request("GET", "/healthz")
    d.request("GET", "/readyz")
    d.request("GET", "/no-such-route")
    d.request("GET", "/%22quoted%22%5C%0A")
    d.github("ping", {"zen": "x"}, "fmt-ping")
    d.github("ping", {"zen": "x"}, "fmt-bad", secret="wrong")
    d.github("issue_comment", {"action": "deleted"}, "fmt-ignored")
    d.gitlab("Note Hook", {"object_kind": "note"}, "fmt-gl")
    d.gitlab("Note Hook", {"object_kind": "note"}, "fmt-gl-bad",
             token="wrong")
    meter(d, None, {})
    meter(d, "AgEfbm90LWEtdG9rZW4", {"requestId": "r", "iteration": 1,
                                     "model": "m", "tokensUsed": 1,
                                     "costUSD": 0.1})
    api(d, "GET", "/api/v1/namespaces/fmt/secrets")
    api(d, "POST", "/api/v1/namespaces/fmt/secrets", {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s"}, "stringData": {"k": "v"}})
    api(d, "GET", "/api/v1/namespaces/fmt/secrets/none")


def main(t):
    checker(t)
    fake = ScmFake()
    try:
        d = scm_daemon(fake)
        d.start()
        exercise(d)
        status, headers, body = d.request("GET", "/metrics")
        text = body.decode("utf-8")
        d.stop()
    finally:
        fake.stop()
    t.eq(status, 200, "GET /metrics")
    ctype = dict((k.lower(), v) for k, v in headers.items()).get(
        "content-type", "")
    t.eq(ctype, "text/plain; version=0.0.4; charset=utf-8",
         "served as the text format, version 0.0.4")
    errs, samples = check(text)
    t.eq(errs, [], "the daemon's /metrics is valid Prometheus text")
    families = set(re.findall(r"^# TYPE (\S+) histogram$", text, re.M))
    t.ok(len(families) >= 3 and len(samples) >= 50,
         "a text worth checking: %d samples, %d histograms" %
         (len(samples), len(families)))
    ref, why = reference_parse(text)
    if ref is None:
        t.skip("prometheus_client reads the same samples: %s" % why)
        return
    t.ok(why is None, "prometheus_client parses the daemon's /metrics",
         why)
    # prometheus_client names a counter's samples x_total and adds
    # x_created for none of ours; compare what both read
    ours = {k: v for k, v in samples.items()}
    diff = sorted(set(ours) ^ set(ref))
    t.eq(diff[:5], [], "prometheus_client reads the same series")
    bad = [k for k in ours if k in ref and not (
        ours[k] == ref[k] or (math.isnan(ours[k]) and math.isnan(ref[k])))]
    t.eq(bad[:5], [], "and the same values")


run_tests(main)
