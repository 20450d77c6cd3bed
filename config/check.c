/* config: the checks across keys made once every key has parsed (cfg_checks_doc lists them for the docs), the
 * derived fields, the defaults, and the check of l2.dirs against the disk. */
#include "config_table.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "kvr_geometry.h"


/* Fill the geometry from model.preset, refusing explicit values that contradict it. set: which keys were given
 * (NULL: none; model.attention given must match the preset, else it is taken from it). No preset and no geometry:
 * no model (bound at the first attach), and the keys that describe one must not be given. */
static int resolve_model(struct kvr_config *c, const bool *set, char *err, size_t errlen)
{
	static const char *const shape[] = { "block_tokens", "tp_size", "attention", "kv_layout" };
	bool attention_set = set && set[cfg_key_find("model", "attention") - cfg_keys];
	struct {
		const char *name;
		uint32_t *v, preset;
	} g[] = {
		{ "layers", &c->model.layers, 0 },
		{ "kv_heads", &c->model.kv_heads, 0 },
		{ "head_dim", &c->model.head_dim, 0 },
		{ "dtype_bytes", &c->model.dtype_bytes, 0 },
	};
	const struct kvr_preset *p;
	const char *attention;
	int attention_id;

	if (c->model.preset[0] == '\0') {
		/* no preset and no geometry at all: no model, bound at the first attach */
		c->model.unbound = !c->model.layers && !c->model.kv_heads && !c->model.head_dim && !c->model.dtype_bytes;
		/* given at other than its default (the defaults round-trip through kvr_config_to_json) */
		struct kvr_config d;
		cfg_table_defaults(&d);
		const bool differs[] = { c->model.block_tokens != d.model.block_tokens, c->model.tp_size != d.model.tp_size,
					 strcmp(c->model.attention, d.model.attention) != 0,
					 strcmp(c->model.kv_layout, d.model.kv_layout) != 0 };
		for (size_t i = 0; c->model.unbound && set && i < ARRAY_SIZE(shape); i++)
			if (set[cfg_key_find("model", shape[i]) - cfg_keys] && differs[i])
				return FAIL("$.model.%s: given without a model: set model.preset (or model.layers, "
					    "kv_heads, head_dim, dtype_bytes), or leave it out and the instance takes the "
					    "first worker's geometry", shape[i]);
		if (c->model.unbound)
			return 0;
		for (size_t i = 0; i < ARRAY_SIZE(g); i++)
			if (*g[i].v == 0)
				return FAIL("$.model.%s: required when model.preset is empty", g[i].name);
		if (c->model.dtype_bytes == 3)
			return FAIL("$.model.dtype_bytes: 3 is not 1, 2 or 4");
		if (c->model.model_id[0] == '\0')
			return FAIL("$.model.model_id: required when model.preset is empty (without it two models of "
				    "one geometry would share blocks)");
		return 0;
	}
	p = kvr_preset_find(c->model.preset);
	if (!p)
		return FAIL("$.model.preset: internal error: no geometry for \"%s\"", c->model.preset);
	g[0].preset = p->layers;
	g[1].preset = p->kv_heads_total;
	g[2].preset = p->head_dim;
	g[3].preset = p->dtype_bytes;
	for (size_t i = 0; i < ARRAY_SIZE(g); i++) {
		if (*g[i].v && *g[i].v != g[i].preset)
			return FAIL("$.model.%s: %" PRIu32 " conflicts with model.preset \"%s\" (%" PRIu32 ")",
				    g[i].name, *g[i].v, p->name, g[i].preset);
	}
	attention_id = p->attention == KVR_ATTN_MLA ? CFG_ATTN_MLA : CFG_ATTN_MHA;
	attention = cfg_enum_value(cfg_key_find("model", "attention"), (unsigned)attention_id);
	if (attention_set && cfg_enum_index("model", "attention", c->model.attention) != attention_id)
		return FAIL("$.model.attention: \"%s\" conflicts with model.preset \"%s\" (%s)", c->model.attention,
			    p->name, attention);
	for (size_t i = 0; i < ARRAY_SIZE(g); i++)
		*g[i].v = g[i].preset;
	set_str(c->model.attention, sizeof(c->model.attention), attention);
	if (c->model.model_id[0] == '\0')
		set_str(c->model.model_id, sizeof(c->model.model_id), p->hf_id ? p->hf_id : p->name);
	return 0;
}

