/*
 * chat.c — one model request through the guard, whatever its API (POST
 * /v1/chat/completions, /v1/responses, /v1/messages; stream false and
 * true): the conversation model. The wire formats are completions.c,
 * responses.c and messages.c (conv.h).
 *
 * One request, in order:
 *   1. its run: X-Loopguard-Run, else derived from the conversation's
 *      start (the first assistant message: the id of its first tool call,
 *      unique, else a hash of the messages up to it), or the run of
 *      previous_response_id; created with X-Loopguard-Policy's policy;
 *   2. the messages new since the run's last request become events: each
 *      tool result a result (the structured result contract when its
 *      content is a JSON object with a trace-v1 status), a new message
 *      of the person a user event (a new episode);
 *   3. the model call is a model event, its worst case the request's
 *      bytes (a token is at least one byte) plus max_tokens; a stop here
 *      never reaches the upstream;
 *   4. the upstream body: the client's, with the calls the guard refused
 *      restored in place (each an assistant tool call and its tool
 *      answer, before the client message that followed it), steer
 *      messages appended to what they concern, the cascade applied
 *      (the hidden tool removed, the offered tools added, the escalated
 *      model);
 *   5. the upstream's answer: its text is text events (in pieces while it
 *      streams: a text loop cuts the stream), its usage settles the model
 *      call, each tool call is a call event in one turn; executed calls
 *      pass, refused ones are taken out (and restored from then on), and
 *      when none is left the upstream is asked again (gateway.max_reasks);
 *      a stop is a final assistant message (after gateway.final_round).
 * An answer the guard did not change is the upstream's bytes as they
 * came. Streams: text deltas are forwarded as they arrive, tool call
 * deltas held until the response is complete, then decided and emitted
 * (or not) with indices renumbered.
 */
#include "conv.h"

#include "../policy/policy.h"
#include "../util/utf8.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define USAGE_TRIES 5 /* a usage step that finds the store busy */

#define RETRY_WINDOW_MS 60000

/* ---- small helpers ---- */


/* The text of a content value: a string, or the text parts. New. */
static char *text_of(const json_t *c) {
  if (json_is_string(c)) return lg__strdup(json_string_value(c));
  lg__buf_t b = {0};
  lg__buf_puts(&b, "");
  for (size_t i = 0; json_is_array(c) && i < json_array_size(c); i++) {
    const char *t = sget(json_array_get(c, i), "text");
    if (t) lg__buf_puts(&b, t);
  }
  return lg__buf_steal(&b, NULL);
}

/* A tool's answer as the text its result's value is made of (new): a
 * string, or its parts in order, a text part as its text and any other
 * (an image, a document, a file) as "[TYPE sha256:HEX]", HEX the first
 * 16 digits of the digest of what it shows (its source, URL, file or
 * data; the part whole when it has none of them), after the text of its
 * own content when it has some (Anthropic's search_result blocks: their
 * text parts, their source a URL). So an answer that is
 * only an image is not blank (a blank value stops the run, as a tool that
 * answered nothing: Claude Code's Read of an image file, a screenshot),
 * the same image is the same value, and no image is copied into a
 * trace. */
static char *result_text(const json_t *c) {
  static const char *const shown[] = {"source", "image_url", "file_id", "file_data", "file_url"};
  if (!json_is_array(c)) return text_of(c);
  lg__buf_t b = {0};
  lg__buf_puts(&b, "");
  for (size_t i = 0; i < json_array_size(c); i++) {
    json_t *p = json_array_get(c, i), *what = NULL;
    const char *t = sget(p, "text"), *ty = sget(p, "type");
    if (t) lg__buf_puts(&b, t);
    if (t || !json_is_object(p)) continue;
    json_t *inner = json_object_get(p, "content");
    char *it = inner ? result_text(inner) : NULL;
    if (inner && !it) {
      lg__buf_free(&b);
      return NULL;
    }
    if (it) lg__buf_puts(&b, it);
    lg__free(it);
    for (size_t k = 0; !what && k < LG__ARRAY_LEN(shown); k++) what = json_object_get(p, shown[k]);
    char *j = lg__json_text(what ? what : p, NULL), hex[65];
    if (!j) {
      lg__buf_free(&b);
      return NULL;
    }
    lg__sha256_hex(j, strlen(j), hex);
    lg__free(j);
    lg__buf_printf(&b, "[%s sha256:%.16s]", ty ? ty : "part", hex);
  }
  return lg__buf_steal(&b, NULL);
}

/* The text of a message's (or a block's) "content". New. */
static char *content_text(const json_t *msg) { return text_of(json_object_get(msg, "content")); }

static const char *order[] = {"pass", "execute", "observe", "replay", "block", "stop"};

static int action_rank(const char *a) {
  for (int i = 0; i < 6; i++)
    if (a && !strcmp(a, order[i])) return i;
  return -1;
}

static void raise_action(lg__gw_job_t *j, const char *a, const char *reason) {
  int k = action_rank(a);
  if (k > action_rank(j->action)) {
    j->action = order[k]; /* static */
    snprintf(j->reason, sizeof j->reason, "%s", reason ? reason : "");
  }
}

/* Client message i (borrowed), built when first read; NULL out of range
 * or out of memory (then c->lazy_oom). */
static json_t *legacy_msg(chat_t *c, size_t i, json_t *m);
static json_t *client_msg(chat_t *c, size_t i) {
  json_t *m = lg__json_lazy_get(&c->lazy, c->messages, i);
  if (m && c->legacy) m = legacy_msg(c, i, m);
  if (!m && i < json_array_size(c->messages)) c->lazy_oom = 1;
  return m;
}

/* The string member k of client message i, PEEK_ROLE or PEEK_TYPE (as
 * sget gives it), without building the message when its check kept it. */
enum { PEEK_ROLE, PEEK_TYPE };
static const char *const peek_keys[2] = {"role", "type"};
static const char *msg_str(chat_t *c, size_t i, int k) {
  const char *v;
  if (!lg__json_lazy_peek(&c->lazy, c->messages, i, k, &v))
    return c->legacy && k == PEEK_ROLE && v && !strcmp(v, "function") ? "tool" : v; /* as legacy_msg reads it */
  return sget(client_msg(c, i), peek_keys[k]);
}

static int is_role(chat_t *c, size_t i, const char *role);

/* A legacy request's client message i (m) as read (lg__gwo_legacy_msg):
 * a function message answers the assistant message before it. */
static json_t *legacy_msg(chat_t *c, size_t i, json_t *m) {
  if (i < c->nlmsg && c->lmsg[i]) return c->lmsg[i];
  const char *role = sget(m, "role");
  long a = -1;
  if (role && !strcmp(role, "function"))
    for (a = (long)i - 1; a >= 0 && !is_role(c, (size_t)a, "assistant");) a--;
  return lg__gwo_legacy_msg(c, m, i, a);
}

/* What tells a conversation's start apart besides its messages, for its
 * hash: whom it is for (the request's user, safety_identifier and
 * prompt_cache_key; Anthropic's metadata.user_id), and the system prompt
 * an API keeps out of the messages (Anthropic's system, Responses'
 * instructions). A client says these the same on every request of a
 * conversation. */
static void conv_context(chat_t *c, lg__buf_t *h) {
  static const char *const who[] = {"user", "safety_identifier", "prompt_cache_key"};
  for (size_t i = 0; i < LG__ARRAY_LEN(who); i++) {
    const char *v = sget(c->root, who[i]);
    lg__buf_puts(h, v ? v : "");
    lg__buf_putc(h, '\n');
  }
  const char *uid = sget(json_object_get(c->root, "metadata"), "user_id");
  lg__buf_puts(h, uid ? uid : "");
  lg__buf_putc(h, '\n');
  char *sys = text_of(json_object_get(c->root, is_anthropic(c) ? "system" : "instructions"));
  if (sys) lg__buf_puts(h, sys);
  lg__buf_putc(h, '\n');
  lg__free(sys);
}

/* The key of an id of kind KIND, "KIND:ID" (new, or NULL): in the
 * gateway's table and the store, a conversation's (conv), a response's
 * (resp), an output item's (item); in the store, what the run keeps of an
 * id (own, rs, answers:conv: prev_fetch). */
static char *id_key(const char *kind, const char *id) {
  lg__buf_t b = {0};
  lg__buf_printf(&b, "%s:%s", kind, id);
  return lg__buf_steal(&b, NULL);
}

/* The key of a conversation's start: messages[0..a] with a the first
 * assistant message (extra, when not NULL, stands in for messages[a]). */
static char *conv_key(chat_t *c, size_t a, json_t *extra) {
  json_t *am = extra ? extra : client_msg(c, a);
  const char *ty = sget(am, "type");
  if (ty && !strcmp(ty, "item_reference") && sget(am, "id")) /* an answer's item, by its id */
    return id_key("item", sget(am, "id"));
  lg__buf_t b = {0};
  json_t *tcs = json_object_get(am, "tool_calls");
  /* (a legacy call's id is where it is, not unique: its conversation is
   * known by its messages) */
  const char *id = c->legacy ? NULL : sget(json_array_get(tcs, 0), "id");
  if (!id) id = sget(am, "call_id"); /* a Responses function_call item */
  json_t *blocks = json_object_get(am, "content");
  for (size_t i = 0; !id && json_is_array(blocks) && i < json_array_size(blocks); i++) {
    const char *ty = sget(json_array_get(blocks, i), "type");
    if (ty && !strcmp(ty, "tool_use")) id = sget(json_array_get(blocks, i), "id");
  }
  if (id) {
    lg__buf_puts(&b, "tc:");
    lg__buf_puts(&b, id);
    return lg__buf_steal(&b, NULL);
  }
  lg__buf_t h = {0};
  conv_context(c, &h);
  for (size_t i = 0; i <= a; i++) {
    /* an item of no role before the first answer (a Responses reasoning
     * item) is not counted: the key made from the answer itself, when it
     * came (lg__gwc_register_key), had not seen it */
    if (i < a && !msg_str(c, i, PEEK_ROLE)) continue;
    json_t *m = i == a ? am : client_msg(c, i);
    char *t = content_text(m);
    lg__buf_puts(&h, sget(m, "role") ? sget(m, "role") : "");
    lg__buf_putc(&h, '\n');
    if (t) lg__buf_puts(&h, t);
    lg__buf_putc(&h, '\n');
    lg__free(t);
    /* a legacy answer's call is part of what it said: two conversations
     * whose first answers call different functions, or the same one with
     * other arguments, are two */
    json_t *fn = c->legacy ? json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0), "function") : NULL;
    if (fn) lg__buf_printf(&h, "%s\n%s\n", sget(fn, "name") ? sget(fn, "name") : "",
                           sget(fn, "arguments") ? sget(fn, "arguments") : "");
  }
  lg__buf_printf(&b, "h:%016llx:%zu", (unsigned long long)lg__hash_str(h.data ? h.data : ""), h.len);
  lg__buf_free(&h);
  return lg__buf_steal(&b, NULL);
}

static int is_type(chat_t *c, size_t i, const char *type) {
  const char *ty = msg_str(c, i, PEEK_TYPE);
  return ty && !strcmp(ty, type);
}

/* Responses: whether client item i is a call (lg__gwr_is_call). */
static int is_call_item(chat_t *c, size_t i) { return lg__gwr_is_call(msg_str(c, i, PEEK_TYPE)); }

static int is_reasoning(const char *ty) { return ty && !strcmp(ty, "reasoning"); }
static int is_message(const char *ty) { return ty && !strcmp(ty, "message"); }

static int is_role(chat_t *c, size_t i, const char *role) {
  const char *r = msg_str(c, i, PEEK_ROLE);
  return r && !strcmp(r, role);
}

/* The client message that names the conversation: its first assistant
 * message; on Responses, whose answer comes as items one by one
 * (reasoning, message, function_call), the first call of that answer
 * when it has one (a call's id is unique, the text often is not), as
 * lg__gwc_register_key picks it, or an item_reference (a client that
 * sends the answer's items back by their ids: the AI SDK with `store`).
 * -1: none. */
static long first_assistant(chat_t *c) {
  for (size_t i = 0; i < c->n; i++) {
    if (is_call_item(c, i) || is_type(c, i, "item_reference")) return (long)i;
    if (!is_role(c, i, "assistant")) continue;
    for (size_t k = i + 1; is_responses(c) && k < c->n; k++) {
      if (is_call_item(c, k)) return (long)k;
      if (!is_role(c, k, "assistant") && !is_type(c, k, "reasoning")) break;
    }
    return (long)i;
  }
  return -1;
}

/* A run id or group a header names: an id as every id (lg__id_problem:
 * a header may hold bytes that are not UTF-8, which no JSON could carry)
 * that one segment of a URL can name. */
static bool valid_id(const char *s) {
  return s && !lg__id_problem(s, strlen(s)) && lg__path_segment_ok(s);
}


/* The decision object of a step (new reference), or NULL. */
static json_t *answer_json(const lg__step_t *st) {
  if (!st->answer.data) return NULL;
  json_t *a = lg__json_load(st->answer.data, st->answer.len, NULL, NULL);
  if (lg__json_oom()) {
    json_decref(a);
    return NULL;
  }
  return a;
}


/* ---- events ---- */

/* A stop decided on this request: the final message (the decision's, or
 * `fallback`; on a run stopped before, the final message this server gave
 * then, which a final round may have made the model's own), the action,
 * the log line when the event stopped the run. Whether the run is still
 * stopped is the store's to say, never the memory's: another replica, or
 * an operator's resume event, may have resumed it. */
static void note_stop(chat_t *c, const lg__step_t *st, json_t *a, const char *fallback,
                      const char *tool, const char *call_id) {
  const char *m = a ? sget(a, "message") : NULL, *reason = a ? sget(a, "reason") : NULL;
  if (!m) m = fallback;
  if (st->was_stopped && c->r->final_text) m = c->r->final_text;
  if (!c->stop_text) c->stop_text = lg__strdup(m);
  raise_action(c->j, "stop", reason);
  if (st->stopped_now) {
    c->stop_reason = st->reason;
    lg__gw_note_intervention(c->cx, c->r->id, "stop", reason, tool, call_id);
  }
}

/* ---- the usage, with the steps after it ---- */

/* What lg__gw_step would have answered for a step of a batch that ran: 0
 * when it decided, else its own failure's code. */
static int step_rc(const lg__step_t *st) {
  return st->decided ? 0 : st->err.code ? st->err.code : LG_ECONFLICT;
}

/* A step made again for its event as made (ev), its inputs kept. */
static void restep(chat_t *c, lg__step_t *st, const lg_event_t *ev) {
  lg__step_t in = *st;
  lg__step_clear(st);
  lg__step_init(st, ev, now_ms(c->cx));
  st->prices = in.prices;
  st->usage_measured = in.usage_measured;
  st->ttl_ms = in.ttl_ms;
  st->scopes = in.scopes;
  st->nscopes = in.nscopes;
  st->auto_turn = in.auto_turn;
  st->fill = in.fill;
  st->fill_ud = in.fill_ud;
}

/* The pending usage settled in a step of its own: a store that is busy (a
 * lock not had in time, a deadlock or serialization victim on PostgreSQL:
 * two replicas on one run) rolled the step back whole, so it is tried
 * again. */
static int settle_alone(chat_t *c, lg_error_t *e) {
  int rc = 0;
  for (int attempt = 0; attempt < USAGE_TRIES; attempt++) {
    if (attempt) {
      struct timespec ts = {0, (long)(5 << attempt) * 1000000L}; /* 10, 20, 40, 80 ms */
      nanosleep(&ts, NULL);
    }
    restep(c, &c->use, &c->use_ev);
    memset(e, 0, sizeof *e);
    rc = lg__gw_step(c->cx, c->r, &c->use, e);
    if (rc != LG_EBUSY) break;
  }
  return rc;
}

/* A warning that the store was in the way: the run, `what` (name and an
 * integer), the store's code and message (docs/gateway.md, "Metrics and
 * logs"). */
static void store_warning(chat_t *c, const char *event, const char *what, long long v, int rc,
                          const lg_error_t *e) {
  lg__buf_t f = {0};
  lg__buf_puts(&f, "\"run_id\":");
  lg__buf_json_str(&f, c->r->id, strlen(c->r->id));
  lg__buf_printf(&f, ",\"%s\":%lld,\"code\":%d,\"message\":", what, v, rc);
  lg__buf_json_str_lossy(&f, e->message, strlen(e->message));
  if (!f.oom) lg__server_log(c->cx->srv, "warn", event, f.data);
  lg__buf_free(&f);
}

/* The pending usage done with (rc: its step's): what still failed is
 * logged (the reservation then goes at its TTL). */
static void usage_done(chat_t *c, int rc, const lg_error_t *e) {
  if (rc)
    store_warning(c, "usage_not_settled", "reservation", (long long)c->use_ev.u.usage.reservation,
                  rc, e);
  lg_prices_free(c->use.prices);
  lg__step_clear(&c->use);
  c->use_pending = 0;
}

/* The pending usage, when no step comes after it. */
static void settle_usage(chat_t *c) {
  if (!c->use_pending) return;
  lg_error_t e = {0};
  usage_done(c, settle_alone(c, &e), &e);
}

/* After a batch the store failed whole (a busy store): its steps v[0..n)
 * decided again one at a time from their events as made (evs), in order.
 * rcs[i] (rcs may be NULL): what lg__gw_step answered for v[i]; the last
 * one's is returned, its failure in *e. */
static int steps_alone(chat_t *c, lg__step_t *v, const lg_event_t *evs, size_t n, int *rcs, lg_error_t *e) {
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    restep(c, &v[i], &evs[i]);
    memset(e, 0, sizeof *e);
    rc = lg__gw_step(c->cx, c->r, &v[i], e);
    if (rcs) rcs[i] = rc;
  }
  return rc;
}

/* The steps v[0..n) (of the events evs, kept as they were), decided after
 * the pending usage in one transaction (the step's batch: the same
 * decisions and trace as one step each). rcs[i]: what lg__gw_step would
 * have answered for v[i]. A batch that failed whole (a busy store) is
 * decided again a step at a time, the usage first with its tries. */
static void decide_steps(chat_t *c, lg__step_t *v, const lg_event_t *evs, size_t n, int *rcs) {
  lg_error_t e = {0};
  size_t k = c->use_pending ? 1 : 0;
  /* the usage and the steps side by side (none when no usage is pending:
   * an answer's text took it; before session 38 three steps or more then
   * had an array made and not freed) */
  lg__step_t one[2], *all = !k ? NULL : k + n <= 2 ? one : lg__malloc((k + n) * sizeof *all);
  if (!all) { /* no usage (or no memory): the steps alone */
    settle_usage(c);
    for (size_t i = 0; i < n; i++) {
      rcs[i] = lg__gw_step(c->cx, c->r, &v[i], &e);
      memset(&e, 0, sizeof e);
    }
    return;
  }
  all[0] = c->use;
  memcpy(all + 1, v, n * sizeof *v);
  lg__step_batch_t b = {all, n + 1};
  int rc = lg__gw_step_batch(c->cx, c->r, &b, &e);
  c->use = all[0];
  memcpy(v, all + 1, n * sizeof *v);
  if (all != one) lg__free(all);
  if (rc) {
    store_warning(c, "batch_retried", "steps", (long long)(n + 1), rc, &e);
    settle_usage(c);
    steps_alone(c, v, evs, n, rcs, &e);
    return;
  }
  usage_done(c, step_rc(&c->use), &c->use.err);
  for (size_t i = 0; i < n; i++) rcs[i] = step_rc(&v[i]);
}

/* One event through the step (after the pending usage); *a (may be
 * NULL) the decision object. */
static int step_event(chat_t *c, lg_event_t *ev, lg__step_t *st, json_t **a) {
  lg__step_init(st, ev, now_ms(c->cx));
  int rc;
  decide_steps(c, st, ev, 1, &rc);
  *a = rc ? NULL : answer_json(st);
  return rc;
}

static void mem_sync(chat_t *c); /* the run's memory to the store ("the run's memory", below) */

/* A piece of the response's text (trace-v1 `text`, of the model call's
 * turn). 0: go on; 1: a text loop, observed (the steer message is said
 * with the next request); 2: the run stopped. */
static int text_event(chat_t *c, const char *p, size_t n) {
  if (!n) return 0;
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_TEXT;
  /* its turn: the stored run's (lg__step_t.model_turn) */
  ev.u.text.text = p;
  ev.u.text.len = n;
  ev.u.text.agent = c->j->hdr_agent;
  lg__step_t st;
  json_t *a;
  int out = 0;
  if (!step_event(c, &ev, &st, &a)) {
    if (st.action == LG_ACT_STOP) {
      note_stop(c, &st, a, "I stopped: I was repeating myself.", NULL, NULL);
      out = 2;
    } else if (st.action == LG_ACT_OBSERVE) {
      const char *m = a ? sget(a, "message") : NULL;
      lg__free(c->r->text_steer);
      c->r->text_steer = m ? lg__strdup(m) : NULL;
      c->r->text_steer_at = SIZE_MAX;
      mem_sync(c);
      raise_action(c->j, "observe", "text_repeat");
      lg__gw_note_intervention(c->cx, c->r->id, "observe", "text_repeat", NULL, NULL);
      out = 1;
    }
  }
  json_decref(a);
  lg__step_clear(&st);
  return out;
}

#define TEXT_PIECE 256 /* a stream's text goes to the step in pieces of this many bytes */

/* The text of the response not given to the step yet, when a piece is
 * full or (all) at the end. Returns text_event's answer. */
int lg__gwc_feed_text(chat_t *c, int at_end) {
  size_t n = c->text.len - c->text_fed;
  if (!n || (!at_end && n < TEXT_PIECE)) return 0;
  const char *p = c->text.data + c->text_fed;
  c->text_fed = c->text.len;
  return text_event(c, p, n);
}

/* A run stopped by a loop (next_allowed_action resume_after_change)
 * resumed: a `resume` event, as an operator's, so the trace says so and
 * replays to it. 1 when the run goes on. */
static int resume_run(chat_t *c) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_RESUME;
  ev.u.resume.note = "a new message from the person (gateway)";
  lg__step_t st;
  json_t *a;
  int ok = !step_event(c, &ev, &st, &a) && st.action != LG_ACT_STOP;
  json_decref(a);
  lg__step_clear(&st);
  return ok;
}

/* A new message from the person (trace-v1 `user`): a new episode. The
 * engine keeps a stopped run stopped, so a run stopped by a loop is
 * resumed first (the person asked for something new); one stopped by a
 * cap, a budget, an operator or its own way out stays stopped. */
