/*
 * mooncake-p2p: publish, fetch, list, serve and remove objects of the P2P store.
 *
 * Exit codes, which scripts may rely on (also printed by --help):
 *   0   success (publish and serve: interrupted by SIGINT/SIGTERM after serving, as intended)
 *   1   usage: a bad command line or argument (a bad object name, size or number)
 *   2   not found: no object of that name
 *   3   verification failed: a shard's every holder sent bytes that do not match its checksum
 *       (fetch), or the local file does not match the object (serve)
 *   4   the metadata store cannot be reached
 *   5   peers or transfers failed: some shard has no live holder, timeouts
 *   6   publish: the name is taken (--force replaces the object)
 *   7   a local file or resource: cannot open, map, reserve space, write, rename
 *   130 fetch interrupted by SIGINT or SIGTERM (the partial file is removed)
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_p2p_tool.h"

static const char usage_text[] =
    "usage: mooncake-p2p [--metadata URL] [--listen ADDR] COMMAND ARGS [OPTIONS]\n"
    "\n"
    "commands:\n"
    "  publish FILE NAME [--shard-size B] [--force]\n"
    "        publish FILE as object NAME and serve it until SIGINT/SIGTERM\n"
    "  fetch NAME OUT [--no-p2p] [--max-inflight N] [--random] [--serve-after]\n"
    "                 [--limit-rate B] [--timeout-ms MS] [--json] [--quiet]\n"
    "        fetch NAME into the file OUT from every holder, verifying each shard; with\n"
    "        --serve-after go on serving it until SIGINT/SIGTERM. --no-p2p: only from the\n"
    "        origin, and serve nobody (a comparison)\n"
    "  list [PREFIX]\n"
    "        objects (name, size, shards, holders, complete holders, origin)\n"
    "  serve NAME FILE\n"
    "        verify FILE against NAME, then serve it as a complete holder until interrupted\n"
    "  rm NAME [--keep-replicas]\n"
    "        remove NAME's description and, unless --keep-replicas, every holder's entry\n"
    "\n"
    "options:\n"
    "  --metadata URL   etcd://HOST:PORT[,...] or file://DIR (default: MC_METADATA, else the\n"
    "                   engine's file:// store of this user)\n"
    "  --listen ADDR    the engine's tcp endpoint, as MC_LISTEN (default 127.0.0.1:0)\n"
    "  sizes take a K, M or G suffix (powers of 1024)\n"
    "\n"
    "exit codes: 0 ok, 1 usage, 2 not found, 3 verification failed, 4 metadata unreachable,\n"
    "  5 peer or transfer failure, 6 name exists, 7 local file error, 130 interrupted\n";

enum opt_id {
    OPT_METADATA = 1,
    OPT_LISTEN,
    OPT_SHARD_SIZE,
    OPT_FORCE,
    OPT_NO_P2P,
    OPT_MAX_INFLIGHT,
    OPT_RANDOM,
    OPT_SERVE_AFTER,
    OPT_LIMIT_RATE,
    OPT_TIMEOUT,
    OPT_JSON,
    OPT_QUIET,
    OPT_KEEP,
    OPT_HELP,
    OPT_VERSION,
};

#define BIT(o) (1u << (o))

typedef struct tool_opts {
    const char *metadata, *listen;
    uint64_t shard_size, limit_rate, max_inflight, timeout_ms;
    unsigned seen; /* BIT(opt_id) of each option given */
    char **args;
    int nargs;
} tool_opts_t;

typedef struct tool_cmd {
    const char *name;
    int min_args, max_args;
    unsigned allowed;
    int (*run)(mc_p2p_t *p2p, tool_opts_t *o);
} tool_cmd_t;

/* ---- signals ---- */

static volatile int interrupted;
static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sig_cond = PTHREAD_COND_INITIALIZER;

/* SIGINT and SIGTERM are blocked in every thread (the engine's inherit the mask) and taken
 * here: a handler could not safely stop a fetch or wake a waiting command. */
static void *signal_thread(void *arg)
{
    sigset_t *set = arg;
    int sig;

    while (sigwait(set, &sig) == 0) {
        pthread_mutex_lock(&sig_lock);
        interrupted = sig;
        pthread_cond_broadcast(&sig_cond);
        pthread_mutex_unlock(&sig_lock);
    }
    return NULL;
}

