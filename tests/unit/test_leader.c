/*
 * leader: the record logic of the Lease election, without an API server,
 * and the renew deadline against the fake kube-apiserver
 * (tests/integration/test_leader.py runs the election between daemons).
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "leader/leader.h"
#include "storeenv.h"
#include "testutil.h"

#define DUR_MS	15000
/* 2026-12-01T11:43:10.123456Z */
#define WALL_US	INT64_C(1796125390123456)

static json_t *
lease(const char *holder, int secs, int transitions, const char *acquire)
{
	return json_pack("{s:s,s:s,s:{s:s,s:s,s:s},s:{s:s,s:i,s:s,s:s,s:i}}",
	    "apiVersion", "coordination.k8s.io/v1", "kind", "Lease",
	    "metadata", "name", "le", "namespace", "ns", "resourceVersion",
	    "42", "spec", "holderIdentity", holder, "leaseDurationSeconds",
	    secs, "acquireTime", acquire, "renewTime",
	    "2026-01-01T00:00:05.000000Z", "leaseTransitions", transitions);
}

static const char *
spec_s(const json_t *o, const char *k)
{
	return json_string_value(json_object_get(json_object_get(o, "spec"),
	    k));
}

static json_int_t
spec_i(const json_t *o, const char *k)
{
	return json_integer_value(json_object_get(json_object_get(o, "spec"),
	    k));
}

/*
 * leader_decide for "me", leading or not, at now_ms and WALL_US, on cur:
 * it writes our record, renewed now, with acquire and transitions.
 */
static void
assert_writes(struct leader_observed *obs, const json_t *cur, int leading,
    int64_t now_ms, const char *acquire, json_int_t transitions)
{
	json_t *out = NULL;

	assert_int_equal(leader_decide(obs, cur, "ns", "le", "me", leading,
	    DUR_MS, now_ms, WALL_US, &out, NULL), LEADER_WRITE);
	assert_string_equal(spec_s(out, "holderIdentity"), "me");
	assert_string_equal(spec_s(out, "acquireTime"), acquire);
	assert_string_equal(spec_s(out, "renewTime"),
	    "2026-12-01T11:43:10.123456Z");
	assert_int_equal(spec_i(out, "leaseTransitions"), transitions);
	json_decref(out);
}

static void
test_micro_time(void **state)
{
	char s[40];

	(void)state;
	leader_micro_time(WALL_US, s);
	assert_string_equal(s, "2026-12-01T11:43:10.123456Z");
	leader_micro_time(INT64_C(1796125390000001), s);
	assert_string_equal(s, "2026-12-01T11:43:10.000001Z");
}

/* No Lease: create one with our record, transitions 0. */
static void
test_create(void **state)
{
	struct leader_observed obs = { 0 };
	json_t *out = NULL;
	const char *holder = NULL;

	(void)state;
	assert_int_equal(leader_decide(&obs, NULL, "ns", "le", "me", 0,
	    1500, 1000, WALL_US, &out, &holder), LEADER_WRITE);
	assert_string_equal(holder, "");
	assert_string_equal(json_string_value(json_object_get(
	    json_object_get(out, "metadata"), "name")), "le");
	assert_string_equal(spec_s(out, "holderIdentity"), "me");
	/* rounded up to whole seconds */
	assert_int_equal(spec_i(out, "leaseDurationSeconds"), 2);
	assert_string_equal(spec_s(out, "acquireTime"),
	    "2026-12-01T11:43:10.123456Z");
	assert_string_equal(spec_s(out, "renewTime"),
	    "2026-12-01T11:43:10.123456Z");
	assert_int_equal(spec_i(out, "leaseTransitions"), 0);
	json_decref(out);
	leader_observed_release(&obs);
}

/*
 * Another holder: not ours until its record has stayed the same for its
 * leaseDurationSeconds on our clock, then taken with its
 * resourceVersion, one transition more.
 */
