/* Message tests: every decoder accepts good messages and rejects a table of malformed ones. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <kvring/msg.h>

TestSuite(msg);

/* ---- one uniform view of the fixed-body decoders ---------------------------------------- */

enum dec {
	D_PING,
	D_PONG,
	D_STOP,
	D_RESET,
	D_WORKER_GONE,
	D_COMMIT_REP,
	D_LOOKUP_REP,
	D_LOAD_DONE,
	D_STORE_DONE,
	N_DEC
};

static const struct {
	const char *name;
	unsigned type;
	size_t body;       /* body_len */
	unsigned allowed;  /* flag bits a good message may carry */
} decs[N_DEC] = {
	[D_PING] = {"ping", KVR_MSG_PING, sizeof(struct kvr_msg_ping), 0},
	[D_PONG] = {"pong", KVR_MSG_PONG, sizeof(struct kvr_msg_pong), 0},
	[D_STOP] = {"stop", KVR_MSG_STOP, 0, 0},
	[D_RESET] = {"reset", KVR_MSG_RESET, 0, 0},
	[D_WORKER_GONE] = {"worker_gone", KVR_MSG_WORKER_GONE, sizeof(struct kvr_msg_worker_gone), 0},
	[D_COMMIT_REP] = {"commit_rep", KVR_MSG_COMMIT_REP, sizeof(struct kvr_msg_commit_rep), KVR_MSGF_ERROR},
	[D_LOOKUP_REP] = {"lookup_rep", KVR_MSG_LOOKUP_REP, sizeof(struct kvr_msg_lookup_rep),
			  KVR_MSGF_MORE | KVR_MSGF_ERROR},
	[D_LOAD_DONE] = {"load_done", KVR_MSG_LOAD_DONE, sizeof(struct kvr_msg_load_done),
			 KVR_MSGF_MORE | KVR_MSGF_ERROR},
	[D_STORE_DONE] = {"store_done", KVR_MSG_STORE_DONE, sizeof(struct kvr_msg_store_done),
			  KVR_MSGF_MORE | KVR_MSGF_ERROR},
};

/* Decode m with decoder d into out (KVR_MSG_BODY bytes). */
static int decode(enum dec d, const struct kvr_msg *m, void *out)
{
	switch (d) {
	case D_PING: return kvr_msg_decode_ping(m, out);
	case D_PONG: return kvr_msg_decode_pong(m, out);
	case D_STOP: return kvr_msg_decode_stop(m);
	case D_RESET: return kvr_msg_decode_reset(m);
	case D_WORKER_GONE: return kvr_msg_decode_worker_gone(m, out);
	case D_COMMIT_REP: return kvr_msg_decode_commit_rep(m, out);
	case D_LOOKUP_REP: return kvr_msg_decode_lookup_rep(m, out);
	case D_LOAD_DONE: return kvr_msg_decode_load_done(m, out);
	case D_STORE_DONE: return kvr_msg_decode_store_done(m, out);
	case N_DEC: break;
	}
	return -ENOSYS;
}

/* A good message of each kind (bodies with every field set). */
static void good(enum dec d, struct kvr_msg *m)
{
	uint8_t body[KVR_MSG_BODY] = {0};
	unsigned flags = 0;
	switch (d) {
	case D_PING: {
		struct kvr_msg_ping p = {.sent_ns = 123456789, .nonce = 42};
		memcpy(body, &p, sizeof(p));
		break;
	}
	case D_PONG: {
		struct kvr_msg_pong p = {.sent_ns = 123456789, .nonce = 42, .pid = 4321, .handled = 99};
		memcpy(body, &p, sizeof(p));
		break;
	}
	case D_WORKER_GONE: {
		struct kvr_msg_worker_gone p = {.worker = 1, .generation = 3, .area_fd = 17};
		memcpy(body, &p, sizeof(p));
		break;
	}
	case D_COMMIT_REP: {
		struct kvr_msg_commit_rep p = {.status = 0, .n_committed = 5, .n_visible = 3};
		memcpy(body, &p, sizeof(p));
		break;
	}
	case D_LOOKUP_REP: {
		struct kvr_msg_lookup_rep p = {.status = 0, .matched = 3, .lane = 1, .index_ns = 1000};
		memcpy(body, &p, sizeof(p));
		flags = KVR_MSGF_MORE; /* slots follow */
		break;
	}
	case D_LOAD_DONE: {
		struct kvr_msg_load_done p = {.status = -EIO, .n_blocks = 4, .n_failed = 2, .copies = 2, .bytes = 4096,
					      .copy_ns = 50, .runs = 1, .queue_us = 7};
		memcpy(body, &p, sizeof(p));
		flags = KVR_MSGF_MORE | KVR_MSGF_ERROR;
		break;
	}
	case D_STORE_DONE: {
		struct kvr_msg_store_done p = {.status = 0, .n_blocks = 6, .n_stored = 3, .n_present = 2, .n_failed = 1,
					       .copies = 3, .bytes = 1 << 20, .copy_ns = 10, .queue_us = 1};
		memcpy(body, &p, sizeof(p));
		flags = KVR_MSGF_MORE;
		break;
	}
	default:
		break;
	}
	kvr_msg_build(m, decs[d].type, flags, 0x1122334455667788ull, 0, body, decs[d].body);
}

