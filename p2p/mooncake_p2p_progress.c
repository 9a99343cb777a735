/* mooncake-p2p: the progress display of a fetch and its summary. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mooncake_p2p_tool.h"

#define BAR_WIDTH       24
#define PLAIN_PERIOD_MS 1000

uint64_t tool_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

const char *tool_human(uint64_t bytes, char *buf, size_t size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;

    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

void tool_progress_init(tool_progress_t *p, const char *name, bool quiet, volatile int *stop)
{
    memset(p, 0, sizeof(*p));
    p->name = name;
    p->quiet = quiet;
    p->tty = isatty(STDERR_FILENO);
    p->stop = stop;
    p->start_ms = tool_now_ms();
}

/* Rate (bytes/s) over the whole fetch, and the ETA at that rate ("?" until there is one). */
static void rate_eta(const tool_progress_t *p, const mc_p2p_progress_t *pr, double *rate_p,
                     char *eta, size_t size)
{
    double secs = (double)(tool_now_ms() - p->start_ms) / 1000.0;
    double rate = secs > 0 ? (double)pr->bytes_done / secs : 0;

    *rate_p = rate;
    if (rate <= 0) {
        snprintf(eta, size, "?");
        return;
    }
    uint64_t left = (uint64_t)((double)(pr->bytes_total - pr->bytes_done) / rate);
    snprintf(eta, size, "%" PRIu64 ":%02" PRIu64, left / 60, left % 60);
}

static void draw(tool_progress_t *p, const mc_p2p_progress_t *pr)
{
    char done[32], total[32], rate_s[32], eta[32], bar[BAR_WIDTH + 1];
    double frac = pr->bytes_total ? (double)pr->bytes_done / (double)pr->bytes_total : 1, rate;
    int fill = (int)(frac * BAR_WIDTH);

    rate_eta(p, pr, &rate, eta, sizeof(eta));
    memset(bar, '#', (size_t)fill);
    memset(bar + fill, '.', (size_t)(BAR_WIDTH - fill));
    bar[BAR_WIDTH] = '\0';
    tool_human(pr->bytes_done, done, sizeof(done));
    tool_human(pr->bytes_total, total, sizeof(total));
    tool_human((uint64_t)rate, rate_s, sizeof(rate_s));
    if (p->tty)
        fprintf(stderr, "\r%s [%s] %5.1f%% %s/%s %s/s ETA %s holders %u\033[K", p->name, bar,
                frac * 100, done, total, rate_s, eta, pr->holders_in_use);
    else
        fprintf(stderr, "%s: %.1f%% %s/%s %s/s ETA %s holders %u corrupt %u retries %u\n", p->name,
                frac * 100, done, total, rate_s, eta, pr->holders_in_use, pr->corrupt, pr->retries);
    fflush(stderr);
}

int tool_progress_cb(void *arg, const mc_p2p_progress_t *pr)
{
    tool_progress_t *p = arg;
    uint64_t now = tool_now_ms();

    if (!p->quiet && (p->tty || now - p->last_ms >= PLAIN_PERIOD_MS)) {
        p->last_ms = now;
        draw(p, pr);
    }
    return p->stop && *p->stop;
}

void tool_progress_done(tool_progress_t *p, const mc_p2p_progress_t *pr, int rc, bool json)
{
    double secs = (double)(tool_now_ms() - p->start_ms) / 1000.0;

    if (p->tty && !p->quiet)
        fputc('\n', stderr);
    if (json)
        printf("{\"name\":\"%s\",\"ok\":%s,\"bytes\":%" PRIu64 ",\"seconds\":%.3f,"
               "\"from_origin\":%" PRIu64 ",\"from_replicas\":%" PRIu64 ",\"corrupt\":%u,"
               "\"retries\":%u}\n",
               p->name, rc ? "false" : "true", pr->bytes_done, secs, pr->bytes_from_origin,
               pr->bytes_from_replicas, pr->corrupt, pr->retries);
    else if (!rc)
        printf("fetched %s: %" PRIu64 " bytes in %.2f s (%.1f MiB/s); from the origin %" PRIu64
               ", from replicas %" PRIu64 "; corrupt %u, retries %u\n",
               p->name, pr->bytes_done, secs,
               secs > 0 ? (double)pr->bytes_done / secs / (1 << 20) : 0.0, pr->bytes_from_origin,
               pr->bytes_from_replicas, pr->corrupt, pr->retries);
    fflush(stdout);
}
