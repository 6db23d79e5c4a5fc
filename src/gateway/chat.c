/*
 * chat.c — OpenAI Chat Completions through the guard (POST
 * /v1/chat/completions, stream false and true).
 *
 * One request, in order:
 *   1. its run: X-Loopguard-Run, else derived from the conversation's
 *      start (the first assistant message: the id of its first tool call,
 *      unique, else a hash of the messages up to it);
 *   2. the messages new since the run's last request become events: each
 *      `tool` message a result (the structured result contract when its
 *      content is a JSON object with a trace-v1 status);
 *   3. the model call is a model event, its worst case the request's
 *      bytes (a token is at least one byte) plus max_tokens; a stop here
 *      never reaches the upstream;
 *   4. the upstream body: the client's, with the calls the guard refused
 *      restored in place (each an assistant tool call and its tool
 *      answer, before the client message that followed it), steer
 *      messages appended to the result they concern, the hidden tool
 *      removed;
 *   5. the upstream's answer: its usage settles the model call, each tool
 *      call is a call event in one turn; executed calls pass, refused
 *      ones are taken out (and restored from then on), and when none is
 *      left the upstream is asked again (gateway.max_reasks); a stop is
 *      a final assistant message.
 * An answer the guard did not change is the upstream's bytes as they
 * came. Streams: text deltas are forwarded as they arrive, tool call
 * deltas held until the response is complete, then decided and emitted
 * (or not) with indices renumbered.
 */
#include "gw.h"

#include "../policy/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define RETRY_WINDOW_MS 60000

/* ---- small helpers ---- */

static const char *sget(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

/* The text of a message's content: a string, or the text parts. New. */
static char *content_text(const json_t *msg) {
  json_t *c = json_object_get(msg, "content");
  if (json_is_string(c)) return lg__strdup(json_string_value(c));
  lg__buf_t b = {0};
  lg__buf_puts(&b, "");
  for (size_t i = 0; json_is_array(c) && i < json_array_size(c); i++) {
    const char *t = sget(json_array_get(c, i), "text");
    if (t) lg__buf_puts(&b, t);
  }
  return lg__buf_steal(&b, NULL);
}

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

/* The key of a conversation's start: messages[0..a] with a the first
 * assistant message (extra, when not NULL, stands in for messages[a]). */
static char *conv_key(json_t *messages, size_t a, json_t *extra) {
  json_t *am = extra ? extra : json_array_get(messages, a);
  json_t *tcs = json_object_get(am, "tool_calls");
  const char *id = sget(json_array_get(tcs, 0), "id");
  if (!id) id = sget(am, "call_id"); /* a Responses function_call item */
  json_t *blocks = json_object_get(am, "content");
  for (size_t i = 0; !id && json_is_array(blocks) && i < json_array_size(blocks); i++) {
    const char *ty = sget(json_array_get(blocks, i), "type");
    if (ty && !strcmp(ty, "tool_use")) id = sget(json_array_get(blocks, i), "id");
  }
  lg__buf_t b = {0};
  if (id) {
    lg__buf_puts(&b, "tc:");
    lg__buf_puts(&b, id);
    return lg__buf_steal(&b, NULL);
  }
  lg__buf_t h = {0};
  for (size_t i = 0; i <= a; i++) {
    json_t *m = i == a ? am : json_array_get(messages, i);
    char *t = content_text(m);
    lg__buf_puts(&h, sget(m, "role") ? sget(m, "role") : "");
    lg__buf_putc(&h, '\n');
    if (t) lg__buf_puts(&h, t);
    lg__buf_putc(&h, '\n');
    lg__free(t);
  }
  lg__buf_printf(&b, "h:%016llx:%zu", (unsigned long long)lg__hash_str(h.data ? h.data : ""), h.len);
  lg__buf_free(&h);
  return lg__buf_steal(&b, NULL);
}

static long first_assistant(json_t *messages) {
  for (size_t i = 0; i < json_array_size(messages); i++) {
    const char *role = sget(json_array_get(messages, i), "role");
    const char *ty = sget(json_array_get(messages, i), "type");
    if ((role && !strcmp(role, "assistant")) || (ty && !strcmp(ty, "function_call"))) return (long)i;
  }
  return -1;
}

static bool valid_id(const char *s) {
  if (!s || !*s || strlen(s) > 1024) return false;
  for (const char *p = s; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '/') return false;
  return true;
}

static int64_t now_ms(lg__gw_ctx_t *cx) { return lg__server_now(cx->srv); }

/* The decision object of a step (new reference), or NULL. */
static json_t *answer_json(const lg__step_t *st) {
  if (!st->answer.data) return NULL;
  lg__json_begin();
  json_t *a = json_loadb(st->answer.data, st->answer.len, 0, NULL);
  if (lg__json_oom()) {
    json_decref(a);
    return NULL;
  }
  return a;
}

/* ---- state of one request ---- */

typedef struct chat {
  int api;                    /* LG__GW_API_OPENAI (chat), _ANTHROPIC (messages) */
  lg__gw_ctx_t *cx;
  lg__gw_job_t *j;
  lg__gw_run_t *r;
  json_t *root, *messages;
  size_t n;                   /* client messages */
  const char *model;          /* as sent upstream */
  int stream;                 /* the client asked for a stream */
  int client_usage;           /* the client asked for the usage chunk */
  size_t ui;                  /* upstream */
  char *new_key;              /* the conversation key to register */
  char *stop_text;            /* the run stopped: the final message */
  int streamed;               /* the stream began */
  int max_reasks;             /* gateway.max_reasks of the server's policy */
  /* streaming: the response being read */
  lg__buf_t line;             /* a partial SSE line */
  json_t *tcalls;             /* held tool calls by index: [{id,name,args}] */
  json_t *last_chunk;         /* a chunk as a template for ours */
  json_t *usage;              /* the usage chunk's usage */
  int saw_done;
  lg__buf_t text;             /* the text streamed */
  char *finish;               /* the finish_reason held back */
  /* Responses */
  const char *prev_id;        /* previous_response_id of the request */
  const char *cur_resp_id;    /* the id of the response being decided */
  char *reask_prev;           /* a re-ask continues this response */
  json_t *input_wrap;         /* input given as a string, as a message */
  int r_seq;                  /* the client's next sequence_number */
  int r_index;                /* the client's next output_index */
  int r_started;              /* response.created sent */
  json_t *r_done;             /* the upstream's response.completed response */
  /* Anthropic streams */
  int a_started;              /* message_start sent to the client */
  int a_index;                /* the client's next content block index */
  json_t *a_map;              /* upstream block index -> client index, or -1 - tool index */
  json_t *a_msg;              /* message_start's message (a template) */
  int64_t a_out_tokens;       /* message_delta's usage.output_tokens */
} chat_t;

#define API_RESPONSES 2 /* c->api: OpenAI Responses */
static int is_anthropic(const chat_t *c) { return c->api == LG__GW_API_ANTHROPIC; }
static int is_responses(const chat_t *c) { return c->api == API_RESPONSES; }
/* Tools and tool_choice name their function at the top (Messages, Responses). */
static int flat_tools(const chat_t *c) { return c->api != LG__GW_API_OPENAI; }

/* ---- events ---- */

/* A tool message as a result event. Unknown calls (not the gateway's)
 * are skipped. */
static void feed_result(chat_t *c, const char *call_id, json_t *msg, int is_error) {
  char *text = content_text(msg);
  if (!text) return;
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_RESULT;
  lg_result_t *res = &ev.u.result;
  res->call_id = call_id;
  res->side_effect_committed = 0; /* not said */
  res->retry_after_ms = 0;
  char *value = NULL;
  json_t *sj = NULL;
  if (text[0] == '{') {
    lg__json_begin();
    sj = json_loads(text, 0, NULL);
    if (lg__json_oom()) {
      json_decref(sj);
      sj = NULL;
    }
  }
  const char *sname = sj ? sget(sj, "status") : NULL;
  lg_status_t s = sname ? lg_status_parse(sname, strlen(sname)) : LG_STATUS_INVALID;
  if (sj && s != LG_STATUS_INVALID) { /* the structured result contract */
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
      value = lg__json_text(v, &res->value_len);
      res->value_kind = json_is_null(v) ? LG_VALUE_NULL : LG_VALUE_PRESENT;
      if (json_is_string(v)) {
        const char *t = json_string_value(v);
        while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r') t++;
        if (!*t) res->value_kind = LG_VALUE_BLANK;
      }
    }
  } else { /* a plain answer: progress (an error: retryable), its text the value */
    res->status = is_error ? LG_STATUS_RETRYABLE : LG_STATUS_PROGRESS;
    value = lg_json_quote(text, strlen(text));
    res->value_len = value ? strlen(value) : 0;
    const char *t = text;
    while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r') t++;
    res->value_kind = *t ? LG_VALUE_PRESENT : LG_VALUE_BLANK;
  }
  res->value = value;
  lg__step_t st;
  lg__step_init(&st, &ev, now_ms(c->cx));
  lg_error_t e = {0};
  if (!lg__gw_step(c->cx, c->r->id, &st, &e) && st.action == LG_ACT_STOP) {
    json_t *a = answer_json(&st);
    const char *m = a ? sget(a, "message") : NULL;
    if (!c->stop_text) c->stop_text = lg__strdup(m ? m : "I stopped this run: the loop guard ended it.");
    if (st.stopped_now) lg__gw_note_intervention(c->cx, c->r->id, "stop", a ? sget(a, "reason") : NULL, NULL, call_id);
    raise_action(c->j, "stop", a ? sget(a, "reason") : NULL);
    json_decref(a);
  }
  lg__step_clear(&st);
  lg__free(value);
  lg__free(text);
  json_decref(sj);
}

