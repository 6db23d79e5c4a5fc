/*
 * completions.c — the OpenAI Chat Completions wire format of the gateway
 * (POST /v1/chat/completions): the stop's final message, the reader of an
 * upstream stream (text and role deltas forwarded as they came, tool call
 * deltas held until decided) and the end of the client's stream
 * (finish_reason, the usage chunk when asked for, [DONE]). The
 * conversation itself is chat.c's.
 */
#include "conv.h"

#include <stdio.h>

static void chunk_id(chat_t *c, char *buf, size_t n) {
  snprintf(buf, n, "chatcmpl-lg%lld", (long long)now_ms(c->cx));
}

/* Chat Completions: the final message as the stream's last chunks. */
void lg__gwo_final_stream(chat_t *c, const char *text, const char *model) {
  char id[64];
  chunk_id(c, id, sizeof id);
  json_int_t created = (json_int_t)(now_ms(c->cx) / 1000);
  lg__gwc_begin_stream(c);
  lg__buf_t b = {0};
  json_t *ch = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n}]}", "id", id, "object",
                         "chat.completion.chunk", "created", created, "model", model, "choices",
                         "index", 0, "delta", "role", "assistant", "content", text, "finish_reason");
  json_t *fin = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{}, s:s}]}", "id", id, "object",
                          "chat.completion.chunk", "created", created, "model", model, "choices",
                          "index", 0, "delta", "finish_reason", "stop");
  char *t1 = ch ? lg__json_text(ch, NULL) : NULL, *t2 = fin ? lg__json_text(fin, NULL) : NULL;
  lg__buf_printf(&b, "data: %s\n\ndata: %s\n\n", t1 ? t1 : "{}", t2 ? t2 : "{}");
  if (c->client_usage) {
    json_t *zero = lg__gwc_usage(c, 0, 0);
    json_t *u = json_pack("{s:s, s:s, s:I, s:s, s:[], s:O}", "id", id, "object",
                          "chat.completion.chunk", "created", created, "model", model, "choices",
                          "usage", c->usage ? c->usage : zero);
    char *t3 = u ? lg__json_text(u, NULL) : NULL;
    lg__buf_printf(&b, "data: %s\n\n", t3 ? t3 : "{}");
    lg__free(t3);
    json_decref(u);
    json_decref(zero);
  }
  lg__buf_puts(&b, "data: [DONE]\n\n");
  if (b.data) lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
  lg__free(t1);
  lg__free(t2);
  json_decref(ch);
  json_decref(fin);
}

/* Chat Completions: the final message as the whole answer (the upstream's
 * response `resp` with its choices replaced, or one of ours). */
void lg__gwo_final_plain(chat_t *c, const char *text, const char *model, json_t *resp) {
  char id[64];
  chunk_id(c, id, sizeof id);
  json_t *o = resp ? json_copy(resp) : json_object();
  if (!resp) {
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "object", json_string("chat.completion"));
    json_object_set_new(o, "created", json_integer(now_ms(c->cx) / 1000));
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "usage", lg__gwc_usage(c, 0, 0));
  }
  json_object_set_new(o, "choices",
                      json_pack("[{s:i, s:{s:s, s:s, s:n}, s:n, s:s}]", "index", 0, "message", "role",
                                "assistant", "content", text, "refusal", "logprobs",
                                "finish_reason", "stop"));
  lg__gwc_answer_body(c, o);
  json_decref(o);
}

static void stream_chunk_text(chat_t *c, json_t *chunk) {
  char *t = lg__json_text(chunk, NULL);
  if (!t) return;
  lg__buf_t b = {0};
  lg__buf_printf(&b, "data: %s\n\n", t);
  if (b.data) lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
  lg__free(t);
}

/* The most tool calls one streamed answer holds: a delta's index past it
 * (or below 0) is not the API's, and is dropped, as an event that is not
 * JSON is: the held calls are an array indexed by it. */
#define MAX_STREAM_CALLS 256