static int signals_start(void)
{
    static sigset_t set;
    pthread_t tid;

    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) || pthread_create(&tid, NULL, signal_thread, &set)) {
        fprintf(stderr, "mooncake-p2p: cannot set up signal handling\n");
        return EXIT_LOCAL;
    }
    pthread_detach(tid);
    return 0;
}

static void wait_interrupt(void)
{
    pthread_mutex_lock(&sig_lock);
    while (!interrupted)
        pthread_cond_wait(&sig_cond, &sig_lock);
    pthread_mutex_unlock(&sig_lock);
}

/* ---- errors ---- */

static int exit_code(int rc)
{
    switch (rc) {
    case 0:
        return EXIT_OK;
    case -ENOENT:
        return EXIT_NOT_FOUND;
    case -EILSEQ:
        return EXIT_VERIFY;
    case -MC_EMETA:
        return EXIT_META;
    case -EEXIST:
        return EXIT_EXISTS;
    case -EINVAL:
    case -ENAMETOOLONG:
    case -MC_ECONFIG:
        return EXIT_USAGE;
    case -MC_ECANCELED:
        return EXIT_INTERRUPT;
    case -ENOMEM:
        return EXIT_LOCAL;
    default:
        return EXIT_TRANSFER;
    }
}

/* The library's reasons name the object: the command is all they lack. */
static int report(const char *cmd, int rc)
{
    if (rc)
        fprintf(stderr, "mooncake-p2p: %s: %s (%s)\n", cmd, mc_p2p_last_error(), mc_err_name(rc));
    return exit_code(rc);
}

/* ---- commands ---- */

static int cmd_publish(mc_p2p_t *p2p, tool_opts_t *o)
{
    const char *file = o->args[0], *name = o->args[1];
    mc_p2p_register_opts_t ro = {
        .size = sizeof(ro), .shard_size = o->shard_size, .force = !!(o->seen & BIT(OPT_FORCE))};
    mc_p2p_object_info_t info;
    tool_map_t m;
    int rc = tool_map_in(file, &m);

    if (rc)
        return rc;
    rc = mc_p2p_register(p2p, name, &(mc_p2p_buf_t){m.addr, m.len}, 1, &ro);
    if (rc) {
        tool_map_done(&m, rc);
        return report("publish", rc);
    }
    if (mc_p2p_stat(p2p, name, &info) == 0)
        printf("published %s: %llu bytes, %u shards of %llu, from %s; serving until "
               "interrupted\n",
               name, (unsigned long long)info.size, info.shards,
               (unsigned long long)info.shard_size, info.origin);
    fflush(stdout);
    wait_interrupt();
    /* The description goes; the replicas others hold go on serving fetches under way. */
    rc = mc_p2p_unregister(p2p, name, 1);
    tool_map_done(&m, rc);
    return rc ? report("publish (withdrawing)", rc) : EXIT_OK;
}

static int fetch_into(mc_p2p_t *p2p, tool_opts_t *o, tool_map_t *m, tool_progress_t *pp)
{
    mc_p2p_get_opts_t go = {.size = sizeof(go),
                            .max_inflight = (unsigned)o->max_inflight,
                            .order =
                                o->seen & BIT(OPT_RANDOM) ? MC_P2P_RANDOM : MC_P2P_RAREST_FIRST,
                            .origin_only = !!(o->seen & BIT(OPT_NO_P2P)),
                            .no_serve = !!(o->seen & BIT(OPT_NO_P2P)),
                            .shard_timeout_ms = (unsigned)o->timeout_ms,
                            .cb = tool_progress_cb,
                            .cb_arg = pp,
                            .max_rate = o->limit_rate};
    mc_p2p_progress_t pr = {0};
    int rc = mc_p2p_get_replica(p2p, o->args[0], &(mc_p2p_buf_t){m->addr, m->len}, 1, &go, &pr);

    tool_progress_done(pp, &pr, rc, o->seen & BIT(OPT_JSON));
    return rc;
}

static int cmd_fetch(mc_p2p_t *p2p, tool_opts_t *o)
{
    const char *name = o->args[0], *out = o->args[1];
    mc_p2p_object_info_t info;
    tool_progress_t pp;
    tool_map_t m;
    int rc = mc_p2p_stat(p2p, name, &info);

    if (rc)
        return report("fetch", rc);
    if ((rc = tool_map_out(out, info.size, &m)) != 0)
        return rc;
    tool_progress_init(&pp, name, o->seen & BIT(OPT_QUIET), &interrupted);
    rc = fetch_into(p2p, o, &m, &pp);
    if (rc) {
        tool_map_done(&m, rc);
        return report("fetch", rc);
    }
    if ((rc = tool_map_commit(out, &m)) == 0 && (o->seen & BIT(OPT_SERVE_AFTER))) {
        fprintf(stderr, "mooncake-p2p: serving %s until interrupted\n", name);
        wait_interrupt();
    }
    int wrc = mc_p2p_delete_replica(p2p, name);
    tool_map_done(&m, wrc);
    return rc ? rc : wrc ? report("fetch (withdrawing)", wrc) : EXIT_OK;
}