/* A stop decided by the gateway itself: its re-asks ran out with every
 * call of every response refused, which is a streak of blocked calls. A
 * stop event through the step, so the trace says so and replays to it. */
static void stop_run(chat_t *c, const char *reason) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_STOP;
  ev.u.stop.reason = LG_R_BLOCK_STREAK;
  ev.u.stop.message = "The model kept asking for tool calls that were refused, through every "
                      "re-ask the gateway allows (gateway.max_reasks); I am stopping.";
  reason = lg_reason_name(LG_R_BLOCK_STREAK);
  lg__step_t st;
  lg__step_init(&st, &ev, now_ms(c->cx));
  lg_error_t e = {0};
  lg__gw_step(c->cx, c->r->id, &st, &e);
  lg__step_clear(&st);
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

static json_t *build_body(chat_t *c) {
  lg__gw_run_t *r = c->r;
  json_t *b = json_copy(c->root); /* shallow: the client's members shared */
  json_t *msgs = json_array();
  if (!b || !msgs) {
    json_decref(b);
    json_decref(msgs);
    return NULL;
  }
  size_t k = 0;
  const char *prev = c->reask_prev ? c->reask_prev : c->prev_id;
  if (is_responses(c) && prev) {
    /* The upstream keeps the conversation: the refused calls of the
     * response continued are answered first, then what the client sent. */
    for (size_t q = 0; q < r->nrs; q++) {
      if (!r->rs[q].resp_id || strcmp(r->rs[q].resp_id, prev)) continue;
      for (size_t t = 0; t < json_array_size(r->rs[q].items); t++) {
        json_t *it = json_array_get(r->rs[q].items, t);
        const char *ty = sget(it, "type");
        if (ty && !strcmp(ty, "function_call_output")) json_array_append(msgs, it);
      }
    }
    k = r->nrs; /* nothing else restored */
    if (c->reask_prev) json_object_set_new(b, "previous_response_id", json_string(c->reask_prev));
  }
  for (size_t i = 0; i <= c->n; i++) {
    for (; k < r->nrs && r->rs[k].anchor <= i; k++)
      if (!r->rs[k].resp_id || !prev) json_array_extend(msgs, r->rs[k].items);
    if (i == c->n || (c->reask_prev && is_responses(c))) break;
    json_t *m = json_array_get(c->messages, i);
    const char *role = sget(m, "role");
    const char *steer = role && !strcmp(role, "tool")
                            ? sget(r->steer, sget(m, "tool_call_id") ? sget(m, "tool_call_id") : "")
                            : NULL;
    const char *mty = sget(m, "type");
    const char *rsteer = is_responses(c) && mty && !strcmp(mty, "function_call_output")
                             ? sget(r->steer, sget(m, "call_id") ? sget(m, "call_id") : "")
                             : NULL;
    if (rsteer && json_is_string(json_object_get(m, "output"))) {
      lg__buf_t nb = {0};
      lg__buf_printf(&nb, "%s\n\n[loopguard] %s", sget(m, "output"), rsteer);
      json_t *m2 = json_copy(m);
      if (m2 && nb.data) json_object_set_new(m2, "output", json_string(nb.data));
      json_array_append_new(msgs, m2 ? m2 : json_incref(m));
      lg__buf_free(&nb);
    } else if (steer) { /* the observe rung: said with the result it is about */
      char *t = content_text(m);
      lg__buf_t nb = {0};
      lg__buf_printf(&nb, "%s\n\n[loopguard] %s", t ? t : "", steer);
      json_t *m2 = json_copy(m);
      if (m2 && nb.data) json_object_set_new(m2, "content", json_string(nb.data));
      json_array_append_new(msgs, m2 ? m2 : json_incref(m));
      lg__free(t);
      lg__buf_free(&nb);
    } else if (is_anthropic(c) && role && !strcmp(role, "user") &&
               json_is_array(json_object_get(m, "content")) && json_object_size(r->steer)) {
      json_t *m2 = json_deep_copy(m);
      json_t *blocks = json_object_get(m2, "content");
      for (size_t k = 0; k < json_array_size(blocks); k++) {
        json_t *bl = json_array_get(blocks, k);
        const char *ty = sget(bl, "type"), *tid = sget(bl, "tool_use_id");
        const char *st = ty && !strcmp(ty, "tool_result") && tid ? sget(r->steer, tid) : NULL;
        if (!st) continue;
        char *t = content_text(bl);
        lg__buf_t nb = {0};
        lg__buf_printf(&nb, "%s\n\n[loopguard] %s", t ? t : "", st);
        if (nb.data) json_object_set_new(bl, "content", json_string(nb.data));
        lg__free(t);
        lg__buf_free(&nb);
      }
      json_array_append_new(msgs, m2 ? m2 : json_incref(m));
    } else {
      json_array_append(msgs, m);
    }
  }
  json_object_set_new(b, is_responses(c) ? "input" : "messages", msgs);
  if (c->model) json_object_set_new(b, "model", json_string(c->model));
  /* The cascade: the stuck tool hidden for a few model calls. */
  json_t *tools = json_object_get(b, "tools");
  if (r->hide_left > 0 && r->hide_tool && json_is_array(tools)) {
    json_t *kept = json_array();
    for (size_t i = 0; i < json_array_size(tools); i++) {
      json_t *t = json_array_get(tools, i);
      const char *nm = flat_tools(c) ? sget(t, "name") : sget(json_object_get(t, "function"), "name");
      if (!nm || strcmp(nm, r->hide_tool)) json_array_append(kept, t);
    }
    json_t *tc = json_object_get(b, "tool_choice");
    const char *forced = flat_tools(c) ? sget(tc, "name") : sget(json_object_get(tc, "function"), "name");
    if (forced && !strcmp(forced, r->hide_tool)) json_object_del(b, "tool_choice");
    if (json_array_size(kept)) {
      json_object_set_new(b, "tools", kept);
    } else { /* never tools: [] with tool calls in the conversation */
      json_decref(kept);
      json_object_set_new(b, "tool_choice", is_anthropic(c) ? json_pack("{s:s}", "type", "none")
                                                            : json_string("none"));
    }
  }
  if (c->stream && c->api == LG__GW_API_OPENAI) { /* usage settles the cost: asked for always */
    json_t *so = json_object_get(b, "stream_options");
    json_t *so2 = json_is_object(so) ? json_copy(so) : json_object();
    json_object_set_new(so2, "include_usage", json_true());
    json_object_set_new(b, "stream_options", so2);
  }
  return b;
}

/* ---- final answers ---- */

static void chunk_id(chat_t *c, char *buf, size_t n) {
  snprintf(buf, n, "chatcmpl-lg%lld", (long long)now_ms(c->cx));
}

/* Writes one Anthropic SSE event. */
static void a_event(chat_t *c, const char *type, json_t *data) {
  char *t = data ? lg__json_text(data, NULL) : NULL;
  lg__buf_t b = {0};
  lg__buf_printf(&b, "event: %s\ndata: %s\n\n", type, t ? t : "{}");
  if (b.data) lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
  lg__free(t);
  json_decref(data);
}

static void a_message_start(chat_t *c, const char *model) {
  if (c->a_started) return;
  c->a_started = 1;
  char id[64];
  snprintf(id, sizeof id, "msg_lg%lld", (long long)now_ms(c->cx));
  json_t *m = c->a_msg ? json_incref(c->a_msg)
                       : json_pack("{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:{s:i, s:i}}", "id", id,
                                   "type", "message", "role", "assistant", "content", "model", model,
                                   "stop_reason", "stop_sequence", "usage", "input_tokens", 0,
                                   "output_tokens", 0);
  a_event(c, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", m));
}

static void a_message_end(chat_t *c, const char *stop_reason) {
  a_event(c, "message_delta",
          json_pack("{s:s, s:{s:s, s:n}, s:{s:I}}", "type", "message_delta", "delta", "stop_reason",
                    stop_reason, "stop_sequence", "usage", "output_tokens", (json_int_t)c->a_out_tokens));
  a_event(c, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static void answer_final_anthropic(chat_t *c, const char *text, const char *model) {
  lg__gw_job_t *j = c->j;
  if (c->stream) {
    if (!c->streamed) {
      lg__gw_stream_start(j);
      c->streamed = 1;
    }
    a_message_start(c, model);
    int i = c->a_index++;
    a_event(c, "content_block_start",
            json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", i,
                      "content_block", "type", "text", "text", ""));
    a_event(c, "content_block_delta",
            json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", i, "delta",
                      "type", "text_delta", "text", text));
    a_event(c, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", i));
    a_message_end(c, "end_turn");
    return;
  }
  char id[64];
  snprintf(id, sizeof id, "msg_lg%lld", (long long)now_ms(c->cx));
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s}], s:s, s:n, s:{s:i, s:i}}", "id", id,
                        "type", "message", "role", "assistant", "model", model, "content", "type",
                        "text", "text", text, "stop_reason", "end_turn", "stop_sequence", "usage",
                        "input_tokens", 0, "output_tokens", 0);
  char *t = o ? lg__json_text(o, NULL) : NULL;
  j->status = 200;
  snprintf(j->ctype, sizeof j->ctype, "application/json");
  j->out.len = 0;
  if (t) lg__buf_puts(&j->out, t);
  lg__free(t);
  json_decref(o);
  lg__gw_answer(j);
}

static void register_key(chat_t *c, json_t *msg);
static void r_final_stream(chat_t *c, const char *text, json_t *resp);