static void user_event(chat_t *c) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_USER;
  lg__step_t st;
  json_t *a;
  int rc = step_event(c, &ev, &st, &a);
  const char *next = a ? sget(a, "next_allowed_action") : NULL;
  int resume = !rc && st.action == LG_ACT_STOP && next && !strcmp(next, "resume_after_change");
  json_decref(a);
  lg__step_clear(&st);
  if (rc) return;
  /* the cascade starts again with the episode */
  c->r->hide_left = 0;
  c->r->offer = 0;
  c->r->esc_left = 0;
  if (!resume || !resume_run(c)) return;
  step_event(c, &ev, &st, &a); /* the episode, now that the run goes on */
  json_decref(a);
  lg__step_clear(&st);
  lg__free(c->r->final_text);
  c->r->final_text = NULL;
  lg__free(c->stop_text);
  c->stop_text = NULL;
  c->j->action = NULL;
  c->j->reason[0] = 0;
}

/* The structured result contract (a JSON object with a trace-v1 status)
 * into res; *value (new) holds its value's JSON. 0 when sj is not one. */
static int structured_result(json_t *sj, lg_result_t *res, char **value) {
  const char *sname = sget(sj, "status");
  lg_status_t s = sname ? lg_status_parse(sname, strlen(sname)) : LG_STATUS_INVALID;
  if (s == LG_STATUS_INVALID) return 0;
  res->status = s;
  json_t *pv = json_object_get(sj, "progress_version");
  if (json_is_integer(pv)) {
    res->has_progress_version = 1;
    res->progress_version = json_integer_value(pv);
  }
  json_t *sec = json_object_get(sj, "side_effect_committed");
  if (json_is_boolean(sec)) res->side_effect_committed = json_is_true(sec) ? 1 : -1;
  json_t *ra = json_object_get(sj, "retry_after_ms");
  if (json_is_integer(ra)) res->retry_after_ms = json_integer_value(ra);
  res->operation_id = sget(sj, "operation_id");
  json_t *v = json_object_get(sj, "value");
  if (v) {
    *value = lg__json_text(v, &res->value_len);
    res->value_kind = json_is_null(v)                                  ? LG_VALUE_NULL
                      : json_is_string(v) && blank(json_string_value(v)) ? LG_VALUE_BLANK
                                                                       : LG_VALUE_PRESENT;
  }
  return 1;
}

/* A command's outcome as a coding agent's shell tool words it
 * (command_outcome). */
typedef struct {
  int exited;         /* it says the command's exit code: code */
  long long code;
  int running;        /* it says the command goes on (a session to poll) */
  const char *output; /* its output (output_len bytes), without the words around */
  size_t output_len;
} outcome_t;

/* Whether the n bytes at t are white space only (blank, for a span). */
static int blankn(const char *t, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (t[i] != ' ' && t[i] != '\t' && t[i] != '\n' && t[i] != '\r') return 0;
  return 1;
}

/* The number that starts s, followed by the text end (at most 10 digits,
 * maybe a '-'): 1 and *v. */
static int leading_int(const char *s, const char *end, long long *v) {
  const char *d = s + (*s == '-');
  long long x = 0;
  int n = 0;
  for (; *d >= '0' && *d <= '9' && n < 10; d++, n++) x = x * 10 + (*d - '0');
  if (!n || strncmp(d, end, strlen(end))) return 0;
  *v = *s == '-' ? -x : x;
  return 1;
}

/* Whether t is Codex's plain-text outcome of a command: header lines,
 * then a line that starts with "Output:". Its shell answers "Exit code:
 * N", "Wall time: S seconds" (and "Total output lines: N"); its
 * exec_command and write_stdin "Chunk ID: X", "Wall time: S seconds",
 * "Process exited with code N" or, while the command runs, "Process
 * running with session ID N", "Original token count: N", maybe after
 * "Total output lines: N" and a blank line. Such a header with a wall
 * time and an exit code or a session fills h; a line that is none of
 * these ends the look at once (most answers: at their first bytes). */
static int exec_header(const char *t, outcome_t *h) {
  enum { OTHER, WALL, EXIT, RUNNING };
  static const struct {
    const char *p;
    int kind;
  } heads[] = {{"Wall time: ", WALL},
               {"Total output lines: ", OTHER},
               {"Chunk ID: ", OTHER},
               {"Original token count: ", OTHER},
               {"Exit code: ", EXIT},
               {"Process exited with code ", EXIT},
               {"Process running with session ID ", RUNNING}};
  int wall = 0;
  memset(h, 0, sizeof *h);
  for (int line = 0; line < 10; line++) {
    if (!strncmp(t, "Output:", 7)) {
      h->output = t + 7 + (t[7] == '\n');
      h->output_len = strlen(h->output);
      return wall && (h->exited || h->running);
    }
    if (*t != '\n') { /* a blank line is allowed (after the total) */
      size_t k = 0, nk = sizeof heads / sizeof *heads, len = 0;
      while (k < nk && strncmp(t, heads[k].p, len = strlen(heads[k].p))) k++;
      if (k == nk) return 0;
      wall |= heads[k].kind == WALL;
      long long v;
      if (heads[k].kind == EXIT || heads[k].kind == RUNNING) { /* a number, the whole line */
        if (!leading_int(t + len, "\n", &v)) return 0;
        if (heads[k].kind == RUNNING) {
          h->running = 1;
        } else {
          h->exited = 1;
          h->code = v;
        }
      }
    }
    t = strchr(t, '\n');
    if (!t) return 0;
    t++;
  }
  return 0;
}

/* Whether t is Claude Code's BashOutput answer (a background shell's
 * output since the last look): "<status>S</status>", S running,
 * completed, failed or killed, then maybe "<exit_code>N</exit_code>",
 * the output's "<stdout>" and "<stderr>" blocks, and
 * "<timestamp>...</timestamp>" at its end. Fills h: running, or exited
 * with its code (a failed shell without one: 1), the output the blocks
 * between, without the timestamp. */
static int bash_output(const char *t, outcome_t *h) {
  static const char *const states[] = {"running", "completed", "failed", "killed"};
  if (strncmp(t, "<status>", 8)) return 0;
  t += 8;
  size_t k = 0, nk = sizeof states / sizeof *states, len = 0;
  while (k < nk && (strncmp(t, states[k], len = strlen(states[k])) || strncmp(t + len, "</status>", 9))) k++;
  if (k == nk) return 0;
  memset(h, 0, sizeof *h);
  t += len + 9;
  h->running = k == 0;
  h->exited = !h->running;
  h->code = k == 2;
  while (*t == '\n') t++;
  long long v;
  if (!strncmp(t, "<exit_code>", 11) && leading_int(t + 11, "</exit_code>", &v)) {
    h->code = v;
    t = strstr(t, "</exit_code>") + 12;
  }
  const char *end = strstr(t, "<timestamp>");
  h->output = t;
  h->output_len = end ? (size_t)(end - t) : strlen(t);
  return 1;
}

/* The last line from `from` on (t's last KiB) that starts with mark
 * (after a line end, or at t's start), the text after mark; or NULL. */
static const char *last_marked_line(const char *t, const char *from, const char *mark) {
  size_t m = strlen(mark);
  const char *p = from, *at = !strncmp(t, mark, m) ? t : NULL;
  for (; (p = strstr(p, mark)); p++)
    if (p > t && p[-1] == '\n') at = p;
  return at ? at + m : NULL;
}

/* Whether t is OpenHands' words for a command (its execute_bash
 * answer): the output, then a line "[The command completed with exit
 * code N.]" (and lines such as "[Current working directory: ...]",
 * "[Command finished with exit code N]"): exited with N; or, while the
 * command runs, "[The command has no new output after S seconds. ...]"
 * as its last line, the output before it (after "[Below is the output
 * of the previous command.]" or "[Command output continued from
 * previous command]" when a poll's answer starts so). Only the text's
 * last KiB is looked at for the markers. */
static int openhands_outcome(const char *t, outcome_t *h) {
  static const char *const cont[] = {"[Below is the output of the previous command.]\n",
                                     "[Command output continued from previous command]\n"};
  memset(h, 0, sizeof *h);
  size_t n = strlen(t);
  const char *tail = n > 1024 ? t + n - 1024 : t;
  const char *num = last_marked_line(t, tail, "[The command completed with exit code ");
  if (num) {
    h->exited = leading_int(num, ".]", &h->code);
    return h->exited;
  }
  const char *wait = last_marked_line(t, tail, "[The command has no new output after ");
  if (!wait || (strchr(wait, '\n') && !blank(strchr(wait, '\n')))) return 0; /* the last line */
  wait -= strlen("[The command has no new output after ");
  for (size_t k = 0; k < sizeof cont / sizeof *cont; k++)
    if (!strncmp(t, cont[k], strlen(cont[k]))) t += strlen(cont[k]);
  h->running = 1;
  h->output = t;
  h->output_len = wait > t ? (size_t)(wait - t) : 0;
  return 1;
}

/* A coding agent's words for a command's outcome: Codex's (exec_header),
 * Claude Code's BashOutput (bash_output) or OpenHands' (openhands_outcome). */
static int command_outcome(const char *t, outcome_t *h) {
  return exec_header(t, h) || bash_output(t, h) || openhands_outcome(t, h);
}

/* Whether a tool's answer is a command's outcome in a coding agent's
 * words that says the command failed (an exit code other than 0): Codex's
 * JSON text, an object with an integer `exit_code` in its `metadata`
 * object or at its top (`{"output": "...", "metadata": {"exit_code": 1,
 * "duration_seconds": 0.4}}`, what it answers its shell and local shell
 * calls with, in a function_call_output, a local_shell_call_output or a
 * Chat Completions tool message), or the plain text command_outcome
 * read (h, or NULL when it read none). Only JSON text that holds
 * "exit_code" as written is parsed. */
static int command_failed(const char *t, const outcome_t *h) {
  if (h) return h->exited && h->code != 0;
  while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r') t++;
  if (*t != '{' || !strstr(t, "\"exit_code\"")) return 0;
  json_t *o = lg__json_load(t, strlen(t), NULL, NULL);
  json_t *md = json_object_get(o, "metadata");
  json_t *ec = json_object_get(json_is_object(md) ? md : o, "exit_code");
  int failed = json_is_integer(ec) && json_integer_value(ec) != 0;
  json_decref(o);
  return failed;
}

/* A plain answer: progress (failed: retryable), its text the value. */
static void plain_result(const char *text, int failed, lg_result_t *res, char **value) {
  res->status = failed ? LG_STATUS_RETRYABLE : LG_STATUS_PROGRESS;
  *value = lg_json_quote(text, strlen(text));
  res->value_len = *value ? strlen(*value) : 0;
  res->value_kind = blank(text) ? LG_VALUE_BLANK : LG_VALUE_PRESENT;
}

/* Whether a tool's answer can be the structured result contract: a JSON
 * object with a "status" member. Its text then starts with '{' and holds
 * "status" as written, unless a \u escape spells it: without either, it
 * is not parsed at all (most answers are plain text or objects without a
 * status). */
static int may_be_structured(const char *t) {
  while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r') t++;
  return *t == '{' && (strstr(t, "\"status\"") || strstr(t, "\\u"));
}

/* Room in f for one more step. 0 when out of memory. */
static int fed_room(lg__gw_fed_t *f) {
  if (f->n < f->cap) return 1;
  size_t cap = f->cap ? f->cap * 2 : 32;
  lg__step_t *st = lg__realloc(f->st, (cap + 1) * sizeof *st);
  if (st) f->st = st;
  lg_event_t *ev = st ? lg__realloc(f->ev, (cap + 1) * sizeof *ev) : NULL;
  if (ev) f->ev = ev;
  struct lg__gw_fed_keep *k = ev ? lg__realloc(f->keep, cap * sizeof *k) : NULL;
  if (k) f->keep = k;
  if (!st || !ev || !k) return 0;
  f->cap = cap;
  return 1;
}

/* A tool's answer (content: a string or text parts; is_error: the tool
 * said it failed) as a result into res, what res borrows into k (text,
 * value, sj; owned), and what oc says of a command (command_outcome; all
 * 0 when it is not one: its output points into k->text). A plain answer
 * is a failure when the API's flag or the command says so. 0, or
 * LG_ENOMEM. */
static int read_result(const json_t *content, int is_error, lg_result_t *res,
                       struct lg__gw_fed_keep *k, outcome_t *oc) {
  char *text = result_text(content);
  if (!text) return LG_ENOMEM;
  int known = command_outcome(text, oc);
  if (!known) memset(oc, 0, sizeof *oc);
  char *value = NULL;
  json_t *sj = NULL;
  if (may_be_structured(text)) {
    sj = lg__json_load(text, strlen(text), NULL, NULL);
    if (lg__json_oom() || !json_is_object(sj)) {
      json_decref(sj);
      sj = NULL;
    }
  }
  if (!sj || !structured_result(sj, res, &value))
    plain_result(text, is_error || command_failed(text, known ? oc : NULL), res, &value);
  res->value = value;
  k->text = text;
  k->value = value;
  k->sj = sj;
  return 0;
}

/* The length of a clock's reading at t (n bytes left, p the byte
 * before, or 0): a time of day with its seconds (H:MM:SS or HH:MM:SS, a
 * fraction after a '.' or ','), or a date (YYYY-MM-DD or YYYY/MM/DD),
 * neither inside a longer run of digits; 0 when none. A file's line and
 * column ("main.c:12:5") has no seconds, and is no clock. */
static size_t clock_at(const unsigned char *t, size_t n, int p) {
#define D(i) ((i) < n && t[i] >= '0' && t[i] <= '9')
  size_t e = 0;
  if (p >= '0' && p <= '9') return 0;
  if (D(0) && D(1) && D(2) && D(3) && 4 < n && (t[4] == '-' || t[4] == '/') && D(5) && D(6) &&
      7 < n && t[7] == t[4] && D(8) && D(9))
    e = 10;
  else {
    size_t h = D(1) ? 2 : 1;
    if (D(0) && h < n && t[h] == ':' && D(h + 1) && D(h + 2) && h + 3 < n && t[h + 3] == ':' &&
        D(h + 4) && D(h + 5)) {
      e = h + 6;
      if (e + 1 < n && (t[e] == '.' || t[e] == ',') && D(e + 1))
        for (e++; D(e); e++) {}
    }
  }
  return e && !D(e) ? e : 0;
#undef D
}

static int is_hex(int ch) { return lg__hexval((unsigned char)ch) >= 0; }
static int is_alnum(int ch) { return (ch >= '0' && ch <= '9') || ((ch | 32) >= 'a' && (ch | 32) <= 'z'); }

/* The length of a random id at t (n bytes left, p the byte before, or 0):
 * a UUID (8-4-4-4-12 hex digits), or a run of 32 hex digits or more (a
 * trace id, a digest), neither inside a longer word; 0 when none. */
static size_t id_at(const unsigned char *t, size_t n, int p) {
  static const unsigned char groups[] = {8, 4, 4, 4, 12};
  size_t e = 0;
  if (is_alnum(p)) return 0;
  for (size_t g = 0; g < sizeof groups; g++) {
    size_t k = 0;
    while (k < groups[g] && e < n && is_hex(t[e])) k++, e++;
    if (k < groups[g] || (g + 1 < sizeof groups && (e >= n || t[e++] != '-'))) {
      e = 0;
      break;
    }
  }
  if (!e) {
    while (e < n && is_hex(t[e])) e++;
    if (e < 32) return 0;
  }
  return e < n && is_alnum(t[e]) ? 0 : e;
}

size_t lg__gw_output_gist(const char *text, size_t n, char *out) {
  const unsigned char *t = (const unsigned char *)text;
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    int p = i ? t[i - 1] : 0;
    size_t k = t[i] >= '0' && t[i] <= '9' ? clock_at(t + i, n - i, p) : 0;
    if (!k && is_hex(t[i])) k = id_at(t + i, n - i, p);
    out[o++] = k ? '#' : (char)t[i];
    i += k ? k : 1;
  }
  return o;
}

/* A result that shows something (text: a computer call's screenshot's
 * digest, as read_result read it; a running command's output so far):
 * what the run has not seen before is progress, so that an action the
 * model repeats while the screen changes (a scroll down a long page, a
 * click on Next) is not a loop, nor a poll of a build that keeps
 * printing; the same screen or output again, or one seen before (a menu
 * opened and closed), is none. res (as read_result made it) carries the
 * run's count of new sights as its progress_version (trace-v1), which
 * the trace keeps, so a replay decides the same. A screen: the run's
 * first sight (baseline) is what the next are compared with, and carries
 * none (a first progress_version is always progress: the model's first
 * action would start the repeat count again). A command's output is news
 * from the first: a poll that brings the build's first lines is progress,
 * but not one that brings only the time or a new id (lg__gw_output_gist). */
static void seen_progress(chat_t *c, const char *text, size_t len, int baseline, lg_result_t *res) {
  lg__gw_run_t *r = c->r;
  char hex[65], *plain = baseline ? NULL : lg__malloc(len + 1);
  lg__sha256_hex(plain ? plain : text, plain ? lg__gw_output_gist(text, len, plain) : len, hex);
  lg__free(plain);
  hex[16] = 0;
  size_t n = json_array_size(r->sights), i = 0;
  for (; i < n; i++) {
    const char *seen = json_string_value(json_array_get(r->sights, i));
    if (seen && !strcmp(seen, hex)) break;
  }
  if (i == n) { /* new */
    if (!r->sights && !(r->sights = json_array())) return; /* out of memory: no progress said */
    if (n >= 64) json_array_remove(r->sights, 0);
    if (json_array_append_new(r->sights, json_string(hex))) return;
    if (!n && baseline) return; /* the run's first: what the next are compared with */
    r->sight_v++;
  }
  if (!r->sight_v) return; /* the first again: no progress yet to be above */
  res->has_progress_version = 1;
  res->progress_version = r->sight_v;
}

/* Messages: the name of the request's computer-use tool (its type
 * computer_20250124 and the like), or NULL. */
static const char *computer_tool(chat_t *c) {
  if (!c->computer_seen) {
    c->computer_seen = 1;
    json_t *tools = json_object_get(c->root, "tools");
    for (size_t i = 0; !c->computer && i < json_array_size(tools); i++) {
      const char *ty = sget(json_array_get(tools, i), "type");
      if (ty && !strncmp(ty, "computer_", 9)) c->computer = sget(json_array_get(tools, i), "name");
    }
  }
  return c->computer;
}

/* Whether client message i's tool_result for call `id` answers a call of
 * the computer-use tool (Messages: the tool_use block of that id in the
 * assistant message before). */
static int computer_result(chat_t *c, size_t i, const char *id) {
  const char *name = computer_tool(c);
  for (size_t a = i; name && id && a-- > 0;) {
    if (!is_role(c, a, "assistant")) continue;
    json_t *blocks = json_object_get(client_msg(c, a), "content");
    for (size_t k = 0; k < json_array_size(blocks); k++) {
      json_t *bl = json_array_get(blocks, k);
      const char *bid = sget(bl, "id"), *bn = sget(bl, "name");
      if (bid && !strcmp(bid, id)) return bn && !strcmp(bn, name);
    }
    return 0;
  }
  return 0;
}

/* Whether the result just read (text, result_text's) is a computer
 * call's screen: a Responses computer_call_output's screenshot (m) or, on
 * Messages, an image in the answer of a call of the computer-use tool. */
static int is_screen(chat_t *c, json_t *m, size_t i, const char *call_id, const char *text) {
  if (!text) return 0;
  if (is_responses(c)) {
    const lg__gwr_kind_t *k = lg__gwr_kind(sget(m, "type"));
    return k && k->out == LG__OUT_SCREENSHOT && strstr(text, "[computer_screenshot sha256:");
  }
  return is_anthropic(c) && strstr(text, "[image sha256:") && computer_result(c, i, call_id);
}

/* Fills a result read late (lg__step_t's fill): its message built and
 * read, once (a batch decided again a step at a time reads it again). */
static int fill_result(lg__step_t *st, void *ud) {
  struct lg__gw_fed_keep *k = ud;
  chat_t *c = k->c;
  if (!k->filled) {
    json_t *m = client_msg(c, k->msg), *content, *owned = NULL;
    const char *call_id;
    int is_error = 0;
    if (is_anthropic(c)) { /* a tool_result block of a user message */
      json_t *bl = json_array_get(json_object_get(m, "content"), k->block);
      content = json_object_get(bl, "content");
      call_id = sget(bl, "tool_use_id");
      is_error = json_is_true(json_object_get(bl, "is_error"));
    } else if (is_responses(c)) { /* a call's output item (lg__gwr_output_content) */
      content = owned = m ? lg__gwr_output_content(m, &is_error) : NULL;
      call_id = sget(m, "call_id");
    } else {
      content = json_object_get(m, "content");
      call_id = sget(m, "tool_call_id");
    }
    outcome_t h;
    int rc = !m ? LG_ENOMEM : read_result(content, is_error, &k->res, k, &h);
    if (!rc && is_screen(c, m, k->msg, call_id, k->text))
      seen_progress(c, k->text, strlen(k->text), 1, &k->res);
    else if (!rc && h.running && !h.exited && !blankn(h.output, h.output_len))
      seen_progress(c, h.output, h.output_len, 0, &k->res); /* a poll that brought new output */
    json_decref(owned);
    if (rc) {
      k->oom = 1;
      return rc;
    }
    k->res.call_id = k->call_id = call_id;
    k->filled = 1;
  }
  st->ev.u.result = k->res;
  return 0;
}

/* A tool result as a result event, decided with the request's other
 * results (flush_results_then), and read late: only when the step finds
 * the run waiting for a result (fill_result). Unknown calls (not the
 * gateway's: an agent's history in a fresh run) are refused by the step
 * without being read, and nothing changes. Client message i, or its
 * content block `block` (Anthropic's tool_result blocks). */
static void feed_later(chat_t *c, size_t i, size_t block) {
  lg__gw_fed_t *f = &c->fed;
  if (!fed_room(f)) return; /* out of memory: not decided, as a failed step */
  struct lg__gw_fed_keep *k = &f->keep[f->n];
  memset(k, 0, sizeof *k);
  k->c = c;
  k->msg = i;
  k->block = block;
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_RESULT;
  lg__step_init(&f->st[f->n], &ev, now_ms(c->cx));
  f->st[f->n].fill = fill_result; /* fill_ud: when the steps stay put (flush_results_then) */
  f->ev[f->n] = ev;
  f->n++;
}

/* The first of the first n results read late that could not be read (out
 * of memory), or NULL. */
static const struct lg__gw_fed_keep *unread(const lg__gw_fed_t *f, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (f->keep[i].oom) return &f->keep[i];
  return NULL;
}

