/* kvringd's epoll set: the fds actors.c, server.c and kvringd.c register with the one loop (kvringd.c, run). */
#include <errno.h>
#include <sys/epoll.h>

#include "sup.h"

int sup_epoll_add(struct sup *s, int fd, struct sup_watch *w, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.ptr = w};
	return epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

void sup_epoll_del(struct sup *s, int fd)
{
	(void)epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
}
