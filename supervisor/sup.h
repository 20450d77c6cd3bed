/* kvringd internals: the supervisor's state shared by its modules (layout, actors, server, main loop). */
#ifndef KVR_SUP_H
#define KVR_SUP_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvr_config.h"
#include "kvr_ctl.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_proto.h"
#include "kvr_segment.h"
#include "kvr_slots.h"

/*
 * kvringd is single-threaded: one epoll loop (kvringd.c) over a signalfd, the listening
 * socket, every connected peer, every actor's readiness pipe and one timerfd that is
 * always armed for the earliest deadline (health tick, ready timeout, restart backoff,
 * stop escalation, drain). Modules:
 *   layout.c   the ring list and actor table of an instance, the segments
 *   actors.c   spawning, the restart state machine, health pings, reaping
 *   server.c   the socket: take-over, accept, peer credentials, timeouts, requests, INSPECT
 *   attach.c   the attach protocol: ATTACH, ATTACH_SCHED, DETACH and its fence, slot freeing
 *   kvringd.c  command line, startup, the loop, drain and shutdown
 *   epoll.c    the loop's epoll set (sup_epoll_add/del), which the others register with
 *   metrics.c  the HTTP listener (metrics.enabled): /metrics, and /status and / (status.c,
 *              status_html.c); libmicrohttpd on its own thread
 * Functions return 0 or -errno unless they say otherwise; they log what they do (this is
 * a program, not a library). The one other thread is the metrics server's: it only reads
 * the shared segments (atomic loads), fields of struct sup set before it starts, and the
 * copy of the engine table the loop hands it under its lock (sup_engine_publish).
 */

#define SUP_STOP_TERM_NS (2ull * 1000000000ull) /* STOP, then SIGTERM after 2 s ... */
#define SUP_STOP_KILL_NS (5ull * 1000000000ull) /* ... and SIGKILL after 5 s */
#define SUP_HEALTH_MAX_MISSED 5                 /* pings missed in a row before a kill -9 */
#define SUP_DRAIN_POLL_NS (10ull * 1000000ull)  /* drain: re-check the rings this often */
#define SUP_MAX_CONNS 128                       /* connected peers (inspect + attached workers) */
#define SUP_ACCEPT_PAUSE_NS (100ull * 1000000ull) /* accept failed for lack of fds: retry after */
#define SUP_MAX_REFUSED 8                       /* refused peers waiting for their reply to be read */

enum sup_watch_kind { W_SIGNAL, W_LISTEN, W_TIMER, W_CONN, W_READY };

/* What an epoll event points at. */
struct sup_watch {
	enum sup_watch_kind kind;
	void *ptr;
};

enum sup_phase {
	PH_RUN,   /* serving */
	PH_DRAIN, /* SIGTERM: no new work; waiting for the rings to empty */
	PH_STOP,  /* STOP sent to every actor; waiting for them to exit */
	PH_DONE,
};

struct sup_actor {
	unsigned index;
	struct kvr_actor_ent *ent;
	struct kvr_ring *ctl_in, *ctl_out;
	const char *exe;         /* executable path (one per kind, in struct sup) */
	pid_t pid;               /* 0 when not running */
	int ready_fd;            /* read end of the readiness pipe while STARTING, else -1 */
	struct sup_watch ready_watch;
	uint64_t deadline;       /* next TIMER event (CLOCK_MONOTONIC ns), 0 = none */
	uint64_t stop_ns;        /* when STOP was sent */
	bool term_sent;
	uint32_t backoff_ms;     /* delay of the next non-immediate restart */
	uint64_t *deaths;        /* ring of the last crash_loop_max_deaths death times */
	unsigned n_deaths, death_pos;
	uint32_t nonce;          /* of the last PING */
	bool ping_outstanding;
	unsigned missed;         /* pings missed in a row */
	uint64_t beat_seen;      /* the actor's heartbeat at the last health tick */
	uint64_t run_seen;       /* its time on a CPU (/proc/PID/schedstat, ns) at the last missed ping */
	uint64_t starved;        /* health ticks not counted as missed: it waited for a CPU all along */
};

/* An engine (engines.c): its identity, and how many workers and schedulers of it are attached. */
struct sup_engine_id {
	char id[48];             /* never "" ("default") */
	char model_ns[64];       /* "" = the instance's model.model_id */
};
struct sup_engine {
	struct sup_engine_id id;
	unsigned refs;           /* 0: the index is free */
	uint8_t model;           /* its model entry (kvr_ctl_model) */
};

