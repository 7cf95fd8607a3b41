/* In-process SQLite load driver: one connection, one prepared statement, called in a
 * tight loop with a random key per call. Prints one line of JSON: calls/s and latency
 * percentiles. Built by scripts/bench.sh with the system's libsqlite3.
 *
 *   sqlite_driver DB EXTENSION JOURNAL SQL KEYS SECONDS [CACHE_KIB]
 *   SQL has one parameter, the key (text); JOURNAL is wal or delete; CACHE_KIB, when
 *   given, sets the connection's page cache (PRAGMA cache_size=-CACHE_KIB; SQLite's
 *   default is 2,000 KiB). */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check(int rc, sqlite3 *db, const char *what) {
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
        fprintf(stderr, "%s: %s\n", what, sqlite3_errmsg(db));
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: %s DB EXTENSION JOURNAL SQL KEYS SECONDS [CACHE_KIB]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1], *ext = argv[2], *journal = argv[3], *sql = argv[4];
    long keys = atol(argv[5]);
    double seconds = atof(argv[6]);
    sqlite3 *db;
    char *err = NULL, pragma[192];
    check(sqlite3_open(path, &db), db, "open");
    sqlite3_busy_timeout(db, 10000);
    sqlite3_enable_load_extension(db, 1);
    if (sqlite3_load_extension(db, ext, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "load: %s\n", err);
        return 1;
    }
    snprintf(pragma, sizeof pragma, "PRAGMA journal_mode=%s; PRAGMA synchronous=%s; PRAGMA cache_size=%ld;", journal,
             strcmp(journal, "wal") == 0 ? "normal" : "full", argc == 8 ? -atol(argv[7]) : -2000L);
    check(sqlite3_exec(db, pragma, NULL, NULL, NULL), db, "pragma");
    sqlite3_stmt *stmt;
    check(sqlite3_prepare_v2(db, sql, -1, &stmt, NULL), db, "prepare");

    size_t cap = 1 << 20, n = 0;
    double *lat = malloc(cap * sizeof *lat);
    char key[32];
    unsigned long long rng = 88172645463325252ULL;
    double start = now_s(), end = start + seconds;
    while (1) {
        double t0 = now_s();
        if (t0 >= end) break;
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        snprintf(key, sizeof key, "k%lld", (long long)(rng % (unsigned long long)keys) + 1);
        if (sqlite3_bind_parameter_count(stmt) > 0)
            sqlite3_bind_text(stmt, 1, key, -1, SQLITE_TRANSIENT);
        int rc;
        while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {}
        check(rc, db, "step");
        sqlite3_reset(stmt);
        if (n == cap) lat = realloc(lat, (cap *= 2) * sizeof *lat);
        lat[n++] = now_s() - t0;
    }
    double elapsed = now_s() - start;
    qsort(lat, n, sizeof *lat, cmp);
    printf("{\"calls\": %zu, \"calls_per_s\": %.1f, \"p50_ms\": %.4f, \"p99_ms\": %.4f}\n", n, n / elapsed,
           lat[n / 2] * 1e3, lat[(size_t)(n * 0.99)] * 1e3);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return 0;
}