static void answer_final_responses(chat_t *c, const char *text, const char *model) {
  lg__gw_job_t *j = c->j;
  char id[64], mid[64];
  int64_t t = now_ms(c->cx);
  snprintf(id, sizeof id, "resp_lg%lld%04d", (long long)t, (int)(lg__hash_str(c->r->id) % 10000));
  snprintf(mid, sizeof mid, "msg_lg%lld", (long long)t);
  json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}],"
                        " s:n, s:n, s:{s:i, s:i, s:i}}",
                        "id", id, "object", "response", "created_at", (json_int_t)(t / 1000),
                        "status", "completed", "model", model, "output", "type", "message", "id", mid,
                        "status", "completed", "role", "assistant", "content", "type", "output_text",
                        "text", text, "annotations", "error", "incomplete_details", "usage",
                        "input_tokens", 0, "output_tokens", 0, "total_tokens", 0);
  register_key(c, o);
  if (c->stream) {
    if (!c->streamed) {
      lg__gw_stream_start(j);
      c->streamed = 1;
    }
    r_final_stream(c, text, o);
    json_decref(o);
    return;
  }
  char *tx = o ? lg__json_text(o, NULL) : NULL;
  j->status = 200;
  snprintf(j->ctype, sizeof j->ctype, "application/json");
  j->out.len = 0;
  if (tx) lg__buf_puts(&j->out, tx);
  lg__free(tx);
  json_decref(o);
  lg__gw_answer(j);
}

/* The stop as a normal final assistant message. */
static void answer_final(chat_t *c, json_t *resp) {
  lg__gw_job_t *j = c->j;
  const char *text = c->stop_text ? c->stop_text : "I stopped.";
  lg__free(c->r->final_text);
  c->r->final_text = lg__strdup(text);
  raise_action(j, "stop", j->reason[0] ? j->reason : NULL);
  char id[64];
  chunk_id(c, id, sizeof id);
  const char *model = resp && sget(resp, "model") ? sget(resp, "model") : c->model ? c->model : "";
  if (is_anthropic(c)) {
    answer_final_anthropic(c, text, model);
    return;
  }
  if (is_responses(c)) {
    answer_final_responses(c, text, model);
    return;
  }
  if (c->stream) {
    if (!c->streamed) {
      lg__gw_stream_start(j);
      c->streamed = 1;
    }
    lg__buf_t b = {0};
    json_t *ch = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n}]}", "id", id,
                           "object", "chat.completion.chunk", "created",
                           (json_int_t)(now_ms(c->cx) / 1000), "model", model, "choices", "index", 0,
                           "delta", "role", "assistant", "content", text, "finish_reason");
    json_t *fin = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{}, s:s}]}", "id", id, "object",
                            "chat.completion.chunk", "created", (json_int_t)(now_ms(c->cx) / 1000),
                            "model", model, "choices", "index", 0, "delta", "finish_reason", "stop");
    char *t1 = ch ? lg__json_text(ch, NULL) : NULL, *t2 = fin ? lg__json_text(fin, NULL) : NULL;
    lg__buf_printf(&b, "data: %s\n\ndata: %s\n\n", t1 ? t1 : "{}", t2 ? t2 : "{}");
    if (c->client_usage) {
      json_t *u = json_pack("{s:s, s:s, s:I, s:s, s:[], s:O}", "id", id, "object",
                            "chat.completion.chunk", "created", (json_int_t)(now_ms(c->cx) / 1000),
                            "model", model, "choices", "usage",
                            c->usage ? c->usage : json_pack("{s:i,s:i,s:i}", "prompt_tokens", 0, "completion_tokens", 0, "total_tokens", 0));
      char *t3 = u ? lg__json_text(u, NULL) : NULL;
      lg__buf_printf(&b, "data: %s\n\n", t3 ? t3 : "{}");
      lg__free(t3);
      json_decref(u);
    }
    lg__buf_puts(&b, "data: [DONE]\n\n");
    if (b.data) lg__gw_stream_write(j, b.data, b.len);
    lg__buf_free(&b);
    lg__free(t1);
    lg__free(t2);
    json_decref(ch);
    json_decref(fin);
    return;
  }
  json_t *o = resp ? json_copy(resp) : json_object();
  if (!resp) {
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "object", json_string("chat.completion"));
    json_object_set_new(o, "created", json_integer(now_ms(c->cx) / 1000));
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "usage", json_pack("{s:i,s:i,s:i}", "prompt_tokens", 0,
                                              "completion_tokens", 0, "total_tokens", 0));
  }
  json_object_set_new(o, "choices",
                      json_pack("[{s:i, s:{s:s, s:s, s:n}, s:n, s:s}]", "index", 0, "message", "role",
                                "assistant", "content", text, "refusal", "logprobs",
                                "finish_reason", "stop"));
  char *t = lg__json_text(o, NULL);
  j->status = 200;
  snprintf(j->ctype, sizeof j->ctype, "application/json");
  j->out.len = 0;
  if (t) lg__buf_puts(&j->out, t);
  lg__free(t);
  json_decref(o);
  lg__gw_answer(j);
}

/* ---- one model call ---- */

/* The body again once the model decision said what to hide (never larger
 * than the one its worst case was taken from). Keeps the old one when
 * out of memory. */
static void rebuild_body(chat_t *c, char **btext, size_t *blen) {
  if (!c->r->hide_left) return;
  json_t *body = build_body(c);
  size_t n = 0;
  char *t = body ? lg__json_text(body, &n) : NULL;
  json_decref(body);
  if (!t) return;
  lg__free(*btext);
  *btext = t;
  *blen = n;
}

typedef struct model_out {
  int stop;                   /* the model call was refused: stop */
  int error;                  /* an error was answered */
  int64_t reservation;
} model_out_t;

static model_out_t model_event(chat_t *c, size_t body_len) {
  model_out_t mo = {0};
  json_t *mt = json_object_get(c->root, "max_completion_tokens");
  if (!mt) mt = json_object_get(c->root, "max_tokens");
  if (!mt) mt = json_object_get(c->root, "max_output_tokens");
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_MODEL;
  ev.u.model.m.model = c->model;
  ev.u.model.m.turn = c->r->turn + 1;
  ev.u.model.m.input_tokens = (int64_t)body_len; /* a token is at least one byte */
  ev.u.model.m.max_tokens = json_is_integer(mt) ? json_integer_value(mt) : -1;
  ev.u.model.m.output_tokens = -1;
  ev.u.model.m.cost_nusd = -1;
  lg__step_t st;
  lg__step_init(&st, &ev, now_ms(c->cx));
  lg_prices_t *pr = lg_price_book_get(c->cx->srv->prices);
  st.prices = pr;
  st.ttl_ms = lg__gw_keys_ttl(c->cx, c->ui); /* --reservation-ttl (keys.c) */
  lg_error_t e = {0};
  int rc = lg__gw_step(c->cx, c->r->id, &st, &e);
  json_t *a = rc ? NULL : answer_json(&st);
  if (rc) {
    mo.error = 1;
    if (st.fail == LG__STEP_UNPRICED)
      lg__gw_error(c->j, 400, "invalid_request_error", "model_not_priced",
                   "loopguard: this model call cannot be priced, and the run has a cost cap or "
                   "budget: %s",
                   e.message);
    else if (st.fail == LG__STEP_IN_FLIGHT)
      lg__gw_keys_refusal(c->j, &st.refusal, NULL);
    else
      lg__gw_error(c->j, 500, "server_error", NULL, "loopguard could not decide on this model call: %s",
                   e.message[0] ? e.message : lg_strerror(rc));
  } else if (st.budget_refused) { /* a shared budget: an error, not a stop */
    mo.error = 1;
    lg__gw_keys_refusal(c->j, &st.refusal, NULL);
  } else if (st.action == LG_ACT_STOP) {
    mo.stop = 1;
    const char *m = a ? sget(a, "message") : NULL;
    if (!c->stop_text) c->stop_text = lg__strdup(m ? m : "I stopped: the run reached a limit.");
    raise_action(c->j, "stop", a ? sget(a, "reason") : NULL);
    if (st.stopped_now) lg__gw_note_intervention(c->cx, c->r->id, "stop", a ? sget(a, "reason") : NULL, NULL, NULL);
  } else {
    const char *rid = a ? sget(a, "reservation_id") : NULL;
    mo.reservation = rid ? strtoll(rid, NULL, 10) : 0;
    c->r->turn++;
    /* The engine says what this model call must not be offered (the
     * cascade after a block: hide_turns counts down in the run). */
    json_t *ht = json_object_get(a, "hide_tools");
    lg__free(c->r->hide_tool);
    c->r->hide_tool = json_array_size(ht) ? lg__strdup(json_string_value(json_array_get(ht, 0))) : NULL;
    c->r->hide_left = c->r->hide_tool ? 1 : 0;
  }
  json_decref(a);
  lg_prices_free(pr);
  lg__step_clear(&st);
  return mo;
}

static void usage_event(chat_t *c, int64_t resv, json_t *usage, int failed, size_t body_len) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_USAGE;
  ev.u.usage.reservation = resv;
  json_t *pt = json_object_get(usage, "prompt_tokens"), *ct = json_object_get(usage, "completion_tokens");
  if (!pt) pt = json_object_get(usage, "input_tokens");
  if (!ct) ct = json_object_get(usage, "output_tokens");
  if (failed) { /* the provider answered an error or nothing: nothing charged */
    ev.u.usage.cost_nusd = 0;
  } else {
    ev.u.usage.input_tokens = json_is_integer(pt) ? json_integer_value(pt) : (int64_t)body_len;
    ev.u.usage.output_tokens = json_is_integer(ct) ? json_integer_value(ct) : 0;
    /* usage.cost when the upstream reports one (USD; charged at most the
     * reservation), else from the price table, else the worst case */
    ev.u.usage.cost_nusd = lg__gw_keys_usage_cost(usage);
  }
  lg__step_t st;
  lg__step_init(&st, &ev, now_ms(c->cx));
  lg_prices_t *pr = lg_price_book_get(c->cx->srv->prices);
  st.prices = pr;
  lg_error_t e = {0};
  lg__gw_step(c->cx, c->r->id, &st, &e);
  lg_prices_free(pr);
  lg__step_clear(&st);
}