/* Where a tool call delta without an `index` goes (Gemini's
 * OpenAI-compatible stream omits it, each call whole in a delta): a delta
 * with an id no held call has starts a call; one with a held call's id
 * goes to it; one without an id (a signature alone) to the last call. */
static json_int_t unindexed_call(chat_t *c, const char *id) {
  size_t n = json_array_size(c->tcalls);
  if (!id || !*id) return n ? (json_int_t)n - 1 : 0;
  for (size_t k = 0; k < n; k++) {
    const char *had = sget(json_array_get(c->tcalls, k), "id");
    if (had && !strcmp(had, id)) return (json_int_t)k;
  }
  return (json_int_t)n;
}

static void legacy_delta(chat_t *c, json_t *delta);

/* Chat Completions: a chunk's tool call deltas added to the held calls
 * (by their index), until the stream ends. A delta's members other than
 * the API's own (Gemini's extra_content, the thought signature it wants
 * back with the call) are kept on the call as they last came, as the
 * openai SDK's accumulator keeps them. A custom tool's call (a delta of
 * type "custom", or with a "custom" member) is held as a function's is,
 * its custom.input and custom.name joined as the pieces come (the SDKs'
 * types do not say how one streams: this is a function's way). */
static void hold_call_deltas(chat_t *c, json_t *tcd) {
  for (size_t i = 0; i < json_array_size(tcd); i++) {
    json_t *d = json_array_get(tcd, i), *jix = json_object_get(d, "index");
    json_int_t idx = json_integer_value(jix);
    if (!jix) idx = unindexed_call(c, sget(d, "id"));
    if (idx < 0 || idx >= MAX_STREAM_CALLS) continue;
    while ((json_int_t)json_array_size(c->tcalls) <= idx)
      if (json_array_append_new(c->tcalls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", "", "type", "function",
                                                     "function", "name", "", "arguments", "")))
        break; /* out of memory: the delta is lost, the loop is not endless */
    json_t *acc = json_array_get(c->tcalls, (size_t)idx);
    if (sget(d, "id")) json_object_set(acc, "id", json_object_get(d, "id"));
    const char *dty = sget(d, "type");
    json_t *dcu = json_object_get(d, "custom");
    int custom = (dty && !strcmp(dty, "custom")) || json_is_object(dcu);
    if (custom && !json_object_get(acc, "custom")) {
      json_object_set_new(acc, "type", json_string("custom"));
      json_object_del(acc, "function");
      json_object_set_new(acc, "custom", json_pack("{s:s, s:s}", "name", "", "input", ""));
    }
    const char *k;
    json_t *v;
    json_object_foreach(d, k, v) {
      if (strcmp(k, "index") && strcmp(k, "id") && strcmp(k, "type") && strcmp(k, "function") &&
          strcmp(k, "custom"))
        json_object_set(acc, k, v);
    }
    json_t *dfn = custom ? dcu : json_object_get(d, "function");
    const char *nm = sget(dfn, "name"), *ar = sget(dfn, custom ? "input" : "arguments");
    if (nm) lg__gwc_held(c, (size_t)idx, LG__HELD_NAME, nm, strlen(nm));
    if (ar) lg__gwc_held(c, (size_t)idx, LG__HELD_ARGS, ar, strlen(ar));
  }
}

/* A reasoning detail's members whose pieces are joined. */
static const char *const joined[3] = {"text", "summary", "data"};

/* Whether two reasoning details are pieces of one: their type and index. */
static int same_detail(json_t *a, json_t *b) {
  const char *ta = sget(a, "type"), *tb = sget(b, "type");
  return (ta && tb ? !strcmp(ta, tb) : ta == tb) &&
         json_integer_value(json_object_get(a, "index")) == json_integer_value(json_object_get(b, "index"));
}

/* Chat Completions: a delta's reasoning kept, in case a call of the answer
 * is restored (restored_items): reasoning_content and reasoning joined,
 * reasoning_details merged as OpenRouter streams them (a detail's pieces
 * share its type and index: text, summary and data joined, the other
 * members as they last came). A detail's first piece is kept in
 * c->details, the rest of its strings in c->dmore, joined once read
 * (lg__gwo_details): a piece at a time, a long detail's joins would copy
 * it over and over. Within the answer's bound, as held calls. */
