/* gen-config-doc: prints docs/config.md from the config key table (BUILDDIR/tests/config/gen-config-doc). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_config.h"

int main(void)
{
	char *md = kvr_config_doc_markdown();
	size_t len;

	if (!md) {
		fprintf(stderr, "gen-config-doc: out of memory\n");
		return 1;
	}
	len = strlen(md);
	if (fwrite(md, 1, len, stdout) != len || fflush(stdout)) {
		fprintf(stderr, "gen-config-doc: write failed\n");
		free(md);
		return 1;
	}
	free(md);
	return 0;
}