/* The results fed so far and then `next` (NULL: none), decided in one
 * transaction (the step's batch: the same decisions and trace as one step
 * each), and what the results mean. The results wait for the request's
 * next step, its model call's, so that a request takes one transaction
 * before its model call leaves. Returns what lg__gw_step would for next:
 * 0 when it decided, else its failure (why in *e). A result read late
 * that could not be (out of memory) fails the batch whole, and so the
 * request (LG_ENOMEM, nothing of it stayed); the conversation is read
 * again from that result with the run's next request. */
static int flush_results_then(chat_t *c, lg__step_t *next, lg_error_t *e) {
  lg__gw_fed_t *f = &c->fed;
  if (!f->n) return next ? lg__gw_step(c->cx, c->r, next, e) : 0;
  size_t n = f->n, all = n + (next != NULL);
  if (next) {
    f->st[n] = *next; /* st and ev have room for it (fed_room) */
    f->ev[n] = next->ev;
  }
  for (size_t i = 0; i < n; i++)
    if (f->st[i].fill) f->st[i].fill_ud = &f->keep[i];
  lg__step_batch_t b = {f->st, all};
  int rc = lg__gw_step_batch(c->cx, c->r, &b, e);
  if (rc && unread(f, n)) { /* nothing of the batch stayed: the request fails */
    lg__err(e, LG_ENOMEM, NULL, -1, "out of memory");
    rc = LG_ENOMEM;
  } else if (rc) { /* failed whole (a busy store): nothing of it stayed; a step at a time */
    store_warning(c, "batch_retried", "steps", (long long)all, rc, e);
    rc = steps_alone(c, f->st, f->ev, all, NULL, e);
    if (!next) rc = 0;
  } else if (next) {
    rc = step_rc(&f->st[n]);
    if (rc) *e = f->st[n].err;
  }
  const struct lg__gw_fed_keep *k = unread(f, n);
  if (k) { /* the conversation is read again from it with the next request */
    f->oom = 1;
    if (c->r->fed > k->msg) c->r->fed = k->msg;
  }
  if (next) *next = f->st[n];
  for (size_t i = 0; i < n; i++) {
    lg__step_t *st = &f->st[i];
    if (st->decided && st->action == LG_ACT_STOP) {
      json_t *a = answer_json(st);
      note_stop(c, st, a, "I stopped this run: the loop guard ended it.", NULL, f->keep[i].call_id);
      json_decref(a);
    }
    lg__step_clear(st);
    lg__free(f->keep[i].value);
    lg__free(f->keep[i].text);
    json_decref(f->keep[i].sj);
  }
  f->n = 0;
  return rc;
}

static void flush_results(chat_t *c) {
  lg_error_t e = {0};
  flush_results_then(c, NULL, &e);
}

/* A stop decided by the gateway itself: its re-asks ran out with every
 * call of every response refused, which is a streak of blocked calls. A
 * stop event through the step, so the trace says so and replays to it. */
static void stop_run(chat_t *c) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_STOP;
  ev.u.stop.reason = LG_R_BLOCK_STREAK;
  ev.u.stop.message = "The model kept asking for tool calls that were refused, through every "
                      "re-ask the gateway allows (gateway.max_reasks); I am stopping.";
  lg__step_t st;
  json_t *a;
  step_event(c, &ev, &st, &a);
  json_decref(a);
  lg__step_clear(&st);
  const char *reason = lg_reason_name(LG_R_BLOCK_STREAK);
  c->stop_reason = LG_R_BLOCK_STREAK;
  lg__gw_note_intervention(c->cx, c->r->id, "stop", reason, NULL, NULL);
  raise_action(c->j, "stop", reason);
  if (!c->stop_text)
    c->stop_text = lg__strdup(
        "I stopped: I kept asking for the same tool call after being told it would not run, "
        "so trying again will not help. Please check what the tool needs before running me again.");
}

/* ---- the upstream body ---- */

static json_t *tool_msg(const char *id, const char *content) {
  return json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id ? id : "", "content",
                   content ? content : "");
}

/* "[loopguard] note" added to member `key` of o, in place: a string (or
 * none) gets "\n\n[loopguard] note" at its end (no blank line before it
 * when it was empty or absent: a computer call's output's note); a list of parts or blocks
 * keeps every one (an image, a file) and gets a text part of type
 * `part_type` after them. */
static void note_into(json_t *o, const char *key, const char *part_type, const char *note) {
  json_t *v = json_object_get(o, key);
  lg__buf_t nb = {0};
  if (json_is_string(v) || json_is_null(v) || !v) {
    const char *had = json_is_string(v) ? json_string_value(v) : "";
    lg__buf_printf(&nb, "%s%s[loopguard] %s", had, *had ? "\n\n" : "", note);
    if (nb.data) json_object_set_new(o, key, json_string(nb.data));
  } else if (json_is_array(v)) {
    lg__buf_printf(&nb, "[loopguard] %s", note);
    if (nb.data) json_array_append_new(v, json_pack("{s:s, s:s}", "type", part_type, "text", nb.data));
  }
  lg__buf_free(&nb);
}

/* The type of a text part in the API's lists of parts: a Responses
 * input's is input_text (its function_call_output's too); Chat
 * Completions' and Anthropic's blocks are text. */
static const char *text_part(const chat_t *c) { return is_responses(c) ? "input_text" : "text"; }

/* Message or item m with a note (note_into; new): in a Responses call's
 * output item its output, a shell's in its last chunk's stderr (its
 * output is chunks, where a text part would be refused); else in its
 * content. */
static json_t *with_note(chat_t *c, json_t *m, const char *note) {
  json_t *m2 = json_deep_copy(m);
  if (!m2) return json_incref(m);
  const char *ty = is_responses(c) ? sget(m2, "type") : NULL;
  const lg__gwr_kind_t *k = ty ? lg__gwr_kind(ty) : NULL;
  if (k && strcmp(ty, k->output)) k = NULL; /* an output item's kind, or none */
  json_t *out = json_object_get(m2, "output");
  if (k && k->out == LG__OUT_CHUNKS && json_array_size(out))
    note_into(json_array_get(out, json_array_size(out) - 1), "stderr", NULL, note);
  else if (k && (k->out == LG__OUT_SCREENSHOT || k->out == LG__OUT_LOCAL_SHELL))
    /* no text, or JSON text the note would break: a message of its own (place_notes) */
    note_into(m2, LG__GWR_NOTE, NULL, note);
  else
    note_into(m2, k ? "output" : "content", text_part(c), note);
  return m2;
}

/* Responses: notes (their text in b, emptied) said as a user message, at
 * the end of items. */
static void say_notes(json_t *items, lg__buf_t *b) {
  json_array_append_new(items, json_pack("{s:s, s:s, s:[{s:s, s:s#}]}", "type", "message", "role", "user",
                                         "content", "type", "input_text", "text", b->data, (int)b->len));
  b->len = 0;
}

/* Responses: the upstream's items with each note kept in a computer call's
 * output (LG__GWR_NOTE) said as a user message of its own, after that
 * output and the outputs next to it, where every call before has its
 * answer (a message between a call and its output is refused); new. */
static json_t *place_notes(json_t *items) {
  size_t n = json_array_size(items), i = 0;
  while (i < n && !json_object_get(json_array_get(items, i), LG__GWR_NOTE)) i++;
  if (i == n) return json_incref(items); /* none: most requests */
  json_t *out = json_array(), *open = json_object();
  lg__buf_t notes = {0};
  for (i = 0; out && open && i < n; i++) {
    json_t *it = json_array_get(items, i);
    const char *ty = sget(it, "type"), *note = sget(it, LG__GWR_NOTE), *id = sget(it, "call_id");
    if (note) {
      lg__buf_printf(&notes, "%s%s", notes.len ? "\n\n" : "", note);
      it = json_copy(it); /* the restored turn's item stays as it is */
      json_object_del(it, LG__GWR_NOTE);
      json_array_append_new(out, it);
    } else {
      json_array_append(out, it);
    }
    if (id && lg__gwr_is_call(ty)) json_object_set_new(open, id, json_true());
    if (id && lg__gwr_is_output(ty)) json_object_del(open, id);
    json_t *next = json_array_get(items, i + 1);
    if (notes.len && !json_object_size(open) && !(next && lg__gwr_is_output(sget(next, "type"))))
      say_notes(out, &notes);
  }
  if (notes.len && out) say_notes(out, &notes); /* calls left unanswered: said at the end */
  lg__buf_free(&notes);
  json_decref(open);
  return out;
}

/* The screenshot the client sent last (a computer call's output, or an
 * image in a person's message), as a computer_call_output's output; NULL
 * when it sent none (borrowed from the client's message, or new). */
static json_t *last_screen(chat_t *c, json_t **owned) {
  *owned = NULL;
  for (size_t i = c->n; i-- > 0;) {
    const char *ty = msg_str(c, i, PEEK_TYPE);
    if (ty && !strcmp(ty, "computer_call_output")) {
      json_t *o = json_object_get(client_msg(c, i), "output");
      if (sget(o, "image_url") || sget(o, "file_id")) return o;
    } else if (is_role(c, i, "user")) {
      json_t *parts = json_object_get(client_msg(c, i), "content");
      for (size_t k = json_array_size(parts); k-- > 0;) {
        json_t *p = json_array_get(parts, k);
        const char *pt = sget(p, "type");
        if (!pt || strcmp(pt, "input_image") || !(sget(p, "image_url") || sget(p, "file_id"))) continue;
        *owned = json_pack("{s:s, s:O?, s:O?}", "type", "computer_screenshot", "image_url",
                           json_object_get(p, "image_url"), "file_id", json_object_get(p, "file_id"));
        if (*owned && !sget(*owned, "image_url")) json_object_del(*owned, "image_url");
        if (*owned && !sget(*owned, "file_id")) json_object_del(*owned, "file_id");
        return *owned;
      }
    }
  }
  return NULL;
}

/* Responses: the output of computer call tc, refused (lg__gwr_output_for,
 * with the screen as the client saw it last). */
static json_t *output_for(chat_t *c, json_t *tc, const char *id, const char *text) {
  const lg__gwr_kind_t *k = lg__gwr_kind(sget(tc, "type"));
  json_t *owned = NULL, *screen = k && k->out == LG__OUT_SCREENSHOT ? last_screen(c, &owned) : NULL;
  json_t *o = lg__gwr_output_for(tc, id, text, screen);
  json_decref(owned);
  return o;
}

/* The steer message of the observe rung for a tool result, said with the
 * result it is about (never between a call and its result). */
static const char *result_steer(chat_t *c, json_t *m) {
  const char *role = sget(m, "role"), *ty = sget(m, "type");
  const char *id = role && !strcmp(role, "tool") ? sget(m, "tool_call_id")
                   : is_responses(c) && lg__gwr_is_output(ty) ? sget(m, "call_id")
                                                                                  : NULL;
  return id ? sget(c->r->steer, id) : NULL;
}

/* Anthropic: a user message whose tool_result blocks carry steer messages. */
static json_t *anthropic_steered(chat_t *c, json_t *m) {
  json_t *m2 = json_deep_copy(m);
  json_t *blocks = json_object_get(m2, "content");
  for (size_t k = 0; k < json_array_size(blocks); k++) {
    json_t *bl = json_array_get(blocks, k);
    const char *ty = sget(bl, "type"), *tid = sget(bl, "tool_use_id");
    const char *st = ty && !strcmp(ty, "tool_result") && tid ? sget(c->r->steer, tid) : NULL;
    if (st) note_into(bl, "content", "text", st);
  }
  return m2 ? m2 : json_incref(m);
}

/* Client message i as the upstream gets it (new reference). */
static json_t *client_message(chat_t *c, size_t i) {
  json_t *m = client_msg(c, i);
  const char *role = sget(m, "role");
  const char *steer = result_steer(c, m);
  json_t *out;
  if (steer) out = with_note(c, m, steer);
  else if (is_anthropic(c) && role && !strcmp(role, "user") && json_object_size(c->r->steer) &&
           json_is_array(json_object_get(m, "content")))
    out = anthropic_steered(c, m);
  else out = json_incref(m);
  /* a text loop's steer: said with the message that followed it */
  if (c->steer_text && c->steer_at == i) {
    json_t *o2 = with_note(c, out, c->steer_text);
    json_decref(out);
    out = o2;
  }
  return out;
}

/* Whether client message i can carry a text loop's steer: the person's
 * message or a tool's result (a tool message, a function_call_output
 * item, an Anthropic user message), from its role and type alone. */
static int steer_carrier(chat_t *c, size_t i) {
  const char *ty = msg_str(c, i, PEEK_TYPE);
  if (is_responses(c) && ty)
    return lg__gwr_is_output(ty) || (!strcmp(ty, "message") && is_role(c, i, "user"));
  return is_role(c, i, "user") || (!is_anthropic(c) && is_role(c, i, "tool"));
}

/* Where this request says a text loop's steer (the observe rung): observed
 * on an answer, it is said with the next request, on its last message that
 * can carry it (steer_carrier), after the answer it is about, as a note
 * (client_message). A conversation the client sends whole every time gets
 * it on that same message in every later request, so that the upstream
 * sees one conversation; one the upstream keeps (Responses'
 * previous_response_id or conversation) gets it once: taken from the run
 * for this request, and given back unless an upstream answered it
 * (text_steer_done). Earlier builds said it only when the last message was
 * the person's or a tool message (a Responses request that ends with a
 * function_call_output never got it), counted a kept conversation's index
 * within each request's input (said again with every later request), and
 * wrote it into the stored items of the gateway's own answer of the
 * request that observed it. Called once a request, before its body is
 * built: a steer observed during the request waits for the next. */
static void text_steer_place(chat_t *c) {
  lg__gw_run_t *r = c->r;
  if (!r->text_steer) return;
  int kept = is_responses(c) && (c->prev_id || c->conv_id);
  if (r->text_steer_at != SIZE_MAX) { /* said with an earlier request */
    if (kept) { /* which the upstream holds now */
      lg__free(r->text_steer);
      r->text_steer = NULL;
      mem_sync(c);
    } else {
      c->steer_text = lg__strdup(r->text_steer);
      c->steer_at = r->text_steer_at;
    }
    return;
  }
  size_t i = c->n;
  while (i > 0 && !steer_carrier(c, i - 1)) i--;
  if (!i) return; /* no message to say it with: the next request's */
  c->steer_at = i - 1;
  if (kept) {
    c->steer_text = r->text_steer;
    r->text_steer = NULL;
    c->steer_once = 1;
  } else {
    c->steer_text = lg__strdup(r->text_steer);
    r->text_steer_at = c->steer_at;
  }
  mem_sync(c);
}

/* The request's end: a steer it took from the run (steer_once) that no
 * upstream answered goes back to the run, for the next request (unless
 * another was observed meanwhile). */
static void text_steer_done(chat_t *c) {
  lg__gw_run_t *r = c->r;
  if (!c->steer_once || c->steer_sent) return;
  if (!r->text_steer) {
    r->text_steer = c->steer_text;
    r->text_steer_at = SIZE_MAX;
    c->steer_text = NULL;
  }
  mem_sync(c);
}

/* Responses: the previous_response_id of the request when it names an
 * answer the gateway made itself (a stop, a stream it cut), which no
 * upstream knows: what own_response() kept of it ({prev, items}), else
 * NULL. A re-ask continues an upstream response. */
static json_t *own_prev(const chat_t *c) {
  if (!is_responses(c) || c->reask_prev || !c->prev_id) return NULL;
  return json_object_get(c->r->own, c->prev_id);
}

/* The answers (function_call_output items) among restored items, added
 * to msgs: for an upstream that keeps the conversation, calls and all. */
static void append_answers(json_t *msgs, json_t *items) {
  for (size_t t = 0; t < json_array_size(items); t++) {
    json_t *it = json_array_get(items, t);
    const char *ty = sget(it, "type");
    if (lg__gwr_is_output(ty)) json_array_append(msgs, it);
  }
}

/* What a conversation's upstream is sent again of restored items: of a
 * turn the guard restored, the answers (the conversation holds its
 * calls); of a request whose stream was cut (conv_lost), all of it. */
static void conv_again(json_t *msgs, const lg__gw_restore_t *rs) {
  if (rs->lost) json_array_extend(msgs, rs->items);
  else append_answers(msgs, rs->items);
}

/* What of an answer both a restored turn and the client may hold, by a
 * key of its own: its thinking (Messages: a thinking block's signature,
 * a redacted_thinking block's data; Chat Completions: OpenRouter's
 * reasoning_details, signed or encrypted) and its reasoning and message
 * items (Responses: their id; a stream gave the client both as they
 * came). NULL for anything else. */
static const char *reasoning_key(json_t *b) {
  const char *ty = sget(b, "type");
  const char *k = !ty                                  ? NULL
                  : !strcmp(ty, "thinking")            ? sget(b, "signature")
                  : !strcmp(ty, "redacted_thinking")   ? sget(b, "data")
                  : !strcmp(ty, "reasoning")           ? sget(b, "id")
                  : !strcmp(ty, "message")             ? sget(b, "id")
                  : !strcmp(ty, "reasoning.text")      ? sget(b, "signature")
                  : !strcmp(ty, "reasoning.encrypted") ? sget(b, "data")
                                                       : NULL;
  return k && *k ? k : NULL;
}

/* Where a message keeps its thinking: Messages' content blocks, Chat
 * Completions' reasoning_details. */
static const char *thinking_member(const chat_t *c) {
  return is_anthropic(c) ? "content" : "reasoning_details";
}

/* The reasoning keys of the restored items (each an item, or a message
 * that keeps its thinking in thinking_member) added to the set held. */
static void hold_reasoning(const chat_t *c, json_t *held, json_t *items) {
  for (size_t t = 0; t < json_array_size(items); t++) {
    json_t *it = json_array_get(items, t), *bl = json_object_get(it, thinking_member(c));
    const char *k = reasoning_key(it);
    if (k) json_object_set_new(held, k, json_true());
    for (size_t b = 0; b < json_array_size(bl); b++)
      if ((k = reasoning_key(json_array_get(bl, b)))) json_object_set_new(held, k, json_true());
  }
}

/* The client's message m (new: a copy, or m itself) without the thinking
 * that restored turns hold (held), unless none of its own would be left
 * to start it (a provider with thinking on wants one there). Messages:
 * what comes before its own first thinking block goes too, the refused
 * answer's text with its thinking (the restored turn holds both), so
 * that the message still starts with its thinking. */
static json_t *without_held_thinking(const chat_t *c, json_t *m, json_t *held) {
  json_t *bl = json_object_get(m, thinking_member(c));
  size_t n = json_array_size(bl), dup = 0, own = 0, first = n;
  for (size_t k = 0; k < n; k++) {
    const char *key = reasoning_key(json_array_get(bl, k));
    if (key && json_object_get(held, key)) dup++;
    else if (key && !own++) first = k;
  }
  if (!dup || !own) return json_incref(m);
  json_t *out = json_copy(m), *kept = json_array();
  for (size_t k = is_anthropic(c) ? first : 0; k < n; k++) {
    const char *key = reasoning_key(json_array_get(bl, k));
    if (!key || !json_object_get(held, key)) json_array_append(kept, json_array_get(bl, k));
  }
  json_object_set_new(out, thinking_member(c), kept);
  return out;
}

/* Responses: 1 when client item i is a reasoning or message item that
 * restored turns hold (held), itself or an item_reference to it. */
static int held_reasoning_item(chat_t *c, size_t i, json_t *held) {
  if (!is_type(c, i, "reasoning") && !is_type(c, i, "item_reference") && !is_type(c, i, "message")) return 0;
  const char *id = sget(client_msg(c, i), "id");
  return id && json_object_get(held, id);
}

/* The conversation the upstream sees: the client's, with the refused
 * calls restored in place and the steer messages said; after an answer
 * of the gateway's own, what the upstream did not see of it first. */
static json_t *build_messages(chat_t *c) {
  lg__gw_run_t *r = c->r;
  json_t *msgs = json_array();
  if (!msgs) return NULL;
  size_t k = 0;
  json_t *own = own_prev(c);
  if (own) json_array_extend(msgs, json_object_get(own, "items"));
  if (c->conv_id) {
    /* The upstream's conversation holds every call it made: the refused
     * ones are answered once, first, then what the client sent (a re-ask:
     * nothing more, the conversation has it). */
    if (c->conv_pending) /* the store's: whichever replica made them, as restore() chose them */
      json_array_extend(msgs, c->conv_pending);
    for (size_t q = 0; !c->conv_pending && q < r->nrs; q++)
      if (!r->rs[q].conv_sent) conv_again(msgs, &r->rs[q]);
    for (size_t i = 0; !c->reask_prev && i < c->n; i++) json_array_append_new(msgs, client_message(c, i));
    return msgs;
  }
  const char *prev = c->reask_prev ? c->reask_prev : c->prev_id;
  if (is_responses(c) && prev) {
    /* The upstream keeps the conversation: the refused calls of the
     * response continued are answered first, then what the client sent. */
    for (size_t q = 0; q < r->nrs; q++)
      if (r->rs[q].resp_id && !strcmp(r->rs[q].resp_id, prev)) append_answers(msgs, r->rs[q].items);
    if (prev == c->prev_id && c->prev_answers) append_answers(msgs, c->prev_answers); /* the store's */
    k = r->nrs; /* nothing else restored */
  }
  /* A stream forwards an answer's thinking and reasoning items as they
   * come: when every call of that answer was refused and the upstream
   * asked again, the client holds them beside the re-ask's (Chat
   * Completions: numbered after them, shifted_details), and the turn
   * restored holds them too. The upstream gets each once, in the turn it
   * made (OpenAI refuses a reasoning item twice, or not followed by its
   * own answer's item). */
  json_t *held = json_object();
  for (size_t i = 0; i <= c->n; i++) {
    for (; k < r->nrs && r->rs[k].anchor <= i; k++)
      if (!r->rs[k].resp_id || !prev) {
        json_array_extend(msgs, r->rs[k].items);
        hold_reasoning(c, held, r->rs[k].items);
      }
    if (i == c->n || (c->reask_prev && is_responses(c))) break;
    if (!json_object_size(held)) {
      json_array_append_new(msgs, client_message(c, i));
    } else if (!is_responses(c)) {
      json_t *m = client_message(c, i);
      json_array_append_new(msgs, without_held_thinking(c, m, held));
      json_decref(m);
    } else if (!held_reasoning_item(c, i, held)) {
      json_array_append_new(msgs, client_message(c, i));
    }
  }
  json_decref(held);
  return msgs;
}

/* A tool's name in the API's tools list / tool_choice (Chat Completions:
 * a function's, or a custom tool's, {"type": "custom", "custom": {...}};
 * Responses: a built-in tool the client runs is named by its type). */
static const char *tool_name_of(const chat_t *c, json_t *t) {
  const char *nm;
  if (flat_tools(c)) {
    nm = sget(t, "name");
    return nm || !is_responses(c) ? nm : lg__gwr_builtin_tool(sget(t, "type"));
  }
  nm = sget(json_object_get(t, "function"), "name");
  return nm ? nm : sget(json_object_get(t, "custom"), "name");
}

