/* A small engine for white-box unit tests (no harness, no child process): METADATA=none,
 * logging off, and settings as NAME, VALUE pairs, NULL-terminated. Include after cmocka.h. */
#ifndef MC_TEST_UNIT_ENGINE_H
#define MC_TEST_UNIT_ENGINE_H

#include <mooncake/engine.h>

static inline mc_engine_t *unit_engine(const char *const *settings)
{
    mc_config_t *cfg;
    mc_engine_t *e;

    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA", "none"), 0);
    assert_int_equal(mc_config_set(cfg, "LOG_LEVEL", "off"), 0);
    for (; settings && settings[0]; settings += 2)
        assert_int_equal(mc_config_set(cfg, settings[0], settings[1]), 0);
    assert_int_equal(mc_engine_create(cfg, &e), 0);
    mc_config_destroy(cfg);
    return e;
}

#endif
