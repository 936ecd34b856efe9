//go:build capi

// signals.c: the Go runtime's threads never run the program's signal
// handlers.
//
// A C program installs handlers for asynchronous signals (perftest's
// SIGALRM ends a timed run; others catch SIGINT or SIGCHLD) without
// SA_ONSTACK, as C allows. The kernel delivers a process-directed signal
// to any thread that does not block it; on a thread of the Go runtime the
// handler would run on a goroutine's small stack and corrupt it (the
// runtime then crashes). So the runtime must start with those signals
// blocked: its threads inherit the mask of the thread that creates the
// runtime (in the library's constructor), and every thread the runtime
// makes later starts with that mask. sr_sig_block runs before the Go
// runtime's constructor (a constructor priority orders it first) and
// blocks every asynchronous signal the runtime does not need; the thin
// libraries' constructors, which run after this library's, call
// softrdma_sig_restore to give the program's thread its own mask back.
// Signals then reach the program's threads only, as without softrdma.
//
// A handler must also not run on a goroutine's stack when the signal
// reaches a program's thread while that thread is inside softrdma (its
// Go code runs on a goroutine stack): the Go runtime requires handlers
// installed by C code to have SA_ONSTACK (os/signal's documentation), so
// that they run on the alternate signal stack the runtime gives every
// thread that calls into Go. C programs rarely set it, so a thread of
// ours (sr_sig_fixer, started with every signal blocked) adds SA_ONSTACK
// to any handler installed without it, checking every 10 ms: a program
// installs its handler well before the signal comes (perftest's SIGALRM
// after alarm()).
//
// Left unblocked: the synchronous signals (a fault belongs to the thread
// that caused it), SIGPIPE, and SIGURG (the runtime's preemption signal,
// sent to its own threads).

#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include "capi.h"

static void *sr_sig_fixer(void *arg)
{
	(void)arg;
	for (;;) {
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		for (int s = 1; s < NSIG; s++) {
			struct sigaction sa, again;
			if (s == SIGKILL || s == SIGSTOP || sigaction(s, NULL, &sa) != 0)
				continue;
			if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN || (sa.sa_flags & SA_ONSTACK))
				continue;
			sa.sa_flags |= SA_ONSTACK;
			// Read again just before: a handler the program changed in
			// between is left for the next round.
			if (sigaction(s, NULL, &again) != 0 || again.sa_handler != sa.sa_handler ||
			    (again.sa_flags | SA_ONSTACK) != sa.sa_flags)
				continue;
			sigaction(s, &sa, NULL);
		}
		nanosleep(&ts, NULL);
	}
	return NULL;
}

static sigset_t sr_saved_mask;
static int sr_mask_saved;

__attribute__((constructor(101))) static void sr_sig_block(void)
{
	sigset_t all;
	static const int keep[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT, SIGPIPE, SIGURG };
	sigfillset(&all);
	for (unsigned i = 0; i < sizeof keep / sizeof keep[0]; i++)
		sigdelset(&all, keep[i]);
	if (pthread_sigmask(SIG_BLOCK, &all, &sr_saved_mask) == 0)
		sr_mask_saved = 1;
	{
		pthread_t t;
		pthread_attr_t a;
		sigset_t none, old;
		sigfillset(&none);
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&a, 64 * 1024);
		pthread_sigmask(SIG_BLOCK, &none, &old); // the fixer takes no signal
		if (pthread_create(&t, &a, sr_sig_fixer, NULL) == 0)
			pthread_setname_np(t, "softrdma-sig");
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&a);
	}
}

// softrdma_sig_restore gives the thread that loaded the libraries its
// signal mask back (once; the second thin library's call does nothing).
void softrdma_sig_restore(void)
{
	if (__atomic_exchange_n(&sr_mask_saved, 0, __ATOMIC_ACQ_REL))
		pthread_sigmask(SIG_SETMASK, &sr_saved_mask, NULL);
}
