/* notify: sd_notify(3)'s protocol for kvringd under a Type=notify systemd unit (notify.c). */
#ifndef KVR_SUP_NOTIFY_H
#define KVR_SUP_NOTIFY_H

/* Take $NOTIFY_SOCKET (and remove it from the environment: actors never inherit it). */
void sup_notify_init(void);
/* Send `state` ("READY=1", "STOPPING=1") to it; 0, or -errno (logged). No-op without one. */
int sup_notify(const char *state);

#endif