static const struct {
  unsigned bit;
  const char *name, *desc, *field, *fdesc;
} offered[] = {
    {LG_ALT_ASK_HUMAN, "ask_human",
     "Ask the person you work for a question when you are stuck; your run ends and they answer.",
     "question", "The question for the person."},
    {LG_ALT_FINALIZE_PARTIAL, "finalize_partial",
     "Finish now with the partial answer you have, saying what is missing.", "answer",
     "Your answer as it is."},
};

/* An offered tool (cascade.offer) in the API's tools shape. */
static json_t *offered_tool(const chat_t *c, size_t i) {
  json_t *params = json_pack("{s:s, s:{s:{s:s, s:s}}, s:[s]}", "type", "object", "properties",
                             offered[i].field, "type", "string", "description", offered[i].fdesc,
                             "required", offered[i].field);
  if (is_anthropic(c))
    return json_pack("{s:s, s:s, s:o}", "name", offered[i].name, "description", offered[i].desc,
                     "input_schema", params);
  if (is_responses(c))
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "function", "name", offered[i].name,
                     "description", offered[i].desc, "parameters", params);
  return json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name",
                   offered[i].name, "description", offered[i].desc, "parameters", params);
}

static json_t *tool_choice_none(const chat_t *c) {
  return is_anthropic(c) ? json_pack("{s:s}", "type", "none") : json_string("none");
}

/* The cascade on the request's tools: the hidden tool taken out (and a
 * tool_choice forcing it dropped), the offered tools added; tools are
 * never left empty (tool use is turned off instead). The final round
 * keeps the tools and turns tool use off. */
static void apply_cascade(chat_t *c, json_t *b) {
  lg__gw_run_t *r = c->r;
  json_t *tools = json_object_get(b, "tools");
  if (!json_is_array(tools)) return;
  if (c->final_round) {
    json_object_set_new(b, "tool_choice", tool_choice_none(c));
    return;
  }
  int hide = r->hide_left > 0 && r->hide_tool;
  unsigned offer = c->estimate ? r->policy->offer : r->offer;
  if (c->estimate) hide = 0; /* the worst case: nothing taken out */
  if (!hide && !offer) return;
  json_t *kept = json_array();
  for (size_t i = 0; i < json_array_size(tools); i++) {
    json_t *t = json_array_get(tools, i);
    const char *nm = tool_name_of(c, t);
    if (!hide || !nm || strcmp(nm, r->hide_tool)) json_array_append(kept, t);
  }
  for (size_t i = 0; i < LG__ARRAY_LEN(offered); i++) {
    int have = 0;
    for (size_t k = 0; k < json_array_size(kept); k++) {
      const char *nm = tool_name_of(c, json_array_get(kept, k));
      have |= nm && !strcmp(nm, offered[i].name);
    }
    if ((offer & offered[i].bit) && !have) json_array_append_new(kept, offered_tool(c, i));
  }
  json_t *tc = json_object_get(b, "tool_choice");
  const char *forced = tool_name_of(c, tc);
  if (hide && forced && !strcmp(forced, r->hide_tool)) json_object_del(b, "tool_choice");
  if (json_array_size(kept)) {
    json_object_set_new(b, "tools", kept);
  } else { /* never tools: [] with tool calls in the conversation */
    json_decref(kept);
    json_object_set_new(b, "tool_choice", tool_choice_none(c));
  }
}

/* The model this call is sent with: the escalation's, else the client's
 * (routed); for the worst case, the longer of the two names. */
static const char *call_model(const chat_t *c) {
  const char *esc = c->estimate ? c->r->policy->escalate_model : c->esc_model;
  if (!esc || !c->model) return c->model;
  if (c->estimate && strlen(esc) < strlen(c->model)) return c->model;
  return esc;
}

/* An OpenAI stream whose client did not ask for the usage chunk: the
 * gateway asks for it (its usage settles the call's cost). */
static int usage_unasked(const chat_t *c) {
  return c->stream && c->api == LG__GW_API_OPENAI && !c->client_usage &&
         !lg__gw_learnt(c->cx, c->ui, LG__GW_LEARNT_NO_STREAM_OPTIONS, NULL);
}

static int mentions(const lg__buf_t *b, const char *word) {
  size_t n = strlen(word);
  for (size_t i = 0; !b->oom && i + n <= b->len; i++)
    if (!memcmp(b->data + i, word, n)) return 1;
  return 0;
}

/* Whether the upstream refused a member the gateway added to the client's
 * request (x: a 400 or 422 that names it): stream_options, which
 * Mistral's API does not take (422, "Extra inputs are not permitted"; it
 * sends a stream's usage unasked); a loopguard key's max_tokens, which
 * OpenAI's reasoning models do not take ("Use 'max_completion_tokens'
 * instead"). The upstream is marked, never sent it again, and the
 * request mended: 1, ask again at once. */
/* An exchange's answer when refused_added mended the call: made again
 * (0 is a re-ask, any other value the request answered). */
#define MENDED (-1)

static int refused_added(chat_t *c, const lg__gw_http_t *x) {
  if (x->status != 400 && x->status != 422) return 0;
  if (usage_unasked(c) && mentions(&x->body_out, "stream_options")) {
    lg__gw_learn(c->cx, c->ui, LG__GW_LEARNT_NO_STREAM_OPTIONS, NULL);
    return !usage_unasked(c); /* learnt: asked without it (never again and again) */
  }
  if (c->root_added && !strcmp(c->root_added, "max_tokens") && mentions(&x->body_out, "max_completion_tokens")) {
    json_t *v = json_incref(json_object_get(c->root, "max_tokens"));
    json_object_del(c->root, "max_tokens");
    json_object_set_new(c->root, "max_completion_tokens", v);
    c->root_added = "max_completion_tokens";
    lg__gw_learn(c->cx, c->ui, LG__GW_LEARNT_MAX_COMPLETION_TOKENS, c->model); /* keys.c's */
    return 1;
  }
  return 0;
}

static json_t *build_body(chat_t *c) {
  if (lg__json_lazy_all(&c->lazy, c->messages)) return NULL; /* the copy shares them */
  json_t *b = json_copy(c->root); /* shallow: the client's members shared */
  json_t *msgs = b ? build_messages(c) : NULL;
  if (!b || !msgs) {
    json_decref(b);
    json_decref(msgs);
    return NULL;
  }
  const char *prev = c->reask_prev ? c->reask_prev : c->prev_id;
  json_t *own = own_prev(c);
  if (is_responses(c) && prev && c->reask_prev && !c->conv_id) /* a conversation goes on by itself */
    json_object_set_new(b, "previous_response_id", json_string(c->reask_prev));
  else if (own && sget(own, "prev")) /* never an id of the gateway's own */
    json_object_set_new(b, "previous_response_id", json_incref(json_object_get(own, "prev")));
  else if (own)
    json_object_del(b, "previous_response_id");
  if (is_responses(c)) {
    json_t *placed = place_notes(msgs);
    json_decref(msgs);
    if (!(msgs = placed)) {
      json_decref(b);
      return NULL;
    }
  }
  json_object_set_new(b, is_responses(c) ? "input" : "messages", msgs);
  const char *model = call_model(c);
  if (model) json_object_set_new(b, "model", json_string(model));
  apply_cascade(c, b);
  if (c->final_round) { /* asked whole, whatever the client's stream */
    json_object_del(b, "stream");
    json_object_del(b, "stream_options");
  } else if (usage_unasked(c)) {
    json_t *so = json_object_get(b, "stream_options");
    json_t *so2 = json_is_object(so) ? json_copy(so) : json_object();
    json_object_set_new(so2, "include_usage", json_true());
    json_object_set_new(b, "stream_options", so2);
  }
  if (lg__gwo_legacy_body(c, b)) { /* said in the client's dialect */
    json_decref(b);
    return NULL;
  }
  return b;
}

/* Whether client message m is sent with a steer message (client_message
 * would change it). */
static int steered(chat_t *c, json_t *m) {
  if (result_steer(c, m)) return 1;
  const char *role = sget(m, "role");
  if (!is_anthropic(c) || !role || strcmp(role, "user")) return 0;
  json_t *blocks = json_object_get(m, "content");
  for (size_t k = 0; k < json_array_size(blocks); k++) {
    json_t *bl = json_array_get(blocks, k);
    const char *ty = sget(bl, "type"), *tid = sget(bl, "tool_use_id");
    if (ty && !strcmp(ty, "tool_result") && tid && sget(c->r->steer, tid)) return 1;
  }
  return 0;
}

/* Whether build_body would give the client's body back as it is, but for
 * members it adds in front (client_bytes): nothing restored, no steer
 * message, no cascade, the client's model, no re-ask, no stream_options
 * to change, nothing changed in the top object but a key's max_tokens.
 * Then the client's bytes are what the upstream gets (no parse-and-dump
 * round trip, which also rewrites numbers, escapes and white space). */
static int body_unchanged(chat_t *c) {
  lg__gw_run_t *r = c->r;
  if (c->input_wrap || c->final_round || c->reask_prev || r->nrs || c->steer_text ||
      c->root_replaced || own_prev(c) || c->prev_answers || json_array_size(c->conv_pending))
    return 0;
  const char *model = call_model(c), *asked = sget(c->root, "model");
  if (model && (!asked || strcmp(model, asked))) return 0;
  if (usage_unasked(c) && json_object_get(c->root, "stream_options")) return 0;
  if (json_is_array(json_object_get(c->root, "tools"))) {
    unsigned offer = c->estimate ? r->policy->offer : r->offer;
    if (offer || (!c->estimate && r->hide_left > 0 && r->hide_tool)) return 0;
  }
  for (size_t i = 0; json_object_size(r->steer) && i < c->n; i++)
    if (steered(c, client_msg(c, i))) return 0;
  return 1;
}

/* The client's bytes, with what build_body would add to the top object
 * and the client's body has none of written first in it ("{" then the
 * members, a comma, and the rest of the object): the member keys.c added
 * (c->root_added, an integer max_tokens), and a stream's request for the
 * usage chunk (which settles its cost) when the client sent no
 * stream_options. A key's request or a stream then costs no parse and dump
 * of the whole conversation. With nothing to add, the job's own buffer
 * (*own NULL: not copied, which for a body of 30 MB of images was a tenth
 * of a second), and so for the worst case's estimate, of which only the
 * length is read (prepare_call); else a copy, *own. NULL when out of
 * memory. */
static const char *client_bytes(chat_t *c, size_t *len, char **own) {
  const char *b = c->j->body;
  size_t n = c->j->body_len, at = 0;
  char head[160] = "";
  int hl = 0;
  if (c->root_added)
    hl = snprintf(head, sizeof head, "\"%s\":%lld,", c->root_added,
                  (long long)json_integer_value(json_object_get(c->root, c->root_added)));
  if (usage_unasked(c))
    hl += snprintf(head + hl, sizeof head - (size_t)hl, "\"stream_options\":{\"include_usage\":true},");
  if (hl) {
    while (at < n && b[at] != '{') at++; /* the top object (the body was read as one) */
    at++;
    size_t k = lg__json_ws_end(b, at, n);
    if (k < n && b[k] == '}') head[--hl] = 0; /* an empty object: no comma */
  }
  *own = NULL;
  if (!hl || c->estimate) {
    *len = n + (size_t)hl;
    return b;
  }
  char *t = lg__malloc(n + (size_t)hl + 1);
  if (!t) return NULL;
  memcpy(t, b, at);
  memcpy(t + at, head, (size_t)hl);
  memcpy(t + at + hl, b + at, n - at);
  *len = n + (size_t)hl;
  t[*len] = 0;
  return *own = t;
}

/* The upstream body as text: *len its length; *raw (may be NULL) set when
 * it is the client's bytes (client_bytes); *own what the caller frees
 * (NULL: the text is the job's body). NULL when out of memory. */
static const char *body_text(chat_t *c, size_t *len, int *raw, char **own) {
  if (raw) *raw = 0;
  if (body_unchanged(c)) {
    const char *t = client_bytes(c, len, own);
    if (t && raw) *raw = 1;
    return t;
  }
  json_t *body = build_body(c);
  char *t = body ? lg__json_text(body, len) : NULL;
  json_decref(body);
  return *own = t;
}

/* Bytes a hidden tool can add to a body once it is dumped: tool use
 * turned off when no tool is left (',"tool_choice":{"type":"none"}').
 * And each real of a body sent as the client's bytes can grow by 21
 * (jansson writes "0.7" as "0.69999999999999996"). */
#define HIDE_SLACK 32

/* ---- final answers ---- */

#define OWN_KEPT 8 /* answers of the gateway's own a run remembers */

/* e kept as r's answer `id` of its own (taken), the oldest past OWN_KEPT
 * let go. */
static void own_keep(lg__gw_run_t *r, const char *id, json_t *e) {
  while (json_object_size(r->own) >= OWN_KEPT) { /* the oldest goes */
    void *it = json_object_iter(r->own);
    json_object_del(r->own, json_object_iter_key(it));
  }
  json_object_set_new(r->own, id, e);
}

/* What the store keeps beside r's key KIND:ID (lg__gw_data_get), or NULL. */
static json_t *kept_data(chat_t *c, const char *kind, const char *id) {
  char *k = id_key(kind, id);
  json_t *d = k ? lg__gw_data_get(c->cx, c->r, k) : NULL;
  lg__free(k);
  return d;
}

/* ---- the run's memory, one for the replicas of a store ----
 *
 * What a run's later requests are sent upstream with besides the client's
 * conversation: the calls restored in place (rs), the observe rung's
 * steer notes by call id, a text loop's steer note and the message it is
 * said with; what a request continuing a stored Responses conversation
 * is billed for it (stored_tokens: input_bound), and the model of a
 * cascade's escalation that the next model calls are priced at. Kept in
 * the store beside the run ("gw:RUN", lg__gw_data_put) whenever it
 * changes, before the answer that changed it goes (mem_sync),
 * and read at every request of a run this request did not make
 * (mem_fetch): the replica a conversation's next request comes to sends
 * what the one that answered would have sent. Not on memory: (the
 * server's memory is all there is). Two replicas deciding requests of one
 * run at the same moment both write it: the last write wins (a
 * conversation's requests come one after another). */

static json_t *mem_json(const lg__gw_run_t *r) {
  json_t *rs = json_array();
  for (size_t q = 0; rs && q < r->nrs; q++)
    json_array_append_new(rs, json_pack("{s:I, s:O, s:s?, s:b}", "at", (json_int_t)r->rs[q].anchor, "items",
                                        r->rs[q].items, "resp", r->rs[q].resp_id, "sent", r->rs[q].conv_sent));
  json_int_t at = r->text_steer_at == SIZE_MAX ? -1 : (json_int_t)r->text_steer_at;
  json_t *m = rs ? json_pack("{s:o, s:O, s:s?, s:I, s:I, s:s?, s:i}", "rs", rs, "steer", r->steer,
                             "text_steer", r->text_steer, "text_steer_at", at, "stored_tokens",
                             (json_int_t)r->stored_tokens, "esc_model", r->esc_left > 0 ? r->esc_model : NULL,
                             "esc_left", r->esc_left > 0 ? r->esc_left : 0)
                 : NULL;
  if (m && json_array_size(r->sights)) { /* (named "screens" before running outputs counted) */
    json_object_set(m, "screens", r->sights);
    json_object_set_new(m, "screen_v", json_integer(r->sight_v));
  }
  return m;
}

static int mem_empty(const lg__gw_run_t *r) {
  return !r->nrs && !json_object_size(r->steer) && !r->text_steer && !r->stored_tokens && r->esc_left <= 0 &&
         !json_array_size(r->sights);
}

/* The memory written to the store when it changed since it was last
 * written or read (nothing written while it was always empty): its text
 * is what the store gets, and its hash what is compared. */
static void mem_sync(chat_t *c) {
  lg__gw_run_t *r = c->r;
  if (!r || !lg__gw_keys_kept(c->cx) || (!r->mem_stored && mem_empty(r))) return;
  json_t *m = mem_json(r);
  char *t = m ? lg__json_text(m, NULL) : NULL;
  json_decref(m);
  uint64_t h = t ? lg__hash_str(t) : 0;
  if (t && (!r->mem_stored || h != r->mem_hash)) {
    char *k = id_key("gw", r->id);
    if (k) lg__gw_data_put_text(c->cx, r, k, t);
    lg__free(k);
    r->mem_stored = 1;
    r->mem_hash = h;
  }
  lg__free(t);
}

/* The run's memory is the store's: the refused calls of the response the
 * request continues are in it (restore() wrote the same to "rs:ID"), not
 * to be sent twice. */
static void mem_taken(chat_t *c) {
  json_decref(c->prev_answers);
  c->prev_answers = NULL;
}

/* The store's memory of the run, taken in place of this server's (which
 * another replica may have made stale), unless it is the text this
 * server wrote or read last (its hash): then nothing is parsed or
 * copied, which is every request of a run on one server. Copied out of
 * the reader's chunks: the run keeps it. */
static void mem_fetch(chat_t *c) {
  lg__gw_run_t *r = c->r;
  if (c->run_made || !lg__gw_keys_kept(c->cx)) return; /* a run this request made: nothing stored */
  char *k = id_key("gw", r->id);
  char *t = k ? lg__gw_data_text(c->cx, r, k) : NULL;
  lg__free(k);
  if (!t) return;
  uint64_t h = lg__hash_str(t);
  if (r->mem_stored && h == r->mem_hash) { /* this server's memory is the store's */
    lg__free(t);
    mem_taken(c);
    return;
  }
  json_t *d = lg__json_load(t, strlen(t), NULL, NULL), *rs = json_object_get(d, "rs");
  lg__free(t);
  json_t *steer = json_object_get(d, "steer");
  if (!json_is_array(rs) || !json_is_object(steer)) {
    json_decref(d);
    return;
  }
  size_t n = json_array_size(rs);
  lg__gw_restore_t *v = n ? lg__calloc(n, sizeof *v) : NULL;
  json_t *st = json_deep_copy(steer);
  const char *ts = sget(d, "text_steer");
  char *text = ts ? lg__strdup(ts) : NULL;
  if ((n && !v) || !st || (ts && !text)) { /* out of memory: this server's memory stays */
    lg__free(v);
    json_decref(st);
    lg__free(text);
    json_decref(d);
    return;
  }
  for (size_t q = 0; q < n; q++) {
    json_t *e = json_array_get(rs, q);
    const char *resp = sget(e, "resp");
    v[q].anchor = (size_t)json_integer_value(json_object_get(e, "at"));
    v[q].items = json_deep_copy(json_object_get(e, "items"));
    v[q].resp_id = resp ? lg__strdup(resp) : NULL;
    v[q].conv_sent = json_is_true(json_object_get(e, "sent"));
    if (!v[q].items) v[q].items = json_array(); /* out of memory: that restore is lost */
  }
  for (size_t q = 0; q < r->nrs; q++) {
    json_decref(r->rs[q].items);
    lg__free(r->rs[q].resp_id);
  }
  lg__free(r->rs);
  r->rs = v;
  r->nrs = r->caprs = n;
  json_decref(r->steer);
  r->steer = st;
  lg__free(r->text_steer);
  r->text_steer = text;
  json_int_t at = json_integer_value(json_object_get(d, "text_steer_at"));
  r->text_steer_at = at < 0 ? SIZE_MAX : (size_t)at;
  /* the most a stored Responses conversation of the run holds: the larger
   * of the two (a worst case never under-estimates) */
  json_int_t stored = json_integer_value(json_object_get(d, "stored_tokens"));
  if (stored > r->stored_tokens) r->stored_tokens = stored;
  /* the escalation's model, which the next model calls are priced at */
  const char *esc = sget(d, "esc_model");
  json_int_t left = json_integer_value(json_object_get(d, "esc_left"));
  char *em = esc && left > 0 ? lg__strdup(esc) : NULL;
  if (em || !esc) {
    lg__free(r->esc_model);
    r->esc_model = em;
    r->esc_left = em && left < INT_MAX ? (int)left : 0;
  }
  json_t *screens = json_object_get(d, "screens");
  json_int_t sv = json_integer_value(json_object_get(d, "screen_v"));
  if (json_array_size(screens) && sv >= 0 && (screens = json_deep_copy(screens))) {
    json_decref(r->sights);
    r->sights = screens;
    r->sight_v = sv;
  }
  json_decref(d);
  r->mem_stored = 1;
  r->mem_hash = h; /* as read: a memory taken whole writes it again only once it changes */
  mem_taken(c);
}

/* What the run kept of the response a request continues from, or of its
 * conversation, when another replica may hold it (it answered, or this
 * server did before a restart or an eviction): from the store
 * (lg__gw_data_get), unless memory: (the run's memory is all there is).
 *   - a conversation (conv_id): the answers of refused calls its upstream
 *     has not had, whichever replica made or sent them (conv_pending);
 *   - an answer the gateway made itself ("own:ID"): kept in the run's
 *     memory again (own_prev);
 *   - an upstream's response another replica answered: the answers of its
 *     refused calls, which the upstream's stored response holds unanswered
 *     ("rs:ID", restore()): the request's own (prev_answers). */
static void prev_fetch(chat_t *c) {
  lg__gw_run_t *r = c->r;
  if (!lg__gw_keys_kept(c->cx)) return;
  if (c->conv_id) {
    json_t *d = kept_data(c, "answers:conv", c->conv_id);
    c->conv_pending = json_is_array(d) ? json_incref(d) : json_array();
    json_decref(d);
    return;
  }
  if (!is_responses(c) || !c->prev_id) return;
  /* (d is read once, then tested: jansson's json_is_* name their argument
   * twice, so a call inside one is made twice and its first value lost) */
  json_t *d = NULL;
  if (!strncmp(c->prev_id, "resp_lg", 7)) {
    if (!json_object_get(r->own, c->prev_id) && (d = kept_data(c, "own", c->prev_id)) && json_is_object(d))
      own_keep(r, c->prev_id, json_deep_copy(d)); /* out of the reader's chunks: the run keeps it */
  } else {
    char *k = id_key("resp", c->prev_id); /* answered here: what it restored is in memory */
    int here = k && lg__gw_key_names(c->cx->gw, k, r);
    lg__free(k);
    if (!here && (d = kept_data(c, "rs", c->prev_id)) && json_is_array(d)) c->prev_answers = json_incref(d);
  }
  json_decref(d);
}

/* Responses: an id for an answer the gateway makes itself, "resp_lg..."
 * (OpenAI's ids are "resp_" and hex digits), into buf. */
