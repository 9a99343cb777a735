/* IP addresses as "ip:port" / "[v6]:port" text (internal). */
#ifndef MC_UTIL_SOCKADDR_H
#define MC_UTIL_SOCKADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* Parse "a.b.c.d:port" or "[v6]:port". 0 or -EINVAL. */
int mc__parse_ip_port(const char *s, struct sockaddr_storage *sa, socklen_t *len_p);
/* The reverse, into buf. */
void mc__format_ip_port(const struct sockaddr_storage *sa, char *buf, size_t size);

#endif