/* Bytes of one block of one TP rank (MLA: every rank holds the whole latent; TP over the KV heads: one
 * replicated head a rank). Fits in 64 bits: each factor is bounded by the key table. */
static uint64_t block_bytes_per_rank(const struct kvr_config *c)
{
	uint64_t heads;

	if (c->model.mla)
		heads = c->model.kv_heads;
	else if (c->model.tp_size > c->model.kv_heads)
		heads = 1;
	else
		heads = c->model.kv_heads / c->model.tp_size;

	return (uint64_t)c->model.layers * heads * c->model.head_dim * c->model.dtype_bytes * c->model.block_tokens *
	       (c->model.mla ? 1 : 2);
}

/* "host:port", port 1..65535; an IPv6 host in brackets. */
bool cfg_listen_valid(const char *s)
{
	const char *colon = strrchr(s, ':');
	size_t hlen, plen;
	unsigned long port;

	if (!colon)
		return false;
	hlen = (size_t)(colon - s);
	plen = strlen(colon + 1);
	if (hlen == 0 || plen == 0 || plen > 5 || strspn(colon + 1, "0123456789") != plen)
		return false;
	port = strtoul(colon + 1, NULL, 10);
	if (port < 1 || port > 65535)
		return false;
	if (s[0] == '[')
		return hlen > 2 && s[hlen - 1] == ']' && !memchr(s + 1, ']', hlen - 2) && !memchr(s, ' ', hlen);
	return !memchr(s, ':', hlen) && !memchr(s, ' ', hlen) && !memchr(s, '[', hlen) && !memchr(s, ']', hlen);
}

/* The checks of sizes against one block of `block` bytes (one rank's): each staging pool holds a buffer, each L2
 * dir's share a block file. block 0: no model yet (checked again when one binds). */
static int check_sizes(const struct kvr_config *c, uint64_t block, char *err, size_t errlen)
{
	uint64_t buf, load, store, small;
	const char *pool;

	load = c->staging.ceiling_bytes * c->staging.load_percent / 100;
	store = c->staging.ceiling_bytes - load;
	buf = c->staging.buffer_bytes ? c->staging.buffer_bytes : block;
	pool = load <= store ? "load" : "store";
	small = load <= store ? load : store;
	if (c->staging.buffer_bytes && buf > small)
		return FAIL("$.staging.buffer_bytes: %" PRIu64 " does not fit the %s pool (%" PRIu64 " bytes)", buf,
			    pool, small);
	if (buf > small)
		return FAIL("$.staging.ceiling_bytes: the %s pool (%" PRIu64 " bytes) cannot hold one block (%" PRIu64
			    " bytes)", pool, small, buf);
	if (c->l2.n_dirs > 0 && c->l2.capacity_bytes == 0)
		return FAIL("$.l2.capacity_bytes: required when l2.dirs is not empty");
	/* each dir's share must hold one block file (a 4 KiB header + one rank's block, 4 KiB aligned: a lower
	 * bound, the slot may be larger): else every write to it fails */
	if (!block)
		return 0;
	buf = 4096 + (block + 4095) / 4096 * 4096;
	if (c->l2.n_dirs > 0 && c->l2.capacity_bytes / c->l2.n_dirs < buf)
		return FAIL("$.l2.capacity_bytes: %" PRIu64 " split over %" PRIu32 " l2.dirs leaves %" PRIu64
			    " bytes a dir, less than one block file (%" PRIu64 " bytes)", c->l2.capacity_bytes,
			    c->l2.n_dirs, c->l2.capacity_bytes / c->l2.n_dirs, buf);
	return 0;
}