Test(msg, good_messages_decode)
{
	for (int d = 0; d < N_DEC; d++) {
		struct kvr_msg m;
		uint8_t out[KVR_MSG_BODY];
		memset(out, 0xa5, sizeof(out));
		good((enum dec)d, &m);
		cr_assert_eq(decode((enum dec)d, &m, out), 0, "%s", decs[d].name);
		cr_assert_arr_eq(out, m.body, decs[d].body, "%s: decoded body differs", decs[d].name);
		for (size_t i = decs[d].body; i < sizeof(out); i++)
			cr_assert_eq(out[i], 0xa5, "%s: decoder wrote past its struct", decs[d].name);
	}
	/* and the variants the rules allow */
	struct kvr_msg m;
	struct kvr_msg_lookup_rep lr = {.status = -ENOENT, .matched = 0};
	kvr_msg_build(&m, KVR_MSG_LOOKUP_REP, KVR_MSGF_ERROR, 1, 0, &lr, sizeof(lr));
	cr_assert_eq(kvr_msg_decode_lookup_rep(&m, &lr), 0, "failed lookup without a list");
	struct kvr_msg_commit_rep cr = {.status = -EIO, .n_committed = 0};
	kvr_msg_build(&m, KVR_MSG_COMMIT_REP, KVR_MSGF_ERROR, 1, 0, &cr, sizeof(cr));
	cr_assert_eq(kvr_msg_decode_commit_rep(&m, &cr), 0);
	struct kvr_msg_pong p = {.pid = 1};
	kvr_msg_build(&m, KVR_MSG_PONG, 0, 0, 0, &p, sizeof(p));
	cr_assert_eq(kvr_msg_decode_pong(&m, &p), 0);
}

/* A malformation applied to a good message of decoder d; returns 0 if it does not apply. */
enum mut {
	M_TYPE_NEXT,
	M_TYPE_NONE,
	M_TYPE_HIGH,
	M_LEN_MINUS,
	M_LEN_PLUS,
	M_LEN_FULL,
	M_LEN_255,
	M_FLAG_4,
	M_FLAG_80,
	M_FLAG_MORE,
	M_FLAG_ERROR,
	M_SEQ_1,
	M_SEQ_MAX,
	M_TAIL_BYTE,
	M_LAST_BYTE,
	/* type-specific */
	M_PING_RESERVED,
	M_PONG_PID_0,
	M_PONG_PID_NEG,
	M_STATUS_POSITIVE,
	M_STATUS_TOO_NEGATIVE,
	M_COMMIT_VISIBLE,
	M_LOOKUP_MORE_MISSING,
	M_LOOKUP_MORE_EXTRA,
	M_LOOKUP_RESERVED,
	M_LOOKUP_ERROR_MATCHED,
	M_LOOKUP_MATCHED_BIG,
	M_LOAD_FAILED_GT_BLOCKS,
	M_LOAD_MORE_MISSING,
	M_LOAD_BLOCKS_BIG,
	M_STORE_SUM,
	M_STORE_RESERVED,
	M_STORE_MORE_EXTRA,
	N_MUT
};

static const char *const mut_names[N_MUT] = {
	"type+1", "type 0", "type 0x4001", "body_len-1", "body_len+1", "body_len 48", "body_len 255",
	"flag 0x4", "flag 0x80", "flag MORE", "flag ERROR", "seq 1", "seq ~0", "byte after body_len",
	"last body byte", "ping reserved", "pong pid 0", "pong pid -1", "status 1", "status -5000",
	"commit n_visible > n_committed", "lookup matched without MORE", "lookup MORE without matched",
	"lookup reserved", "lookup error with matched", "lookup matched > max list", "load n_failed > n_blocks",
	"load failed without MORE", "load n_blocks > max list", "store counts exceed n_blocks", "store reserved",
	"store MORE without failed",
};

