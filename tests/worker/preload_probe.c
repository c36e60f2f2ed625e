/* A library for LD_PRELOAD in supervisor_test: every process that loads it appends its effective uid to the file
 * $DDL_PRELOAD_PROBE_OUT, so a test sees whether any root process ran with a job's environment. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void probe(void) {
  const char* out = getenv("DDL_PRELOAD_PROBE_OUT");
  if (out == NULL) return;
  FILE* f = fopen(out, "a");
  if (f == NULL) return;
  fprintf(f, "euid=%u\n", (unsigned)geteuid());
  fclose(f);
}