/* ---- deciding a response's tool calls ---- */

typedef struct calls_out {
  json_t *kept;               /* the calls the client may run */
  int refused;                /* calls taken out */
  int stop;
} calls_out_t;

/* Decides the calls `tcs` (array of tool call objects) of one response
 * with text `content` (may be NULL). */
static calls_out_t decide_calls(chat_t *c, json_t *tcs, const char *content) {
  calls_out_t co = {json_array(), 0, 0};
  json_t *rest_calls = json_array(), *rest_results = json_array();
  for (size_t i = 0; i < json_array_size(tcs) && !co.stop; i++) {
    json_t *tc = json_array_get(tcs, i);
    json_t *fn = json_object_get(tc, "function");
    const char *name = sget(fn, "name"), *args = sget(fn, "arguments"), *id = sget(tc, "id");
    char *atext = NULL;
    if (is_responses(c)) { /* a function_call item */
      name = sget(tc, "name");
      args = sget(tc, "arguments");
      id = sget(tc, "call_id");
    }
    if (is_anthropic(c)) { /* a tool_use block */
      name = sget(tc, "name");
      json_t *in = json_object_get(tc, "input");
      args = atext = json_is_object(in) ? lg__json_text(in, NULL) : NULL;
      if (!args) args = sget(tc, "_args"); /* a stream's, as its deltas came */
    }
    lg_event_t ev;
    memset(&ev, 0, sizeof ev);
    ev.type = LG_EV_CALL;
    ev.u.call.tool = name ? name : "";
    ev.u.call.args = args && *args ? args : "{}";
    ev.u.call.args_len = strlen(ev.u.call.args);
    ev.u.call.turn = c->r->turn;
    ev.u.call.call_id = id;
    ev.u.call.agent = c->j->hdr_agent;
    lg__step_t st;
    lg__step_init(&st, &ev, now_ms(c->cx));
    lg_error_t e = {0};
    int rc = name ? lg__gw_step(c->cx, c->r->id, &st, &e) : -1;
    json_t *a = rc ? NULL : answer_json(&st);
    const char *reason = a ? sget(a, "reason") : NULL, *msg = a ? sget(a, "message") : NULL;
    if (rc || st.action == LG_ACT_EXECUTE) { /* undecidable (malformed): the client's to see */
      json_array_append(co.kept, tc);
      if (!rc && msg && id) {
        json_object_set_new(c->r->steer, id, json_string(msg));
        raise_action(c->j, "observe", "same_call_repeat");
        lg__gw_note_intervention(c->cx, c->r->id, "observe", reason, name, id);
      } else {
        raise_action(c->j, "execute", NULL);
      }
    } else if (st.action == LG_ACT_BLOCK || st.action == LG_ACT_REPLAY) {
      int replay = st.action == LG_ACT_REPLAY;
      co.refused++;
      json_array_append(rest_calls, tc);
      char *content_txt = NULL;
      if (replay) {
        json_t *sr = json_object_get(a, "saved_result");
        content_txt = json_is_string(sr) ? lg__strdup(json_string_value(sr)) : lg__json_text(sr, NULL);
      } else {
        lg__buf_t b = {0};
        lg__buf_printf(&b, "Error: loopguard did not run this call (%s). %s", reason ? reason : "blocked",
                       msg ? msg : "");
        content_txt = lg__buf_steal(&b, NULL);
      }
      if (is_responses(c))
        json_array_append_new(rest_results, json_pack("{s:s, s:s, s:s}", "type", "function_call_output",
                                                      "call_id", id ? id : "", "output",
                                                      content_txt ? content_txt : ""));
      else if (is_anthropic(c))
        json_array_append_new(rest_results, json_pack("{s:s, s:s, s:s, s:b}", "type", "tool_result",
                                                      "tool_use_id", id ? id : "", "content",
                                                      content_txt ? content_txt : "", "is_error", !replay));
      else
        json_array_append_new(rest_results, tool_msg(id, content_txt ? content_txt : ""));
      lg__free(content_txt);
      raise_action(c->j, replay ? "replay" : "block", reason);
      lg__gw_note_intervention(c->cx, c->r->id, replay ? "replay" : "block", reason, name, id);
    } else { /* stop */
      co.stop = 1;
      if (!c->stop_text) c->stop_text = lg__strdup(msg ? msg : "I stopped: the loop guard ended this run.");
      raise_action(c->j, "stop", reason);
      if (st.stopped_now) lg__gw_note_intervention(c->cx, c->r->id, "stop", reason, name, id);
    }
    json_decref(a);
    lg__step_clear(&st);
    lg__free(atext);
  }
  if (co.refused && !co.stop) { /* restored before the client's next message */
    json_t *am = NULL, *items = json_array();
    if (is_responses(c)) {
      json_array_extend(items, rest_calls);
      json_array_extend(items, rest_results);
    } else if (is_anthropic(c)) {
      json_t *blocks = json_array();
      if (!json_array_size(co.kept) && content && *content)
        json_array_append_new(blocks, json_pack("{s:s, s:s}", "type", "text", "text", content));
      for (size_t i = 0; i < json_array_size(rest_calls); i++) {
        json_t *tu = json_deep_copy(json_array_get(rest_calls, i));
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
      json_array_append_new(items, json_pack("{s:s, s:O}", "role", "user", "content", rest_results));
    } else {
    am = json_pack("{s:s, s:o, s:O}", "role", "assistant", "content",
                           json_array_size(co.kept) || !content ? json_null() : json_string(content),
                           "tool_calls", rest_calls);
    json_array_append_new(items, am);
    json_array_extend(items, rest_results);
    }
    lg__gw_run_t *r = c->r;
    if (r->nrs == r->caprs) {
      size_t cap = r->caprs ? r->caprs * 2 : 4;
      lg__gw_restore_t *v = lg__realloc(r->rs, cap * sizeof *v);
      if (v) {
        r->rs = v;
        r->caprs = cap;
      }
    }
    if (r->nrs < r->caprs) {
      /* The client sees the kept calls as this response; the refused ones
       * go before it, so the anchor is the end of the client's messages. */
      r->rs[r->nrs].anchor = c->n;
      r->rs[r->nrs].items = items;
      r->rs[r->nrs].resp_id = c->cur_resp_id ? lg__strdup(c->cur_resp_id) : NULL;
      r->nrs++;
    } else {
      json_decref(items);
    }
  }
  json_decref(rest_calls);
  json_decref(rest_results);
  return co;
}

/* ---- the exchange, non-stream ---- */

static int upstream_error(chat_t *c, lg__gw_http_t *x) {
  char lab[300];
  lg__gw_upstream_label(x->up, lab, sizeof lab);
  if (x->cc == CURLE_OPERATION_TIMEDOUT)
    lg__gw_error(c->j, 504, "upstream_timeout", "upstream_timeout", "upstream %s timed out: %s", lab,
                 x->errbuf);
  else
    lg__gw_error(c->j, 502, "upstream_error", "upstream_unreachable",
                 "upstream %s cannot be reached: %s", lab, x->errbuf);
  return -1;
}

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

static void register_key(chat_t *c, json_t *msg) {
  if (is_responses(c) && sget(msg, "id")) { /* previous_response_id finds the run */
    lg__buf_t b = {0};
    lg__buf_printf(&b, "resp:%s", sget(msg, "id"));
    if (b.data) lg__gw_key_put(c->cx->gw, b.data, c->r->id);
    lg__buf_free(&b);
    /* A stateless client sends the output back as items: the first call
     * or message of it is what its next request starts with. */
    json_t *items = json_object_get(msg, "output");
    json_t *first = NULL;
    for (size_t i = 0; !first && i < json_array_size(items); i++) {
      json_t *it = json_array_get(items, i);
      const char *ty = sget(it, "type"), *role = sget(it, "role");
      if ((ty && !strcmp(ty, "function_call")) || (role && !strcmp(role, "assistant"))) first = it;
    }
    msg = first;
  }
  if (c->j->hdr_run || first_assistant(c->messages) >= 0 || !msg) return;
  char *k = conv_key(c->messages, c->n, msg);
  if (k) lg__gw_key_put(c->cx->gw, k, c->r->id);
  lg__free(k);
}

/* The members of array obj[member] whose "type" is `type` (new array):
 * an Anthropic message's tool_use blocks, a Responses output's
 * function_call items. */
static json_t *items_of_type(json_t *obj, const char *member, const char *type) {
  json_t *out = json_array(), *items = json_object_get(obj, member);
  for (size_t i = 0; i < json_array_size(items); i++) {
    const char *ty = sget(json_array_get(items, i), "type");
    if (ty && !strcmp(ty, type)) json_array_append(out, json_array_get(items, i));
  }
  return out;
}
static json_t *tool_uses(json_t *msg) { return items_of_type(msg, "content", "tool_use"); }
static json_t *function_calls(json_t *resp) { return items_of_type(resp, "output", "function_call"); }

/* The output_text of a Responses output (new). */
static char *output_text(json_t *resp) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "");
  json_t *items = json_object_get(resp, "output");
  for (size_t i = 0; i < json_array_size(items); i++) {
    json_t *ct = json_object_get(json_array_get(items, i), "content");
    for (size_t k = 0; k < json_array_size(ct); k++) {
      const char *ty = sget(json_array_get(ct, k), "type");
      if (ty && !strcmp(ty, "output_text")) lg__buf_puts(&b, sget(json_array_get(ct, k), "text"));
    }
  }
  return lg__buf_steal(&b, NULL);
}