#define F32(m, st, f) ((uint8_t *)(m)->body + offsetof(st, f))

static int put32(struct kvr_msg *m, size_t off, uint32_t v)
{
	memcpy(m->body + off, &v, sizeof(v));
	return 1;
}

static int mutate(enum dec d, enum mut k, struct kvr_msg *m)
{
	unsigned t = decs[d].type;
	size_t len = decs[d].body;
	switch (k) {
	case M_TYPE_NEXT: m->hdr.type = (uint16_t)(t + 1); return 1;
	case M_TYPE_NONE: m->hdr.type = 0; return 1;
	case M_TYPE_HIGH: m->hdr.type = (uint16_t)(t | 0x4000); return 1;
	case M_LEN_MINUS: if (!len) return 0; m->hdr.body_len--; return 1;
	case M_LEN_PLUS: m->hdr.body_len++; return 1;
	case M_LEN_FULL: if (len == KVR_MSG_BODY) return 0; m->hdr.body_len = KVR_MSG_BODY; return 1;
	case M_LEN_255: m->hdr.body_len = 255; return 1;
	case M_FLAG_4: m->hdr.flags |= 0x4; return 1;
	case M_FLAG_80: m->hdr.flags |= 0x80; return 1;
	case M_FLAG_MORE:
		if (decs[d].allowed & KVR_MSGF_MORE) return 0;
		m->hdr.flags |= KVR_MSGF_MORE;
		return 1;
	case M_FLAG_ERROR:
		if (decs[d].allowed & KVR_MSGF_ERROR) return 0;
		m->hdr.flags |= KVR_MSGF_ERROR;
		return 1;
	case M_SEQ_1: m->hdr.seq = 1; return 1;
	case M_SEQ_MAX: m->hdr.seq = UINT32_MAX; return 1;
	case M_TAIL_BYTE: if (len == KVR_MSG_BODY) return 0; m->body[len] = 1; return 1;
	case M_LAST_BYTE: if (len == KVR_MSG_BODY) return 0; m->body[KVR_MSG_BODY - 1] = 0x80; return 1;
	case M_PING_RESERVED:
		return d == D_PING && put32(m, offsetof(struct kvr_msg_ping, reserved), 1);
	case M_PONG_PID_0: return d == D_PONG && put32(m, offsetof(struct kvr_msg_pong, pid), 0);
	case M_PONG_PID_NEG: return d == D_PONG && put32(m, offsetof(struct kvr_msg_pong, pid), UINT32_MAX);
	case M_STATUS_POSITIVE:
		return (d == D_COMMIT_REP || d == D_LOOKUP_REP || d == D_LOAD_DONE || d == D_STORE_DONE) &&
		       put32(m, 0, 1);
	case M_STATUS_TOO_NEGATIVE:
		return (d == D_COMMIT_REP || d == D_LOOKUP_REP || d == D_LOAD_DONE || d == D_STORE_DONE) &&
		       put32(m, 0, (uint32_t)-5000);
	case M_COMMIT_VISIBLE:
		return d == D_COMMIT_REP && put32(m, offsetof(struct kvr_msg_commit_rep, n_visible), 6);
	case M_LOOKUP_MORE_MISSING:
		if (d != D_LOOKUP_REP) return 0;
		m->hdr.flags &= (uint8_t)~KVR_MSGF_MORE;
		return 1;
	case M_LOOKUP_MORE_EXTRA:
		return d == D_LOOKUP_REP && put32(m, offsetof(struct kvr_msg_lookup_rep, matched), 0);
	case M_LOOKUP_RESERVED:
		return d == D_LOOKUP_REP && put32(m, offsetof(struct kvr_msg_lookup_rep, promoted), 0xffffffffu); /* more promoted than matched */
	case M_LOOKUP_ERROR_MATCHED:
		return d == D_LOOKUP_REP && put32(m, offsetof(struct kvr_msg_lookup_rep, status), (uint32_t)-EIO);
	case M_LOOKUP_MATCHED_BIG:
		return d == D_LOOKUP_REP && put32(m, offsetof(struct kvr_msg_lookup_rep, matched), KVR_MSG_MAX_LIST + 1);
	case M_LOAD_FAILED_GT_BLOCKS:
		return d == D_LOAD_DONE && put32(m, offsetof(struct kvr_msg_load_done, n_failed), 5);
	case M_LOAD_MORE_MISSING:
		if (d != D_LOAD_DONE) return 0;
		m->hdr.flags &= (uint8_t)~KVR_MSGF_MORE;
		return 1;
	case M_LOAD_BLOCKS_BIG:
		return d == D_LOAD_DONE && put32(m, offsetof(struct kvr_msg_load_done, n_blocks), KVR_MSG_MAX_LIST + 1);
	case M_STORE_SUM:
		return d == D_STORE_DONE && put32(m, offsetof(struct kvr_msg_store_done, n_present), 3);
	case M_STORE_RESERVED:
		return d == D_STORE_DONE && put32(m, offsetof(struct kvr_msg_store_done, reserved), 1);
	case M_STORE_MORE_EXTRA:
		return d == D_STORE_DONE && put32(m, offsetof(struct kvr_msg_store_done, n_failed), 0) &&
		       put32(m, offsetof(struct kvr_msg_store_done, n_present), 3);
	case N_MUT: break;
	}
	return 0;
}