static void hold_reasoning(chat_t *c, json_t *delta) {
  for (int i = 0; i < 2; i++) {
    const char *t = sget(delta, i ? "reasoning" : "reasoning_content");
    size_t n = t ? strlen(t) : 0;
    c->held_bytes += n;
    if (n) lg__buf_append(&c->think[i], t, n);
  }
  json_t *ds = json_object_get(delta, "reasoning_details");
  for (size_t i = 0; i < json_array_size(ds); i++) {
    json_t *d = json_array_get(ds, i);
    if (!json_is_object(d)) continue;
    size_t at = 0, n = json_array_size(c->details);
    while (at < n && !same_detail(json_array_get(c->details, at), d)) at++;
    json_t *acc = json_array_get(c->details, at); /* NULL: a new detail */
    for (int j = 0; j < 3; j++) c->held_bytes += json_string_length(json_object_get(d, joined[j]));
    if (!acc) {
      lg__buf_t(*more)[3] = n < MAX_STREAM_CALLS ? lg__realloc(c->dmore, (n + 1) * sizeof *more) : NULL;
      if (!more) continue; /* past the bound, or out of memory: dropped */
      c->dmore = more;
      memset(more[n], 0, sizeof more[n]);
      json_array_append_new(c->details, json_copy(d));
      continue;
    }
    const char *k;
    json_t *v;
    json_object_foreach(d, k, v) {
      int j = 0;
      while (j < 3 && strcmp(k, joined[j])) j++;
      if (j < 3 && json_is_string(v) && json_is_string(json_object_get(acc, k)))
        lg__buf_append(&c->dmore[at][j], json_string_value(v), json_string_length(v));
      else
        json_object_set(acc, k, v);
    }
  }
}

json_t *lg__gwo_details(chat_t *c) {
  for (size_t k = 0; k < json_array_size(c->details); k++) {
    json_t *e = json_array_get(c->details, k);
    for (int j = 0; j < 3; j++) {
      lg__buf_t *b = &c->dmore[k][j];
      if (!b->len) continue;
      if (!b->oom) {
        lg__buf_t all = {0};
        const char *had = sget(e, joined[j]);
        lg__buf_puts(&all, had ? had : "");
        lg__buf_append(&all, b->data, b->len);
        if (!all.oom && all.data) json_object_set_new(e, joined[j], json_stringn(all.data, all.len));
        lg__buf_free(&all);
      }
      b->len = 0; /* joined once: read again, the same */
      b->oom = 0;
    }
  }
  return c->details;
}

/* The answer read is done with (another is asked for in the same
 * response): its reasoning_details were forwarded as they came, so the
 * next answer's go to the client numbered after them (shifted_details). */
void lg__gwo_details_next(chat_t *c) {
  json_int_t most = 0; /* past the answer's highest index (an index past 2^32 is not the API's) */
  for (size_t k = 0; k < json_array_size(c->details); k++) {
    json_t *ix = json_object_get(json_array_get(c->details, k), "index");
    json_int_t v = json_is_integer(ix) ? json_integer_value(ix) : -1;
    if (v >= 0 && v < (json_int_t)1 << 32 && v + 1 > most) most = v + 1;
  }
  c->details_shift += most;
}

/* A chunk whose first choice (at `at`) carries reasoning_details, when
 * they go to the client renumbered (details_shift): a copy, their
 * indices shifted; NULL when the chunk goes as it came. */
static json_t *details_of(json_t *ch, size_t at) {
  return json_object_get(json_object_get(json_array_get(json_object_get(ch, "choices"), at), "delta"),
                         "reasoning_details");
}

