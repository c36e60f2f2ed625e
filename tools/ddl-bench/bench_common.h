/*
 * bench_common.h: what ddl-bench (tools/ddl-bench/main.cpp, C++, libddl) and mpi-allreduce-bench
 * (bench/mpi_allreduce.c, C, MPI) share, so that the two print the same table and JSON the same way and read
 * the same flags with the same words: the sweep flags (-b -e -f -i -n -w -c) and their checks, the
 * nccl-tests table (sweep line, rank list, column header, rows, footer) and the --json writer.
 *
 * Plain C, static inline, usable from C and C++; nothing here knows MPI or libddl. A rank's collective work
 * (timing, checking, gathering the rank lines) stays in each program. Errors in flags go through the
 * program's own bad_flag function, which prints (see bench_report_bad_flag) and does not return.
 */
#ifndef DDL_BENCH_COMMON_H
#define DDL_BENCH_COMMON_H

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The usage lines of the sweep flags, the same in both programs. */
#define BENCH_USAGE_SWEEP_FLAGS                                                                             \
  "  -b, --minbytes SIZE      smallest message, bytes; suffix K, M or G (default 8)\n"                      \
  "  -e, --maxbytes SIZE      largest message (default 64M)\n"                                              \
  "  -f, --stepfactor N       multiply the size by N each step (default 2)\n"                               \
  "  -i, --stepbytes SIZE     add SIZE each step instead; used when -f is not given or is 1 (default 1M)\n" \
  "  -n, --iters N            timed iterations per size (default 20)\n"                                     \
  "  -w, --warmup_iters N     untimed iterations before them (default 5)\n"                                 \
  "  -c, --check N            check the result N times per size, 0 to skip (default 1)\n"

/* getopt_long's short options for the sweep flags, and their entries in its table of struct option (from
 * <getopt.h>, included by the program). */
#define BENCH_SWEEP_SHORT_OPTIONS "b:e:f:i:n:w:c:"
/* clang-format off */
#define BENCH_SWEEP_LONG_OPTIONS                  \
  {"minbytes", required_argument, NULL, 'b'},     \
  {"maxbytes", required_argument, NULL, 'e'},     \
  {"stepfactor", required_argument, NULL, 'f'},   \
  {"stepbytes", required_argument, NULL, 'i'},    \
  {"iters", required_argument, NULL, 'n'},        \
  {"warmup_iters", required_argument, NULL, 'w'}, \
  {"check", required_argument, NULL, 'c'}
/* clang-format on */

/* The bytes of one "#  Rank ..." line as the ranks exchange them (NUL-padded). */
#define BENCH_RANK_LINE 160

/* A program's handler for a bad flag: says "PROGRAM: FLAG: <format, ...>" and exits with 2; never returns. */
typedef void (*bench_bad_flag_fn)(const char* flag, const char* format, ...);

/* The sizes and iterations of a sweep, as the flags give them. */
struct bench_sweep {
  size_t min_bytes;
  size_t max_bytes;
  size_t step_factor;
  size_t step_bytes;
  int iters;
  int warmup_iters;
  int check; /* check iterations per size and variant; 0: no check ("N/A") */
};

/* nccl-tests' defaults: -b 8 -e 64M -f 2 -i 1M -n 20 -w 5 -c 1. */
static inline struct bench_sweep bench_sweep_defaults(void) {
  struct bench_sweep s = {8, (size_t)64 << 20, 2, (size_t)1 << 20, 20, 5, 1};
  return s;
}

struct bench_variant {
  double time_us;
  double algbw; /* GB/s, GB = 1e9 bytes */
  double busbw;
  long long wrong; /* -1 when not checked */
};

/* One size of the sweep: out-of-place and in-place. */
struct bench_row {
  size_t bytes;
  size_t count;
  struct bench_variant out_of_place;
  struct bench_variant in_place;
};

/* ---- Flags ---- */

