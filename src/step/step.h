/*
 * step.h — the decision step: one event for one stored run, in one store
 * transaction.
 *
 *   load the run → check the deny rules → apply the event (src/event/) →
 *   save the run and append its trace line (src/trace/write.c)
 *
 * The server's routes, the CLI's cancel (lg_store_cancel_run/_group) and
 * run creation all come through here; the group commit (src/store/group.c)
 * runs many steps in one transaction. A front end fills an lg__step_t with
 * its event and reads the outcome from it; it never touches the store's
 * transactions itself. Replay applies events to a run it holds in memory,
 * through the same lg__run_apply, with no store.
 */
#ifndef LG_STEP_H
#define LG_STEP_H

#include "../util/internal.h"

/* How a step that did not decide failed, for the front end to report. */
typedef enum lg__step_fail {
  LG__STEP_OK = 0,
  LG__STEP_BAD_EVENT,   /* malformed for this run (HTTP 400); err says why */
  LG__STEP_CONFLICT,    /* does not fit the run's state (409) */
  LG__STEP_UNPRICED,    /* a model call that cannot be priced (422) */
  LG__STEP_REFUSED,     /* a shared budget refused and nothing changed (402, 403,
                           429): an in-flight cap that is full now, or a
                           limit of the call's own scopes (a gateway key's) */
  LG__STEP_NO_RUN,      /* the run is not stored (404) */
  LG__STEP_STORE        /* the store failed (500, or 503 when busy) */
} lg__step_fail_t;

/* Policy of a stored run from its JSON (a cache may answer); NULL: parse. */
typedef lg_policy_t *(*lg__policy_fn)(void *ud, const char *json, lg_error_t *err);

typedef struct lg__step {
  /* in */
  lg_event_t ev;              /* the event; its t_ms is set by the step */
  int64_t now_ms;             /* epoch ms (the run's time is now - created) */
  lg_prices_t *prices;        /* model and usage events; may be NULL */
  int usage_measured;         /* a usage's tokens are the provider's count (the
                                 gateway's), not an agent's word: the shared
                                 budgets are charged their price whole; else at
                                 most the call's reservation (an agent cannot
                                 lock a budget it shares by the tokens it says) */
  int64_t ttl_ms;             /* a model event's shared reservation: how long
                                 it holds unsettled (0: the budgets' default) */
  const char *const *scopes;  /* a model event's own budget scopes beside the
                                 run's (a gateway key's: key:ID, workspace:W);
                                 borrowed */
  size_t nscopes;
  lg_canon_t *canon;          /* scratch of the deciding thread */
  lg__policy_fn policy;       /* may be NULL */
  void *policy_ud;
  int auto_turn;              /* a call that named no turn: it gets a turn
                                 of its own (the run's calls so far + 1) */
  int model_turn;             /* the gateway's: the turn is the stored run's,
                                 not the front end's count: a model event's
                                 is the run's model calls so far + 1, a call's
                                 or text's the run's model calls (the answer
                                 of its last model call), whichever process
                                 made the earlier ones (a replica, a server
                                 before a restart) */
  int (*fill)(struct lg__step *st, void *ud); /* a result read late (NULL: the
                                 event is whole): called on the deciding
                                 thread, once the event is placed and only
                                 when the run can take a result
                                 (lg__run_awaits_result; else it is refused
                                 whatever it holds), to fill ev.u.result
                                 from the front end's own text. 0, or an
                                 error: the step fails as the store's would
                                 (a batch whole) */
  void *fill_ud;
  /* out */
  lg__step_fail_t fail;       /* why it did not decide, when it returned != 0 */
  int decided;                /* the event reached the run */
  int applied;                /* the engine took it (a failure after that
                                 fails a batch whole) */
  int was_stopped;            /* the run had stopped before */
  int stopped_now;            /* this event stopped it */
  int denied;                 /* a deny rule stopped it (a cancel in the trace) */
  lg_event_type_t asked;      /* denied: the event's own type, and its call_id */
  const char *asked_call_id;  /* (borrowed), which the answer keeps the shape of */
  lg_action_t action;         /* the decision, for metrics and logs */
  lg_reason_t reason;
  int ledger_outcome;         /* an lg_claim_outcome_t of a call, or -1 */
  int budget_refused;         /* a shared budget refused (refusal says why) */
  lg_budget_refusal_t refusal;
  int64_t actual_nusd;        /* usage: the cost settled */
  lg__buf_t answer;           /* the decision as http-api-v1's JSON object */
  lg__buf_t stop_log;         /* a stop: the fields of its log line */
  char *envelope;             /* a stop: the terminal envelope (JSON) */
  lg_error_t err;             /* the detail of a failure inside the step */
  int called;                 /* the run was found and the step ran */
} lg__step_t;