static json_t *shifted_details(chat_t *c, json_t *ch, size_t at) {
  if (!c->details_shift || !json_array_size(details_of(ch, at))) return NULL;
  json_t *cp = json_deep_copy(ch), *ds = details_of(cp, at);
  for (size_t k = 0; k < json_array_size(ds); k++) {
    json_t *d = json_array_get(ds, k), *ix = json_object_get(d, "index");
    if (json_is_integer(ix) && json_integer_value(ix) >= 0 && json_integer_value(ix) <= (json_int_t)1 << 32)
      json_object_set_new(d, "index", json_integer(json_integer_value(ix) + c->details_shift));
  }
  return cp;
}

void lg__gwo_details_clear(chat_t *c) {
  for (size_t k = 0; k < json_array_size(c->details); k++)
    for (int j = 0; j < 3; j++) lg__buf_free(&c->dmore[k][j]);
  lg__free(c->dmore);
  c->dmore = NULL;
  json_decref(c->details);
  c->details = NULL;
}

/* A chunk holding tool call deltas carries more for the client than them:
 * text, a member of the delta besides the role (reasoning), or the role
 * when the client has not had it (a first chunk that holds the role and
 * the first call delta at once, as some servers send it: the openai SDK's
 * stream refuses a choice whose first chunk has no role). */
static int more_than_calls(const chat_t *c, json_t *delta) {
  const char *k;
  json_t *v;
  json_object_foreach(delta, k, v) {
    if (!strcmp(k, "content") ? json_string_length(v) > 0
                              : strcmp(k, "tool_calls") && (strcmp(k, "role") || !c->role_told))
      return 1;
  }
  return 0;
}

int lg__gwo_on_event(chat_t *c, const char *data, size_t n, const char *raw, size_t rawn) {
  if (n == 6 && !memcmp(data, "[DONE]", 6)) {
    c->saw_done = 1;
    return 0;
  }
  json_t *ch = lg__gwc_event_json(c, data, n);
  if (!ch) return 0; /* not JSON: dropped */
  if (json_object_get(ch, "error")) { /* the upstream's error event: as it came */
    c->saw_error = 1;
    lg__gw_stream_write(c->j, raw, rawn);
    json_decref(ch);
    return 0;
  }
  json_t *u = json_object_get(ch, "usage");
  if (json_is_object(u)) {
    json_decref(c->usage);
    c->usage = json_incref(u);
  }
  /* the first choice's delta (n of 2 and more: each chunk holds one
   * choice, named by its index; another's passes as it came, as does a
   * chunk of no choice that is not the usage chunk: Azure's
   * prompt_filter_results) */
  json_t *choices = json_object_get(ch, "choices"), *choice = NULL;
  size_t at;
  for (at = 0; at < json_array_size(choices); at++) {
    json_t *e = json_array_get(choices, at), *ix = json_object_get(e, "index");
    if (!ix || (json_is_integer(ix) && !json_integer_value(ix))) {
      choice = e;
      break;
    }
  }
  if (!choice && (json_array_size(choices) || !json_is_object(u))) {
    lg__gw_stream_write(c->j, raw, rawn);
    json_decref(ch);
    return 0;
  }
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
  if (c->legacy) legacy_delta(c, delta);
  json_t *tcd = json_object_get(delta, "tool_calls");
  const char *fin = sget(choice, "finish_reason");
  if (fin) {
    lg__free(c->finish);
    c->finish = lg__strdup(fin);
  }
  if (json_is_array(tcd)) hold_call_deltas(c, tcd);
  hold_reasoning(c, delta);
  const char *content = sget(delta, "content");
  if (content) lg__buf_puts(&c->text, content);
  if (content && (c->cut = lg__gwc_feed_text(c, 0))) { /* a text loop: cut here */
    json_decref(ch);
    return 1;
  }
  /* Text and role deltas pass at once, as they came; tool call deltas and
   * the finish are held. */
  json_t *sh = shifted_details(c, ch, at);
  if (!json_is_array(tcd) && !fin) {
    if (sh) stream_chunk_text(c, sh);
    else lg__gw_stream_write(c->j, raw, rawn);
    c->role_told |= json_object_get(delta, "role") != NULL;
  } else if (more_than_calls(c, delta)) {
    c->role_told |= json_object_get(delta, "role") != NULL;
    json_t *cp = sh ? json_incref(sh) : json_deep_copy(ch);
    json_t *cc = json_array_get(json_object_get(cp, "choices"), at);
    json_object_del(json_object_get(cc, "delta"), "tool_calls");
    json_object_set_new(cc, "finish_reason", json_null());
    stream_chunk_text(c, cp);
    json_decref(cp);
  }
  json_decref(sh);
  json_decref(ch);
  return 0;
}

