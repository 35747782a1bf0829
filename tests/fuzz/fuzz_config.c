/*
 * Fuzz target of the YAML configuration parser: any input must give
 * either a config that config_release() frees whole, or an error whose
 * message has the "NAME:LINE: " shape; never a crash or a leak. Short
 * inputs also go through the duration and USD parsers.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct config c;
	char *cause = NULL, *s;

	if (config_parse(&c, "fuzz.yaml", (const char *)data, size,
	    &cause) == 0) {
		if (c.file == NULL || c.listen == NULL ||
		    c.api.listen == NULL || c.state_dir == NULL)
			abort();
		config_release(&c);
	} else {
		if (cause == NULL || strncmp(cause, "fuzz.yaml:", 10) != 0 ||
		    strchr(cause, '\n') != NULL)
			abort();
		free(cause);
	}

	if (size <= 64) {
		s = xstrndup((const char *)data, size);
		if (config_parse_duration(s) < -1 || config_parse_usd(s) < -1)
			abort();
		free(s);
	}
	return 0;
}
