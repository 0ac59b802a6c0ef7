/* A wall-clock step for one process, as NTP or an operator makes one on a node: preloaded, it adds the
 * seconds written in the file $CLOCK_SHIFT_FILE (re-read at most once a second) to CLOCK_REALTIME,
 * gettimeofday() and time(). The monotonic clocks and every sleep are left alone, as a real step leaves
 * them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static double shift_seconds(void) {
    static double shift = 0.0;
    static struct timespec checked = {0, 0};
    static clock_gettime_fn real = NULL;
    struct timespec now;
    if (!real)
        real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    real(CLOCK_MONOTONIC, &now);
    if (checked.tv_sec == 0 || now.tv_sec > checked.tv_sec) {
        const char *path = getenv("CLOCK_SHIFT_FILE");
        FILE *file = path ? fopen(path, "r") : NULL;
        double read = 0.0;
        if (file) {
            if (fscanf(file, "%lf", &read) == 1)
                shift = read;
            fclose(file);
        }
        checked = now;
    }
    return shift;
}

static void add(struct timespec *ts, double seconds) {
    long long nanos = (long long)(seconds * 1e9);
    ts->tv_sec += nanos / 1000000000LL;
    ts->tv_nsec += nanos % 1000000000LL;
    if (ts->tv_nsec >= 1000000000L) { ts->tv_sec += 1; ts->tv_nsec -= 1000000000L; }
    if (ts->tv_nsec < 0) { ts->tv_sec -= 1; ts->tv_nsec += 1000000000L; }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static clock_gettime_fn real = NULL;
    if (!real)
        real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        add(ts, shift_seconds());
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    (void)tz;
    if (rc == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
