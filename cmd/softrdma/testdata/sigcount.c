/* sigcount: counts the SIGINTs it gets (one handler call each) until
 * SIGUSR1, then prints the count. For TestExecSysfsViewTerminal. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t ints, usr1;

static void on_int(int s)
{
	(void)s;
	ints++;
	(void)!write(1, "int\n", 4);
}

static void on_usr1(int s)
{
	(void)s;
	usr1 = 1;
}

int main(void)
{
	struct sigaction sa;
	sigset_t block, wait;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_int;
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigprocmask(SIG_BLOCK, &block, &wait);
	sigdelset(&wait, SIGUSR1);
	printf("ready\n");
	fflush(stdout);
	while (!usr1)
		sigsuspend(&wait);
	printf("total=%d\n", (int)ints);
	return 0;
}
