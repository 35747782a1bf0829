/*
 * Which repository a delivery is about, as the configuration names it:
 * "HOST/path", HOST from the provider's API URL, path GitHub's full_name
 * or GitLab's path_with_namespace. The repos rules (the namespace of a
 * repository's tasks) and repo_allowlist (which repositories may run
 * agents at all) match their globs on it through the same function.
 */
#include "config.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "scm/scm.h"
#include "util/util.h"

/* The host of repositories served by the API at url. */
char *
scm_repo_host(const char *url, const char *dflt)
{
	const char *p = url != NULL ? strstr(url, "://") : NULL;
	size_t n;

	if (p == NULL)
		return xstrdup(dflt);
	p += 3;
	n = strcspn(p, "/:");
	if (n == 0)
		return xstrdup(dflt);
	/* api.github.com serves github.com */
	if (n == 14 && strncmp(p, "api.github.com", 14) == 0)
		return xstrdup("github.com");
	return xstrndup(p, n);
}

/* s in ASCII lower case, a copy. */
static char *
ascii_lower(const char *s)
{
	char *out = xstrdup(s), *p;

	for (p = out; *p; p++)
		if (*p >= 'A' && *p <= 'Z')
			*p = (char)(*p - 'A' + 'a');
	return out;
}

/*
 * Whether glob matches HOST/repo, ignoring case: host names do, and
 * GitHub and GitLab find a repository or project whatever the case of its
 * path, so "MyOrg/..." is the glob of myorg/checkout too.
 */
int
scm_repo_match(const char *glob, const char *host, const char *repo)
{
	char *raw = xasprintf("%s/%s", host, repo), *id = ascii_lower(raw);
	char *g = ascii_lower(glob);
	int match = fnmatch(g, id, 0) == 0;

	free(raw);
	free(id);
	free(g);
	return match;
}

/* Whether repo of host matches one of the n globs (or n is 0). */
int
scm_repo_allowed(const char *const *globs, size_t n, const char *host,
    const char *repo)
{
	size_t i;

	if (n == 0)
		return 1;
	if (repo == NULL || host == NULL)
		return 0;
	for (i = 0; i < n; i++)
		if (scm_repo_match(globs[i], host, repo))
			return 1;
	return 0;
}
