# rdma: ibverbs RC over every device pair, VRAM by GPUDirect (the file transport stages the rest).
list(APPEND MC_TRANSPORT_SOURCES
  transport/rdma/rdma.c
  transport/rdma/rdma_desc.c
  transport/rdma/rdma_msg.c
  transport/rdma/rdma_post.c
  transport/rdma/rdma_qp.c
  transport/rdma/rdma_vram.c)
