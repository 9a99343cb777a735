/* Forward declarations and limits shared by the internal headers (internal). */
#ifndef MC_FWD_H
#define MC_FWD_H

#include <mooncake/engine.h>

#define MC_TP_MAX    8  /* transports one engine may have (transport/table.c) */
#define MC_MAX_RAILS 16 /* rails per peer and transport */

typedef struct mc_buffer mc_buffer_t;
typedef struct mc_desc mc_desc_t;
typedef struct mc_desc_buffer mc_desc_buffer_t;
typedef struct mc_peer mc_peer_t;
typedef struct mc_rail mc_rail_t;
typedef struct mc_task mc_task_t;
typedef struct mc_slice mc_slice_t;
typedef struct mc_link mc_link_t;
typedef struct mc_transport_ops mc_transport_ops_t;

#endif