Test(msg, malformed_messages_rejected)
{
	unsigned checked = 0;
	for (int d = 0; d < N_DEC; d++) {
		for (int k = 0; k < N_MUT; k++) {
			struct kvr_msg m;
			good((enum dec)d, &m);
			if (!mutate((enum dec)d, (enum mut)k, &m))
				continue;
			uint8_t out[KVR_MSG_BODY], canary[KVR_MSG_BODY];
			memset(canary, 0x3c, sizeof(canary));
			memcpy(out, canary, sizeof(out));
			struct kvr_msg before = m;
			int rc = decode((enum dec)d, &m, out);
			cr_expect_eq(rc, -EBADMSG, "%s with %s: got %d", decs[d].name, mut_names[k], rc);
			cr_expect_arr_eq(out, canary, sizeof(out), "%s with %s: output written on failure", decs[d].name,
					 mut_names[k]);
			cr_expect_arr_eq(&m, &before, sizeof(m), "%s: decoder changed its input", decs[d].name);
			checked++;
		}
		cr_expect_eq(decode((enum dec)d, NULL, NULL), -EBADMSG, "%s(NULL)", decs[d].name);
	}
	cr_assert_geq(checked, 130, "only %u malformed cases ran", checked);
}

/* ---- lists -------------------------------------------------------------------------- */

static const unsigned list_types[] = {KVR_MSG_LOOKUP, KVR_MSG_ALLOC, KVR_MSG_SLOTS, KVR_MSG_ALLOC_REP,
				      KVR_MSG_COMMIT, KVR_MSG_LOAD, KVR_MSG_STORE, KVR_MSG_BLOCKS};
#define N_LIST_TYPES (sizeof(list_types) / sizeof(list_types[0]))

Test(msg, list_geometry)
{
	static const unsigned isz[] = {16, 16, 8, 8, 8, 12, 20, 4};
	static const unsigned per[] = {2, 2, 5, 5, 5, 3, 2, 10};
	for (size_t i = 0; i < N_LIST_TYPES; i++) {
		cr_assert_eq(kvr_msg_list_item_size(list_types[i]), isz[i], "%s", kvr_msg_type_name(list_types[i]));
		cr_assert_eq(kvr_msg_list_per_msg(list_types[i]), per[i]);
		cr_assert_leq(sizeof(struct kvr_msg_list_hdr) + per[i] * isz[i], KVR_MSG_BODY);
	}
	static const unsigned not_lists[] = {0, KVR_MSG_PING, KVR_MSG_PONG, KVR_MSG_STOP, KVR_MSG_LOOKUP_REP,
					     KVR_MSG_LOAD_DONE, KVR_MSG_STORE_DONE, KVR_MSG_COMMIT_REP, 63, 64, 1000};
	for (size_t i = 0; i < sizeof(not_lists) / sizeof(not_lists[0]); i++) {
		cr_assert_eq(kvr_msg_list_item_size(not_lists[i]), 0);
		cr_assert_eq(kvr_msg_list_per_msg(not_lists[i]), 0);
	}
}