struct sup_conn {
	int fd;                  /* -1 once dropped (sup_conns_reap frees it) */
	struct sup_watch watch;
	pid_t pid;
	uid_t uid;
	int worker;              /* attached worker slot, -1 if none */
	int sched;               /* attached scheduler slot, -1 if none */
	int fence_slot;          /* DETACH of this worker slot: answered once nothing of it can copy, -1 none */
	uint64_t fence_ns;       /* when that DETACH came (logged with the answer) */
	bool refused;            /* not the owner: answered -EACCES, closed on its next input */
	uint64_t deadline;       /* not attached by then (CLOCK_MONOTONIC ns): closed */
	struct sup_conn *next;
};

/* A DCP group being formed or served: dcp_size consecutive TP ranks, one gather actor
 * (actor SUP_ACTOR_GATHER(.., slot)) that serves every member's stores once all of them
 * attached (dcp_groups.c); each member loads through its own loader. */
struct sup_dcp_group {
	uint32_t tp_size, dcp_size, interleave;
	uint32_t index;                 /* tp_rank / dcp_size */
	int engine;                     /* the engine (kvringd's index) whose ranks form it: two
					 * engines' DCP ranks never share a group */
	int members[KVR_DCP_MAX];       /* worker slot of each DCP rank, -1 while missing; a
					 * group with no member is free */
	int owner;                      /* the worker whose commit rings its gather actor uses */
	bool reset_due;                 /* its gather actor ran: RESET the owner's slots if it
					 * exits while the group is incomplete */
};

/* Members attached to a group, and whether all dcp_size are. */
unsigned sup_group_members(const struct sup_dcp_group *gr);
static inline bool sup_group_complete(const struct sup_dcp_group *gr)
{
	return gr->dcp_size && sup_group_members(gr) == gr->dcp_size;
}

struct sup {
	struct kvr_config cfg;
	char *cfg_json;          /* effective config, embedded in the control segment */
	const char *argv0;
	struct kvr_segment ctl_seg, arena_seg, slots_seg;
	int area_fd[KVR_CTL_MAX_CLIENTS];      /* each client slot's area of ctl_seg (kvr_ctl_split_areas) */
	int area_next_fd[KVR_CTL_MAX_WORKERS]; /* a DETACHING worker slot's fresh area, until the
						* lookup actor maps it (kvr_ctl_area_fresh); -1 */
	bool area_map_failed[KVR_CTL_MAX_WORKERS]; /* ... and we could not map it yet (logged once) */
	struct kvr_ctl *ctl;
	struct kvr_ctl_rings rings;       /* our views of its rings (built once the layout is set) */
	struct kvr_slot_table *slots;  /* NULL until L1 is laid out (no model section: at the first attach) */
	char bound_by[96];             /* no model section: the worker whose geometry L1 was laid out for */
	bool l1_releasing;             /* no model section, nothing attached: L1 is being given up for another
					* format (sup_l1_release_begin); attaches are answered -EAGAIN meanwhile */
	/* the instance's model, as rank 0 of its TP group sees it (layout.c) */
	struct kvr_geometry geom;
	kvr_key ns;              /* key namespace */
	uint64_t lane_bytes;     /* one lane of one block */
	uint32_t lanes;          /* commit quorum */
	int kv_fd[KVR_CTL_MAX_WORKERS];        /* each attached worker's KV memory, -1 if none */
	uint64_t kv_bytes[KVR_CTL_MAX_WORKERS];
	uint32_t generation;

	int epfd, sigfd, tfd, listen_fd;
	struct sup_watch sig_watch, listen_watch, timer_watch;
	bool socket_bound;       /* we created cfg.instance.socket: unlink it on exit */

	char exe[KVR_ACTOR_REMOTE + 1][PATH_MAX]; /* per actor kind */
	struct sup_actor actors[KVR_CTL_MAX_ACTORS];
	unsigned n_actors;

