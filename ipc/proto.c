/* Attach protocol transport: SOCK_SEQPACKET records with SCM_RIGHTS descriptors. */
#include "kvr_proto.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int kvr_proto_send(int sock, const void *rec, size_t len, const int *fds, unsigned n_fds)
{
	if (n_fds > KVR_PROTO_MAX_FDS || (n_fds && !fds))
		return -EINVAL;
	struct iovec iov = {.iov_base = (void *)rec, .iov_len = len};
	union {
		char buf[CMSG_SPACE(sizeof(int) * KVR_PROTO_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (n_fds) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * n_fds);
	}
	ssize_t n;
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EMSGSIZE;
}

ssize_t kvr_proto_recv(int sock, void *rec, size_t cap, int *ret_fds, unsigned max_fds, unsigned *ret_n_fds)
{
	struct iovec iov = {.iov_base = rec, .iov_len = cap};
	union {
		char buf[CMSG_SPACE(sizeof(int) * KVR_PROTO_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
	ssize_t n;
	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;

	unsigned got = 0;
	int fds[KVR_PROTO_MAX_FDS];
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (unsigned i = 0; i < k && got < KVR_PROTO_MAX_FDS; i++)
			memcpy(&fds[got++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
	}
	if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || got > max_fds) {
		for (unsigned i = 0; i < got; i++)
			close(fds[i]);
		return -EMSGSIZE;
	}
	if (got)
		memcpy(ret_fds, fds, sizeof(int) * got);
	if (ret_n_fds)
		*ret_n_fds = got;
	return n;
}

int kvr_proto_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (!path || strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}
