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
	assert_int_equal(leader_decide(&obs, mine, "ns", "le", "me", 1,
	    DUR_MS, 0, WALL_US, &out, NULL), LEADER_WRITE);
	assert_string_equal(spec_s(out, "acquireTime"),
	    "2026-01-01T00:00:00.000000Z");
	assert_string_equal(spec_s(out, "renewTime"),
	    "2026-12-01T11:43:10.123456Z");
	assert_int_equal(spec_i(out, "leaseTransitions"), 1);
	json_decref(out);
	out = NULL;
	assert_int_equal(leader_decide(&obs, theirs, "ns", "le", "me", 1,
	    DUR_MS, 100000, WALL_US, &out, NULL), LEADER_TAKEN);
	assert_null(out);
	json_decref(mine);
	json_decref(theirs);
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

/* A leader on api's Lease default/name, leading once this returns. */
static struct leader *
start_leading(struct k8s_api *api, const char *name, int64_t duration_ms,
    int64_t deadline_ms, int64_t retry_ms)
{
	struct leader_config lc;
	struct leader *l = NULL;
	char *cause = NULL;

	memset(&lc, 0, sizeof(lc));
	lc.api = api;
	lc.namespace = "default";
	lc.name = name;
	lc.identity = "me_0123456789abcdef";
	lc.lease_duration_ms = duration_ms;
	lc.renew_deadline_ms = deadline_ms;
	lc.retry_period_ms = retry_ms;
	lc.changed = on_change;
	assert_int_equal(leader_start(&l, &lc, &cause), 0);
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
		    "holderIdentity", json_string("other_fedcba9876543210"));
		/* a renewal may write between the read and the update */
		rc = k8s_update(api, &K8S_LEASE, "default", name, next, NULL,
		    &st);
		json_decref(next);
	} while (rc == K8S_ECONFLICT);
	assert_int_equal(rc, 0);
	k8s_status_release(&st);
}

static const char *
holder_of(struct k8s_api *api, const char *name, char out[64])
{
	struct k8s_status st;
	json_t *cur = NULL;

	memset(&st, 0, sizeof(st));
	assert_int_equal(k8s_get(api, &K8S_LEASE, "default", name, &cur,
	    &st), 0);
	snprintf(out, 64, "%s", spec_s(cur, "holderIdentity"));
	json_decref(cur);
	return out;
}

/*
 * A leader whose renewal hangs: the fake API server takes 3 s to answer
 * each Lease call, the client's own timeout is 4 s, so a renewal (a get
 * and an update) would succeed after 6 s. renew_deadline is 1 s: the
 * leadership ends 1 s after the last renewal, while the call is still in
 * flight, and is said once. Renewals that go through keep it (1.5 s of
 * them first, longer than the deadline).
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
	l = start_leading(api, "deadline", 1500, 1000, 200);
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
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/delay", NULL));
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
	__atomic_store_n(&lost_calls, 0, __ATOMIC_SEQ_CST);
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
	    "other_fedcba9876543210");

	/* renewals every 10 s: the stop comes first */
	l = start_leading(env.api, "stopped", 30000, 20000, 10000);
	take_over(env.api, "stopped");
	assert_int_equal(leader_state(l), LEADER_LEADING);
	leader_stop(l);
	assert_string_equal(holder_of(env.api, "stopped", who),
	    "other_fedcba9876543210");
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
		cmocka_unit_test(test_no_duration),
		cmocka_unit_test(test_identity),
		cmocka_unit_test(test_deadline_while_hung),
		cmocka_unit_test(test_taken_noticed),
	};

	return cmocka_run_group_tests_name("leader", tests, NULL, NULL);
}