/* Takes the refused function_call items out of a Responses output. */
static void keep_items(json_t *resp, json_t *kept) {
  json_t *items = json_object_get(resp, "output"), *ni = json_array();
  for (size_t i = 0; i < json_array_size(items); i++) {
    json_t *it = json_array_get(items, i);
    const char *ty = sget(it, "type");
    int keep = !ty || strcmp(ty, "function_call");
    for (size_t k = 0; !keep && k < json_array_size(kept); k++) keep = json_array_get(kept, k) == it;
    if (keep) json_array_append(ni, it);
  }
  json_object_set_new(resp, "output", ni);
}

/* Takes the refused tool_use blocks out of msg's content. */
static void keep_blocks(json_t *msg, json_t *kept) {
  json_t *blocks = json_object_get(msg, "content"), *nb = json_array();
  for (size_t i = 0; i < json_array_size(blocks); i++) {
    json_t *bl = json_array_get(blocks, i);
    const char *ty = sget(bl, "type");
    int keep = !ty || strcmp(ty, "tool_use");
    for (size_t k = 0; !keep && k < json_array_size(kept); k++)
      keep = json_array_get(kept, k) == bl;
    if (keep) json_array_append(nb, bl);
  }
  json_object_set_new(msg, "content", nb);
}

static const char *api_path(const chat_t *c) {
  return is_anthropic(c) ? "/messages" : is_responses(c) ? "/responses" : "/chat/completions";
}

