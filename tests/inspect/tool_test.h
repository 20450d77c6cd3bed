/* tool_test: run a program from the build tree with its output in files, read them back (inspect/ringbench tests). */
#ifndef KVR_TOOL_TEST_H
#define KVR_TOOL_TEST_H

#include <criterion/criterion.h>

#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

extern char **environ;

/* Start <KVR_BUILD_ROOT>/rel_exe with args (NULL-terminated, at most 14); stdout goes to
 * out_path, stderr to err_path. Returns the pid. */
static inline pid_t tool_spawn(const char *rel_exe, const char *const *args, const char *out_path,
			       const char *err_path)
{
	const char *root = getenv("KVR_BUILD_ROOT");
	cr_assert_not_null(root, "KVR_BUILD_ROOT is not set (run through meson test)");
	char exe[512];
	snprintf(exe, sizeof(exe), "%s/%s", root, rel_exe);
	char *argv[16] = {exe};
	int n = 1;
	for (; args[n - 1] && n < 15; n++)
		argv[n] = (char *)args[n - 1];
	argv[n] = NULL;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	pid_t pid;
	cr_assert_eq(posix_spawn(&pid, exe, &fa, NULL, argv, environ), 0, "cannot run %s", exe);
	posix_spawn_file_actions_destroy(&fa);
	return pid;
}

/* The whole file as a string (caller frees); "" when it is empty. */
static inline char *tool_slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	char *buf = NULL;
	size_t cap = 0;
	if (getdelim(&buf, &cap, '\0', f) < 0) {
		free(buf);
		buf = strdup("");
	}
	fclose(f);
	return buf;
}

#endif