static void
test_expiry_on_our_clock(void **state)
{
	struct leader_observed obs = { 0 };
	json_t *cur = lease("them", 10, 3, "2026-01-01T00:00:00.000000Z");
	json_t *out = NULL;

	(void)state;
	assert_int_equal(leader_decide(&obs, cur, "ns", "le", "me", 0,
	    DUR_MS, 1000, WALL_US, &out, NULL), LEADER_NOT_OURS);
	assert_int_equal(obs.at_ms, 1000);
	/* the same record later: still the first sight that counts */
	assert_int_equal(leader_decide(&obs, cur, "ns", "le", "me", 0,
	    DUR_MS, 10999, WALL_US, &out, NULL), LEADER_NOT_OURS);
	assert_int_equal(obs.at_ms, 1000);
	assert_int_equal(leader_decide(&obs, cur, "ns", "le", "me", 0,
	    DUR_MS, 11000, WALL_US, &out, NULL), LEADER_WRITE);
	assert_string_equal(spec_s(out, "holderIdentity"), "me");
	assert_int_equal(spec_i(out, "leaseTransitions"), 4);
	assert_string_equal(spec_s(out, "acquireTime"),
	    "2026-12-01T11:43:10.123456Z");
	assert_string_equal(json_string_value(json_object_get(
	    json_object_get(out, "metadata"), "resourceVersion")), "42");
	assert_int_equal(spec_i(out, "leaseDurationSeconds"), 15);
	json_decref(out);
	json_decref(cur);
	leader_observed_release(&obs);
}

/* A renewal seen resets the wait: the holder is alive. */
static void
test_renewal_resets(void **state)
{
	struct leader_observed obs = { 0 };
	json_t *a = lease("them", 10, 0, "2026-01-01T00:00:00.000000Z");
	json_t *b = lease("them", 10, 0, "2026-01-01T00:00:00.000000Z");
	json_t *out = NULL;

	(void)state;
	json_object_set_new(json_object_get(b, "spec"), "renewTime",
	    json_string("2026-01-01T00:00:07.000000Z"));
	/* a clock that does not start at 0, as a monotonic one does not */
	assert_int_equal(leader_decide(&obs, a, "ns", "le", "me", 0, DUR_MS,
	    5000, WALL_US, &out, NULL), LEADER_NOT_OURS);
	assert_int_equal(leader_decide(&obs, b, "ns", "le", "me", 0, DUR_MS,
	    14000, WALL_US, &out, NULL), LEADER_NOT_OURS);
	assert_int_equal(leader_decide(&obs, b, "ns", "le", "me", 0, DUR_MS,
	    23999, WALL_US, &out, NULL), LEADER_NOT_OURS);
	assert_int_equal(leader_decide(&obs, b, "ns", "le", "me", 0, DUR_MS,
	    24000, WALL_US, &out, NULL), LEADER_WRITE);
	json_decref(out);
	json_decref(a);
	json_decref(b);
	leader_observed_release(&obs);
}

/* A released Lease (no holder) is taken at once. */
static void
test_released(void **state)
{
	struct leader_observed obs = { 0 };
	json_t *cur = lease("them", 10, 2, "2026-01-01T00:00:00.000000Z");
	json_t *rel = leader_release_object(cur, WALL_US), *out = NULL;

	(void)state;
	assert_string_equal(spec_s(rel, "holderIdentity"), "");
	assert_int_equal(spec_i(rel, "leaseDurationSeconds"), 1);
	assert_int_equal(spec_i(rel, "leaseTransitions"), 2);
	assert_string_equal(spec_s(rel, "renewTime"),
	    "2026-12-01T11:43:10.123456Z");
	/* an update that fails if another process wrote meanwhile */
	assert_string_equal(json_string_value(json_object_get(
	    json_object_get(rel, "metadata"), "resourceVersion")), "42");
	assert_int_equal(leader_decide(&obs, rel, "ns", "le", "me", 0,
	    DUR_MS, 5, WALL_US, &out, NULL), LEADER_WRITE);
	assert_string_equal(spec_s(out, "holderIdentity"), "me");
	assert_int_equal(spec_i(out, "leaseTransitions"), 3);
	json_decref(out);
	json_decref(rel);
	json_decref(cur);
	leader_observed_release(&obs);
}