/* Sets the defaults of a step for `ev` at now_ms (ledger_outcome -1). */
void lg__step_init(lg__step_t *st, const lg_event_t *ev, int64_t now_ms);
/* Frees what the step's outcome holds. */
void lg__step_clear(lg__step_t *st);

/* The step as an lg_store_run_fn (ud: the lg__step_t), for
 * lg_store_with_run and the group commit. */
int lg__step_locked(void *ud, lg_store_t *s, const lg_run_record_t *rec);
/* One step in a transaction of its own. 0 when decided; else st->fail
 * says why and err what. */
int lg__step_run(lg_store_t *s, const char *run_id, lg__step_t *st, lg_error_t *err);
/* After lg_store_with_run(..., lg__step_locked, st, err) returned rc (the
 * group commit's way): sets st->fail for a failure outside the step and
 * the detail of one inside it into *err. Returns rc. */
int lg__step_finish(lg__step_t *st, int rc, lg_error_t *err);
/* Several events of one run in one transaction: the run loaded once,
 * each event placed, checked and decided in order as lg__step_locked would
 * (each step its own outcome: an event that does not fit the run fails
 * alone, the engine having changed nothing, and the others go on), each
 * decision's trace line appended, the run saved once. Once an event stops
 * the run the later ones change nothing and get the stop, as steps of
 * their own would. So the decisions and the trace are those of the steps
 * one by one. The deny rules are read once, for the first event that
 * needs them: the batch is one transaction, as if its events came at
 * once. Call, model and usage events write the store before the engine
 * decides (a claim, a reservation, a settlement), each in a savepoint of
 * its layer's that is undone when the event fails. A store failure, or a
 * failure after the engine took an event, fails every step (fail STORE)
 * and writes nothing. The steps' policy and canon are the first's;
 * their prices, budget scopes and reservation TTL their own. */
typedef struct lg__step_batch {
  lg__step_t *v;              /* the steps, in order, each lg__step_init'ed */
  size_t n;
} lg__step_batch_t;

/* The batch as an lg_store_run_fn (ud: the lg__step_batch_t). */
int lg__step_batch_locked(void *ud, lg_store_t *s, const lg_run_record_t *rec);
/* The batch in a transaction of its own. 0 when the batch ran (each step
 * says whether it decided); else every step's fail says why. */
int lg__step_batch_run(lg_store_t *s, const char *run_id, lg__step_batch_t *b, lg_error_t *err);
/* After lg_store_with_run(..., lg__step_batch_locked, b, err) returned rc:
 * each step's fail for a failure outside the batch (NO_RUN, STORE). */
int lg__step_batch_finish(lg__step_batch_t *b, int rc, lg_error_t *err);

/* The kill switch for one run: its deny rule, durable first, then a
 * cancel event through the step when the run is stored. LG_ENOTFOUND
 * (st->fail NO_RUN) when it is not: the rule waits for it. *rule_stored
 * (may be NULL): 1 once the rule is written, so that a failure after it
 * is not reported as nothing done. */
int lg__step_cancel(lg_store_t *s, const char *run_id, const char *reason, int64_t now_ms,
                    lg__step_t *st, int *rule_stored, lg_error_t *err);

/* A new run id for a run that names none: "run_" and 24 random hex
 * digits (lg__random_id) into out[32]. 0 or LG_EIO. */
int lg__step_new_run_id(char out[32]);

/* Creates a run: its record, its budget scopes (may be none) and its first
 * trace line, all or nothing. LG_ECONFLICT when run_id exists: *same (may
 * be NULL) then says whether it was created with this group, policy and
 * checkpoint (a client's retry). */
int lg__step_create(lg_store_t *s, const lg_run_t *run, const char *policy_json,
                    const int64_t *checkpoint, const char *const *scopes, size_t nscopes,
                    int64_t now_ms, int *same, lg_error_t *err);

/* fn(ud) on `run` in one transaction (lg_store_with_run), storing it
 * first when it is not stored yet: its row written once, with its first
 * save (lg__store_with_run_born: SQLite's stores only; PostgreSQL's create
 * with lg__step_create). *created: 1 when this call stored it. */
int lg__step_with_new(lg_store_t *s, const lg_run_t *run, const char *policy_json, int64_t now_ms,
                      lg_store_run_fn fn, void *ud, int *created, lg_error_t *err);

/* Cancels every active run of `group` after writing the group's deny
 * rule; on_run (may be NULL) hears of each run stopped, with its step.
 * *rule_stored as for lg__step_cancel: a failure after it leaves the rule
 * and the runs stopped before it. */
int lg__step_cancel_group(lg_store_t *s, const char *group, const char *reason, int64_t now_ms,
                          void (*on_run)(void *ud, const char *run_id, lg__step_t *st), void *ud,
                          int *rule_stored, lg_error_t *err);

#endif
