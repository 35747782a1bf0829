/*
 * leader: Lease-based leader election on a Kubernetes API server, the
 * way client-go's leaderelection package does it, so that of several
 * diverged processes on one cluster exactly one runs the reconciler and
 * the notifier.
 *
 * The lock is a coordination.k8s.io/v1 Lease. Its spec is the record:
 * holderIdentity, leaseDurationSeconds, acquireTime, renewTime (MicroTime:
 * RFC 3339 with 6 fractional digits, UTC) and leaseTransitions. A try
 * reads the Lease; a missing one is created with our record; else, when
 * the record differs from the one last observed, the local monotonic
 * time is noted; a record naming another holder observed less than its
 * leaseDurationSeconds ago is not ours; otherwise our record is written
 * with the object's resourceVersion (a 409 means another process won the
 * round). Times of other processes' clocks are never compared with ours:
 * only the local time at which a change was seen counts.
 *
 * A standby tries every retry_period, with up to 1.2 times of jitter; the
 * leader renews every retry_period and has lost when no renewal succeeded
 * for renew_deadline (timed by a thread of its own, as client-go's renew
 * context: a call that hangs does not stretch it), or when it reads
 * another holder. Lost is final: the
 * election thread stops, and the process is expected to stop its leader's
 * work and exit (as controller-runtime does). leader_stop() of a leader
 * releases the Lease (holderIdentity "", leaseDurationSeconds 1, as
 * client-go's ReleaseOnCancel), so that a standby takes over at its next
 * try rather than after lease_duration.
 */
#ifndef DIVERGE_LEADER_H
#define DIVERGE_LEADER_H

#include <stdint.h>

#include <jansson.h>

struct k8s_api;

enum leader_state {
	LEADER_STANDBY = 0,	/* trying to acquire */
	LEADER_LEADING,		/* holding the Lease */
	LEADER_LOST		/* held it, and could not renew it: final */
};

struct leader_config {
	/*
	 * borrowed; its calls should give up within renew_deadline (a REST
	 * client opened with that deadline): a loss is said on time
	 * whatever they do, but leader_stop() waits for a call in flight
	 */
	struct k8s_api *api;
	const char *namespace;		/* of the Lease */
	const char *name;		/* of the Lease */
	const char *identity;		/* ours: hostname_randomhex */
	int64_t lease_duration_ms;
	int64_t renew_deadline_ms;
	int64_t retry_period_ms;
	/*
	 * Called when the state changes: to LEADER_LEADING on the election
	 * thread, to LEADER_LOST on it or on the deadline's thread, once;
	 * it must be quick.
	 */
	void (*changed)(void *arg, enum leader_state state);
	void *arg;
};

struct leader;

/*
 * Start the election thread (the first try is made at once). cfg's
 * strings are copied. 0, or -1 with a new message in *cause.
 */
int leader_start(struct leader **out, const struct leader_config *cfg,
    char **cause);
/* The current state (any thread). */
enum leader_state leader_state(struct leader *l);
/*
 * Stop the election thread and, when leading, release the Lease (logged
 * "leader election: released"); free. NULL is fine.
 */
void leader_stop(struct leader *l);

/* A new identity, "HOSTNAME_" and 16 random hex digits; caller frees. */
char *leader_identity_new(void);

/* ---- the record logic, without I/O (unit tests) ---- */

/* What one process last saw of the Lease, and when (its own clock). */
struct leader_observed {
	char *record;		/* the spec, canonical JSON; NULL: none yet */
	int64_t at_ms;		/* monotonic time it was first seen */
};

void leader_observed_release(struct leader_observed *o);

/*
 * "2026-12-01T11:43:10.123456Z" for unix_us microseconds since the epoch
 * (a MicroTime), into out.
 */
void leader_micro_time(int64_t unix_us, char out[40]);

enum leader_decision {
	LEADER_NOT_OURS = 0,	/* another holder's unexpired record */
	LEADER_WRITE,		/* write *out: create (cur NULL) or update */
	LEADER_TAKEN		/* we led, and another holder now has it */
};

/*
 * Decide a try on the Lease cur as read (NULL: it does not exist), for
 * identity, leading or not, at monotonic now_ms and wall clock now_us;
 * obs is updated when cur's record differs from the one observed. For
 * LEADER_WRITE, *out is the new object to create or update (cur's
 * metadata, resourceVersion included, and our record, with one
 * leaseTransitions more only when the holder was not us; a new reference);
 * *holder (may be NULL) gets cur's holder ("" when none), borrowed from
 * cur. lease_duration_ms stands in when the record has no duration.
 */
enum leader_decision leader_decide(struct leader_observed *obs,
    const json_t *cur, const char *namespace, const char *name,
    const char *identity, int leading, int64_t lease_duration_ms,
    int64_t now_ms, int64_t now_us, json_t **out, const char **holder);

/*
 * The object that releases cur (held by us): holderIdentity "",
 * leaseDurationSeconds 1, both times now_us, leaseTransitions kept; a
 * new reference.
 */
json_t *leader_release_object(const json_t *cur, int64_t now_us);

#endif