/*
 * The leader renews: acquireTime and transitions kept, renewTime now,
 * whatever the age of the record; another holder means it was taken.
 */
static void
test_renew_and_taken(void **state)
{
	struct leader_observed obs = { 0 };
	json_t *mine = lease("me", 15, 1, "2026-01-01T00:00:00.000000Z");
	json_t *theirs = lease("them", 15, 2, "2026-01-01T00:00:09.000000Z");
	json_t *out = NULL;

	(void)state;
	assert_writes(&obs, mine, 1, 0, "2026-01-01T00:00:00.000000Z", 1);
	assert_int_equal(leader_decide(&obs, theirs, "ns", "le", "me", 1,
	    DUR_MS, 100000, WALL_US, &out, NULL), LEADER_TAKEN);
	assert_null(out);
	json_decref(mine);
	json_decref(theirs);
	leader_observed_release(&obs);
}

/*
 * A record that names us is no change of holder, leading or not (a
 * standby whose create or update went through while its answer was
 * lost, as client-go's IsLeader): leaseTransitions and acquireTime
 * kept, an acquireTime missing is now.
 */
static void
test_same_holder(void **state)
{
	struct leader_observed obs = { 0 };
	json_t *cur = lease("me", 15, 3, "2026-01-01T00:00:00.000000Z");

	(void)state;
	assert_writes(&obs, cur, 0, 0, "2026-01-01T00:00:00.000000Z", 3);
	json_object_del(json_object_get(cur, "spec"), "acquireTime");
	assert_writes(&obs, cur, 1, 0, "2026-12-01T11:43:10.123456Z", 3);
	json_decref(cur);
	leader_observed_release(&obs);
}

/* No leaseDurationSeconds in the record: ours stands in. */
static void
test_no_duration(void **state)
{
	struct leader_observed obs = { 0 };
	json_t *cur = lease("them", 0, 0, "2026-01-01T00:00:00.000000Z");
	json_t *out = NULL;

	(void)state;
	json_object_del(json_object_get(cur, "spec"), "leaseDurationSeconds");
	assert_int_equal(leader_decide(&obs, cur, "ns", "le", "me", 0,
	    DUR_MS, 0, WALL_US, &out, NULL), LEADER_NOT_OURS);
	assert_int_equal(leader_decide(&obs, cur, "ns", "le", "me", 0,
	    DUR_MS, DUR_MS - 1, WALL_US, &out, NULL), LEADER_NOT_OURS);
	assert_int_equal(leader_decide(&obs, cur, "ns", "le", "me", 0,
	    DUR_MS, DUR_MS, WALL_US, &out, NULL), LEADER_WRITE);
	json_decref(out);
	json_decref(cur);
	leader_observed_release(&obs);
}

static void
test_identity(void **state)
{
	char *a = leader_identity_new(), *b = leader_identity_new();
	const char *us = strrchr(a, '_');

	(void)state;
	assert_non_null(us);
	assert_int_equal(strlen(us + 1), 16);
	assert_int_equal(strspn(us + 1, "0123456789abcdef"), 16);
	assert_string_not_equal(a, b);
	free(a);
	free(b);
}

#define ME	"me_0123456789abcdef"
#define OTHER	"other_fedcba9876543210"

static int lost_calls, leading_calls;
static int64_t lost_at_ms;

static void
on_change(void *arg, enum leader_state st)
{
	(void)arg;
	if (st == LEADER_LEADING)
		__atomic_add_fetch(&leading_calls, 1, __ATOMIC_SEQ_CST);
	if (st == LEADER_LOST) {
		__atomic_store_n(&lost_at_ms, now_mono_ms(), __ATOMIC_SEQ_CST);
		__atomic_add_fetch(&lost_calls, 1, __ATOMIC_SEQ_CST);
	}
}

/* Wait up to ms for l to be in state want. */
static int
wait_state(struct leader *l, enum leader_state want, int64_t ms)
{
	int64_t end = now_mono_ms() + ms;

	while (leader_state(l) != want && now_mono_ms() < end)
		sleep_ms(10);
	return leader_state(l) == want;
}

