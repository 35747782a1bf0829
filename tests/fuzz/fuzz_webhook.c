/*
 * Fuzz target: the webhook normalizer and the signature parsers. The first
 * byte picks the provider and event; the rest is the JSON body.
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
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
	if (webhook_normalize(events[i].p, events[i].event, "fuzz", body, len,
	    &self, &ev, &reason) != WH_BAD_REQUEST) {
		json_t *j = scm_event_to_json(&ev);
		struct scm_event back;

		if (scm_event_from_json(&back, j) == 0)
			scm_event_release(&back);
		json_decref(j);
		scm_event_release(&ev);
	}
	webhook_has_command_line(body, len);
	/* the same bytes as signature headers */
	text = xstrndup(body, len);
	{
		const char *s[1] = { "secret" };
		size_t l[1] = { 6 };
		struct webhook_keys k = { s, l, 1, NULL, 0 };
		unsigned char key[4] = { 1, 2, 3, 4 };

		webhook_github_verify(&k, text, "x", 1);
		webhook_standard_verify(key, sizeof(key), "id", "1614265330",
		    text, "x", 1, 1614265330, &reason);
		webhook_gitlab_verify_token(&k, text);
	}
	free(text);
	return 0;
}
