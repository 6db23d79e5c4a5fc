/*
 * text.c — the text guards' detector: chanting inside one response, and
 * the monologue (the same text as the whole of several responses).
 *
 * A response arrives in pieces cut at arbitrary bytes (mid-word, mid-line,
 * mid-UTF-8 character), so everything here is a byte-at-a-time state
 * machine over a fixed-size state (lg__text_t in engine.h): no buffer grows
 * with the response, and the same bytes give the same answer however they
 * are cut.
 *
 * Each line is first classified from its first few bytes (kept in `head`
 * until its kind is known): a fence line (``` or ~~~) toggles code; inside
 * code, a line indented by four columns or more (Markdown's code block),
 * a table row (|), a heading (#), a list item ("- ", "* ", "+ ", "12. ",
 * "3) ") or a divider (three of - = * _ ~) the line is skipped and
 * clears the rings, so repetition people write on purpose never counts and
 * never joins repetition across it. Other lines are prose, read as words
 * (bytes between white space and sentence ends) and sentences (ended by
 * . ! ? or the line's end), whose 32-bit hashes go into two rings.
 *
 * Chanting is a block at the end of a ring repeated back to back: a block
 * of 2 to 16 words four times (one word: eight times), or a block of 1 to 8
 * sentences of at least 4 words in all, three times. Because only adjacent
 * repeats count, a phrase that comes back far apart is never a loop. A
 * response counts once, on the byte that completes its first loop.
 *
 * The monologue hash covers every byte of the response (code included),
 * white space runs collapsed to one space and leading white space dropped:
 * white space differences do not matter, different words do.
 */
#include "engine.h"

#define FNV32_PRIME 16777619u
#define FNV64_PRIME 1099511628211ull

static inline uint32_t fnv32(uint32_t h, uint8_t c) { return (h ^ c) * FNV32_PRIME; }
/* Folds a word's hash into its sentence's: order matters, so "a b" and
 * "b a" differ. */
static inline uint32_t fold(uint32_t h, uint32_t w) {
  h ^= w + 0x9e3779b9u + (h << 6) + (h >> 2);
  return h;
}

static bool is_space(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
}
static bool is_end(uint8_t c) { return c == '.' || c == '!' || c == '?' || c == '\n'; }

static uint32_t ring_at(const uint32_t *ring, int cap, int head, int back) {
  int i = head - back; /* back = 1 is the newest */
  if (i < 0) i += cap;
  return ring[i];
}

/* The rings start again (a skipped line, a new response). */
static void barrier(lg__text_t *x) {
  x->nwords = x->whead = 0;
  x->nsents = x->shead = 0;
  x->word = LG__FNV32_OFF;
  x->word_len = 0;
  x->sent = 0;
  x->sent_words = 0;
}

/* A block of k words repeated `reps` times at the end of the ring. */
static bool words_loop(const lg__text_t *x) {
  for (int k = 1; k <= 16; k++) {
    int reps = k == 1 ? 8 : 4; /* "no no no no" is emphasis, not a loop */
    if (x->nwords < k * reps) break;
    bool same = true;
    for (int i = 1; i <= k * (reps - 1) && same; i++)
      same = ring_at(x->words, LG__TW_WORDS, x->whead, i) ==
             ring_at(x->words, LG__TW_WORDS, x->whead, i + k);
    if (same) return true;
  }
  return false;
}

/* A block of m sentences (4 words or more in all) three times at the end. */
static bool sents_loop(const lg__text_t *x) {
  for (int m = 1; m <= 8; m++) {
    if (x->nsents < 3 * m) break;
    bool same = true;
    uint32_t nw = 0;
    for (int i = 1; i <= m; i++) {
      int j = x->shead - i;
      nw += x->sent_nw[j < 0 ? j + LG__TW_SENTS : j];
    }
    for (int i = 1; i <= 2 * m && same; i++)
      same = ring_at(x->sents, LG__TW_SENTS, x->shead, i) ==
             ring_at(x->sents, LG__TW_SENTS, x->shead, i + m);
    if (same && nw >= 4) return true;
  }
  return false;
}

static bool end_word(lg__text_t *x) {
  if (!x->word_len) return false;
  x->words[x->whead] = x->word;
  x->whead = (x->whead + 1) % LG__TW_WORDS;
  if (x->nwords < LG__TW_WORDS) x->nwords++;
  x->sent = fold(x->sent, x->word);
  x->sent_words++;
  x->word = LG__FNV32_OFF;
  x->word_len = 0;
  return words_loop(x);
}

static bool end_sentence(lg__text_t *x) {
  if (!x->sent_words) return false;
  x->sents[x->shead] = x->sent;
  x->sent_nw[x->shead] = x->sent_words;
  x->shead = (x->shead + 1) % LG__TW_SENTS;
  if (x->nsents < LG__TW_SENTS) x->nsents++;
  x->sent = 0;
  x->sent_words = 0;
  return sents_loop(x);
}

/* One byte of a prose line; true when it completed a loop. */
static bool prose(lg__text_t *x, uint8_t c) {
  if (!is_space(c) && !is_end(c)) {
    x->word = fnv32(x->word, c);
    x->word_len++;
    return false;
  }
  bool loop = end_word(x);
  if (is_end(c)) loop |= end_sentence(x);
  return loop;
}