/*
 * An election on api's Lease default/name, as identity ME (the
 * callbacks' counters start again at 0).
 */
static struct leader *
start_election(struct k8s_api *api, const char *name, int64_t duration_ms,
    int64_t deadline_ms, int64_t retry_ms)
{
	struct leader_config lc;
	struct leader *l = NULL;
	char *cause = NULL;

	__atomic_store_n(&leading_calls, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&lost_calls, 0, __ATOMIC_SEQ_CST);
	memset(&lc, 0, sizeof(lc));
	lc.api = api;
	lc.namespace = "default";
	lc.name = name;
	lc.identity = ME;
	lc.lease_duration_ms = duration_ms;
	lc.renew_deadline_ms = deadline_ms;
	lc.retry_period_ms = retry_ms;
	lc.changed = on_change;
	assert_int_equal(leader_start(&l, &lc, &cause), 0);
	return l;
}

/* The same, leading once this returns. */
static struct leader *
start_leading(struct k8s_api *api, const char *name, int64_t duration_ms,
    int64_t deadline_ms, int64_t retry_ms)
{
	struct leader *l = start_election(api, name, duration_ms, deadline_ms,
	    retry_ms);

	assert_true(wait_state(l, LEADER_LEADING, 10000));
	return l;
}

/* Another process takes Lease default/name over (an update that wins). */
static void
take_over(struct k8s_api *api, const char *name)
{
	struct k8s_status st;
	json_t *cur = NULL, *next;
	int rc;

	memset(&st, 0, sizeof(st));
	do {
		k8s_status_release(&st);
		assert_int_equal(k8s_get(api, &K8S_LEASE, "default", name,
		    &cur, &st), 0);
		next = json_deep_copy(cur);
		json_decref(cur);
		json_object_set_new(json_object_get(next, "spec"),
		    "holderIdentity", json_string(OTHER));
		/* a renewal may write between the read and the update */
		rc = k8s_update(api, &K8S_LEASE, "default", name, next, NULL,
		    &st);
		json_decref(next);
	} while (rc == K8S_ECONFLICT);
	assert_int_equal(rc, 0);
	k8s_status_release(&st);
}

/* Lease default/name as stored (to json_decref). */
static json_t *
lease_get(struct k8s_api *api, const char *name)
{
	struct k8s_status st;
	json_t *cur = NULL;

	memset(&st, 0, sizeof(st));
	assert_int_equal(k8s_get(api, &K8S_LEASE, "default", name, &cur,
	    &st), 0);
	k8s_status_release(&st);
	return cur;
}

static const char *
holder_of(struct k8s_api *api, const char *name, char out[64])
{
	json_t *cur = lease_get(api, name);

	snprintf(out, 64, "%s", spec_s(cur, "holderIdentity"));
	json_decref(cur);
	return out;
}

/*
 * Wait up to ms for the fake to have seen n requests of method on Lease
 * default/name in all.
 */
static int
wait_requests(struct storeenv *env, const char *method, const char *name,
    int n, int64_t ms)
{
	char *suffix = xasprintf("/leases/%s", name);
	int64_t end = now_mono_ms() + ms;
	int seen;

	while ((seen = storeenv_fake_count(env, method, suffix)) < n &&
	    now_mono_ms() < end)
		sleep_ms(20);
	free(suffix);
	return seen >= n;
}

/*
 * A leader whose renewal hangs: the fake API server takes 3 s to answer
 * each Lease call, the client's own timeout is 4 s, so a renewal (a get
 * and an update) would succeed after 6 s. renew_deadline is 1 s: the
 * leadership ends 1 s after the last renewal, while the call is still in
 * flight, and is said once; not at lease_duration (a minute). Renewals
 * that go through keep it (1.5 s of them first, longer than the
 * deadline). Lost is final: once the calls answer again, the try in
 * flight ends (one update at most) and no renewal follows it.
 */