void lg__gwc_own_id(chat_t *c, char *buf, size_t size) {
  static _Atomic unsigned seq;
  snprintf(buf, size, "resp_lg%lld%04d%u", (long long)now_ms(c->cx),
           (int)(lg__hash_str(c->r->id) % 10000), atomic_fetch_add(&seq, 1) % 1000);
}

/* Responses: the answer `id` was made by the gateway (text: what it says,
 * or NULL). No upstream has it, so a request that continues from it
 * (previous_response_id) is sent as continuing from where this request
 * did (its previous upstream response, or none), with this request's
 * input and the answer said again before its own input. */
void lg__gwc_own_response(chat_t *c, const char *id, const char *text) {
  lg__gw_run_t *r = c->r;
  if (!is_responses(c) || !id || !r) return;
  json_t *own = own_prev(c);
  const char *prev = c->reask_prev ? c->reask_prev : own ? sget(own, "prev") : c->prev_id;
  json_t *items = build_messages(c); /* with the steer said with this request, if any */
  if (!items) return;
  if (c->steer_once) c->steer_sent = 1; /* a request continuing from it has it there */
  if (text && *text)
    json_array_append_new(items, json_pack("{s:s, s:s, s:[{s:s, s:s}]}", "type", "message", "role",
                                           "assistant", "content", "type", "output_text", "text", text));
  json_t *e = json_pack("{s:s?, s:o}", "prev", prev, "items", json_deep_copy(items)); /* as restore() */
  json_decref(items);
  if (!e) return;
  char *k = id_key("own", id); /* a replica's next request may continue from it */
  if (k) lg__gw_data_put(c->cx, r, k, e);
  lg__free(k);
  own_keep(r, id, e);
}

/* The client's stream starts (the HTTP side answers 200, text/event-stream). */
void lg__gwc_begin_stream(chat_t *c) {
  if (c->streamed) return;
  lg__gw_stream_start(c->j, 200, "text/event-stream");
  c->streamed = 1;
}

/* A JSON object as the whole (non-stream) answer, 200. */
void lg__gwc_answer_body(chat_t *c, json_t *o) {
  lg__gw_job_t *j = c->j;
  char *t = o ? lg__json_text(o, NULL) : NULL;
  j->status = 200;
  snprintf(j->ctype, sizeof j->ctype, "application/json");
  j->out.len = 0;
  if (t) lg__buf_puts(&j->out, t);
  lg__free(t);
  lg__gw_answer(j);
}






static void final_round(chat_t *c);

/* gateway.final_round: for a loop that stopped on this request (not a cap,
 * a budget, an operator or the model's own way out, and not a text loop,
 * whose answer would be more of the same). */
static int final_round_due(const chat_t *c) {
  if (!c->r->policy || !c->r->policy->gw_final_round || c->final_round) return 0;
  switch (c->stop_reason) {
  case LG_R_SAME_CALL_REPEAT:
  case LG_R_SHORT_CYCLE:
  case LG_R_NO_PROGRESS:
  case LG_R_FAILURE_STREAK:
  case LG_R_BLOCK_STREAK:
  case LG_R_CONTEXT_LOOP: return 1;
  default: return 0;
  }
}

/* The stop as a normal final assistant message. */
static void answer_final(chat_t *c, json_t *resp) {
  if (final_round_due(c)) final_round(c);
  const char *text = c->stop_text ? c->stop_text : "I stopped.";
  lg__free(c->r->final_text);
  c->r->final_text = lg__strdup(text);
  raise_action(c->j, "stop", c->j->reason[0] ? c->j->reason : NULL);
  const char *model = resp && sget(resp, "model") ? sget(resp, "model") : c->model ? c->model : "";
  if (is_anthropic(c)) lg__gwm_final(c, text, model);
  else if (is_responses(c)) lg__gwr_final(c, text, model);
  else if (c->stream) lg__gwo_final_stream(c, text, model);
  else lg__gwo_final_plain(c, text, model, resp);
}

/* ---- one model call ---- */

typedef struct model_out {
  int stop;                   /* the model call was refused: stop */
  int error;                  /* an error was answered */
  int64_t reservation;
  int64_t worst_nusd;         /* the worst case it was let through on (-1: unpriced) */
  int64_t input_tokens;       /*   its input tokens, */
  int64_t max_tokens;         /*   its output tokens (-1: unbounded) */
} model_out_t;

/* A model event the step did not decide, or a shared budget refused:
 * the error in the API's shape. */
static void model_error(chat_t *c, int rc, const lg__step_t *st, const lg_error_t *e) {
  if (!rc) { /* a limit of the run's own scopes (the run stopped): an error all the same,
               * as gateway-v1 answers a shared budget (keys.c: metadata) */
    lg__gw_keys_refusal(c->cx, c->j, &st->refusal, NULL);
  } else if (st->fail == LG__STEP_UNPRICED) {
    lg__gw_error(c->j, 400, "invalid_request_error", "model_not_priced",
                 "loopguard: this model call cannot be priced, and the run has a cost cap or "
                 "budget: %s",
                 e->message);
  } else if (st->fail == LG__STEP_REFUSED) { /* the key's limit, an in-flight cap: the run as
                                                 it was (keys.c: metadata, Retry-After) */
    lg__gw_keys_refusal(c->cx, c->j, &st->refusal, NULL);
  } else {
    lg__gw_failed(c->j, NULL, "decide on this model call", e, rc);
  }
}

/* What a model decision says this call is given: the hidden tool, the
 * offered tools and the escalation (cascade), and where it goes. */
static void model_cascade(chat_t *c, json_t *a) {
  lg__gw_run_t *r = c->r;
  json_t *ht = json_object_get(a, "hide_tools");
  lg__free(r->hide_tool);
  r->hide_tool = json_array_size(ht) ? lg__strdup(json_string_value(json_array_get(ht, 0))) : NULL;
  r->hide_left = r->hide_tool ? 1 : 0;
  r->offer = 0;
  json_t *of = json_object_get(a, "offer");
  for (size_t i = 0; i < json_array_size(of); i++)
    for (size_t k = 0; k < LG__ARRAY_LEN(offered); k++)
      if (json_is_string(json_array_get(of, i)) &&
          !strcmp(json_string_value(json_array_get(of, i)), offered[k].name))
        r->offer |= offered[k].bit;
  const char *esc = sget(a, "escalate_model");
  lg__free(c->esc_model);
  lg__free(c->esc_asked);
  c->esc_model = esc ? lg__strdup(esc) : NULL;
  c->esc_asked = esc ? lg__strdup(esc) : NULL;
  r->esc_left = esc ? (int)json_integer_value(json_object_get(a, "escalate_turns")) - 1 : 0;
  /* the escalated model is routed as a client's model would be */
  c->ui = c->base_ui;
  c->model = c->base_model;
  if (c->esc_model) {
    const char *sent = NULL;
    c->ui = lg__gw_config_pick(lg__gw_cfg(c->cx->gw), c->esc_model, c->j->route, &sent);
    if (sent && sent != c->esc_model) { /* a prefix stripped */
      char *t = lg__strdup(sent);
      lg__free(c->esc_model);
      c->esc_model = t;
    }
  }
  c->j->upstream = c->ui;
}

/* Attachments of the conversation (an image or a file, by URL, by id or
 * inline): the members that carry one, "image_url" (Chat Completions,
 * Responses), "file_id", "file_url", "file_data" (files; Responses'
 * images by id) and "source" (Anthropic's images and documents), as keys
 * of the messages (a quote inside a string is escaped, so a tool's
 * arguments or a result's text never count). Counted from the bytes: a
 * key a message repeats counts twice, which only raises the bound. */
static int64_t attachments(const chat_t *c) {
#define KEY(k) {k, sizeof k - 1}
  static const struct {
    const char *s;
    size_t n;
  } keys[] = {KEY("image_url"), KEY("file_id"), KEY("file_url"), KEY("file_data"), KEY("source")};
#undef KEY
  const lg__json_lazy_t *lz = &c->lazy;
  if (!lz->n || !lz->text) return 0;
  const struct lg__json_span *last = &lz->span[lz->n - 1];
  const char *p = lz->text + lz->at, *end = lz->text + last->off + last->len;
  int64_t n = 0;
  while (p < end && (p = memchr(p, '"', (size_t)(end - p)))) {
    p++;
    for (size_t k = 0; k < LG__ARRAY_LEN(keys); k++) {
      size_t kl = keys[k].n;
      if ((size_t)(end - p) <= kl || memcmp(p, keys[k].s, kl) || p[kl] != '"') continue;
      size_t at = lg__json_ws_end(p, kl + 1, (size_t)(end - p));
      if (at < (size_t)(end - p) && p[at] == ':') n++;
      break;
    }
  }
  return n;
}

/* The bytes of the attachments given inline in JSON value v: a data URL
 * (an image_url's, as a string or its object's url, a file_data) and the
 * data of a base64 source (Anthropic's images and documents). Each is an
 * attachment that attachments() counts (by its image_url, file_data or
 * source key); a data URL anywhere else (in a tool's text) is text, and
 * not counted here. */
static int64_t inline_bytes(const json_t *v) {
  int64_t n = 0;
  if (json_is_array(v))
    for (size_t i = 0; i < json_array_size(v); i++) n += inline_bytes(json_array_get(v, i));
  if (!json_is_object(v)) return n;
  const char *ty = sget(v, "type"), *k;
  json_t *x;
  if (ty && !strcmp(ty, "base64") && json_is_string(json_object_get(v, "data")))
    n += (int64_t)json_string_length(json_object_get(v, "data"));
  json_object_foreach((json_t *)v, k, x) {
    json_t *s = !strcmp(k, "image_url") && json_is_object(x) ? json_object_get(x, "url") : x;
    const char *t = json_string_value(s);
    if ((!strcmp(k, "image_url") || !strcmp(k, "file_data")) && t && !strncmp(t, "data:", 5))
      n += (int64_t)json_string_length(s);
    else if (json_is_object(x) || json_is_array(x))
      n += inline_bytes(x);
  }
  return n;
}

/* The bytes of the client's attachments given inline (inline_bytes of
 * each message), or 0 when a message cannot be built (out of memory:
 * nothing taken off the bound). */
static int64_t inlined(chat_t *c) {
  int64_t n = 0;
  for (size_t i = 0; i < c->n; i++) {
    json_t *m = client_msg(c, i);
    if (!m) return 0;
    n += inline_bytes(m);
  }
  return n;
}

/* The input a model call to `model` is billed at most, in tokens:
 * - its body's bytes (a token is at least one byte);
 * - each attachment at the price table's attachment_tokens for the model,
 *   when it has one (an image by URL is a few bytes and a thousand
 *   tokens; none: counted by its bytes alone, as before session 30), in
 *   place of its bytes when it is given inline (a screenshot's base64 is
 *   hundreds of kilobytes and the same thousand tokens: counted by its
 *   bytes, a computer-use agent's worst case was most of a million
 *   tokens, which a run's cost cap or a key's limit refused; until
 *   session 43);
 * - for a Responses request that continues a conversation the upstream
 *   stores (previous_response_id, conversation, a re-ask continuing the
 *   answer just made), what that conversation holds: the upstream bills
 *   it as input again. Known for the answers a gateway of the store
 *   relayed on the run (their usage: the most of them; the run's memory,
 *   mem_fetch); one none saw (made directly, on memory: before a restart
 *   or an eviction) counts as nothing, as before session 30. */
static int64_t input_bound(chat_t *c, const lg_prices_t *pr, const char *model, size_t body_len) {
  int64_t n = (int64_t)body_len;
  lg_price_t price;
  if (model && !lg_prices_lookup(pr, model, &price, NULL) && price.attachment_tokens > 0) {
    if (c->attached < 0) c->attached = attachments(c); /* the client's messages: once a request */
    if (c->inlined < 0) c->inlined = c->attached ? inlined(c) : 0;
    int64_t most = INT64_MAX / 4 / price.attachment_tokens; /* beyond any price: refused */
    n += (c->attached < most ? c->attached : most) * price.attachment_tokens;
    /* their bytes were counted in the body's, unless the body does not
     * hold the client's messages (a Responses re-ask continuing the
     * answer just made: the stored conversation's tokens count them) */
    if (c->inlined <= n && !(is_responses(c) && c->reask_prev)) n -= c->inlined;
  }
  if (is_responses(c) && (c->prev_id || c->conv_id || c->reask_prev) && c->r->stored_tokens > 0 &&
      c->r->stored_tokens <= INT64_MAX / 2)
    n += c->r->stored_tokens;
  return n;
}

/* The model call as a model event, before it is made: its worst case is
 * input_bound's input plus the client's max tokens, priced as the model
 * it goes to. */
static model_out_t model_event(chat_t *c, size_t body_len) {
  model_out_t mo = {0};
  json_t *mt = lg__gw_output_bound(c->root, NULL);
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_MODEL;
  ev.u.model.m.model = c->r->esc_left > 0 && c->r->esc_model ? c->r->esc_model : c->base_model;
  /* its turn: the stored run's (lg__step_t.model_turn) */
  lg_prices_t *pr = lg_price_book_get(c->cx->srv->prices);
  ev.u.model.m.input_tokens = input_bound(c, pr, ev.u.model.m.model, body_len);
  int64_t mx = json_is_integer(mt) ? json_integer_value(mt) : -1, n = lg__gw_choices(c->j, c->root);
  if (n > 1 && mx < 0) mx = lg__gw_output_cap(pr, ev.u.model.m.model, (int64_t)body_len);
  if (n > 1 && mx >= 0) mx = lg__gw_times(mx, n); /* every answer that long */
  ev.u.model.m.max_tokens = mx;
  ev.u.model.m.output_tokens = -1;
  ev.u.model.m.cost_nusd = -1;
  lg__step_t st;
  lg__step_init(&st, &ev, now_ms(c->cx));
  st.prices = pr;
  st.ttl_ms = lg__gw_keys_ttl(c->cx, c->ui); /* --reservation-ttl (keys.c) */
  st.scopes = (const char *const *)c->j->key_scopes; /* a key's (keys.c) */
  st.nscopes = c->j->nkey_scopes;
  lg_error_t e = {0};
  int rc = flush_results_then(c, &st, &e); /* with the request's results */
  json_t *a = rc ? NULL : answer_json(&st);
  if (rc || st.budget_refused) {
    mo.error = 1;
    model_error(c, rc, &st, &e);
  } else if (st.action == LG_ACT_STOP) {
    mo.stop = 1;
    note_stop(c, &st, a, "I stopped: the run reached a limit.", NULL, NULL);
  } else {
    const char *rid = a ? sget(a, "reservation_id") : NULL;
    mo.reservation = rid ? strtoll(rid, NULL, 10) : 0;
    mo.worst_nusd = st.ev.u.model.m.cost_nusd; /* the gate's worst case (gate.c) */
    mo.input_tokens = ev.u.model.m.input_tokens;
    mo.max_tokens = mx;
    c->r->model_calls++;
    model_cascade(c, a);
  }
  json_decref(a);
  lg_prices_free(pr);
  lg__step_clear(&st);
  return mo;
}

/* What a model call's usage is made of. */
enum usage_from {
  USAGE_ANSWER, /* the answer's usage (NULL: the input's bytes, no output) */
  USAGE_NONE,   /* the provider answered an error or nothing: nothing charged */
  USAGE_LOST    /* a whole answer the upstream lost after its 200 (the
                   connection broke, a timeout, past the answer's bound): a
                   provider bills the answer it generated, whose size is
                   not known here, so the call is charged the worst case it
                   was let through on (until session 30: nothing) */
};

static void usage_event(chat_t *c, const model_out_t *mo, json_t *usage, enum usage_from from,
                        size_t body_len) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_USAGE;
  ev.u.usage.reservation = mo->reservation;
  json_t *pt = json_object_get(usage, "prompt_tokens"), *ct = json_object_get(usage, "completion_tokens");
  if (!pt) pt = json_object_get(usage, "input_tokens");
  if (!ct) ct = json_object_get(usage, "output_tokens");
  if (from == USAGE_NONE) {
    ev.u.usage.cost_nusd = 0;
  } else if (from == USAGE_LOST) {
    ev.u.usage.input_tokens = mo->input_tokens;
    ev.u.usage.output_tokens = mo->max_tokens > 0 ? mo->max_tokens : 0;
    ev.u.usage.cost_nusd = mo->worst_nusd;
  } else {
    ev.u.usage.input_tokens = json_is_integer(pt) ? json_integer_value(pt) : (int64_t)body_len;
    /* Anthropic counts the input read from and written to its prompt
     * cache apart from input_tokens: input all the same, counted and
     * priced as input (OpenAI's count holds its cached tokens) */
    static const char *const cache_keys[2] = {"cache_creation_input_tokens", "cache_read_input_tokens"};
    for (int i = 0; i < 2 && json_is_integer(pt); i++) {
      json_int_t v = json_integer_value(json_object_get(usage, cache_keys[i]));
      if (v > 0 && ev.u.usage.input_tokens >= 0 && ev.u.usage.input_tokens <= INT64_MAX - v)
        ev.u.usage.input_tokens += v;
    }
    ev.u.usage.output_tokens = json_is_integer(ct) ? json_integer_value(ct) : 0;
    if (is_responses(c) && ev.u.usage.input_tokens >= 0 && ev.u.usage.output_tokens >= 0 &&
        ev.u.usage.input_tokens <= INT64_MAX / 4 && ev.u.usage.output_tokens <= INT64_MAX / 4 &&
        ev.u.usage.input_tokens + ev.u.usage.output_tokens > c->r->stored_tokens) {
      c->r->stored_tokens = ev.u.usage.input_tokens + ev.u.usage.output_tokens; /* input_bound */
      /* a replica's next request continuing it counts it too (a response
       * the upstream does not store is continued by none) */
      if (c->conv_id || !json_is_false(json_object_get(c->root, "store"))) mem_sync(c);
    }
    /* usage.cost when the upstream reports one (USD; charged at most the
     * reservation), else from the price table, else the worst case */
    ev.u.usage.cost_nusd = lg__gw_keys_usage_cost(usage);
  }
  /* The step settles the request's reservation: an answer the upstream
   * completed must be charged. It is decided with the step after it (the
   * answer's text or calls), or alone (settle_usage) when none comes. */
  settle_usage(c);
  c->use_ev = ev;
  lg__step_init(&c->use, &ev, now_ms(c->cx));
  c->use.prices = lg_price_book_get(c->cx->srv->prices);
  c->use.usage_measured = 1; /* the provider's count (or the gateway's bound when it sent none) */
  c->use_pending = 1;
}

/* ---- deciding a response's tool calls ---- */

typedef struct calls_out {
  json_t *kept;               /* the calls the client may run */
  int refused;                /* calls taken out */
  int stop;
  json_t *rest_calls;         /* the refused calls, and their answers */
  json_t *rest_results;
} calls_out_t;

/* A tool call of the API's shape: its name, arguments (JSON text; *owned
 * when made here) and id. */
typedef struct call_parts {
  const char *name, *args, *id;
  char *owned;
} call_parts_t;

/* A custom tool's call (Responses' custom_tool_call item, Chat
 * Completions' tool call of type "custom"): its input is free text, not
 * JSON, and its arguments are the object {"input": that text}, so that
 * the same input is the same call. No input: NULL (as a call without
 * arguments). */
static char *custom_args(json_t *input) {
  if (!json_is_string(input)) return NULL;
  json_t *o = json_pack("{s:O}", "input", input);
  char *t = o ? lg__json_text(o, NULL) : NULL;
  json_decref(o);
  return t;
}

static call_parts_t call_parts(const chat_t *c, json_t *tc) {
  call_parts_t p = {NULL, NULL, NULL, NULL};
  const char *ty = sget(tc, "type");
  if (is_responses(c)) { /* a call item: a function's, a custom tool's, a built-in's */
    const lg__gwr_kind_t *k = lg__gwr_kind(ty);
    json_t *a = k ? json_object_get(tc, k->args) : NULL;
    p.name = k && k->tool ? k->tool : sget(tc, "name");
    p.args = !k                               ? NULL
             : k->form == LG__ARGS_JSON_TEXT  ? sget(tc, k->args)
             : k->form == LG__ARGS_FREE_TEXT  ? (p.owned = custom_args(a))
             : json_is_object(a)              ? (p.owned = lg__json_text(a, NULL))
                                              : NULL;
    p.id = sget(tc, "call_id");
  } else if (ty && !strcmp(ty, "custom")) { /* Chat Completions: a custom tool's call */
    json_t *cu = json_object_get(tc, "custom");
    p.name = sget(cu, "name");
    p.args = p.owned = custom_args(json_object_get(cu, "input"));
    p.id = sget(tc, "id");
  } else if (is_anthropic(c)) { /* a tool_use block */
    p.name = sget(tc, "name");
    json_t *in = json_object_get(tc, "input");
    p.args = p.owned = json_is_object(in) ? lg__json_text(in, NULL) : NULL;
    if (!p.args) p.args = sget(tc, "_args"); /* a stream's, as its deltas came */
    p.id = sget(tc, "id");
  } else {
    json_t *fn = json_object_get(tc, "function");
    p.name = sget(fn, "name");
    p.args = sget(fn, "arguments");
    p.id = sget(tc, "id");
  }
  return p;
}

/* The answer the upstream gets for refused call tc, in the API's shape. */
static json_t *refusal_result(chat_t *c, json_t *tc, const char *id, const char *text, int is_error) {
  if (is_responses(c)) return output_for(c, tc, id, text);
  if (is_anthropic(c))
    return json_pack("{s:s, s:s, s:s, s:b}", "type", "tool_result", "tool_use_id", id ? id : "",
                     "content", text, "is_error", is_error);
  return tool_msg(id, text);
}

/* A block or replay: the call taken out, its answer kept for the upstream. */
static void refuse_call(chat_t *c, calls_out_t *co, json_t *tc, const call_parts_t *p, json_t *a,
                        int replay) {
  const char *reason = a ? sget(a, "reason") : NULL, *msg = a ? sget(a, "message") : NULL;
  co->refused++;
  json_array_append(co->rest_calls, tc);
  char *text = NULL;
  if (replay) {
    json_t *sr = json_object_get(a, "saved_result");
    text = json_is_string(sr) ? lg__strdup(json_string_value(sr)) : lg__json_text(sr, NULL);
  } else {
    lg__buf_t b = {0};
    lg__buf_printf(&b, "Error: loopguard did not run this call (%s). %s", reason ? reason : "blocked",
                   msg ? msg : "");
    text = lg__buf_steal(&b, NULL);
  }
  json_array_append_new(co->rest_results, refusal_result(c, tc, p->id, text ? text : "", !replay));
  lg__free(text);
  /* cascade.escalate: the model calls it lasts, for pricing them */
  const char *esc = sget(a, "escalate_model");
  if (esc) {
    lg__free(c->r->esc_model);
    c->r->esc_model = lg__strdup(esc);
    c->r->esc_left = (int)json_integer_value(json_object_get(a, "escalate_turns"));
  }
  raise_action(c->j, replay ? "replay" : "block", reason);
  lg__gw_note_intervention(c->cx, c->r->id, replay ? "replay" : "block", reason, p->name, p->id);
}

