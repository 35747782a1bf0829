/*
 * Fuzz target: the webhook normalizer and the signature parsers. The first
 * byte picks the provider and event; the rest is the JSON body.
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "scm/scm.h"
#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct {
	enum scm_provider p;
	const char *event;
} events[] = {
	{ SCM_GITHUB, "issue_comment" },
	{ SCM_GITHUB, "pull_request_review_comment" },
	{ SCM_GITHUB, "pull_request" },
	{ SCM_GITHUB, "ping" },
	{ SCM_GITLAB, "Note Hook" },
	{ SCM_GITLAB, "Confidential Note Hook" },
	{ SCM_GITLAB, "Merge Request Hook" },
	{ SCM_GITLAB, "Push Hook" },
};

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct webhook_identity self = { "diverge[bot]",
	    "diverge", 7 };
	struct scm_event ev;
	const char *reason = NULL;
	const char *body;
	enum webhook_verdict v;
	size_t i, len;
	char *text;

	if (size < 1)
		return 0;
	util_json_init();
	log_setup(LOG_ERROR, 0);
	i = data[0] % ARRAY_SIZE(events);
	body = (const char *)data + 1;
	len = size - 1;
	memset(&ev, 0, sizeof(ev));
	v = webhook_normalize(events[i].p, events[i].event, "fuzz", body, len,
	    &self, &ev, &reason);
	if (v == WH_ACCEPT) {
		char *enc = scm_event_encode(&ev);
		struct scm_event back;

		/* what we store must read back the same */
		if (scm_event_decode(&back, enc, strlen(enc)) != 0 ||
		    back.number != ev.number || back.kind != ev.kind)
			abort();
		scm_event_release(&back);
		free(enc);
	}
	if (v == WH_ACCEPT || v == WH_IGNORE)
		scm_event_release(&ev);
	webhook_has_command_line(body, len);
	/* the stored-form decoder on arbitrary bytes */
	{
		struct scm_event any;

		if (scm_event_decode(&any, body, len) == 0)
			scm_event_release(&any);
	}
	/* the same bytes as signature headers */
	text = xstrndup(body, len);
	{
		const char *s[1] = { "secret" };
		size_t l[1] = { 6 };
		struct webhook_keys k = { s, l, 1, NULL, 0, NULL, 0, NULL };
		unsigned char key[4] = { 1, 2, 3, 4 };

		webhook_github_verify(&k, text, "x", 1);
		webhook_standard_verify(key, sizeof(key), "id", "1614265330",
		    text, "x", 1, 1614265330, &reason);
		webhook_gitlab_verify_token(&k, text);
	}
	free(text);
	return 0;
}