static void
test_deadline_while_hung(void **state)
{
	struct storeenv env;
	struct k8s_cluster c;
	struct k8s_rest_config rc;
	struct k8s_api *api = NULL;
	struct leader *l = NULL;
	char *cause = NULL;
	int64_t t0;
	int puts;

	(void)state;
	if (storeenv_open(&env, 3, 100) < 0)
		skip();
	memset(&c, 0, sizeof(c));
	c.server = env.fake_server;
	c.ca_file = env.fake_ca;
	c.token = (char *)"contract-token";
	c.namespace = (char *)"default";
	memset(&rc, 0, sizeof(rc));
	rc.connect_timeout_ms = 2000;
	rc.timeout_ms = 4000;
	rc.deadline_ms = 4000;
	assert_int_equal(k8s_rest_open(&api, &c, &rc, &cause), 0);
	l = start_leading(api, "deadline", 60000, 1000, 200);
	sleep_ms(1500);
	assert_int_equal(leader_state(l), LEADER_LEADING);
	assert_int_equal(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 0);

	json_decref(storeenv_fake(&env, "POST", "/_fake/delay",
	    "{\"ms\": 3000, \"count\": 1000, \"match\": "
	    "\"/leases/deadline\"}"));
	t0 = now_mono_ms();
	assert_true(wait_state(l, LEADER_LOST, 8000));
	/* the last renewal was at t0 at the latest */
	if (__atomic_load_n(&lost_at_ms, __ATOMIC_SEQ_CST) - t0 > 2500)
		fail_msg("lost %lld ms after the calls began to hang",
		    (long long)(lost_at_ms - t0));
	puts = storeenv_fake_count(&env, "PUT", "/leases/deadline");
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/delay", NULL));
	assert_false(wait_requests(&env, "PUT", "deadline", puts + 2, 6000));
	leader_stop(l);		/* waits for the call in flight */
	assert_int_equal(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 1);
	assert_int_equal(__atomic_load_n(&leading_calls, __ATOMIC_SEQ_CST),
	    1);
	k8s_api_free(api);
	storeenv_close(&env);
}

/*
 * A leader that finds the Lease held by another (its renewal reads
 * another holder: an operator's edit, a process that waited out an
 * expiry this one missed) stops leading at that renewal, not only once
 * renew_deadline has passed without one: with a 20 s deadline and
 * renewals every 100 ms, it is lost within 4 s, said once. A leader
 * stopped before its next renewal sees it too: it gives up nothing
 * that is no longer its own.
 */
static void
test_taken_noticed(void **state)
{
	struct storeenv env;
	struct leader *l;
	char who[64];
	int64_t t0;

	(void)state;
	assert_int_equal(storeenv_open(&env, 1, 100), 0);
	l = start_leading(env.api, "taken", 30000, 20000, 100);
	t0 = now_mono_ms();
	take_over(env.api, "taken");
	assert_true(wait_state(l, LEADER_LOST, 4000));
	if (__atomic_load_n(&lost_at_ms, __ATOMIC_SEQ_CST) - t0 > 4000)
		fail_msg("lost %lld ms after the Lease was taken",
		    (long long)(lost_at_ms - t0));
	leader_stop(l);
	assert_int_equal(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 1);
	assert_string_equal(holder_of(env.api, "taken", who),
	    OTHER);

	/* renewals every 10 s: the stop comes first */
	l = start_leading(env.api, "stopped", 30000, 20000, 10000);
	take_over(env.api, "stopped");
	assert_int_equal(leader_state(l), LEADER_LEADING);
	leader_stop(l);
	assert_string_equal(holder_of(env.api, "stopped", who),
	    OTHER);
	storeenv_close(&env);
}

/*
 * A standby takes over a Lease whose holder stopped renewing once its
 * leaseDurationSeconds (1) has passed on our clock, one transition more;
 * stopped, it releases the Lease (holderIdentity "", 1 s) so that the
 * next standby need not wait, transitions kept.
 */