int cfg_check_config(struct kvr_config *c, const bool *set, char *err, size_t errlen)
{
	char s[80];
	int r;

	if (!(c->instance.socket_mode & 0200))
		return FAIL("$.instance.socket_mode: \"%04" PRIo32 "\" lacks owner write (0200): only the instance "
			    "owner may attach, and connecting needs write permission", c->instance.socket_mode);
	if (c->rings.capacity & (c->rings.capacity - 1))
		return FAIL("$.rings.capacity: %" PRIu32 " is not a power of two", c->rings.capacity);
	if (c->timeouts.reply_ms >= c->timeouts.alloc_wait_ms)
		return FAIL("$.timeouts.reply_ms: %" PRIu32 " must be below timeouts.alloc_wait_ms (%" PRIu32 "): a "
			    "reply dropped for a full ring must not outlast a wait for room", c->timeouts.reply_ms,
			    c->timeouts.alloc_wait_ms);
	if (c->timeouts.alloc_wait_ms >= c->timeouts.lookup_call_ms)
		return FAIL("$.timeouts.alloc_wait_ms: %" PRIu32 " must be below timeouts.lookup_call_ms (%" PRIu32
			    "): the storer would give up on an ALLOC the lookup actor still holds", c->timeouts.alloc_wait_ms,
			    c->timeouts.lookup_call_ms);
	if (c->timeouts.l2_answer_ms >= c->timeouts.lookup_call_ms)
		return FAIL("$.timeouts.l2_answer_ms: %" PRIu32 " must be below timeouts.lookup_call_ms (%" PRIu32 ")",
			    c->timeouts.l2_answer_ms, c->timeouts.lookup_call_ms);
	if (c->supervisor.restart_backoff_initial_ms > c->supervisor.restart_backoff_max_ms)
		return FAIL("$.supervisor.restart_backoff_initial_ms: %" PRIu32
			    " exceeds supervisor.restart_backoff_max_ms (%" PRIu32 ")",
			    c->supervisor.restart_backoff_initial_ms, c->supervisor.restart_backoff_max_ms);
	r = resolve_model(c, set, err, errlen);
	if (r < 0)
		return r;
	cfg_derive(c); /* the model's attention is final: every check below reads the derived fields */
	if (!c->model.unbound && !c->model.mla && c->model.kv_heads % c->model.tp_size && c->model.tp_size % c->model.kv_heads)
		return FAIL("$.model.tp_size: %" PRIu32 " neither divides model.kv_heads (%" PRIu32
			    ") nor is a multiple of it", c->model.tp_size, c->model.kv_heads);
	if (c->model.mla && c->model.kv_fused)
		return FAIL("$.model.kv_layout: \"kv-fused\" is for K and V pages (mha); an mla layer has one latent "
			    "page already");
	if (!c->model.unbound && c->model.tp_size > c->instance.max_workers)
		return FAIL("$.model.tp_size: %" PRIu32 " exceeds instance.max_workers (%" PRIu32 "): each rank of a "
			    "TP group attaches as one worker, so no group could ever be complete",
			    c->model.tp_size, c->instance.max_workers);
	if (c->l1.capacity_bytes && c->l1.workload_prompts)
		return FAIL("$.l1.workload_prompts: only used when l1.capacity_bytes is 0 (it is %" PRIu64 ")",
			    c->l1.capacity_bytes);
	if (c->l1.capacity_bytes && c->l1.workload_tokens)
		return FAIL("$.l1.workload_tokens: only used when l1.capacity_bytes is 0 (it is %" PRIu64 ")",
			    c->l1.capacity_bytes);
	if (c->l1.capacity_bytes == 0 && c->l1.workload_prompts == 0)
		return FAIL("$.l1.workload_prompts: required when l1.capacity_bytes is 0");
	if (c->l1.capacity_bytes == 0 && c->l1.workload_tokens == 0)
		return FAIL("$.l1.workload_tokens: required when l1.capacity_bytes is 0");

	r = check_sizes(c, c->model.unbound ? 0 : block_bytes_per_rank(c), err, errlen);
	if (r < 0)
		return r;
	if (c->l2.read_only && c->l2.n_dirs == 0)
		return FAIL("$.l2.read_only: needs l2.dirs (there is no disk store to serve)");
	if (c->metrics.enabled && !cfg_listen_valid(c->metrics.listen))
		return FAIL("$.metrics.listen: invalid \"%s\" (expected host:port, port 1..65535)",
			    cfg_clean(c->metrics.listen, s, sizeof(s)));
	if (c->remote.tls)
		return FAIL("$.remote.tls: TLS is not built into this kvring (hiredis without hiredis_ssl): use a "
			    "private network or a TLS proxy, and tls false");
	if (c->remote.password[0] == 0 && c->remote.user[0])
		return FAIL("$.remote.user: \"%s\" needs remote.password", cfg_clean(c->remote.user, s, sizeof(s)));
	return 0;
}

