/* Every transport of the engine: adding one is its directory and a line here. When several
 * reach a peer equally well, the first listed wins. The order is also each transport's slot,
 * which control requests name on the wire: append only. */
#include "transport.h"

extern const mc_transport_ops_t mc__tcp_ops, mc__shm_ops, mc__rdma_ops, mc__file_ops;

const mc_transport_ops_t *const mc__transports[] = {
    &mc__tcp_ops,
    &mc__shm_ops,
    &mc__rdma_ops,
    &mc__file_ops,
};

const unsigned mc__n_transports = sizeof(mc__transports) / sizeof(mc__transports[0]);

_Static_assert(sizeof(mc__transports) / sizeof(mc__transports[0]) <= MC_TP_MAX,
               "more transports than MC_TP_MAX");