static void
test_expired_taken_and_released(void **state)
{
	struct storeenv env;
	struct k8s_status st;
	json_t *old = lease(OTHER, 1, 5, "2026-01-01T00:00:00.000000Z");
	json_t *meta = json_object_get(old, "metadata"), *cur;
	struct leader *l;

	(void)state;
	assert_int_equal(storeenv_open(&env, 1, 100), 0);
	json_object_set_new(meta, "name", json_string("expired"));
	json_object_set_new(meta, "namespace", json_string("default"));
	json_object_del(meta, "resourceVersion");
	memset(&st, 0, sizeof(st));
	assert_int_equal(k8s_create(env.api, &K8S_LEASE, "default", old, NULL,
	    &st), 0);
	k8s_status_release(&st);
	json_decref(old);

	l = start_leading(env.api, "expired", 30000, 20000, 100);
	cur = lease_get(env.api, "expired");
	assert_string_equal(spec_s(cur, "holderIdentity"), ME);
	assert_int_equal(spec_i(cur, "leaseDurationSeconds"), 30);
	assert_int_equal(spec_i(cur, "leaseTransitions"), 6);
	json_decref(cur);

	leader_stop(l);
	cur = lease_get(env.api, "expired");
	assert_string_equal(spec_s(cur, "holderIdentity"), "");
	assert_int_equal(spec_i(cur, "leaseDurationSeconds"), 1);
	assert_int_equal(spec_i(cur, "leaseTransitions"), 6);
	json_decref(cur);
	storeenv_close(&env);
}

/*
 * What the API server answers. A standby whose tries fail (403) does not
 * lead. A create that took effect while its answer was lost (a 500 after
 * the commit) leaves a Lease that names us: the next try takes it as the
 * same holder, no transition. A renewal refused with a 409 (another
 * writer between our get and update) is a lost round, not a lost Lease:
 * the next renewal goes through.
 */
static void
test_api_answers(void **state)
{
	struct storeenv env;
	struct leader *l;
	json_t *cur;
	int puts;

	(void)state;
	if (storeenv_open(&env, 3, 100) < 0)
		skip();
	json_decref(storeenv_fake(&env, "POST", "/_fake/faults",
	    "{\"status\": 403, \"count\": 1000, \"method\": \"GET\", "
	    "\"match\": \"/leases/answers\"}"));
	l = start_election(env.api, "answers", 30000, 20000, 100);
	assert_true(wait_requests(&env, "GET", "answers", 3, 10000));
	assert_int_equal(leader_state(l), LEADER_STANDBY);
	assert_int_equal(__atomic_load_n(&leading_calls, __ATOMIC_SEQ_CST),
	    0);
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/faults", NULL));
	json_decref(storeenv_fake(&env, "POST", "/_fake/faults",
	    "{\"status\": 500, \"after\": true, \"method\": \"POST\", "
	    "\"match\": \"/leases\"}"));
	assert_true(wait_state(l, LEADER_LEADING, 10000));
	cur = lease_get(env.api, "answers");
	assert_string_equal(spec_s(cur, "holderIdentity"), ME);
	assert_int_equal(spec_i(cur, "leaseTransitions"), 0);
	json_decref(cur);

	/* the first update after the fault, or the second, gets the 409 */
	puts = storeenv_fake_count(&env, "PUT", "/leases/answers");
	json_decref(storeenv_fake(&env, "POST", "/_fake/faults",
	    "{\"status\": 409, \"method\": \"PUT\", "
	    "\"match\": \"/leases/answers\"}"));
	assert_true(wait_requests(&env, "PUT", "answers", puts + 3, 10000));
	assert_int_equal(leader_state(l), LEADER_LEADING);
	leader_stop(l);
	assert_int_equal(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 0);
	storeenv_close(&env);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_micro_time),
		cmocka_unit_test(test_create),
		cmocka_unit_test(test_expiry_on_our_clock),
		cmocka_unit_test(test_renewal_resets),
		cmocka_unit_test(test_released),
		cmocka_unit_test(test_renew_and_taken),
		cmocka_unit_test(test_same_holder),
		cmocka_unit_test(test_no_duration),
		cmocka_unit_test(test_identity),
		cmocka_unit_test(test_deadline_while_hung),
		cmocka_unit_test(test_taken_noticed),
		cmocka_unit_test(test_expired_taken_and_released),
		cmocka_unit_test(test_api_answers),
	};

	return cmocka_run_group_tests_name("leader", tests, NULL, NULL);
}