/* A call of an offered tool (cascade.offer) ended the run: the client's
 * final message is the model's question (ask_human) or its partial
 * answer (finalize_partial), when it gave one. */
static void offered_stop_text(chat_t *c, const call_parts_t *p, lg_reason_t reason) {
  const char *field = reason == LG_R_HUMAN_REQUIRED && !strcmp(p->name, "ask_human") ? "question"
                      : reason == LG_R_COMPLETE && !strcmp(p->name, "finalize_partial") ? "answer"
                                                                                       : NULL;
  if (!field || !p->args) return;
  lg__json_begin();
  json_t *o = json_loads(p->args, 0, NULL);
  if (lg__json_oom()) {
    json_decref(o);
    return;
  }
  const char *t = sget(o, field);
  if (t && *t) {
    lg__free(c->stop_text);
    c->stop_text = lg__strdup(t);
  }
  json_decref(o);
}

/* A call's event: the step's view of the parts p. */
static lg_event_t call_event(const chat_t *c, const call_parts_t *p) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_CALL;
  ev.u.call.tool = p->name ? p->name : "";
  ev.u.call.args = p->args && *p->args ? p->args : "{}";
  ev.u.call.args_len = strlen(ev.u.call.args);
  /* its turn: the stored run's (lg__step_t.model_turn) */
  ev.u.call.call_id = p->id;
  ev.u.call.agent = c->j->hdr_agent;
  return ev;
}

/* What a call's step (rc: its answer, -1 when the call has no name) means
 * for the client. */
static void call_outcome(chat_t *c, calls_out_t *co, json_t *tc, const call_parts_t *p, int rc,
                         const lg__step_t *st) {
  json_t *a = rc ? NULL : answer_json(st);
  const char *reason = a ? sget(a, "reason") : NULL, *msg = a ? sget(a, "message") : NULL;
  if (rc || st->action == LG_ACT_EXECUTE) { /* undecidable (malformed): the client's to see */
    json_array_append(co->kept, tc);
    if (!rc && msg && p->id) {
      json_object_set_new(c->r->steer, p->id, json_string(msg));
      raise_action(c->j, "observe", "same_call_repeat");
      lg__gw_note_intervention(c->cx, c->r->id, "observe", reason, p->name, p->id);
    } else {
      raise_action(c->j, "execute", NULL);
    }
  } else if (st->action == LG_ACT_BLOCK || st->action == LG_ACT_REPLAY) {
    refuse_call(c, co, tc, p, a, st->action == LG_ACT_REPLAY);
  } else { /* stop */
    co->stop = 1;
    if (st->stopped_now) offered_stop_text(c, p, st->reason);
    note_stop(c, st, a, "I stopped: the loop guard ended this run.", p->name, p->id);
  }
  json_decref(a);
}

/* The reasoning members of a Chat Completions answer, as they go back in
 * its assistant message: reasoning_content, reasoning (strings) and
 * reasoning_details (an array). */
static const char *const chat_reasoning_keys[3] = {"reasoning_content", "reasoning", "reasoning_details"};

/* c->reasoning, what of the answer goes back with a call restored from it:
 * of msg, the whole answer's message, or with msg NULL of the stream just
 * read (whose Messages thinking blocks were kept as they came, and Chat
 * Completions reasoning in c->think and c->details). Read only when a
 * call is restored, not for every answer. */
static void answer_reasoning(chat_t *c, json_t *msg) {
  if (!msg && is_anthropic(c)) return;
  json_decref(c->reasoning);
  if (is_anthropic(c)) {
    c->reasoning = lg__gwm_thinking(msg);
  } else if (is_responses(c)) {
    c->reasoning = lg__gwc_items_of_type(msg ? msg : c->r_done, "output", is_reasoning);
  } else {
    c->reasoning = json_object();
    for (int i = 0; i < 3; i++) {
      json_t *v = NULL;
      if (msg) {
        v = json_incref(json_object_get(msg, chat_reasoning_keys[i]));
      } else if (i < 2) {
        if (c->think[i].len && !c->think[i].oom) v = json_stringn(c->think[i].data, c->think[i].len);
      } else if (json_array_size(c->details)) {
        v = json_incref(lg__gwo_details(c));
      }
      if (i < 2 ? json_is_string(v) : json_is_array(v)) json_object_set(c->reasoning, chat_reasoning_keys[i], v);
      json_decref(v);
    }
  }
}

/* The refused calls as items of the upstream's conversation (new): an
 * assistant turn with the calls (and the response's text, when no call
 * is left for the client to carry it), then their answers; with what the
 * provider binds to them of the answer msg (NULL: the stream just read). */
static json_t *restored_items(chat_t *c, calls_out_t *co, const char *content, json_t *msg) {
  answer_reasoning(c, msg);
  json_t *items = json_array();
  int with_text = !json_array_size(co->kept) && content && *content;
  if (is_responses(c)) {
    /* no call left for the client: the answer's reasoning items go first,
     * as the provider made them (it binds its calls to them), then its
     * message items (what the model said beside the calls, as Chat's and
     * Messages' restored turns hold it; until session 41 it was left out);
     * with calls left, the client has those items, before which the
     * restored calls go: without their ids, they are bound to nothing */
    if (!json_array_size(co->kept)) json_array_extend(items, c->reasoning);
    if (with_text) {
      json_t *said = lg__gwc_items_of_type(msg ? msg : c->r_done, "output", is_message);
      json_array_extend(items, said);
      json_decref(said);
    }
    for (size_t i = 0; i < json_array_size(co->rest_calls); i++) {
      json_t *fc = json_array_get(co->rest_calls, i);
      if (json_array_size(co->kept) && json_object_get(fc, "id")) {
        fc = json_copy(fc);
        json_object_del(fc, "id");
        json_array_append_new(items, fc);
      } else {
        json_array_append(items, fc);
      }
    }
    json_array_extend(items, co->rest_results);
  } else if (is_anthropic(c)) {
    json_t *blocks = json_array();
    /* no call left for the client: this turn is the answer's, and its
     * thinking goes first (a provider with thinking on refuses the last
     * tool use's assistant turn without it) */
    if (!json_array_size(co->kept)) json_array_extend(blocks, c->reasoning);
    if (with_text) json_array_append_new(blocks, json_pack("{s:s, s:s}", "type", "text", "text", content));
    for (size_t i = 0; i < json_array_size(co->rest_calls); i++) {
      json_t *tu = json_deep_copy(json_array_get(co->rest_calls, i));
      if (json_object_get(tu, "_args")) { /* a stream's: its input parsed */
        lg__json_begin();
        json_t *in = json_loads(sget(tu, "_args"), 0, NULL);
        json_object_set_new(tu, "input", json_is_object(in) ? in : json_object());
        if (!json_is_object(in)) json_decref(in);
        json_object_del(tu, "_args");
      }
      json_array_append_new(blocks, tu);
    }
    json_array_append_new(items, json_pack("{s:s, s:o}", "role", "assistant", "content", blocks));
    json_array_append_new(items, json_pack("{s:s, s:O}", "role", "user", "content", co->rest_results));
  } else {
    /* the answer's reasoning (DeepSeek's and Moonshot's reasoning_content,
     * OpenRouter's reasoning_details): with thinking on, a provider
     * refuses an assistant message with tool calls without it, whether or
     * not the client got calls of that answer */
    json_t *m = json_pack("{s:s, s:o, s:O}", "role", "assistant", "content",
                          with_text ? json_string(content) : json_null(), "tool_calls", co->rest_calls);
    json_object_update(m, c->reasoning);
    json_array_append_new(items, m);
    json_array_extend(items, co->rest_results);
  }
  return items;
}

/* The answers of a conversation's refused calls that its upstream has
 * not had yet (conv_pending), written to the store for the next request,
 * on whichever replica it comes. */
static void conv_pending_put(chat_t *c) {
  char *k = id_key("answers:conv", c->conv_id);
  if (k) lg__gw_data_put(c->cx, c->r, k, c->conv_pending);
  lg__free(k);
}

/* Keeps items for every later request of the run. The client sees the
 * kept calls as this response; the refused ones go before it, so the
 * anchor is the end of the client's messages. lost: the items are a
 * conversation's request that its upstream did not keep (conv_lost). */
static void restore(chat_t *c, json_t *items, int lost) {
  lg__gw_run_t *r = c->r;
  if (r->nrs == r->caprs) {
    size_t cap = r->caprs ? r->caprs * 2 : 4;
    lg__gw_restore_t *v = lg__realloc(r->rs, cap * sizeof *v);
    if (v) {
      r->rs = v;
      r->caprs = cap;
    }
  }
  /* a copy of its own: the items hold parts of the request and the answer,
   * whose chunks (lg__json_region_begin) must not stay for the run's life */
  json_t *kept = r->nrs < r->caprs ? json_deep_copy(items) : NULL;
  json_decref(items);
  if (!kept) return;
  r->rs[r->nrs].anchor = c->n;
  r->rs[r->nrs].items = kept;
  r->rs[r->nrs].resp_id = c->cur_resp_id ? lg__strdup(c->cur_resp_id) : NULL;
  r->rs[r->nrs].conv_sent = 0;
  r->rs[r->nrs].lost = lost;
  r->nrs++;
  if (c->conv_pending) { /* a conversation's: answered once, by whichever replica is next */
    conv_again(c->conv_pending, &r->rs[r->nrs - 1]);
    conv_pending_put(c);
    return;
  }
  /* A Responses client continuing from this response (previous_response_id)
   * on another replica: the upstream holds the refused calls unanswered,
   * and that replica sends their answers from the store (prev_fetch). */
  const char *rid = r->rs[r->nrs - 1].resp_id;
  if (!is_responses(c) || c->conv_id || !rid) return;
  json_t *all = json_array();
  for (size_t q = 0; all && q < r->nrs; q++)
    if (r->rs[q].resp_id && !strcmp(r->rs[q].resp_id, rid)) json_array_extend(all, r->rs[q].items);
  char *k = id_key("rs", rid);
  if (all && k) lg__gw_data_put(c->cx, r, k, all);
  lg__free(k);
  json_decref(all);
}

/* Calls of an answer in a conversation that nothing will answer (the run
 * stopped on them, or on the answer's text): the upstream's conversation
 * holds them, so the next request answers them with the stop's message. */
static void conv_unanswered(chat_t *c, json_t *tcs) {
  if (!c->conv_id || !json_array_size(tcs)) return;
  json_t *items = json_array();
  const char *why = c->stop_text ? c->stop_text : "The loop guard stopped this run; the call was not made.";
  for (size_t i = 0; i < json_array_size(tcs); i++) {
    json_t *tc = json_array_get(tcs, i);
    const char *id = sget(tc, "call_id");
    if (id) json_array_append_new(items, output_for(c, tc, id, why));
  }
  restore(c, items, 0);
}

/* A conversation's upstream answered: the answers build_messages gave it
 * are in its conversation now (those restored from this answer, not yet),
 * and so is a text loop's steer said once (text_steer_place). */
static void conv_delivered(chat_t *c) {
  if (c->steer_once) c->steer_sent = 1;
  for (size_t q = 0; c->conv_id && q < c->r->nrs; q++) c->r->rs[q].conv_sent = 1;
  mem_sync(c);
  if (json_array_size(c->conv_pending)) {
    json_array_clear(c->conv_pending);
    conv_pending_put(c);
  }
}

/* A conversation's request whose stream the gateway cut (a text loop):
 * the upstream keeps nothing of a stream its client left (OpenAI's
 * Conversations API: not its input, not its answer), but the client was
 * given a whole answer and goes on as if it did. So what it sent there
 * (its tool outputs, a person's message) is sent again, first in the next
 * request, as a refused call's answer is (restore), and the answers
 * restored with this request stay unsent (conv_delivered was not called):
 * else the calls they answer stay unanswered in the conversation, and the
 * upstream refuses every later request of it; and the person's words are
 * gone from what the model reads. A re-ask sent none of the client's. */
static void conv_lost(chat_t *c) {
  if (!c->conv_id || c->reask_prev) return;
  json_t *items = json_array();
  for (size_t i = 0; items && i < c->n; i++) json_array_append_new(items, client_message(c, i));
  if (json_array_size(items)) restore(c, items, 1);
  else json_decref(items);
}

/* Gemini's OpenAI-compatible API signs an answer's first call (its
 * extra_content.google.thought_signature) and refuses a step of the
 * current turn whose first call carries none. An answer the guard splits
 * (calls kept for the client, refused ones restored) is two steps: the
 * one whose first call lost the answer's signature gets the value Google
 * documents for calls it did not make, skip_thought_signature_validator.
 * Nothing changes for an answer with no signature (any other provider). */
static json_t *thought_signature(json_t *tc) {
  return json_object_get(json_object_get(json_object_get(tc, "extra_content"), "google"), "thought_signature");
}

static void sign_first(json_t *calls) {
  json_t *tc = json_array_get(calls, 0);
  if (!tc || json_is_string(thought_signature(tc))) return;
  json_t *cp = json_deep_copy(tc), *ec = json_object_get(cp, "extra_content"), *g;
  if (!cp) return; /* out of memory: the step goes unsigned, the provider says so */
  if (!json_is_object(ec)) json_object_set_new(cp, "extra_content", ec = json_object());
  g = json_object_get(ec, "google");
  if (!json_is_object(g)) json_object_set_new(ec, "google", g = json_object());
  json_object_set_new(g, "thought_signature", json_string("skip_thought_signature_validator"));
  json_array_set_new(calls, 0, cp);
}

static void sign_split(const chat_t *c, json_t *tcs, calls_out_t *co) {
  if (is_responses(c) || is_anthropic(c) || !co->refused || !json_array_size(co->kept)) return;
  for (size_t i = 0; i < json_array_size(tcs); i++) {
    if (json_is_string(thought_signature(json_array_get(tcs, i)))) {
      sign_first(co->kept);
      sign_first(co->rest_calls);
      return;
    }
  }
}

/* Decides the calls `tcs` (array of tool call objects) of one response
 * with text `content` (may be NULL), the answer msg (NULL: the stream just
 * read). */
static calls_out_t decide_calls(chat_t *c, json_t *tcs, const char *content, json_t *msg) {
  calls_out_t co = {json_array(), 0, 0, json_array(), json_array()};
  size_t n = json_array_size(tcs), m = 0;
  call_parts_t *p = lg__calloc(n ? n : 1, sizeof *p);
  lg_event_t *ev = lg__calloc(n ? n : 1, sizeof *ev);
  lg__step_t *st = lg__calloc(n ? n : 1, sizeof *st);
  int *rc = lg__calloc(n ? n : 1, sizeof *rc);
  size_t *at = lg__calloc(n ? n : 1, sizeof *at);
  if (!p || !ev || !st || !rc || !at) { /* out of memory: undecided, the client's to see */
    for (size_t i = 0; i < n; i++) json_array_append(co.kept, json_array_get(tcs, i));
    n = 0;
  }
  /* the calls with a name, in one transaction with the usage before them */
  for (size_t i = 0; i < n; i++) {
    p[i] = call_parts(c, json_array_get(tcs, i));
    if (!p[i].name) continue;
    ev[m] = call_event(c, &p[i]);
    lg__step_init(&st[m], &ev[m], now_ms(c->cx));
    at[i] = ++m;
  }
  if (m) decide_steps(c, st, ev, m, rc);
  /* in order, up to a stop (the calls after it got the stop again) */
  for (size_t i = 0; i < n && !co.stop; i++)
    call_outcome(c, &co, json_array_get(tcs, i), &p[i], at[i] ? rc[at[i] - 1] : -1,
                 at[i] ? &st[at[i] - 1] : NULL);
  for (size_t i = 0; i < m; i++) lg__step_clear(&st[i]);
  for (size_t i = 0; i < n; i++) lg__free(p[i].owned);
  lg__free(p);
  lg__free(ev);
  lg__free(st);
  lg__free(rc);
  lg__free(at);
  sign_split(c, tcs, &co);
  if (co.refused && !co.stop) restore(c, restored_items(c, &co, content, msg), 0);
  if (co.stop) conv_unanswered(c, tcs);
  mem_sync(c); /* before the client has the answer */
  json_decref(co.rest_calls);
  json_decref(co.rest_results);
  co.rest_calls = co.rest_results = NULL;
  return co;
}

/* ---- answers and what they hold ---- */

/* Answers the response resp (parsed) / raw (the bytes), changed or not. */
static void answer_json_obj(chat_t *c, json_t *resp, const lg__buf_t *raw, int changed) {
  lg__gw_job_t *j = c->j;
  j->status = 200;
  snprintf(j->ctype, sizeof j->ctype, "application/json");
  j->out.len = 0;
  if (!changed) {
    lg__buf_append(&j->out, raw->data, raw->len);
  } else {
    char *t = lg__json_text(resp, NULL);
    if (t) lg__buf_puts(&j->out, t);
    lg__free(t);
  }
  lg__gw_answer(j);
}

void lg__gwc_register_key(chat_t *c, json_t *msg) {
  int start = !c->j->hdr_run && first_assistant(c) < 0; /* the conversation's first answer */
  if (is_responses(c) && sget(msg, "id")) { /* previous_response_id finds the run */
    char *k = id_key("resp", sget(msg, "id"));
    if (k) lg__gw_key_put(c->cx, k, c->r);
    lg__free(k);
    /* A stateless client sends the output back as items: its first call
     * (else its first message) is what first_assistant finds in its next
     * request; or as references to them (item:ID), any of which may come
     * first: every answer's, so that a client that drops its history's
     * start still finds its run by the first reference it keeps. */
    json_t *items = json_object_get(msg, "output");
    json_t *first = NULL, *said = NULL;
    for (size_t i = 0; i < json_array_size(items); i++) {
      json_t *it = json_array_get(items, i);
      const char *ty = sget(it, "type"), *role = sget(it, "role");
      if (!first && lg__gwr_is_call(ty)) first = it;
      else if (!said && role && !strcmp(role, "assistant")) said = it;
      if (!c->j->hdr_run && sget(it, "id")) {
        k = id_key("item", sget(it, "id"));
        if (k) lg__gw_key_put(c->cx, k, c->r);
        lg__free(k);
      }
    }
    msg = first ? first : said;
  }
  if (!start || !msg) return;
  char *k = conv_key(c, c->n, msg);
  if (k) lg__gw_key_put(c->cx, k, c->r);
  lg__free(k);
}

/* The members of array obj[member] whose "type" is of the kind (new
 * array): an Anthropic message's tool_use blocks, a Responses output's
 * call items or reasoning items. */
json_t *lg__gwc_items_of_type(json_t *obj, const char *member, lg__gw_kind_fn kind) {
  json_t *out = json_array(), *items = json_object_get(obj, member);
  for (size_t i = 0; i < json_array_size(items); i++) {
    if (kind(sget(json_array_get(items, i), "type"))) json_array_append(out, json_array_get(items, i));
  }
  return out;
}

void lg__gwc_keep_only(json_t *obj, const char *member, lg__gw_kind_fn kind, json_t *kept) {
  json_t *items = json_object_get(obj, member), *out = json_array();
  for (size_t i = 0; i < json_array_size(items); i++) {
    json_t *it = json_array_get(items, i);
    int keep = !kind(sget(it, "type"));
    for (size_t k = 0; !keep && k < json_array_size(kept); k++) keep = json_array_get(kept, k) == it;
    if (keep) json_array_append(out, it);
  }
  json_object_set_new(obj, member, out);
}

/* ---- one model call, either way ---- */

static void end_api_stream(chat_t *c);
static void error_event(chat_t *c, const lg__buf_t *e);

/* The model call's body: its worst case decided first (the body with
 * nothing hidden, every offered tool and the longer model name, which the
 * body sent never exceeds), then the body as the decision says. NULL when
 * the call is not made (mo says why: an error, or a stop), answered.
 * *own: what the caller frees (body_text). */
static const char *prepare_call(chat_t *c, size_t *blen, model_out_t *mo, char **own) {
  memset(mo, 0, sizeof *mo);
  *own = NULL;
  c->estimate = 1;
  int raw = 0;
  char *first = NULL;
  const char *t = body_text(c, blen, &raw, &first);
  c->estimate = 0;
  if (t) {
    /* The body sent may be the client's bytes (larger than a dump of the
     * estimate when the client's JSON has white space), or, when the
     * decision hides a tool, a dump of the client's body (its reals
     * longer, tool use turned off): the worst case covers both. */
    size_t worst = *blen;
    if (worst < c->j->body_len) worst = c->j->body_len;
    if (c->r->policy->hide_turns > 0 && json_is_array(json_object_get(c->root, "tools")))
      worst += HIDE_SLACK + (raw ? 21 * c->body_reals : 0);
    *mo = model_event(c, worst);
    lg__free(first);
    int made = !mo->error && !mo->stop; /* counted, its worst case reserved */
    /* A call escalated to another model (cascade.escalate), or back from
     * one, goes where a key's checks did not look: its model allowed, its
     * own provider key the one for that upstream, never another's. */
    if (made && c->j->key && (c->esc_model || c->j->byok_for != c->ui + 1) &&
        lg__gw_keys_route(c->cx,
                          c->esc_model ? c->esc_asked : json_string_value(json_object_get(c->root, "model")),
                          c->esc_model ? c->esc_model : c->model, c->ui))
      mo->error = 1; /* answered (403, 500) */
    t = made && !mo->error ? body_text(c, blen, NULL, own) : NULL;
    if (made && !t) usage_event(c, mo, NULL, USAGE_NONE, worst); /* not sent: nothing charged or held */
  }
  if (!t && !mo->error && !mo->stop) {
    lg__gw_error(c->j, 500, "server_error", NULL, "out of memory");
    mo->error = 1;
  }
  if (t) return t;
  /* not made: the stop's final message, or the error; a re-ask refused
   * after the stream began (a key's limit, a workspace's, an in-flight cap,
   * a model not priced) ends it on that error as its API's error event,
   * never on the answer before, whose calls were refused (earlier builds
   * ended it there: Responses' response.completed listed the refused calls,
   * the others finished on tool_use / tool_calls without one) */
  if (mo->stop) answer_final(c, c->last_chunk);
  else if (!c->streamed) lg__gw_answer(c->j);
  else error_event(c, &c->j->out);
  return NULL;
}

/* The path a model call goes to under its upstream: the route's, as it
 * came, but for an escalation on an AzureOpenAI client's
 * /deployments/NAME/...: Azure's classic API answers with the
 * deployment its path names, whatever the body's model says, so the
 * escalation's model is the deployment asked for. */