/* Stream lists of several lengths through build and decode; the items come back whole. */
Test(msg, list_round_trip)
{
	static const uint32_t totals[] = {1, 2, 3, 5, 9, 10, 11, 31, 1000};
	uint8_t items[1000 * 20], back[1000 * 20 + 20];
	for (size_t i = 0; i < sizeof(items); i++)
		items[i] = (uint8_t)(i * 7 + 1);
	for (size_t t = 0; t < N_LIST_TYPES; t++) {
		unsigned type = list_types[t], isz = kvr_msg_list_item_size(type), per = kvr_msg_list_per_msg(type);
		for (size_t n = 0; n < sizeof(totals) / sizeof(totals[0]); n++) {
			uint32_t total = totals[n];
			uint32_t msgs = (total + per - 1) / per;
			memset(back, 0, sizeof(back));
			uint32_t carried = 0;
			for (uint32_t seq = 0; seq < msgs; seq++) {
				struct kvr_msg m;
				unsigned c = kvr_msg_build_list(&m, type, 99, seq, 3, 0, items, total);
				carried += c;
				cr_assert_eq(m.hdr.seq, seq);
				cr_assert_eq(!!(m.hdr.flags & KVR_MSGF_MORE), seq + 1 < msgs, "%s total %u seq %u MORE",
					     kvr_msg_type_name(type), total, seq);
				struct kvr_msg_list_hdr h;
				memset(&h, 0xee, sizeof(h));
				cr_assert_eq(kvr_msg_decode_list(&m, type, &h), 0, "%s total %u seq %u",
					     kvr_msg_type_name(type), total, seq);
				cr_assert_eq(h.total, total);
				cr_assert_eq(h.count, c);
				cr_assert_eq(h.lane, 3);
				kvr_msg_list_items(&m, back);
			}
			cr_assert_eq(carried, total);
			cr_assert_arr_eq(back, items, (size_t)total * isz, "%s total %u", kvr_msg_type_name(type), total);
			cr_assert_eq(back[(size_t)total * isz], 0, "items written past the list");
		}
	}
}

Test(msg, malformed_lists_rejected)
{
	uint8_t items[64 * 20];
	for (size_t i = 0; i < sizeof(items); i++)
		items[i] = (uint8_t)(i + 1);
	unsigned checked = 0;
	for (size_t t = 0; t < N_LIST_TYPES; t++) {
		unsigned type = list_types[t], isz = kvr_msg_list_item_size(type), per = kvr_msg_list_per_msg(type);
		const uint32_t total = 2 * per + 1; /* three messages: full, full, one item */
		for (int k = 0; k < 16; k++) {
			struct kvr_msg m;
			uint32_t seq = (k & 1) ? 2 : 0; /* odd cases mutate the last message */
			kvr_msg_build_list(&m, type, 5, seq, 0, 0, items, total);
			struct kvr_msg_list_hdr h;
			memcpy(&h, m.body, sizeof(h));
			unsigned decode_as = type;
			const char *what = NULL;
			switch (k) {
			case 0: what = "MORE missing"; m.hdr.flags = 0; break;
			case 1: what = "MORE on the last"; m.hdr.flags = KVR_MSGF_MORE; break;
			case 2: what = "total 0"; h.total = 0; break;
			case 3: what = "total > max"; h.total = KVR_MSG_MAX_LIST + 1; break;
			case 4: what = "count - 1"; h.count--; break;
			case 5: what = "count + 1"; h.count++; break;
			case 6: what = "body_len - item"; m.hdr.body_len = (uint8_t)(m.hdr.body_len - isz); break;
			case 7: what = "body_len + 1"; m.hdr.body_len++; break;
			case 8: what = "body_len < list header"; m.hdr.body_len = 4; break;
			case 9: what = "unused item bytes"; m.body[KVR_MSG_BODY - 1] = 1; break;
			case 10: what = "seq beyond the list"; m.hdr.seq = 3; break;
			case 11: what = "seq ~0"; m.hdr.seq = UINT32_MAX; break;
			case 12: what = "ERROR flag"; m.hdr.flags |= KVR_MSGF_ERROR; break;
			case 13: what = "flag 0x80"; m.hdr.flags |= 0x80; break;
			case 14: what = "decoded as another list type";
				decode_as = type == KVR_MSG_BLOCKS ? KVR_MSG_LOOKUP : KVR_MSG_BLOCKS;
				break;
			case 15: what = "decoded as a non-list type"; m.hdr.type = KVR_MSG_PING; decode_as = KVR_MSG_PING;
				break;
			}
			if (k >= 2 && k <= 5)
				memcpy(m.body, &h, sizeof(h));
			if (k == 9 && m.hdr.body_len == KVR_MSG_BODY)
				continue; /* a full body has no unused bytes */
			struct kvr_msg_list_hdr out, canary;
			memset(&canary, 0x6b, sizeof(canary));
			out = canary;
			int rc = kvr_msg_decode_list(&m, decode_as, &out);
			cr_expect_eq(rc, -EBADMSG, "%s: %s accepted", kvr_msg_type_name(type), what);
			cr_expect_arr_eq(&out, &canary, sizeof(out), "%s: %s: header written on failure",
					 kvr_msg_type_name(type), what);
			checked++;
		}
		struct kvr_msg_list_hdr out;
		cr_expect_eq(kvr_msg_decode_list(NULL, type, &out), -EBADMSG);
	}
	cr_assert_geq(checked, 120);
}