static int cmd_list(mc_p2p_t *p2p, tool_opts_t *o)
{
    const char *prefix = o->nargs ? o->args[0] : "";
    mc_p2p_object_info_t *infos;
    size_t n;
    int rc = mc_p2p_list(p2p, prefix, &infos, &n);

    if (rc)
        return report("list", rc);
    printf("%-32s %14s %7s %8s %9s  %s\n", "NAME", "SIZE", "SHARDS", "HOLDERS", "COMPLETE",
           "ORIGIN");
    for (size_t i = 0; i < n; i++)
        printf("%-32s %14llu %7u %8u %9u  %s\n", infos[i].name, (unsigned long long)infos[i].size,
               infos[i].shards, infos[i].holders, infos[i].complete_holders, infos[i].origin);
    free(infos);
    return EXIT_OK;
}

static int cmd_serve(mc_p2p_t *p2p, tool_opts_t *o)
{
    const char *name = o->args[0], *file = o->args[1];
    tool_map_t m;
    int rc = tool_map_in(file, &m);

    if (rc)
        return rc;
    rc = mc_p2p_serve(p2p, name, &(mc_p2p_buf_t){m.addr, m.len}, 1);
    if (rc) {
        mc_p2p_object_info_t info;
        int code = report("serve", rc);
        /* a file of another length does not match the object either */
        if (rc == -EINVAL && !mc_p2p_stat(p2p, name, &info) && info.size != m.len)
            code = EXIT_VERIFY;
        tool_map_done(&m, rc);
        return code;
    }
    printf("serving %s from %s until interrupted\n", name, file);
    fflush(stdout);
    wait_interrupt();
    rc = mc_p2p_delete_replica(p2p, name);
    tool_map_done(&m, rc);
    return rc ? report("serve (withdrawing)", rc) : EXIT_OK;
}

static int cmd_rm(mc_p2p_t *p2p, tool_opts_t *o)
{
    int rc = mc_p2p_remove(p2p, o->args[0], !!(o->seen & BIT(OPT_KEEP)));

    if (!rc)
        printf("removed %s\n", o->args[0]);
    return report("rm", rc);
}

#define GLOBAL_OPTS (BIT(OPT_METADATA) | BIT(OPT_LISTEN))

static const tool_cmd_t commands[] = {
    {"publish", 2, 2, GLOBAL_OPTS | BIT(OPT_SHARD_SIZE) | BIT(OPT_FORCE), cmd_publish},
    {"fetch", 2, 2,
     GLOBAL_OPTS | BIT(OPT_NO_P2P) | BIT(OPT_MAX_INFLIGHT) | BIT(OPT_RANDOM) |
         BIT(OPT_SERVE_AFTER) | BIT(OPT_LIMIT_RATE) | BIT(OPT_TIMEOUT) | BIT(OPT_JSON) |
         BIT(OPT_QUIET),
     cmd_fetch},
    {"list", 0, 1, GLOBAL_OPTS, cmd_list},
    {"serve", 2, 2, GLOBAL_OPTS, cmd_serve},
    {"rm", 1, 1, GLOBAL_OPTS | BIT(OPT_KEEP), cmd_rm},
};

/* ---- command line ---- */

static const struct option long_opts[] = {
    {"metadata", required_argument, NULL, OPT_METADATA},
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"shard-size", required_argument, NULL, OPT_SHARD_SIZE},
    {"force", no_argument, NULL, OPT_FORCE},
    {"no-p2p", no_argument, NULL, OPT_NO_P2P},
    {"max-inflight", required_argument, NULL, OPT_MAX_INFLIGHT},
    {"random", no_argument, NULL, OPT_RANDOM},
    {"serve-after", no_argument, NULL, OPT_SERVE_AFTER},
    {"limit-rate", required_argument, NULL, OPT_LIMIT_RATE},
    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
    {"json", no_argument, NULL, OPT_JSON},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"keep-replicas", no_argument, NULL, OPT_KEEP},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {0},
};

