/*
 * Settings (internal).
 *
 * Every setting is declared once, with its default and how its text is read: the core's in
 * config.c, each transport's in its ops table (settings). mc_config_create applies the
 * defaults, then the MC_* environment; mc_config_set changes one; the engine reads the core's
 * into mc_engine_cfg_t at create and each transport reads its own in its init.
 */
#ifndef MC_CONFIG_H
#define MC_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <mooncake/engine.h>

typedef struct mc_setting {
    const char *name; /* "SLICE_SIZE": MC_SLICE_SIZE in the environment */
    const char *def;  /* default, as text */
    uint64_t lo, hi;  /* a decimal number in [lo, hi], unless parse is set */
    /* Any other syntax: 0 with *num_p set (0 for text), or -MC_ECONFIG with the reason (the
     * caller names the setting and the value before it). */
    int (*parse)(const char *value, uint64_t *num_p);
    const char *help; /* one line for README and mooncake-info */
} mc_setting_t;

/* Parsers for settings that are not a plain number. */
int mc__parse_bool(const char *value, uint64_t *num_p); /* 0/1/true/false/yes/no/on/off */
int mc__parse_text(const char *value, uint64_t *num_p); /* anything */

/* A setting's number (its parse result) or text. The name must be declared. */
uint64_t mc__config_num(const mc_config_t *c, const char *name);
const char *mc__config_str(const mc_config_t *c, const char *name);
/* A copy (for the engine to keep). NULL when out of memory. */
mc_config_t *mc__config_dup(const mc_config_t *c);

/* The core's settings, read once when an engine is created. Strings point into the engine's
 * copy of its configuration. */
typedef struct mc_engine_cfg {
    int log_level;
    const char *segment_name; /* "": the control transport's first address */
    const char *metadata;
    const char *cluster_id;
    unsigned metadata_ttl_s;
    const char *auth_token; /* "": no authentication */
    const char *protocol;   /* "auto" or a transport's name */
    int progress_thread;
    int progress_implicit;
    uint64_t progress_serve_us; /* caller mode: the serving thread steps in after this; 0 off */
    uint64_t slice_size;
    unsigned retry_cnt;
    unsigned transfer_timeout_ms;
    unsigned io_timeout_ms;
    unsigned linger_ms;         /* destroy: how long it waits for peers to take its messages */
    bool msg_ack_after_handler; /* a ring's message is acknowledged once its handler ran */
    unsigned connect_timeout_ms;
    uint64_t handshake_max;
    const char *devices; /* MC_DEVICES: "" for all */
    const char *matrix;  /* MC_NIC_PRIORITY_MATRIX: "" to compute it */
} mc_engine_cfg_t;

void mc__engine_cfg_read(const mc_config_t *c, mc_engine_cfg_t *cfg);

#endif