/* ---- build, names, describe ----------------------------------------------------------- */

Test(msg, build)
{
	struct kvr_msg m;
	memset(&m, 0xff, sizeof(m));
	uint8_t body[64];
	for (int i = 0; i < 64; i++)
		body[i] = (uint8_t)(i + 1);
	kvr_msg_build(&m, KVR_MSG_PING, KVR_MSGF_MORE, 7, 3, body, 10);
	cr_assert_eq(m.hdr.type, KVR_MSG_PING);
	cr_assert_eq(m.hdr.flags, KVR_MSGF_MORE);
	cr_assert_eq(m.hdr.body_len, 10);
	cr_assert_eq(m.hdr.seq, 3);
	cr_assert_eq(m.hdr.req_id, 7);
	cr_assert_arr_eq(m.body, body, 10);
	for (int i = 10; i < KVR_MSG_BODY; i++)
		cr_assert_eq(m.body[i], 0, "byte %d not zeroed", i);
	kvr_msg_build(&m, KVR_MSG_PING, 0, 7, 0, body, 64);
	cr_assert_eq(m.hdr.body_len, KVR_MSG_BODY, "body_len not clamped");
	cr_assert_arr_eq(m.body, body, KVR_MSG_BODY);
	kvr_msg_build(&m, KVR_MSG_STOP, 0, 0, 0, NULL, 0);
	cr_assert_eq(kvr_msg_decode_stop(&m), 0);
}

Test(msg, names_and_describe)
{
	static const struct {
		unsigned type;
		const char *name;
	} t[] = {
		{KVR_MSG_PING, "ping"},       {KVR_MSG_PONG, "pong"},           {KVR_MSG_STOP, "stop"},
		{KVR_MSG_WORKER_GONE, "worker_gone"}, {KVR_MSG_LOOKUP, "lookup"}, {KVR_MSG_LOOKUP_REP, "lookup_rep"},
		{KVR_MSG_SLOTS, "slots"},     {KVR_MSG_LOAD, "load"},           {KVR_MSG_LOAD_DONE, "load_done"},
		{KVR_MSG_BLOCKS, "blocks"},   {KVR_MSG_STORE, "store"},         {KVR_MSG_STORE_DONE, "store_done"},
		{KVR_MSG_ALLOC, "alloc"},     {KVR_MSG_ALLOC_REP, "alloc_rep"}, {KVR_MSG_COMMIT, "commit"},
		{KVR_MSG_COMMIT_REP, "commit_rep"}, {KVR_MSG_RESET, "reset"},   {0, "unknown"},
		{5, "unknown"},               {63, "unknown"},                  {64, "unknown"},
		{65535, "unknown"},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		cr_assert_str_eq(kvr_msg_type_name(t[i].type), t[i].name, "type %u", t[i].type);

	char buf[96];
	struct kvr_msg m;
	struct kvr_msg_ping p = {.sent_ns = 1, .nonce = 2};
	kvr_msg_build(&m, KVR_MSG_PING, 0, 7, 0, &p, sizeof(p));
	cr_assert_eq(kvr_msg_describe(&m, buf, sizeof(buf)), buf);
	cr_assert_str_eq(buf, "ping req=7 seq=0 flags=- len=16");
	kvr_msg_build(&m, KVR_MSG_BLOCKS, KVR_MSGF_MORE | KVR_MSGF_ERROR, 18446744073709551615ull, 4294967295u, NULL, 0);
	kvr_msg_describe(&m, buf, sizeof(buf));
	cr_assert_str_eq(buf, "blocks req=18446744073709551615 seq=4294967295 flags=ME len=0");
	memset(&m, 0xff, sizeof(m));
	kvr_msg_describe(&m, buf, sizeof(buf));
	cr_assert_str_eq(buf, "unknown req=18446744073709551615 seq=4294967295 flags=0xff len=255");
	/* truncation keeps a terminated string */
	kvr_msg_describe(&m, buf, 8);
	cr_assert_str_eq(buf, "unknown");
}