static void run_plain(chat_t *c) {
  lg__gw_job_t *j = c->j;
  const lg__gw_config_t *cfg = lg__gw_cfg(c->cx->gw);
  for (int ask = 0;; ask++) {
    c->r->hide_left = 0; /* the estimate: the largest body, nothing hidden */
    json_t *body = build_body(c);
    size_t blen = 0;
    char *btext = body ? lg__json_text(body, &blen) : NULL;
    json_decref(body);
    if (!btext) {
      lg__gw_error(j, 500, "server_error", NULL, "out of memory");
      return;
    }
    model_out_t mo = model_event(c, blen);
    if (mo.error) {
      lg__free(btext);
      lg__gw_answer(j);
      return;
    }
    if (mo.stop) {
      lg__free(btext);
      answer_final(c, NULL);
      return;
    }
    rebuild_body(c, &btext, &blen);
    lg__gw_http_t x = {0};
    x.up = &cfg->up[c->ui];
    x.method = "POST";
    x.path = api_path(c);
    x.body = btext;
    x.body_len = blen;
    x.headers = j->fwd;
    x.client_auth = j->auth;
    x.provider_key = j->provider_key;
    x.stop = lg__gw_stopflag(c->cx->gw);
    int rc = lg__gw_http_do(c->cx->curl, &x);
    lg__gw_note_upstream(c->cx->gw, c->ui, x.ns);
    lg__free(btext);
    if (rc) {
      usage_event(c, mo.reservation, NULL, 1, blen);
      upstream_error(c, &x);
      lg__gw_http_clear(&x);
      lg__gw_answer(j);
      return;
    }
    if (x.status != 200) { /* the provider's error, as it sent it */
      usage_event(c, mo.reservation, NULL, 1, blen);
      j->status = (int)x.status;
      snprintf(j->ctype, sizeof j->ctype, "%s", x.ctype[0] ? x.ctype : "application/json");
      lg__buf_t t = j->out;
      j->out = x.body_out;
      x.body_out = t;
      lg__gw_http_clear(&x);
      lg__gw_answer(j);
      return;
    }
    lg__json_begin();
    json_t *resp = json_loadb(x.body_out.data ? x.body_out.data : "", x.body_out.len, 0, NULL);
    if (lg__json_oom()) {
      json_decref(resp);
      resp = NULL;
    }
    json_t *choice = json_array_get(json_object_get(resp, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    if (is_anthropic(c)) msg = json_is_array(json_object_get(resp, "content")) ? resp : NULL;
    if (is_responses(c)) msg = json_is_array(json_object_get(resp, "output")) ? resp : NULL;
    c->cur_resp_id = sget(resp, "id");
    if (!json_is_object(msg)) {
      usage_event(c, mo.reservation, NULL, 0, blen);
      json_decref(resp);
      if (!resp) {
        lg__gw_error(j, 502, "upstream_error", "upstream_bad_response",
                     "upstream %s answered 200 with a body that is not JSON", cfg->up[c->ui].name);
        lg__gw_http_clear(&x);
        lg__gw_answer(j);
        return;
      }
      answer_json_obj(c, NULL, &x.body_out, 0); /* not ours to judge: as it is */
      lg__gw_http_clear(&x);
      return;
    }
    usage_event(c, mo.reservation, json_object_get(resp, "usage"), 0, blen);
    json_t *tcs = is_anthropic(c)    ? tool_uses(msg)
                  : is_responses(c) ? function_calls(msg)
                                    : json_incref(json_object_get(msg, "tool_calls"));
    if (!json_array_size(tcs)) {
      raise_action(j, "pass", NULL);
      register_key(c, msg);
      answer_json_obj(c, resp, &x.body_out, 0);
      json_decref(tcs);
      json_decref(resp);
      lg__gw_http_clear(&x);
      return;
    }
    char *atext = is_anthropic(c) ? content_text(msg) : is_responses(c) ? output_text(msg) : NULL;
    calls_out_t co = decide_calls(c, tcs, flat_tools(c) ? atext : sget(msg, "content"));
    lg__free(atext);
    json_decref(tcs);
    if (co.stop) {
      answer_final(c, resp);
    } else if (json_array_size(co.kept)) {
      if (co.refused && is_responses(c)) keep_items(msg, co.kept);
      else if (co.refused && is_anthropic(c)) keep_blocks(msg, co.kept);
      else if (co.refused) json_object_set(msg, "tool_calls", co.kept);
      register_key(c, msg);
      answer_json_obj(c, resp, &x.body_out, co.refused > 0);
    } else if (ask < c->max_reasks) { /* nothing left for the client: ask again */
      if (is_responses(c) && (c->prev_id || c->reask_prev) && sget(resp, "id")) {
        lg__free(c->reask_prev); /* the upstream keeps the conversation: continue it */
        c->reask_prev = lg__strdup(sget(resp, "id"));
      }
      json_decref(co.kept);
      json_decref(resp);
      lg__gw_http_clear(&x);
      continue;
    } else {
      stop_run(c, NULL);
      answer_final(c, resp);
    }
    json_decref(co.kept);
    json_decref(resp);
    lg__gw_http_clear(&x);
    return;
  }
}

/* ---- the exchange, streamed ---- */

static void stream_chunk_text(chat_t *c, json_t *chunk) {
  char *t = lg__json_text(chunk, NULL);
  if (!t) return;
  lg__buf_t b = {0};
  lg__buf_printf(&b, "data: %s\n\n", t);
  if (b.data) lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
  lg__free(t);
}

/* One SSE "data:" payload of the upstream's stream. */
static int a_on_event(chat_t *c, const char *data, size_t n, const char *raw, size_t rawn);
static int r_on_event(chat_t *c, const char *data, size_t n);

static int on_event(chat_t *c, const char *data, size_t n, const char *raw, size_t rawn) {
  if (is_anthropic(c)) return a_on_event(c, data, n, raw, rawn);
  if (is_responses(c)) return r_on_event(c, data, n);
  if (n == 6 && !memcmp(data, "[DONE]", 6)) {
    c->saw_done = 1;
    return 0;
  }
  lg__json_begin();
  json_t *ch = json_loadb(data, n, 0, NULL);
  if (lg__json_oom() || !ch) {
    json_decref(ch);
    return 0; /* not JSON: dropped */
  }
  json_t *u = json_object_get(ch, "usage");
  if (json_is_object(u)) {
    json_decref(c->usage);
    c->usage = json_incref(u);
  }
  json_t *choices = json_object_get(ch, "choices");
  json_t *choice = json_array_get(choices, 0);
  if (!choice) { /* the usage chunk: passed on only if the client asked */
    if (c->client_usage) {
      json_decref(c->last_chunk);
      c->last_chunk = json_incref(ch);
    }
    json_decref(ch);
    return 0;
  }
  json_decref(c->last_chunk);
  c->last_chunk = json_incref(ch);
  json_t *delta = json_object_get(choice, "delta");
  json_t *tcd = json_object_get(delta, "tool_calls");
  const char *fin = sget(choice, "finish_reason");
  if (fin) {
    lg__free(c->finish);
    c->finish = lg__strdup(fin);
  }
  for (size_t i = 0; json_is_array(tcd) && i < json_array_size(tcd); i++) {
    json_t *d = json_array_get(tcd, i);
    json_int_t idx = json_integer_value(json_object_get(d, "index"));
    while ((json_int_t)json_array_size(c->tcalls) <= idx)
      json_array_append_new(c->tcalls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", "", "type",
                                                 "function", "function", "name", "", "arguments", ""));
    json_t *acc = json_array_get(c->tcalls, (size_t)idx);
    json_t *afn = json_object_get(acc, "function");
    if (sget(d, "id")) json_object_set_new(acc, "id", json_string(sget(d, "id")));
    json_t *dfn = json_object_get(d, "function");
    const char *nm = sget(dfn, "name"), *ar = sget(dfn, "arguments");
    if (nm) {
      lg__buf_t b = {0};
      lg__buf_printf(&b, "%s%s", sget(afn, "name"), nm);
      json_object_set_new(afn, "name", json_string(b.data ? b.data : ""));
      lg__buf_free(&b);
    }
    if (ar) {
      lg__buf_t b = {0};
      lg__buf_printf(&b, "%s%s", sget(afn, "arguments"), ar);
      json_object_set_new(afn, "arguments", json_string(b.data ? b.data : ""));
      lg__buf_free(&b);
    }
  }
  const char *content = sget(delta, "content");
  if (content) lg__buf_puts(&c->text, content);
  /* Text and role deltas pass at once, as they came; tool call deltas and
   * the finish are held. */
  if (!json_is_array(tcd) && !fin) {
    lg__gw_stream_write(c->j, raw, rawn);
  } else if (content && *content) {
    json_t *cp = json_deep_copy(ch);
    json_t *cd = json_object_get(json_array_get(json_object_get(cp, "choices"), 0), "delta");
    json_object_del(cd, "tool_calls");
    json_object_set_new(json_array_get(json_object_get(cp, "choices"), 0), "finish_reason", json_null());
    stream_chunk_text(c, cp);
    json_decref(cp);
  }
  json_decref(ch);
  return 0;
}

static int on_stream_data(void *ud, const char *p, size_t n) {
  chat_t *c = ud;
  if (!c->streamed) {
    lg__gw_stream_start(c->j);
    c->streamed = 1;
  }
  if (atomic_load(&c->j->s_gone)) return 1; /* the client went away: stop reading */
  lg__buf_append(&c->line, p, n);
  /* Events end with a blank line. */
  for (;;) {
    char *d = c->line.data;
    size_t len = c->line.len;
    size_t end = 0, sep = 0;
    for (size_t i = 0; i + 1 < len; i++) {
      if (d[i] == '\n' && d[i + 1] == '\n') {
        end = i;
        sep = 2;
        break;
      }
      if (i + 3 < len && d[i] == '\r' && d[i + 1] == '\n' && d[i + 2] == '\r' && d[i + 3] == '\n') {
        end = i;
        sep = 4;
        break;
      }
    }
    if (!sep) break;
    /* The data lines of the event. */
    const char *ev = d;
    size_t evn = end;
    const char *dl = NULL;
    size_t dn = 0;
    for (size_t i = 0; i < evn;) {
      size_t k = i;
      while (k < evn && ev[k] != '\n') k++;
      size_t ll = k - i;
      if (ll && ev[i + ll - 1] == '\r') ll--;
      if (ll >= 5 && !memcmp(ev + i, "data:", 5)) {
        dl = ev + i + 5;
        dn = ll - 5;
        while (dn && *dl == ' ') dl++, dn--;
      }
      i = k + 1;
    }
    if (dl) {
      lg__buf_t raw = {0};
      lg__buf_append(&raw, d, end + sep);
      on_event(c, dl, dn, raw.data, raw.len);
      lg__buf_free(&raw);
    }
    memmove(d, d + end + sep, len - end - sep);
    c->line.len = len - end - sep;
  }
  return 0;
}

/* After the upstream's stream ended: the held calls decided and emitted. */
static int finish_stream(chat_t *c, int ask) {
  json_t *tcs = c->tcalls;
  if (!json_array_size(tcs)) {
    raise_action(c->j, "pass", NULL);
    json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", c->text.data ? c->text.data : "");
    register_key(c, m);
    json_decref(m);
    return 1;
  }
  const char *content = c->text.len ? c->text.data : NULL;
  calls_out_t co = decide_calls(c, tcs, content);
  int done = 1;
  if (co.stop) {
    answer_final(c, c->last_chunk);
    json_decref(co.kept);
    return 2;
  }
  if (json_array_size(co.kept)) {
    json_t *m = json_pack("{s:s, s:O}", "role", "assistant", "tool_calls", co.kept);
    register_key(c, m);
    json_decref(m);
    json_t *tmpl = c->last_chunk ? json_deep_copy(c->last_chunk) : json_object();
    json_t *calls = json_array();
    for (size_t i = 0; i < json_array_size(co.kept); i++) {
      json_t *k = json_deep_copy(json_array_get(co.kept, i));
      json_object_set_new(k, "index", json_integer((json_int_t)i));
      json_array_append_new(calls, k);
    }
    json_t *choices = json_pack("[{s:i, s:{s:o}, s:n}]", "index", 0, "delta", "tool_calls", calls,
                                "finish_reason");
    json_object_set_new(tmpl, "choices", choices);
    json_object_del(tmpl, "usage");
    stream_chunk_text(c, tmpl);
    json_decref(tmpl);
  } else if (ask < c->max_reasks) {
    done = 0;
  } else {
    stop_run(c, NULL);
    answer_final(c, c->last_chunk);
    done = 2;
  }
  json_decref(co.kept);
  return done;
}

static void end_stream(chat_t *c) {
  json_t *tmpl = c->last_chunk ? json_deep_copy(c->last_chunk) : json_object();
  const char *fin = json_array_size(c->tcalls) ? "tool_calls" : c->finish ? c->finish : "stop";
  json_object_set_new(tmpl, "choices",
                      json_pack("[{s:i, s:{}, s:s}]", "index", 0, "delta", "finish_reason", fin));
  json_object_del(tmpl, "usage");
  stream_chunk_text(c, tmpl);
  json_decref(tmpl);
  if (c->client_usage && c->usage) {
    json_t *u = c->last_chunk ? json_deep_copy(c->last_chunk) : json_object();
    json_object_set_new(u, "choices", json_array());
    json_object_set(u, "usage", c->usage);
    stream_chunk_text(c, u);
    json_decref(u);
  }
  lg__gw_stream_write(c->j, "data: [DONE]\n\n", 14);
}

/* ---- Anthropic streams ---- */

static int a_map_get(chat_t *c, json_int_t idx) {
  char k[32];
  snprintf(k, sizeof k, "%lld", (long long)idx);
  json_t *v = json_object_get(c->a_map, k);
  return v ? (int)json_integer_value(v) : -1000000;
}

static void a_forward(chat_t *c, const char *type, json_t *ch, int index) {
  json_t *cp = json_copy(ch);
  if (index >= 0) json_object_set_new(cp, "index", json_integer(index));
  a_event(c, type, cp);
}

static int a_on_event(chat_t *c, const char *data, size_t n, const char *raw, size_t rawn) {
  (void)raw, (void)rawn;
  lg__json_begin();
  json_t *ch = json_loadb(data, n, 0, NULL);
  if (lg__json_oom() || !json_is_object(ch)) {
    json_decref(ch);
    return 0;
  }
  const char *type = sget(ch, "type");
  json_int_t idx = json_integer_value(json_object_get(ch, "index"));
  if (!type) {
  } else if (!strcmp(type, "message_start")) {
    json_t *m = json_object_get(ch, "message");
    if (!c->a_msg && json_is_object(m)) c->a_msg = json_incref(m);
    json_decref(c->usage);
    c->usage = json_pack("{s:O?}", "input_tokens", json_object_get(json_object_get(m, "usage"), "input_tokens"));
    a_message_start(c, c->model ? c->model : "");
  } else if (!strcmp(type, "content_block_start")) {
    json_t *cb = json_object_get(ch, "content_block");
    const char *ty = sget(cb, "type");
    char k[32];
    snprintf(k, sizeof k, "%lld", (long long)idx);
    if (ty && !strcmp(ty, "tool_use")) { /* held until decided */
      int t = (int)json_array_size(c->tcalls);
      json_array_append_new(c->tcalls, json_pack("{s:s, s:s, s:s, s:s}", "type", "tool_use", "id",
                                                 sget(cb, "id") ? sget(cb, "id") : "", "name",
                                                 sget(cb, "name") ? sget(cb, "name") : "", "_args", ""));
      json_object_set_new(c->a_map, k, json_integer(-1 - t));
    } else {
      int ci = c->a_index++;
      json_object_set_new(c->a_map, k, json_integer(ci));
      a_forward(c, type, ch, ci);
    }
  } else if (!strcmp(type, "content_block_delta") || !strcmp(type, "content_block_stop")) {
    int m = a_map_get(c, idx);
    json_t *d = json_object_get(ch, "delta");
    if (m <= -1 && m > -1000000) {
      json_t *tu = json_array_get(c->tcalls, (size_t)(-1 - m));
      const char *pj = sget(d, "partial_json");
      if (tu && pj) {
        lg__buf_t b = {0};
        lg__buf_printf(&b, "%s%s", sget(tu, "_args"), pj);
        json_object_set_new(tu, "_args", json_string(b.data ? b.data : ""));
        lg__buf_free(&b);
      }
    } else if (m >= 0) {
      const char *tx = sget(d, "text");
      if (tx) lg__buf_puts(&c->text, tx);
      a_forward(c, type, ch, m);
    }
  } else if (!strcmp(type, "message_delta")) {
    const char *sr = sget(json_object_get(ch, "delta"), "stop_reason");
    if (sr) {
      lg__free(c->finish);
      c->finish = lg__strdup(sr);
    }
    json_t *ot = json_object_get(json_object_get(ch, "usage"), "output_tokens");
    if (json_is_integer(ot)) {
      c->a_out_tokens += json_integer_value(ot);
      if (c->usage) json_object_set(c->usage, "output_tokens", ot);
    }
  } else if (!strcmp(type, "message_stop")) {
    c->saw_done = 1;
  } else { /* ping, error: as they came */
    a_event(c, type, json_incref(ch));
  }
  json_decref(ch);
  return 0;
}

static int a_finish_stream(chat_t *c, int ask) {
  json_t *tcs = c->tcalls;
  if (!json_array_size(tcs)) {
    raise_action(c->j, "pass", NULL);
    json_t *m = json_pack("{s:s, s:[{s:s, s:s}]}", "role", "assistant", "content", "type", "text",
                          "text", c->text.data ? c->text.data : "");
    register_key(c, m);
    json_decref(m);
    return 1;
  }
  calls_out_t co = decide_calls(c, tcs, c->text.len ? c->text.data : NULL);
  int done = 1;
  if (co.stop) {
    answer_final(c, NULL);
    done = 2;
  } else if (json_array_size(co.kept)) {
    json_t *blocks = json_array();
    for (size_t i = 0; i < json_array_size(co.kept); i++) {
      json_t *tu = json_array_get(co.kept, i);
      int ci = c->a_index++;
      a_event(c, "content_block_start",
              json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type", "content_block_start", "index",
                        ci, "content_block", "type", "tool_use", "id", sget(tu, "id"), "name",
                        sget(tu, "name"), "input"));
      a_event(c, "content_block_delta",
              json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", ci,
                        "delta", "type", "input_json_delta", "partial_json", sget(tu, "_args")));
      a_event(c, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", ci));
      json_array_append_new(blocks, json_pack("{s:s, s:s}", "type", "tool_use", "id", sget(tu, "id")));
    }
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", blocks);
    register_key(c, m);
    json_decref(m);
    lg__free(c->finish);
    c->finish = lg__strdup("tool_use");
  } else if (ask < c->max_reasks) {
    done = 0;
  } else {
    stop_run(c, NULL);
    answer_final(c, NULL);
    done = 2;
  }
  json_decref(co.kept);
  return done;
}