	struct sup_conn *conns;
	unsigned n_conns, n_refused;
	struct sup_conn *dropped;   /* closed while epoll events may still point at them */
	uint64_t n_idle_closed;     /* connections closed for not attaching in time ... */
	uint64_t n_evicted;         /* ... and to make room at SUP_MAX_CONNS, since start */
	struct sup_conn *worker_conn[KVR_CTL_MAX_WORKERS];
	struct sup_dcp_group groups[KVR_CTL_MAX_WORKERS / 2];
	int worker_group[KVR_CTL_MAX_WORKERS]; /* a DCP worker's group slot until its slot is free, else -1 */
	bool worker_gone_sent[KVR_CTL_MAX_WORKERS]; /* a DETACHING worker's WORKER_GONE is on its way */
	uint32_t worker_gone_lgen[KVR_CTL_MAX_WORKERS]; /* ... to this generation of the lookup actor */

	struct sup_metrics *metrics; /* the /metrics server, NULL when disabled */

	pthread_t prefault_thread;  /* prefault.c: faults the arena in after start */
	bool prefault_running;
	atomic_bool prefault_stop;

	struct sup_engine engines[KVR_CTL_MAX_ENGINES];
	int worker_engine[KVR_CTL_MAX_WORKERS];  /* an attached worker's engine index, -1 if none */
	int sched_engine[KVR_CTL_MAX_SCHEDULERS];

	uint64_t accept_resume;  /* accept paused (out of fds) until then; 0 = not paused */
	bool accept_failing;     /* accept has failed since the last success (logged once) */

	enum sup_phase phase;
	uint64_t next_health;    /* 0 = not scheduled */
	uint64_t drain_deadline;
};

/* ---- layout.c --------------------------------------------------------------------- */

/* Actor indices in the actor table (kvr_ctl.h's KVR_ACTOR_IX_* with this config). */
#define SUP_ACTOR_LOOKUP KVR_ACTOR_IX_LOOKUP
#define SUP_ACTOR_LOADER(w) KVR_ACTOR_IX_LOADER(w)
#define SUP_ACTOR_STORER(w) KVR_ACTOR_IX_STORER(w)
#define SUP_ACTOR_DISK(max_workers, i) KVR_ACTOR_IX_DISK(max_workers, i) /* one per l2.dirs[i] */
/* one per possible DCP group (a group has at least 2 ranks) */
#define SUP_ACTOR_GATHER(cfg, g) KVR_ACTOR_IX_GATHER((cfg)->instance.max_workers, (cfg)->l2.n_dirs, g)
#define SUP_N_GATHER(cfg) KVR_N_GATHER((cfg)->instance.max_workers)
/* the remote tier actor: one when remote.cluster names a cluster, after the gather actors */
#define SUP_ACTOR_REMOTE(cfg) KVR_ACTOR_IX_REMOTE((cfg)->instance.max_workers, (cfg)->l2.n_dirs)
#define SUP_N_REMOTE(cfg) ((cfg)->remote.n_cluster ? 1u : 0u)
#define SUP_N_ACTORS(cfg) (SUP_ACTOR_REMOTE(cfg) + SUP_N_REMOTE(cfg))

/* The rings of an instance with max_workers worker slots: every actor's control pair and
 * every per-worker data ring, with capacity and endpoints. This is the one place that says
 * which rings exist (layout.c). Returns the count or -ENOSPC. */
int sup_ring_specs(const struct kvr_config *cfg, struct kvr_ctl_ring_spec *specs, unsigned cap);

/* Hand worker w's store-side rings (store.req/rep, commit.req/rep) to actor `storer` — a
 * DCP group's gather actor — or back to w's own storer (-1), with the endpoints of the
 * table sup_ring_specs builds from. kvringd calls it only while no actor serves them and
 * no client is attached, and first drops what is left on them: a request id carries the
 * generation of the actor it was addressed to, and a storer and a gather actor count
 * generations apart, so a stale request could pass for a current one of the other actor.
 * commit.req is left alone (the lookup actor consumes it; what it holds belongs to this
 * worker slot, which the next storer's or gather actor's RESET clears). */
void sup_storer_rings_bind(struct sup *s, unsigned w, int storer);

/* Supervisor-side checks of a parsed config (limits of this build). 0 or -EINVAL with
 * "$.key: reason" in err. */
int sup_check_config(const struct kvr_config *cfg, char *err, size_t errlen);

/* Create the control segment and the arena, fill the instance header and actor table.
 * Logs and returns -errno on failure (nothing left behind). */