int kvr_config_check_block(const struct kvr_config *cfg, uint64_t lane_bytes, char *err, size_t errlen)
{
	return check_sizes(cfg, lane_bytes, err, errlen);
}

/* --- public -------------------------------------------------------------------------------------------------- */

/* The derived fields of the enum keys (kvr_config.h): the strings were checked against their values[], each
 * of which sits at the index of its enum (config.c). */
void cfg_derive(struct kvr_config *c)
{
	c->instance.log_level_id = cfg_enum_index("instance", "log_level", c->instance.log_level);
	c->model.mla = cfg_enum_index("model", "attention", c->model.attention) == CFG_ATTN_MLA;
	c->model.kv_fused = cfg_enum_index("model", "kv_layout", c->model.kv_layout) == CFG_KV_FUSED;
	c->l1.prefault_background = cfg_enum_index("l1", "prefault", c->l1.prefault) == CFG_PREFAULT_BACKGROUND;
	c->l1.eviction_id = (enum kvr_cfg_eviction)cfg_enum_index("l1", "eviction", c->l1.eviction);
	c->l2.write_back = cfg_enum_index("l2", "mode", c->l2.mode) == CFG_L2_WRITE_BACK;
	c->l2.durability_id = (enum kvr_cfg_durability)cfg_enum_index("l2", "durability", c->l2.durability);
}

void kvr_config_defaults(struct kvr_config *cfg)
{
	char err[8];

	cfg_table_defaults(cfg);
	(void) resolve_model(cfg, NULL, err, sizeof(err)); /* the default (no model) always resolves (tested) */
	cfg_derive(cfg);
}

/* --- the disk ------------------------------------------------------------------------------------------------ */

/* Where an absolute path leads, for "the same directory": the deepest directory on it that exists (st_dev,
 * st_ino; stat follows symlinks) and the lexical rest below it ("" when the whole path exists). */
struct dir_id {
	bool found;
	dev_t dev;
	ino_t ino;
	char norm[KVR_PATH_MAX + 2];
	const char *rest;
};

static void dir_identity(const char *path, struct dir_id *ret)
{
	struct stat st;
	size_t cut;
	char save;
	bool ok;

	cfg_path_lexical(path, ret->norm);
	cut = strlen(ret->norm);
	for (;;) {
		save = ret->norm[cut];
		ret->norm[cut] = '\0';
		ok = stat(cut ? ret->norm : "/", &st) == 0;
		ret->norm[cut] = save;
		if (ok || cut == 0)
			break;
		do
			cut--;
		while (cut > 0 && ret->norm[cut] != '/');
	}
	ret->found = ok;
	ret->dev = ok ? st.st_dev : 0;
	ret->ino = ok ? st.st_ino : 0;
	ret->rest = ret->norm + (ok ? cut : 0);
}

int kvr_config_check_fs(const struct kvr_config *cfg, char *err, size_t errlen)
{
	struct dir_id id[KVR_L2_MAX_DIRS];
	char a[80], b[80];
	uint32_t n;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!cfg)
		return FAIL("config: no configuration");
	n = cfg->l2.n_dirs < KVR_L2_MAX_DIRS ? cfg->l2.n_dirs : KVR_L2_MAX_DIRS;
	for (uint32_t i = 0; i < n; i++) {
		dir_identity(cfg->l2.dirs[i], &id[i]);
		for (uint32_t j = 0; j < i; j++) {
			if (!id[i].found || !id[j].found || id[i].dev != id[j].dev || id[i].ino != id[j].ino ||
			    strcmp(id[i].rest, id[j].rest))
				continue;
			return FAIL("$.l2.dirs[%" PRIu32 "]: duplicate of $.l2.dirs[%" PRIu32 "]: \"%s\" is the same "
				    "directory as \"%s\" (same device and inode%s)", i, j,
				    cfg_clean(cfg->l2.dirs[i], a, sizeof(a)), cfg_clean(cfg->l2.dirs[j], b, sizeof(b)),
				    id[i].rest[0] ? " of an existing parent" : "");
		}
	}
	return 0;
}