/* A number with an optional K, M or G suffix; 0 on success. */
static int parse_size(const char *opt, const char *s, uint64_t max, uint64_t *v_p)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    int shift = *end == 'K' || *end == 'k'   ? 10
                : *end == 'M' || *end == 'm' ? 20
                : *end == 'G' || *end == 'g' ? 30
                                             : 0;
    if (shift)
        end++;
    if (errno || end == s || *end || *s == '-' || v > (max >> shift)) {
        fprintf(stderr, "mooncake-p2p: --%s %s: not a number up to %llu\n", opt, s,
                (unsigned long long)max);
        return -1;
    }
    *v_p = (uint64_t)v << shift;
    return 0;
}

static int parse_value(tool_opts_t *o, int id, const char *arg)
{
    switch (id) {
    case OPT_METADATA:
        o->metadata = arg;
        return 0;
    case OPT_LISTEN:
        o->listen = arg;
        return 0;
    case OPT_SHARD_SIZE:
        return parse_size("shard-size", arg, UINT64_MAX, &o->shard_size);
    case OPT_MAX_INFLIGHT:
        return parse_size("max-inflight", arg, 4096, &o->max_inflight);
    case OPT_LIMIT_RATE:
        return parse_size("limit-rate", arg, UINT64_MAX, &o->limit_rate);
    case OPT_TIMEOUT:
        return parse_size("timeout-ms", arg, 86400000, &o->timeout_ms);
    default:
        return 0;
    }
}

static int parse_args(int argc, char **argv, tool_opts_t *o)
{
    int c;

    opterr = 1;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        if (c == 'h')
            c = OPT_HELP;
        if (c == '?' || c == ':' || parse_value(o, c, optarg))
            return EXIT_USAGE;
        o->seen |= BIT(c);
    }
    o->args = argv + optind;
    o->nargs = argc - optind;
    return 0;
}

static const tool_cmd_t *find_command(tool_opts_t *o)
{
    const char *name = o->nargs ? o->args[0] : "";

    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const tool_cmd_t *c = &commands[i];
        if (strcmp(c->name, name))
            continue;
        o->args++;
        o->nargs--;
        if (o->nargs < c->min_args || o->nargs > c->max_args)
            fprintf(stderr, "mooncake-p2p: %s takes %d%s argument%s\n", name, c->min_args,
                    c->max_args > c->min_args ? " or 1" : "", c->max_args > 1 ? "s" : "");
        else if (o->seen & ~c->allowed)
            fprintf(stderr, "mooncake-p2p: an option given does not apply to %s\n", name);
        else
            return c;
        return NULL;
    }
    fprintf(stderr, "mooncake-p2p: %s%s\n", *name ? "unknown command: " : "no command", name);
    return NULL;
}

static int node_create(const tool_opts_t *o, mc_p2p_t **p2p_p)
{
    mc_config_t *cfg;
    int rc = mc_config_create(&cfg);

    if (!rc && o->metadata)
        rc = mc_config_set(cfg, "METADATA", o->metadata);
    if (!rc && o->listen)
        rc = mc_config_set(cfg, "LISTEN", o->listen);
    if (rc) {
        fprintf(stderr, "mooncake-p2p: %s\n", mc_last_error());
        if (cfg)
            mc_config_destroy(cfg);
        return EXIT_USAGE;
    }
    rc = mc_p2p_create(cfg, p2p_p);
    mc_config_destroy(cfg);
    if (rc == -MC_ETIMEOUT || rc == -MC_EMETA)
        rc = -MC_EMETA; /* the engine could not publish its segment */
    return rc ? report("start", rc) : 0;
}

int main(int argc, char **argv)
{
    tool_opts_t o = {0};
    const tool_cmd_t *cmd;
    mc_p2p_t *p2p;
    int rc = parse_args(argc, argv, &o);

    if (rc || (o.seen & BIT(OPT_HELP))) {
        fputs(usage_text, rc ? stderr : stdout);
        return rc;
    }
    if (o.seen & BIT(OPT_VERSION)) {
        printf("mooncake-p2p %s\n", MC_VERSION_STRING);
        return EXIT_OK;
    }
    if (!(cmd = find_command(&o))) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    if ((rc = signals_start()) != 0 || (rc = node_create(&o, &p2p)) != 0)
        return rc;
    rc = cmd->run(p2p, &o);
    mc_p2p_destroy(p2p);
    return rc;
}