int sup_segments_create(struct sup *s);
void sup_segments_close(struct sup *s);
/* No model section: lay L1 out for geometry g (an attaching worker's canonical block, as
 * rank 0 sees it), then start what a model section starts at once (lookup, disk and remote
 * actors, prefault, /metrics' view of the slot table). `who` names the worker in logs and
 * refusals. 0, or -errno with the reason in err naming the config key and sizes (a block
 * that does not fit the arena or a staging pool, a TP size beyond max_workers); nothing is
 * left half laid out. */
int sup_l1_bind(struct sup *s, const struct kvr_geometry *g, const char *who, char *err, size_t errlen);
/* No model section, L1 laid out, and no client attached (no worker in a slot but `except`,
 * DETACHING ones included; no scheduler): L1 may be given up for another slot format. */
bool sup_l1_idle(const struct sup *s, int except);
/* Give L1 up (sup_l1_idle held) so that the next worker lays it out for its own format: the
 * lookup, disk and remote actors are stopped (they drain as at a shutdown), the prefault
 * thread ends; sup_l1_release_update() finishes once they exited. `why` is logged. */
void sup_l1_release_begin(struct sup *s, const char *why);
/* Every loop turn: once the actors sup_l1_release_begin stopped are down, the slot table and
 * the arena go (a client still mapping them keeps its copy) and L1 is unbound. */
void sup_l1_release_update(struct sup *s);
/* The instance's geometry for TP rank `rank` (from model.* of the config). 0 or -errno,
 * with a reason in err naming the config key. */
int sup_model_geometry(const struct kvr_config *cfg, uint32_t rank, uint32_t num_blocks, struct kvr_geometry *ret,
		       char *err, size_t errlen);

/* ---- actors.c --------------------------------------------------------------------- */

enum sup_event { EV_SPAWNED, EV_READY, EV_DIED, EV_TIMER, EV_STOP, EV_N };

/* Resolve the executable of every actor kind (instance.actor_dir, the build tree next to
 * /proc/self/exe, KVR_LIBEXECDIR). -ENOENT with the reason in err. */
int sup_find_executables(struct sup *s, char *err, size_t errlen);
int sup_actors_init(struct sup *s);
void sup_actors_free(struct sup *s);
/* Start an IDLE actor (spawn it). */
void sup_actor_start(struct sup *s, struct sup_actor *a);
/* Feed an event to the state machine. status: the wait status for EV_DIED. */
void sup_actor_event(struct sup *s, struct sup_actor *a, enum sup_event ev, int status);
/* The readiness pipe of a became readable. */
void sup_actor_ready_input(struct sup *s, struct sup_actor *a);
/* Reap every exited child (SIGCHLD). */
void sup_reap(struct sup *s);
/* Fire due actor timers and the health tick. */
void sup_actor_timers(struct sup *s, uint64_t now);
/* Earliest actor deadline (0 = none). */
uint64_t sup_actor_next_deadline(const struct sup *s);
/* True when no actor process is alive. */
bool sup_actors_all_down(const struct sup *s);
/* Send a message to an actor's ctl.in without blocking. 0 or -EAGAIN. */
int sup_actor_send(struct sup_actor *a, const void *msg);

/* ---- server.c --------------------------------------------------------------------- */

/* Take over cfg.instance.socket: refuse when another instance answers on it (returns 1,
 * message printed), replace a stale one, create the parent directory. Returns 0 to go
 * on, or the exit code. Does not bind. */
int sup_socket_takeover(struct sup *s);
/* Bind, chmod and listen; adds the socket to epoll. 0 or -errno (logged). */
int sup_socket_listen(struct sup *s);
/* Close and unlink the listening socket (drain and exit). */
void sup_socket_close(struct sup *s);
void sup_accept(struct sup *s);
/* Resume accepting after a pause (EMFILE and the like), once accept_resume has passed. */
void sup_accept_resume(struct sup *s, uint64_t now);
void sup_conn_input(struct sup *s, struct sup_conn *c, uint32_t events);
void sup_conns_close_all(struct sup *s);
/* Un-attached connections (none yet, a refused peer, one that sent DETACH) are closed
 * supervisor.attach_timeout_ms after they were accepted or detached, so idle peers cannot
 * hold the SUP_MAX_CONNS connections; at the limit, accepting a new one closes the oldest
 * un-attached one instead of refusing the newcomer. An attached worker is never closed. */