/* What the line is, from its first bytes: 0 not known yet, else a
 * LG__LINE_* kind; *fence_line when it opens or closes a code block. */
static int classify(const lg__text_t *x, bool *fence_line) {
  const char *h = x->head;
  int n = x->head_len;
  *fence_line = false;
  char c = h[0];
  if (c == '`' || c == '~') {
    for (int i = 1; i < n && i < 3; i++)
      if (h[i] != c) return x->fence ? LG__LINE_SKIP : LG__LINE_PROSE;
    if (n < 3) return 0;
    *fence_line = true;
    return LG__LINE_SKIP;
  }
  if (x->fence) return LG__LINE_SKIP;
  if (c == '|' || c == '#') return LG__LINE_SKIP;
  if (c == '-' || c == '*' || c == '+' || c == '=' || c == '_') {
    if (n < 2) return 0;
    if (h[1] == ' ' && (c == '-' || c == '*' || c == '+')) return LG__LINE_SKIP; /* list */
    if (h[1] != c) return LG__LINE_PROSE;
    if (n < 3) return 0;
    return h[2] == c ? LG__LINE_SKIP : LG__LINE_PROSE; /* divider */
  }
  if (c >= '0' && c <= '9') { /* "12. item", "3) item" */
    int i = 1;
    while (i < n && h[i] >= '0' && h[i] <= '9') i++;
    if (i == n) return n < 8 ? 0 : LG__LINE_PROSE;
    if (h[i] != '.' && h[i] != ')') return LG__LINE_PROSE;
    if (i + 1 == n) return 0;
    return h[i + 1] == ' ' ? LG__LINE_SKIP : LG__LINE_PROSE;
  }
  return LG__LINE_PROSE;
}

/* One byte at the start of a line (its kind not known yet). */
static bool line_start(lg__text_t *x, uint8_t c) {
  if (c == '\n') { /* the line ended before its kind was known */
    x->indent = 0;
    bool loop = false;
    for (int i = 0; i < x->head_len; i++) loop |= prose(x, (uint8_t)x->head[i]);
    loop |= prose(x, c);
    x->head_len = 0;
    return loop;
  }
  if (!x->head_len && (c == ' ' || c == '\t')) { /* indentation */
    if (x->indent < 64) x->indent = (uint8_t)(x->indent + (c == '\t' ? 4 : 1));
    return false;
  }
  x->head[x->head_len++] = (char)c;
  bool fence_line = false;
  /* Four columns of indentation is a Markdown code block (a fence inside
   * it is code too). */
  int kind = x->indent >= 4 && !x->fence ? LG__LINE_SKIP : classify(x, &fence_line);
  if (!kind && x->head_len < LG__LINE_HEAD) return false;
  if (!kind) kind = LG__LINE_PROSE;
  x->line = (uint8_t)kind;
  x->indent = 0;
  if (kind == LG__LINE_SKIP) {
    if (fence_line) x->fence = !x->fence;
    barrier(x);
    x->head_len = 0;
    return false;
  }
  bool loop = false;
  for (int i = 0; i < x->head_len; i++) loop |= prose(x, (uint8_t)x->head[i]);
  x->head_len = 0;
  return loop;
}

static bool chant_byte(lg__text_t *x, uint8_t c) {
  switch (x->line) {
  case LG__LINE_START: return line_start(x, c);
  case LG__LINE_PROSE: {
    bool loop = prose(x, c);
    if (c == '\n') x->line = LG__LINE_START;
    return loop;
  }
  default:
    if (c == '\n') x->line = LG__LINE_START;
    return false;
  }
}

static void mono_byte(lg__text_t *x, uint8_t c) {
  if (is_space(c)) {
    x->mono_space = x->mono_len > 0;
    return;
  }
  if (x->mono_space) {
    x->mono = (x->mono ^ ' ') * FNV64_PRIME;
    x->mono_len++;
    x->mono_space = false;
  }
  x->mono = (x->mono ^ c) * FNV64_PRIME;
  x->mono_len++;
}

static void text_reset(lg__text_t *x) {
  memset(x, 0, sizeof *x);
  barrier(x);
  x->mono = LG__FNV64_OFF;
}

void lg__text_begin(lg_run_t *run, int64_t turn) {
  lg__text_t *x = &run->text;
  if (x->open && x->mono_len > 0 && !x->mono_void) {
    if (run->mono_ref_len == x->mono_len && run->mono_ref == x->mono) {
      run->mono_run = lg__sat_add(run->mono_run, 1);
    } else {
      run->mono_ref = x->mono;
      run->mono_ref_len = x->mono_len;
      run->mono_run = 1;
    }
  }
  text_reset(x);
  x->open = true;
  x->turn = turn;
}

bool lg__text_feed(lg_run_t *run, const char *s, size_t n) {
  lg__text_t *x = &run->text;
  bool loop = false;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)s[i];
    mono_byte(x, c);
    loop |= chant_byte(x, c);
  }
  if (!loop || x->looped) return false;
  x->looped = true;
  return true;
}

void lg__text_clear(lg_run_t *run) {
  text_reset(&run->text);
  run->text_loops = 0;
  run->mono_ref = 0;
  run->mono_ref_len = 0;
  run->mono_run = 0;
}

void lg__text_call(lg_run_t *run) {
  run->mono_ref = 0;
  run->mono_ref_len = 0;
  run->mono_run = 0;
  run->text.mono_void = true;
}