/* Prints "PROGRAM: FLAG: <message>" and the pointer to --help on stderr: the body of a bad_flag handler. One
 * fprintf, so that a rank stopped by its launcher just after cannot leave half a message. */
static inline void bench_report_bad_flag(const char* program, const char* flag, const char* format,
                                         va_list args) {
  va_list copy;
  va_copy(copy, args);
  int len = vsnprintf(NULL, 0, format, copy);
  va_end(copy);
  char* what = len >= 0 ? (char*)malloc((size_t)len + 1) : NULL;
  if (what != NULL) vsnprintf(what, (size_t)len + 1, format, args);
  fprintf(stderr, "%s: %s: %s\n(%s --help lists the flags)\n", program, flag, what != NULL ? what : format,
          program);
  free(what);
}

/* "8", "64M", "1.5K", "1G": a byte count as nccl-tests reads it (binary K/M/G; fractions rounded down). */
static inline size_t bench_parse_size(const char* flag, const char* text, bench_bad_flag_fn bad_flag) {
  char* end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  int ok = end != text && errno == 0 && isfinite(v) && v >= 0 && isdigit((unsigned char)text[0]);
  if (ok && *end != '\0') {
    switch (*end) {
      case 'k':
      case 'K':
        v *= 1 << 10;
        break;
      case 'm':
      case 'M':
        v *= 1 << 20;
        break;
      case 'g':
      case 'G':
        v *= 1 << 30;
        break;
      default:
        ok = 0;
    }
    ok = ok && end[1] == '\0';
  }
  if (!ok || v >= 0x1p62) {
    bad_flag(flag, "invalid size '%s' (use bytes, optionally with K, M or G: 8, 64M)", text);
    return 0;
  }
  return (size_t)v;
}

static inline long long bench_parse_integer(const char* flag, const char* text, long long min, long long max,
                                            bench_bad_flag_fn bad_flag) {
  char* end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < min || v > max) {
    bad_flag(flag, "invalid value '%s' (use an integer from %lld to %lld)", text, min, max);
  }
  return v;
}

/* One sweep flag (c is getopt's answer, arg its optarg) into s; 0 if c is not one of b e f i n w c. */
static inline int bench_parse_sweep_flag(int c, const char* arg, struct bench_sweep* s, int* factor_given,
                                         int* step_given, bench_bad_flag_fn bad_flag) {
  switch (c) {
    case 'b':
      s->min_bytes = bench_parse_size("-b", arg, bad_flag);
      return 1;
    case 'e':
      s->max_bytes = bench_parse_size("-e", arg, bad_flag);
      return 1;
    case 'f':
      s->step_factor = (size_t)bench_parse_integer("-f", arg, 1, 1 << 20, bad_flag);
      *factor_given = 1;
      return 1;
    case 'i':
      s->step_bytes = bench_parse_size("-i", arg, bad_flag);
      *step_given = 1;
      return 1;
    case 'n':
      s->iters = (int)bench_parse_integer("-n", arg, 1, 1 << 30, bad_flag);
      return 1;
    case 'w':
      s->warmup_iters = (int)bench_parse_integer("-w", arg, 0, 1 << 30, bad_flag);
      return 1;
    case 'c':
      s->check = (int)bench_parse_integer("-c", arg, 0, 1 << 20, bad_flag);
      return 1;
    default:
      return 0;
  }
}

/* After the last flag. As nccl-tests: the sizes grow by the factor when it is above 1, else by the step; -i
 * alone means steps. Then the checks that need all the flags. */
static inline void bench_finish_sweep(struct bench_sweep* s, int factor_given, int step_given,
                                      bench_bad_flag_fn bad_flag) {
  if (step_given && !factor_given) s->step_factor = 1;
  if (s->step_factor == 1 && s->step_bytes == 0) bad_flag("-i", "must be above 0 when sizes grow linearly");
  if (s->step_factor > 1 && s->min_bytes == 0) bad_flag("-b", "must be above 0 when sizes grow by a factor");
  if (s->min_bytes > s->max_bytes)
    bad_flag("-b", "minbytes %zu is above maxbytes %zu", s->min_bytes, s->max_bytes);
}