/* Earliest such deadline (0 = none). */
uint64_t sup_conns_next_deadline(const struct sup *s);
/* Close the connections whose deadline passed. Call outside an epoll batch. */
void sup_conns_expire(struct sup *s, uint64_t now);
/* Free the connections sup_accept closed to make room; call after each epoll batch. */
void sup_conns_reap(struct sup *s);
/* What attach.c answers with. A reply record (no payload, no descriptors) with status and
 * the reason fmt formats (NULL: none), for kvringd's generation. */
void sup_rep_init(const struct sup *s, struct kvr_proto_rep *rep, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Send rep (its header and payload_len bytes of payload) with n_fds descriptors on fd. 0 or -errno. */
int sup_send_rep(int fd, const struct kvr_proto_rep *rep, const int *fds, unsigned n_fds);
/* An attach reply (rep, n_fds 2) with the control segment, read-only, and client slot
 * `area`'s area, read-write: all a client may write. 0 or -errno. */
int sup_send_client_fds(struct sup *s, int sock, const struct kvr_proto_rep *rep, unsigned area);
/* Whether c holds a worker or a scheduler slot. */
bool sup_conn_attached(const struct sup_conn *c);
/* supervisor.attach_timeout_ms in ns: how long an un-attached connection is kept. */
uint64_t sup_attach_timeout_ns(const struct sup *s);

/* ---- attach.c: the attach protocol ------------------------------------------------ */

/* ATTACH from c (the request, its descriptors: fds[0], the worker's KV memory, is taken
 * (set to -1) when adopted): validated against the instance's model, a worker slot filled,
 * its loader and storer (or its DCP group's gather actor) started, answered — or refused
 * with the reason in the reply. */
void sup_handle_attach(struct sup *s, struct sup_conn *c, const struct kvr_proto_req *req, int *fds,
		       unsigned n_fds);
/* ATTACH_SCHED from c: a scheduler slot for an engine's scheduler, answered or refused. */
void sup_handle_attach_sched(struct sup *s, struct sup_conn *c, const struct kvr_proto_req *req, unsigned n_fds);
/* DETACH from c: a scheduler is answered at once, a worker once nothing of it can copy (its
 * fence, sup_workers_update); -ENOTCONN when c is not attached. */
void sup_handle_detach(struct sup *s, struct sup_conn *c);
/* c's connection is closing: the worker or scheduler it attached (if any) detaches. */
void sup_conn_detach(struct sup *s, struct sup_conn *c);
/* Free DETACHING worker slots whose loader and storer have exited. */
void sup_workers_update(struct sup *s);

/* ---- limits.c ---- */
/* RLIMIT_NOFILE against what cfg's processes hold open (the count is in limits.c; the actors
 * inherit kvringd's limit): a soft limit below it is raised to the hard limit (logged). 0, or
 * -EMFILE when the hard limit is below it, with "RLIMIT_NOFILE soft S hard H, this config
 * needs at least N (which process): raise it (ulimit -n N) or ..." in err. */
int sup_nofile_check(const struct kvr_config *cfg, char *err, size_t errlen);

/* ---- prefault.c ---- */
/* Fault the arena in from a background thread (l1.prefault "background"), or say why not
 * (ctl->prefault_state). Never fails kvringd. */
void sup_prefault_start(struct sup *s);
/* Stop the thread and wait for it (before the arena is unmapped). */
void sup_prefault_stop(struct sup *s);

/* ---- engines.c ---- */
/* Validate an attach's engine identity into *ret ("" engine_id = "default"). 0, or -EINVAL
 * with the reason in why. */
int sup_engine_parse(const struct kvr_attach_engine *in, struct sup_engine_id *ret, char *why, size_t len);
/* The engine's index (a new one, or the attached engine of that id: its model_ns must be
 * the same), its client count +1. -EINVAL (model_ns differs) / -EBUSY (no free index), why set. */
int sup_engine_join(struct sup *s, const struct sup_engine_id *e, char *why, size_t len);
/* A client of engine ix left (ix < 0: none). */
void sup_engine_leave(struct sup *s, int ix);
/* The model name that goes into engine e's key namespace. */
const char *sup_engine_model(const struct sup *s, const struct sup_engine_id *e);
/* The geometry of an attached worker of engine ix (any rank: a namespace does not depend
 * on it), or NULL when none is attached. */
const struct kvr_geometry *sup_engine_geometry(const struct sup *s, int ix);
/* Key namespace of geometry g for engine ix (kvr_geometry_namespace with its model). */
int sup_engine_namespace(const struct sup *s, int ix, const struct kvr_geometry *g, kvr_key *ret);
/* The engines attached now, in index order, with their worker and scheduler slots attached
 * (a detaching worker no longer counts): what INSPECT sends and /status shows. Returns the
 * number of entries written to ret. */
unsigned sup_engine_table(const struct sup *s, struct kvr_inspect_engine ret[KVR_CTL_MAX_ENGINES]);
/* After an attach or a detach changed the engines or their clients: hand the table to the
 * HTTP listener's pages (sup_metrics_engines), which must not read kvringd's memory. */
void sup_engine_publish(struct sup *s);

/* ---- dcp_groups.c: DCP groups and their gather actors --------------------------------- */

void sup_groups_init(struct sup *s);
/* Worker slot w (validated DCP rank geometry g, not yet attached) joins its group: its
 * store rings are handed to the group's gather actor, which starts once every rank is there.
 * The gather actor's index, or -errno with one line in err (another layout in the same
 * group, no free group slot). */
int sup_group_join(struct sup *s, unsigned w, const struct kvr_geometry *g, int engine, char *err, size_t errlen);
/* Worker w left: its group's gather actor stops (the group is incomplete). */
void sup_group_leave(struct sup *s, unsigned w);
/* Whether detached worker w's slot can be freed (its gather actor exited); when it can,
 * its store rings go back to its own storer. Non-DCP workers: true. */
bool sup_group_release(struct sup *s, unsigned w);
/* Start the gather actor of every complete group that is not running. */
void sup_groups_update(struct sup *s);
/* Gather actor index -> its group (NULL when the index is not a gather actor). */
const struct sup_dcp_group *sup_gather_group(const struct sup *s, unsigned actor);

/* ---- metrics.c -------------------------------------------------------------------- */

/* metrics.enabled: bind and listen on metrics.listen now, before any actor starts (serving
 * begins with sup_metrics_start()). 0 (also when disabled), or -errno with
 * "cannot listen on HOST:PORT: reason" in err. */
int sup_metrics_open(struct sup *s, char *err, size_t errlen);
/* Serve GET /metrics, /status and / on the bound socket from libmicrohttpd's own thread; reads s->ctl,
 * s->slots and s->cfg, which must stay valid until sup_metrics_close(). 0 or -errno (logged). */
int sup_metrics_start(struct sup *s);
/* Stop serving and close the socket (before the segments are unmapped). Idempotent. */
void sup_metrics_close(struct sup *s);
/* Hold off renders while the main thread changes what they read (a client area mapped over
 * its place: kvr_ctl_map_area). No-ops when /metrics is disabled. */
void sup_metrics_pause(struct sup *s);
void sup_metrics_resume(struct sup *s);
/* The main thread (sup_engine_publish): copy the engine table t[n] that /status and / show,
 * under the lock. No-op when /metrics is disabled. */
void sup_metrics_engines(struct sup *s, const struct kvr_inspect_engine *t, unsigned n);
/* The main thread, once L1 is laid out at the first attach (sup_l1_bind): the slot table and
 * block size the pages read from then on, under the lock. No-op when /metrics is disabled. */
void sup_metrics_bind(struct sup *s);

/* What one scrape reads. The renderer keeps derived counters monotonic in it. */
struct sup_metrics_view {
	const struct kvr_ctl *ctl;          /* required */
	const struct kvr_slot_table *slots; /* NULL: no kvring_l1_slots series */
	uint64_t l1_misses;                 /* last kvring_l1_misses_total rendered */
	/* /status: the engines attached (kvringd's own table, copied by sup_metrics_engines()
	 * under the lock); NULL: unknown ("engines": null) */
	const struct kvr_inspect_engine *engines;
	unsigned n_engines;
};

/* The exposition (Prometheus text format 0.0.4) of everything v points at, NUL-terminated,
 * with its length in *ret_len. Returns a buffer the caller frees, or NULL (out of memory). */
char *sup_metrics_render(struct sup_metrics_view *v, size_t *ret_len);

/* ---- epoll.c ---------------------------------------------------------------------- */

/* Watch fd in the loop's epoll set; its events come back as w. 0 or -errno. */
int sup_epoll_add(struct sup *s, int fd, struct sup_watch *w, uint32_t events);
/* Stop watching fd (errors ignored: a closed fd has left the set already). */
void sup_epoll_del(struct sup *s, int fd);

#endif