static const char *call_path(chat_t *c) {
  const char *p = c->j->path, *rest = NULL;
  if (!c->j->azure || !c->esc_model || strncmp(p, "/deployments/", 13) || !(rest = strchr(p + 13, '/')))
    return p;
  lg__buf_t b = {0};
  lg__buf_puts(&b, "/deployments/");
  lg__gw_url_put(&b, c->esc_model, "-._~"); /* one segment: a '/' or '%' of its own encoded */
  lg__buf_puts(&b, rest);
  lg__free(c->esc_path);
  c->esc_path = lg__buf_steal(&b, NULL); /* NULL when out of memory: the path as it came */
  return c->esc_path ? c->esc_path : p;
}

/* The exchange of a model call (on_data: the stream's reader, or NULL). */
static int call_upstream(chat_t *c, lg__gw_http_t *x, const char *body, size_t len,
                         int (*on_data)(void *, const char *, size_t)) {
  lg__gw_job_t *j = c->j;
  memset(x, 0, sizeof *x);
  x->up = &lg__gw_cfg(c->cx->gw)->up[c->ui];
  x->method = "POST";
  x->path = call_path(c); /* the route's (an AzureOpenAI client's /deployments/NAME/...) */
  x->v1 = !j->azure;
  x->query = j->query;
  x->body = body;
  x->body_len = len;
  x->headers = j->fwd;
  x->client_auth = j->auth;
  x->provider_key = j->provider_key;
  x->stop = lg__gw_stopflag(c->cx->gw);
  x->on_data = on_data;
  x->gone = &j->s_gone;
  x->client_fd = j->fd;
  x->stream = on_data ? j : NULL;
  x->hdrs = &j->up_hdrs;
  x->ud = c;
  x->max_bytes = lg__gw_answer_max(c->cx->gw); /* a whole answer, or one event (on_stream_data) */
  int rc = lg__gw_http_do(c->cx->curl, c->cx->multi, x);
  lg__gw_note_upstream(c->cx->gw, c->ui, x);
  return rc;
}

/* ---- the exchange, non-stream ---- */

/* The upstream's answer parsed (NULL: not a JSON object), *msg the part that holds
 * the tool calls (a chat choice's message, the Messages or Responses
 * object), or NULL when it has none. */
static json_t *parse_answer(chat_t *c, const lg__buf_t *raw, json_t **msg) {
  json_t *resp = lg__json_load(raw->data ? raw->data : "", raw->len, NULL, NULL);
  if (lg__json_oom() || !json_is_object(resp)) { /* an array is no answer of any API */
    json_decref(resp);
    resp = NULL;
  }
  json_t *m = json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message");
  if (is_anthropic(c)) m = json_is_array(json_object_get(resp, "content")) ? resp : NULL;
  if (is_responses(c)) m = json_is_array(json_object_get(resp, "output")) ? resp : NULL;
  *msg = json_is_object(m) ? m : NULL;
  if (c->legacy && *msg) lg__gwo_legacy_answer(c, *msg);
  return resp;
}

/* The text of an answer's message (new). */
static char *answer_text(chat_t *c, json_t *msg) {
  if (is_anthropic(c)) return content_text(msg);
  if (is_responses(c)) return lg__gwr_output_text(msg);
  const char *t = sget(msg, "content");
  return lg__strdup(t ? t : "");
}

/* The tool calls of an answer's message (new reference). */
static json_t *answer_calls(chat_t *c, json_t *msg) {
  if (is_anthropic(c)) return lg__gwm_tool_uses(msg);
  if (is_responses(c)) return lg__gwr_function_calls(msg);
  json_t *t = json_object_get(msg, "tool_calls");
  return json_is_array(t) ? json_incref(t) : json_array();
}

/* Decides a whole answer: 1 answered, 0 ask again (nothing left for the
 * client and re-asks left). */
static int plain_decide(chat_t *c, json_t *resp, json_t *msg, const lg__buf_t *raw, int ask) {
  char *text = answer_text(c, msg);
  int tx = text_event(c, text, text ? strlen(text) : 0);
  json_t *tcs = tx == 2 ? NULL : answer_calls(c, msg);
  if (tx == 2) { /* a text loop stopped the run: the stop replaces it */
    lg__free(text);
    if (c->conv_id) {
      json_t *calls = answer_calls(c, msg);
      conv_unanswered(c, calls);
      json_decref(calls);
    }
    answer_final(c, resp);
    return 1;
  }
  if (!json_array_size(tcs)) {
    if (tx != 1) raise_action(c->j, "pass", NULL);
    lg__gwc_register_key(c, msg);
    answer_json_obj(c, resp, raw, 0);
    json_decref(tcs);
    lg__free(text);
    return 1;
  }
  calls_out_t co = decide_calls(c, tcs, text, msg);
  lg__free(text);
  json_decref(tcs);
  int done = 1;
  if (co.stop) {
    answer_final(c, resp);
  } else if (json_array_size(co.kept)) {
    if (co.refused && is_responses(c)) lg__gwr_keep_items(msg, co.kept);
    else if (co.refused && is_anthropic(c)) lg__gwm_keep_blocks(msg, co.kept);
    else if (co.refused) json_object_set(msg, "tool_calls", co.kept);
    lg__gwc_register_key(c, msg);
    answer_json_obj(c, resp, raw, co.refused > 0);
  } else if (ask < c->max_reasks) { /* nothing left for the client: ask again */
    if (is_responses(c) && (c->prev_id || c->conv_id || c->reask_prev) && sget(resp, "id")) {
      lg__free(c->reask_prev); /* the upstream keeps the conversation: continue it */
      c->reask_prev = lg__strdup(sget(resp, "id"));
    }
    done = 0;
  } else {
    stop_run(c);
    answer_final(c, resp);
  }
  json_decref(co.kept);
  return done;
}

/* What the usage of an answer that is not streamed, and not decided on,
 * is made of (rc: the exchange's). */
static enum usage_from plain_usage_from(int rc, const lg__gw_http_t *x, const json_t *resp) {
  if (x->status != 200) return USAGE_NONE; /* an error, or no answer */
  if (rc) /* after its 200: the upstream's failure was billed all the same; a
           * request that died (its client left, the server stopped) is
           * released, not charged (gateway-v1, "Keys") */
    return lg__gw_http_failure(x) != LG__GW_UP_OK ? USAGE_LOST : USAGE_NONE;
  return resp ? USAGE_ANSWER : USAGE_NONE; /* no JSON: no answer (a web page where an API was meant) */
}

/* One model call, not streamed: 1 answered, 0 ask again (a re-ask),
 * MENDED the same again (refused_added). */
static int plain_exchange(chat_t *c, int ask) {
  lg__gw_job_t *j = c->j;
  size_t blen = 0;
  model_out_t mo;
  char *own;
  const char *btext = prepare_call(c, &blen, &mo, &own);
  if (!btext) return 1;
  lg__gw_http_t x;
  int rc = call_upstream(c, &x, btext, blen, NULL);
  lg__free(own);
  if (x.status == 200) conv_delivered(c);
  json_t *msg = NULL, *resp = rc || x.status != 200 ? NULL : parse_answer(c, &x.body_out, &msg);
  c->cur_resp_id = sget(resp, "id");
  int done = 1;
  if (!rc && refused_added(c, &x)) {
    usage_event(c, &mo, NULL, USAGE_NONE, blen);
    done = MENDED;
  } else if (rc || x.status != 200 || !msg) {
    usage_event(c, &mo, json_object_get(resp, "usage"), plain_usage_from(rc, &x, resp), blen);
    if (rc) lg__gw_upstream_failed(j, &x);
    else if (x.status != 200) lg__gw_upstream_answer(j, &x); /* the provider's error, as sent */
    else if (!resp)
      lg__gw_error(j, 502, "upstream_error", "upstream_bad_response",
                   "upstream %s answered 200 with a body that is not a JSON object", x.up->name);
    if (rc || x.status != 200 || !resp) lg__gw_answer(j);
    else answer_json_obj(c, NULL, &x.body_out, 0); /* not ours to judge: as it is */
  } else {
    usage_event(c, &mo, json_object_get(resp, "usage"), USAGE_ANSWER, blen);
    done = plain_decide(c, resp, msg, &x.body_out, ask);
  }
  settle_usage(c); /* when no step came after it */
  json_decref(resp);
  lg__gw_http_clear(&x);
  return done;
}

/* gateway.final_round: the upstream asked once more, whole, with tool use
 * turned off; its text (when it gave one and no tool call) becomes the
 * final message. Not a model event: the run has stopped, and the engine
 * takes no event after a stop (docs/gateway.md). */
static void final_round(chat_t *c) {
  c->final_round = 1;
  size_t blen = 0;
  char *own = NULL;
  const char *btext = body_text(c, &blen, NULL, &own);
  if (!btext) return;
  lg__gw_http_t x;
  int rc = call_upstream(c, &x, btext, blen, NULL);
  lg__free(own);
  json_t *msg = NULL, *resp = rc || x.status != 200 ? NULL : parse_answer(c, &x.body_out, &msg);
  json_t *tcs = msg ? answer_calls(c, msg) : NULL;
  char *text = msg && !json_array_size(tcs) ? answer_text(c, msg) : NULL;
  if (text && *text) {
    lg__free(c->stop_text);
    c->stop_text = text;
    text = NULL;
  }
  lg__free(text);
  json_decref(tcs);
  json_decref(resp);
  lg__gw_http_clear(&x);
}




json_t *lg__gwc_event_json(chat_t *c, const char *data, size_t n) {
  json_t *o = lg__json_load(data, n, NULL, NULL);
  if (lg__json_oom() || !json_is_object(o)) {
    json_decref(o);
    return NULL;
  }
  c->events++;
  lg__gwc_begin_stream(c);
  return o;
}

/* One SSE "data:" payload of the upstream's stream, to its API's reader. */
static int on_event(chat_t *c, const char *data, size_t n, const char *raw, size_t rawn) {
  if (is_anthropic(c)) return lg__gwm_on_event(c, data, n, raw, rawn);
  if (is_responses(c)) return lg__gwr_on_event(c, data, n);
  return lg__gwo_on_event(c, data, n, raw, rawn);
}

static int on_stream_data(void *ud, const char *p, size_t n) {
  chat_t *c = ud;
  if (atomic_load(&c->j->s_gone)) return 1; /* the client went away: stop reading */
  lg__buf_append(&c->line, p, n);
  if (!c->line.data) return 0; /* nothing yet (or no memory for it) */
  /* Each whole event is read where it lies (sse.c); the rest is kept for
   * the next bytes. c->line does not change while an event is read. */
  size_t off = 0;
  int stop = 0;
  lg__sse_event_t ev;
  lg__buf_t joined = {0};
  while (!stop && lg__sse_next(c->line.data + off, c->line.len - off, &ev, &joined)) {
    if (ev.data) {
      stop = on_event(c, ev.data, ev.data_len, c->line.data + off, ev.used);
    } else if (c->line.data[off] == ':') {
      /* a comment, the upstream's keep-alive (OpenRouter's ": OPENROUTER
       * PROCESSING" while the model is queued): on to the client as it
       * came, its stream begun, so that a proxy or a client between them
       * that times out an idle connection sees bytes, as it would directly */
      lg__gwc_begin_stream(c);
      lg__gw_stream_write(c->j, c->line.data + off, ev.used);
    }
    off += ev.used;
  }
  lg__buf_free(&joined);
  if (off) {
    memmove(c->line.data, c->line.data + off, c->line.len - off);
    c->line.len -= off;
  }
  if (!stop && c->streamed) lg__gw_stream_keepalive(c->cx->gw, c->j);
  size_t max = lg__gw_answer_max(c->cx->gw);
  if (!stop && c->line.len > max) return LG__GW_OVER; /* an event without end */
  /* what the stream keeps to decide at its end: a stream of valid events
   * without end holds as much as one answer */
  if (!stop && c->text.len + c->held_bytes > max) return c->over_held = 1, LG__GW_OVER;
  return stop; /* 1: abort the upstream's stream */
}




/* ---- the end of a streamed answer, any API ---- */

int lg__gwc_held(chat_t *c, size_t i, int part, const char *s, size_t n) {
  if (i >= c->n_held) {
    lg__buf_t(*v)[2] = lg__realloc(c->held, (i + 1) * sizeof *v);
    if (!v) return LG_ENOMEM;
    memset(v + c->n_held, 0, (i + 1 - c->n_held) * sizeof *v);
    c->held = v;
    c->n_held = i + 1;
  }
  c->held_bytes += n;
  return lg__buf_append(&c->held[i][part], s, n);
}

static void held_free(chat_t *c) {
  for (size_t i = 0; i < c->n_held; i++) lg__buf_free(&c->held[i][0]), lg__buf_free(&c->held[i][1]);
  lg__free(c->held);
  c->held = NULL;
  c->n_held = 0;
}

/* The held calls' arguments and names, as they came, into the calls (Chat
 * Completions: function.arguments and .name, a custom tool's custom.input
 * and .name; Messages: _args), the buffers freed. A part that ran out of
 * memory stays empty. */
static void held_into_calls(chat_t *c) {
  static const char *const chat_keys[2][2] = {{"arguments", "name"}, {"input", "name"}};
  for (size_t i = 0; i < c->n_held; i++) {
    json_t *tc = json_array_get(c->tcalls, i), *cu = json_object_get(tc, "custom");
    json_t *o = is_anthropic(c) ? tc : cu ? cu : json_object_get(tc, "function");
    for (int part = 0; part < 2; part++) {
      lg__buf_t *b = &c->held[i][part];
      if (o && b->len && !b->oom) /* JSON strings' text joined: UTF-8 still, but checked */
        json_object_set_new(o, is_anthropic(c) ? "_args" : chat_keys[cu != NULL][part],
                            json_stringn(b->data, b->len));
    }
  }
  held_free(c);
}

/* The held calls of the stream (new reference). */
static json_t *held_calls(chat_t *c) {
  if (is_responses(c)) return c->r_done ? lg__gwr_function_calls(c->r_done) : json_array();
  held_into_calls(c);
  return json_incref(c->tcalls);
}

/* The stream's answer registered as the start of its conversation, when
 * it holds no call for the client. */
static void register_text(chat_t *c) {
  const char *t = c->text.data ? c->text.data : "";
  json_t *m = is_responses(c)   ? json_incref(c->r_done)
              : is_anthropic(c) ? json_pack("{s:s, s:[{s:s, s:s}]}", "role", "assistant", "content",
                                            "type", "text", "text", t)
                                : json_pack("{s:s, s:s}", "role", "assistant", "content", t);
  if (m) lg__gwc_register_key(c, m);
  json_decref(m);
}

/* Ends the client's stream the way its API ends one. */
static void end_api_stream(chat_t *c) {
  if (is_anthropic(c)) lg__gwm_end_stream(c);
  else if (is_responses(c)) lg__gwr_end_stream(c);
  else lg__gwo_end_stream(c);
}

/* After the upstream's stream ended: the rest of its text given to the
 * step, its held calls decided and the kept ones emitted. 1: end the
 * stream; 2: the final message ended it; 0: ask again. */
static int stream_finish(chat_t *c, int ask) {
  if (is_responses(c)) c->cur_resp_id = sget(c->r_done, "id");
  int tx = lg__gwc_feed_text(c, 1);
  if (tx == 2) {
    if (c->conv_id) {
      json_t *calls = held_calls(c);
      conv_unanswered(c, calls);
      json_decref(calls);
    }
    answer_final(c, is_responses(c) || is_anthropic(c) ? NULL : c->last_chunk);
    return 2;
  }
  json_t *tcs = held_calls(c);
  if (!json_array_size(tcs)) {
    json_decref(tcs);
    if (tx != 1) raise_action(c->j, "pass", NULL);
    register_text(c);
    return 1;
  }
  calls_out_t co = decide_calls(c, tcs, c->text.len ? c->text.data : NULL, NULL);
  json_decref(tcs);
  int done = 1;
  if (co.stop) {
    answer_final(c, is_responses(c) || is_anthropic(c) ? NULL : c->last_chunk);
    done = 2;
  } else if (json_array_size(co.kept)) {
    if (is_anthropic(c)) lg__gwm_emit_kept(c, co.kept);
    else if (is_responses(c)) lg__gwr_emit_kept(c, co.kept, co.refused);
    else lg__gwo_emit_kept(c, co.kept);
  } else if (ask < c->max_reasks) {
    if (is_responses(c) && (c->prev_id || c->conv_id || c->reask_prev)) {
      lg__free(c->reask_prev);
      c->reask_prev = lg__strdup(sget(c->r_done, "id"));
    }
    done = 0;
  } else {
    stop_run(c);
    answer_final(c, is_responses(c) || is_anthropic(c) ? NULL : c->last_chunk);
    done = 2;
  }
  json_decref(co.kept);
  return done;
}

/* An upstream's answer other than 200, in words: its status and the
 * provider's own message (error.message, in either API's shape), else
 * the start of its body; cut to size, a byte that is not whole UTF-8 (a
 * body's, or a sequence the cut split) or a control byte as '?', for the
 * JSON it goes into. */
static void refused_text(const lg__gw_http_t *x, char *out, size_t size) {
  const lg__buf_t *b = &x->body_out;
  lg__json_begin();
  json_t *e = b->len ? json_loadb(b->data, b->len, 0, NULL) : NULL;
  const char *m = sget(json_object_get(e, "error"), "message");
  if (m) snprintf(out, size, "answered %ld: %s", x->status, m);
  else snprintf(out, size, "answered %ld: %.*s", x->status, (int)(b->len < 200 ? b->len : 200), b->len ? b->data : "");
  json_decref(e);
  for (size_t i = 0, n = strlen(out); i < n;) {
    size_t k = (unsigned char)out[i] < 0x80 ? 1 : lg__utf8_len((const unsigned char *)out + i, n - i);
    if (!k || (unsigned char)out[i] < 0x20) out[i] = '?', k = 1;
    i += k;
  }
}

/* The client's stream ended on an error, e (the error's body in the API's
 * shape, lg__gw_error_body's), as its API sends one: Chat Completions
 * `data: {"error": ...}` (as OpenAI does), Messages `event: error`,
 * Responses an `error` event (its code, message and param). */
static void error_event(chat_t *c, const lg__buf_t *e) {
  const char *body = e->data && !e->oom ? e->data : "{}";
  if (is_responses(c)) {
    json_t *o = lg__json_load(body, strlen(body), NULL, NULL), *er = json_object_get(o, "error");
    const char *m = sget(er, "message");
    json_t *param = json_object_get(er, "param");
    json_t *ev = json_pack("{s:s, s:s?, s:s, s:O}", "type", "error", "code", sget(er, "code"), "message",
                           m ? m : "loopguard: the stream failed", "param", param ? param : json_null());
    json_decref(o);
    if (ev) lg__gwr_event(c, ev);
    return;
  }
  lg__buf_t b = {0};
  if (is_anthropic(c)) lg__buf_printf(&b, "event: error\ndata: %s\n\n", body);
  else lg__buf_printf(&b, "data: %s\n\n", body);
  if (b.data) lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
}

/* The upstream's stream failed after the client's began (cut off, timed
 * out, garbage): an error event in the API's shape ends it, so the
 * client's SDK reports the failure rather than a short answer. */
static void stream_error(chat_t *c, const lg__gw_http_t *x, int rc) {
  char lab[300], msg[900], over[120], refused[500];
  lg__gw_upstream_label(x->up, lab, sizeof lab);
  snprintf(over, sizeof over, "sent %s over %zu bytes (LOOPGUARD_GATEWAY_ANSWER_BYTES)",
           c->over_held ? "text and tool calls" : "an event", x->max_bytes);
  if (!rc && x->status != 200) refused_text(x, refused, sizeof refused);
  snprintf(msg, sizeof msg, "upstream %s: %s", lab,
           !rc && x->status != 200             ? refused
           : !rc                               ? "the stream ended before its last event"
           : x->over                           ? over
           : x->cc == CURLE_OPERATION_TIMEDOUT ? "timed out in the middle of the stream"
                                               : x->errbuf);
  lg__buf_t e = {0};
  int status = !rc && x->status >= 400 && x->status < 600 ? (int)x->status
               : rc && x->cc == CURLE_OPERATION_TIMEDOUT  ? 504
                                                          : 502;
  lg__gw_error_body(&e, is_anthropic(c), status, "upstream_error", "upstream_error", NULL, msg);
  error_event(c, &e);
  lg__buf_free(&e);
}

/* The state of reading one upstream stream, reset. */
static void stream_reset(chat_t *c) {
  json_decref(c->tcalls);
  c->tcalls = json_array();
  lg__gwo_details_next(c);
  lg__gwo_details_clear(c);
  c->details = json_array();
  held_free(c);
  json_decref(c->a_map);
  c->a_map = json_object();
  lg__free(c->finish);
  c->finish = NULL;
  json_decref(c->usage);
  c->usage = NULL;
  json_decref(c->r_done);
  c->r_done = NULL;
  c->saw_done = 0;
  c->saw_error = 0;
  c->text.len = 0;
  c->r_sent = 0;
  c->text_fed = 0;
  c->line.len = 0;
  c->events = 0;
  json_decref(c->reasoning);
  c->reasoning = NULL;
  c->think_at = -1;
  c->think[0].len = c->think[1].len = 0;
  c->held_bytes = 0;
}

/* The usage of a stream cut by the gateway, or that came without one:
 * what the upstream had sent, at most (a token is at least a byte: the
 * answer's text and held calls and reasoning), and the input the
 * upstream counted when it said so before the cut (Anthropic's
 * message_start, its cache tokens with it), else the request's bytes.
 * New. */
static json_t *cut_usage(chat_t *c, size_t blen) {
  json_t *u = json_is_integer(json_object_get(c->usage, "input_tokens"))
                  ? json_copy(c->usage)
                  : json_pack("{s:I}", "input_tokens", (json_int_t)blen);
  json_object_set_new(u, "output_tokens", json_integer((json_int_t)(c->text.len + c->held_bytes)));
  return u;
}

json_t *lg__gwc_usage(const chat_t *c, json_int_t in, json_int_t out) {
  if (is_anthropic(c)) return json_pack("{s:I, s:I}", "input_tokens", in, "output_tokens", out);
  if (is_responses(c))
    return json_pack("{s:I, s:{s:i}, s:I, s:{s:i}, s:I}", "input_tokens", in, "input_tokens_details",
                     "cached_tokens", 0, "output_tokens", out, "output_tokens_details", "reasoning_tokens",
                     0, "total_tokens", (json_int_t)lg__add_sat(in, out));
  return json_pack("{s:I, s:I, s:I}", "prompt_tokens", in, "completion_tokens", out, "total_tokens",
                   (json_int_t)lg__add_sat(in, out));
}