/* One chunk of ours to the client, "data: {...}": the upstream's last
 * chunk (its id, model, created, and what the gateway does not know, in
 * their order) with our `choices` and `usage` (NULL: none) in their
 * places, written without a copy of the chunk. Nothing when it cannot be
 * written (out of memory). */
static void send_chunk(chat_t *c, const char *choices, const char *usage) {
  static const char *const keys[2] = {"choices", "usage"};
  const char *vals[2] = {choices, usage};
  lg__buf_t b = {0};
  if (!lg__buf_puts(&b, "data: ") && !lg__buf_json_with(&b, c->last_chunk, keys, vals, 2) &&
      !lg__buf_puts(&b, "\n\n") && !b.oom)
    lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
}

/* After the upstream's stream ended: the held calls decided and emitted. */
/* Chat Completions: the kept calls as one chunk, renumbered from 0. */
void lg__gwo_emit_kept(chat_t *c, json_t *kept) {
  json_t *m = json_pack("{s:s, s:O}", "role", "assistant", "tool_calls", kept);
  /* a legacy conversation is known by its text (its calls have no ids) */
  if (m && c->legacy && c->text.len) json_object_set_new(m, "content", json_stringn(c->text.data, c->text.len));
  lg__gwc_register_key(c, m);
  json_decref(m);
  static const char *const index_key[1] = {"index"};
  lg__buf_t ch = {0};
  int rc;
  if (c->legacy) { /* its one call, as a function_call delta */
    rc = lg__buf_puts(&ch, "[{\"index\":0,\"delta\":{\"function_call\":") ||
         lg__buf_json(&ch, json_object_get(json_array_get(kept, 0), "function"));
  } else {
    rc = lg__buf_puts(&ch, "[{\"index\":0,\"delta\":{\"tool_calls\":[");
    for (size_t i = 0; !rc && i < json_array_size(kept); i++) {
      char ix[24];
      snprintf(ix, sizeof ix, "%zu", i);
      const char *vals[1] = {ix};
      rc = (i && lg__buf_putc(&ch, ',')) || lg__buf_json_with(&ch, json_array_get(kept, i), index_key, vals, 1);
    }
    rc = rc || lg__buf_putc(&ch, ']');
  }
  if (!rc && !lg__buf_puts(&ch, "},\"finish_reason\":null}]") && !ch.oom) send_chunk(c, ch.data, NULL);
  lg__buf_free(&ch);
}

/* The stream's finish_reason: tool_calls with calls, unless the upstream
 * said length (the answer cut off by max_tokens: its last call's
 * arguments are not whole, as the answer not streamed says too). */
void lg__gwo_end_stream(chat_t *c) {
  int cut = c->finish && !strcmp(c->finish, "length");
  const char *fin = cut                          ? "length"
                    : json_array_size(c->tcalls) ? (c->legacy ? "function_call" : "tool_calls")
                    : c->finish                  ? c->finish
                                                 : "stop";
  lg__buf_t ch = {0};
  if (!lg__buf_puts(&ch, "[{\"index\":0,\"delta\":{},\"finish_reason\":") &&
      !lg__buf_json_str(&ch, fin, strlen(fin)) && !lg__buf_puts(&ch, "}]") && !ch.oom)
    send_chunk(c, ch.data, NULL);
  lg__buf_free(&ch);
  if (c->client_usage && c->usage) {
    char *u = lg__json_text(c->usage, NULL);
    if (u) send_chunk(c, "[]", u);
    lg__free(u);
  }
  lg__gw_stream_write(c->j, "data: [DONE]\n\n", 14);
}