/* ---- The sweep ---- */

/* The size after *size; 0 (leaving *size) when that would pass max_bytes. */
static inline int bench_next_size(const struct bench_sweep* s, size_t* size) {
  if (s->step_factor > 1) {
    if (*size > s->max_bytes / s->step_factor) return 0;
    *size *= s->step_factor;
  } else {
    if (*size > s->max_bytes - s->step_bytes) return 0;
    *size += s->step_bytes;
  }
  return 1;
}

/* algbw and busbw from time_us, as nccl-tests computes them for allreduce. */
static inline void bench_set_bandwidth(struct bench_variant* v, double bytes, int nranks) {
  v->algbw = bytes / (v->time_us * 1e3);
  v->busbw = v->algbw * 2.0 * (nranks - 1) / nranks;
}

/* ---- The table ---- */

/* This rank's line of "# Using ranks", NUL-padded to len bytes. */
static inline void bench_rank_line(char* line, size_t len, int rank) {
  char host[64] = {0};
  gethostname(host, sizeof host - 1);
  memset(line, 0, len);
  snprintf(line, len, "#  Rank %2d Pid %6d on %10s", rank, (int)getpid(), host);
}

static inline void bench_print_sweep(const struct bench_sweep* s) {
  printf("# minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d validation: %d\n",
         s->min_bytes, s->max_bytes, s->step_factor > 1 ? s->step_factor : s->step_bytes,
         s->step_factor > 1 ? "factor" : "bytes", s->warmup_iters, s->iters, s->check);
}

/* The rest of the header after the program's own lines: the ranks (nranks lines of BENCH_RANK_LINE bytes, in
 * rank order) and the column titles. */
static inline void bench_print_table_head(const char* lines, int nranks) {
  printf("#\n# Using ranks\n");
  for (int r = 0; r < nranks; ++r) printf("%.*s\n", BENCH_RANK_LINE - 1, lines + (size_t)r * BENCH_RANK_LINE);
  printf("#\n");
  printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "",
         "", "", "", "");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
         "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "",
         "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  fflush(stdout);
}