/* A cut stream's client is told the usage its run was charged (`u`, of
 * cut_usage: the provider's own count never came), in its API's shape:
 * Chat Completions' usage chunk (when asked for), Responses' usage of
 * response.completed, Messages' output_tokens of message_delta (its
 * input went with message_start). */
static void cut_told(chat_t *c, json_t *u) {
  json_int_t out = json_integer_value(json_object_get(u, "output_tokens"));
  if (is_anthropic(c)) {
    c->a_out_tokens = lg__add_sat(c->a_out_tokens, out);
    return;
  }
  json_decref(c->usage);
  c->usage = lg__gwc_usage(c, json_integer_value(json_object_get(u, "input_tokens")), out);
}

/* The usage of a streamed model call whose upstream failed: nothing when
 * it sent nothing of an answer (an error status, no answer, a 200 without
 * text, calls, reasoning or its input count: a provider bills none of
 * them); else what it had sent, at most (cut_usage), as a provider bills
 * a stream that broke, or whose client hung up, for what it generated.
 * Settled at 0 until session 28. */
static void failed_usage(chat_t *c, const model_out_t *mo, const lg__gw_http_t *x, size_t blen) {
  if (x->status != 200 ||
      !(c->text.len || c->held_bytes || json_is_integer(json_object_get(c->usage, "input_tokens")))) {
    usage_event(c, mo, NULL, USAGE_NONE, blen);
    return;
  }
  json_t *u = cut_usage(c, blen);
  usage_event(c, mo, u, USAGE_ANSWER, blen);
  json_decref(u);
}

/* One model call, streamed: 0 ask again, MENDED the same again, else the
 * stream is answered. */
static int stream_exchange(chat_t *c, int ask) {
  lg__gw_job_t *j = c->j;
  size_t blen = 0;
  model_out_t mo;
  char *own;
  const char *btext = prepare_call(c, &blen, &mo, &own);
  if (!btext) return 1;
  stream_reset(c);
  lg__gw_http_t x;
  int rc = call_upstream(c, &x, btext, blen, on_stream_data);
  lg__free(own);
  if (x.status == 200 && !c->cut) conv_delivered(c);
  int done = 1;
  if (c->cut) { /* a text loop: the upstream's stream was aborted */
    conv_lost(c);
    json_t *u = cut_usage(c, blen);
    usage_event(c, &mo, u, USAGE_ANSWER, blen);
    cut_told(c, u);
    json_decref(u);
    if (c->cut == 2) answer_final(c, is_responses(c) || is_anthropic(c) ? NULL : c->last_chunk);
    else end_api_stream(c);
  } else if (!rc && x.status == 200 && (c->saw_done || (c->api == LG__GW_API_OPENAI && c->finish))) {
    json_t *u = c->usage ? json_incref(c->usage) : cut_usage(c, blen); /* none sent: at most */
    usage_event(c, &mo, u, USAGE_ANSWER, blen);
    json_decref(u);
    lg__gwc_begin_stream(c);
    done = stream_finish(c, ask);
    if (done == 1) end_api_stream(c);
  } else if (c->streamed) { /* the upstream failed mid-stream */
    failed_usage(c, &mo, &x, blen);
    if (!atomic_load(&j->s_gone) && !c->saw_error) stream_error(c, &x, rc);
  } else if (!rc && refused_added(c, &x)) {
    usage_event(c, &mo, NULL, USAGE_NONE, blen);
    done = MENDED;
  } else { /* nothing was sent to the client: an error of its API */
    failed_usage(c, &mo, &x, blen);
    if (rc) lg__gw_upstream_failed(j, &x);
    else if (x.status != 200) lg__gw_upstream_answer(j, &x);
    else
      lg__gw_error(j, 502, "upstream_error", "upstream_bad_response",
                   "upstream %s answered 200 with a stream that holds no event of its API", x.up->name);
    lg__gw_answer(j);
  }
  settle_usage(c); /* when no step came after it */
  lg__gw_http_clear(&x);
  return done;
}

/* The model calls of a request: the first, and the re-asks while every
 * call of an answer is refused (gateway.max_reasks); a call the upstream
 * refused for what the gateway added to it made again, mended, and not
 * counted as a re-ask. */
static void run_calls(chat_t *c) {
  int (*exchange)(chat_t *, int) = c->stream ? stream_exchange : plain_exchange;
  for (int ask = 0, r; (r = exchange(c, ask)) == 0 || r == MENDED;) ask += r == 0;
}

/* ---- the route ---- */

/* 0 when the request's member `name` is absent, null, or a whole number of
 * at least `least`; else 1, answered 400. */
static int bad_count(chat_t *c, const char *name, int least) {
  json_t *v = json_object_get(c->root, name);
  if (!v || json_is_null(v) || (json_is_integer(v) && json_integer_value(v) >= least)) return 0;
  lg__gw_error(c->j, 400, "invalid_request_error", "invalid_value",
               "%s: expected a whole number of at least %d", name, least);
  return 1;
}

/* The members the guard reads as the upstream will, checked as providers
 * check them: `stream` a boolean (the guard reads a stream or a JSON
 * answer by it: "stream": 1, which a lenient server takes for true, was
 * read as false and its stream answered 502 after the call was paid),
 * the max tokens and `n` whole numbers (the worst case is priced on
 * them). null is as absent. 1: answered 400. */
static int bad_member(chat_t *c) {
  json_t *v = json_object_get(c->root, "stream");
  if (v && !json_is_boolean(v) && !json_is_null(v)) {
    lg__gw_error(c->j, 400, "invalid_request_error", "invalid_type", "stream: expected true or false");
    return 1;
  }
  for (size_t i = 0; i < LG__GW_NBOUNDS; i++)
    if (bad_count(c, lg__gw_bounds[i], 0)) return 1;
  return bad_count(c, "n", 1);
}

/* The request's body parsed and checked. 0, or an error answered into j. */
static int parse_request(chat_t *c) {
  lg__gw_job_t *j = c->j;
  json_error_t je;
  c->lazy.prefix = c->prefix = j->hdr_run ? lg__gw_prefix_take(c->cx->gw, j->hdr_run)
                                          : lg__gw_prefix_find(c->cx->gw, j->body, j->body_len);
  c->lazy.peek[PEEK_ROLE] = peek_keys[PEEK_ROLE];
  c->lazy.peek[PEEK_TYPE] = peek_keys[PEEK_TYPE];
  c->root = lg__json_load_lazy(j->body, j->body_len, is_responses(c) ? "input" : "messages", &c->lazy,
                               &je, &c->body_reals);
  if (lg__json_oom()) {
    json_decref(c->root);
    c->root = NULL;
    lg__gw_error(j, 500, "server_error", NULL, "out of memory");
    return -1;
  }
  if (!c->root) {
    lg__gw_error(j, 400, "invalid_request_error", "invalid_json",
                 "the body is not a JSON object (line %d, column %d: %s)", je.line, je.column, je.text);
    return -1;
  }
  if (!json_is_object(c->root)) { /* JSON, so je says nothing */
    lg__gw_error(j, 400, "invalid_request_error", "invalid_json",
                 "the body is not a JSON object: it is %s", lg__json_type_name(c->root));
    return -1;
  }
  c->messages = json_object_get(c->root, is_responses(c) ? "input" : "messages");
  if (is_responses(c) && json_is_string(c->messages)) { /* input: "text" is one user message */
    c->input_wrap = json_pack("[{s:s, s:O}]", "role", "user", "content", c->messages);
    c->messages = c->input_wrap;
  }
  if (!json_is_array(c->messages)) {
    lg__gw_error(j, 400, "invalid_request_error", "invalid_value", "%s: expected an array",
                 is_responses(c) ? "input" : "messages");
    return -1;
  }
  if (bad_member(c)) return -1;
  if (lg__gwo_legacy_root(c)) {
    lg__gw_error(j, 500, "server_error", NULL, "out of memory");
    return -1;
  }
  if (is_responses(c) && json_is_true(json_object_get(c->root, "background"))) {
    /* its answer is polled for (GET /v1/responses/{id}, passed through):
     * its calls would not be decided, nor its cost counted */
    lg__gw_error(j, 400, "invalid_request_error", "unsupported_value",
                 "background: loopguard does not guard a background response (its answer is polled "
                 "for, so its tool calls could not be decided, nor its cost counted); send it "
                 "without background, or to the provider's own URL");
    return -1;
  }
  if (j->hdr_run && !valid_id(j->hdr_run)) {
    lg__gw_error(j, 400, "invalid_request_error", "invalid_run",
                 "X-Loopguard-Run: expected a run id of 1 to 1024 bytes of UTF-8 without control "
                 "characters or '/', not \".\" or \"..\"");
    return -1;
  }
  if (j->hdr_group && !valid_id(j->hdr_group)) { /* as a run's group over HTTP */
    lg__gw_error(j, 400, "invalid_request_error", "invalid_group",
                 "X-Loopguard-Group: expected a group of 1 to 1024 bytes of UTF-8 without control "
                 "characters or '/', not \".\" or \"..\"");
    return -1;
  }
  if (j->hdr_policy && !lg__gw_policy_named(c->cx->gw, j->hdr_policy)) {
    lg__gw_error(j, 400, "invalid_request_error", "unknown_policy",
                 "X-Loopguard-Policy: no policy named \"%.200s\" (the server's --policies folder "
                 "holds NAME.json for each name)",
                 j->hdr_policy);
    return -1;
  }
  c->prev_id = is_responses(c) ? sget(c->root, "previous_response_id") : NULL;
  if (is_responses(c)) { /* a conversation's id, or {id} */
    json_t *cv = json_object_get(c->root, "conversation");
    c->conv_id = json_is_string(cv) ? json_string_value(cv) : sget(cv, "id");
  }
  c->n = json_array_size(c->messages);
  c->stream = json_is_true(json_object_get(c->root, "stream"));
  c->client_usage = json_is_true(json_object_get(json_object_get(c->root, "stream_options"), "include_usage"));
  c->base_ui = lg__gw_config_pick(lg__gw_cfg(c->cx->gw), sget(c->root, "model"), c->j->route,
                                  &c->base_model);
  c->ui = c->base_ui;
  c->model = c->base_model;
  j->upstream = c->ui;
  return 0;
}

/* The request's run: named by its header, else found by its
 * conversation's start (or previous_response_id), else new. 0, or an
 * error answered. */
static int find_run(chat_t *c) {
  lg__gw_job_t *j = c->j;
  char *key = NULL;
  long a = first_assistant(c);
  if (!j->hdr_run && c->conv_id) /* the conversation is the run's, from its first request */
    key = id_key("conv", c->conv_id);
  else if (!j->hdr_run && c->prev_id)
    key = id_key("resp", c->prev_id);
  else if (!j->hdr_run && a >= 0)
    key = conv_key(c, (size_t)a, NULL);
  if (c->lazy_oom) {
    lg__free(key);
    lg__gw_error(j, 500, "server_error", NULL, "out of memory");
    return -1;
  }
  lg_error_t e = {0};
  c->r = lg__gw_run_get(c->cx, j->hdr_run, key, lg__gw_policy_named(c->cx->gw, j->hdr_policy),
                        &c->run_made, &e);
  lg__free(key);
  if (!c->r) {
    lg__gw_failed(j, NULL, "create the run", &e, e.code);
    return -1;
  }
  snprintf(j->run_id, sizeof j->run_id, "%s", c->r->id);
  c->max_reasks = (int)c->r->policy->gw_max_reasks;
  prev_fetch(c);
  mem_fetch(c);
  return 0;
}

/* What makes a request a retry of the run's last: its body, and who sent
 * it: the loopguard key (its id), else the client's own credentials
 * (Authorization, and x-api-key or api-key: lg__auth_key_header). Another
 * key, or another client, sending the same body on the same run gets a
 * model call of its own, past its own key's checks, never the cached
 * answer of another. */
static uint64_t retry_hash(const lg__gw_job_t *j) {
  uint64_t h = lg__hash_str(j->body), i = 0;
  const char *who = j->key ? lg__gw_key_id(j) : j->auth;
  h = (h ^ (who ? lg__hash_str(who) : 0)) * 0x100000001b3u + ++i;
  for (const struct curl_slist *s = j->key ? NULL : j->fwd; s; s = s->next)
    if (lg__auth_key_header(s->data)) h = (h ^ lg__hash_str(s->data)) * 0x100000001b3u + ++i;
  return h;
}

/* A retry of the run's last request (the same body and sender, soon
 * after): the same answer again, not a second model call. 1 when
 * answered. */
static int answer_retry(chat_t *c, uint64_t h) {
  lg__gw_run_t *r = c->r;
  lg__gw_job_t *j = c->j;
  if (c->stream || r->last_hash != h || !r->last_body.len || now_ms(c->cx) - r->last_ms >= RETRY_WINDOW_MS)
    return 0;
  j->status = r->last_status;
  snprintf(j->ctype, sizeof j->ctype, "application/json");
  lg__buf_append(&j->out, r->last_body.data, r->last_body.len);
  j->action = NULL;
  raise_action(j, r->last_action[0] ? r->last_action : "pass", r->last_reason);
  lg__gw_answer(j);
  return 1;
}

/* Keeps a whole 200 answer for a retry of the same request. */
static void keep_for_retry(chat_t *c, uint64_t h) {
  lg__gw_run_t *r = c->r;
  lg__gw_job_t *j = c->j;
  if (c->stream || !j->answered || j->status != 200) return;
  r->last_hash = h;
  r->last_ms = now_ms(c->cx);
  r->last_status = j->status;
  r->last_body.len = 0;
  lg__buf_append(&r->last_body, j->out.data, j->out.len);
  snprintf(r->last_action, sizeof r->last_action, "%s", j->action ? j->action : "");
  snprintf(r->last_reason, sizeof r->last_reason, "%s", j->reason);
}

/* A message from the person: a `user` event. An Anthropic user message
 * that holds tool_result blocks is the results' turn, whatever else it
 * holds: a text beside them is what the client adds to its results (as
 * Claude Code adds a <system-reminder> to most), not a new episode,
 * which would start at every turn and keep any loop from being counted.
 * Its results are read (feed_message); all of it goes upstream as sent. */
static int is_user_message(const chat_t *c, json_t *m) {
  const char *role = sget(m, "role"), *ty = sget(m, "type");
  if (!role || strcmp(role, "user") || (ty && strcmp(ty, "message"))) return 0;
  json_t *ct = json_object_get(m, "content");
  if (!is_anthropic(c) || !json_is_array(ct)) return 1;
  int other = 0;
  for (size_t k = 0; k < json_array_size(ct); k++) {
    const char *bt = sget(json_array_get(ct, k), "type");
    if (bt && !strcmp(bt, "tool_result")) return 0; /* the results' turn */
    if (bt) other = 1;
  }
  return other;
}

/* What client message i is to feed_new, from its role and type alone:
 * nothing (an assistant's or a system's message, never built to feed);
 * on the OpenAI APIs, one tool result read late (feed_later: chat's
 * "tool" message, a Responses function_call_output) or the person's
 * message (is_user_message says so from its role and type: its content,
 * images and all, is not built); on Anthropic's, a user message to build
 * and feed (feed_message: its blocks may be tool results). */
enum { FEED_NOT, FEED_LATE, FEED_USER, FEED_BUILT };
static int feed_kind(chat_t *c, size_t i) {
  const char *role = msg_str(c, i, PEEK_ROLE), *ty = msg_str(c, i, PEEK_TYPE);
  int user = role && !strcmp(role, "user");
  if (is_anthropic(c)) return user ? FEED_BUILT : FEED_NOT;
  if (is_responses(c) ? lg__gwr_is_output(ty) : role && !strcmp(role, "tool"))
    return FEED_LATE;
  return user && (!ty || !strcmp(ty, "message")) ? FEED_USER : FEED_NOT;
}

/* Whether client message i is the model's: an assistant message or a
 * Responses output item (a call, reasoning, or a reference to one). */
static int is_answer(chat_t *c, size_t i) {
  return is_role(c, i, "assistant") || is_call_item(c, i) ||
         is_type(c, i, "reasoning") || is_type(c, i, "item_reference");
}

/* The last answer the client continues from: the last of the model's
 * messages that a message of another kind follows (an assistant message
 * the client put last is its own prefill), or -1. */
static long last_answer(chat_t *c) {
  size_t i = c->n;
  while (i > 0 && is_answer(c, i - 1)) i--; /* the client's trailing prefill */
  while (i > 0 && !is_answer(c, i - 1)) i--;
  return (long)i - 1;
}

/* The person's message, client message i: a `user` event when it is new.
 * The first prompt starts the run itself. A message before the answer the
 * client continues from was in the request that answer was made for, and
 * was decided then, by whichever process answered it (a replica, a server
 * before a restart): what this process last fed of the run (r->fed) is
 * only its own, and a message it had not seen may be old (feeding it again
 * would start an episode again, or resume a stopped run). */
static void feed_user(chat_t *c, size_t i) {
  flush_results(c); /* in order: the results before it first */
  long last = c->prev_id || c->conv_id ? -1 : c->last_ans;
  if ((long)i < last) return;
  /* a conversation's (conv_id) first request made its run: later ones,
   * on any replica, find it */
  if (c->r->model_calls > 0 || last >= 0 || c->prev_id || (c->conv_id && !c->run_made)) user_event(c);
}

/* One new client message as events: its tool results, or a user event
 * (is_user_message: a message with results is the results' turn). Earlier
 * builds took an Anthropic message of results and a text for the
 * person's alone: its results were never read. */
static void feed_message(chat_t *c, size_t i, json_t *m) {
  const char *role = sget(m, "role");
  /* Anthropic's results: the tool_result blocks of a user message
   * (OpenAI's, a message or an item each, are fed by feed_new) */
  if (is_anthropic(c) && role && !strcmp(role, "user")) {
    json_t *blocks = json_object_get(m, "content");
    for (size_t k = 0; k < json_array_size(blocks); k++) {
      const char *bt = sget(json_array_get(blocks, k), "type");
      if (bt && !strcmp(bt, "tool_result")) feed_later(c, i, k);
    }
  }
  if (is_user_message(c, m)) feed_user(c, i); /* a message without results */
}

/* What is new since the run's last request, as events. A Responses
 * request with previous_response_id or a conversation holds only what is
 * new. */
static int feed_new(chat_t *c) {
  if (c->n < c->r->fed) c->r->fed = c->n; /* a shorter conversation: trimmed */
  size_t from = c->prev_id || c->conv_id ? 0 : c->r->fed;
  c->last_ans = last_answer(c);
  for (size_t i = from; is_anthropic(c) && i < c->n; i++) /* all built before any is fed: none or all */
    if (feed_kind(c, i) == FEED_BUILT && !client_msg(c, i)) {
      lg__gw_error(c->j, 500, "server_error", NULL, "out of memory");
      return -1;
    }
  for (size_t i = from; i < c->n; i++) {
    int kind = feed_kind(c, i);
    if (kind == FEED_LATE) feed_later(c, i, 0);
    else if (kind == FEED_USER) feed_user(c, i);
    else if (kind == FEED_BUILT) feed_message(c, i, client_msg(c, i));
  }
  /* the last results wait for the model call (flush_results_then); one
   * that could not be read (out of memory) is read again next time */
  if (!c->fed.oom) c->r->fed = c->n;
  return 0;
}

/* The key's checks (keys.c); a max_tokens it filled in is written in
 * front of the client's bytes (client_bytes). */
static int keys_model(chat_t *c) {
  if (!c->j->key) return 0;
  const char *added = NULL;
  lg_prices_t *pr = lg_price_book_get(c->cx->srv->prices);
  size_t input = (size_t)input_bound(c, pr, c->model, c->j->body_len);
  lg_prices_free(pr);
  int rc = lg__gw_keys_model(c->cx, c->root, c->model, c->ui, input, &added, &c->root_replaced);
  if (added) c->root_added = added;
  return rc;
}

static void chat_free(chat_t *c) {
  lg__gwo_legacy_free(c);
  lg__json_lazy_free(&c->lazy);
  json_decref(c->prev_answers);
  json_decref(c->conv_pending);
  lg__json_prefix_free(c->prefix);
  lg__free(c->fed.st);
  lg__free(c->fed.ev);
  lg__free(c->fed.keep);
  json_decref(c->root);
  json_decref(c->tcalls);
  lg__gwo_details_clear(c);
  held_free(c);
  json_decref(c->last_chunk);
  json_decref(c->usage);
  json_decref(c->a_map);
  json_decref(c->a_msg);
  json_decref(c->a_delta);
  json_decref(c->input_wrap);
  json_decref(c->r_done);
  json_decref(c->r_open_item);
  lg__free(c->reask_prev);
  lg__free(c->esc_model);
  lg__free(c->esc_asked);
  lg__free(c->esc_path);
  lg__buf_free(&c->line);
  lg__buf_free(&c->text);
  json_decref(c->reasoning);
  lg__buf_free(&c->think[0]);
  lg__buf_free(&c->think[1]);
  lg__free(c->finish);
  lg__free(c->new_key);
  lg__free(c->stop_text);
  lg__free(c->steer_text);
}

void lg__gw_chat(lg__gw_ctx_t *cx) {
  lg__gw_job_t *j = cx->j;
  chat_t c;
  memset(&c, 0, sizeof c);
  c.cx = cx;
  c.j = j;
  c.a_open = c.r_open = -1;
  c.think_at = -1;
  c.attached = c.inlined = -1;
  c.api = j->kind == LG__GW_MESSAGES    ? LG__GW_API_ANTHROPIC
          : j->kind == LG__GW_RESPONSES ? API_RESPONSES
                                        : LG__GW_API_OPENAI;
  uint64_t h = retry_hash(j);
  if (!parse_request(&c) && !find_run(&c) && !answer_retry(&c, h) && !feed_new(&c)) {
    text_steer_place(&c);
    /* What comes before the model call and reads the results' decisions
     * (a stop, a stopped run's last text) or the store (a key's checks):
     * the results first, as they came. */
    if (c.stop_text || j->key) flush_results(&c);
    if (c.stop_text) answer_final(&c, NULL);
    else if (keys_model(&c)) {
      /* refused by the key (keys.c): answered */
    } else run_calls(&c);
    flush_results(&c); /* when no model call took them (an error before it) */
    settle_usage(&c);
    text_steer_done(&c);
    keep_for_retry(&c, h);
  }
  if (!j->action && j->run_id[0]) j->action = "pass";
  /* this conversation as read, for the run's next request (found by its
   * header, else by its first bytes) */
  lg__gw_prefix_keep(cx->gw, c.r, &c.lazy);
  if (c.r) lg__gw_run_unlock(cx->gw, c.r);
  if (!j->answered && !c.streamed) lg__gw_answer(j);
  chat_free(&c);
}
