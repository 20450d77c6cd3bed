/* notify: systemd's readiness protocol (sd_notify(3)) without libsystemd — a datagram to $NOTIFY_SOCKET. */
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvr_log.h"

/*
 * Under a unit of Type=notify, systemd sets NOTIFY_SOCKET to a datagram socket (a path, or
 * "@name" in the abstract namespace) and counts the service started when "READY=1" arrives
 * there, stopping when "STOPPING=1" does. kvringd sends READY=1 once its lookup actor is
 * ready (the instance admits workers: an engine ordered After=kvring.service finds a socket
 * that answers), STOPPING=1 when it begins to drain. Outside systemd NOTIFY_SOCKET is unset
 * and nothing is sent. The variable is taken out of the environment at start so that the
 * actors kvringd spawns do not inherit it (systemd's NotifyAccess=main would refuse them
 * anyway; an actor must never speak for the service).
 */

static struct sockaddr_un addr;
static socklen_t addr_len;

void sup_notify_init(void)
{
	const char *p = getenv("NOTIFY_SOCKET");
	if (!p || !*p)
		return;
	size_t n = strlen(p);
	if ((p[0] != '/' && p[0] != '@') || n >= sizeof(addr.sun_path)) {
		kvr_warn("NOTIFY_SOCKET=%s: not an absolute path or an abstract socket name: systemd is not told "
			 "when kvringd is ready",
			 p);
	} else {
		addr.sun_family = AF_UNIX;
		memcpy(addr.sun_path, p, n);
		if (p[0] == '@')
			addr.sun_path[0] = '\0'; /* abstract namespace: no trailing NUL counts */
		addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (p[0] == '/' ? 1 : 0));
	}
	(void)unsetenv("NOTIFY_SOCKET");
}

int sup_notify(const char *state)
{
	if (!addr_len)
		return 0;
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *)&addr, addr_len);
	int rc = w < 0 ? -errno : 0;
	(void)close(fd);
	if (rc)
		kvr_warn("cannot tell systemd \"%s\" (NOTIFY_SOCKET): %s", state, strerror(-rc));
	return rc;
}
