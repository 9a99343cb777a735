# tcp: the control transport (handshake, messages, other transports' control requests) and the
# data path of last resort.
list(APPEND MC_TRANSPORT_SOURCES
  transport/tcp/tcp.c
  transport/tcp/tcp_auth.c
  transport/tcp/tcp_conn.c
  transport/tcp/tcp_desc.c
  transport/tcp/tcp_initiator.c
  transport/tcp/tcp_msg.c
  transport/tcp/tcp_proto.c
  transport/tcp/tcp_rail.c
  transport/tcp/tcp_target.c)