static void a_end_stream(chat_t *c) {
  a_message_start(c, c->model ? c->model : "");
  const char *fin = c->finish && strcmp(c->finish, "tool_use") ? c->finish : "end_turn";
  if (c->finish && !strcmp(c->finish, "tool_use")) {
    /* tool_use only when calls were emitted: finish_stream says so */
    fin = "tool_use";
  }
  a_message_end(c, fin);
}

/* ---- Responses streams ---- */

/* Writes one Responses event with the client's own sequence number. */
static void r_event(chat_t *c, json_t *ev) {
  const char *type = sget(ev, "type");
  json_object_set_new(ev, "sequence_number", json_integer(c->r_seq++));
  char *t = lg__json_text(ev, NULL);
  lg__buf_t b = {0};
  lg__buf_printf(&b, "event: %s\ndata: %s\n\n", type ? type : "message", t ? t : "{}");
  if (b.data) lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
  lg__free(t);
  json_decref(ev);
}

static int r_on_event(chat_t *c, const char *data, size_t n) {
  lg__json_begin();
  json_t *ev = json_loadb(data, n, 0, NULL);
  if (lg__json_oom() || !json_is_object(ev)) {
    json_decref(ev);
    return 0;
  }
  const char *type = sget(ev, "type");
  json_int_t oi = json_integer_value(json_object_get(ev, "output_index"));
  char k[32];
  snprintf(k, sizeof k, "%lld", (long long)oi);
  if (!type) {
    json_decref(ev);
  } else if (!strcmp(type, "response.created") || !strcmp(type, "response.in_progress")) {
    if (c->r_started > 1 || (c->r_started && !strcmp(type, "response.created"))) json_decref(ev);
    else {
      c->r_started++;
      r_event(c, ev);
    }
  } else if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete")) {
    json_decref(c->r_done);
    c->r_done = json_incref(json_object_get(ev, "response"));
    json_decref(c->usage);
    c->usage = json_incref(json_object_get(c->r_done, "usage"));
    c->saw_done = 1;
    json_decref(ev);
  } else if (!strcmp(type, "response.output_item.added")) {
    json_t *it = json_object_get(ev, "item");
    const char *ity = sget(it, "type");
    if (ity && !strcmp(ity, "function_call")) { /* held until decided */
      json_object_set_new(c->a_map, k, json_integer(-1));
      json_decref(ev);
    } else {
      int ci = c->r_index++;
      json_object_set_new(c->a_map, k, json_integer(ci));
      json_object_set_new(ev, "output_index", json_integer(ci));
      r_event(c, ev);
    }
  } else if (json_object_get(ev, "output_index")) {
    int m = a_map_get(c, oi);
    if (m < 0) {
      json_decref(ev); /* a held call's deltas, or an item never announced */
    } else {
      const char *d = !strcmp(type, "response.output_text.delta") ? sget(ev, "delta") : NULL;
      if (d) lg__buf_puts(&c->text, d);
      json_object_set_new(ev, "output_index", json_integer(m));
      r_event(c, ev);
    }
  } else { /* errors and the rest: as they came */
    r_event(c, ev);
  }
  return 0;
}

/* The calls of the completed response decided; the kept ones emitted,
 * then response.completed listing only what the client may run. */
static int r_finish_stream(chat_t *c, int ask) {
  json_t *done = c->r_done;
  if (!done) return 1;
  c->cur_resp_id = sget(done, "id");
  json_t *tcs = function_calls(done);
  int rc = 1;
  calls_out_t co = {NULL, 0, 0};
  if (json_array_size(tcs)) {
    co = decide_calls(c, tcs, c->text.len ? c->text.data : NULL);
    if (co.stop) {
      json_decref(co.kept);
      json_decref(tcs);
      answer_final(c, NULL);
      return 2;
    }
    if (!json_array_size(co.kept)) {
      json_decref(co.kept);
      json_decref(tcs);
      if (ask < c->max_reasks) {
        if (c->prev_id || c->reask_prev) {
          lg__free(c->reask_prev);
          c->reask_prev = lg__strdup(sget(done, "id"));
        }
        return 0;
      }
      stop_run(c, NULL);
      answer_final(c, NULL);
      return 2;
    }
    for (size_t i = 0; i < json_array_size(co.kept); i++) {
      json_t *it = json_array_get(co.kept, i);
      int ci = c->r_index++;
      r_event(c, json_pack("{s:s, s:i, s:O}", "type", "response.output_item.added", "output_index", ci, "item", it));
      r_event(c, json_pack("{s:s, s:s?, s:i, s:s?}", "type", "response.function_call_arguments.done",
                           "item_id", sget(it, "id"), "output_index", ci, "arguments", sget(it, "arguments")));
      r_event(c, json_pack("{s:s, s:i, s:O}", "type", "response.output_item.done", "output_index", ci, "item", it));
    }
    if (co.refused) keep_items(done, co.kept);
    json_decref(co.kept);
  } else {
    raise_action(c->j, "pass", NULL);
  }
  json_decref(tcs);
  register_key(c, done);
  r_event(c, json_pack("{s:s, s:O}", "type", "response.completed", "response", done));
  return rc;
}

/* Ends a Responses stream the gateway must end early: response.completed
 * with what the upstream completed, or an empty incomplete response. */
static void r_end_stream(chat_t *c) {
  json_t *resp = c->r_done ? json_incref(c->r_done)
                           : json_pack("{s:s, s:s, s:s, s:[]}", "id", "resp_lg_incomplete", "object",
                                       "response", "status", "incomplete", "output");
  r_event(c, json_pack("{s:s, s:o}", "type", "response.completed", "response", resp));
}

/* A final message as Responses events (a stop). */
static void r_final_stream(chat_t *c, const char *text, json_t *resp) {
  char mid[64];
  snprintf(mid, sizeof mid, "msg_lg%lld", (long long)now_ms(c->cx));
  if (!c->r_started) {
    c->r_started = 2;
    json_t *r0 = json_deep_copy(resp);
    json_object_set_new(r0, "status", json_string("in_progress"));
    json_object_set_new(r0, "output", json_array());
    r_event(c, json_pack("{s:s, s:o}", "type", "response.created", "response", r0));
  }
  int ci = c->r_index++;
  json_t *item = json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}", "type", "message", "id", mid,
                           "status", "completed", "role", "assistant", "content", "type",
                           "output_text", "text", text, "annotations");
  r_event(c, json_pack("{s:s, s:i, s:O}", "type", "response.output_item.added", "output_index", ci, "item", item));
  r_event(c, json_pack("{s:s, s:s, s:i, s:i, s:s}", "type", "response.output_text.delta", "item_id", mid,
                       "output_index", ci, "content_index", 0, "delta", text));
  r_event(c, json_pack("{s:s, s:s, s:i, s:i, s:s}", "type", "response.output_text.done", "item_id", mid,
                       "output_index", ci, "content_index", 0, "text", text));
  r_event(c, json_pack("{s:s, s:i, s:O}", "type", "response.output_item.done", "output_index", ci, "item", item));
  json_decref(item);
  r_event(c, json_pack("{s:s, s:O}", "type", "response.completed", "response", resp));
}

