/* yield_handover: what one hand-over of a core between two processes costs when each
 * waits for the other with sched_yield (as barrier waiters do on a node with more ranks
 * than cores): both pinned to CPU 0, a shared counter passed back and forth N times.
 *
 *   cc -O2 -o yield_handover bench/progs/yield_handover.c && ./yield_handover
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>
int main(){
  cpu_set_t s; CPU_ZERO(&s); CPU_SET(0,&s); sched_setaffinity(0,sizeof s,&s);
  _Atomic long *c = mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  long N=200000;
  pid_t p=fork();
  int me = p==0;
  struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
  for(long i=0;i<N;i++){ while(atomic_load(c)%2!=me) sched_yield(); atomic_fetch_add(c,1);}
  clock_gettime(CLOCK_MONOTONIC,&b);
  if(!me){wait(0); printf("%.3f us per hand-over\n", ((b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec))/1e3/(2*N));}
  return 0;
}
