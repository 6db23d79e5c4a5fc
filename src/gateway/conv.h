/*
 * conv.h — one guarded model request of the gateway, whatever its API:
 * what chat.c (the conversation as events, the upstream body, the
 * decisions, the exchange) shares with the three wire formats it speaks,
 * completions.c (OpenAI Chat Completions), messages.c (Anthropic
 * Messages) and responses.c (OpenAI Responses): their final answers, the
 * readers of their streams, and how each emits the calls the client may
 * run. Names are lg__gwc_ (chat.c), lg__gwo_, lg__gwm_, lg__gwr_.
 */
#ifndef LG_GW_CONV_H
#define LG_GW_CONV_H

#include "gw.h"

#include <stdio.h>

static inline const char *sget(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

static inline int64_t now_ms(lg__gw_ctx_t *cx) { return lg__server_now(cx->srv); }
/* Whether text t is empty or white space only: a blank result value,
 * which the engine takes for a tool that answered nothing. */
static inline int blank(const char *t) {
  while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r') t++;
  return !*t;
}

/* The tool results of a request, fed and not yet decided: their steps
 * (one batch), their events as made (to decide them again one at a time
 * when the store fails the batch whole) and what their events borrow.
 * st and ev have room for one more: the step the results go before.
 * A result read late (chat.c, feed_later) is its message's index until
 * the step finds the run waiting for a result and fills it (fill_result,
 * on the deciding thread, while the request waits for its step). */
typedef struct lg__gw_fed {
  lg__step_t *st;
  lg_event_t *ev;
  struct lg__gw_fed_keep {
    char *text, *value;       /* the result's content, its value (owned) */
    json_t *sj;               /* its structured form, or NULL (owned) */
    const char *call_id;      /* borrowed from the request */
    struct chat *c;           /* read late: the request, */
    size_t msg, block;        /*   its message (and block: Anthropic's), */
    lg_result_t res;          /*   the result once read (filled), */
    int filled, oom;          /*   or out of memory reading it */
  } *keep;
  size_t n, cap;
  int oom;                    /* a result read late could not be (out of memory):
                                 the conversation is read again from it */
} lg__gw_fed_t;

typedef struct chat {
  int api;                    /* LG__GW_API_OPENAI (chat), _ANTHROPIC (messages) */
  lg__gw_ctx_t *cx;
  lg__gw_job_t *j;
  lg__gw_run_t *r;
  json_t *root, *messages;    /* messages (input): read with chat.c's client_msg */
  lg__json_lazy_t lazy;       /*   each built when first read (json_load.c) */
  lg__json_prefix_t *prefix;  /*   the run's last request's, read before (lg__gw_prefix_take) */
  int lazy_oom;               /*   one could not be built: out of memory */
  size_t n;                   /* client messages */
  long last_ans;              /* the last answer the client continues from (chat.c,
                                 last_answer), or -1 */
  int run_made;               /* the request made its run (lg__gw_run_get) */
  json_t *prev_answers;       /* Responses: the answers of the refused calls of the
                                 response continued, read from the store (chat.c,
                                 prev_fetch), or NULL */
  json_t *conv_pending;       /* a conversation's (conv_id) answers of refused calls its
                                 upstream has not had, the store's (not on memory:),
                                 or NULL: then the run's memory says (rs[].conv_sent) */
  const char *model;          /* as sent upstream */
  int stream;                 /* the client asked for a stream */
  int client_usage;           /* the client asked for the usage chunk */
  size_t ui;                  /* upstream */
  char *new_key;              /* the conversation key to register */
  char *stop_text;            /* the run stopped: the final message */
  int streamed;               /* the stream began */
  int max_reasks;             /* gateway.max_reasks of the run's policy */
  size_t base_ui;             /* the upstream and model of the request, before */
  const char *base_model;     /*   an escalation (cascade.escalate) changes them */
  char *esc_model;            /* this model call's cascade.escalate model, or NULL */
  char *esc_asked;            /*   ... as the policy names it (a route's prefix kept) */
  char *esc_path;             /*   ... as an AzureOpenAI client's path names a deployment */
  int estimate;               /* building the worst case: every offer, the longer model */
  int final_round;            /* building gateway.final_round's body: tools off */
  const char *root_added;     /* the member keys.c added to root (max_tokens), else NULL: sent
                                 in front of the client's bytes (client_bytes) */
  int root_replaced;          /* it replaced the client's own null: the body is built, since
                                 its bytes would send the null after the bound, and a JSON
                                 reader takes the last of a repeated member */
  int64_t attached;           /* the client's attachments (chat.c, attachments); -1 not counted */
  int64_t inlined;            /*   the bytes of those given inline (inline_bytes); -1 not counted */
  size_t body_reals;          /* the real numbers of the client's body */
  char *steer_text;           /* a text loop's steer said with this request (owned), */
  size_t steer_at;            /*   with this client message (chat.c, text_steer_place); */
  int steer_once;             /*   taken from the run: said once, the upstream keeps it, */
  int steer_sent;             /*   and it has it (else it goes back to the run) */
  lg__gw_fed_t fed;           /* the request's tool results, to decide together */
  lg__step_t use;             /* the answer's usage, decided with the step(s) */
  lg_event_t use_ev;          /*   after it (decide_steps), when use_pending; */
  int use_pending;            /*   its event as made */
  lg_reason_t stop_reason;    /* a stop decided in this request (LG_R_NONE: none) */
  size_t text_fed;            /* bytes of text already given to the step */
  int cut;                    /* a text loop cut the stream: 1 observe, 2 stop */
  int events;                 /* valid events read from the upstream's stream */
  int saw_error;              /* the upstream's stream carried its own error event */
  int a_open;                 /* Anthropic stream: the client's open text block, or -1 */
  int r_open;                 /* Responses stream: the client's open message item, or -1 */
  size_t r_sent;              /*   the bytes of text the client got (a cut's last delta is not sent) */
  json_t *r_open_item;        /*   and that item (output_item.added's) */
  /* streaming: the response being read */
  lg__buf_t line;             /* a partial SSE line */
  json_t *tcalls;             /* held tool calls by index: [{id,name,args}] */
  lg__buf_t (*held)[2];       /* their arguments and names as the deltas come, by the */
  size_t n_held;              /*   same index (into tcalls at the stream's end: lg__gwc_held) */
  size_t held_bytes;          /*   their bytes, all told */
  int over_held;              /* the text and held calls went past the answer's bound */
  json_t *last_chunk;         /* a chunk as a template for ours */
  json_t *usage;              /* the usage chunk's usage */
  int saw_done;
  lg__buf_t text;             /* the text streamed */
  char *finish;               /* the finish_reason held back */
  /* Responses */
  const char *prev_id;        /* previous_response_id of the request */
  const char *conv_id;        /* its conversation (Conversations API: the upstream keeps the
                                 conversation, the input holds what is new), or NULL */
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
  json_t *a_delta;            /* the upstream's last message_delta (its members a template) */
  int64_t a_out_tokens;       /* message_delta's usage.output_tokens */
  /* What of an answer goes back with its calls when the guard leaves none
   * for the client (restored_items): Messages' thinking blocks, which the
   * provider wants first in the assistant turn of the last tool use;
   * Responses' reasoning items, to which it binds the calls after them;
   * Chat Completions' reasoning_content (DeepSeek's, Moonshot's),
   * reasoning and reasoning_details (OpenRouter's: what it passes back to
   * the provider as its thinking, signed). */
  json_t *reasoning;          /* the answer's thinking blocks / reasoning items, in order; Chat
                                 Completions: an object of those members (NULL: none) */
  json_t *details;            /* Chat Completions stream: reasoning_details as they come, merged
                                 by type and index (their first pieces), */
  lg__buf_t (*dmore)[3];      /*   and the rest of their text, summary and data, by the same
                                   index (joined by lg__gwo_details) */
  json_int_t details_shift;   /* added to a stream's reasoning_details indices on their way to
                                 the client: past those of the response's earlier answers */
  int role_told;              /* Chat Completions stream: the client was sent a delta's role
                                 (a chunk whose calls are held passes its role on once) */
  const char *computer;       /* Messages: the name of the request's computer-use tool (a tool
                                 of type computer_*), once looked for (computer_seen) */
  int computer_seen;
  int legacy;                 /* Chat Completions' older function calling (`functions`): read in
                                 the newer dialect (completions.c, "legacy function calling") */
  json_t **lmsg;              /*   its client messages as read (by index: a copy, translated), */
  size_t nlmsg;               /*   made when first read */
  json_int_t think_at;        /* a stream's open thinking block: its upstream index (-1: none), */
  lg__buf_t think[2];         /*   its text and its signature as the deltas come (Chat
                                   Completions: reasoning_content, reasoning) */
} chat_t;

#define API_RESPONSES 2 /* c->api: OpenAI Responses */
static inline int is_anthropic(const chat_t *c) { return c->api == LG__GW_API_ANTHROPIC; }
static inline int is_responses(const chat_t *c) { return c->api == API_RESPONSES; }
/* Tools and tool_choice name their function at the top (Messages, Responses). */
static inline int flat_tools(const chat_t *c) { return c->api != LG__GW_API_OPENAI; }

/* An upstream stream's map of its indices to the client's (by index). */
static inline int lg__gwc_map_get(chat_t *c, json_int_t idx) {
  char k[32];
  snprintf(k, sizeof k, "%lld", (long long)idx);
  json_t *v = json_object_get(c->a_map, k);
  return v ? (int)json_integer_value(v) : -1000000;
}

/* ---- chat.c, for the wire formats ---- */

/* The client's stream starts (the HTTP side answers 200, text/event-stream). */
void lg__gwc_begin_stream(chat_t *c);
/* A JSON object as the whole (non-stream) answer, 200. */
void lg__gwc_answer_body(chat_t *c, json_t *o);
/* Remembers the conversation's start (and a Responses id) for its run,
 * from the answer msg the client gets. */
void lg__gwc_register_key(chat_t *c, json_t *msg);
/* The streamed text not yet given to the step: 0 go on, 1 a text loop
 * observed, 2 the run stopped (cut the stream). */
int lg__gwc_feed_text(chat_t *c, int at_end);
/* Appends a streamed delta of held call i's arguments (LG__HELD_ARGS) or
 * name (LG__HELD_NAME, Chat Completions): kept in a buffer, so that
 * arguments that come in thousands of deltas (a file a tool is to write)
 * are copied once, not once a delta. 0, or LG_ENOMEM. */
enum { LG__HELD_ARGS = 0, LG__HELD_NAME = 1 };
int lg__gwc_held(chat_t *c, size_t i, int part, const char *s, size_t n);
/* Responses: an id for an answer the gateway makes itself; that answer
 * (its text, or NULL) remembered, so that a request continuing from it
 * never sends the id upstream. */
void lg__gwc_own_id(chat_t *c, char *buf, size_t size);
/* A usage of in input and out output tokens in the API's shape (new):
 * Chat Completions' prompt/completion/total_tokens, Responses' with its
 * details, Messages' input/output_tokens. */
json_t *lg__gwc_usage(const chat_t *c, json_int_t in, json_int_t out);
void lg__gwc_own_response(chat_t *c, const char *id, const char *text);
/* One event of the upstream's stream parsed (new), counted, and the
 * client's stream begun; NULL when it is not a JSON object (dropped). */
json_t *lg__gwc_event_json(chat_t *c, const char *data, size_t n);
/* Whether an item's or a block's "type" ty (NULL: none) is of a kind. */
typedef int (*lg__gw_kind_fn)(const char *ty);
/* The members of array obj[member] whose "type" is of the kind (new array). */
json_t *lg__gwc_items_of_type(json_t *obj, const char *member, lg__gw_kind_fn kind);
/* obj[member] without its members of the kind that are not in kept (the
 * refused calls taken out of an answer). */
void lg__gwc_keep_only(json_t *obj, const char *member, lg__gw_kind_fn kind, json_t *kept);

/* ---- completions.c: Chat Completions ---- */

/* The stop's final message: as the stream's last chunks; as the whole
 * answer (the upstream's response resp with its choices replaced, or
 * one of ours). */
void lg__gwo_final_stream(chat_t *c, const char *text, const char *model);
void lg__gwo_final_plain(chat_t *c, const char *text, const char *model, json_t *resp);
/* One "data:" payload of the upstream's stream (raw: the event as it came).
 * Non-zero: abort the upstream (a text loop cut it). */
int lg__gwo_on_event(chat_t *c, const char *data, size_t n, const char *raw, size_t rawn);
/* The kept calls as one chunk; the stream's end (finish, usage, [DONE]). */
void lg__gwo_emit_kept(chat_t *c, json_t *kept);
void lg__gwo_end_stream(chat_t *c);
/* Legacy function calling (`functions`, an assistant's `function_call`, a
 * `function` message): read as tools, tool calls and tool messages. */
int lg__gwo_legacy_root(chat_t *c);                   /* c->legacy set, c->root translated; -1 out of memory */
/* client message i (m) as read (borrowed), answered: the assistant message a
 * function message answers (-1: none); NULL out of memory */
json_t *lg__gwo_legacy_msg(chat_t *c, json_t *m, size_t i, long answered);
void lg__gwo_legacy_answer(chat_t *c, json_t *msg);   /* an answer's function_call as its tool call */
int lg__gwo_legacy_body(chat_t *c, json_t *b);        /* the upstream body said back; -1 out of memory */
void lg__gwo_legacy_free(chat_t *c);
json_t *lg__gwo_details(chat_t *c);     /* the stream's reasoning_details, joined (borrowed) */
void lg__gwo_details_clear(chat_t *c);  /* freed, NULL */
void lg__gwo_details_next(chat_t *c);   /* another answer of the response is read next */

/* ---- messages.c: Anthropic Messages ---- */

void lg__gwm_final(chat_t *c, const char *text, const char *model);
int lg__gwm_on_event(chat_t *c, const char *data, size_t n, const char *raw, size_t rawn);
void lg__gwm_emit_kept(chat_t *c, json_t *kept);
void lg__gwm_end_stream(chat_t *c);
/* A message's tool_use blocks (new); msg without the refused ones. */
json_t *lg__gwm_tool_uses(json_t *msg);
void lg__gwm_keep_blocks(json_t *msg, json_t *kept);
/* A message's thinking and redacted_thinking blocks, in order (new). */
json_t *lg__gwm_thinking(json_t *msg);

/* ---- responses.c: OpenAI Responses ---- */

void lg__gwr_final(chat_t *c, const char *text, const char *model);
int lg__gwr_on_event(chat_t *c, const char *data, size_t n);
/* One event to the client, with the client's own sequence number. */
void lg__gwr_event(chat_t *c, json_t *ev);
void lg__gwr_emit_kept(chat_t *c, json_t *kept, int refused);
void lg__gwr_end_stream(chat_t *c);
/* The Responses items of a call the client runs and of its answer: a
 * function's (function_call, function_call_output: arguments, JSON
 * text), a custom tool's (custom_tool_call, custom_tool_call_output:
 * input, free text), the built-in tools' (shell_call, apply_patch_call,
 * computer_call, local_shell_call: action, operation, objects). */
enum { LG__ARGS_JSON_TEXT, LG__ARGS_FREE_TEXT, LG__ARGS_OBJECT };
/* How an output item holds the answer: `output` a string or text parts;
 * a shell's chunks of stdout and stderr, each with its outcome; an
 * apply_patch's `status` (completed, failed) and `output` text; a
 * computer call's screenshot (`output` an object, no text at all); a
 * local shell's `output`, JSON text (Codex's: the command's output, and its
 * exit code in `metadata`), the item with an `id` of its own, which the
 * API requires beside `call_id`. */
enum { LG__OUT_TEXT, LG__OUT_CHUNKS, LG__OUT_STATUS, LG__OUT_SCREENSHOT, LG__OUT_LOCAL_SHELL };
/* A note the gateway has for the model about a computer call's output (a
 * steer, a refusal's text), kept in the item under this member until the
 * upstream body is made: there it becomes a user message of its own
 * (chat.c, place_notes), since the output has no text to carry it. */
#define LG__GWR_NOTE "_lg_note"
typedef struct lg__gwr_kind {
  const char *call, *output, *tool, *args;
  int form, out;
} lg__gwr_kind_t;
/* The kind of an item's type (a call's or its answer's), or NULL. */
const lg__gwr_kind_t *lg__gwr_kind(const char *ty);
int lg__gwr_is_call(const char *ty);
int lg__gwr_is_output(const char *ty);
/* A tools list entry's type when it is a built-in tool the client runs
 * ("shell", "apply_patch"): its name. NULL otherwise. */
const char *lg__gwr_builtin_tool(const char *ty);
/* The output item that answers call item `call` (of its kind: a shell's
 * as a command that exited 1 with `text` its stderr, an apply_patch's
 * failed with `text`; a computer call's with `screen`, the screenshot the
 * model saw last, as the action did not run, `text` its LG__GWR_NOTE),
 * with output `text` (new). */
json_t *lg__gwr_output_for(json_t *call, const char *call_id, const char *text, json_t *screen);
/* An output item's answer as a tool's content (new: a string, or text
 * parts) and whether the tool failed (*is_error): a shell's stdout and
 * stderr, an error when a command exited non-zero or timed out; an
 * apply_patch's output, an error when it failed; a computer call's
 * screenshot as a list of that one part, which a result reads as any
 * image part: by its digest ("[computer_screenshot sha256:HEX]"). */
json_t *lg__gwr_output_content(json_t *item, int *is_error);
/* An output's call items (new), its text (new); resp without the refused
 * calls. */
json_t *lg__gwr_function_calls(json_t *resp);
char *lg__gwr_output_text(json_t *resp);
void lg__gwr_keep_items(json_t *resp, json_t *kept);

#endif