static void run_stream(chat_t *c) {
  lg__gw_job_t *j = c->j;
  const lg__gw_config_t *cfg = lg__gw_cfg(c->cx->gw);
  for (int ask = 0;; ask++) {
    c->r->hide_left = 0; /* the estimate: the largest body, nothing hidden */
    json_t *body = build_body(c);
    size_t blen = 0;
    char *btext = body ? lg__json_text(body, &blen) : NULL;
    json_decref(body);
    if (!btext) {
      lg__gw_error(j, 500, "server_error", NULL, "out of memory");
      if (!c->streamed) lg__gw_answer(j);
      return;
    }
    model_out_t mo = model_event(c, blen);
    if (mo.error || mo.stop) {
      lg__free(btext);
      if (mo.stop) answer_final(c, c->last_chunk);
      else if (!c->streamed) lg__gw_answer(j);
      else if (is_anthropic(c)) a_end_stream(c);
      else if (is_responses(c)) r_end_stream(c);
      else end_stream(c);
      return;
    }
    rebuild_body(c, &btext, &blen);
    json_decref(c->tcalls);
    c->tcalls = json_array();
    json_decref(c->a_map);
    c->a_map = json_object();
    lg__free(c->finish);
    c->finish = NULL;
    json_decref(c->usage);
    c->usage = NULL;
    c->saw_done = 0;
    c->text.len = 0;
    c->line.len = 0;
    lg__free(c->finish);
    c->finish = NULL;
    lg__gw_http_t x = {0};
    x.up = &cfg->up[c->ui];
    x.method = "POST";
    x.path = api_path(c);
    x.body = btext;
    x.body_len = blen;
    x.headers = j->fwd;
    x.client_auth = j->auth;
    x.provider_key = j->provider_key;
    x.stop = lg__gw_stopflag(c->cx->gw);
    x.on_data = on_stream_data;
    x.ud = c;
    int rc = lg__gw_http_do(c->cx->curl, &x);
    lg__gw_note_upstream(c->cx->gw, c->ui, x.ns);
    lg__free(btext);
    if (rc || x.status != 200) {
      usage_event(c, mo.reservation, NULL, 1, blen);
      if (c->streamed) { /* mid-stream: end it the way the API ends one */
        if (is_anthropic(c)) a_end_stream(c);
        else if (is_responses(c)) r_end_stream(c);
        else end_stream(c);
        return;
      }
      if (rc) upstream_error(c, &x);
      else {
        j->status = (int)x.status;
        snprintf(j->ctype, sizeof j->ctype, "%s", x.ctype[0] ? x.ctype : "application/json");
        lg__buf_t t = j->out;
        j->out = x.body_out;
        x.body_out = t;
      }
      lg__gw_http_clear(&x);
      lg__gw_answer(j);
      return;
    }
    lg__gw_http_clear(&x);
    usage_event(c, mo.reservation, c->usage, 0, blen);
    if (!c->streamed) {
      lg__gw_stream_start(j);
      c->streamed = 1;
    }
    int done = is_anthropic(c)    ? a_finish_stream(c, ask)
               : is_responses(c) ? r_finish_stream(c, ask)
                                 : finish_stream(c, ask);
    if (done == 2) return; /* the final message ended the stream */
    if (done) {
      if (is_anthropic(c)) a_end_stream(c);
      else if (!is_responses(c)) end_stream(c);
      return;
    }
    json_decref(c->r_done);
    c->r_done = NULL;
  }
}

/* ---- the route ---- */

void lg__gw_chat(lg__gw_ctx_t *cx) {
  lg__gw_job_t *j = cx->j;
  chat_t c;
  memset(&c, 0, sizeof c);
  c.cx = cx;
  c.j = j;
  c.max_reasks = (int)cx->srv->default_policy->gw_max_reasks;
  c.api = j->kind == LG__GW_MESSAGES    ? LG__GW_API_ANTHROPIC
          : j->kind == LG__GW_RESPONSES ? API_RESPONSES
                                        : LG__GW_API_OPENAI;
  lg__json_begin();
  json_error_t je;
  c.root = json_loadb(j->body, j->body_len, 0, &je);
  if (lg__json_oom()) {
    json_decref(c.root);
    lg__gw_error(j, 500, "server_error", NULL, "out of memory");
    lg__gw_answer(j);
    return;
  }
  if (!json_is_object(c.root)) {
    lg__gw_error(j, 400, "invalid_request_error", "invalid_json",
                 "the body is not a JSON object (line %d, column %d: %s)", je.line, je.column,
                 c.root ? "not an object" : je.text);
    goto out;
  }
  c.messages = json_object_get(c.root, is_responses(&c) ? "input" : "messages");
  if (is_responses(&c) && json_is_string(c.messages)) { /* input: "text" is one user message */
    c.input_wrap = json_pack("[{s:s, s:O}]", "role", "user", "content", c.messages);
    c.messages = c.input_wrap;
  }
  if (!json_is_array(c.messages)) {
    lg__gw_error(j, 400, "invalid_request_error", "invalid_value", "%s: expected an array",
                 is_responses(&c) ? "input" : "messages");
    goto out;
  }
  c.prev_id = is_responses(&c) ? sget(c.root, "previous_response_id") : NULL;

  c.n = json_array_size(c.messages);
  c.stream = json_is_true(json_object_get(c.root, "stream"));
  c.client_usage = json_is_true(json_object_get(json_object_get(c.root, "stream_options"), "include_usage"));
  const char *model = sget(c.root, "model");
  c.ui = lg__gw_config_pick(lg__gw_cfg(cx->gw), model, is_anthropic(&c), &c.model);
  j->upstream = c.ui;
  if (j->hdr_run && !valid_id(j->hdr_run)) {
    lg__gw_error(j, 400, "invalid_request_error", "invalid_run",
                 "X-Loopguard-Run: expected a run id of printable characters without '/'");
    goto out;
  }
  char *key = NULL;
  long a = first_assistant(c.messages);
  if (!j->hdr_run && c.prev_id) {
    lg__buf_t kb = {0};
    lg__buf_printf(&kb, "resp:%s", c.prev_id);
    key = lg__buf_steal(&kb, NULL);
  } else if (!j->hdr_run && a >= 0) {
    key = conv_key(c.messages, (size_t)a, NULL);
  }
  lg_error_t e = {0};
  c.r = lg__gw_run_get(cx, j->hdr_run, key, &e);
  lg__free(key);
  if (!c.r) {
    lg__gw_error(j, 500, "server_error", NULL, "loopguard could not create the run: %s",
                 e.message[0] ? e.message : lg_strerror(e.code));
    goto out;
  }
  snprintf(j->run_id, sizeof j->run_id, "%s", c.r->id);
  /* A retry of the last request (same body, soon after): the same answer,
   * not a second model call. */
  uint64_t h = lg__hash_str(j->body);
  if (!c.stream && c.r->last_hash == h && c.r->last_body.len &&
      now_ms(cx) - c.r->last_ms < RETRY_WINDOW_MS) {
    j->status = c.r->last_status;
    snprintf(j->ctype, sizeof j->ctype, "application/json");
    lg__buf_append(&j->out, c.r->last_body.data, c.r->last_body.len);
    j->action = NULL;
    raise_action(j, c.r->last_action[0] ? c.r->last_action : "pass", c.r->last_reason);
    lg__gw_answer(j);
    goto out;
  }
  /* What is new since the last request: the results. */
  if (c.n < c.r->fed) c.r->fed = c.n; /* a shorter conversation: trimmed */
  /* Responses with previous_response_id: the input is only what is new. */
  for (size_t i = c.prev_id ? 0 : c.r->fed; i < c.n; i++) {
    json_t *m = json_array_get(c.messages, i);
    const char *role = sget(m, "role");
    if (is_responses(&c)) {
      const char *ty = sget(m, "type");
      if (ty && !strcmp(ty, "function_call_output")) {
        json_t *tmp = json_pack("{s:O?}", "content", json_object_get(m, "output"));
        feed_result(&c, sget(m, "call_id"), tmp, 0);
        json_decref(tmp);
      }
      continue;
    }
    if (!is_anthropic(&c)) {
      if (role && !strcmp(role, "tool")) feed_result(&c, sget(m, "tool_call_id"), m, 0);
      continue;
    }
    json_t *blocks = json_object_get(m, "content");
    for (size_t k = 0; role && !strcmp(role, "user") && k < json_array_size(blocks); k++) {
      json_t *bl = json_array_get(blocks, k);
      const char *ty = sget(bl, "type");
      if (ty && !strcmp(ty, "tool_result"))
        feed_result(&c, sget(bl, "tool_use_id"), bl, json_is_true(json_object_get(bl, "is_error")));
    }
  }
  c.r->fed = c.n;
  if (c.r->final_text && !c.stop_text) c.stop_text = lg__strdup(c.r->final_text);
  if (!c.stop_text && lg__gw_keys_model(cx, c.r->id, c.root, c.model, c.ui, j->body_len)) {
    /* refused by the key (keys.c): answered */
  } else if (c.stop_text) {
    answer_final(&c, NULL);
  } else if (c.stream) {
    run_stream(&c);
  } else {
    run_plain(&c);
  }
  if (!c.stream && j->answered && j->status == 200) { /* kept for a retry */
    c.r->last_hash = h;
    c.r->last_ms = now_ms(cx);
    c.r->last_status = j->status;
    c.r->last_body.len = 0;
    lg__buf_append(&c.r->last_body, j->out.data, j->out.len);
    snprintf(c.r->last_action, sizeof c.r->last_action, "%s", j->action ? j->action : "");
    snprintf(c.r->last_reason, sizeof c.r->last_reason, "%s", j->reason);
  }
out:
  if (!j->action && j->run_id[0]) j->action = "pass";
  if (c.r) lg__gw_run_unlock(c.r);
  if (!j->answered && !c.streamed) lg__gw_answer(j);
  json_decref(c.root);
  json_decref(c.tcalls);
  json_decref(c.last_chunk);
  json_decref(c.usage);
  json_decref(c.a_map);
  json_decref(c.a_msg);
  json_decref(c.input_wrap);
  json_decref(c.r_done);
  lg__free(c.reask_prev);
  lg__buf_free(&c.line);
  lg__buf_free(&c.text);
  lg__free(c.finish);
  lg__free(c.new_key);
  lg__free(c.stop_text);
}
