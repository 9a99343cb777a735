/* IP addresses as text. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sockaddr.h"

int mc__parse_ip_port(const char *s, struct sockaddr_storage *sa, socklen_t *len_p)
{
    char host[64];
    const char *colon;
    char *end;
    unsigned long port;
    struct sockaddr_in *v4 = (struct sockaddr_in *)sa;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)sa;

    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof(host))
            return -EINVAL;
        memcpy(host, s + 1, (size_t)(close - s - 1));
        host[close - s - 1] = 0;
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof(host))
            return -EINVAL;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = 0;
    }
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (errno || *end || colon[1] == 0 || port > 65535)
        return -EINVAL;
    memset(sa, 0, sizeof(*sa));
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len_p = sizeof(*v4);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *len_p = sizeof(*v6);
        return 0;
    }
    return -EINVAL;
}

void mc__format_ip_port(const struct sockaddr_storage *sa, char *buf, size_t size)
{
    char ip[INET6_ADDRSTRLEN] = "?";

    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &v6->sin6_addr, ip, sizeof(ip));
        snprintf(buf, size, "[%s]:%u", ip, ntohs(v6->sin6_port));
    } else {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &v4->sin_addr, ip, sizeof(ip));
        snprintf(buf, size, "%s:%u", ip, ntohs(v4->sin_port));
    }
}
