/* ringbench transport "pipe": two anonymous pipes, one write(2)/read(2) per 64-byte message. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ringbench.h"

struct rb_chan {
	int tx, rx;
};

static int pipe_setup(struct rb_env *env, char *why, size_t len)
{
	if (pipe2(env->pipe_a2b, O_CLOEXEC) < 0) {
		snprintf(why, len, "pipe: %s", strerror(errno));
		return -errno;
	}
	if (pipe2(env->pipe_b2a, O_CLOEXEC) < 0) {
		int rc = -errno;
		snprintf(why, len, "pipe: %s", strerror(errno));
		close(env->pipe_a2b[0]);
		close(env->pipe_a2b[1]);
		return rc;
	}
	return 0;
}

static void pipe_teardown(struct rb_env *env)
{
	for (int i = 0; i < 2; i++) {
		close(env->pipe_a2b[i]);
		close(env->pipe_b2a[i]);
	}
}

static int pipe_open(struct rb_env *env, enum rb_role role, struct rb_chan **ret, char *why, size_t len)
{
	struct rb_chan *c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	c->tx = role == RB_A ? env->pipe_a2b[1] : env->pipe_b2a[1];
	c->rx = role == RB_A ? env->pipe_b2a[0] : env->pipe_a2b[0];
	*ret = c;
	return 0;
}

static int pipe_send(struct rb_chan *c, const struct kvr_msg *m)
{
	/* 64 bytes <= PIPE_BUF: one write is atomic and whole */
	for (;;) {
		ssize_t n = write(c->tx, m, sizeof(*m));
		if (n == (ssize_t)sizeof(*m))
			return 0;
		if (n >= 0)
			return -EIO;
		if (errno != EINTR)
			return -errno;
	}
}

static int pipe_recv(struct rb_chan *c, struct kvr_msg *m)
{
	size_t got = 0;
	while (got < sizeof(*m)) {
		ssize_t n = read(c->rx, (uint8_t *)m + got, sizeof(*m) - got);
		if (n > 0)
			got += (size_t)n;
		else if (n == 0)
			return -EPIPE;
		else if (errno != EINTR)
			return -errno;
	}
	return 0;
}

static void pipe_close(struct rb_chan *c)
{
	free(c);
}

const struct rb_transport rb_pipe_transport = {
	.name = "pipe",
	.label = "pipe",
	.setup = pipe_setup,
	.teardown = pipe_teardown,
	.open = pipe_open,
	.send = pipe_send,
	.recv = pipe_recv,
	.close = pipe_close,
};