/* nccl-tests' time column: two decimals below 100 us, one below 10 ms, none above. */
static inline void bench_format_time(char* buf, size_t len, double us) {
  snprintf(buf, len, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

/* One row of the table; type and redop as nccl-tests spells them. */
static inline void bench_print_row(const struct bench_row* r, const char* type, const char* redop) {
  printf("%12zu  %12zu  %8s  %6s  %6d", r->bytes, r->count, type, redop, -1);
  const struct bench_variant* vs[2] = {&r->out_of_place, &r->in_place};
  for (int k = 0; k < 2; ++k) {
    char time[32], wrong[32];
    bench_format_time(time, sizeof time, vs[k]->time_us);
    if (vs[k]->wrong >= 0) {
      snprintf(wrong, sizeof wrong, "%5g", (double)vs[k]->wrong);
    } else {
      snprintf(wrong, sizeof wrong, "%5s", "N/A");
    }
    printf("  %7s  %6.2f  %6.2f  %5s", time, vs[k]->algbw, vs[k]->busbw, wrong);
  }
  printf("\n");
  fflush(stdout);
}

struct bench_summary {
  long long total_wrong;
  int failed_checks; /* nccl-tests' "Out of bounds values": checks that found any wrong value */
  double avg_busbw;
};

static inline struct bench_summary bench_summarize(const struct bench_row* rows, size_t nrows) {
  struct bench_summary s = {0, 0, 0.0};
  double busbw_sum = 0;
  for (size_t i = 0; i < nrows; ++i) {
    const struct bench_variant* vs[2] = {&rows[i].out_of_place, &rows[i].in_place};
    for (int k = 0; k < 2; ++k) {
      if (vs[k]->wrong > 0) {
        s.total_wrong += vs[k]->wrong;
        ++s.failed_checks;
      }
      busbw_sum += vs[k]->busbw;
    }
  }
  s.avg_busbw = nrows ? busbw_sum / (2.0 * nrows) : 0.0;
  return s;
}

/* The table's footer. */
static inline void bench_print_summary(const struct bench_summary* s) {
  printf("# Out of bounds values : %d %s\n", s->failed_checks, s->failed_checks ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g \n", s->avg_busbw);
  printf("#\n");
  if (s->total_wrong > 0) printf("# FAILED: %lld wrong values\n", s->total_wrong);
  fflush(stdout);
}

/* ---- JSON ---- */

static inline void bench_json_string(FILE* f, const char* s) {
  fputc('"', f);
  for (; *s != '\0'; ++s) {
    unsigned char u = (unsigned char)*s;
    if (*s == '"' || *s == '\\') {
      fputc('\\', f);
      fputc(*s, f);
    } else if (u < 0x20) {
      fprintf(f, "\\u%04x", u);
    } else {
      fputc(*s, f);
    }
  }
  fputc('"', f);
}

/* A number as JSON has it: no inf or nan. */
static inline void bench_json_number(FILE* f, double v) {
  if (isfinite(v)) {
    fprintf(f, "%.6g", v);
  } else {
    fputs("null", f);
  }
}

static inline void bench_json_wrong(FILE* f, long long wrong) {
  if (wrong >= 0) {
    fprintf(f, "%lld", wrong);
  } else {
    fputs("null", f);
  }
}

/* One variant's fields of a result, their names prefixed ("" out of place, "inplace_" in place). */
static inline void bench_json_variant(FILE* f, const char* prefix, const struct bench_variant* v) {
  fprintf(f, ", \"%stime_us\": ", prefix);
  bench_json_number(f, v->time_us);
  fprintf(f, ", \"%salgbw_GBs\": ", prefix);
  bench_json_number(f, v->algbw);
  fprintf(f, ", \"%sbusbw_GBs\": ", prefix);
  bench_json_number(f, v->busbw);
  fprintf(f, ", \"%swrong\": ", prefix);
  bench_json_wrong(f, v->wrong);
}

/* "PROGRAM: --json: cannot write 'PATH': <errno's text>" on stderr. */
static inline void bench_json_cannot_write(const char* program, const char* path) {
  fprintf(stderr, "%s: --json: cannot write '%s': %s\n", program, path, strerror(errno));
}

/* Writes the results to f (opened on path) in ddl-bench's --json schema and closes f. type and redop as the
 * JSON spells them. Returns 0 if that failed, after saying so. */
static inline int bench_write_json(FILE* f, const char* program, const char* path, int nranks,
                                   const char* topology, const char* algo, const char* type,
                                   const char* redop, const struct bench_row* rows, size_t nrows) {
  fprintf(f, "{\"ranks\": %d, \"topology\": ", nranks);
  bench_json_string(f, topology);
  fputs(", \"algo\": ", f);
  bench_json_string(f, algo);
  fputs(", \"results\": [", f);
  for (size_t i = 0; i < nrows; ++i) {
    const struct bench_row* r = &rows[i];
    fprintf(f, "%s{\"bytes\": %zu, \"count\": %zu, \"type\": ", i == 0 ? "\n  " : ",\n  ", r->bytes,
            r->count);
    bench_json_string(f, type);
    fputs(", \"redop\": ", f);
    bench_json_string(f, redop);
    fputs(", \"algo\": ", f);
    bench_json_string(f, algo);
    bench_json_variant(f, "", &r->out_of_place);
    bench_json_variant(f, "inplace_", &r->in_place);
    fputs("}", f);
  }
  fputs(nrows == 0 ? "]}\n" : "\n]}\n", f);
  int failed = ferror(f);
  if (fclose(f) != 0 || failed) {
    bench_json_cannot_write(program, path);
    return 0;
  }
  return 1;
}

#endif /* DDL_BENCH_COMMON_H */