/* ---- legacy function calling ----
 *
 * A request that offers `functions` (and no `tools`) speaks the API's
 * older dialect of tool use: its model asks for one call at a time, an
 * assistant message's `function_call` ({name, arguments}, no id), and the
 * client answers it with a message of role `function` (its name, its
 * content). The gateway reads it in the newer dialect, so that one path
 * decides both: the request's `functions` and `function_call` are read as
 * `tools` and `tool_choice`, each such message as an assistant's
 * `tool_calls` or a `tool` message (a copy, c->lmsg), an answer's
 * function_call (whole, or its stream's deltas) as its one tool call; the
 * body the upstream gets, when the gateway changes it, and the calls a
 * stream emits are said back in the older dialect (an answer the gateway
 * does not change goes as the upstream sent it). A function call has no
 * id: it is named by where its message is in the client's conversation,
 * "call_legacy_N" (an answer's N is the number of messages it follows,
 * where the client puts it), and a function message answers the
 * assistant message before it. */

static void legacy_id(char *buf, size_t size, size_t at) { snprintf(buf, size, "call_legacy_%zu", at); }

/* The function_call fc of o (a message, or a stream's delta: then its call
 * has index 0) as o's one tool call, named by place `at`, in place. 0, or
 * -1 out of memory (o unchanged). */
static int as_tool_call(json_t *o, json_t *fc, size_t at, int delta) {
  char id[48];
  legacy_id(id, sizeof id, at);
  json_t *tc = json_pack("{s:s, s:s, s:O}", "id", id, "type", "function", "function", fc);
  if (tc && delta && json_object_set_new(tc, "index", json_integer(0))) {
    json_decref(tc);
    return -1;
  }
  if (!tc || json_object_set_new(o, "tool_calls", json_pack("[o]", tc))) return -1;
  json_object_del(o, "function_call");
  return 0;
}

int lg__gwo_legacy_root(chat_t *c) {
  json_t *root = c->root, *fns = json_object_get(root, "functions");
  if (c->api != LG__GW_API_OPENAI || !json_is_array(fns) || json_object_get(root, "tools")) return 0;
  json_t *tools = json_array(), *fc = json_object_get(root, "function_call"), *tc = NULL;
  for (size_t i = 0; tools && i < json_array_size(fns); i++)
    if (json_array_append_new(tools, json_pack("{s:s, s:O}", "type", "function", "function", json_array_get(fns, i))))
      break;
  if (json_is_object(fc)) /* {"name": F}: that function forced */
    tc = json_pack("{s:s, s:{s:O?}}", "type", "function", "function", "name", json_object_get(fc, "name"));
  else if (fc)
    tc = json_incref(fc); /* "none", "auto" */
  if (!tools || json_array_size(tools) < json_array_size(fns) || (fc && !tc)) {
    json_decref(tools);
    json_decref(tc);
    return -1;
  }
  json_object_set_new(root, "tools", tools);
  json_object_del(root, "functions");
  if (tc) {
    json_object_set_new(root, "tool_choice", tc);
    json_object_del(root, "function_call");
  }
  c->legacy = 1;
  return 0;
}

/* Client message i (m) as the gateway reads it, kept in c->lmsg[i]:
 * answered is the index of the assistant message a function message
 * answers (-1: none before it). m itself when it is of neither kind; NULL
 * out of memory. */
