/*
 * fiber.c — fibers (fiber.h). On x86-64 a switch is ours: the registers a
 * call keeps (rbx, rbp, r12-r15) pushed on the stack left, the stack
 * pointer swapped, popped from the other. Elsewhere ucontext's
 * swapcontext, which also saves the signal mask: a system call each way
 * (3.5 a gateway request when it was used here). The fibers never change
 * the signal mask or the floating point modes, so these are not saved.
 *
 * AddressSanitizer keeps a shadow of every stack and must be told when a
 * thread moves to another one (__sanitizer_start_switch_fiber before the
 * switch, __sanitizer_finish_switch_fiber after it), or it reads the
 * fiber's frames as overflows of the thread's stack.
 */
#include "fiber.h"
#include "internal.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FIB_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(FIB_ASAN)
#define FIB_ASAN 1
#endif
#ifdef FIB_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__)
#define FIB_ASM 1
/* lg__fiber_switch(&from_sp, to_sp): saves this side's registers and
 * stack pointer in *from_sp, goes on from to_sp's. */
__asm__(".text\n"
        ".globl lg__fiber_switch\n"
        ".hidden lg__fiber_switch\n"
        ".type lg__fiber_switch,@function\n"
        "lg__fiber_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size lg__fiber_switch,.-lg__fiber_switch\n");
void lg__fiber_switch(void **from, void *to);
#else
#include <ucontext.h>
#endif

struct lg__fiber {
#ifdef FIB_ASM
  void *sp;                 /* the fiber's stack pointer, while it is stopped */
  void *back_sp;            /* the thread's, while the fiber runs */
#else
  ucontext_t ctx;           /* the fiber's, while it is stopped */
  ucontext_t back;          /* the thread's, while the fiber runs */
#endif
  char *map;                /* the guard page and the stack */
  size_t map_len;
  char *stack;
  size_t size;
  void (*fn)(void *);
  void *arg;
  int running;              /* fn started and has not returned */
#ifdef FIB_ASAN
  void *fake_self, *fake_back;
  const void *back_bottom;
  size_t back_size;
#endif
};

static _Thread_local lg__fiber_t *tl_self;

lg__fiber_t *lg__fiber_self(void) { return tl_self; }

lg__fiber_t *lg__fiber_new(size_t stack) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  stack = (stack + pg - 1) & ~(pg - 1);
  lg__fiber_t *f = lg__calloc(1, sizeof *f);
  if (!f) return NULL;
  f->map_len = stack + pg;
  void *m = mmap(NULL, f->map_len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) {
    lg__free(f);
    return NULL;
  }
  f->map = m;
  mprotect(f->map, pg, PROT_NONE); /* an overflow faults here, not in a neighbour */
  f->stack = f->map + pg;
  f->size = stack;
  return f;
}

void lg__fiber_free(lg__fiber_t *f) {
  if (!f) return;
  munmap(f->map, f->map_len);
  lg__free(f);
}

/* In the fiber, just after the thread switched to it. */
static void arrived(lg__fiber_t *f) {
#ifdef FIB_ASAN
  __sanitizer_finish_switch_fiber(f->fake_self, &f->back_bottom, &f->back_size);
#else
  (void)f;
#endif
}

/* From the fiber to the thread, for good (fn returned) or until resumed. */
static void to_thread(lg__fiber_t *f, int end) {
#ifdef FIB_ASAN
  __sanitizer_start_switch_fiber(end ? NULL : &f->fake_self, f->back_bottom, f->back_size);
#endif
#ifdef FIB_ASM
  lg__fiber_switch(&f->sp, f->back_sp);
#else
  if (end) setcontext(&f->back);
  else swapcontext(&f->ctx, &f->back);
#endif
}

static void trampoline(void) {
  lg__fiber_t *f = tl_self;
  arrived(f);
  f->fn(f->arg);
  f->running = 0;
  to_thread(f, 1); /* never back here: the next start begins anew */
}

/* The thread into f, until f yields or returns. */
static int enter(lg__fiber_t *f) {
  lg__fiber_t *outer = tl_self;
  tl_self = f;
#ifdef FIB_ASAN
  __sanitizer_start_switch_fiber(&f->fake_back, f->stack, f->size);
#endif
#ifdef FIB_ASM
  lg__fiber_switch(&f->back_sp, f->sp);
#else
  swapcontext(&f->back, &f->ctx);
#endif
#ifdef FIB_ASAN
  __sanitizer_finish_switch_fiber(f->fake_back, NULL, NULL);
#endif
  tl_self = outer;
  return f->running;
}

int lg__fiber_start(lg__fiber_t *f, void (*fn)(void *), void *arg) {
  if (f->running) return 0;
#ifdef FIB_ASM
  /* The stack as lg__fiber_switch leaves it: six registers (zero), then
   * the address it returns to, the trampoline, which starts as if called
   * (a return address of 0 above it, the stack 16-aligned under that). */
  uintptr_t top = ((uintptr_t)f->stack + f->size) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = NULL;               /* the trampoline's return address: none */
  void (*entry)(void) = trampoline; /* where the first switch returns to */
  memcpy(--sp, &entry, sizeof entry);
  for (int i = 0; i < 6; i++) *--sp = NULL;
  f->sp = sp;
#else
  if (getcontext(&f->ctx)) return 0;
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = f->size;
  f->ctx.uc_link = NULL;
  makecontext(&f->ctx, trampoline, 0);
#endif
  f->fn = fn;
  f->arg = arg;
  f->running = 1;
#ifdef FIB_ASAN
  f->fake_self = NULL;
#endif
  return enter(f);
}

int lg__fiber_resume(lg__fiber_t *f) { return f->running ? enter(f) : 0; }

void lg__fiber_yield(void) {
  lg__fiber_t *f = tl_self;
  if (!f) return;
  to_thread(f, 0);
  arrived(f);
}