json_t *lg__gwo_legacy_msg(chat_t *c, json_t *m, size_t i, long answered) {
  const char *role = sget(m, "role");
  json_t *fc = json_object_get(m, "function_call");
  int call = role && !strcmp(role, "assistant") && json_is_object(fc) && !json_object_get(m, "tool_calls");
  if (!call && !(role && !strcmp(role, "function"))) return m;
  if (!c->lmsg) {
    size_t n = json_array_size(c->messages);
    if (!(c->lmsg = lg__calloc(n, sizeof *c->lmsg))) return NULL;
    c->nlmsg = n;
  }
  if (i >= c->nlmsg) return m;
  json_t *t = json_copy(m); /* shallow: the client's members shared */
  char id[48];
  int bad = !t;
  if (call) {
    bad = bad || as_tool_call(t, fc, i, 0);
  } else {
    if (answered >= 0) legacy_id(id, sizeof id, (size_t)answered);
    else snprintf(id, sizeof id, "call_legacy_none");
    bad = bad || json_object_set_new(t, "role", json_string("tool")) ||
          json_object_set_new(t, "tool_call_id", json_string(id));
  }
  if (bad) {
    json_decref(t);
    return NULL;
  }
  return c->lmsg[i] = t;
}

/* The function_call of an answer (msg: the upstream's, as parsed) as its
 * one tool call, in place. */
void lg__gwo_legacy_answer(chat_t *c, json_t *msg) {
  json_t *fc = json_object_get(msg, "function_call");
  if (c->legacy && json_is_object(fc) && !json_object_get(msg, "tool_calls")) as_tool_call(msg, fc, c->n, 0);
}

/* A stream's delta of the function call, as its tool call's delta (index
 * 0), in place. */
static void legacy_delta(chat_t *c, json_t *delta) {
  json_t *fc = json_object_get(delta, "function_call");
  if (json_is_object(fc)) as_tool_call(delta, fc, c->n, 1);
}

/* The upstream body b (build_body's: a shallow copy of the request, its
 * messages a new array) said back in the older dialect: tools as
 * functions, tool_choice as function_call, each assistant message's first
 * tool call as its function_call, each tool message as a function
 * message named by the call before it. 0, or -1 out of memory. */
int lg__gwo_legacy_body(chat_t *c, json_t *b) {
  if (!c->legacy) return 0;
  json_t *tools = json_object_get(b, "tools"), *fns = json_array();
  for (size_t i = 0; fns && i < json_array_size(tools); i++) {
    json_t *fn = json_object_get(json_array_get(tools, i), "function");
    if (fn && json_array_append(fns, fn)) break;
  }
  if (!fns || json_object_set_new(b, "functions", fns)) return -1;
  json_object_del(b, "tools");
  json_t *tc = json_object_get(b, "tool_choice");
  if (tc) {
    json_t *fc = json_is_string(tc) ? json_incref(tc)
                                    : json_pack("{s:O?}", "name", json_object_get(json_object_get(tc, "function"), "name"));
    if (!fc || json_object_set_new(b, "function_call", fc)) return -1;
    json_object_del(b, "tool_choice");
  }
  json_t *msgs = json_object_get(b, "messages"), *out = json_array();
  const char *called = NULL; /* the name of the last call */
  for (size_t i = 0; out && i < json_array_size(msgs); i++) {
    json_t *m = json_array_get(msgs, i), *t = NULL;
    const char *role = sget(m, "role");
    json_t *tcs = json_object_get(m, "tool_calls");
    if (role && !strcmp(role, "assistant") && json_array_size(tcs)) {
      json_t *fn = json_object_get(json_array_get(tcs, 0), "function");
      called = sget(fn, "name");
      if ((t = json_copy(m)) && !json_object_set(t, "function_call", fn)) json_object_del(t, "tool_calls");
    } else if (role && !strcmp(role, "tool")) {
      if ((t = json_copy(m))) {
        json_object_set_new(t, "role", json_string("function"));
        if (called) json_object_set_new(t, "name", json_string(called));
        json_object_del(t, "tool_call_id");
      }
    } else {
      t = json_incref(m);
    }
    if (!t || json_array_append_new(out, t)) {
      json_decref(out);
      out = NULL;
    }
  }
  return out && !json_object_set_new(b, "messages", out) ? 0 : -1;
}

void lg__gwo_legacy_free(chat_t *c) {
  for (size_t i = 0; i < c->nlmsg; i++) json_decref(c->lmsg[i]);
  lg__free(c->lmsg);
  c->lmsg = NULL;
  c->nlmsg = 0;
}
